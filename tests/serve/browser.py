"""browser.py: the checks of tests/test_browser.sh: the workbench's page (web/, served by `kiln serve --workbench`)
driven in headless Chromium with Selenium, through the page only (clicks and typing; the API is called only to check
what the page did):
  page        GET / gives the page with its content type, no-cache, and its three tabs
  key         the server wants its key: the page shows the key box, refuses a wrong key in words, keeps the right one
              in localStorage
  corpus      a ~200 KB corpus uploaded from a file input, listed with its size and checked
  tokenizer   a BPE of up to 512 tokens trained as a job (the bar full, "done")
  vocabulary  its bytes/token on its held-out text beside another vocabulary, its top merges
  tokenize    text typed into the live box comes back as colored pieces (alternating colors, a title with the id)
              that spell the text and carry the ids the API gives
  failure     a tokenizer job that fails shows the library's one-line error in the page
  shards      shards made from the Train tab
  train       50 steps of the tiny preset on the CPU: the chart's plotted points grow while it runs, end at 50 train
              points and 2 validation points, tokens/s and the step shown; the checkpoint listed with Resume/Export
  export      run1's checkpoint exported as q8_0 by its Export button, the GGUF listed among the models
  reload      a second run, the page reloaded: the Live card follows it again (its points still growing), Pause holds
              the chart, Resume moves it again, Stop ends the job as stopped
  resume      run1 trained on from its step-50 checkpoint by its Resume button to 60 steps, the new checkpoint listed
  generate    the first run chosen in the Generate tab: tokens stream in as spans, hovering one shows its top-5
  chat        (with SmolLM2-135M-Instruct in DATA/models) chat mode: a question and its streamed answer in the
              message list, the answer the tokens' text, the top-5 tooltip
A screenshot of each tab (1280x900) goes to --shots (the Generate tab's of the chat where it runs). Each check prints ok/FAIL/skip; after a failure the checks that
need its result fail naming it."""
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
from harness import Fail, Skip, check, one_line  # noqa: E402

try:
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
except ImportError as e:  # test_browser.sh checks first; this is for a direct run
    print(f"skip test_browser: selenium is missing ({e})")
    sys.exit(0)

A = None
SRV = None
D = None  # the WebDriver
DONE = set()  # the checks that passed


def needs(*names):
    for n in names:
        if n not in DONE:
            raise Fail(f"needs browser_{n}, which did not pass")


def q(css):
    return D.find_element(By.CSS_SELECTOR, css)


def qs(css):
    return D.find_elements(By.CSS_SELECTOR, css)


def by_id(i):
    return D.find_element(By.ID, i)


def text(i):
    return by_id(i).text


def wait_for(what, fn, seconds=60, every=0.1):
    """fn() until it is truthy (its value is returned); fails naming what after seconds."""
    end = time.time() + seconds
    last = None
    while True:
        try:
            v = fn()
            if v:
                return v
        except WebDriverException as e:
            last = e.msg if hasattr(e, "msg") else str(e)
        if time.time() > end:
            raise Fail(f"{what} after {seconds} s" + (f" ({one_line(str(last), 200)})" if last else ""))
        time.sleep(every)


def type_into(i, value):
    e = by_id(i)
    e.clear()
    e.send_keys(str(value))


def choose(i, value):
    Select(by_id(i)).select_by_value(value)


def msg_done(i, what, seconds):
    """Waits for the message element i to say ok or error; fails with the page's message on an error."""
    e = wait_for(f"{what}: no result in #{i} (it says {text(i)!r})", lambda: by_id(i).get_attribute("class") in ("msg ok", "msg error") and by_id(i), seconds)
    check("ok" in e.get_attribute("class"), f"{what}: the page says {one_line(e.text)}")
    return e.text


def shot(name):
    path = os.path.join(A.shots, name + ".png")
    D.execute_script("window.scrollTo(0, 0)")
    D.save_screenshot(path)
    return path


def tab(name):
    by_id("tab-" + name).click()
    wait_for(f"the {name} panel shown", lambda: by_id("panel-" + name).is_displayed(), 5)


