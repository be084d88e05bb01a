// oracle/findings.c — see findings.h.
#include "findings.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void fc_findings_add(fc_findings *f, const char *fmt, ...) {
    int cap = (int)(sizeof f->msg / sizeof f->msg[0]);
    if (f->n_kept < cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->msg[f->n_kept], sizeof f->msg[0], fmt, ap);
        va_end(ap);
        f->n_kept++;
    }
    f->n++;
}

static const char *API_NAMES[FC_API_COUNT] = {"reference", "torch-fsdp1", "torch-fsdp2"};

const char *fc_sched_api_name(fc_sched_api a) { return API_NAMES[a]; }

int fc_sched_api_parse(const char *name, fc_sched_api *out) {
    for (int a = 0; a < FC_API_COUNT; a++)
        if (!strcmp(name, API_NAMES[a])) return *out = (fc_sched_api)a, 0;
    return -1;
}
