/* app.js: the kiln workbench's page logic over kiln serve's /wb/ API (docs/workbench.md). No library: fetch() for
 * JSON, fetch() + ReadableStream for the SSE streams (EventSource cannot send the API key's header). Jobs live on the
 * server, so the page rebuilds itself from GET /wb/jobs at every load and follows the running ones again. Whatever
 * came from the server goes into the page as text (textContent), never as HTML. Tested by tests/serve/browser.py.
 *
 * The ids the test reads (keep them stable):
 *   tabs          tab-tokenizer tab-train tab-generate; panels panel-tokenizer panel-train panel-generate
 *   key           key-box key-input key-save key-msg key-open; banner banner-text
 *   corpus        corpus-list (inputs with data-corpus=NAME) corpus-upload-box (a <details>) corpus-name corpus-file
 *                 corpus-paste corpus-upload corpus-msg
 *   tokenizer     tok-name tok-vocab tok-special tok-heldout tok-train tok-progress tok-status
 *                 tok-select tok-summary cmp-select cmp-run cmp-results (rows with data-tokenizer, data-bpt) cmp-msg
 *                 tok-merges tok-input tok-pieces (span.piece with data-id) tok-stats tok-msg
 *   train         data-name data-tokenizer data-val data-make data-progress data-status
 *                 run-name run-data run-preset run-device run-threads run-steps run-time run-lr run-schedule run-warmup
 *                 run-batch run-context run-eval run-ckpt run-8bit run-mixed run-preset-info dim-embd dim-layer dim-head dim-kv dim-ff
 *                 train-start train-pause train-resume train-stop train-msg train-progress live-job
 *                 loss-chart (data-points: train points drawn, data-val-points) stat-step stat-loss stat-val stat-toks
 *                 stat-eta stat-mem runs-list (rows data-run, data-step; buttons data-action=resume|export) runs-msg
 *                 export-type jobs-list
 *   generate      gen-model gen-chat gen-temp gen-topk gen-topp gen-n gen-seed gen-device gen-prompt gen-messages
 *                 gen-run gen-stop gen-clear gen-msg gen-stats gen-output (span.tok with data-i) tooltip
 */
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "kiln.workbench.key";
const TAB_STORE = "kiln.workbench.tab";
const TERMINAL = new Set(["done", "failed", "stopped"]);

const ui = {
  info: null,
  tokenizers: [],   // /wb/tokenizers
  corpora: [],      // /wb/corpora
  jobs: new Map(),  // id -> job (the last seen)
  watching: new Map(), // id -> AbortController of its events stream
  trainJob: null,   // the job the Live card follows
  chart: { train: [], val: [], steps: 0 },
  models: [],
  gen: { abort: null, tokens: [], messages: [] },
};

/* ---------------------------------------------------------------- small helpers */

function el(tag, props, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e[k] = v;
  }
  for (const c of kids) if (c != null) e.append(c);
  return e;
}

function msg(id, text, kind) {
  const e = $(id);
  if (!e) return;
  e.textContent = text || "";
  e.className = "msg" + (kind ? " " + kind : "");
}

function banner(text) {
  $("banner-text").textContent = text;
  $("banner").hidden = !text;
}

const fmt = {
  num(x, d = 3) { return x == null || !isFinite(x) ? "–" : Number(x).toFixed(d); },
  int(x) { return x == null ? "–" : Number(x).toLocaleString("en-US"); },
  bytes(n) {
    if (n == null || !isFinite(n)) return "–";
    const u = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) n /= 1024, i++;
    return (i ? n.toFixed(1) : String(n)) + " " + u[i];
  },
  secs(s) {
    if (s == null || !isFinite(s)) return "–";
    s = Math.round(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  },
};

function setOptions(select, items, keep = true) {
  const old = select.value;
  select.replaceChildren(...items.map(([value, label]) => el("option", { value, text: label })));
  if (keep && items.some(([v]) => v === old)) select.value = old;
}

function numField(id) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  const n = Number(v);
  if (!isFinite(n)) throw new Error($(id).labels?.[0]?.textContent + ": not a number: " + v);
  return n;
}

/* ---------------------------------------------------------------- the API */

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function headers(extra) {
  const h = Object.assign({}, extra);
  const key = localStorage.getItem(KEY_STORE);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function failure(r, path) {
  let text = "";
  try { text = await r.text(); } catch (_) { /* the status alone */ }
  let m = text;
  try { m = JSON.parse(text).error.message; } catch (_) { /* not the JSON error */ }
  if (r.status === 401) askKey(localStorage.getItem(KEY_STORE) ? "The server refused this key: enter it again." : "The server needs its API key.");
  return new ApiError(r.status, `${path}: ${r.status} ${m || r.statusText}`.slice(0, 500));
}

/* A JSON request: the parsed answer, or an ApiError with the server's message. */
async function api(method, path, body, raw) {
  const opt = { method, headers: headers() };
  if (raw !== undefined) opt.body = raw, opt.headers["Content-Type"] = "text/plain; charset=utf-8";
  else if (body !== undefined) opt.body = JSON.stringify(body), opt.headers["Content-Type"] = "application/json";
  let r;
  try { r = await fetch(path, opt); }
  catch (e) { throw new ApiError(0, `${path}: the server cannot be reached (${e.message})`); }
  if (!r.ok) throw await failure(r, path);
  return r.status === 204 ? null : r.json();
}

/* An SSE stream: onEvent(event, data) for each message; resolves at its end. signal aborts it. */
async function sse(method, path, body, onEvent, signal) {
  const opt = { method, headers: headers({ Accept: "text/event-stream" }), signal };
  if (body !== undefined) opt.body = JSON.stringify(body), opt.headers["Content-Type"] = "application/json";
  const r = await fetch(path, opt);
  if (!r.ok) throw await failure(r, path);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "", ev = "message", data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line === "") {
        if (data.length) {
          let d = data.join("\n");
          try { d = JSON.parse(d); } catch (_) { /* a plain text payload */ }
          onEvent(ev, d);
        }
        ev = "message", data = [];
      } else if (line.startsWith("event:")) ev = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}

