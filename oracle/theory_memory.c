// oracle/theory_memory.c — the memory figures of one rank against the theory
// (P11, fc_theory_check_memory, see theory.h): the shards by the sharded
// formula, the gathered parameters and unsharded gradients by the peaks its
// own comm log shows and the bounds the prefetch policy sets, and the
// implementation's own categories (activations, comm buffers) only reported.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "optim.h"
#include "theory_internal.h"

// Bytes of unit u's post-forward slice under FSDP2's integer
// reshard_after_forward (P_u / PF in param_dtype), 0 where none is kept.
static size_t slice_bytes(const theory *t, int u) {
    return t->g.PF && reshards(t, u) ? t->lay[u].padded / (size_t)t->g.PF * t->psz : 0;
}

// The peak of gathered parameters the comm log shows: a unit's held elements
// (theory_internal.h) in param_dtype from its all_gather until its free. A
// post-forward slice is taken before the forward free and held until the
// all_gather that rebuilds the unit from it has completed.
static size_t log_gathered_peak(const theory *t, const fc_comm_log *log) {
    enum { NONE, FULL, SLICE, FULL_AND_SLICE };
    int *held = callocCheck((size_t)t->nu, sizeof(int));
    size_t cur = 0, peak = 0;
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        int u = e->unit;
        if (!valid_unit(t, u)) continue;
        size_t bytes = held_elems(t, u) * t->psz, slice = slice_bytes(t, u);
        if (e->op == FC_OP_ALL_GATHER && (held[u] == NONE || held[u] == SLICE)) {
            held[u] = held[u] == SLICE ? FULL_AND_SLICE : FULL;
            cur += bytes;
        } else if (e->op == FC_OP_WAIT && e->of == FC_OP_ALL_GATHER && held[u] == FULL_AND_SLICE) {
            held[u] = FULL;
            cur -= slice;
        } else if (e->op == FC_OP_FREE && held[u] == FULL) {
            int keep = slice && e->phase == FC_PHASE_FORWARD;
            cur += keep ? slice : 0;
            if (cur > peak) peak = cur;
            cur -= bytes;
            held[u] = keep ? SLICE : NONE;
        }
        if (cur > peak) peak = cur;
    }
    free(held);
    return peak;
}

// The most unsharded gradient the schedule needs at once, by the log: unit u's
// held elements of gradient, at most fp32, from its first backward compute until its
// reduction (reduce_scatter, or no_shard's all_reduce) completed; under
// no_sync it stays across the micro-batches that do not reduce.
static size_t log_grads_bound(const theory *t, const fc_comm_log *log) {
    int *live = callocCheck((size_t)t->nu, sizeof(int));
    size_t cur = 0, peak = 0;
    long step = log->n ? log->ev[0].step : 0;
    for (size_t i = 0; i < log->n; i++) {
        const fc_event *e = &log->ev[i];
        if (e->step != step) {  // a new step starts with no unsharded gradient
            memset(live, 0, (size_t)t->nu * sizeof(int));
            cur = 0;
            step = e->step;
        }
        if (!valid_unit(t, e->unit)) continue;
        size_t bytes = fp32_bytes(held_elems(t, e->unit));
        int reduced =
            e->op == FC_OP_WAIT && (e->of == FC_OP_REDUCE_SCATTER || (e->of == FC_OP_ALL_REDUCE && !t->g.sharded));
        if (e->op == FC_OP_BACKWARD && !live[e->unit]) {
            live[e->unit] = 1;
            cur += bytes;
            if (cur > peak) peak = cur;
        } else if (reduced && live[e->unit]) {
            live[e->unit] = 0;
            cur -= bytes;
        }
    }
    free(live);
    return peak;
}

