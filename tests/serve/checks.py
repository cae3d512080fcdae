"""checks.py: the end-to-end checks of `kiln serve`, run by tests/test_serve.sh against a server it started.

    python3 tests/serve/checks.py --url http://127.0.0.1:PORT --kiln build/kiln [--model M.gguf] [--api-key K]
        [--prefix NAME] [--slots N] [--slot-ctx N] [--state FILE] [--pid PID] [--spec lookup|draft_model [--self-draft]]
        CHECK...

Each CHECK (see CHECKS) prints "ok|FAIL|skip PREFIX_CHECK". --model is the file the server runs (none: the bundled
default), for the `kiln generate` comparisons; --slot-ctx the context of one slot (-c / -np), for the over-long
prompt; --state a JSON file that the persistence phases (run against successive servers) share; --pid the server's
process, for the SIGTERM check; --spec the server's drafter, for the spec_* checks (--self-draft: the model is its own
draft, so every draft must be taken)."""
import argparse
import json
import os
import re
import signal
import threading
import time

import harness as h
from harness import Fail, Skip, check

A = None    # the parsed arguments
SRV = None  # harness.Server

# Prompts per model: the bundled model knows Shakespeare, SmolLM2 English.
PROMPTS = {
    "default": ["ROMEO:", "First Citizen:\nBefore we proceed", "KING RICHARD III:\nNow is", "JULIET:\nO Romeo,",
                "MENENIUS:\nWhat work's", "HAMLET:\nTo be", "LADY MACBETH:\nOut,", "GLOUCESTER:\nI do"],
    "smollm": ["The capital of France is", "Water boils at", "The three primary colors are", "Once upon a time",
               "In computer science, a hash table", "The largest planet", "def fibonacci(n):", "Photosynthesis is"],
}


def prompts():
    return PROMPTS["smollm" if A.model and "smollm" in os.path.basename(A.model).lower() else "default"]


def openai_client(api_key=None):
    import openai
    return openai.OpenAI(base_url=SRV.url + "/v1", api_key=api_key or A.api_key or "none", max_retries=0, timeout=60)


def model_id():
    return SRV.json("GET", "/v1/models")["data"][0]["id"]


# ---------------------------------------------------------------- OpenAI, through the openai package

def c_models():
    ms = openai_client().models.list()
    ids = [m.id for m in ms.data]
    check(len(ids) >= 1, "GET /v1/models lists no model")
    check(all(isinstance(i, str) and i for i in ids), f"model ids {ids!r}")


def c_chat():
    r = openai_client().chat.completions.create(model=model_id(), messages=[{"role": "user", "content": prompts()[0]}],
                                               max_tokens=8, temperature=0)
    check(r.object == "chat.completion", f"object '{r.object}'")
    check(len(r.choices) == 1 and r.choices[0].message.role == "assistant", f"choices {r.choices!r}")
    check(isinstance(r.choices[0].message.content, str), "no content")
    check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason!r}")
    u = r.usage
    check(u is not None and u.prompt_tokens > 0 and 0 < u.completion_tokens <= 8 and
          u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u!r}")
    check(r.choices[0].finish_reason == "stop" or u.completion_tokens == 8, f"length finish after {u.completion_tokens} tokens")


def c_chat_stream():
    cl = openai_client()
    msgs = [{"role": "user", "content": prompts()[1]}]
    s = cl.chat.completions.create(model=model_id(), messages=msgs, max_tokens=8, temperature=0, stream=True,
                                   stream_options={"include_usage": True})
    text, finish, usage, n = "", None, None, 0
    for ch in s:
        n += 1
        check(ch.object == "chat.completion.chunk", f"chunk object '{ch.object}'")
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    check(n >= 2, f"only {n} chunks")
    check(finish in ("stop", "length"), f"finish_reason {finish!r}")
    check(usage is not None and usage.completion_tokens > 0, f"no usage in the last chunk (include_usage): {usage!r}")
    whole = cl.chat.completions.create(model=model_id(), messages=msgs, max_tokens=8, temperature=0)
    check(text == whole.choices[0].message.content,
          lambda: f"streamed '{h.one_line(text)}' != non-stream '{h.one_line(whole.choices[0].message.content)}'")


def c_completions():
    cl = openai_client()
    r = cl.completions.create(model=model_id(), prompt=prompts()[0], max_tokens=8, temperature=0)
    check(r.object == "text_completion", f"object '{r.object}'")
    check(len(r.choices) == 1 and isinstance(r.choices[0].text, str), f"choices {r.choices!r}")
    u = r.usage
    check(u and u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u!r}")
    parts = [c.choices[0].text for c in cl.completions.create(model=model_id(), prompt=prompts()[0], max_tokens=8,
                                                                temperature=0, stream=True) if c.choices]
    check("".join(parts) == r.choices[0].text, lambda: f"stream '{h.one_line(''.join(parts))}' != '{h.one_line(r.choices[0].text)}'")


def c_usage_counts():
    """prompt_tokens is the prompt's token count as /tokenize counts it (with the BOS the model adds), and
    completion_tokens the tokens generated: with an n that EOS cannot cut short on this prompt, exactly n."""
    p = prompts()[2]
    toks = SRV.json("POST", "/tokenize", {"content": p, "add_special": True})["tokens"]
    r = openai_client().completions.create(model=model_id(), prompt=p, max_tokens=5, temperature=0)
    check(r.usage.prompt_tokens == len(toks), f"prompt_tokens {r.usage.prompt_tokens}, /tokenize counts {len(toks)}")
    check(r.choices[0].finish_reason == "stop" or r.usage.completion_tokens == 5,
          f"finish {r.choices[0].finish_reason} after {r.usage.completion_tokens} of 5")


def expect_400(path, body, field):
    st, _, data = SRV.request("POST", path, body)
    check(st == 400, lambda: f"{path} {h.one_line(json.dumps(body)[:200])}: status {st}, not 400: {h.one_line(data.decode(errors='replace'))}")
    try:
        err = json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        raise Fail(f"{path}: a 400 without an 'error' object: {h.one_line(data.decode(errors='replace'))}")
    said = (err.get("param") or "") + " " + (err.get("message") or "")
    check(field in said, f"{path}: the error does not name '{field}': {h.one_line(json.dumps(err))}")


