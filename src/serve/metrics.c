/* metrics.c: GET /metrics in Prometheus's text format (only with --metrics), llama-server's llamacpp:* names:
 * token totals, prompt and generation seconds, requests processing and deferred, slot use and KV usage; then kiln:*
 * counters of the scheduler's steps (rows, seconds in the engine, seconds handing out tokens, steps with prompts) and
 * of speculative decoding (drafts verified and taken). */
#include "serve/serve.h"

#include <stdio.h>
#include <stdlib.h>

void srv_route_metrics(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!s->o.metrics) {
        srv_error(rs, 501, NULL, "metrics are off: start the server with --metrics");
        return;
    }
    srv_metrics m;
    srv_sched_metrics(s->sched, &m);
    const struct {
        const char *name, *type, *help;
        double v;
    } rows[] = {
        {"prompt_tokens_total", "counter", "Number of prompt tokens processed.", (double)m.prompt_tokens},
        {"prompt_seconds_total", "counter", "Prompt process time.", m.prompt_s},
        {"tokens_predicted_total", "counter", "Number of generation tokens processed.", (double)m.predicted_tokens},
        {"tokens_predicted_seconds_total", "counter", "Predict process time.", m.predicted_s},
        {"n_decode_total", "counter", "Total number of batched decodes.", (double)m.decodes},
        {"requests_total", "counter", "Requests finished.", (double)m.requests_done},
        {"prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", m.prompt_s > 0 ? (double)m.prompt_tokens / m.prompt_s : 0},
        {"predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
         m.predicted_s > 0 ? (double)m.predicted_tokens / m.predicted_s : 0},
        {"kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.", m.kv_total ? (double)m.kv_used / (double)m.kv_total : 0},
        {"kv_cache_tokens", "gauge", "KV-cache tokens.", (double)m.kv_used},
        {"requests_processing", "gauge", "Number of requests processing.", (double)m.processing},
        {"requests_deferred", "gauge", "Number of requests deferred.", (double)m.deferred},
        {"slots_total", "gauge", "Slots of the server.", (double)srv_sched_n_slots(s->sched)},
        {"slots_busy_max", "gauge", "The most slots busy at once.", (double)m.n_busy_max},
    };
    /* kiln's own: where a batched step's time goes */
    const struct {
        const char *name, *type, *help;
        double v;
    } own[] = {
        {"step_rows_total", "counter", "Rows (tokens) of all batched decodes.", (double)m.step_rows},
        {"step_decode_seconds_total", "counter", "Seconds in the engine's batched decodes.", m.step_decode_s},
        {"step_emit_seconds_total", "counter", "Seconds sampling and handing out the tokens of the batched decodes.", m.step_emit_s},
        {"steps_mixed_total", "counter", "Batched decodes that carried prompt tokens.", (double)m.steps_mixed},
        {"draft_tokens_total", "counter", "Speculative drafts verified.", (double)m.draft_tokens},
        {"draft_accepted_total", "counter", "Speculative drafts the model took.", (double)m.draft_accepted},
    };
    size_t cap = 8192, n = 0;
    char *b = malloc(cap);
    for (size_t i = 0; b && i < sizeof rows / sizeof *rows; i++)
        n += (size_t)snprintf(b + n, cap - n, "# HELP llamacpp:%s %s\n# TYPE llamacpp:%s %s\nllamacpp:%s %.17g\n", rows[i].name, rows[i].help,
                              rows[i].name, rows[i].type, rows[i].name, rows[i].v);
    for (size_t i = 0; b && n < cap && i < sizeof own / sizeof *own; i++)
        n += (size_t)snprintf(b + n, cap - n, "# HELP kiln:%s %s\n# TYPE kiln:%s %s\nkiln:%s %.17g\n", own[i].name, own[i].help,
                              own[i].name, own[i].type, own[i].name, own[i].v);
    if (!b || n >= cap) {
        free(b);
        srv_error(rs, 500, NULL, "out of memory");
        return;
    }
    rs->status = 200;
    rs->content_type = "text/plain; version=0.0.4";
    rs->body = b, rs->n_body = n;
}
