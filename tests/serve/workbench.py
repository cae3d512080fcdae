"""workbench.py: the checks of tests/test_workbench.sh against a running `kiln serve --workbench` (no model), with
the standard library only. Two phases over one data folder, the server restarted between them:
  before  /wb/info; upload a corpus, train a tokenizer (its held-out bytes per token, merges, tokenize, compare),
          make shards, train ~50 steps of the tiny preset on the CPU reading its SSE events live (the step count
          rising, the loss falling, the checkpoints kept with their validation loss), a second run paused, resumed
          and stopped mid-way while an events client that went away is dropped, a run resumed from an earlier
          checkpoint, an export quantized, generation streamed with its top-5 from a checkpoint and the export, a
          job that fails with the library's one-line error, every route's errors, the model routes' 503, auth
  after   every job of the state file listed again with its final state and outputs, and `kiln generate` on the
          first run's export
The state file carries what the first phase saw to the second."""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
from harness import Fail, check, one_line  # noqa: E402

A = None
SRV = None
STATE = {}


def corpus_text():
    """~200 KB: a slice of the shared English corpus where it is, else words from a fixed seed."""
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


def submit(body, want=202):
    return SRV.json("POST", "/wb/jobs", body, want=want)


def wait(job_id, seconds=120, until=lambda j: j["state"] not in ("queued", "running")):
    end = time.time() + seconds
    while True:
        j = SRV.json("GET", f"/wb/jobs/{job_id}")
        if until(j):
            return j
        check(time.time() < end, f"job {job_id} still {j['state']} after {seconds} s: {one_line(json.dumps(j.get('progress')))}")
        time.sleep(0.1)


def events(job_id, limit=None, timeout=120):
    """The SSE stream of a job: [(event, data)] to its end (or limit events, then the connection is dropped)."""
    c = SRV.conn(timeout)
    out = []
    try:
        c.request("GET", f"/wb/jobs/{job_id}/events", headers=SRV.headers())
        r = c.getresponse()
        check(r.status == 200, f"events of {job_id}: status {r.status}")
        check("event-stream" in (r.getheader("Content-Type") or ""), "events: not text/event-stream")
        ev = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if line.startswith(b"event: "):
                ev = line[7:].decode()
            elif line.startswith(b"data: "):
                out.append((ev, json.loads(line[6:])))
                if ev == "end" or (limit and len(out) >= limit):
                    break
    finally:
        if limit and c.sock:
            c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
    return out


def c_auth_and_no_model():
    st, _, _ = SRV.request("GET", "/wb/jobs", auth=False)
    check(st == 401, f"GET /wb/jobs without the key: {st}, not 401")
    st, _, body = SRV.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    check(st == 503 and b"no model loaded" in body, f"a model route without -m: {st} {one_line(body.decode())}")


def c_corpus():
    st, _, body = SRV.request("POST", "/wb/corpora?name=../evil", b"text", headers={"Content-Type": "text/plain"})
    check(st == 400 and b'"param":"name"' in body, f"a traversal name: {st} {one_line(body.decode())}")
    st, _, body = SRV.request("POST", "/wb/corpora?name=bad", b"ab\xffcd", headers={"Content-Type": "text/plain"})
    check(st == 400 and b"UTF-8" in body, f"a corpus not UTF-8: {st}")
    text = corpus_text()
    st, _, body = SRV.request("POST", "/wb/corpora?name=english", text, headers={"Content-Type": "text/plain"})
    check(st == 201, f"upload: {st} {one_line(body.decode())}")
    listed = {c["name"]: c for c in SRV.json("GET", "/wb/corpora")["corpora"]}
    check(listed.get("english", {}).get("bytes") == len(text), f"the corpus is not listed with its size: {one_line(json.dumps(listed))}")
    check("bad" not in listed and "../evil" not in listed, "a refused corpus was saved")
    if os.path.isdir(os.path.join(A.examples, "english")):
        check(any(n.startswith("english/") and c["example"] for n, c in listed.items()), "the shared examples are not offered")


