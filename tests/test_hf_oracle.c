/* test_hf_oracle.c: kiln convert hf against Hugging Face transformers, per architecture.
 * tests/ref/hf_oracle.py builds each architecture from its published config, shrunk, with random weights, and
 * saves the folder with transformers' float32 logits of 80 tokens (past the original context of 64 where RoPE is
 * scaled) and its greedy continuation into $KILN_BUILD/hf/<name>. Here each folder is converted (F32 through the
 * CLI when KILN_BIN is set, else the library; Q4_K_M by kiln_quantize_file over the F32 file), loaded, and run on the CPU and, when there is one, the GPU:
 *   - logits: max |kiln - transformers| over all 80 x V, relative to max |transformers|, within the type's bound;
 *   - greedy: F32's 8 argmax steps equal transformers' (Q4_K_M's agreement is printed, not asserted: random
 *     weights leave small top-1 margins that a 4-bit weight may flip);
 *   - tokenizer: kiln's ids of a sample text equal the tokenizers / sentencepiece package's.
 * An architecture kiln cannot load yet (KILN_ERR_UNSUPPORTED) is a skip naming what is missing. Without python3's
 * torch and transformers every case skips. */
#include "kiln.h"
#include "test.h"

#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_GREEDY 8

/* Error bounds, relative to the logits' scale (max |logit|, ~8 here). F32: the f16 KV cache dominates; measured
 * 2.8e-4 at worst (mistral; qwen2 1.0e-4, gemma3 1.5e-4). Q4_K_M: measured 0.267 at worst (mistral, whose
 * untied head is Q6_K and embedding Q4_K; llama3 0.13, qwen2 and gemma3 0.096), with every greedy token equal.
 * Ignoring Llama 3's RoPE factors gave 1.57 in F32, and a q/k permutation left out lands past 1. */
/* On the GPU an F32 file runs its prefill matmuls on bf16 copies of the weights (tensor cores; 2^-9 relative
 * rounding per weight), so its bound is the bf16 one: measured on an H200 2.6e-3 (qwen2) to 8.8e-3 (olmo2, whose
 * post-norms and full-width QK-norm amplify it), every greedy token equal. Q4_K_M's rounding dwarfs bf16's. */
static const struct {
    const char *name;
    kiln_ftype ftype;
    double bound, gpu_bound;
} types[] = {{"f32", KILN_FTYPE_ALL_F32, 2e-3, 1.5e-2}, {"q4_k_m", KILN_FTYPE_MOSTLY_Q4_K_M, 0.35, 0.35}};

static const char *const archs[] = {"llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "smollm3", "olmo2"};

static int n_failed;

/* One result line in tests/run.sh's format; msg NULL for none. */
static void report(const char *verdict, const char *name, const char *msg) {
    printf("%s %s%s%s\n", verdict, name, msg ? ": " : "", msg ? msg : "");
    fflush(stdout);
    if (verdict[0] == 'F') n_failed++;
}

typedef struct oracle {
    int32_t tokens[256], greedy[N_GREEDY], text_ids[1024];
    size_t n_tokens, n_text_ids;
    int64_t V;
    char text[1024];
    float *logits; /* n_tokens x V */
} oracle;

static int read_ids(json_t *a, int32_t *out, size_t cap, size_t *n) {
    if (!json_is_array(a) || json_array_size(a) > cap) return 0;
    for (size_t i = 0; i < json_array_size(a); i++) out[i] = (int32_t)json_integer_value(json_array_get(a, i));
    *n = json_array_size(a);
    return 1;
}

static int load_oracle(const char *dir, oracle *o, char *why, size_t n_why) {
    char path[1024];
    snprintf(path, sizeof path, "%s/oracle.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    size_t ng = 0;
    int ok = j && read_ids(json_object_get(j, "tokens"), o->tokens, 256, &o->n_tokens) &&
             read_ids(json_object_get(j, "greedy"), o->greedy, N_GREEDY, &ng) && ng == N_GREEDY &&
             read_ids(json_object_get(j, "text_ids"), o->text_ids, 1024, &o->n_text_ids) &&
             json_is_string(json_object_get(j, "text"));
    if (ok) {
        o->V = json_integer_value(json_object_get(j, "n_vocab"));
        snprintf(o->text, sizeof o->text, json_string_value(json_object_get(j, "text")));
    }
    json_decref(j);
    if (!ok) {
        snprintf(why, n_why, "%s is missing or malformed", path);
        return 0;
    }
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    FILE *f = fopen(path, "rb");
    size_t n = o->n_tokens * (size_t)o->V;
    o->logits = malloc(n * sizeof(float));
    ok = f && o->logits && fread(o->logits, sizeof(float), n, f) == n;
    if (f) fclose(f);
    if (!ok) snprintf(why, n_why, "%s is short", path);
    return ok;
}

/* Converts dir into out: through the CLI (KILN_BIN) for F32, so that `kiln convert hf` itself is covered. */
static kiln_status convert(const char *dir, const char *out, kiln_ftype ftype, char *why, size_t n_why) {
    const char *bin = getenv("KILN_BIN");
    if (ftype == KILN_FTYPE_ALL_F32 && bin && *bin) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "'%s' convert hf '%s' -o '%s' --type f32 2>&1", bin, dir, out);
        FILE *p = popen(cmd, "r");
        why[0] = 0;
        if (p) {
            size_t n = fread(why, 1, n_why - 1, p);
            why[n] = 0;
            if (n && why[n - 1] == '\n') why[n - 1] = 0;
        }
        int rc = p ? pclose(p) : -1;
        return rc == 0 ? KILN_OK : KILN_ERR_FORMAT;
    }
    /* a quantized type: kiln quantize over the F32 file converted first (as the CLI does) */
    char f32[1200];
    snprintf(f32, sizeof f32, "%s/f32.gguf", dir);
    kiln_convert_hf_params p = {KILN_FTYPE_ALL_F32};
    kiln_quantize_params q = {.ftype = ftype};
    kiln_status s = ftype == KILN_FTYPE_ALL_F32 ? kiln_convert_hf(dir, out, &p) : kiln_quantize_file(f32, out, &q);
    if (s) snprintf(why, n_why, "%s", kiln_last_error());
    return s;
}