/* ---------------------------------------------------------------- the key */

function askKey(why) {
  $("key-box").hidden = false;
  msg("key-msg", why || "", why ? "error" : "");
  $("key-input").value = localStorage.getItem(KEY_STORE) || "";
  $("key-input").focus();
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const k = $("key-input").value.trim();
  if (k) localStorage.setItem(KEY_STORE, k); else localStorage.removeItem(KEY_STORE);
  $("key-box").hidden = true;
  loadAll();
});
$("key-open").addEventListener("click", () => askKey(""));
$("banner-close").addEventListener("click", () => banner(""));

/* ---------------------------------------------------------------- tabs */

function showTab(panel) {
  for (const t of document.querySelectorAll(".tab")) {
    const on = t.dataset.panel === panel;
    t.classList.toggle("active", on);
    t.setAttribute("aria-selected", on);
    $(t.dataset.panel).hidden = !on;
  }
  localStorage.setItem(TAB_STORE, panel);
  if (panel === "panel-train") drawChart();
}
for (const t of document.querySelectorAll(".tab")) t.addEventListener("click", () => showTab(t.dataset.panel));

/* ---------------------------------------------------------------- jobs: events, reconnects */

/* Follows a job's events until its end; on a dropped connection, reconnects (the stream replays every stored event,
 * so handlers.reset() clears what they drew). handlers: reset(), progress(d), state(s), end(job). */
function watchJob(job, handlers) {
  const id = job.id;
  if (ui.watching.has(id)) ui.watching.get(id).abort();
  const ctl = new AbortController();
  ui.watching.set(id, ctl);
  ui.jobs.set(id, job);
  let tries = 0;
  const run = async () => {
    while (!ctl.signal.aborted) {
      let ended = false;
      handlers.reset && handlers.reset();
      try {
        await sse("GET", `/wb/jobs/${encodeURIComponent(id)}/events`, undefined, (ev, d) => {
          tries = 0;
          if (ev === "progress") {
            const j = ui.jobs.get(id);
            if (j && d.state && d.state !== j.state) { // a pause or resume: the state rides on the event
              j.state = d.state;
              handlers.state && handlers.state(d.state);
              renderJobs();
            }
            handlers.progress && handlers.progress(d);
          }
          else if (ev === "state") {
            const j = ui.jobs.get(id);
            if (j) j.state = d.state;
            handlers.state && handlers.state(d.state);
            renderJobs();
          } else if (ev === "end") {
            ended = true;
            ui.jobs.set(id, d);
            handlers.end && handlers.end(d);
            renderJobs();
          }
        }, ctl.signal);
      } catch (e) {
        if (ctl.signal.aborted) return;
        if (e instanceof ApiError && e.status && e.status !== 503) {
          handlers.error && handlers.error(e.message);
          break;
        }
      }
      if (ended || ctl.signal.aborted) break;
      // the stream ended without its end event: the server restarted or the network dropped; ask, then retry
      try {
        const j = await api("GET", `/wb/jobs/${encodeURIComponent(id)}`);
        ui.jobs.set(id, j);
        if (TERMINAL.has(j.state)) { handlers.end && handlers.end(j); renderJobs(); break; }
      } catch (e) {
        handlers.error && handlers.error(`lost the job's events, retrying: ${e.message}`);
      }
      await new Promise((r) => setTimeout(r, Math.min(1000 * ++tries, 5000)));
    }
    if (ui.watching.get(id) === ctl) ui.watching.delete(id);
  };
  run();
  return ctl;
}

function jobLine(j) {
  if (j.state === "failed") return `failed: ${j.error || "no message"}`;
  const p = j.progress || {};
  if (j.state === "queued") return `queued on ${j.queue || "its device"}`;
  if (p.total) return `${j.state}: ${p.stage || ""} ${fmt.int(p.done)} / ${fmt.int(p.total)}`;
  return j.state;
}

function setBar(id, done, total) {
  const f = total ? Math.max(0, Math.min(1, done / total)) : 0;
  $(id).style.width = (100 * f).toFixed(1) + "%";
  $(id).dataset.fraction = f.toFixed(4);
}

/* The Tokenizer card's and the Data card's jobs: a bar and a line. */
function simpleJob(job, bar, status, onDone) {
  $(bar).classList.remove("failed", "complete");
  msg(status, jobLine(job));
  return watchJob(job, {
    reset() { setBar(bar, 0, 1); },
    progress(d) {
      setBar(bar, d.done, d.total);
      msg(status, `${d.stage}: ${fmt.int(d.done)} / ${fmt.int(d.total)}`);
    },
    state(s) { if (s !== "running") msg(status, s); },
    end(j) {
      if (j.state === "done") {
        setBar(bar, 1, 1);
        $(bar).classList.add("complete");
        msg(status, "done" + outputsLine(j), "ok");
        onDone && onDone(j);
      } else {
        $(bar).classList.add("failed");
        msg(status, j.state === "failed" ? `failed: ${j.error}` : j.state, "error");
      }
    },
    error(m) { msg(status, m, "error"); },
  });
}

function outputsLine(j) {
  const o = j.outputs || {};
  if (o.train_tokens != null) return `: ${fmt.int(o.train_tokens)} training tokens, ${fmt.int(o.val_tokens)} validation tokens`;
  if (j.kind === "tokenizer" && j.progress) return `: ${fmt.int(j.progress.done)} merges`;
  return "";
}