def c_tokenizer():
    j = submit({"kind": "tokenizer", "name": "tok", "corpus": ["english"], "vocab_size": 512, "special": ["<s>", "</s>", "<unk>"]})
    STATE["tokenizer"] = j["id"]
    j = wait(j["id"])
    check(j["state"] == "done", f"tokenizer job: {j['state']}: {j['error']}")
    p = j["progress"]
    # the last report is the merges made: all that were asked, or fewer when the corpus runs out of pairs (the seeded
    # corpus has 16 words)
    check(p["stage"] == "tokenizer" and 0 < p["done"] <= p["total"] and p["total"] == 512 - 256 - 3, f"tokenizer progress {p}")
    if os.path.isfile(os.path.join(A.examples, "english", "tinyshakespeare.txt")):
        check(p["done"] == p["total"], f"tokenizer progress on the shared corpus {p}")
    check(os.path.isfile(j["outputs"]["tokenizer"]), "no tokenizer file")


def c_info():
    i = SRV.json("GET", "/wb/info")
    check([p["name"] for p in i["presets"]] == ["tiny", "small", "124m"] and i["presets"][0]["dims"]["n_embd"] == 64, f"presets {i['presets']}")
    check(i["devices"][0]["name"] == "cpu" and i["devices"][0]["threads"] >= 1, f"devices {i['devices']}")
    check({"f32", "f16", "q8_0", "q4_k_m"} <= set(i["export_types"]) and i["lr_schedules"] == ["cosine", "linear", "constant"], f"info {i}")
    check(i["auth"] is True and i["model"] is None, f"auth/model {i['auth']} {i['model']}")