def corpus_text():
    """~200 KB: a slice of the shared English corpus where it is, else words from a fixed seed (as workbench.py)."""
    p = os.path.join(A.examples, "english", "tinyshakespeare.txt")
    if os.path.isfile(p):
        with open(p, "rb") as f:
            data = f.read(200_000)
        return data[: data.rfind(b"\n") + 1]
    rng = random.Random(7)
    words = "the king and queen of a far land rode to war with their men in rain and sun".split()
    out = []
    while sum(len(w) + 1 for w in out) < 200_000:
        out.append(rng.choice(words) + ("\n" if rng.random() < 0.1 else ""))
    return " ".join(out).encode()


# ---------------------------------------------------------------- the checks

def c_page():
    st, hd, body = SRV.request("GET", "/", auth=False)
    check(st == 200 and hd.get("content-type", "").startswith("text/html"), f"GET /: {st} {hd.get('content-type')}")
    check(hd.get("cache-control") == "no-cache", f"GET /: Cache-Control {hd.get('cache-control')!r}")
    check(b'id="tab-tokenizer"' in body and b"/wb/ui/app.js" in body, "GET / is not the workbench's page")
    st, hd, _ = SRV.request("GET", "/wb/ui/app.js", auth=False)
    check(st == 200 and "javascript" in hd.get("content-type", ""), f"GET /wb/ui/app.js: {st} {hd.get('content-type')}")
    st, hd, _ = SRV.request("GET", "/wb/ui/style.css", auth=False)
    check(st == 200 and hd.get("content-type", "").startswith("text/css"), f"GET /wb/ui/style.css: {st} {hd.get('content-type')}")
    st, _, body = SRV.request("GET", "/wb/ui/nothing.js", auth=False)
    check(st == 404 and b'"error"' in body, f"GET /wb/ui/nothing.js: {st}")
    D.get(SRV.url + "/")
    check("kiln" in D.title, f"the page's title is {D.title!r}")
    for t in ("tokenizer", "train", "generate"):
        check(by_id("tab-" + t).is_displayed(), f"no tab {t}")


def c_key():
    needs("page")
    box = wait_for("the key box shown for a server with --api-key", lambda: by_id("key-box").is_displayed() and by_id("key-box"), 10)
    check(box.is_displayed(), "no key box")
    type_into("key-input", "not-the-key")
    by_id("key-save").click()
    wait_for(f"a wrong key refused in the page (key-msg {text('key-msg')!r})", lambda: by_id("key-box").is_displayed() and "refused" in text("key-msg"), 10)
    type_into("key-input", A.api_key)
    by_id("key-save").click()
    wait_for("the key box hidden after the key", lambda: not by_id("key-box").is_displayed(), 5)
    kept = D.execute_script("return localStorage.getItem('kiln.workbench.key')")
    check(kept == A.api_key, f"localStorage has {kept!r}")
    wait_for("the server's version in the header", lambda: "kiln" in text("server-info") and "connecting" not in text("server-info"), 10)
    check(not by_id("banner").is_displayed(), lambda: f"an error banner: {text('banner-text')}")


def c_corpus():
    needs("key")
    data = corpus_text()
    path = os.path.join(A.tmp, "english.txt")
    with open(path, "wb") as f:
        f.write(data)
    if not by_id("corpus-name").is_displayed():
        q("#corpus-upload-box summary").click()
    type_into("corpus-name", "english")
    by_id("corpus-file").send_keys(path)
    by_id("corpus-upload").click()
    msg_done("corpus-msg", "the upload", 30)
    box = wait_for("the corpus in the list", lambda: qs('#corpus-list input[data-corpus="english"]'), 5)[0]
    check(box.is_selected(), "the uploaded corpus is not checked")
    listed = {c["name"]: c for c in SRV.json("GET", "/wb/corpora")["corpora"]}
    check(listed.get("english", {}).get("bytes") == len(data), f"the server has {listed.get('english')}, not {len(data)} bytes")


