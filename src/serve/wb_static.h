/* wb_static.h: the workbench's page (the files of web/) compiled in: the table that tools/bin2c writes into
 * BUILD/wb_static.c at build time and src/serve/routes_static.c serves. */
#ifndef KILN_SERVE_WB_STATIC_H
#define KILN_SERVE_WB_STATIC_H

#include <stddef.h>

typedef struct srv_static_file {
    const char *name;         /* the base name: "index.html", "app.js" */
    const char *content_type; /* "text/html; charset=utf-8" */
    const unsigned char *bytes; /* (n) */
    size_t n;
} srv_static_file;

extern const srv_static_file srv_wb_static[]; /* (srv_wb_static_n) */
extern const size_t srv_wb_static_n;

#endif