async function loadJobs() {
  const r = await api("GET", "/wb/jobs");
  // a followed job keeps the state its events told (this list may be older than its last event)
  const told = new Map([...ui.watching.keys()].filter((id) => ui.jobs.has(id)).map((id) => [id, ui.jobs.get(id).state]));
  for (const j of r.jobs) if (told.has(j.id)) j.state = told.get(j.id);
  ui.jobs = new Map(r.jobs.map((j) => [j.id, j]));
  renderJobs();
  fillDataSelect();
  // follow again what still runs: the newest job of each card
  const live = r.jobs.filter((j) => !TERMINAL.has(j.state));
  const last = (kind) => live.filter((j) => j.kind === kind).pop();
  const t = last("tokenizer"), d = last("data"), tr = last("train");
  if (t && !ui.watching.has(t.id)) simpleJob(t, "tok-progress", "tok-status", afterTokenizer);
  if (d && !ui.watching.has(d.id)) simpleJob(d, "data-progress", "data-status", () => loadJobs().catch(showError));
  const lastTrain = tr || r.jobs.filter((j) => j.kind === "train").pop();
  if (lastTrain && (!ui.trainJob || ui.trainJob.id !== lastTrain.id)) followTrain(lastTrain);
  else if (ui.trainJob) ui.trainJob = ui.jobs.get(ui.trainJob.id) || ui.trainJob, trainButtons();
  for (const j of live) if (j.kind === "export" && !ui.watching.has(j.id)) watchExport(j);
}

function renderJobs() {
  const rows = [...ui.jobs.values()].reverse().slice(0, 30).map((j) => {
    const stop = !TERMINAL.has(j.state)
      ? el("button", { class: "small danger", text: "Stop", onclick: () => jobAction(j.id, "stop").catch(showError) })
      : null;
    return el("tr", { "data-job": j.id, "data-state": j.state },
      el("td", { text: (j.params && (j.params.name || j.params.resume || j.params.run)) || j.id, title: j.id }),
      el("td", { text: j.kind }),
      el("td", {}, el("span", { class: "pill " + j.state, text: j.state })),
      el("td", { class: "small", text: j.state === "failed" ? j.error : jobLine(j) }),
      el("td", {}, stop));
  });
  $("jobs-list").replaceChildren(...rows);
}

/* POST /wb/jobs/ID/ACTION; the job as the page knows it. A followed job's state comes from its events alone: they
 * may tell the pause or the end before this answer comes, and the answer would then set the state back. */
async function jobAction(id, action) {
  const j = await api("POST", `/wb/jobs/${encodeURIComponent(id)}/${action}`);
  if (j && j.id && !ui.watching.has(id)) ui.jobs.set(j.id, j);
  renderJobs();
  return ui.jobs.get(id) || j;
}

function showError(e) {
  banner(e && e.message ? e.message : String(e));
}

/* ---------------------------------------------------------------- corpora */

async function loadCorpora() {
  const checked = new Set([...document.querySelectorAll("#corpus-list input:checked")].map((i) => i.dataset.corpus));
  const r = await api("GET", "/wb/corpora");
  ui.corpora = r.corpora;
  const list = r.corpora.map((c) => {
    const box = el("input", { type: "checkbox", "data-corpus": c.name, onchange: corporaSummary });
    box.checked = checked.has(c.name);
    return el("label", { class: "check" }, box, el("span", { text: c.name }),
      el("span", { class: "tag " + (c.example ? "example" : "mine"), text: c.example ? "example" : "yours" }),
      el("span", { class: "muted small", text: fmt.bytes(c.bytes) }));
  });
  $("corpus-list").replaceChildren(...(list.length ? list : [el("p", { class: "muted", text: "No corpus yet: upload one below." })]));
  if (!r.corpora.some((c) => !c.example)) $("corpus-upload-box").open = true;
  corporaSummary();
}

function checkedCorpora() {
  return [...document.querySelectorAll("#corpus-list input:checked")].map((i) => i.dataset.corpus);
}

function corporaSummary() {
  const c = checkedCorpora();
  $("data-corpora").textContent = c.length ? "Corpora (checked in the Tokenizer tab): " + c.join(", ")
    : "Check the corpora to shard in the Tokenizer tab.";
}

$("corpus-upload").addEventListener("click", async () => {
  const name = $("corpus-name").value.trim();
  const file = $("corpus-file").files[0];
  const pasted = $("corpus-paste").value;
  if (!name) return msg("corpus-msg", "Give the corpus a name.", "error");
  if (!file && !pasted) return msg("corpus-msg", "Choose a file or paste some text.", "error");
  msg("corpus-msg", "uploading…");
  try {
    const body = file ? await file.arrayBuffer() : pasted;
    const r = await api("POST", `/wb/corpora?name=${encodeURIComponent(name)}`, undefined, body);
    msg("corpus-msg", `saved ${r.name}: ${fmt.bytes(r.bytes)}`, "ok");
    $("corpus-upload-box").open = false;
    $("corpus-file").value = "", $("corpus-paste").value = "";
    await loadCorpora();
    const box = document.querySelector(`#corpus-list input[data-corpus="${CSS.escape(r.name)}"]`);
    if (box) box.checked = true, corporaSummary();
  } catch (e) { msg("corpus-msg", e.message, "error"); }
});

/* ---------------------------------------------------------------- tokenizers */

async function loadTokenizers() {
  let r;
  try { r = await api("GET", "/wb/tokenizers"); }
  catch (e) {
    // a server without the route yet: the tokenizer jobs that are done
    r = { tokenizers: [...ui.jobs.values()].filter((j) => j.kind === "tokenizer" && j.state === "done")
      .map((j) => ({ name: j.params.name, source: "workbench" })) };
    msg("tok-msg", e.message, "error");
  }
  ui.tokenizers = r.tokenizers;
  const opts = r.tokenizers.map((t) => [t.name, t.name + (t.n_vocab ? ` (${fmt.int(t.n_vocab)})` : "")]);
  setOptions($("tok-select"), opts);
  compareOptions($("tok-select").value);
  const own = opts.filter(([v]) => !v.startsWith("gguf:"));
  setOptions($("data-tokenizer"), own);
}

async function afterTokenizer(job) {
  await loadTokenizers();
  if (job && job.params && job.params.name) {
    $("tok-select").value = job.params.name;
    $("data-tokenizer").value = job.params.name;
  }
  await showTokenizer();
}