def c_vocab():
    """The tokenizer's routes: held-out bytes per token, merges, tokenize, compare, and their errors."""
    j = SRV.json("GET", f"/wb/jobs/{STATE['tokenizer']}")
    h = j["outputs"].get("heldout")
    check(h and h["bytes"] > 1000 and h["tokens"] > 100 and abs(h["bytes_per_token"] - h["bytes"] / h["tokens"]) < 1e-9, f"heldout {h}")
    check(os.path.isfile(h["file"]) and os.path.getsize(h["file"]) == h["bytes"], "the held-out file")
    t = SRV.json("GET", "/wb/tokenizer?name=tok&merges=5")
    # 512 on the shared corpus; fewer on the seeded one (16 words), which runs out of pairs: bytes + specials + merges
    check(t["n_vocab"] == 256 + 3 + t["n_merges"] <= 512 and [x["text"] for x in t["special"]] == ["<s>", "</s>", "<unk>"],
          f"tokenizer {t['n_vocab']} {t['n_merges']} {t['special']}")
    check(len(t["merges"]) == 5 and [m["rank"] for m in t["merges"]] == list(range(5)) and t["n_merges"] > 5, f"merges {t['merges']}")
    check(t["heldout"]["bytes_per_token"] == h["bytes_per_token"], "the tokenizer's held-out measure")
    text = "the king and the queen"
    k = SRV.json("POST", "/wb/tokenize", {"tokenizer": "tok", "text": text})
    check("".join(x["piece"] for x in k["tokens"]) == text and k["n_tokens"] == len(k["tokens"]) < len(text), f"tokenize {k}")
    check(k["n_bytes"] == len(text) and abs(k["bytes_per_token"] - len(text) / k["n_tokens"]) < 1e-9, "tokenize's counts")
    listed = [x["name"] for x in SRV.json("GET", "/wb/tokenizers")["tokenizers"]]
    check("tok" in listed and "bundled" in listed, f"/wb/tokenizers {listed}")
    names = ["tok", "bundled"] + [n for n in listed if n.endswith("llama-spm.gguf")]
    c = SRV.json("POST", "/wb/compare", {"tokenizers": names, "heldout": "tok"})
    check(c["bytes"] == h["bytes"] and [r["tokenizer"] for r in c["results"]] == names and c["results"][0]["tokens"] == h["tokens"], f"compare {c}")
    c = SRV.json("POST", "/wb/compare", {"tokenizers": ["tok"], "text": text})
    check(c["results"][0]["tokens"] == k["n_tokens"], f"compare of a text {c}")
    # a corpus past the 4 MiB compared: cut back to a character start ("é" is 2 bytes; the 4 MiB mark falls inside one)
    big = ("a" + "ééé " * 600_000).encode()
    cut = 4 << 20
    while big[cut] & 0xC0 == 0x80:
        cut -= 1
    st, _, body = SRV.request("POST", "/wb/corpora?name=big", big, headers={"Content-Type": "text/plain"})
    check(st == 201, f"the big corpus: {st} {one_line(body.decode())}")
    c = SRV.json("POST", "/wb/compare", {"tokenizers": ["tok"], "corpus": "big"})
    check(c["bytes"] == cut == (4 << 20) - 1, f"compare of a corpus past 4 MiB: {c['bytes']} bytes, not {cut}")
    bad = [("POST", "/wb/tokenize", {"tokenizer": "nope", "text": "x"}, 404, "tokenizer"),
           ("POST", "/wb/tokenize", {"tokenizer": "../x", "text": "x"}, 400, "tokenizer"),
           ("POST", "/wb/tokenize", {"tokenizer": "tok", "text": 3}, 400, "text"),
           ("POST", "/wb/tokenize", {"tokenizer": "tok", "text": "x", "extra": 1}, 400, "extra"),
           ("POST", "/wb/tokenize", {"tokenizer": "gguf:none.gguf", "text": "x"}, 404, "tokenizer"),
           ("POST", "/wb/compare", {"tokenizers": ["tok"], "text": "x", "heldout": "tok"}, 400, "text"),
           ("POST", "/wb/compare", {"tokenizers": [], "text": "x"}, 400, "tokenizers"),
           ("POST", "/wb/compare", {"tokenizers": ["tok"], "corpus": "nope"}, 404, "corpus"),
           ("POST", "/wb/compare", {"tokenizers": ["tok"], "heldout": "tok-bad"}, 404, "heldout"),
           ("GET", "/wb/tokenizer?name=tok&merges=-1", None, 400, "merges"),
           ("GET", "/wb/tokenizer?name=served", None, 404, "tokenizer")]
    for method, path, body, want, param in bad:
        st, _, b = SRV.request(method, path, body)
        err = json.loads(b).get("error", {}) if b.startswith(b"{") else {}
        check(st == want and err.get("param") == param and "\n" not in err.get("message", "\n"), f"{method} {path} {body}: {st} {one_line(b.decode())}")


def c_data():
    j = wait(submit({"kind": "data", "name": "shards", "tokenizer": "tok", "corpus": ["english"], "val_fraction": 0.1})["id"])
    STATE["data"] = j["id"]
    check(j["state"] == "done", f"data job: {j['state']}: {j['error']}")
    o = j["outputs"]
    check(o["train_tokens"] > 10_000 and o["val_tokens"] > 1000, f"shards {o}")
    check(os.path.isfile(os.path.join(o["data"], "manifest.txt")), "no manifest")