/* Runs the 80 tokens and the greedy steps on one device; returns the relative error (or -1 with why set). The
 * logits are left in all (n_tokens x V). */
static double run(const kiln_model *m, const oracle *o, bool gpu, int32_t *greedy, float *all, char *why, size_t n_why,
                  kiln_status *st) {
    kiln_session_params sp = {.n_ctx = 128};
    if (gpu) sp.device = (kiln_device){KILN_DEVICE_CUDA, 0};
    kiln_session *s = NULL;
    *st = kiln_session_new(m, &sp, &s);
    if (!*st) *st = kiln_session_eval(s, o->tokens, o->n_tokens, NULL, all);
    double err = -1;
    if (!*st) {
        double max_ref = 0, max_err = 0;
        for (size_t i = 0; i < o->n_tokens * (size_t)o->V; i++) {
            double r = fabs(o->logits[i]), e = fabs((double)all[i] - o->logits[i]);
            if (r > max_ref) max_ref = r;
            if (!(e <= max_err)) max_err = e; /* a NaN sticks */
        }
        err = max_err / max_ref;
        const float *last = all + (o->n_tokens - 1) * (size_t)o->V;
        int32_t next = 0;
        for (int64_t v = 1; v < o->V; v++)
            if (last[v] > last[next]) next = (int32_t)v;
        greedy[0] = next;
        for (int k = 1; k < N_GREEDY && !*st; k++) *st = kiln_session_eval_argmax(s, &greedy[k - 1], 1, &greedy[k]);
    }
    if (*st) snprintf(why, n_why, "%s", kiln_last_error()), err = -1;
    kiln_session_free(s);
    return err;
}

/* True when dir/unscaled (the model without its RoPE scaling) gives kiln the very logits in all: a kiln that
 * does not apply the scaling, which the comparison would report as a wrong conversion. */
static bool ignores_scaling(const char *dir, const oracle *o, const float *all) {
    char plain[1100], out[1200], why[1024];
    snprintf(plain, sizeof plain, "%s/unscaled", dir);
    snprintf(out, sizeof out, "%s/unscaled.gguf", dir);
    struct stat st;
    if (stat(plain, &st) != 0 || convert(plain, out, KILN_FTYPE_ALL_F32, why, sizeof why)) return false;
    kiln_model *m = NULL;
    float *other = malloc(o->n_tokens * (size_t)o->V * sizeof(float));
    int32_t greedy[N_GREEDY];
    kiln_status s;
    bool same = !kiln_model_load(out, &m) && run(m, o, false, greedy, other, why, sizeof why, &s) >= 0 &&
                memcmp(other, all, o->n_tokens * (size_t)o->V * sizeof(float)) == 0;
    kiln_model_free(m);
    free(other);
    return same;
}

static void check_tokenizer(const char *name, const kiln_model *m, const oracle *o) {
    char tn[128], msg[512];
    snprintf(tn, sizeof tn, "hf_oracle_%s_tokenizer", name);
    const kiln_tokenizer *t = kiln_model_tokenizer(m);
    kiln_tokens ids = {0};
    if (!t) {
        report("FAIL", tn, "the converted model has no tokenizer");
        return;
    }
    if (kiln_tokenizer_encode(t, o->text, strlen(o->text), false, false, &ids)) {
        report("FAIL", tn, kiln_last_error());
        return;
    }
    size_t i = 0;
    while (i < ids.n && i < o->n_text_ids && ids.ids[i] == o->text_ids[i]) i++;
    if (i == ids.n && i == o->n_text_ids) report("ok", tn, NULL);
    else {
        snprintf(msg, sizeof msg, "%zu ids against the reference's %zu; first difference at %zu (kiln %d, reference %d)", ids.n,
                 o->n_text_ids, i, i < ids.n ? ids.ids[i] : -1, i < o->n_text_ids ? o->text_ids[i] : -1);
        report("FAIL", tn, msg);
    }
    kiln_tokens_free(&ids);
}