/* The vocabularies to compare with: a model's GGUF tokenizer first (the likeliest comparison), then the rest. */
function compareOptions(name) {
  const others = ui.tokenizers.filter((t) => t.name !== name).map((t) => t.name);
  const rank = (n) => (/llama|gpt-?2|qwen|smol|mistral|phi|gemma/i.test(n) ? 0 : n.startsWith("gguf:") ? 2 : 1);
  others.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  setOptions($("cmp-select"), others.map((n) => [n, n]));
}

async function showTokenizer() {
  const name = $("tok-select").value;
  compareOptions(name);
  $("tok-merges").replaceChildren();
  $("tok-summary").textContent = "";
  $("cmp-results").replaceChildren();
  if (!name) { $("tok-summary").textContent = "No tokenizer yet: train one above."; return; }
  tokenizeSoon(0);
  try {
    const t = await api("GET", `/wb/tokenizer?name=${encodeURIComponent(name)}&merges=40`);
    const h = t.heldout;
    $("tok-summary").textContent = `${fmt.int(t.n_vocab)} tokens` + (t.special && t.special.length ? `, special: ${t.special.map((x) => (typeof x === "string" ? x : x.text)).join(" ")}` : "") +
      (h ? ` · held out ${fmt.bytes(h.bytes)}: ${fmt.num(h.bytes_per_token, 2)} bytes/token` : "");
    $("tok-merges").replaceChildren(...t.merges.map((m) => el("li", { "data-rank": m.rank },
      el("span", { class: "rank", text: String(m.rank + 1) }), el("span", { class: "piece h0", text: visible(m.left) }), el("span", { class: "plus", text: "+" }),
      el("span", { class: "piece h1", text: visible(m.right) }), el("span", { class: "plus", text: "→" }),
      el("span", { class: "piece h2", text: visible(m.left + m.right) }))));
    if (h) compare();
  } catch (e) { $("tok-summary").textContent = e.message; $("tok-summary").className = "msg error"; return; }
  $("tok-summary").className = "muted";
}

/* A piece's text with its spaces and line ends visible. */
function visible(s) {
  return s.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
}

$("tok-select").addEventListener("change", showTokenizer);
$("tok-refresh").addEventListener("click", () => loadTokenizers().then(showTokenizer).catch(showError));

$("tok-train").addEventListener("click", async () => {
  const corpus = checkedCorpora();
  if (!corpus.length) return msg("tok-status", "Check at least one corpus on the left.", "error");
  try {
    const body = {
      kind: "tokenizer", name: $("tok-name").value.trim(), corpus,
      vocab_size: numField("tok-vocab"),
      special: $("tok-special").value.split(/[\s,]+/).filter(Boolean),
      heldout_fraction: numField("tok-heldout"),
    };
    if (body.heldout_fraction === undefined) delete body.heldout_fraction;
    const j = await api("POST", "/wb/jobs", body);
    ui.jobs.set(j.id, j);
    renderJobs();
    simpleJob(j, "tok-progress", "tok-status", afterTokenizer);
  } catch (e) { msg("tok-status", e.message, "error"); }
});

async function compare() {
  const name = $("tok-select").value, other = $("cmp-select").value;
  if (!name) return;
  msg("cmp-msg", "measuring…");
  try {
    const names = other ? [name, other] : [name];
    const r = await api("POST", "/wb/compare", { tokenizers: names, heldout: name });
    const max = Math.max(...r.results.map((x) => x.bytes_per_token || 0), 1e-9);
    $("cmp-results").replaceChildren(...r.results.map((x, i) => el("div", { class: "barrow", "data-tokenizer": x.tokenizer, "data-bpt": x.bytes_per_token },
      el("span", { class: "label", text: x.tokenizer }),
      el("span", { class: "track" }, el("span", { class: "fill h" + i, style: `width:${(100 * x.bytes_per_token / max).toFixed(1)}%` })),
      el("span", { class: "value", text: `${fmt.num(x.bytes_per_token, 2)} B/tok` }),
      el("span", { class: "muted small", text: `${fmt.int(x.tokens)} tokens` }))));
    msg("cmp-msg", `${fmt.bytes(r.bytes)} of ${name}'s held-out text; more bytes per token is a tighter vocabulary.`);
  } catch (e) { msg("cmp-msg", e.message, "error"); }
}
$("cmp-run").addEventListener("click", compare);

let tokTimer = 0, tokSeq = 0;
function tokenizeSoon(ms = 250) {
  clearTimeout(tokTimer);
  tokTimer = setTimeout(tokenizeNow, ms);
}
async function tokenizeNow() {
  const name = $("tok-select").value, text = $("tok-input").value;
  const seq = ++tokSeq;
  if (!name) return;
  if (!text) {
    $("tok-pieces").replaceChildren(), $("tok-stats").textContent = "", msg("tok-msg", "");
    return;
  }
  try {
    const r = await api("POST", "/wb/tokenize", { tokenizer: name, text });
    if (seq !== tokSeq) return; // a newer text is on its way
    const out = [];
    r.tokens.forEach((t, i) => {
      out.push(el("span", { class: "piece h" + (i % 6) + (t.special ? " special" : ""), "data-id": t.id, title: `id ${t.id}`, text: visible(t.piece) }));
      if (t.piece.endsWith("\n")) out.push(el("br")); // the line breaks where the text does
    });
    $("tok-pieces").replaceChildren(...out);
    const bpt = r.bytes_per_token != null ? r.bytes_per_token : r.n_tokens ? r.n_bytes / r.n_tokens : null;
    $("tok-stats").textContent = `${fmt.int(r.n_tokens)} tokens · ${fmt.int(r.n_bytes)} bytes · ${fmt.num(bpt, 2)} bytes/token` +
      (r.truncated ? " (the first tokens shown)" : "");
    msg("tok-msg", "");
  } catch (e) { if (seq === tokSeq) msg("tok-msg", e.message, "error"); }
}
$("tok-input").addEventListener("input", () => tokenizeSoon());

/* ---------------------------------------------------------------- data */

function fillDataSelect() {
  const names = [...new Set([...ui.jobs.values()].filter((j) => j.kind === "data" && j.state === "done").map((j) => j.params.name))];
  setOptions($("run-data"), names.reverse().map((n) => [n, n]));
}

