"""harness.py: what the end-to-end checks of tests/test_serve.sh share. A check is a function that raises Fail (or
any exception) to fail and Skip to be skipped; run_checks prints "ok NAME", "FAIL NAME: why" or "skip NAME: reason"
per check, the lines tests/run.sh counts. The HTTP helpers speak to the server under test with the standard library
only (http.client), so a status, a header or a half-read stream is seen exactly as it came; the openai package is
used where the brief asks for the real client."""
import http.client
import json
import socket
import subprocess
import sys
import time
import traceback
import urllib.parse


class Fail(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, why):
    """Fails the running check with why (a str, or a function that makes one) when cond is false."""
    if not cond:
        raise Fail(why() if callable(why) else why)


def one_line(s, limit=600):
    """s on one line, its control bytes escaped, at most limit characters: for a message that quotes the server."""
    s = s.encode("unicode_escape", "backslashreplace").decode("ascii") if isinstance(s, str) else repr(s)
    return s if len(s) <= limit else s[:limit] + "..."


class Server:
    """The server under test at url (http://127.0.0.1:PORT), with the API key every request sends unless told."""

    def __init__(self, url, api_key=None, timeout=60.0):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.url = u.hostname, u.port, url.rstrip("/")
        self.api_key, self.timeout = api_key, timeout

    def conn(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def headers(self, extra=None, auth=True):
        h = {"Content-Type": "application/json"}
        if auth and self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(extra or {})
        return h

    def request(self, method, path, body=None, headers=None, auth=True, timeout=None):
        """One request on its own connection: (status, headers as a lower-cased dict, body bytes). A dict or list body
        is sent as JSON, bytes and str as they are."""
        c = self.conn(timeout)
        try:
            data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
            if isinstance(data, str):
                data = data.encode()
            c.request(method, path, body=data, headers=self.headers(headers, auth))
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def json(self, method, path, body=None, want=200, **kw):
        """request() whose status must be want; returns the body parsed as JSON."""
        st, _, data = self.request(method, path, body, **kw)
        check(st == want, lambda: f"{method} {path}: status {st}, not {want}: {one_line(data.decode(errors='replace'))}")
        try:
            return json.loads(data)
        except ValueError:
            raise Fail(f"{method} {path}: the body is not JSON: {one_line(data.decode(errors='replace'))}")

    def stream(self, path, body, cancel_after=None, timeout=None):
        """POSTs body and reads the streamed reply: SSE ("data: {...}" events; "data: [DONE]" ends) or NDJSON (one
        object a line), told apart by the Content-Type. Returns (status, the events parsed, whether [DONE] came).
        With cancel_after=K it closes the connection after K events, as a client that goes away mid-stream."""
        c = self.conn(timeout)
        events, done = [], False
        try:
            c.request("POST", path, body=json.dumps(body).encode(), headers=self.headers())
            r = c.getresponse()
            if r.status != 200:
                return r.status, [json.loads(r.read() or b"null")], False
            ctype = (r.getheader("Content-Type") or "").lower()
            sse = "event-stream" in ctype
            check(sse or "ndjson" in ctype or "json" in ctype, f"POST {path}: stream Content-Type '{ctype}'")
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line:
                    continue
                if sse:
                    if not line.startswith(b"data:"):
                        continue  # "event:", "id:", comments
                    line = line[5:].strip()
                    if line == b"[DONE]":
                        done = True
                        break
                events.append(json.loads(line))
                if cancel_after is not None and len(events) >= cancel_after:
                    break
            return 200, events, done
        finally:
            if cancel_after is not None and c.sock:
                c.sock.shutdown(socket.SHUT_RDWR)  # the peer sees the connection go, not a slow reader
            c.close()


def wait_idle(srv, n_slots, seconds=10.0):
    """Polls /slots until no slot is processing; returns the last /slots answer (the caller checks it)."""
    end = time.time() + seconds
    while True:
        slots = srv.json("GET", "/slots")
        busy = [s for s in slots if s.get("is_processing")]
        if not busy or time.time() > end:
            return slots
        time.sleep(0.1)


def kiln_generate(kiln, model, prompt, n, chat=False, ctx=None, sample=None):
    """kiln generate's text for prompt, greedy or under sample's options (CLI flag -> value): stdout without the
    echoed prompt (generate echoes it unless --chat)."""
    cmd = [kiln, "generate", "-p", prompt, "-n", str(n), "-t", "1"]
    for k, v in (sample or {"--temp": 0}).items():
        cmd += [k, str(v)]
    if model:
        cmd += ["-m", model]
    if chat:
        cmd.append("--chat")
    if ctx:
        cmd += ["-c", str(ctx)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(p.returncode == 0, lambda: f"{' '.join(cmd)}: status {p.returncode}: {one_line(p.stderr.decode(errors='replace'))}")
    out = p.stdout.decode()
    if not chat:
        check(out.startswith(prompt), f"kiln generate did not echo the prompt: {one_line(out)}")
        out = out[len(prompt):]
    return out


def run_checks(prefix, checks, only):
    """Runs the checks named in only (all when empty) in order; returns the number failed."""
    failed = 0
    for name, fn in checks:
        if only and name not in only:
            continue
        full = f"{prefix}_{name}"
        try:
            fn()
            print(f"ok {full}", flush=True)
        except Skip as e:
            print(f"skip {full}: {one_line(str(e))}", flush=True)
        except Fail as e:
            failed += 1
            print(f"FAIL {full}: {one_line(str(e))}", flush=True)
        except Exception as e:  # a crash of the check is a failure, with where it happened
            failed += 1
            tb = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {full}: {type(e).__name__}: {one_line(str(e))} (line {tb.lineno})", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit("harness.py is imported by tests/serve/checks.py")