def c_tokenizer():
    needs("corpus")
    type_into("tok-name", "tok")
    type_into("tok-vocab", 512)
    by_id("tok-train").click()
    msg_done("tok-status", "the tokenizer job", 120)
    frac = float(by_id("tok-progress").get_attribute("data-fraction") or 0)
    check(frac == 1.0, f"the bar is at {frac}")
    wait_for("the tokenizer chosen in the Vocabulary card", lambda: Select(by_id("tok-select")).first_selected_option.get_attribute("value") == "tok", 10)


def c_vocabulary():
    needs("tokenizer")
    summary = wait_for("the held-out bytes/token", lambda: "bytes/token" in text("tok-summary") and text("tok-summary"), 20)
    # 512 tokens on the shared corpus; fewer on the seeded one (16 words, where ../shared is missing, as in CI), which
    # runs out of pairs: the page must give the size the server has, and its held-out bytes/token
    t = SRV.json("GET", "/wb/tokenizer?name=tok&merges=0")
    check(t["n_vocab"] == 256 + 3 + t["n_merges"] <= 512, f"the tokenizer has {t['n_vocab']} tokens and {t['n_merges']} merges")
    check(str(t["n_vocab"]) in summary and f"{t['heldout']['bytes_per_token']:.2f}" in summary,
          f"the summary {summary!r} does not give {t['n_vocab']} tokens and {t['heldout']['bytes_per_token']:.2f} bytes/token")
    rows = wait_for("the compare bars", lambda: qs("#cmp-results .barrow"), 20)
    bpt = {r.get_attribute("data-tokenizer"): float(r.get_attribute("data-bpt")) for r in rows}
    check(bpt.get("tok", 0) > 1.0, f"bytes/token of tok: {bpt}")
    check(len(bpt) >= 2 or len(Select(by_id("cmp-select")).options) == 0, f"only {list(bpt)} compared while another vocabulary is offered")
    merges = qs("#tok-merges li")
    check(len(merges) >= 10, f"{len(merges)} merges shown")


def c_tokenize():
    needs("tokenizer")
    sample = "the king and queen rode to war\nin rain"
    type_into("tok-input", sample)
    want = SRV.json("POST", "/wb/tokenize", {"tokenizer": "tok", "text": sample})
    ids = [t["id"] for t in want["tokens"]]

    def pieces():
        sp = qs("#tok-pieces span.piece")
        got = [int(s.get_attribute("data-id")) for s in sp]
        return sp if got == ids else None
    sp = wait_for(f"the pieces of the tokenize box to be the API's {ids}", pieces, 15)
    check(len(sp) >= 5, f"{len(sp)} pieces")
    colors = [s.value_of_css_property("background-color") for s in sp]
    check(all(colors[i] != colors[i + 1] for i in range(len(colors) - 1)), f"neighbouring pieces share a color: {colors}")
    check(all(s.get_attribute("title") == f"id {s.get_attribute('data-id')}" for s in sp), "a piece's title is not its id")
    spelled = "".join(s.text for s in sp).replace("\u2423", " ").replace("\u21b5", "\n")
    check(spelled == sample, f"the pieces spell {spelled!r}")
    check("bytes/token" in text("tok-stats"), f"tok-stats {text('tok-stats')!r}")
    shot("tokenizer")


def c_failure():
    needs("corpus")
    type_into("tok-name", "tok-bad")
    type_into("tok-vocab", 300)
    type_into("tok-special", "A")  # the text of a byte token: the library refuses it
    by_id("tok-train").click()
    e = wait_for("the failed job's message", lambda: by_id("tok-status").get_attribute("class") == "msg error" and by_id("tok-status"), 60)
    check("byte token" in e.text, f"the page says {one_line(e.text)}")
    type_into("tok-special", "<s> </s> <unk>")
    type_into("tok-name", "tok")


def c_shards():
    needs("tokenizer")
    tab("train")
    type_into("data-name", "shards")
    choose("data-tokenizer", "tok")
    by_id("data-make").click()
    m = msg_done("data-status", "the data job", 120)
    check("training tokens" in m, f"data-status {m!r}")
    wait_for("the shards offered to the run", lambda: Select(by_id("run-data")).first_selected_option.get_attribute("value") == "shards", 10)