$("data-make").addEventListener("click", async () => {
  const corpus = checkedCorpora();
  if (!corpus.length) return msg("data-status", "Check the corpora to shard in the Tokenizer tab.", "error");
  if (!$("data-tokenizer").value) return msg("data-status", "Train a tokenizer first (Tokenizer tab).", "error");
  try {
    const body = { kind: "data", name: $("data-name").value.trim(), tokenizer: $("data-tokenizer").value, corpus,
      val_fraction: numField("data-val") };
    const j = await api("POST", "/wb/jobs", body);
    ui.jobs.set(j.id, j);
    renderJobs();
    simpleJob(j, "data-progress", "data-status", async (done) => {
      await loadJobs();
      $("run-data").value = done.params.name;
    });
  } catch (e) { msg("data-status", e.message, "error"); }
});

/* ---------------------------------------------------------------- train */

/* The chosen preset's dimensions under the form; custom shows its own fields. */
function presetHint() {
  const name = $("run-preset").value;
  $("run-dims").hidden = name !== "custom";
  const p = ui.info && (ui.info.presets || []).find((x) => x.name === name);
  const d = p && p.dims;
  $("run-preset-info").textContent = d ? `${name}: width C ${d.n_embd}, ${d.n_layer} layers, ${d.n_head} heads (${d.n_head_kv} KV), FFN ${d.n_ff}` : "";
}
$("run-preset").addEventListener("change", presetHint);

function trainBody() {
  // a field left blank is the server's default, so it is not sent
  const b = { kind: "train", name: $("run-name").value.trim(), data: $("run-data").value, device: $("run-device").value };
  if ($("run-schedule").value) b.lr_schedule = $("run-schedule").value;
  if (!b.data) throw new Error("Make shards first (the Data card).");
  if ($("run-preset").value === "custom") {
    b.dims = { n_embd: numField("dim-embd"), n_layer: numField("dim-layer"), n_head: numField("dim-head"),
      n_head_kv: numField("dim-kv"), n_ff: numField("dim-ff") };
  } else b.preset = $("run-preset").value;
  const opt = { steps: "run-steps", time_budget_s: "run-time", lr: "run-lr", warmup: "run-warmup", batch: "run-batch",
    context: "run-context", eval_interval: "run-eval", ckpt_interval: "run-ckpt" };
  for (const [k, id] of Object.entries(opt)) { const v = numField(id); if (v !== undefined && !(k === "time_budget_s" && v === 0)) b[k] = v; }
  if (b.device === "cpu") b.threads = numField("run-threads");
  if ($("run-8bit").checked) b.eight_bit = true;
  if ($("run-mixed").checked) b.mixed = true;
  return b;
}

async function startTrain(body) {
  const j = await api("POST", "/wb/jobs", body);
  ui.jobs.set(j.id, j);
  renderJobs();
  followTrain(j);
  return j;
}

$("train-start").addEventListener("click", () => {
  msg("train-msg", "");
  try { startTrain(trainBody()).catch((e) => msg("train-msg", e.message, "error")); }
  catch (e) { msg("train-msg", e.message, "error"); }
});
for (const a of ["pause", "resume", "stop"]) {
  $("train-" + a).addEventListener("click", async () => {
    if (!ui.trainJob) return;
    try {
      const j = await jobAction(ui.trainJob.id, a);
      if (j && j.id) ui.trainJob = j;
      // the events may have told the outcome already; else say what is coming
      const there = TERMINAL.has(j.state) || (a === "pause" && j.state === "paused") || (a === "resume" && j.state === "running");
      if (there) showTrainState(j);
      else msg("train-msg", a === "stop" ? "stopping after this step (its checkpoint is written)…" : a === "pause" ? "pausing…" : "resuming…");
      trainButtons();
    } catch (e) { msg("train-msg", e.message, "error"); }
  });
}

function trainButtons() {
  const s = ui.trainJob ? (ui.jobs.get(ui.trainJob.id) || ui.trainJob).state : null;
  $("train-pause").disabled = s !== "running";
  $("train-resume").disabled = s !== "paused";
  $("train-stop").disabled = !s || TERMINAL.has(s);
}

/* The Live card follows one train job: its events rebuild the chart from the first step. */
function followTrain(job) {
  if (ui.trainJob && ui.trainJob.id !== job.id && ui.watching.has(ui.trainJob.id)) ui.watching.get(ui.trainJob.id).abort();
  ui.trainJob = job;
  $("live-job").textContent = `${(job.params && (job.params.name || job.params.resume)) || ""} · ${job.id}`;
  trainButtons();
  showTrainState(job);
  watchJob(job, {
    reset() {
      ui.chart = { train: [], val: [], steps: (job.params && job.params.steps) || 0 };
      $("train-progress").classList.remove("complete", "failed");
      drawChart();
    },
    progress(d) {
      if (d.stage === "train" || d.stage === "eval") trainPoint(d);
      else if (d.stage !== "paused" && d.stage !== "resumed") $("live-job").textContent = `${job.params.name || ""} · ${d.stage} ${fmt.int(d.done)} / ${fmt.int(d.total)}`;
    },
    state(s) { ui.trainJob.state = s; trainButtons(); showTrainState(ui.trainJob); },
    end(j) {
      ui.trainJob = j;
      $("train-progress").classList.toggle("complete", j.state === "done");
      $("train-progress").classList.toggle("failed", j.state === "failed");
      trainButtons();
      showTrainState(j);
      drawChart();
      loadRuns().catch(showError);
      loadModels().catch(showError);
    },
    error(m) { msg("train-msg", m, "error"); },
  });
}

function showTrainState(j) {
  if (j.state === "failed") msg("train-msg", `failed: ${j.error}`, "error");
  else if (j.state === "done") msg("train-msg", `done: checkpoint at step ${fmt.int((j.outputs || {}).checkpoint_step)}`, "ok");
  else if (j.state === "stopped") msg("train-msg", `stopped: checkpoint at step ${fmt.int((j.outputs || {}).checkpoint_step)}`, "ok");
  else msg("train-msg", j.state === "queued" ? `queued on ${j.queue || "its device"}` : j.state);
}