def c_train():
    j = submit({"kind": "train", "name": "run1", "data": "shards", "preset": "tiny", "steps": 50, "batch": 4, "context": 64,
                "threads": 2, "lr": 3e-3, "eval_interval": 25, "eval_batches": 4, "device": "cpu", "ckpt_interval": 25,
                "lr_schedule": "linear", "warmup": 5, "min_lr": 1e-4})
    STATE["train"] = j["id"]
    evs = events(j["id"])  # from the start: the stored events, then the live ones, then the end
    check(evs and evs[-1][0] == "end", f"no end event: {one_line(json.dumps(evs[-2:]))}")
    end = evs[-1][1]
    check(end["state"] == "done", f"train job: {end['state']}: {end['error']}")
    steps = [d["step"] for e, d in evs if e == "progress" and d["stage"] == "train"]
    check(steps == list(range(1, 51)), f"train steps in the events: {steps}")
    losses = [d["loss"] for e, d in evs if e == "progress" and d["stage"] == "train"]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    check(last < first - 0.3, f"the loss did not fall: first five {first:.3f}, last five {last:.3f}")
    vals = [d["val_loss"] for e, d in evs if e == "progress" and d["stage"] == "eval"]
    check(len(vals) == 2, f"{len(vals)} eval events, not 2 (steps 25 and 50)")
    seqs = [d["seq"] for e, d in evs if e == "progress"]
    check(seqs == sorted(set(seqs)), "events out of order or repeated")
    runs = {r["name"]: r for r in SRV.json("GET", "/wb/runs")["runs"]}
    r = runs.get("run1")
    check(r and r["checkpoint_step"] == 50 and r["checkpoint"] and r["export"], f"run1 in /wb/runs: {r}")
    check(abs(r["val_loss"] - vals[-1]) < 1e-9, f"run1's val_loss {r['val_loss']}, the last eval's {vals[-1]}")
    cks = [(c["step"], c["val_loss"]) for c in r["checkpoints"]]
    check([c[0] for c in cks] == [25, 50] and [c[1] for c in cks] == vals, f"run1's checkpoints {cks}, evals {vals}")
    check(all(os.path.isfile(c["path"]) for c in r["checkpoints"]), "a checkpoint file is missing")
    lrs = [d["lr"] for e, d in evs if e == "progress" and d["stage"] == "train"]
    # linear: warmup to 3e-3 over 5 steps, then straight down to min_lr over steps 5..50; step k (1-based) runs at the
    # rate of index k-1, so the last is 1/45 of the way above min_lr
    want = [3e-3 * k / 5 for k in range(1, 6)] + [1e-4 + (3e-3 - 1e-4) * (1 - (i - 5) / 45) for i in range(5, 50)]
    check(max(abs(a - b) for a, b in zip(lrs, want)) < 1e-6, f"lr schedule {lrs[:6]} .. {lrs[-2:]}, not {want[:6]} .. {want[-2:]}")
    mem = [d.get("memory_bytes") for e, d in evs if e == "progress" and d["stage"] == "train"]
    check(all(m and m > 0 for m in mem) and evs[-2][1].get("device") == "cpu", f"memory {mem[:3]}")
    STATE["export"] = r["export"]


def c_stop():
    j = submit({"kind": "train", "name": "run2", "data": "shards", "preset": "tiny", "steps": 1_000_000, "batch": 4, "context": 64,
                "threads": 2, "ckpt_interval": 2})
    STATE["stopped"] = j["id"]
    early = events(j["id"], limit=3)  # a client that goes away: dropped, the job goes on
    check(len(early) == 3, f"{len(early)} events before the disconnect")
    wait(j["id"], until=lambda x: x["state"] == "running" and (x["progress"] or {}).get("step", 0) >= 5)
    time.sleep(0.3)
    check(SRV.json("GET", f"/wb/jobs/{j['id']}")["state"] == "running", "the job ended with its events client")
    SRV.json("POST", f"/wb/jobs/{j['id']}/pause")
    st, _, body = SRV.request("POST", f"/wb/jobs/{j['id']}/pause")
    check(st == 409 and b"already" in body, f"a second pause: {st}")
    p = wait(j["id"], until=lambda x: x["state"] == "paused")
    at = p["progress"]["done"]
    time.sleep(1.0)
    p = SRV.json("GET", f"/wb/jobs/{j['id']}")
    check(p["state"] == "paused" and p["progress"]["done"] == at and p["progress"]["stage"] == "paused", f"paused, yet {p['state']} {p['progress']}")
    st, _, body = SRV.request("POST", "/wb/jobs", {"kind": "train", "resume": "run2", "data": "shards", "steps": 2_000_000})
    check(st == 409 and j["id"].encode() in body, f"a second training of the paused run2: {st} {one_line(body.decode())}")
    SRV.json("POST", f"/wb/jobs/{j['id']}/resume")
    wait(j["id"], until=lambda x: x["state"] == "running" and (x["progress"] or {}).get("step", 0) > at + 2)
    SRV.json("POST", f"/wb/jobs/{j['id']}/stop")
    j = wait(j["id"])
    check(j["state"] == "stopped", f"stopped job: {j['state']}: {j['error']}")
    at = j["outputs"]["checkpoint_step"]
    check(5 <= at < 1_000_000, f"checkpoint_step {at}")
    runs = {r["name"]: r for r in SRV.json("GET", "/wb/runs")["runs"]}
    check(runs["run2"]["state"] == "stopped" and runs["run2"]["checkpoint_step"] == at and runs["run2"]["checkpoint"], f"run2: {runs['run2']}")
    st, _, body = SRV.request("POST", f"/wb/jobs/{j['id']}/stop")
    check(st == 409, f"a stopped job stopped again: {st}")
    st, _, body = SRV.request("POST", f"/wb/jobs/{STATE['tokenizer']}/stop")
    check(st == 409 and b"already" in body, f"stop of a finished tokenizer job: {st} {one_line(body.decode())}")
    for action in ("pause", "resume"):
        st, _, body = SRV.request("POST", f"/wb/jobs/{j['id']}/{action}")
        check(st == 409, f"{action} of a stopped job: {st}")
    st, _, body = SRV.request("POST", f"/wb/jobs/{j['id']}/jump")
    check(st == 404, f"an unknown job action: {st}")


