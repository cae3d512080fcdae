/* test_wb_static.c: the workbench's page compiled into kiln (tools/bin2c.c -> BUILD/wb_static.c, served by
 * src/serve/routes_static.c) through srv_handle, without a socket: the table holds web/'s files byte for byte (read
 * here from the source tree) with their content types; GET /, /index.html and /wb/ui/FILE serve them with no-cache
 * and without the API key while the API still asks for it; unknown names, traversal and other methods get JSON
 * errors; with the workbench off the page is a 404; and every element app.js looks up by id ($("...")) is in
 * index.html, so that a renamed id fails here rather than as a null in the browser. */
#include "kiln.h"
#include "serve/jobs.h"
#include "serve/serve.h"
#include "serve/wb_static.h"
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

static srv_server *srv;

static srv_response get(const char *method, const char *path) {
    srv_request rq = {.method = method, .path = path};
    srv_response rs;
    srv_handle(srv, &rq, &rs);
    return rs;
}

/* web/NAME from the source tree (the tests run in the repository root), or NULL. */
static char *read_web(const char *name, size_t *n) {
    char p[256];
    snprintf(p, sizeof p, "web/%s", name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    *n = b && len >= 0 ? fread(b, 1, (size_t)len, f) : 0;
    if (b) b[*n] = 0;
    fclose(f);
    return b;
}

static const srv_static_file *entry(const char *name) {
    for (size_t i = 0; i < srv_wb_static_n; i++)
        if (strcmp(srv_wb_static[i].name, name) == 0) return &srv_wb_static[i];
    return NULL;
}

static void test_wb_static_table(void) {
    static const struct {
        const char *name, *type;
    } want[] = {{"index.html", "text/html; charset=utf-8"},
                {"app.js", "text/javascript; charset=utf-8"},
                {"style.css", "text/css; charset=utf-8"}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const srv_static_file *f = entry(want[i].name);
        CHECK(f, "%s is not compiled in", want[i].name);
        CHECK(strcmp(f->content_type, want[i].type) == 0, "%s: content type %s", f->name, f->content_type);
        size_t n;
        char *src = read_web(want[i].name, &n);
        if (!src) SKIP("web/%s not found (run from the repository root)", want[i].name);
        bool same = n == f->n && memcmp(src, f->bytes, n) == 0;
        free(src);
        CHECK(same, "%s: the compiled bytes (%zu) differ from web/%s (%zu): rebuild", f->name, f->n, want[i].name, n);
    }
}

/* One GET: status want, and for a 200 the body equal to the table's file name with its type and no-cache. */
static void expect(const char *method, const char *path, int want, const char *name) {
    srv_response rs = get(method, path);
    int st = rs.status;
    bool json = rs.body && rs.n_body && rs.body[0] == '{' && (!rs.content_type || strstr(rs.content_type, "json"));
    bool same = true, typed = true, no_cache = rs.no_cache;
    if (name) {
        const srv_static_file *f = entry(name);
        same = f && rs.n_body == f->n && memcmp(rs.body, f->bytes, f->n) == 0;
        typed = f && rs.content_type && strcmp(rs.content_type, f->content_type) == 0;
    }
    srv_response_free(&rs);
    CHECK(st == want, "%s %s: status %d, not %d", method, path, st, want);
    if (name)
        CHECK(same && typed && no_cache, "%s %s: body same %d, type right %d, no-cache %d", method, path, same, typed,
              no_cache);
    else CHECK(json, "%s %s: the %d is not a JSON error", method, path, st);
}

static void test_wb_static_routes(void) {
    expect("GET", "/", 200, "index.html");
    expect("GET", "/index.html", 200, "index.html");
    expect("GET", "/wb/ui/index.html", 200, "index.html");
    expect("GET", "/wb/ui/app.js", 200, "app.js");
    expect("GET", "/wb/ui/style.css", 200, "style.css");
    expect("GET", "/wb/ui/nothing.js", 404, NULL);
    expect("GET", "/wb/ui/../Makefile", 404, NULL);
    expect("GET", "/wb/ui/app.js/x", 404, NULL);
    expect("GET", "/wb/ui/", 404, NULL);
    expect("GET", "/index.htm", 404, NULL);
    expect("POST", "/", 405, NULL);
    expect("POST", "/wb/ui/app.js", 405, NULL);
    // open: the page needs no key while the API does
    expect("GET", "/wb/jobs", 401, NULL);
}

static void test_wb_static_off(void) {
    struct wb *w = srv->wb;
    srv->wb = NULL;
    srv_response rs = get("GET", "/");
    int st = rs.status;
    srv_response_free(&rs);
    rs = get("GET", "/wb/ui/app.js");
    int st2 = rs.status;
    srv_response_free(&rs);
    srv->wb = w;
    CHECK(st == 404 && st2 == 404, "the page with the workbench off: %d, %d, not 404", st, st2);
}

/* Every $("ID") of app.js is an id="ID" of index.html. */
static void test_wb_static_ids(void) {
    const srv_static_file *js = entry("app.js"), *html = entry("index.html");
    CHECK(js && html, "app.js or index.html missing");
    char *page = malloc(html->n + 1), *code = malloc(js->n + 1);
    memcpy(page, html->bytes, html->n), page[html->n] = 0;
    memcpy(code, js->bytes, js->n), code[js->n] = 0;
    int n_ids = 0;
    char missing[256] = "";
    for (const char *p = code; (p = strstr(p, "$(\"")) != NULL;) {
        p += 3;
        size_t k = strcspn(p, "\"");
        if (p[k] != '"' || p[k + 1] != ')' || k == 0 || k > 100) continue; /* $("train-" + a): built, not checked */
        char want[128];
        snprintf(want, sizeof want, "id=\"%.*s\"", (int)k, p);
        n_ids++;
        if (!strstr(page, want) && !missing[0]) snprintf(missing, sizeof missing, "%.*s", (int)k, p);
        p += k;
    }
    free(page), free(code);
    CHECK(!missing[0], "app.js looks up #%s, which index.html does not have", missing);
    CHECK(n_ids > 50, "only %d lookups by id found in app.js", n_ids);
}

int main(void) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/kiln-wb-static-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    srv_opts o = {.api_key = "k"};
    wb *w = NULL;
    if (wb_new(dir, NULL, &w) || srv_server_new(NULL, NULL, &o, &(srv_sched_params){0}, &srv)) {
        printf("FAIL test_wb_static_server: %s\n", kiln_last_error());
        return 1;
    }
    srv->wb = w;
    RUN(test_wb_static_table);
    RUN(test_wb_static_routes);
    RUN(test_wb_static_off);
    RUN(test_wb_static_ids);
    wb_free(srv->wb, 10);
    srv_server_free(srv);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    TEST_EXIT();
}
