/* job.c: a request's job (its life, cancel and wait, shared by an HTTP thread and the scheduler) and the text
 * helpers the scheduler uses on generated text: UTF-8 tails, stop-string holdback, sanitizing. */
#include "serve/sched.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- text helpers */

/* The length of the UTF-8 sequence that lead byte c opens; 0 for a continuation or an invalid byte. */
static int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) return 3;
    if (c >= 0xf0 && c <= 0xf4) return 4;
    return 0;
}

size_t srv_utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xc0) == 0x80) continue; /* a continuation byte: look further back for its lead */
        int len = utf8_len(c);
        return len > (int)back ? back : 0;
    }
    return 0;
}

size_t srv_stop_holdback(const char *s, size_t n, char *const *stops, int n_stops) {
    size_t best = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t L = strlen(stops[i]);
        for (size_t k = L > 0 ? L - 1 : 0; k > best; k--) /* a suffix of k bytes that begins stop i */
            if (k <= n && memcmp(s + n - k, stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Whether s[0..n) opens with a valid UTF-8 sequence; its length in *len (1 for an invalid byte). */
static bool utf8_valid_at(const unsigned char *s, size_t n, size_t *len) {
    int L = utf8_len(s[0]);
    *len = 1;
    if (L == 0 || (size_t)L > n) return false;
    for (int i = 1; i < L; i++)
        if ((s[i] & 0xc0) != 0x80) return false;
    if (L == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return false; /* overlong, surrogate */
    if (L == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return false; /* overlong, > U+10FFFF */
    *len = (size_t)L;
    return true;
}

char *srv_utf8_sanitize(const char *s, size_t n, size_t *out_n) {
    if (n > (SIZE_MAX - 1) / 3) return NULL;
    char *o = malloc(3 * n + 1), *p = o; /* each invalid byte becomes 3 bytes at most */
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        size_t len;
        if (utf8_valid_at((const unsigned char *)s + i, n - i, &len)) {
            memcpy(p, s + i, len), p += len;
        } else {
            memcpy(p, "\xef\xbf\xbd", 3), p += 3;
        }
        i += len;
    }
    *p = 0;
    *out_n = (size_t)(p - o);
    return o;
}

/* ---------------------------------------------------------------- jobs */

srv_job *srv_job_new(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->slot = -1;
    j->g.sp = kiln_sampler_default();
    j->g.n_predict = -1;
    j->g.cache_prompt = true;
    j->g.id_slot = -1;
    j->g.spec_n_max = j->g.spec_n_min = -1;
    return j;
}

void srv_job_release(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    if (j->ud_free) j->ud_free(j->ud);
    for (int i = 0; i < j->g.n_stops; i++) free(j->g.stops[i]);
    kiln_grammar_free(j->g.grammar);
    free(j->prompt), free(j->text), free(j->toks), free(j->gen);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void srv_job_cancel(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->cancel = true;
    pthread_mutex_unlock(&j->mu);
}

bool srv_job_cancelled(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    bool c = j->cancel;
    pthread_mutex_unlock(&j->mu);
    return c;
}

bool srv_job_wait(srv_job *j, bool (*alive)(void *), void *ud) {
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->done && alive && !alive(ud)) {
            j->cancel = true;
            pthread_mutex_unlock(&j->mu);
            return false;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}
