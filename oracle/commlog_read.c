// oracle/commlog_read.c — see commlog_read.h.
#include "commlog_read.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fileio.h"

#define LOG_MAX (512u << 20)  // 512 MiB: a gpt2-124m W=8 run logs a few MB per step

static int name_index(const char *s, const char *(*name)(int), int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s, name(i))) return i;
    return -1;
}
static const char *op_name(int i) { return fc_op_name((fc_op)i); }
static const char *group_name(int i) { return fc_group_name((fc_group)i); }
static const char *phase_name(int i) { return fc_phase_name((fc_phase)i); }

// field k of object o as an integer in min..max
static int get_int(const cJSON *o, const char *k, double min, double max, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < min || v->valuedouble > max || v->valuedouble != (double)(long)v->valuedouble)
        return -1;
    *out = (long)v->valuedouble;
    return 0;
}

static int get_name(const cJSON *o, const char *k, const char *(*name)(int), int n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? name_index(v->valuestring, name, n) : -1;
}

static int parse_event(const cJSON *o, int W, int *rank, fc_event *ev, const char **bad) {
    long r, step, micro, order, bytes, unit, stage;
    memset(ev, 0, sizeof *ev);
    if (!cJSON_IsObject(o)) return *bad = "not a JSON object", -1;
    if (get_int(o, "rank", 0, W - 1, &r)) return *bad = "\"rank\" is not an integer in 0..W-1", -1;
    if (get_int(o, "step", 0, 1e9, &step)) return *bad = "\"step\" is not a non-negative integer", -1;
    if (get_int(o, "micro", 0, 1e6, &micro)) return *bad = "\"micro\" is not a non-negative integer", -1;
    if (get_int(o, "order", 0, 1e9, &order)) return *bad = "\"order\" is not a non-negative integer", -1;
    if (get_int(o, "bytes", 0, 9e15, &bytes)) return *bad = "\"bytes\" is not a non-negative integer", -1;
    if (get_int(o, "unit", -1, 1e6, &unit)) return *bad = "\"unit\" is not an integer >= -1", -1;
    if (get_int(o, "stage", -1, 1e6, &stage)) return *bad = "\"stage\" is not an integer >= -1", -1;
    int op = get_name(o, "op", op_name, FC_OP_COUNT);
    if (op < 0) return *bad = "\"op\" is not one of all_gather, reduce_scatter, all_reduce, wait, forward, backward, free, h2d, d2h, optim", -1;
    int of = 0;
    if (op == FC_OP_WAIT && (of = get_name(o, "of", op_name, FC_OP_COUNT)) < 0) return *bad = "a wait without a known \"of\"", -1;
    int group = get_name(o, "group", group_name, FC_GROUP_COUNT);
    if (group < 0) return *bad = "\"group\" is not one of none, world, shard, replicate, post_forward", -1;
    int phase = get_name(o, "phase", phase_name, FC_PHASE_COUNT);
    if (phase < 0) return *bad = "\"phase\" is not one of forward, backward, clip, optim, recompute", -1;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "dtype"), *p = cJSON_GetObjectItemCaseSensitive(o, "prefetch");
    if (!cJSON_IsString(d) || fc_prec_parse(d->valuestring, &ev->dtype)) return *bad = "\"dtype\" is not fp32, bf16 or fp16", -1;
    if (!cJSON_IsBool(p)) return *bad = "\"prefetch\" is not true or false", -1;
    *rank = (int)r;
    ev->step = step, ev->micro = (int)micro, ev->order = (int)order, ev->bytes = (size_t)bytes;
    ev->op = (fc_op)op, ev->of = (fc_op)of, ev->unit = (int)unit, ev->stage = (int)stage;
    ev->group = (fc_group)group, ev->phase = (fc_phase)phase, ev->prefetch = cJSON_IsTrue(p);
    return 0;
}

int fc_log_read_jsonl(const char *path, int W, fc_comm_log *logs, fc_error *e) {
    char *text;
    size_t len;
    if (fc_read_file_limited(path, LOG_MAX, &text, &len, e)) return -1;
    int rc = fc_log_parse_jsonl(text, len, path, W, logs, e);
    free(text);
    return rc;
}

int fc_log_parse_jsonl(const char *text, size_t len, const char *path, int W, fc_comm_log *logs, fc_error *e) {
    if (memchr(text, 0, len)) return fc_fail(e, "%s: not a comm log (a NUL byte)", path);
    int rc = 0;
    long line = 0;
    for (const char *p = text, *end = text + len; p < end && !rc; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        const char *next = nl ? nl + 1 : end;
        size_t blank = 0;
        while (blank < n && (p[blank] == ' ' || p[blank] == '\t' || p[blank] == '\r')) blank++;
        if (blank < n) {
            const char *stop = NULL, *bad = NULL;
            cJSON *o = cJSON_ParseWithLengthOpts(p, n, &stop, 0);
            int ev_rank;
            fc_event ev;
            if (!o)
                rc = fc_fail(e, "%s:%ld: not JSON", path, line + 1);
            else if (parse_event(o, W, &ev_rank, &ev, &bad))
                rc = fc_fail(e, "%s:%ld: %s", path, line + 1, bad);
            else if (logs[ev_rank].n && (ev.step < logs[ev_rank].ev[logs[ev_rank].n - 1].step))
                rc = fc_fail(e, "%s:%ld: rank %d's step %ld after its step %ld (events are in issue order)", path,
                             line + 1, ev_rank, ev.step, logs[ev_rank].ev[logs[ev_rank].n - 1].step);
            else
                fc_log_push(&logs[ev_rank], &ev);
            cJSON_Delete(o);
        }
        p = next;
    }
    return rc;
}
