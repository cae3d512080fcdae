/* routes_static.c: the workbench's page, compiled in from web/ (serve/wb_static.h): GET / and /index.html give
 * index.html, GET /wb/ui/FILE any file of the table, each with its content type and Cache-Control: no-cache (a
 * rebuilt kiln serves its new page at the next load). Open routes: the page asks for the API key itself. 404 (JSON,
 * as every error) for a name not in the table and when the workbench is off. Tested by tests/test_wb_static.c. */
#include "serve/serve.h"
#include "serve/wb_static.h"

#include <stdlib.h>
#include <string.h>

#define UI_PREFIX "/wb/ui/"

static const srv_static_file *find(const char *name) {
    for (size_t i = 0; i < srv_wb_static_n; i++)
        if (strcmp(srv_wb_static[i].name, name) == 0) return &srv_wb_static[i];
    return NULL;
}

void srv_route_wb_static(srv_server *s, const srv_request *rq, srv_response *rs) {
    if (!srv_wb_on(s, rs)) return;
    size_t n = strlen(UI_PREFIX);
    const char *name = strncmp(rq->path, UI_PREFIX, n) == 0 ? rq->path + n : "index.html"; /* else / or /index.html */
    const srv_static_file *f = find(name);
    if (!f) {
        srv_error(rs, 404, NULL, "no file %s in the workbench's page", rq->path);
        return;
    }
    rs->body = malloc(f->n ? f->n : 1);
    if (!rs->body) {
        srv_error(rs, 500, NULL, "out of memory");
        return;
    }
    memcpy(rs->body, f->bytes, f->n);
    rs->n_body = f->n;
    rs->status = 200;
    rs->content_type = f->content_type;
    rs->no_cache = true;
}