let drawPending = false;
function trainPoint(d) {
  const c = ui.chart;
  if (d.steps) c.steps = d.steps;
  if (d.stage === "train" && isFinite(d.loss)) c.train.push([d.step, d.loss]);
  if (d.val_loss != null && isFinite(d.val_loss) && !c.val.some(([s]) => s === d.step)) c.val.push([d.step, d.val_loss]);
  $("stat-step").textContent = `${fmt.int(d.step)} / ${fmt.int(d.steps)}`;
  if (d.stage === "train") $("stat-loss").textContent = fmt.num(d.loss);
  if (c.val.length) $("stat-val").textContent = fmt.num(c.val[c.val.length - 1][1]);
  if (d.tok_s != null) $("stat-toks").textContent = fmt.int(Math.round(d.tok_s));
  if (d.eta_s != null) $("stat-eta").textContent = fmt.secs(d.eta_s);
  const mem = d.memory_bytes != null ? d.memory_bytes : (d.state_bytes || 0) + (d.act_bytes || 0);
  if (mem) $("stat-mem").textContent = fmt.bytes(mem) + (d.device ? " " + d.device : "");
  setBar("train-progress", d.step, d.steps);
  if (!drawPending) drawPending = true, requestAnimationFrame(() => { drawPending = false; drawChart(); });
}

/* ---------------------------------------------------------------- the loss chart (canvas, drawn by hand) */

function niceTicks(lo, hi, n) {
  const span = hi - lo || 1, raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push(+v.toFixed(10));
  return out;
}

function drawChart() {
  const cv = $("loss-chart");
  const { train, val } = ui.chart;
  cv.dataset.points = train.length;
  cv.dataset.valPoints = val.length;
  const w = cv.clientWidth, h = cv.clientHeight;
  if (!w || !h) return; // hidden tab: drawn when shown
  const dpr = window.devicePixelRatio || 1;
  if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(h * dpr)) cv.width = Math.round(w * dpr), cv.height = Math.round(h * dpr);
  const g = cv.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const css = getComputedStyle(document.documentElement);
  const col = (v) => css.getPropertyValue(v).trim();
  const L = 56, R = 16, T = 16, B = 40, pw = w - L - R, ph = h - T - B;
  g.font = "12px system-ui, sans-serif";
  g.fillStyle = col("--muted");
  if (!train.length && !val.length) {
    g.textAlign = "center";
    g.fillText("The loss appears here as the run trains.", L + pw / 2, T + ph / 2);
    return;
  }
  const all = train.concat(val);
  const xmax = Math.max(ui.chart.steps || 0, ...all.map((p) => p[0]), 1);
  let ylo = Math.min(...all.map((p) => p[1])), yhi = Math.max(...all.map((p) => p[1]));
  if (yhi - ylo < 1e-6) ylo -= 0.5, yhi += 0.5;
  const pad = 0.05 * (yhi - ylo);
  ylo = Math.max(0, ylo - pad), yhi += pad;
  const X = (s) => L + (s / xmax) * pw, Y = (v) => T + (1 - (v - ylo) / (yhi - ylo)) * ph;
  // grid and axes
  g.strokeStyle = col("--grid");
  g.lineWidth = 1;
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (const v of niceTicks(ylo, yhi, 5)) {
    g.beginPath(); g.moveTo(L, Y(v)); g.lineTo(L + pw, Y(v)); g.stroke();
    g.fillText(v.toFixed(2), L - 6, Y(v));
  }
  g.textAlign = "center";
  g.textBaseline = "top";
  for (const s of niceTicks(0, xmax, 6)) {
    g.beginPath(); g.moveTo(X(s), T); g.lineTo(X(s), T + ph); g.stroke();
    g.fillText(String(s), X(s), T + ph + 6);
  }
  g.strokeStyle = col("--axis");
  g.beginPath(); g.moveTo(L, T); g.lineTo(L, T + ph); g.lineTo(L + pw, T + ph); g.stroke();
  g.fillStyle = col("--text");
  g.fillText("step", L + pw / 2, T + ph + 22);
  g.save(); g.translate(14, T + ph / 2); g.rotate(-Math.PI / 2); g.textBaseline = "middle"; g.fillText("loss", 0, 0); g.restore();
  // the train loss line, then the validation points
  g.strokeStyle = col("--accent");
  g.lineWidth = 2;
  g.lineJoin = "round";
  g.beginPath();
  train.forEach(([s, v], i) => (i ? g.lineTo(X(s), Y(v)) : g.moveTo(X(s), Y(v))));
  g.stroke();
  g.fillStyle = col("--val");
  g.strokeStyle = "#fff";
  for (const [s, v] of val) { g.beginPath(); g.arc(X(s), Y(v), 5, 0, 2 * Math.PI); g.fill(); g.stroke(); }
  // legend
  g.textAlign = "left"; g.textBaseline = "middle";
  const lx = L + pw - 190, ly = T + 10;
  g.strokeStyle = col("--accent"); g.lineWidth = 2; g.beginPath(); g.moveTo(lx, ly); g.lineTo(lx + 20, ly); g.stroke();
  g.fillStyle = col("--text"); g.fillText("train loss", lx + 26, ly);
  g.fillStyle = col("--val"); g.beginPath(); g.arc(lx + 104, ly, 5, 0, 2 * Math.PI); g.fill();
  g.fillStyle = col("--text"); g.fillText("validation", lx + 114, ly);
}
window.addEventListener("resize", () => drawChart());

/* ---------------------------------------------------------------- runs, checkpoints, exports */

