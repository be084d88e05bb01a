// core/schedule.c — see schedule.h.
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "watchdog.h"

static const char *OP_NAMES[FC_OP_COUNT] = {"all_gather", "reduce_scatter", "all_reduce", "wait",
                                            "forward", "backward", "free", "h2d", "d2h", "optim"};
static const char *PHASE_NAMES[FC_PHASE_COUNT] = {"forward", "backward", "clip", "optim", "recompute"};
static const char *GROUP_NAMES[FC_GROUP_COUNT] = {"none", "world", "shard", "replicate", "post_forward"};
static const char *MEM_NAMES[FC_MEM_COUNT] = {"param_shards", "grad_shards", "optim_state",
                                              "gathered_params", "gathered_grads", "activations",
                                              "comm_buffers"};
static const char *LOC_NAMES[FC_LOC_COUNT] = {"device", "host"};

const char *fc_op_name(fc_op op) { return OP_NAMES[op]; }
const char *fc_phase_name(fc_phase p) { return PHASE_NAMES[p]; }
const char *fc_group_name(fc_group g) { return GROUP_NAMES[g]; }
const char *fc_mem_cat_name(fc_mem_cat c) { return MEM_NAMES[c]; }
const char *fc_mem_loc_name(fc_mem_loc l) { return LOC_NAMES[l]; }

void fc_log_init(fc_comm_log *log) { memset(log, 0, sizeof *log); }

void fc_log_free(fc_comm_log *log) {
    free(log->ev);
    memset(log, 0, sizeof *log);
}

void fc_log_begin_step(fc_comm_log *log, long step) {
    log->step = step;
    log->micro = 0;
    log->order = 0;
}

void fc_log_push(fc_comm_log *log, const fc_event *ev) {
    if (log->n == log->cap) {
        log->cap = log->cap ? 2 * log->cap : 256;
        log->ev = reallocCheck(log->ev, log->cap * sizeof(fc_event));
    }
    log->ev[log->n++] = *ev;
}

void fc_log_add(fc_comm_log *log, fc_event ev) {
    ev.step = log->step;
    ev.micro = log->micro;
    ev.order = log->order++;
    fc_log_push(log, &ev);
    fc_watchdog_event(&ev);  // every logged event is progress
}

void fc_log_event(fc_comm_log *log, fc_op op, fc_op of, int unit, int stage, fc_group group, size_t bytes,
                  fc_prec dtype, fc_phase phase, int prefetch) {
    fc_event e = {0};
    e.op = op;
    e.of = of;
    e.unit = unit;
    e.stage = stage;
    e.group = group;
    e.bytes = bytes;
    e.dtype = dtype;
    e.phase = phase;
    e.prefetch = prefetch;
    fc_log_add(log, e);
}

void fc_log_write_jsonl(const fc_comm_log *log, int rank, FILE *f) {
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        fprintf(f, "{\"rank\":%d,\"step\":%ld,\"micro\":%d,\"order\":%d,\"op\":\"%s\"", rank, e->step,
                e->micro, e->order, OP_NAMES[e->op]);
        if (e->op == FC_OP_WAIT) fprintf(f, ",\"of\":\"%s\"", OP_NAMES[e->of]);
        fprintf(f, ",\"unit\":%d,\"stage\":%d,\"group\":\"%s\",\"bytes\":%zu,\"dtype\":\"%s\","
                   "\"phase\":\"%s\",\"prefetch\":%s}\n",
                e->unit, e->stage, GROUP_NAMES[e->group], e->bytes, fc_prec_name(e->dtype),
                PHASE_NAMES[e->phase], e->prefetch ? "true" : "false");
    }
}

void fc_mem_add(fc_mem_stats *m, fc_mem_loc loc, fc_mem_cat cat, size_t bytes) {
    m->cur[loc][cat] += bytes;
    m->cur_total[loc] += bytes;
    if (m->cur[loc][cat] > m->peak[loc][cat]) m->peak[loc][cat] = m->cur[loc][cat];
    if (m->cur_total[loc] > m->peak_total[loc]) m->peak_total[loc] = m->cur_total[loc];
}

void fc_mem_sub(fc_mem_stats *m, fc_mem_loc loc, fc_mem_cat cat, size_t bytes) {
    if (bytes > m->cur[loc][cat])
        fc_die(FC_EXIT_INTERNAL, "%s:%d: memory accounting underflow in %s", __FILE__, __LINE__,
               MEM_NAMES[cat]);
    m->cur[loc][cat] -= bytes;
    m->cur_total[loc] -= bytes;
}