def set_run(name, steps):
    type_into("run-name", name)
    choose("run-preset", "tiny")
    choose("run-device", "cpu")
    for i, v in (("run-threads", 2), ("run-steps", steps), ("run-batch", 4), ("run-context", 64), ("run-eval", 25), ("run-lr", 0.003)):
        type_into(i, v)
    by_id("run-time").clear()


def points():
    return int(by_id("loss-chart").get_attribute("data-points") or 0)


def c_train():
    needs("shards")
    set_run("run1", 50)
    # every value the chart's data-points takes, recorded in the page: polling from here samples too slowly when the
    # run's 50 steps take a second or two
    D.execute_script("""const cv = document.getElementById('loss-chart'); window.kilnPointsSeen = [];
        new MutationObserver(() => window.kilnPointsSeen.push(+cv.dataset.points))
          .observe(cv, {attributes: true, attributeFilter: ['data-points']});""")
    by_id("train-start").click()
    seen = []
    end = time.time() + 150
    while time.time() < end:
        seen.append(points())
        cls = by_id("train-msg").get_attribute("class")
        if cls in ("msg ok", "msg error"):
            break
        time.sleep(0.1)
    check(by_id("train-msg").get_attribute("class") == "msg ok", f"the run: {one_line(text('train-msg'))}")
    check(points() == 50, f"{points()} train points plotted at the end, not 50")
    vals = int(by_id("loss-chart").get_attribute("data-val-points") or 0)
    check(vals == 2, f"{vals} validation points, not 2")
    seen += D.execute_script("return window.kilnPointsSeen")
    growth = sorted(set(p for p in seen if 0 < p < 50))
    check(len(growth) >= 2, f"the chart did not grow while the run ran: points seen {sorted(set(seen))}")
    check(text("stat-step").replace(",", "").startswith("50 / 50"), f"stat-step {text('stat-step')!r}")
    check(any(ch.isdigit() for ch in text("stat-toks")), f"stat-toks {text('stat-toks')!r}")
    row = wait_for("run1's checkpoint in the list", lambda: qs('#runs-list tr[data-run="run1"][data-step="50"]'), 15)[0]
    check(row.find_elements(By.CSS_SELECTOR, '[data-action="resume"]') and row.find_elements(By.CSS_SELECTOR, '[data-action="export"]'),
          "no Resume/Export buttons on the checkpoint")
    # a checkpoint every 25 steps (the form's default): step 25 listed too, with the validation loss of its eval
    mid = wait_for("run1's step-25 checkpoint in the list", lambda: qs('#runs-list tr[data-run="run1"][data-step="25"]'), 15)[0]
    cells = [c.text for c in mid.find_elements(By.CSS_SELECTOR, "td")]
    check(len(cells) >= 3 and cells[1].strip() == "25" and cells[2].strip() not in ("", "–"), f"the step-25 row {cells}")
    shot("train")


def c_reload():
    needs("train")
    tab("train")
    set_run("run2", 1_000_000)
    by_id("train-start").click()
    wait_for("run2's first points", lambda: points() >= 2, 60)
    D.refresh()
    wait_for("the page back after the reload", lambda: by_id("panel-train").is_displayed(), 10)
    wait_for("the Live card following run2 after the reload", lambda: "run2" in text("live-job"), 15)
    p0 = wait_for("run2's points drawn again", lambda: points(), 20)
    wait_for(f"run2's points growing after the reload (from {p0})", lambda: points() > p0, 30)
    wait_for("the Pause button enabled", lambda: by_id("train-pause").is_enabled(), 10)
    by_id("train-pause").click()
    wait_for(f"run2 paused (the page says {text('train-msg')!r})", lambda: text("train-msg") == "paused" and by_id("train-resume").is_enabled(), 30)
    p1 = points()
    time.sleep(1.0)
    check(points() == p1, f"the chart grew from {p1} to {points()} points while paused")
    by_id("train-resume").click()
    wait_for(f"run2's points growing after Resume (from {p1})", lambda: points() > p1, 30)
    wait_for("the Stop button enabled", lambda: by_id("train-stop").is_enabled(), 10)
    by_id("train-stop").click()
    wait_for(f"run2 stopped (the page says {text('train-msg')!r})", lambda: text("train-msg").startswith("stopped"), 60)
    jobs = [j for j in SRV.json("GET", "/wb/jobs")["jobs"] if j["kind"] == "train" and j["params"].get("name") == "run2"]
    check(jobs and jobs[-1]["state"] == "stopped", f"run2 on the server: {jobs[-1]['state'] if jobs else 'missing'}")