async function loadRuns() {
  const r = await api("GET", "/wb/runs");
  const rows = [];
  for (const run of r.runs.slice().reverse()) {
    const cks = run.checkpoints && run.checkpoints.length ? run.checkpoints.slice().reverse()
      : run.checkpoint ? [{ step: run.checkpoint_step, val_loss: run.val_step === run.checkpoint_step ? run.val_loss : null }] : [];
    cks.forEach((c, i) => {
      rows.push(el("tr", { "data-run": run.name, "data-step": c.step },
        el("td", {}, i ? null : el("strong", { text: run.name }), i ? null : el("span", { class: "pill " + run.state, text: run.state })),
        el("td", { text: fmt.int(c.step) }),
        el("td", { text: c.val_loss == null ? "–" : fmt.num(c.val_loss) }),
        el("td", { class: "actions" },
          el("button", { class: "small", "data-action": "resume", text: "Resume", title: "train on from this checkpoint",
            onclick: () => resumeRun(run.name, c.step) }),
          el("button", { class: "small", "data-action": "export", text: "Export", title: "write a GGUF into the models folder",
            onclick: () => exportRun(run.name, c.step) }))));
    });
  }
  $("runs-list").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: 4, class: "muted", text: "No run yet." }))]));
  if ($("runs-msg").classList.contains("error")) msg("runs-msg", "");
}

/* Trains run on from its checkpoint at step: the run's own settings (its first job's), with the form's steps, time
 * budget and device. */
async function resumeRun(run, step) {
  try {
    const first = [...ui.jobs.values()].find((j) => j.kind === "train" && j.params && j.params.name === run);
    const b = first ? Object.assign({}, first.params) : trainBody();
    delete b.name, delete b.resume, delete b.from_step, delete b.time_budget_s;
    if (b.preset) delete b.dims; // the job's params carry both: the preset's dims filled in
    const form = trainBody();
    b.kind = "train", b.resume = run, b.from_step = step, b.device = form.device;
    if (form.steps !== undefined) b.steps = form.steps;
    if (form.time_budget_s !== undefined) b.time_budget_s = form.time_budget_s;
    if (b.device === "cpu") b.threads = form.threads; else delete b.threads;
    if (!(b.steps > step) && b.time_budget_s === undefined) throw new Error(`Set Steps above ${step} (the checkpoint's step) to train on.`);
    msg("runs-msg", "");
    await startTrain(b);
    msg("train-msg", `resuming ${run} from step ${step}`);
  } catch (e) { msg("runs-msg", e.message, "error"); }
}

async function exportRun(run, step) {
  try {
    const j = await api("POST", "/wb/jobs", { kind: "export", run, step, type: $("export-type").value });
    ui.jobs.set(j.id, j);
    renderJobs();
    watchExport(j);
  } catch (e) { msg("runs-msg", e.message, "error"); }
}

function watchExport(j) {
  msg("runs-msg", `exporting ${j.params.run}…`);
  watchJob(j, {
    progress(d) { msg("runs-msg", `exporting ${j.params.run}: ${d.stage} ${fmt.int(d.done)} / ${fmt.int(d.total)}`); },
    end(done) {
      if (done.state === "done") msg("runs-msg", `exported ${(done.outputs && (done.outputs.model || done.outputs.export)) || done.params.run}`, "ok");
      else msg("runs-msg", `export ${done.state}: ${done.error}`, "error");
      loadModels().catch(showError);
    },
    error(m) { msg("runs-msg", m, "error"); },
  });
}

$("runs-refresh").addEventListener("click", () => loadRuns().catch((e) => msg("runs-msg", e.message, "error")));
$("jobs-refresh").addEventListener("click", () => loadJobs().catch(showError));

/* ---------------------------------------------------------------- generate */

async function loadModels() {
  const r = await api("GET", "/wb/models");
  ui.models = r.models;
  if ($("gen-msg").classList.contains("error")) msg("gen-msg", "");
  setOptions($("gen-model"), r.models.map((m) => [m.id, m.label || m.id]));
  modelChanged();
}

function modelChanged() {
  const m = ui.models.find((x) => x.id === $("gen-model").value);
  $("gen-chat").disabled = !(m && m.chat);
  if (!(m && m.chat)) $("gen-chat").checked = false;
  chatMode();
}

function chatMode() {
  const chat = $("gen-chat").checked;
  $("gen-messages").hidden = !chat;
  $("gen-run").textContent = chat ? "Send" : "Generate";
  $("gen-prompt").placeholder = chat ? "Your message" : "Once upon a time";
  renderMessages();
}

function renderMessages() {
  $("gen-messages").replaceChildren(...ui.gen.messages.map((m) => el("div", { class: "message " + m.role },
    el("span", { class: "role", text: m.role }), el("span", { text: m.content }))));
}

$("gen-model").addEventListener("change", modelChanged);
$("gen-chat").addEventListener("change", chatMode);
$("gen-refresh").addEventListener("click", () => loadModels().catch((e) => msg("gen-msg", e.message, "error")));
$("gen-clear").addEventListener("click", () => {
  ui.gen.messages = [], ui.gen.tokens = [];
  $("gen-output").replaceChildren();
  hideTip();
  $("gen-stats").textContent = "";
  msg("gen-msg", "");
  renderMessages();
});
$("gen-stop").addEventListener("click", () => ui.gen.abort && ui.gen.abort.abort());