def c_errors():
    import openai
    m = model_id()
    user = [{"role": "user", "content": "hi"}]
    chat, cmpl = "/v1/chat/completions", "/v1/completions"
    expect_400(chat, {"model": m, "messages": "hi"}, "messages")
    expect_400(chat, {"model": m, "messages": [{"role": "user", "content": 7}]}, "content")
    expect_400(chat, {"model": m, "messages": user, "max_tokens": "ten"}, "max_tokens")
    expect_400(chat, {"model": m, "messages": user, "max_tokens": -3}, "max_tokens")
    expect_400(chat, {"model": m, "messages": user, "temperature": "hot"}, "temperature")
    expect_400(chat, {"model": m, "messages": user, "temperature": -1}, "temperature")
    expect_400(chat, {"model": m, "messages": user, "top_p": 1.5}, "top_p")
    expect_400(chat, {"model": m, "messages": user, "stream": "yes"}, "stream")
    expect_400(cmpl, {"model": m, "prompt": 42}, "prompt")
    expect_400(cmpl, {"model": m, "prompt": "x", "top_k": -5}, "top_k")
    expect_400("/completion", {"prompt": "x", "n_predict": "many"}, "n_predict")
    expect_400("/completion", {"prompt": [1, -4]}, "prompt")
    # function calling is refused, never silently ignored
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
    expect_400(chat, {"model": m, "messages": user, "tools": [tool]}, "tools")
    expect_400(chat, {"model": m, "messages": user, "tool_choice": "required"}, "tool_choice")
    expect_400(chat, {"model": m, "messages": user, "functions": [tool["function"]]}, "functions")
    r = SRV.json("POST", chat, {"model": m, "messages": user, "max_tokens": 2, "tools": [], "tool_choice": "none"})
    check(r.get("choices"), f"tools [] with tool_choice none: {h.one_line(json.dumps(r))}")
    # Ollama's generate: a field of the wrong type, system with raw, a Go template override
    gen = "/api/generate"
    expect_400(gen, {"model": m, "prompt": "x", "system": ["a"]}, "system")
    expect_400(gen, {"model": m, "prompt": "x", "raw": 1}, "raw")
    expect_400(gen, {"model": m, "prompt": "x", "raw": True, "system": "Be brief."}, "system")
    expect_400(gen, {"model": m, "prompt": "x", "template": "{{ .System }} {{ .Prompt }}"}, "template")
    expect_400(gen, {"model": m, "prompt": "x", "format": "yaml"}, "format")
    expect_400(gen, {"model": m, "prompt": "x", "format": {"not": {}}}, "format")
    expect_400("/api/chat", {"model": m, "messages": user, "tools": [tool]}, "tools")
    # a prompt longer than one slot's context
    long_prompt = " ".join(["the"] * (2 * A.slot_ctx))  # about one token a word: twice the slot's context
    expect_400(cmpl, {"model": m, "prompt": long_prompt, "max_tokens": 4}, "prompt")
    expect_400(chat, {"model": m, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 4}, "messages")
    st, _, data = SRV.request("POST", chat, b"{not json")
    check(st == 400, f"a malformed body: status {st}")
    # the real client sees a 400 as BadRequestError
    try:
        openai_client().chat.completions.create(model=m, messages=user, temperature=-1)
        raise Fail("temperature -1 was accepted by the server")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"status {e.status_code}")
    try:
        openai_client().chat.completions.create(model=m, messages=user, tools=[tool])
        raise Fail("tools were accepted by the server")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "tools" in str(e), f"tools: {e}")
    # the server still answers
    r = openai_client().completions.create(model=m, prompt=prompts()[0], max_tokens=2, temperature=0)
    check(r.usage.completion_tokens > 0, "no tokens after the errors")


def c_routes():
    st, _, _ = SRV.request("GET", "/no/such/route")
    check(st == 404, f"GET /no/such/route: status {st}, not 404")
    st, _, _ = SRV.request("GET", "/v1/chat/completions")
    check(st == 405, f"GET /v1/chat/completions: status {st}, not 405")
    st, _, _ = SRV.request("DELETE", "/completion")
    check(st == 405, f"DELETE /completion: status {st}, not 405")
    st, _, data = SRV.request("GET", "/health", auth=False)
    check(st == 200, f"GET /health: status {st}")


def c_auth():
    import openai
    if not A.api_key:
        raise Skip("the server runs without --api-key")
    for hdr in ({}, {"Authorization": "Bearer wrong-" + A.api_key}, {"Authorization": "Bearer " + A.api_key[:-1]},
                {"Authorization": A.api_key}):
        for method, path in (("GET", "/v1/models"), ("POST", "/completion"), ("GET", "/props"), ("GET", "/slots")):
            st, _, data = SRV.request(method, path, {"prompt": "x"} if method == "POST" else None, headers=hdr, auth=False)
            check(st == 401, f"{method} {path} with {hdr or 'no key'}: status {st}, not 401")
            try:
                check("error" in json.loads(data), "no error object")
            except ValueError:
                raise Fail(f"{path}: the 401 is not JSON: {h.one_line(data.decode(errors='replace'))}")
    st, _, _ = SRV.request("GET", "/health", auth=False)
    check(st == 200, f"/health without a key: status {st}, not 200")
    try:
        openai_client(api_key="not-the-key").models.list()
        raise Fail("a wrong key was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"status {e.status_code}")


def c_greedy_generate():
    """/v1/completions at temperature 0 writes what `kiln generate --temp 0` writes for the prompt and count."""
    for p in prompts()[:2]:
        want = h.kiln_generate(A.kiln, A.model, p, 12)
        r = openai_client().completions.create(model=model_id(), prompt=p, max_tokens=12, temperature=0)
        check(r.choices[0].text == want, lambda: f"prompt '{h.one_line(p)}': server '{h.one_line(r.choices[0].text)}' != generate '{h.one_line(want)}'")


def c_sample_generate():
    """Sampling with a seed (temperature, top-k, top-p, min-p and a repeat penalty) writes what `kiln generate` writes
    with the same settings and seed, one request alone and four at once with seeds of their own: the server draws its
    slots' tokens on the backend in one step (kiln_context_decode_sampled), generate on the host from its logits."""
    ps, n = prompts(), 24

    def opts(seed):
        return {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.15, "seed": seed}

    def flags(seed):
        return {"--temp": 0.9, "--top-k": 40, "--top-p": 0.95, "--min-p": 0.05, "--repeat-penalty": 1.15, "-s": seed}
    want = [h.kiln_generate(A.kiln, A.model, ps[i % len(ps)], n, sample=flags(100 + i)) for i in range(4)]
    r = completion(ps[0], n, cache_prompt=False, **opts(100))
    check(r["content"] == want[0], lambda: f"seed 100: server '{h.one_line(r['content'])}' != generate '{h.one_line(want[0])}'")
    greedy = h.kiln_generate(A.kiln, A.model, ps[0], n)
    check(want[0] != greedy, "the sampled text is the greedy one: the settings did nothing")
    got, errs = [None] * 4, []

    def client(i):
        try:
            got[i] = completion(ps[i % len(ps)], n, cache_prompt=False, **opts(100 + i))["content"]
        except Exception as e:
            errs.append(f"client {i}: {type(e).__name__}: {e}")
    ts = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    check(not errs, lambda: "; ".join(errs))
    for i in range(4):
        check(got[i] == want[i], lambda: f"client {i} (seed {100 + i}): '{h.one_line(got[i] or '')}' != generate '{h.one_line(want[i])}'")


def c_greedy_chat():
    """/v1/chat/completions at temperature 0, one user turn, writes what `kiln generate --chat --temp 0` writes."""
    if A.no_template:  # the server falls back to chatml as text; generate --chat refuses a vocab without <|im_end|>
        raise Skip("the model has no chat template (kiln generate --chat has no equivalent; SmolLM2's run compares chat)")
    p = prompts()[0]
    msgs = [{"role": "user", "content": p}]
    want = h.kiln_generate(A.kiln, A.model, p, 12, chat=True)
    r = openai_client().chat.completions.create(model=model_id(), messages=msgs, max_tokens=12, temperature=0)
    got = r.choices[0].message.content
    check(got == want, lambda: f"server '{h.one_line(got)}' != kiln generate --chat '{h.one_line(want)}'")


USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {k: {"type": "integer", "minimum": 0} for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
FINISH = {"enum": ["stop", "length"]}
SCHEMAS = {  # the fields of OpenAI's API reference that clients read, as JSON Schemas
    "chat": {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"], "properties": {
        "id": {"type": "string", "minLength": 1}, "object": {"const": "chat.completion"}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": USAGE,
        "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "object", "required": ["index", "message", "finish_reason"],
                    "properties": {"index": {"const": 0}, "finish_reason": FINISH, "message": {"type": "object", "required": ["role", "content"],
                                   "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}}}}}}}},
    "completion": {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"], "properties": {
        "object": {"const": "text_completion"}, "usage": USAGE,
        "choices": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["index", "text", "finish_reason"],
                    "properties": {"text": {"type": "string"}, "finish_reason": FINISH}}}}},
    "models": {"type": "object", "required": ["object", "data"], "properties": {"object": {"const": "list"},
               "data": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["id", "object"],
                        "properties": {"id": {"type": "string"}, "object": {"const": "model"}}}}}},
    "error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["message", "type"],
              "properties": {"message": {"type": "string", "minLength": 1}, "type": {"type": "string"}}}}},
}