def c_export():
    needs("train")
    tab("train")
    types = [o.get_attribute("value") for o in Select(by_id("export-type")).options]
    check("q8_0" in types and "f32" in types, f"the export types offered: {types}")
    choose("export-type", "q8_0")
    q('#runs-list tr[data-run="run1"][data-step="50"] [data-action="export"]').click()
    m = msg_done("runs-msg", "the export", 60)
    check("exported" in m, f"runs-msg {m!r}")
    models = SRV.json("GET", "/wb/models")["models"]
    check(any(x["kind"] == "gguf" and "q8_0" in x["id"] for x in models), f"no q8_0 GGUF among the models: {[x['id'] for x in models]}")


def c_generate():
    needs("train")
    tab("generate")
    by_id("gen-refresh").click()

    def run1():
        for o in Select(by_id("gen-model")).options:
            v = o.get_attribute("value")
            if v == "run:run1" or v.startswith("run:run1@"):
                return v
    v = wait_for("run1 among the models", run1, 15)
    choose("gen-model", v)
    type_into("gen-prompt", "the king")
    type_into("gen-n", 24)
    type_into("gen-seed", 1)
    by_id("gen-run").click()
    wait_for(f"the generation's end (gen-msg {text('gen-msg')!r})", lambda: "tok/s" in text("gen-stats") or by_id("gen-msg").text, 90)
    check(not text("gen-msg"), f"the page says {one_line(text('gen-msg'))}")
    toks = qs("#gen-output span.tok")
    check(len(toks) >= 1, "no token spans")
    ActionChains(D).move_to_element(toks[0]).perform()
    tip = wait_for("the top-5 tooltip on hover", lambda: by_id("tooltip").is_displayed() and by_id("tooltip"), 5)
    rows = tip.find_elements(By.CSS_SELECTOR, ".tiprow")
    check(len(rows) == 5, f"{len(rows)} rows in the tooltip, not 5")
    pct = [float(r.find_element(By.CSS_SELECTOR, ".value").text.rstrip("%")) for r in rows]
    check(pct == sorted(pct, reverse=True) and sum(pct) <= 100.5, f"the top-5 percentages {pct}")
    shot("generate")


def c_resume():
    needs("train")
    tab("train")
    type_into("run-steps", 60)
    q('#runs-list tr[data-run="run1"][data-step="50"] [data-action="resume"]').click()
    wait_for("the resumed run followed", lambda: "run1" in text("live-job") and points() > 0 or text("runs-msg"), 30)
    check("run1" in text("live-job"), f"the resumed run is not followed: runs-msg {text('runs-msg')!r}, live-job {text('live-job')!r}")
    m = msg_done("train-msg", "the resumed run", 90)
    check("60" in m, f"train-msg {m!r}")
    wait_for("run1's step-60 checkpoint listed", lambda: qs('#runs-list tr[data-run="run1"][data-step="60"]'), 15)


