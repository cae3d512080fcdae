"""workbench.py: the checks of tests/test_workbench.sh against a running `kiln serve --workbench` (no model), with
the standard library only. Two phases over one data folder, the server restarted between them:
  before  upload a corpus, train a tokenizer, make shards, train ~50 steps of the tiny preset on the CPU reading its
          SSE events live (the step count rising, the loss falling), the run listed with its checkpoint, a second
          run stopped mid-way ("stopped", its checkpoint listed) while an events client that went away is dropped,
          a job that fails with the library's one-line error, the model routes' 503, auth
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


def c_data():
    j = wait(submit({"kind": "data", "name": "shards", "tokenizer": "tok", "corpus": ["english"], "val_fraction": 0.1})["id"])
    STATE["data"] = j["id"]
    check(j["state"] == "done", f"data job: {j['state']}: {j['error']}")
    o = j["outputs"]
    check(o["train_tokens"] > 10_000 and o["val_tokens"] > 1000, f"shards {o}")
    check(os.path.isfile(os.path.join(o["data"], "manifest.txt")), "no manifest")


def c_train():
    j = submit({"kind": "train", "name": "run1", "data": "shards", "preset": "tiny", "steps": 50, "batch": 4, "context": 64,
                "threads": 2, "lr": 3e-3, "eval_interval": 25, "eval_batches": 4, "device": "cpu"})
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
    STATE["export"] = r["export"]


def c_stop():
    j = submit({"kind": "train", "name": "run2", "data": "shards", "preset": "tiny", "steps": 1_000_000, "batch": 4, "context": 64,
                "threads": 2})
    STATE["stopped"] = j["id"]
    early = events(j["id"], limit=3)  # a client that goes away: dropped, the job goes on
    check(len(early) == 3, f"{len(early)} events before the disconnect")
    wait(j["id"], until=lambda x: x["state"] == "running" and (x["progress"] or {}).get("step", 0) >= 5)
    time.sleep(0.3)
    check(SRV.json("GET", f"/wb/jobs/{j['id']}")["state"] == "running", "the job ended with its events client")
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
    check(runs.get("run1", {}).get("checkpoint_step") == 50, f"run1 after the restart: {runs.get('run1')}")


def c_generate():
    with open(A.state) as f:
        exp = json.load(f)["export"]
    check(exp and os.path.isfile(exp), f"run1's export {exp!r} is not a file")
    p = subprocess.run([A.kiln, "generate", "-m", exp, "-p", "ROMEO:", "-n", "24", "--temp", "0", "-t", "1"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    check(p.returncode == 0, lambda: f"kiln generate -m {exp}: status {p.returncode}: {one_line(p.stderr.decode(errors='replace'))}")
    out = p.stdout.decode(errors="replace")
    check(out.startswith("ROMEO:") and len(out) > len("ROMEO:") + 5, f"kiln generate's text: {one_line(out)}")


BEFORE = [("auth_no_model", c_auth_and_no_model), ("corpus", c_corpus), ("tokenizer", c_tokenizer), ("data", c_data), ("train", c_train),
          ("stop", c_stop), ("failure", c_failure)]
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
            json.dump({"ids": {k: v for k, v in STATE.items() if k != "export"}, "jobs": jobs, "export": STATE.get("export", "")}, f)
        return 1 if failed else 0
    return 1 if h.run_checks("workbench", AFTER, []) else 0


if __name__ == "__main__":
    raise SystemExit(main())