// What the prefetch policy lets a sharded schedule hold of gathered
// parameters (bytes), from the config alone: at least the root (gathered
// from the first forward stage to the end of backward) with the largest
// other unit; at most that with prefetch off or the limiter on (with a root,
// two units: the root and one other), else the root and the largest run of
// D + 1 units adjacent in use order (one computing, the next D prefetched:
// D = 1, or FSDP2's longest explicit list).
// shard_grad_op keeps every unit from forward until its backward: all of them.
static void gathered_bounds(const theory *t, size_t *lo, size_t *hi) {
    const fc_model *m = &t->m;
    const fc_run_config *c = t->cfg;
    int D = fc_rule_prefetch_depth(c, 1), Db = fc_rule_prefetch_depth(c, 0);
    if (Db > D) D = Db;
    size_t root = m->root_unit >= 0 ? held_elems(t, m->root_unit) : 0, max1 = 0, run = 0, sum = 0;
    size_t *order = callocCheck((size_t)t->nu, sizeof *order);  // non-root units' elements in order of first use
    int n_order = 0;
    for (int s = 0; s < t->ns; s++) {  // units in order of first use
        int u = unit_of(t, s);
        if (t->st[u].first_fwd != s) continue;
        size_t n = held_elems(t, u);
        sum += n;
        if (u == m->root_unit) continue;
        if (n > max1) max1 = n;
        order[n_order++] = n;
    }
    for (int i = 0; i < n_order; i++) {  // the largest D + 1 consecutive (fewer at the end)
        size_t w = 0;
        for (int j = i; j < n_order && j <= i + D; j++) w += order[j];
        if (w > run) run = w;
    }
    free(order);
    size_t slices = 0;  // FSDP2's post-forward slices: all of them may be held at once
    for (int u = 0; u < t->nu; u++) slices += slice_bytes(t, u);
    if (!fc_rule_row_of(c->strategy)->frees_after_fwd) {
        *lo = *hi = sum * t->psz;
        return;
    }
    *lo = (root + max1) * t->psz;
    if (!c->forward_prefetch && t->bwd_prefetch == FC_PREFETCH_NONE)
        *hi = *lo;
    else if (c->limit_all_gathers)
        *hi = (m->root_unit >= 0 ? root + max1 : run) * t->psz;
    else
        *hi = (root + run) * t->psz;
    *hi += slices;
}

static int log_has_unit_collective(const fc_comm_log *log) {
    for (size_t i = 0; i < log->n; i++)
        if (is_collective(log->ev[i].op) && log->ev[i].unit >= 0) return 1;
    return 0;
}

// Shards: exact, fp32, where the strategy keeps them. A frozen parameter
// keeps no optimizer state; under FSDP2 no gradient either, while FSDP1's
// FlatParameter keeps its whole gradient shard unless no parameter of it trains.
static void check_shards(const theory *t, const fc_mem_stats *mem) {
    const fc_run_config *cfg = t->cfg;
    const size_t(*peak)[FC_MEM_COUNT] = mem->peak;
    const char *names[2];
    size_t shard = 0, frozen = 0, untrained = 0;  // untrained: the stores of units that do not train
    for (int u = 0; u < t->nu; u++) {
        shard += fp32_bytes(t->lay[u].store), frozen += fp32_bytes(t->frozen_store[u]);
        if (!t->trains[u]) untrained += fp32_bytes(t->lay[u].store);
    }
    fc_mem_loc on = cfg->cpu_offload ? FC_LOC_HOST : FC_LOC_DEVICE,
               off = cfg->cpu_offload ? FC_LOC_DEVICE : FC_LOC_HOST;
    fc_mem_cat cats[3] = {FC_MEM_PARAM_SHARD, FC_MEM_GRAD_SHARD, FC_MEM_OPTIM_STATE};
    size_t want[3] = {shard, t->per_param ? shard - frozen : shard - untrained,
                      (size_t)fc_optim_state_names(&cfg->optim, names) * (shard - frozen)};
    for (int i = 0; i < 3; i++) {
        EXPECT(t, peak[on][cats[i]] == want[i], "peak %s %s: expected %zu bytes (the sharded formula), got %zu",
               fc_mem_loc_name(on), fc_mem_cat_name(cats[i]), want[i], peak[on][cats[i]]);
        EXPECT(t, peak[off][cats[i]] == 0, "peak %s %s: expected 0 bytes, got %zu", fc_mem_loc_name(off),
               fc_mem_cat_name(cats[i]), peak[off][cats[i]]);
    }
}

