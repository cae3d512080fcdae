"""spec_serve.py: speculative decoding's speed in a running `kiln serve` (docs/speculative.md's server table).

    python3 bench/spec_serve.py http://127.0.0.1:PORT ['{"name": "prompt", ...}'] [N_PREDICT (200)]

Each prompt runs at temperature 0 with ignore_eos for N_PREDICT tokens, plain (speculative.n_max 0) and with the
server's drafter: the median of 3 single requests' timings.predicted_per_second, then 4 requests at once as tokens
over wall time, and the drafts verified and taken of the last single run."""
import json
import statistics
import sys
import threading
import time
import urllib.request

DEFAULT = {"repetitive": "KING HENRY:\nO God, O God, O God, O God! O God, O God, O God, O God!", "plain": "ROMEO:"}


def post(url, body):
    rq = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(rq, timeout=600) as r:
        return json.loads(r.read())


def main():
    url = sys.argv[1]
    prompts = json.loads(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    for name, p in prompts.items():
        for label, kw in (("plain", {"speculative.n_max": 0}), ("spec", {})):
            body = {"prompt": p, "n_predict": n, "temperature": 0, "cache_prompt": False, "ignore_eos": True, **kw}
            runs = [post(url, body) for _ in range(3)]
            rate = statistics.median(r["timings"]["predicted_per_second"] for r in runs)
            t = runs[-1]["timings"]
            got = []
            ts = [threading.Thread(target=lambda: got.append(post(url, body)["tokens_predicted"])) for _ in range(4)]
            t0 = time.time()
            for th in ts:
                th.start()
            for th in ts:
                th.join()
            agg = sum(got) / (time.time() - t0)
            print(f"{name} {label}: 1 client {rate:.1f} tok/s, 4 clients {agg:.1f} tok/s, "
                  f"drafts {t.get('draft_n_accepted', '-')} of {t.get('draft_n', '-')}", flush=True)


if __name__ == "__main__":
    main()