def c_chat():
    if not A.chat_model:
        raise Skip("no chat model (SmolLM2-135M-Instruct in ~/.cache/kiln: tests/ref/fetch_models.sh)")
    needs("key")
    tab("generate")
    by_id("gen-refresh").click()
    mid = "gguf:" + A.chat_model
    wait_for(f"{mid} among the models", lambda: mid in [o.get_attribute("value") for o in Select(by_id("gen-model")).options], 15)
    choose("gen-model", mid)
    wait_for("chat mode offered for a model with a chat template", lambda: by_id("gen-chat").is_enabled(), 5)
    if not by_id("gen-chat").is_selected():
        by_id("gen-chat").click()
    hidden = D.execute_script("return document.getElementById('gen-messages').hidden")
    check(not hidden and text("gen-run") == "Send", f"the page is not in chat mode (messages hidden {hidden}, button {text('gen-run')!r})")
    by_id("gen-clear").click()
    type_into("gen-prompt", "What is the capital of France?")
    type_into("gen-n", 40)
    type_into("gen-seed", 1)
    type_into("gen-temp", 0.3)
    by_id("gen-run").click()
    wait_for(f"the reply's end (gen-msg {text('gen-msg')!r})", lambda: "tok/s" in text("gen-stats") or by_id("gen-msg").text, 120)
    check(not text("gen-msg"), f"the page says {one_line(text('gen-msg'))}")
    msgs = qs("#gen-messages .message")
    roles = [m.get_attribute("class").split()[-1] for m in msgs]
    check(roles == ["user", "assistant"], f"the message list's roles: {roles}")
    reply = D.execute_script("return [...document.querySelectorAll('#gen-output span.tok')].map(s => s.textContent).join('')")
    said = D.execute_script("return document.querySelector('#gen-messages .message.assistant span:last-child').textContent")
    check(reply.strip() and said == reply, f"the assistant's message {said!r} is not the streamed tokens {reply!r}")
    toks = qs("#gen-output span.tok")
    pick = next((t for t in toks if "Paris" in t.text), toks[min(3, len(toks) - 1)])  # the answer's word, where it is
    ActionChains(D).move_to_element(pick).perform()
    tip = wait_for("the top-5 tooltip on hover", lambda: by_id("tooltip").is_displayed() and by_id("tooltip"), 5)
    check(len(tip.find_elements(By.CSS_SELECTOR, ".tiprow")) == 5, "not 5 rows in the tooltip")
    shot("generate")  # a real model's answer shows the tab better than 50 steps' text: it replaces that screenshot


CHECKS = [("page", c_page), ("key", c_key), ("corpus", c_corpus), ("tokenizer", c_tokenizer), ("vocabulary", c_vocabulary),
          ("tokenize", c_tokenize),
          ("failure", c_failure), ("shards", c_shards), ("train", c_train), ("export", c_export),
          ("generate", c_generate), ("chat", c_chat), ("reload", c_reload), ("resume", c_resume)]


def main():
    global A, SRV, D
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--shots", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--examples", default=os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "corpora"))
    ap.add_argument("--chat-model", default="", help="a GGUF with a chat template in DATA/models (its file name)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    ap.add_argument("only", nargs="*")
    A = ap.parse_args()
    os.makedirs(A.shots, exist_ok=True)
    SRV = h.Server(A.url, A.api_key)
    o = Options()
    o.binary_location = A.chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--force-device-scale-factor=1", f"--user-data-dir={os.path.join(A.tmp, 'chromium')}"):
        o.add_argument(arg)
    try:
        D = webdriver.Chrome(service=Service(A.chromedriver), options=o)
    except WebDriverException as e:
        print(f"skip test_browser: chromium does not start: {one_line(str(e.msg if hasattr(e, 'msg') else e), 300)}")
        return 0
    # the viewport itself 1280x900 (the window's size would include its frame), so that the screenshots are that
    D.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    failed = 0
    try:
        for name, fn in CHECKS:
            if A.only and name not in A.only:
                continue
            before = failed
            failed += h.run_checks("browser", [(name, fn)], [])
            if failed == before:
                DONE.add(name)
        logs = []
        try:
            logs = [e for e in D.get_log("browser") if e.get("level") == "SEVERE"]
        except Exception:
            pass
        for e in logs[:5]:
            print(f"note: the page's console: {one_line(e.get('message', ''), 300)}")
    finally:
        D.quit()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