$("gen-run").addEventListener("click", async () => {
  const model = $("gen-model").value;
  if (!model) return msg("gen-msg", "No model yet: train a run (Train tab) or put a GGUF in the models folder.", "error");
  const chat = $("gen-chat").checked;
  const body = { model, device: $("gen-device").value, top_n: 5 };
  try {
    const map = { temperature: "gen-temp", top_k: "gen-topk", top_p: "gen-topp", n_predict: "gen-n", seed: "gen-seed" };
    for (const [k, id] of Object.entries(map)) { const v = numField(id); if (v !== undefined) body[k] = v; }
  } catch (e) { return msg("gen-msg", e.message, "error"); }
  const text = $("gen-prompt").value;
  if (chat) {
    if (!text.trim()) return msg("gen-msg", "Write a message first.", "error");
    ui.gen.messages.push({ role: "user", content: text });
    body.messages = ui.gen.messages.slice();
    $("gen-prompt").value = "";
    renderMessages();
  } else body.prompt = text;
  const out = $("gen-output");
  out.replaceChildren();
  hideTip();
  ui.gen.tokens = [];
  msg("gen-msg", "");
  $("gen-stats").textContent = "generating…";
  const ctl = new AbortController();
  ui.gen.abort = ctl;
  $("gen-run").disabled = true, $("gen-stop").disabled = false;
  let reply = "", ended = false;
  try {
    await sse("POST", "/wb/generate", body, (ev, d) => {
      if (ev === "prompt" && !chat) {
        out.append(el("span", { class: "prompt", text: d.tokens.map((t) => t.piece).join("") }));
      } else if (ev === "token") {
        const i = ui.gen.tokens.push(d) - 1;
        // text: the bytes that end in whole characters so far (a character split across tokens comes with its last)
        const shown = d.text != null ? d.text : d.piece;
        reply += shown;
        out.append(el("span", { class: "tok", tabIndex: 0, "data-i": i, "data-id": d.id, text: shown }));
        $("gen-stats").textContent = `${ui.gen.tokens.length} tokens`;
      } else if (ev === "end") {
        ended = true;
        $("gen-stats").textContent = `${fmt.int(d.n_tokens)} tokens · ${fmt.num(d.tok_s, 1)} tok/s · stop: ${d.stop}`;
      } else if (ev === "error") {
        ended = true;
        msg("gen-msg", d.message || String(d), "error");
        $("gen-stats").textContent = "";
      }
    }, ctl.signal);
    if (!ended) msg("gen-msg", "the stream ended before its end event (the server stopped?)", "error");
  } catch (e) {
    if (ctl.signal.aborted) $("gen-stats").textContent = `stopped after ${ui.gen.tokens.length} tokens`;
    else msg("gen-msg", e.message, "error"), $("gen-stats").textContent = "";
  } finally {
    if (chat && reply) ui.gen.messages.push({ role: "assistant", content: reply }), renderMessages();
    if (chat && !reply) ui.gen.messages.pop();
    $("gen-run").disabled = false, $("gen-stop").disabled = true;
    ui.gen.abort = null;
  }
});

/* The top-5 tooltip of a generated token. */
function showTip(target) {
  const t = ui.gen.tokens[+target.dataset.i];
  if (!t) return;
  const tip = $("tooltip");
  const top1 = Math.max(1e-12, ...(t.top || []).map((x) => x.p)); // the bars scaled to the likeliest
  const rows = (t.top || []).map((x) => el("div", { class: "tiprow" + (x.id === t.id ? " chosen" : "") },
    el("span", { class: "piece h0", text: visible(x.piece) }),
    el("span", { class: "track" }, el("span", { class: "fill", style: `width:${(100 * x.p / top1).toFixed(1)}%` })),
    el("span", { class: "value", text: (100 * x.p).toFixed(1) + "%" })));
  tip.replaceChildren(el("div", { class: "tiphead", text: `token ${t.id} · p ${(100 * t.p).toFixed(1)}%` }), ...rows);
  tip.hidden = false;
  const r = target.getBoundingClientRect();
  const x = Math.min(window.innerWidth - tip.offsetWidth - 8, Math.max(8, r.left));
  const y = r.bottom + 6 + tip.offsetHeight > window.innerHeight ? r.top - tip.offsetHeight - 6 : r.bottom + 6;
  tip.style.left = x + window.scrollX + "px";
  tip.style.top = y + window.scrollY + "px";
}
function hideTip() { $("tooltip").hidden = true; }
for (const ev of ["mouseover", "focusin"]) $("gen-output").addEventListener(ev, (e) => { if (e.target.classList.contains("tok")) showTip(e.target); });
for (const ev of ["mouseout", "focusout"]) $("gen-output").addEventListener(ev, (e) => { if (e.target.classList.contains("tok")) hideTip(); });

/* ---------------------------------------------------------------- start */

async function loadInfo() {
  const i = await api("GET", "/wb/info");
  ui.info = i;
  $("server-info").textContent = `kiln ${i.version}` + (i.model ? ` · ${i.model}` : "");
  const devs = (i.devices || [{ name: "cpu" }]).map((d) => [d.name, d.name + (d.memory_bytes ? ` (${fmt.bytes(d.memory_bytes)})` : "")]);
  setOptions($("run-device"), devs);
  setOptions($("gen-device"), devs);
  const cpu = (i.devices || []).find((d) => d.name === "cpu");
  if (cpu && cpu.threads) $("run-threads").max = cpu.threads, $("run-threads").title = `${cpu.threads} cores here`;
  if (i.presets && i.presets.length) {
    setOptions($("run-preset"), i.presets.map((p) => [p.name, p.name]).concat([["custom", "custom"]]));
  }
  presetHint();
  if (i.lr_schedules) setOptions($("run-schedule"), [["", "default"]].concat(i.lr_schedules.map((s) => [s, s])));
  if (i.export_types) setOptions($("export-type"), i.export_types.map((s) => [s, s]));
  if (i.auth && !localStorage.getItem(KEY_STORE)) askKey("This server needs its API key.");
}

/* Everything from the server again (at load, and after a key is given). Each part fails on its own, in its card. */
async function loadAll() {
  banner("");
  const parts = [
    loadInfo().catch((e) => { $("server-info").textContent = "kiln"; if (e.status !== 404) throw e; }),
    loadCorpora(),
    loadJobs().then(loadTokenizers).then(showTokenizer),
    loadRuns().catch((e) => { if (e.status !== 401) msg("runs-msg", e.message, "error"); }),
    loadModels().catch((e) => { if (e.status !== 401) msg("gen-msg", e.message, "error"); }),
  ];
  const res = await Promise.allSettled(parts);
  const bad = res.filter((r) => r.status === "rejected").map((r) => r.reason);
  const other = bad.filter((e) => !(e instanceof ApiError && e.status === 401));
  if (other.length) banner(other[0].message);
}

showTab(localStorage.getItem(TAB_STORE) && $(localStorage.getItem(TAB_STORE)) ? localStorage.getItem(TAB_STORE) : "panel-tokenizer");
loadAll();