// Gathered parameters: what the schedule holds.
static void check_gathered_params(const theory *t, const fc_comm_log *log, const fc_mem_stats *mem) {
    size_t gathered_params = mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS];
    if (t->g.sharded) {
        size_t in_log = log_gathered_peak(t, log), lo, hi;
        gathered_bounds(t, &lo, &hi);
        EXPECT(t, gathered_params == in_log,
               "peak device gathered_params: expected %zu bytes, the peak of gathered units in the comm log; got %zu",
               in_log, gathered_params);
        EXPECT(t, in_log >= lo && in_log <= hi,
               "the comm log holds up to %zu bytes of gathered parameters; the prefetch policy allows %zu..%zu", in_log,
               lo, hi);
        return;
    }
    // no_shard computes on its own fp32 parameters, or on a param_dtype
    // copy of them (all at once, or unit by unit as FSDP's NO_SHARD does)
    size_t all = 0;
    for (int u = 0; u < t->nu; u++) all += t->lay[u].numel * t->psz;
    if (t->cfg->param_dtype == FC_PREC_FP32)
        EXPECT(t, gathered_params == 0, "peak device gathered_params: no_shard in fp32 needs none, got %zu bytes",
               gathered_params);
    else
        EXPECT(t, gathered_params > 0 && gathered_params <= all,
               "peak device gathered_params: no_shard in %s needs a compute copy of 1..%zu bytes, got %zu",
               fc_prec_name(t->cfg->param_dtype), all, gathered_params);
}

// Unsharded gradients: at most what the comm log's schedule needs, since FSDP
// may keep one until its reduction completes and in fp32 (the reference's
// own value would judge every other implementation by the reference's choice).
static void check_gathered_grads(const theory *t, const fc_comm_log *log, const fc_mem_stats *mem) {
    const size_t *host = mem->peak[FC_LOC_HOST];
    size_t gathered_grads = mem->peak[FC_LOC_DEVICE][FC_MEM_GATHERED_GRADS], bound = log_grads_bound(t, log);
    EXPECT(t, gathered_grads <= bound,
           "peak device gathered_grads: expected at most %zu bytes (what the comm log's schedule needs), got %zu",
           bound, gathered_grads);
    if (t->g.sharded)
        EXPECT(t, gathered_grads > 0,
               "peak device gathered_grads: expected > 0 (a sharded backward needs unsharded gradients), got 0");
    for (int c = FC_MEM_GATHERED_PARAMS; c <= FC_MEM_GATHERED_GRADS; c++)
        EXPECT(t, host[c] == 0, "peak host %s: expected 0 (compute is on the device), got %zu",
               fc_mem_cat_name((fc_mem_cat)c), host[c]);
}

// Activations and communication buffers are the implementation's own (layout,
// precision, fusion): reported, never compared with a formula. The total's
// peak lies between the largest category's and their sum.
static void check_own_and_total(const theory *t, const fc_comm_log *log, const fc_mem_stats *mem) {
    const size_t *dev = mem->peak[FC_LOC_DEVICE], *host = mem->peak[FC_LOC_HOST];
    EXPECT(t, dev[FC_MEM_ACTIVATIONS] + host[FC_MEM_ACTIVATIONS] > 0, "activations: expected a nonzero peak, got 0");
    if (log_has_unit_collective(log))
        EXPECT(t, dev[FC_MEM_COMM_BUFFERS] + host[FC_MEM_COMM_BUFFERS] > 0,
               "comm_buffers: expected a nonzero peak (the comm log has collectives), got 0");
    for (int l = 0; l < FC_LOC_COUNT; l++) {
        size_t max = 0, sum = 0;
        for (int c = 0; c < FC_MEM_COUNT; c++) {
            sum += mem->peak[l][c];
            if (mem->peak[l][c] > max) max = mem->peak[l][c];
        }
        EXPECT(t, mem->peak_total[l] >= max && mem->peak_total[l] <= sum,
               "peak %s total %zu: expected between the largest category's peak %zu and the sum of peaks %zu",
               fc_mem_loc_name((fc_mem_loc)l), mem->peak_total[l], max, sum);
    }
}

int fc_theory_check_memory(const fc_run_config *cfg, int W, int rank, const fc_comm_log *log, const fc_mem_stats *mem,
                           fc_findings *out) {
    int before = out->n;
    if (cfg->strategy == FC_STRATEGY_LOCAL) return 0;
    theory t;
    theory_init(&t, cfg, W, rank, FC_API_REFERENCE, out);
    check_shards(&t, mem);
    check_gathered_params(&t, log, mem);
    check_gathered_grads(&t, log, mem);
    check_own_and_total(&t, log, mem);
    theory_free(&t);
    return out->n - before;
}