static void check_arch(const char *root, const char *name) {
    char dir[1024], out[1200], tn[128], why[1024], msg[1400];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    oracle o = {0};
    bool ignored = false; /* found on the CPU in F32, then kept for every run of the model */
    if (!load_oracle(dir, &o, why, sizeof why)) {
        snprintf(tn, sizeof tn, "hf_oracle_%s", name);
        report("FAIL", tn, why);
        return;
    }
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        snprintf(out, sizeof out, "%s/%s.gguf", dir, types[ti].name);
        snprintf(tn, sizeof tn, "hf_oracle_%s_%s", name, types[ti].name);
        if (convert(dir, out, types[ti].ftype, why, sizeof why)) {
            report("FAIL", tn, why);
            continue;
        }
        kiln_model *m = NULL;
        kiln_status s = kiln_model_load(out, &m);
        if (s == KILN_ERR_UNSUPPORTED) {
            snprintf(msg, sizeof msg, "kiln cannot run it yet: %s", kiln_last_error());
            report("skip", tn, msg);
            continue;
        }
        if (s) {
            report("FAIL", tn, kiln_last_error());
            continue;
        }
        if (ti == 0) check_tokenizer(name, m, &o);
        float *all = malloc(o.n_tokens * (size_t)o.V * sizeof(float));
        for (int gpu = 0; gpu < 2; gpu++) {
            char dn[160];
            snprintf(dn, sizeof dn, "%s_%s", tn, gpu ? "gpu" : "cpu");
            int32_t greedy[N_GREEDY] = {0};
            double err = run(m, &o, gpu, greedy, all, why, sizeof why, &s);
            if (err < 0) {
                if (gpu && s == KILN_ERR_UNSUPPORTED) report("skip", dn, why);
                else report(s == KILN_ERR_UNSUPPORTED ? "skip" : "FAIL", dn, why);
                continue;
            }
            if (!gpu && ti == 0) ignored = ignores_scaling(dir, &o, all);
            if (ignored) {
                report("skip", dn, "kiln gives the same logits with the config's RoPE scaling taken out: it ignores the scaling");
                continue;
            }
            int agree = 0;
            while (agree < N_GREEDY && greedy[agree] == o.greedy[agree]) agree++;
            const double bound = gpu ? types[ti].gpu_bound : types[ti].bound;
            printf("  %s: max logit error %.2e of the logits' scale (bound %.0e), greedy %d/%d\n", dn, err, bound, agree, N_GREEDY);
            if (!(err <= bound)) {
                snprintf(msg, sizeof msg, "logit error %.3g over the bound %.3g", err, bound);
                report("FAIL", dn, msg);
            } else if (types[ti].ftype == KILN_FTYPE_ALL_F32 && agree < N_GREEDY) {
                snprintf(msg, sizeof msg, "greedy token %d is %d, transformers' %d", agree, greedy[agree], o.greedy[agree]);
                report("FAIL", dn, msg);
            } else report("ok", dn, NULL);
        }
        free(all);
        kiln_model_free(m);
    }
    free(o.logits);
}

int main(void) {
    const char *build = getenv("KILN_BUILD");
    char root[1024], cmd[2048];
    snprintf(root, sizeof root, "%s/hf", build && *build ? build : "build");
    if (system("python3 -c 'import torch, transformers, tokenizers, sentencepiece, safetensors' >/dev/null 2>&1") != 0) {
        printf("skip hf_oracle: python3 lacks torch, transformers, tokenizers, sentencepiece or safetensors\n");
        return 0;
    }
    /* the folders are made again whenever the script is newer than one of them */
    struct stat script, made;
    bool fresh = stat("tests/ref/hf_oracle.py", &script) == 0;
    for (size_t i = 0; fresh && i < sizeof archs / sizeof archs[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s/oracle.json", root, archs[i]);
        fresh = stat(cmd, &made) == 0 && made.st_mtime >= script.st_mtime;
    }
    snprintf(cmd, sizeof cmd, "python3 tests/ref/hf_oracle.py '%s' > '%s.log' 2>&1", root, root);
    if (!fresh && system(cmd) != 0) {
        printf("FAIL hf_oracle: tests/ref/hf_oracle.py failed (see %s.log)\n", root);
        return 1;
    }
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) check_arch(root, archs[i]);
    return n_failed ? 1 : 0;
}