def c_schemas():
    """The raw answers of the OpenAI routes (a success, a stream chunk, an error) against OpenAI's shapes."""
    try:
        import jsonschema
    except ImportError:
        raise Skip("python's jsonschema package is absent (pip install jsonschema)")
    m = model_id()

    def valid(name, doc):
        try:
            jsonschema.validate(doc, SCHEMAS[name])
        except jsonschema.ValidationError as e:
            raise Fail(f"{name}: {e.message} at {list(e.absolute_path)}: {h.one_line(json.dumps(doc)[:300])}")
    valid("models", SRV.json("GET", "/v1/models"))
    valid("chat", SRV.json("POST", "/v1/chat/completions", {"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
    valid("completion", SRV.json("POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 3}))
    valid("error", SRV.json("POST", "/v1/completions", {"model": m, "prompt": "hi", "max_tokens": "x"}, want=400))
    st, ev, done = SRV.stream("/v1/chat/completions", {"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                                       "stream": True})
    check(st == 200 and done, f"stream: status {st}, [DONE] {done}")
    for e in ev:
        check(e.get("object") == "chat.completion.chunk" and isinstance(e.get("choices"), list), f"chunk {h.one_line(json.dumps(e))}")


# ---------------------------------------------------------------- llama-server's routes

def completion(prompt, n, **kw):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": True}
    body.update(kw)
    return SRV.json("POST", "/completion", body)


def c_completion():
    p = prompts()[0]
    r = completion(p, 8)
    for k in ("content", "tokens_predicted", "tokens_evaluated", "stop", "id_slot", "timings"):
        check(k in r, f"/completion's answer lacks '{k}': {sorted(r)}")
    check(0 < r["tokens_predicted"] <= 8, f"tokens_predicted {r['tokens_predicted']}")
    ids = SRV.json("POST", "/tokenize", {"content": p, "add_special": True})["tokens"]
    r2 = completion(ids, 8)
    check(r2["content"] == r["content"], lambda: f"token-id prompt '{h.one_line(r2['content'])}' != text prompt '{h.one_line(r['content'])}'")
    check(r2["tokens_evaluated"] == len(ids), f"tokens_evaluated {r2['tokens_evaluated']} for {len(ids)} prompt ids")
    want = h.kiln_generate(A.kiln, A.model, p, 8)
    check(r["content"] == want, lambda: f"/completion '{h.one_line(r['content'])}' != kiln generate '{h.one_line(want)}'")


def c_completion_probs():
    r = completion(prompts()[1], 6, n_probs=3)
    probs = r.get("completion_probabilities")
    check(isinstance(probs, list) and len(probs) == r["tokens_predicted"],
          f"completion_probabilities: {h.one_line(json.dumps(probs)[:300])} for {r['tokens_predicted']} tokens")
    for p in probs:
        tops = p.get("top_logprobs", p.get("probs", p.get("top_probs")))
        check(isinstance(tops, list) and len(tops) == 3, f"not 3 top entries: {h.one_line(json.dumps(p)[:300])}")
        lps = [t.get("logprob", t.get("prob")) for t in tops]
        check(all(isinstance(x, (int, float)) for x in lps), f"top values {lps}")
        check(lps == sorted(lps, reverse=True), f"top entries not in descending order: {lps}")
        if "id" in p and "id" in tops[0]:  # greedy: the token chosen is the most likely one
            check(p["id"] == tops[0]["id"], f"greedy chose {p['id']}, the top entry is {tops[0]['id']}")


def c_completion_stream():
    p = prompts()[2]
    whole = completion(p, 8)
    st, ev, _ = SRV.stream("/completion", {"prompt": p, "n_predict": 8, "temperature": 0, "stream": True})
    check(st == 200, f"status {st}: {ev}")
    check(ev and ev[-1].get("stop") is True, f"the last event is not a stop: {h.one_line(json.dumps(ev[-1:]))}")
    text = "".join(e.get("content", "") for e in ev)
    check(text == whole["content"], lambda: f"stream '{h.one_line(text)}' != non-stream '{h.one_line(whole['content'])}'")


def c_tokenize_roundtrip():
    for text in (prompts()[3], "Hello, world!  Two  spaces\nand a newline", "caf\u00e9 \u2014 \u65e5\u672c"):
        toks = SRV.json("POST", "/tokenize", {"content": text})["tokens"]
        check(toks and all(isinstance(t, int) for t in toks), f"tokens {toks}")
        back = SRV.json("POST", "/detokenize", {"tokens": toks})["content"]
        check(back == text, lambda: f"'{h.one_line(text)}' -> {toks} -> '{h.one_line(back)}'")
    pieces = SRV.json("POST", "/tokenize", {"content": "Hello", "with_pieces": True})["tokens"]
    check(all(isinstance(t, dict) and "id" in t and "piece" in t for t in pieces), f"with_pieces: {pieces}")
    expect_400("/detokenize", {"tokens": [1, "two"]}, "tokens")


def c_apply_template():
    msgs = [{"role": "user", "content": "What is up?"}]
    r = SRV.json("POST", "/apply-template", {"messages": msgs})
    check(isinstance(r.get("prompt"), str) and "What is up?" in r["prompt"], f"prompt {r!r}")
    expect_400("/apply-template", {"messages": 3}, "messages")


def c_props():
    r = SRV.json("GET", "/props")
    check(r.get("total_slots") == A.slots, f"total_slots {r.get('total_slots')}, the server has {A.slots}")
    check(isinstance(r.get("default_generation_settings"), dict), f"default_generation_settings: {sorted(r)}")


def c_slots():
    s = h.wait_idle(SRV, A.slots)
    check(isinstance(s, list) and len(s) == A.slots, f"/slots: {h.one_line(json.dumps(s)[:300])}")
    check(sorted(x.get("id") for x in s) == list(range(A.slots)), f"slot ids {[x.get('id') for x in s]}")
    check(not any(x.get("is_processing") for x in s), "a slot is busy with nothing running")


def parse_prometheus(text):
    """{name: value} of the sample lines (labels kept in the name); fails on a line that is not Prometheus text."""
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (-?[0-9.eE+-]+|NaN|[+-]Inf)( -?[0-9]+)?$')
    for ln in text.splitlines():
        if ln.startswith("# "):
            check(re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* ", ln), f"/metrics: a comment that is not HELP or TYPE: '{h.one_line(ln)}'")
            continue
        if not ln.strip() or ln.startswith("#"):
            continue
        m = line_re.match(ln)
        check(m, f"/metrics: not a sample line: '{h.one_line(ln)}'")
        out[m.group(1)] = float(m.group(3))
    return out


def c_metrics():
    st, hdr, data = SRV.request("GET", "/metrics")
    if st == 501 or (st == 404 and not A.metrics):
        raise Skip("the server runs without --metrics")
    check(st == 200, f"GET /metrics: status {st}")
    check("text/plain" in hdr.get("content-type", ""), f"Content-Type {hdr.get('content-type')}")
    before = parse_prometheus(data.decode())

    def find(m, suffix):
        keys = [k for k in m if k.endswith(suffix)]
        check(keys, f"/metrics has no *{suffix}: {sorted(m)[:20]}")
        return m[keys[0]]
    completion(prompts()[4], 6)
    after = parse_prometheus(SRV.request("GET", "/metrics")[2].decode())
    for c in ("tokens_predicted_total", "prompt_tokens_total"):
        check(find(after, c) > find(before, c), f"{c} did not grow: {find(before, c)} -> {find(after, c)}")
    check(find(after, "tokens_predicted_total") - find(before, "tokens_predicted_total") >= 1, "predicted count")
    find(after, "requests_processing")
    # kiln's step counters: the request took steps (its prompt's, then a token each) of at least a row each
    steps = find(after, "n_decode_total") - find(before, "n_decode_total")
    rows = find(after, "kiln:step_rows_total") - find(before, "kiln:step_rows_total")
    check(steps >= 1 and rows >= steps, f"kiln:step_rows_total grew by {rows} over {steps} decodes")
    for c in ("kiln:step_decode_seconds_total", "kiln:step_emit_seconds_total"):
        check(find(after, c) > find(before, c), f"{c} did not grow: {find(before, c)} -> {find(after, c)}")
    check(find(after, "kiln:steps_mixed_total") - find(before, "kiln:steps_mixed_total") >= 1, "kiln:steps_mixed_total: the prompt's step")


# ---------------------------------------------------------------- grammars

def c_grammar():
    """llama-server's "grammar" (GBNF) on /completion, streamed and not, and on /v1/completions: every text is a
    whole sentence of the grammar and ends there (stop_type eos), over several seeds at temperature 1. A bad grammar
    is a 400 naming it, a too ambiguous one too, at its first step or a later one."""
    g = 'root ::= (" " [a-z]+){2,5} "."'
    sentence = re.compile(r"^( [a-z]+){2,5}\.$")
    for seed in range(6):
        r = completion(prompts()[seed % len(prompts())], 48, grammar=g, temperature=1.0, seed=seed, cache_prompt=False)
        check(sentence.match(r["content"]), f"seed {seed}: {r['content']!r} is not a sentence of {g}")
        check(r.get("stop_type") == "eos", f"seed {seed}: stop_type {r.get('stop_type')} (the grammar's end is EOS)")
    st, ev, _ = SRV.stream("/completion", {"prompt": prompts()[0], "n_predict": 48, "grammar": g, "stream": True})
    check(st == 200, f"stream: status {st}")
    text = "".join(e.get("content", "") for e in ev if isinstance(e, dict))
    check(sentence.match(text), f"stream: {text!r} is not a sentence of {g}")
    r = SRV.json("POST", "/v1/completions", {"model": model_id(), "prompt": "x", "max_tokens": 16,
                                               "grammar": 'root ::= "yes" | "no"'})
    check(r["choices"][0]["text"] in ("yes", "no") and r["choices"][0]["finish_reason"] == "stop",
          f"/v1/completions with a grammar: {h.one_line(json.dumps(r)[:300])}")
    expect_400("/completion", {"prompt": "x", "grammar": "root ::= foo"}, "grammar")
    expect_400("/completion", {"prompt": "x", "grammar": 'root ::= "a'}, "grammar")
    expect_400("/completion", {"prompt": "x", "grammar": 7}, "grammar")
    expect_400("/completion", {"prompt": "x", "grammar": 'root ::= "a"', "ignore_eos": True}, "grammar")
    # too ambiguous (64^3 stacks in one step): refused when parsed; after a "q", the request's error, and the
    # server goes on
    wide = "".join(f"r{i} ::= " + " | ".join(f'r{i + 1} "{k}"' for k in range(64)) + "\n" for i in range(3)) + 'r3 ::= "a"\n'
    expect_400("/completion", {"prompt": "x", "grammar": "root ::= r0\n" + wide}, "grammar")
    st, _, data = SRV.request("POST", "/completion", {"prompt": "x", "n_predict": 8, "grammar": 'root ::= "q" r0\n' + wide})
    check(st == 400 and b"too ambiguous" in data, lambda: f"a later step too ambiguous: status {st}: {h.one_line(data.decode(errors='replace'))[:300]}")
    r = completion("x", 8, grammar='root ::= "yes" | "no"', cache_prompt=False)
    check(r["content"] in ("yes", "no"), f"after the ambiguous grammar: {r['content']!r}")


def c_schema():
    """JSON Schema on every route that takes one: llama-server's json_schema, OpenAI's response_format (json_schema
    and json_object) and Ollama's format; each finished answer parses and validates (the jsonschema package)."""
    try:
        import jsonschema
    except ImportError:
        raise Skip("the python jsonschema package is missing")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
              "maximum": 150}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
              "required": ["name", "age"], "additionalProperties": False}
    m, user = model_id(), [{"role": "user", "content": "Describe a person."}]
    for seed in range(4):
        r = completion(prompts()[seed % len(prompts())], 120, json_schema=schema, temperature=1.0, seed=seed, cache_prompt=False)
        check(r.get("stop_type") == "eos", f"seed {seed}: json_schema: stop_type {r.get('stop_type')}: {r['content']!r}")
        jsonschema.validate(json.loads(r["content"]), schema)
        rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
        c = SRV.json("POST", "/v1/chat/completions", {"model": m, "messages": user, "max_tokens": 120, "seed": seed,
                                                       "temperature": 1.0, "response_format": rf})["choices"][0]
        check(c["finish_reason"] == "stop", f"seed {seed}: response_format: finish_reason {c['finish_reason']}")
        jsonschema.validate(json.loads(c["message"]["content"]), schema)
        o = SRV.json("POST", "/api/generate", {"model": m, "prompt": "A person:", "stream": False, "format": schema,
                                                "options": {"num_predict": 120, "seed": seed, "temperature": 1.0}})
        check(o.get("done_reason") == "stop", f"seed {seed}: ollama format: done_reason {o.get('done_reason')}")
        jsonschema.validate(json.loads(o["response"]), schema)
    # json_object: any object; the text begins one, and parses as one when it ends within max_tokens
    c = SRV.json("POST", "/v1/chat/completions", {"model": m, "messages": user, "max_tokens": 200,
                                                   "response_format": {"type": "json_object"}})["choices"][0]
    check(c["message"]["content"].lstrip().startswith("{"), f"json_object: {c['message']['content'][:80]!r}")
    if c["finish_reason"] == "stop":
        check(isinstance(json.loads(c["message"]["content"]), dict), "json_object: not an object")
    expect_400("/completion", {"prompt": "x", "json_schema": {"not": {}}}, "json_schema")
    expect_400("/completion", {"prompt": "x", "json_schema": "object"}, "json_schema")
    expect_400("/completion", {"prompt": "x", "json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "json_schema")
    expect_400("/v1/chat/completions", {"model": m, "messages": user, "response_format": {"type": "xml"}}, "response_format")
    expect_400("/v1/chat/completions", {"model": m, "messages": user, "response_format": {"type": "json_schema"}}, "response_format")


# ---------------------------------------------------------------- Ollama's routes

def ndjson(path, body):
    st, ev, _ = SRV.stream(path, body)
    check(st == 200, f"{path}: status {st}: {ev}")
    check(ev and ev[-1].get("done") is True, f"{path}: the last record is not done: {h.one_line(json.dumps(ev[-1:]))}")
    check(all(e.get("done") is False for e in ev[:-1]), f"{path}: a done record before the last")
    return ev


def c_ollama():
    m = model_id()
    tags = SRV.json("GET", "/api/tags")
    check(isinstance(tags.get("models"), list) and tags["models"], f"/api/tags: {tags!r}")
    opts = {"temperature": 0, "num_predict": 8}
    ev = ndjson("/api/generate", {"model": m, "prompt": prompts()[0], "raw": True, "options": opts})  # raw: no template
    text = "".join(e.get("response", "") for e in ev)
    check(ev[-1].get("eval_count", 0) > 0 and ev[-1].get("prompt_eval_count", 0) > 0, f"counts: {h.one_line(json.dumps(ev[-1]))}")
    want = completion(prompts()[0], 8)["content"]
    check(text == want, lambda: f"/api/generate '{h.one_line(text)}' != /completion '{h.one_line(want)}'")
    one = SRV.json("POST", "/api/generate", {"model": m, "prompt": prompts()[0], "raw": True, "options": opts, "stream": False})
    check(one.get("done") is True and one.get("response") == text, f"stream false: {h.one_line(json.dumps(one))}")
    # not raw (Ollama's default): the prompt is a user message in the chat template, after `system` when given, so
    # the greedy text is /v1/chat/completions' for the same messages
    for system in (None, "Answer in one short sentence."):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompts()[0]}]
        want = openai_client().chat.completions.create(model=m, messages=msgs, max_tokens=8, temperature=0).choices[0].message.content
        body = {"model": m, "prompt": prompts()[0], "options": opts, **({"system": system} if system else {})}
        text = "".join(e.get("response", "") for e in ndjson("/api/generate", body))
        check(text == want, lambda: f"/api/generate system={system!r}: '{h.one_line(text)}' != /v1/chat/completions '{h.one_line(want)}'")
        one = SRV.json("POST", "/api/generate", {**body, "stream": False})
        check(one.get("response") == want, lambda: f"/api/generate stream false, system={system!r}: {h.one_line(json.dumps(one))}")
    # an empty prompt: Ollama's "load" answer, nothing generated
    load = SRV.json("POST", "/api/generate", {"model": m})
    check(load.get("done") is True and load.get("done_reason") == "load" and load.get("response") == "", f"empty prompt: {load!r}")
    ev = ndjson("/api/chat", {"model": m, "messages": [{"role": "user", "content": prompts()[1]}], "options": opts})
    check(all(e.get("message", {}).get("role") == "assistant" for e in ev[:-1]), "a chat record without an assistant message")
    text = "".join(e.get("message", {}).get("content", "") for e in ev)
    want = openai_client().chat.completions.create(model=m, messages=[{"role": "user", "content": prompts()[1]}], max_tokens=8,
                                                  temperature=0).choices[0].message.content
    check(text == want, lambda: f"/api/chat '{h.one_line(text)}' != /v1/chat/completions '{h.one_line(want)}'")


# ---------------------------------------------------------------- concurrency

def stream_text(prompt, n, cancel_after=None, ignore_eos=False):
    body = {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
    if ignore_eos:
        body["ignore_eos"] = True
    st, ev, done = SRV.stream("/v1/completions", body, cancel_after=cancel_after)
    check(st == 200, f"status {st}: {ev}")
    return "".join(c["text"] for e in ev for c in e.get("choices", [])), done


def c_concurrency():
    """8 streaming clients on the server's slots (4), three of them cancelled after 2 events of a long stream (as
    long as a slot holds, EOS ignored): every stream not cancelled equals its single-client result; then no slot is
    left busy and a request still works."""
    ps, n = prompts(), 16
    single = [stream_text(p, n)[0] for p in ps]
    cancel = {1, 4, 6}
    got, errs = [None] * len(ps), []

    def client(i):
        try:
            if i in cancel:
                got[i] = stream_text(ps[i], A.slot_ctx - 24, cancel_after=2, ignore_eos=True)
            else:
                got[i] = stream_text(ps[i], n)
        except Exception as e:
            errs.append(f"client {i}: {type(e).__name__}: {e}")
    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(ps))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    check(not any(t.is_alive() for t in ts), "a client hung")
    check(not errs, lambda: "; ".join(errs))
    for i in range(len(ps)):
        if i in cancel:
            check(not got[i][1], f"client {i}: the stream to cancel ended before 2 events")
            continue
        check(got[i][1], f"client {i}: no [DONE]")
        check(got[i][0] == single[i], lambda: f"client {i}: concurrent '{h.one_line(got[i][0])}' != single '{h.one_line(single[i])}'")
    slots = h.wait_idle(SRV, A.slots)
    check(not any(s.get("is_processing") for s in slots), lambda: f"slots still busy: {[s.get('id') for s in slots if s.get('is_processing')]}")
    check(stream_text(ps[0], n)[0] == single[0], "a request after the concurrent run differs")


# ---------------------------------------------------------------- speculative decoding (a server with --lookup or -md)

# Prompts whose greedy continuation repeats itself or the prompt, for prompt lookup to draft from.
REPETITIVE = {
    "default": ["KING HENRY:\nO God, O God, O God, O God! O God, O God, O God, O God!",
                "ROMEO:\nI will go, I will go, I will go, I will go, I will go, I will go",
                "First Citizen:\nSpeak, speak.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\nSpeak, speak.\n\nAll:\n"],
    "smollm": ["Repeat this list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango\n"
               "Repeated list: apple, banana,", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"],
}


def repetitive():
    return REPETITIVE["smollm" if A.model and "smollm" in os.path.basename(A.model).lower() else "default"]


def spec_pair(prompt, n, **kw):
    """/completion at temperature 0 with the server's speculation and with it off (speculative.n_max 0)."""
    on = completion(prompt, n, cache_prompt=False, **kw)
    off = completion(prompt, n, cache_prompt=False, **{"speculative.n_max": 0, **kw})
    return on, off


def c_spec_props():
    r = SRV.json("GET", "/props")
    sp = r.get("speculative")
    check(isinstance(sp, dict) and sp.get("drafter") == A.spec, f"/props speculative {sp!r}, the server drafts with {A.spec}")
    check(sp.get("n_max", 0) >= 1 and 0 <= sp.get("n_min", -1) <= sp["n_max"], f"/props speculative {sp!r}")
    dg = r["default_generation_settings"]
    check(dg.get("speculative.n_max") == sp["n_max"], f"default_generation_settings speculative.n_max {dg.get('speculative.n_max')}")


def c_spec_greedy():
    """Greedy text with speculation equals it without (speculative.n_max 0) and `kiln generate --temp 0`'s, on
    plain and repetitive prompts; the repetitive ones have drafts taken (all of them when the draft is the model)."""
    accepted = 0
    for p in prompts()[:3] + repetitive():
        on, off = spec_pair(p, 48)
        check(on["content"] == off["content"], lambda: f"'{h.one_line(p)}': speculative '{h.one_line(on['content'])}' != plain '{h.one_line(off['content'])}'")
        check(on["tokens"] == off["tokens"], f"'{h.one_line(p)}': the token ids differ")
        t = on["timings"]
        check("draft_n" in t and "draft_n_accepted" in t, f"timings without draft_n: {sorted(t)}")
        check(0 <= t["draft_n_accepted"] <= t["draft_n"], f"timings {t}")
        check("draft_n" not in off["timings"], f"speculative.n_max 0 still reports drafts: {off['timings']}")
        if A.self_draft:
            check(t["draft_n_accepted"] == t["draft_n"] and (t["draft_n"] > 0 or on["tokens_predicted"] < 2),
                  f"'{h.one_line(p)}': the model as its own draft: {t['draft_n_accepted']} of {t['draft_n']} drafts taken")
        if p in repetitive():
            accepted += t["draft_n_accepted"]
    check(accepted > 0, "no draft taken on the repetitive prompts")
    for p in (prompts()[0], repetitive()[0]):
        want = h.kiln_generate(A.kiln, A.model, p, 40)
        got = completion(p, 40)["content"]
        check(got == want, lambda: f"'{h.one_line(p)}': speculative '{h.one_line(got)}' != kiln generate '{h.one_line(want)}'")


def c_spec_ends():
    """n_predict and a stop string that land inside a verified run of drafts end the text where plain decoding
    does: the tokens after them are dropped. With the model as its own draft every token after the first is in such a
    run; with prompt lookup the prompt's continuation repeats ("and, and, and") where drafts are taken."""
    p = repetitive()[0]
    ref = completion(p, 64, cache_prompt=False, **{"speculative.n_max": 0})
    for n in (1, 2, 3, 5, 8, 13, 21, 34):
        on, off = spec_pair(p, n)
        check(on["tokens"] == off["tokens"] == ref["tokens"][:n] and on["content"] == off["content"],
              lambda: f"n_predict {n}: speculative {on['tokens']} '{h.one_line(on['content'])}' != plain {off['tokens']}")
        check(on["tokens_predicted"] == n or on["stop_type"] == "eos", f"n_predict {n}: {on['tokens_predicted']} tokens")
    text = ref["content"]
    words = [m.start() for m in re.finditer(r"\S+", text)]
    check(len(words) >= 6, f"the reference text is too short: '{h.one_line(text)}'")
    for w in (words[3], words[len(words) // 2], words[-2]):
        stop = text[w:w + 6].strip() or text[w]
        cut = text[:text.index(stop)]
        on, off = spec_pair(p, 64, stop=[stop])
        check(on["content"] == off["content"] == cut, lambda: f"stop '{stop}': speculative '{h.one_line(on['content'])}', plain '{h.one_line(off['content'])}', want '{h.one_line(cut)}'")
        check(on["stop_type"] == "word" and on["stopping_word"] == stop, f"stop '{stop}': stop_type {on['stop_type']} '{on['stopping_word']}'")
        check(on["tokens"] == off["tokens"], f"stop '{stop}': the tokens differ: {on['tokens']} vs {off['tokens']}")
    # streamed: the same text, in pieces
    st, ev, _ = SRV.stream("/completion", {"prompt": p, "n_predict": 40, "temperature": 0, "stream": True})
    check(st == 200 and "".join(e.get("content", "") for e in ev) == completion(p, 40)["content"], "the speculative stream differs")


def c_spec_probs():
    """Log-probabilities with speculation come from each token's own row: greedy, the plain run's to float rounding;
    sampling, those of a plain forward over the same tokens."""
    p = repetitive()[0]
    on, off = spec_pair(p, 24, n_probs=3)
    a, b = on["completion_probabilities"], off["completion_probabilities"]
    n = on["tokens_predicted"] - (on["stop_type"] == "eos")  # an ending EOS has no entry, with or without drafts
    check(len(a) == len(b) == n, f"{len(a)} and {len(b)} entries for {on['tokens_predicted']} tokens ({on['stop_type']})")
    for i, (x, y) in enumerate(zip(a, b)):
        check(x["id"] == y["id"], f"token {i}: {x['id']} vs {y['id']}")
        check(abs(x["logprob"] - y["logprob"]) < 1e-3, f"token {i}: logprob {x['logprob']} vs {y['logprob']}")
        check([t["id"] for t in x["top_logprobs"]] == [t["id"] for t in y["top_logprobs"]], f"token {i}: top ids differ")
    check(on["timings"]["draft_n"] > 0, f"n_probs turned speculation off: {on['timings']}")
    # sampling: each token's log-probabilities are those of a plain forward over the prompt and the tokens before it
    # (top_k 3, so the sampled token is among the 5 listed)
    ids = SRV.json("POST", "/tokenize", {"content": p, "add_special": True})["tokens"]
    r = completion(p, 12, temperature=1.0, top_k=3, seed=3, n_probs=5, cache_prompt=False)
    check(r["timings"]["draft_n"] > 0, f"sampling with n_probs did not speculate: {r['timings']}")
    toks = r["tokens"]
    for i, x in enumerate(r["completion_probabilities"]):
        ref = completion(ids + toks[:i], 1, n_probs=5, **{"speculative.n_max": 0})["completion_probabilities"][0]["top_logprobs"]
        check([t["id"] for t in x["top_logprobs"]] == [t["id"] for t in ref], f"sampled token {i}: top ids {x['top_logprobs']} vs {ref}")
        want = {t["id"]: t["logprob"] for t in ref}
        check(x["id"] == toks[i] and abs(x["logprob"] - want.get(x["id"], 1e9)) < 1e-3,
              f"sampled token {i} ({x['id']}): logprob {x['logprob']}, a plain forward gives {want.get(x['id'])}")


def c_spec_concurrent():
    """4 speculating streams at once (or one a slot, past the 4 slots' rows a step has for drafts) each equal their
    single result."""
    ps = (repetitive() + prompts())[:max(4, A.slots)]
    single = [stream_text(p, 40)[0] for p in ps]
    got, errs = [None] * len(ps), []

    def client(i):
        try:
            got[i] = stream_text(ps[i], 40)
        except Exception as e:
            errs.append(f"client {i}: {type(e).__name__}: {e}")
    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(ps))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    check(not any(t.is_alive() for t in ts) and not errs, lambda: "; ".join(errs) or "a client hung")
    for i in range(len(ps)):
        check(got[i][1] and got[i][0] == single[i], lambda: f"client {i}: concurrent '{h.one_line(got[i][0])}' != single '{h.one_line(single[i])}'")


def c_spec_sample():
    """Sampling with a seed speculates, gives text, and the same seed gives the same text; the OpenAI route takes
    the fields too."""
    p = repetitive()[0]
    a = completion(p, 32, temperature=0.8, seed=11, cache_prompt=False)
    b = completion(p, 32, temperature=0.8, seed=11, cache_prompt=False)
    check(isinstance(a["content"], str) and a["tokens_predicted"] > 0, f"sampling: {h.one_line(json.dumps(a)[:300])}")
    check(a["content"] == b["content"], lambda: f"seed 11 twice: '{h.one_line(a['content'])}' != '{h.one_line(b['content'])}'")
    check(a["timings"]["draft_n"] > 0, f"sampling did not speculate: {a['timings']}")
    if A.self_draft:  # p = q: every draft is taken
        check(a["timings"]["draft_n_accepted"] == a["timings"]["draft_n"], f"the model as its own draft, sampling: {a['timings']}")
    r = SRV.json("POST", "/v1/completions", {"model": model_id(), "prompt": p, "max_tokens": 16, "temperature": 0,
                                               "speculative.n_max": 4, "speculative.n_min": 1})
    want = completion(p, 16, **{"speculative.n_max": 0})["content"]
    check(r["choices"][0]["text"] == want, lambda: f"/v1/completions '{h.one_line(r['choices'][0]['text'])}' != '{h.one_line(want)}'")
    for bad in ({"speculative.n_max": -1}, {"speculative.n_max": "4"}, {"speculative.n_min": 1.5}, {"speculative.n_max": 2, "speculative.n_min": 3}):
        field = [k for k in bad][-1]
        expect_400("/completion", {"prompt": "x", **bad}, field)
    if A.metrics:
        m = parse_prometheus(SRV.request("GET", "/metrics")[2].decode())
        check(m.get("kiln:draft_tokens_total", 0) >= m.get("kiln:draft_accepted_total", -1) > 0, f"draft metrics {m.get('kiln:draft_tokens_total')} {m.get('kiln:draft_accepted_total')}")


# ---------------------------------------------------------------- persistence (phases against successive servers)

def state_load():
    with open(A.state) as f:
        return json.load(f)


def state_save(st):
    with open(A.state, "w") as f:
        json.dump(st, f)


def slot_action(slot, action, filename=None, want=200):
    body = {"filename": filename} if filename else {}
    return SRV.json("POST", f"/slots/{slot}?action={action}", body, want=want)


def c_persist_save():
    """Slot 0 reads a prompt and generates; it is saved; then the uninterrupted run continues it (with n_probs, so
    the continuation's probabilities are compared too)."""
    ids = SRV.json("POST", "/tokenize", {"content": prompts()[5], "add_special": True})["tokens"]
    r1 = completion(ids, 8, id_slot=0)
    cont = ids + SRV.json("POST", "/tokenize", {"content": r1["content"], "add_special": False})["tokens"]
    st, _, data = SRV.request("POST", "/slots/0?action=save", {"filename": "slot0.bin"})
    if st == 501:
        raise Skip(f"slot save is not supported: {h.one_line(data.decode(errors='replace'))}")
    check(st == 200, lambda: f"save: status {st}: {h.one_line(data.decode(errors='replace'))}")
    saved = json.loads(data)
    check(saved.get("n_saved", 0) >= len(ids), f"n_saved {saved.get('n_saved')} for a {len(ids)}-token prompt")
    ref = completion(cont, 8, id_slot=0, n_probs=2)
    state_save({"cont": cont, "ref": ref["content"], "ref_probs": ref.get("completion_probabilities"),
                "n_saved": saved.get("n_saved")})
    for bad in ("../slot0.bin", "/etc/passwd", "a/b.bin", ""):
        st, _, _ = SRV.request("POST", "/slots/0?action=save", {"filename": bad})
        check(st == 400, f"save to '{bad}': status {st}, not 400")


def c_persist_foreign():
    """Another model's server saves a slot into the same folder: the foreign file the default model must refuse."""
    completion(prompts()[0], 4, id_slot=0)
    st, _, data = SRV.request("POST", "/slots/0?action=save", {"filename": "foreign.bin"})
    if st == 501:
        raise Skip("slot save is not supported")
    check(st == 200, lambda: f"save: status {st}: {h.one_line(data.decode(errors='replace'))}")


def c_persist_restore():
    """After a restart: a corrupted, a truncated, a foreign and a missing file are each a 4xx and break nothing; the
    real one restores slot 0, and its continuation equals the uninterrupted run's, tokens and probabilities."""
    try:
        st = state_load()
    except (OSError, ValueError):
        raise Skip("the save phase did not run")
    d = A.save_dir
    with open(os.path.join(d, "slot0.bin"), "rb") as f:
        good = f.read()
    bad = bytearray(good)
    for i in range(len(bad) // 2, len(bad) // 2 + 64):
        bad[i] ^= 0x5A
    with open(os.path.join(d, "corrupt.bin"), "wb") as f:
        f.write(bad)
    with open(os.path.join(d, "short.bin"), "wb") as f:
        f.write(good[: len(good) * 2 // 3])
    with open(os.path.join(d, "junk.bin"), "wb") as f:
        f.write(b"not a slot file at all" * 50)
    names = ["corrupt.bin", "short.bin", "junk.bin", "missing.bin", "../slot0.bin"]
    if os.path.exists(os.path.join(d, "foreign.bin")):
        names.append("foreign.bin")
    for name in names:
        code, _, data = SRV.request("POST", "/slots/0?action=restore", {"filename": name})
        check(400 <= code < 500, lambda: f"restore {name}: status {code}, not 4xx: {h.one_line(data.decode(errors='replace'))}")
    check(completion(prompts()[0], 2)["tokens_predicted"] > 0, "the server does not answer after the bad restores")
    r = slot_action(0, "restore", "slot0.bin")
    check(r.get("n_restored") == st["n_saved"], f"n_restored {r.get('n_restored')}, {st['n_saved']} were saved")
    got = completion(st["cont"], 8, id_slot=0, n_probs=2)
    check(got["content"] == st["ref"], lambda: f"restored '{h.one_line(got['content'])}' != uninterrupted '{h.one_line(st['ref'])}'")
    check(got.get("completion_probabilities") == st["ref_probs"], "the continuation's probabilities differ from the uninterrupted run's")
    if "tokens_cached" in got:
        check(got["tokens_cached"] >= st["n_saved"], f"tokens_cached {got['tokens_cached']}: the restored cache was not used")
    if "timings" in got and "prompt_n" in got["timings"]:
        check(got["timings"]["prompt_n"] < len(st["cont"]) - st["n_saved"] + 2,
              f"prompt_n {got['timings']['prompt_n']}: the restored prefix was evaluated again")
    e = slot_action(0, "erase")
    check(e.get("n_erased", 0) > 0, f"erase: {e!r}")


# ---------------------------------------------------------------- load and SIGTERM

def c_load():
    """More clients than slots + queue: some get 503 with Retry-After, the rest finish, none hangs; then the server
    serves normally."""
    n_clients = A.load_clients
    res, lock = [], threading.Lock()

    def client(i):
        t0 = time.time()
        try:
            st, hdr, data = SRV.request("POST", "/completion", {"prompt": prompts()[i % 8], "n_predict": A.load_n,
                                                                "temperature": 0, "ignore_eos": True},
                                        timeout=60)
            with lock:
                res.append((st, hdr.get("retry-after"), time.time() - t0, data))
        except Exception as e:
            with lock:
                res.append((None, None, time.time() - t0, f"{type(e).__name__}: {e}".encode()))
    ts = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    check(not any(t.is_alive() for t in ts), "a client hung past 120 s")
    codes = sorted(str(r[0]) for r in res)
    check(all(r[0] in (200, 503) for r in res), lambda: f"statuses {codes}: {[h.one_line(r[3].decode(errors='replace')) for r in res if r[0] not in (200, 503)][:2]}")
    n503 = sum(r[0] == 503 for r in res)
    check(n503 > 0, f"no 503 from {n_clients} clients on {A.slots} slots: {codes}")
    check(sum(r[0] == 200 for r in res) >= A.slots, f"fewer than {A.slots} requests served: {codes}")
    for r in res:
        if r[0] == 503:
            check(r[1] is not None and r[1].strip().isdigit(), f"a 503 without a Retry-After in seconds: {r[1]!r}")
    check(SRV.request("GET", "/health", auth=False)[0] == 200, "/health after the load")
    check(completion(prompts()[0], 4)["tokens_predicted"] > 0, "no answer after the load")
    slots = h.wait_idle(SRV, A.slots)
    check(not any(s.get("is_processing") for s in slots), "a slot stays busy after the load")


def c_sigterm():
    """SIGTERM during a stream: the stream finishes (or ends cleanly); test_serve.sh checks the exit status."""
    if not A.pid:
        raise Skip("no --pid")
    c = SRV.conn(60)
    c.request("POST", "/completion", body=json.dumps({"prompt": prompts()[0], "n_predict": min(200, A.slot_ctx - 32),
                                                      "temperature": 0, "stream": True,
                                                      "ignore_eos": True}).encode(), headers=SRV.headers())
    r = c.getresponse()
    check(r.status == 200, f"status {r.status}")
    events, stopped = 0, False
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            events += 1
            ev = json.loads(line[5:])
            stopped = stopped or ev.get("stop") is True
            if events == 2:
                os.kill(A.pid, signal.SIGTERM)
    c.close()
    check(events >= 2, f"{events} events before the end")
    # a stream cut between events (no stop event) is a clean end too; a cut inside one fails json.loads above
    print(f"# sigterm: {events} events, {'with' if stopped else 'without'} the stop event", flush=True)


CHECKS = [("models", c_models), ("chat", c_chat), ("chat_stream", c_chat_stream), ("completions", c_completions),
          ("usage_counts", c_usage_counts), ("schemas", c_schemas), ("errors", c_errors), ("routes", c_routes), ("auth", c_auth),
          ("greedy_generate", c_greedy_generate), ("sample_generate", c_sample_generate), ("greedy_chat", c_greedy_chat), ("completion", c_completion),
          ("completion_probs", c_completion_probs), ("completion_stream", c_completion_stream),
          ("tokenize_roundtrip", c_tokenize_roundtrip), ("apply_template", c_apply_template), ("props", c_props),
          ("slots", c_slots), ("metrics", c_metrics), ("grammar", c_grammar), ("schema", c_schema), ("ollama", c_ollama), ("concurrency", c_concurrency),
          ("spec_props", c_spec_props), ("spec_greedy", c_spec_greedy), ("spec_ends", c_spec_ends), ("spec_probs", c_spec_probs),
          ("spec_concurrent", c_spec_concurrent), ("spec_sample", c_spec_sample),
          ("persist_save", c_persist_save), ("persist_foreign", c_persist_foreign), ("persist_restore", c_persist_restore),
          ("load", c_load), ("sigterm", c_sigterm)]


def main():
    global A, SRV
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--prefix", default="serve")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--slot-ctx", type=int, default=256)
    ap.add_argument("--metrics", action="store_true")
    ap.add_argument("--no-template", action="store_true", help="the model has no chat template")
    ap.add_argument("--state", default="")
    ap.add_argument("--save-dir", default="")
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--load-clients", type=int, default=24)
    ap.add_argument("--load-n", type=int, default=24)
    ap.add_argument("--spec", default="none", help="the server's drafter: none, lookup, draft_model")
    ap.add_argument("--self-draft", action="store_true", help="the draft model is the model: every draft is taken")
    ap.add_argument("checks", nargs="*")
    A = ap.parse_args()
    SRV = h.Server(A.url, A.api_key or None)
    unknown = set(A.checks) - {n for n, _ in CHECKS}
    if unknown:
        raise SystemExit(f"checks.py: unknown checks {sorted(unknown)}")
    return 1 if h.run_checks(A.prefix, CHECKS, A.checks) else 0


if __name__ == "__main__":
    raise SystemExit(main())
