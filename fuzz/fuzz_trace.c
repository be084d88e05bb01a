// fuzz/fuzz_trace.c — libFuzzer harness for the trace.json reader
// (fc_trace_parse, oracle/tracefile.h), from memory.
//
// An accepted trace.json must describe a run `compare` can rely on: a valid
// config at its world size, a unit layout equal to the registry's, and a
// layout under which every parameter element has exactly one owning shard:
// the owner of each parameter's first and last element is checked to be a
// rank of the world whose shard range holds it, and every sample of the
// global batch has a reading rank.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "tracefile.h"

static void check(int ok) {
    if (!ok) abort();
}

static void check_owner(const fc_trace *t, int p, size_t index) {
    const fc_model *m = &t->model;
    fc_owner o = fc_cmp_param_owner(m, &t->cfg, t->world_size, p, index);
    check(o.unit == m->params[p].unit && o.unit_offset == m->params[p].unit_offset + index);
    check(o.unit_offset < o.unit_numel);
    if (o.kind == FC_OWNER_REPLICATED) {
        check(t->cfg.strategy == FC_STRATEGY_LOCAL || t->cfg.strategy == FC_STRATEGY_NO_SHARD);
        return;
    }
    check(o.kind == FC_OWNER_SHARD);
    check(o.group_size >= 1 && o.group_size * o.n_groups == t->world_size);
    check(o.shard >= 0 && o.shard < o.group_size && o.rank == o.shard);
    check((size_t)o.shard * o.shard_size <= o.unit_offset && o.unit_offset < (size_t)(o.shard + 1) * o.shard_size);
    check(o.shard_size * (size_t)o.group_size >= o.unit_numel);  // padded to a multiple of F
    char text[512];
    fc_owner_format(&o, m, &t->cfg, text, sizeof text);
    check(text[0] != '\0');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fc_trace t;
    fc_error e;
    e.msg[0] = '\0';
    if (fc_trace_parse((const char *)data, size, "trace.json", &t, &e) != 0) {
        check(e.msg[0] != '\0');
        return 0;
    }
    check(t.world_size >= 1 && t.steps >= 1 && t.first_step >= 0 && t.impl[0] != '\0');
    check(fc_run_config_validate(&t.cfg, &e) == 0 && fc_run_config_validate_world(&t.cfg, t.world_size, &e) == 0);
    check(t.n_state >= 0 && t.n_state <= 2);
    const fc_model *m = &t.model;
    check(m->n_params > 0 && m->n_units > 0);
    for (int p = 0; p < m->n_params; p++) {
        check(m->params[p].numel > 0);
        check_owner(&t, p, 0);
        check_owner(&t, p, m->params[p].numel - 1);
    }
    for (int s = 0; s < t.cfg.global_batch; s += t.cfg.global_batch > 1 ? t.cfg.global_batch - 1 : 1) {
        fc_owner o = fc_cmp_batch_owner(&t.cfg, t.world_size, s);
        check(o.kind == FC_OWNER_DATA && o.rank >= 0 && o.rank < t.world_size);
    }
    fc_trace_close(&t);
    return 0;
}