def c_resume_export():
    """run1 resumed from its step-25 checkpoint to 60 steps; its step-50 checkpoint exported as q8_0."""
    st, _, body = SRV.request("POST", "/wb/jobs", {"kind": "train", "resume": "run1", "from_step": 7, "data": "shards", "steps": 60})
    check(st == 400 and b'"param":"from_step"' in body, f"a resume from a step with no checkpoint: {st} {one_line(body.decode())}")
    st, _, body = SRV.request("POST", "/wb/jobs", {"kind": "train", "name": "x", "from_step": 25, "data": "shards"})
    check(st == 400 and b'"param":"from_step"' in body, f"from_step without resume: {st}")
    j = wait(submit({"kind": "train", "resume": "run1", "from_step": 25, "data": "shards", "preset": "tiny", "steps": 60, "batch": 4,
                     "context": 64, "threads": 2, "lr": 3e-3, "eval_interval": 25, "eval_batches": 4, "ckpt_interval": 25})["id"])
    check(j["state"] == "done", f"resumed run: {j['state']} {j['error']}")
    steps = [c["step"] for c in j["outputs"]["checkpoints"]]
    check(steps == [50, 60], f"the resumed run's checkpoints {steps}")
    r = {r["name"]: r for r in SRV.json("GET", "/wb/runs")["runs"]}["run1"]
    check([c["step"] for c in r["checkpoints"]] == [25, 50, 60] and r["checkpoint_step"] == 60, f"run1 after the resume {r}")
    bad = [({"kind": "export", "run": "run1", "type": "q9_9"}, "type"), ({"kind": "export", "run": "run1", "step": 30}, "step"),
           ({"kind": "export", "run": "nope"}, "run"), ({"kind": "export", "run": "run1", "name": "../m"}, "name")]
    for body, param in bad:
        st, _, b = SRV.request("POST", "/wb/jobs", body)
        check(st == 400 and f'"param":"{param}"'.encode() in b, f"export {body}: {st} {one_line(b.decode())}")
    j = wait(submit({"kind": "export", "run": "run1", "step": 50, "type": "q8_0"})["id"])
    check(j["state"] == "done" and j["params"]["name"] == "run1-50-q8_0", f"export: {j['state']} {j['error']} {j['params']}")
    m = j["outputs"]["model"]
    check(os.path.isfile(m) and os.path.getsize(m) == j["outputs"]["bytes"], f"the export {m}")
    st, _, b = SRV.request("POST", "/wb/jobs", {"kind": "export", "run": "run1", "step": 50, "type": "q8_0"})
    check(st == 409, f"the same export again: {st}")
    STATE["quantized"] = m


def sse(path, body):
    """POSTs body and reads the SSE reply to its end: [(event, data)]."""
    c = SRV.conn(120)
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers=SRV.headers())
        r = c.getresponse()
        check(r.status == 200 and "event-stream" in (r.getheader("Content-Type") or ""), lambda: f"{path}: {r.status} {one_line(r.read().decode())}")
        out, ev = [], None
        for line in r:
            line = line.rstrip(b"\r\n")
            if line.startswith(b"event: "):
                ev = line[7:].decode()
            elif line.startswith(b"data: "):
                out.append((ev, json.loads(line[6:])))
        return out
    finally:
        c.close()


def c_generate_routes():
    ids = {m["id"]: m for m in SRV.json("GET", "/wb/models")["models"]}
    for want in ("run:run1@25", "run:run1@50", "run:run1@60", "run:run1", "gguf:run1-50-q8_0.gguf"):
        check(want in ids, f"{want} not in /wb/models: {sorted(ids)}")
    check(ids["run:run1@50"]["kind"] == "checkpoint" and not ids["run:run1@50"]["chat"], f"{ids['run:run1@50']}")
    for model in ("run:run1@50", "gguf:run1-50-q8_0.gguf"):
        evs = sse("/wb/generate", {"model": model, "prompt": "ROMEO:", "n_predict": 12, "temperature": 0.7, "seed": 3, "top_n": 5})
        kinds = [e for e, _ in evs]
        check(kinds[0] == "prompt" and kinds[-1] == "end" and set(kinds[1:-1]) == {"token"}, f"{model}: events {kinds}")
        prompt = evs[0][1]["tokens"]
        check("".join(t["piece"] for t in prompt).endswith("ROMEO:"), f"the prompt's pieces {prompt}")
        toks = [d for e, d in evs if e == "token"]
        check(len(toks) == evs[-1][1]["n_tokens"] and (evs[-1][1]["stop"] == "eos" or len(toks) == 12), f"{len(toks)} tokens, end {evs[-1][1]}")
        for t in toks:
            ps = [x["p"] for x in t["top"]]
            check(len(ps) == 5 and ps == sorted(ps, reverse=True) and 0 < sum(ps) <= 1 + 1e-6, f"top-5 {t['top']}")
            check(t["p"] <= ps[0] + 1e-9 and (t["id"] not in [x["id"] for x in t["top"]] or t["p"] in ps), f"the token's p {t}")
        none = [d for e, d in sse("/wb/generate", {"model": model, "prompt": "ROMEO:", "n_predict": 3, "top_n": 0}) if e == "token"]
        check(len(none) == 3 and all(t["top"] == [] and 0 < t["p"] <= 1 for t in none), f"top_n 0: {none}")
        greedy = sse("/wb/generate", {"model": model, "prompt": "ROMEO:", "n_predict": 6, "temperature": 0, "top_n": 1})
        g = [d for e, d in greedy if e == "token"]
        check(all(t["id"] == t["top"][0]["id"] for t in g), "temperature 0 did not take the top token")
    # the bundled model greedily: the same text as kiln generate's (its own session and sampler loop)
    check("bundled" in ids, f"the bundled model is not offered: {sorted(ids)}")
    evs = sse("/wb/generate", {"model": "bundled", "prompt": "ROMEO:", "n_predict": 24, "temperature": 0})
    text = "".join(d["text"] for e, d in evs if e == "token")
    p = subprocess.run([A.kiln, "generate", "-p", "ROMEO:", "-n", "24", "--temp", "0", "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(p.returncode == 0 and p.stdout.decode(errors="replace") == "ROMEO:" + text,
          lambda: f"bundled: the workbench wrote {one_line(text)}, kiln generate {one_line(p.stdout.decode(errors='replace'))}")
    bad = [({"model": "run:nope@5", "prompt": "x"}, 404, "model"), ({"model": "weird", "prompt": "x"}, 400, "model"),
           ({"model": "run:run1@50"}, 400, "messages"), ({"model": "run:run1@50", "prompt": "x", "messages": []}, 400, "prompt"),
           ({"model": "run:run1@50", "messages": [{"role": "user", "content": "hi"}]}, 400, "messages"),
           ({"model": "run:run1@50", "prompt": "x", "n_predict": 0}, 400, "n_predict"),
           ({"model": "run:run1@50", "prompt": "x", "top_n": 11}, 400, "top_n"),
           ({"model": "run:run1@50", "prompt": "x", "device": "cuda:9"}, 400, "device"),
           ({"model": "run:run1@50", "prompt": "x", "device": 5}, 400, "device"),
           ({"model": "run:run1@50", "prompt": "x", "temp": 1}, 400, "temp")]
    for body, want, param in bad:
        st, _, b = SRV.request("POST", "/wb/generate", body)
        check(st == want and f'"param":"{param}"'.encode() in b, f"generate {body}: {st} {one_line(b.decode())}")


def c_failure():
    # 'A' is the text of a byte token: kiln_bpe_train refuses it, and the job says why in one line
    j = wait(submit({"kind": "tokenizer", "name": "tok-bad", "corpus": ["english"], "vocab_size": 300, "special": ["A"]})["id"])
    STATE["failed"] = j["id"]
    check(j["state"] == "failed" and "byte token" in (j["error"] or "") and "\n" not in j["error"], f"failed job: {j['state']} {j['error']}")


def c_restart():
    with open(A.state) as f:
        before = json.load(f)
    jobs = {j["id"]: j for j in SRV.json("GET", "/wb/jobs")["jobs"]}
    for key, jid in before["ids"].items():
        check(jid in jobs, f"{key} job {jid} is gone after the restart")
        was = before["jobs"][jid]
        now = jobs[jid]
        check(now["state"] == was["state"] and now["outputs"] == was["outputs"] and now["error"] == was["error"],
              f"{jid}: {was['state']} {was['outputs']} then {now['state']} {now['outputs']}")
    runs = {r["name"]: r for r in SRV.json("GET", "/wb/runs")["runs"]}
    check(runs.get("run1", {}).get("checkpoint_step") == 60, f"run1 after the restart: {runs.get('run1')}")
    check([c["step"] for c in runs["run1"]["checkpoints"]] == [25, 50, 60], f"run1's checkpoints after the restart {runs['run1']}")


def c_generate():
    with open(A.state) as f:
        exp = json.load(f)["export"]
    check(exp and os.path.isfile(exp), f"run1's export {exp!r} is not a file")
    p = subprocess.run([A.kiln, "generate", "-m", exp, "-p", "ROMEO:", "-n", "24", "--temp", "0", "-t", "1"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    check(p.returncode == 0, lambda: f"kiln generate -m {exp}: status {p.returncode}: {one_line(p.stderr.decode(errors='replace'))}")
    out = p.stdout.decode(errors="replace")
    check(out.startswith("ROMEO:") and len(out) > len("ROMEO:") + 5, f"kiln generate's text: {one_line(out)}")


BEFORE = [("auth_no_model", c_auth_and_no_model), ("info", c_info), ("corpus", c_corpus), ("tokenizer", c_tokenizer), ("vocab", c_vocab),
          ("data", c_data), ("train", c_train), ("stop", c_stop), ("resume_export", c_resume_export), ("generate_routes", c_generate_routes),
          ("failure", c_failure)]
AFTER = [("restart", c_restart), ("generate", c_generate)]


def main():
    global A, SRV
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--examples", default="../shared/data/corpora")
    ap.add_argument("--state", required=True)
    ap.add_argument("phase", choices=["before", "after"])
    A = ap.parse_args()
    SRV = h.Server(A.url, A.api_key or None, timeout=120)
    if A.phase == "before":
        failed = h.run_checks("workbench", BEFORE, [])
        jobs = {j["id"]: j for j in SRV.json("GET", "/wb/jobs")["jobs"]}
        with open(A.state, "w") as f:
            json.dump({"ids": {k: v for k, v in STATE.items() if k not in ("export", "quantized")}, "jobs": jobs, "export": STATE.get("export", "")}, f)
        return 1 if failed else 0
    return 1 if h.run_checks("workbench", AFTER, []) else 0


if __name__ == "__main__":
    raise SystemExit(main())
