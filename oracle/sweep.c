// oracle/sweep.c — `mpiexec -n W fsdpcheck sweep`: the conformance gate.
//
// Draws seeded random cases from the config space (model, strategy, shard
// group, prefetch, limiter, dtypes, accumulation, clipping, offload,
// optimizer) at every world size W' = 1..W (sub-communicators of the job),
// runs each with the implementation under test, and checks the properties of
// DESIGN §8 against the clean reference:
//   P1  == the `local` ground truth (loss, gradients, parameters, optimizer
//       state, gradient norm), for fp32 cases
//   P2  full_shard / shard_grad_op == no_shard at the same W' (bitwise when
//       the tested implementation is the reference)
//   P3  hybrid == full_shard at the same W'
//   P4  the case's prefetch settings == no prefetch (bitwise)
//   P5  P1 at a W' whose shards are uneven or empty
//   P6  K micro-batches == the local model on the joined batch
//   P7  train k, save (FULL or SHARDED), load at another W and strategy,
//       train n == train k+n uninterrupted
//   P8  clip_grad_norm: norm and clipped training == local
//   P9  mixed precision == no_shard under the same policy (bitwise)
//   P10 comm log: counts and bytes of every collective == theory; limiter bound
//   P11 memory: shard, state and activation bytes == the sharded formula
//   P12 the same case twice is bitwise identical
//   P14 cpu_offload == no offload (bitwise)
// The first failing case is shrunk (smaller world, model, fewer steps,
// simpler options) while it keeps failing, and a one-line command that
// replays it is printed.
#include "sweep.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "cli.h"
#include "compare.h"
#include "forward.h"
#include "mpicheck.h"
#include "optim.h"
#include "runner.h"

// Tolerances (DESIGN §8): PyTorch assert_close's defaults per dtype.
#define RTOL_FP32 1.3e-6
#define ATOL_FP32 1e-5
#define RTOL_BF16 1.6e-2
#define ATOL_BF16 1e-5

typedef struct {
    const fc_impl_ops *tested;   // the implementation under test
    const fc_impl_ops *ref;      // the clean reference (baselines)
    int tested_is_ref;           // bitwise properties apply
    fc_fault inject;             // injected into the tested implementation
    int rank, W;
} sweep_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ---------------------------------------------------------------------------
// case generation

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int pick(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

static void set_model(fc_run_config *c, const char *name) {
    fc_error e;
    if (fc_model_config_load(name, &c->model, &e)) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
}

// The global batch of a case: divisible by W' and K, m samples per micro-batch.
static void set_batch(fc_run_config *c, int W, int m) { c->global_batch = W * c->grad_accum * m; }

static void draw_case(uint64_t *s, int world, fc_run_config *c, int *W, fc_case_ckpt *k) {
    for (;;) {
        memset(k, 0, sizeof *k);
        fc_run_config_defaults(c);
        *W = 1 + pick(s, world);
        const char *models[] = {"mlp-tiny", "gpt2-tiny", "gpt2-tiny", "mlp-micro"};
        set_model(c, models[pick(s, 4)]);
        const fc_strategy strategies[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_FULL_SHARD, FC_STRATEGY_FULL_SHARD,
                                          FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_HYBRID_SHARD,
                                          FC_STRATEGY_HYBRID_SHARD_ZERO2};
        c->strategy = strategies[pick(s, 6)];
        int hybrid = c->strategy == FC_STRATEGY_HYBRID_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2;
        if (hybrid) {  // a proper divisor when there is one, so replicas exist
            int divs[8], n = 0;
            for (int F = 1; F < *W; F++)
                if (*W % F == 0) divs[n++] = F;
            c->shard_group = n ? divs[pick(s, n)] : *W;
        }
        if (c->strategy != FC_STRATEGY_NO_SHARD) {
            c->backward_prefetch = (fc_prefetch)pick(s, 3);
            c->forward_prefetch = pick(s, 3) == 0;
            c->limit_all_gathers = (c->forward_prefetch || c->backward_prefetch) && pick(s, 3) == 0;
        }
        c->grad_accum = pick(s, 3) == 0 ? 2 : 1;
        c->no_sync = c->grad_accum > 1 && pick(s, 2);
        if (pick(s, 4) == 0) {
            c->norm_type = (fc_norm_type)pick(s, 3);
            c->clip_grad_norm = c->norm_type == FC_NORM_1 ? 0.5f : 0.05f;  // below typical norms: it clips
        }
        int mp = pick(s, 5);
        if (mp == 0) c->param_dtype = FC_PREC_BF16, c->reduce_dtype = FC_PREC_FP32;
        if (mp == 1) c->param_dtype = c->reduce_dtype = pick(s, 2) ? FC_PREC_BF16 : FC_PREC_FP16;
        c->cpu_offload = pick(s, 6) == 0;
        if (pick(s, 4) == 0) {
            c->optim.kind = FC_OPT_SGD;
            c->optim.lr = 0.05;
            c->optim.weight_decay = 0.0;
        }
        c->steps = 2;
        c->seq_len = 8;
        c->seed = rng_next(s) % 1000000;
        set_batch(c, *W, 1 + pick(s, 2));
        if (pick(s, 5) == 0) {  // a checkpoint round trip, loaded at another W and strategy
            const fc_strategy load[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP};
            c->steps = 3;
            k->on = 1;
            k->sharded = pick(s, 2);
            k->at = 1 + pick(s, 2);
            k->strategy = load[pick(s, 3)];
            do k->W = 1 + pick(s, world);
            while (c->global_batch % (k->W * c->grad_accum) != 0);
        }
        fc_error e;
        if (fc_run_config_validate(c, &e) == 0 && fc_run_config_validate_world(c, *W, &e) == 0) return;
    }
}

// The case as `run` flags: replayable, and what reports and JUnit name it by.
static void case_spec(const fc_run_config *c, const fc_case_ckpt *k, char *out, size_t cap) {
    size_t n = 0;
#define ADD(...) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__)
    ADD("--model %s --strategy %s", c->model.name, fc_strategy_name(c->strategy));
    if (c->shard_group) ADD(" --shard-group %d", c->shard_group);
    if (c->backward_prefetch != FC_PREFETCH_NONE) ADD(" --backward-prefetch %s", fc_prefetch_name(c->backward_prefetch));
    if (c->forward_prefetch) ADD(" --forward-prefetch");
    if (c->limit_all_gathers) ADD(" --limit-all-gathers");
    if (c->param_dtype != FC_PREC_FP32 || c->reduce_dtype != FC_PREC_FP32)
        ADD(" --param-dtype %s --reduce-dtype %s", fc_prec_name(c->param_dtype), fc_prec_name(c->reduce_dtype));
    if (c->grad_accum > 1) ADD(" --grad-accum %d", c->grad_accum);
    if (c->no_sync) ADD(" --no-sync");
    if (c->clip_grad_norm > 0) ADD(" --clip-grad-norm %g --norm-type %s", (double)c->clip_grad_norm, fc_norm_name(c->norm_type));
    if (c->cpu_offload) ADD(" --cpu-offload");
    ADD(" --optimizer %s --lr %g", fc_opt_name(c->optim.kind), c->optim.lr);
    if (c->optim.kind == FC_OPT_ADAMW || c->optim.weight_decay != 0) ADD(" --weight-decay %g", c->optim.weight_decay);
    ADD(" --steps %d --global-batch %d", c->steps, c->global_batch);
    if (c->model.kind == FC_MODEL_GPT2) ADD(" --seq-len %d", c->seq_len);
    ADD(" --seed %llu", (unsigned long long)c->seed);
    // sweep's own flag: save after AT steps, load at W2 with STRATEGY, continue
    if (k->on) ADD(" --ckpt %s:%d:%d:%s", k->sharded ? "sharded" : "full", k->at, k->W, fc_strategy_name(k->strategy));
#undef ADD
}

// ---------------------------------------------------------------------------
// comparisons

static void record(fc_case_result *r, int p, int ok, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void record(fc_case_result *r, int p, int ok, const char *fmt, ...) {
    r->checked |= 1u << p;
    if (ok) return;
    r->failed |= 1u << p;
    if (r->detail[0]) return;
    int n = snprintf(r->detail, sizeof r->detail, "P%d ", p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail + n, sizeof r->detail - (size_t)n, fmt, ap);
    va_end(ap);
}

// Compares run a (the tested side) with run b under property p: per-step
// loss and gradient norm, then the final gradients, parameters and
// optimizer state. Runs on the rank that holds the full tensors.
static int compare(fc_case_result *r, int p, const fc_run_config *c, int W, const fc_run_result *a,
                   const fc_run_result *b, int bitwise, const char *against) {
    if (!a->ok || !b->ok) {
        record(r, p, 0, "vs %s: run failed: %s", against, a->ok ? b->error : a->error);
        return 0;
    }
    // bf16 and fp16 policies are compared at bf16's tolerance (the looser of the two)
    int bf = c->param_dtype != FC_PREC_FP32 || c->reduce_dtype != FC_PREC_FP32;
    double rtol = bf ? RTOL_BF16 : RTOL_FP32, atol = bf ? ATOL_BF16 : ATOL_FP32;
    fc_model m;
    fc_model_build(&m, &c->model);
    int ok = 1;
    for (int t = 0; t < a->steps && t < b->steps && ok; t++) {
        double la = a->loss[t], lb = b->loss[t], na = a->norm[t], nb = b->norm[t];
        int same_loss = bitwise ? la == lb : fabs(la - lb) <= atol + rtol * fabs(lb);
        // the norm is accumulated in double from the gradients: relative 1e-5
        // for fp32 reductions, the dtype's rtol when reductions round to 16 bits
        int same_norm = bitwise ? na == nb : fabs(na - nb) <= (bf ? rtol : 1e-5) * fabs(nb) + 1e-12;
        if (!same_loss) record(r, p, 0, "vs %s: loss at step %d: %.9g vs %.9g", against, t, la, lb);
        if (!same_norm) record(r, c->clip_grad_norm > 0 ? 8 : p, 0, "vs %s: gradient norm at step %d: %.9g vs %.9g", against, t, na, nb);
        ok = same_loss && same_norm;
    }
    const float *ta[4] = {a->grads, a->params, a->state[0], a->state[1]};
    const float *tb[4] = {b->grads, b->params, b->state[0], b->state[1]};
    const char *kind[4] = {"grad", "param", "optim.state0", "optim.state1"};
    int nt = 2 + (a->n_state < b->n_state ? a->n_state : b->n_state);
    for (int k = 0; k < nt && ok; k++) {
        // 16-bit reductions along different trees (hybrid vs flat) differ by a
        // few ULPs of the *summands* (measured: up to 3 bf16 ULPs, 9e-5 on a
        // gradient of 4e-3), which is unbounded relative to an element whose
        // terms cancel; so the absolute tolerance scales with the tensor's
        // largest magnitude: atol = rtol * max|b|.
        double atol_k = atol;
        if (bf && !bitwise) {
            double mx = 0;
            for (size_t i = 0; i < m.numel; i++) mx = fabs((double)tb[k][i]) > mx ? fabs((double)tb[k][i]) : mx;
            atol_k = rtol * mx > atol ? rtol * mx : atol;
        }
        // AdamW's update is lr * m / (sqrt(v) + eps): for an element whose
        // gradient sits at the reduction's rounding noise it is a fraction of
        // lr whatever the gradient's exact bits (measured: 2.4e-5 = 0.024 lr
        // after one step, gpt2-tiny W=3, while its gradient agreed to 1e-9).
        // Gradients keep the tight tolerance; parameters allow 0.05 lr a step.
        if (!bitwise && k == 1 && c->optim.kind == FC_OPT_ADAMW) {
            double lr_tol = 0.05 * c->optim.lr * a->steps;
            if (lr_tol > atol_k) atol_k = lr_tol;
        }
        for (size_t i = 0; i < m.numel; i++) {
            float x = ta[k][i], y = tb[k][i];
            double d = fabs((double)x - y), rel = d / (fabs((double)y) > 0 ? fabs((double)y) : 1.0);
            if (d > r->max_abs[p]) r->max_abs[p] = d;
            if (rel > r->max_rel[p] && fabs((double)y) > 0) r->max_rel[p] = rel;
            uint64_t u64 = fc_ulp_distance(x, y);
            double ulp = u64 == UINT64_MAX ? INFINITY : (double)u64;
            if (ulp > r->max_ulp[p]) r->max_ulp[p] = ulp;
            int same = bitwise ? memcmp(&x, &y, 4) == 0 : d <= atol_k + rtol * fabs((double)y);
            if (same || !ok) continue;
            ok = 0;
            int q = 0;  // the parameter holding element i (offsets follow units, not registration)
            for (int p2 = 0; p2 < m.n_params; p2++)
                if (i >= m.params[p2].offset && i < m.params[p2].offset + m.params[p2].numel) q = p2;
            const char *name = m.params[q].name;
            size_t idx = i - m.params[q].offset;
            char own[320];
            fc_owner o = fc_cmp_param_owner(&m, c, W, q, idx);
            fc_owner_format(&o, &m, c, own, sizeof own);
            record(r, p, 0, "vs %s (%s): step %d %s.%s[%zu]: %.9g vs %.9g, owned by %s", against,
                   bitwise ? "bitwise" : "tolerance", a->steps - 1, kind[k], name, idx, (double)x, (double)y, own);
        }
    }
    r->checked |= 1u << p;
    fc_model_free(&m);
    return ok;
}

// ---------------------------------------------------------------------------
// P10 and P11: the schedule and memory theory, from the layout alone

static void check_schedule(fc_case_result *r, const fc_run_config *c, int W, const fc_run_result *t) {
    fc_model m;
    fc_model_build(&m, &c->model);
    int sharded = c->strategy != FC_STRATEGY_NO_SHARD;
    int hybrid = c->strategy == FC_STRATEGY_HYBRID_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2;
    int zero3 = c->strategy == FC_STRATEGY_FULL_SHARD || c->strategy == FC_STRATEGY_HYBRID_SHARD;
    int F = sharded ? (c->shard_group ? c->shard_group : W) : W, R = W / F;
    int K = c->grad_accum, sync = c->no_sync ? 1 : K;
    int nonroot = m.n_units - (m.root_unit >= 0);
    size_t pb = c->param_dtype == FC_PREC_FP32 ? 4 : 2, rb = c->reduce_dtype == FC_PREC_FP32 ? 4 : 2;
    // expected per step
    long ag = !sharded ? 0 : zero3 ? (long)K * (m.n_units + nonroot) : (long)K * m.n_units;
    long rs = sharded ? (long)m.n_units * sync : 0;
    long ar = (!sharded ? (long)m.n_units * sync : hybrid && R > 1 ? (long)m.n_units * sync : 0) + 1;  // + norm
    size_t rs_bytes = 0;
    for (int u = 0; u < m.n_units; u++) rs_bytes += (m.units[u].numel + (size_t)F - 1) / (size_t)F * (size_t)F * rb;
    long got_ag = 0, got_rs = 0, got_ar = 0, alive = 0, max_alive_prefetch = 0;
    size_t got_ag_bytes = 0, got_rs_bytes = 0;
    memset(r->comm_bytes, 0, sizeof r->comm_bytes);
    for (size_t i = 0; i < t->log.n; i++) {
        const fc_event *e = &t->log.ev[i];
        if (e->step != 0) continue;  // one step is enough: every step is the same
        if (e->op <= FC_OP_ALL_REDUCE) r->comm_bytes[e->op] += e->bytes;
        if (e->op == FC_OP_ALL_GATHER) {
            got_ag++, alive++;
            if (e->micro == 0) got_ag_bytes += e->bytes;
            if (e->prefetch && alive > max_alive_prefetch) max_alive_prefetch = alive;
        }
        if (e->op == FC_OP_FREE) alive--;
        if (e->op == FC_OP_REDUCE_SCATTER) {
            got_rs++;
            if (e->micro == c->grad_accum - 1) got_rs_bytes += e->bytes;
        }
        if (e->op == FC_OP_ALL_REDUCE) got_ar++;
    }
    int ok = got_ag == ag && got_rs == rs && got_ar == ar;
    record(r, 10, ok, "comm counts per step: all_gather %ld (theory %ld), reduce_scatter %ld (%ld), all_reduce %ld (%ld)",
           got_ag, ag, got_rs, rs, got_ar, ar);
    if (sharded) {
        // bytes of the first micro-batch's all-gathers and the last one's reductions
        size_t ag_fwd_bwd = 0;  // full_shard regathers non-root units in backward
        for (int u = 0; u < m.n_units; u++) {
            size_t S = (m.units[u].numel + (size_t)F - 1) / (size_t)F;
            ag_fwd_bwd += S * (size_t)F * pb * (zero3 && u != m.root_unit ? 2 : 1);
        }
        int bytes_ok = got_ag_bytes == ag_fwd_bwd && got_rs_bytes == rs_bytes;
        record(r, 10, bytes_ok, "comm bytes per micro-batch: all_gather %zu (theory %zu), reduce_scatter %zu (%zu)",
               got_ag_bytes, ag_fwd_bwd, got_rs_bytes, rs_bytes);
        if (c->limit_all_gathers)
            record(r, 10, max_alive_prefetch <= 2, "limit_all_gathers: a prefetch left %ld units gathered",
                   max_alive_prefetch);
    }
    // P11: shards, optimizer state and activations
    size_t shard = 0;
    for (int u = 0; u < m.n_units; u++)
        shard += (sharded ? (m.units[u].numel + (size_t)F - 1) / (size_t)F : m.units[u].numel) * 4;
    const char *names[2];
    size_t optim = shard * (size_t)fc_optim_state_names(&c->optim, names);
    fc_mem_loc loc = c->cpu_offload ? FC_LOC_HOST : FC_LOC_DEVICE;
    int T = c->model.kind == FC_MODEL_GPT2 ? c->seq_len : 0;
    size_t acts = fc_acts_numel(&m, c->global_batch / W / K, T) * sizeof(float);
    const fc_mem_stats *ms = &t->mem;
    int mem_ok = ms->peak[loc][FC_MEM_PARAM_SHARD] == shard && ms->peak[loc][FC_MEM_GRAD_SHARD] == shard &&
                 ms->peak[loc][FC_MEM_OPTIM_STATE] == optim && ms->peak[FC_LOC_DEVICE][FC_MEM_ACTIVATIONS] == acts;
    record(r, 11, mem_ok, "memory: param shards %zu (formula %zu), grad shards %zu (%zu), optimizer %zu (%zu), activations %zu (%zu)",
           ms->peak[loc][FC_MEM_PARAM_SHARD], shard, ms->peak[loc][FC_MEM_GRAD_SHARD], shard,
           ms->peak[loc][FC_MEM_OPTIM_STATE], optim, ms->peak[FC_LOC_DEVICE][FC_MEM_ACTIVATIONS], acts);
    for (int k = 0; k < FC_MEM_COUNT; k++) r->mem_peak[k] = ms->peak[FC_LOC_DEVICE][k] + ms->peak[FC_LOC_HOST][k];
    r->mem_total = ms->peak_total[FC_LOC_DEVICE] + ms->peak_total[FC_LOC_HOST];
    fc_model_free(&m);
}

// ---------------------------------------------------------------------------
// one case

static fc_run_config local_of(fc_run_config c) {
    c.strategy = FC_STRATEGY_LOCAL;
    c.shard_group = 0;
    c.backward_prefetch = FC_PREFETCH_NONE;
    c.forward_prefetch = c.limit_all_gathers = c.no_sync = c.cpu_offload = 0;
    c.inject = FC_FAULT_NONE;
    return c;
}

// Runs the reference's `local` on rank 0 of sub while the others wait quietly.
static void run_local_rank0(const sweep_ctx *x, const fc_run_config *c, MPI_Comm sub, fc_run_result *out) {
    memset(out, 0, sizeof *out);
    if (x->rank == 0) fc_runner_run(x->ref, c, MPI_COMM_SELF, out);
    fc_sleepy_barrier(sub);
}

// Removes a checkpoint directory the sweep made (its files are flat).
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *ent;
        char path[1024];
        while ((ent = readdir(d)) != NULL) {
            if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
            snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

// P7: train k->at steps at W, save, load into a fresh instance at k->W with
// k->strategy, train the rest; the result must equal the uninterrupted run t
// (bitwise on the same reduction tree, else within tolerance). World-collective.
static void check_round_trip(const sweep_ctx *x, const fc_run_config *cfg, int W, const fc_case_ckpt *k,
                             const fc_run_result *t, fc_case_result *res) {
    char dir[64] = "";
    if (x->rank == 0 && !mkdtemp(strcpy(dir, "/tmp/fsdpcheck-sweep-XXXXXX"))) dir[0] = '\0';
    mpiCheck(MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (!dir[0]) {
        record(res, 7, 0, "cannot create a temporary checkpoint directory");
        return;
    }
    fc_run_config tc = *cfg;
    tc.inject = x->inject;
    fc_state_dict kind = k->sharded ? FC_STATE_DICT_SHARDED : FC_STATE_DICT_FULL;
    int saved = 1;
    fc_error e = {{0}};
    MPI_Comm sub;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, x->rank < W ? 0 : MPI_UNDEFINED, x->rank, &sub));
    if (sub != MPI_COMM_NULL) {
        saved = fc_runner_save(x->tested, &tc, sub, k->at, dir, kind, &e) == 0;
        mpiCheck(MPI_Comm_free(&sub));
    }
    fc_sleepy_barrier(MPI_COMM_WORLD);
    mpiCheck(MPI_Bcast(&saved, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (!saved) {
        if (x->rank == 0) record(res, 7, 0, "save after step %d failed: %s", k->at, e.msg);
    } else {
        fc_run_config lc = tc;  // the loading run: another W and strategy
        lc.strategy = k->strategy;
        lc.shard_group = 0;
        if (lc.strategy == FC_STRATEGY_NO_SHARD) {
            lc.backward_prefetch = FC_PREFETCH_NONE;
            lc.forward_prefetch = lc.limit_all_gathers = 0;
        }
        lc.steps = cfg->steps - k->at;
        fc_run_result r;
        memset(&r, 0, sizeof r);
        mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, x->rank < k->W ? 0 : MPI_UNDEFINED, x->rank, &sub));
        if (sub != MPI_COMM_NULL) {
            fc_runner_resume(x->tested, &lc, sub, dir, &r);
            mpiCheck(MPI_Comm_free(&sub));
        }
        fc_sleepy_barrier(MPI_COMM_WORLD);
        if (x->rank == 0) {
            // the uninterrupted run's last steps line up with the resumed run's
            fc_run_result tail = *t;
            tail.loss = t->loss + k->at;
            tail.norm = t->norm + k->at;
            tail.steps = t->steps - k->at;
            int flat = cfg->strategy == FC_STRATEGY_NO_SHARD || cfg->strategy == FC_STRATEGY_FULL_SHARD ||
                       cfg->strategy == FC_STRATEGY_SHARD_GRAD_OP;
            int same_tree = flat && k->W == W;
            char against[96];
            snprintf(against, sizeof against, "uninterrupted (%s checkpoint at step %d, loaded at W=%d %s)",
                     k->sharded ? "sharded" : "full", k->at, k->W, fc_strategy_name(k->strategy));
            compare(res, 7, cfg, k->W, &r, &tail, x->tested_is_ref && same_tree, against);
        }
        fc_runner_free(&r);
    }
    if (x->rank == 0) remove_dir(dir);
}

// Checks one case at W' ranks; every rank of the world calls it and gets the
// same verdict back (rank 0 decides).
static void run_case(const sweep_ctx *x, const fc_run_config *cfg, int W, const fc_case_ckpt *k,
                     fc_case_result *res) {
    double t0 = now_s();
    memset(res, 0, sizeof *res);
    res->W = W;
    res->cfg = *cfg;
    res->ckpt = *k;
    case_spec(cfg, k, res->spec, sizeof res->spec);
    fc_run_result t;  // the tested run, kept for the round trip below
    memset(&t, 0, sizeof t);
    MPI_Comm sub;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, x->rank < W ? 0 : MPI_UNDEFINED, x->rank, &sub));
    if (sub != MPI_COMM_NULL) {
        fc_run_config tc = *cfg;
        tc.inject = x->inject;
        int exact = x->tested_is_ref;
        fc_run_result again;
        fc_runner_run(x->tested, &tc, sub, &t);
        int is0 = x->rank == 0;
        if (!t.ok && is0) record(res, 12, 0, "the case did not run: %s", t.error);
        if (t.ok) {
            // P12: the same case again
            fc_runner_run(x->tested, &tc, sub, &again);
            if (is0) compare(res, 12, cfg, W, &again, &t, 1, "itself");
            fc_runner_free(&again);
            int mixed = cfg->param_dtype != FC_PREC_FP32 || cfg->reduce_dtype != FC_PREC_FP32;
            // P1 / P5 / P6 / P8: the local ground truth (fp32 policies)
            if (!mixed) {
                fc_run_config lc = local_of(*cfg);
                fc_run_result l;
                run_local_rank0(x, &lc, sub, &l);
                if (is0) {
                    int p = cfg->clip_grad_norm > 0 ? 8 : cfg->grad_accum > 1 ? 6 : 1;
                    int ok = compare(res, p, cfg, W, &t, &l, 0, "local");
                    // uneven or empty shards at this W': world-size invariance
                    fc_model m;
                    fc_model_build(&m, &cfg->model);
                    int uneven = 0;
                    for (int u = 0; u < m.n_units; u++) uneven |= m.units[u].numel % (size_t)W != 0;
                    fc_model_free(&m);
                    if (uneven && W > 1) record(res, 5, ok, "uneven shards at W=%d", W);
                    if (cfg->grad_accum > 1) {  // P6: against local on the joined batch (K = 1)
                        lc.grad_accum = 1;
                        fc_run_result l1;
                        fc_runner_run(x->ref, &lc, MPI_COMM_SELF, &l1);
                        compare(res, 6, cfg, W, &t, &l1, 0, "local with K=1");
                        fc_runner_free(&l1);
                    }
                }
                fc_runner_free(&l);
                fc_sleepy_barrier(sub);
            }
            // P2 / P9: no_shard under the same policy
            if (cfg->strategy == FC_STRATEGY_FULL_SHARD || cfg->strategy == FC_STRATEGY_SHARD_GRAD_OP || mixed) {
                fc_run_config dc = *cfg;
                dc.strategy = FC_STRATEGY_NO_SHARD;
                dc.shard_group = 0;
                dc.backward_prefetch = FC_PREFETCH_NONE;
                dc.forward_prefetch = dc.limit_all_gathers = 0;
                fc_run_result d;
                fc_runner_run(x->ref, &dc, sub, &d);
                if (is0) {
                    int hybrid = cfg->strategy == FC_STRATEGY_HYBRID_SHARD || cfg->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2;
                    int same_tree = !hybrid || (cfg->shard_group && cfg->shard_group == W);
                    compare(res, mixed ? 9 : 2, cfg, W, &t, &d, exact && same_tree, "no_shard");
                }
                fc_runner_free(&d);
            }
            // P3: hybrid against full_shard / shard_grad_op over the whole world
            if (cfg->strategy == FC_STRATEGY_HYBRID_SHARD || cfg->strategy == FC_STRATEGY_HYBRID_SHARD_ZERO2) {
                fc_run_config fc = *cfg;
                fc.strategy = cfg->strategy == FC_STRATEGY_HYBRID_SHARD ? FC_STRATEGY_FULL_SHARD : FC_STRATEGY_SHARD_GRAD_OP;
                fc.shard_group = 0;
                fc_run_result f;
                fc_runner_run(x->ref, &fc, sub, &f);
                if (is0) compare(res, 3, cfg, W, &t, &f, exact && cfg->shard_group == W, "full_shard");
                fc_runner_free(&f);
            }
            // P4: the same implementation without prefetch
            if (cfg->forward_prefetch || cfg->backward_prefetch != FC_PREFETCH_NONE) {
                fc_run_config nc = tc;
                nc.backward_prefetch = FC_PREFETCH_NONE;
                nc.forward_prefetch = nc.limit_all_gathers = 0;
                fc_run_result n;
                fc_runner_run(x->tested, &nc, sub, &n);
                if (is0) compare(res, 4, cfg, W, &t, &n, exact, "no prefetch");
                fc_runner_free(&n);
            }
            // P14: the same implementation without offload
            if (cfg->cpu_offload) {
                fc_run_config oc = tc;
                oc.cpu_offload = 0;
                fc_run_result o;
                fc_runner_run(x->tested, &oc, sub, &o);
                if (is0) compare(res, 14, cfg, W, &t, &o, exact, "no offload");
                fc_runner_free(&o);
            }
            if (is0) check_schedule(res, cfg, W, &t);
        }
        mpiCheck(MPI_Comm_free(&sub));
    }
    fc_sleepy_barrier(MPI_COMM_WORLD);
    int t_ok = t.ok;
    mpiCheck(MPI_Bcast(&t_ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (k->on && t_ok) check_round_trip(x, cfg, W, k, &t, res);
    fc_runner_free(&t);
    res->seconds = now_s() - t0;
    // everyone learns rank 0's verdict (shrinking must take the same path everywhere)
    mpiCheck(MPI_Bcast(res, (int)sizeof *res, MPI_BYTE, 0, MPI_COMM_WORLD));
}

static int lowest_property(unsigned mask) {
    for (int p = 1; p < FC_NPROP; p++)
        if (mask & (1u << p)) return p;
    return 0;
}

// ---------------------------------------------------------------------------
// shrinking: simpler variants of a failing case, kept while they still fail

// Applies simplification k to (c, W); returns 0 if it does not apply.
static int simplify(int k, fc_run_config *c, int *W, fc_case_ckpt *ck) {
    int m = c->global_batch / (*W * c->grad_accum);  // samples per micro-batch
    switch (k) {
    case 0:  // a smaller world, down to 2 (faults that need peers), then 1
        if (*W <= 1) return 0;
        *W = *W > 2 ? *W - 1 : 1;
        if (c->shard_group && *W % c->shard_group) c->shard_group = 0;
        if (c->shard_group == *W) c->shard_group = 0;
        break;
    case 1:
        if (c->clip_grad_norm == 0) return 0;
        c->clip_grad_norm = 0, c->norm_type = FC_NORM_2;
        break;
    case 2:
        if (c->grad_accum == 1) return 0;
        c->grad_accum = 1, c->no_sync = 0;
        break;
    case 3:
        if (!c->no_sync) return 0;
        c->no_sync = 0;
        break;
    case 4:
        if (!c->cpu_offload) return 0;
        c->cpu_offload = 0;
        break;
    case 5:
        if (!c->limit_all_gathers) return 0;
        c->limit_all_gathers = 0;
        break;
    case 6:
        if (!c->forward_prefetch) return 0;
        c->forward_prefetch = 0;
        break;
    case 7:
        if (c->backward_prefetch == FC_PREFETCH_NONE) return 0;
        c->backward_prefetch = FC_PREFETCH_NONE;
        c->limit_all_gathers = c->limit_all_gathers && c->forward_prefetch;
        break;
    case 8:
        if (c->param_dtype == FC_PREC_FP32 && c->reduce_dtype == FC_PREC_FP32) return 0;
        c->param_dtype = c->reduce_dtype = FC_PREC_FP32;
        break;
    case 9:
        if (c->strategy != FC_STRATEGY_HYBRID_SHARD_ZERO2 && c->strategy != FC_STRATEGY_SHARD_GRAD_OP) return 0;
        c->strategy = c->strategy == FC_STRATEGY_SHARD_GRAD_OP ? FC_STRATEGY_FULL_SHARD : FC_STRATEGY_HYBRID_SHARD;
        break;
    case 10:  // fewer layers and smaller dims
        if (!strcmp(c->model.name, "gpt2-tiny")) set_model(c, "gpt2-micro");
        else if (!strcmp(c->model.name, "mlp-tiny")) set_model(c, "mlp-micro");
        else return 0;
        break;
    case 11:
        if (c->model.kind == FC_MODEL_GPT2) return 0;  // some faults live in the tied embedding
        if (!strcmp(c->model.name, "mlp-micro")) return 0;
        set_model(c, "mlp-micro");
        break;
    case 12:
        if (c->steps <= 1) return 0;
        c->steps--;
        break;
    case 13:
        if (c->model.kind != FC_MODEL_GPT2 || c->seq_len <= 2) return 0;
        c->seq_len /= 2;
        break;
    case 14:
        if (c->optim.kind == FC_OPT_ADAMW) return 0;
        c->optim = (fc_optim_config){0};
        {
            fc_run_config d;
            fc_run_config_defaults(&d);
            c->optim = d.optim;
        }
        break;
    case 15:
        if (m <= 1) return 0;
        m = 1;
        break;
    case 16:  // the checkpoint round trip, or its other world size
        if (!ck->on) return 0;
        if (ck->W != *W) {
            ck->W = *W;
        } else {
            ck->on = 0;
            c->steps = 2;
        }
        break;
    default:
        return 0;
    }
    set_batch(c, *W, m);
    fc_error e;
    return fc_run_config_validate(c, &e) == 0 && fc_run_config_validate_world(c, *W, &e) == 0;
}

#define N_SIMPLIFY 17

static void shrink(const sweep_ctx *x, fc_case_result *worst, int quiet) {
    fc_run_config c = worst->cfg;
    fc_case_ckpt ck = worst->ckpt;
    int W = worst->W, tries = 0;
    for (int progress = 1; progress && tries < 60;) {
        progress = 0;
        for (int k = 0; k < N_SIMPLIFY && tries < 60; k++) {
            fc_run_config c2 = c;
            fc_case_ckpt ck2 = ck;
            int W2 = W;
            if (!simplify(k, &c2, &W2, &ck2)) continue;
            if (ck2.on && (ck2.at >= c2.steps || c2.global_batch % (ck2.W * c2.grad_accum))) continue;
            fc_case_result r;
            run_case(x, &c2, W2, &ck2, &r);
            tries++;
            if (r.failed) {
                c = c2, ck = ck2, W = W2, *worst = r, progress = 1;
                if (!quiet && x->rank == 0) fprintf(stderr, "  shrunk (W=%d): %s\n", W, r.spec);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// memory profile for the report's plot

static void memory_profile(const sweep_ctx *x, fc_sweep_report *rep) {
    snprintf(rep->plot_model, sizeof rep->plot_model, "gpt2-tiny");
    const fc_strategy s[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_FULL_SHARD};
    for (int W = 1; W <= x->W && rep->n_points + 3 <= 64; W++) {
        for (int i = 0; i < 3; i++) {
            fc_run_config c;
            fc_run_config_defaults(&c);
            set_model(&c, "gpt2-tiny");
            c.strategy = s[i];
            c.steps = 1;
            c.seq_len = 8;
            set_batch(&c, W, 1);
            fc_model m;
            fc_model_build(&m, &c.model);
            rep->plot_numel = m.numel;
            fc_model_free(&m);
            MPI_Comm sub;
            mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, x->rank < W ? 0 : MPI_UNDEFINED, x->rank, &sub));
            fc_mem_point pt = {s[i], W, 0, 0, 0, 0};
            if (sub != MPI_COMM_NULL) {
                fc_run_result r;
                fc_runner_run(x->tested, &c, sub, &r);
                const size_t *pk = r.mem.peak[FC_LOC_DEVICE];
                pt.param = pk[FC_MEM_PARAM_SHARD], pt.grad = pk[FC_MEM_GRAD_SHARD];
                pt.optim = pk[FC_MEM_OPTIM_STATE], pt.gathered = pk[FC_MEM_GATHERED_PARAMS];
                fc_runner_free(&r);
                mpiCheck(MPI_Comm_free(&sub));
            }
            fc_sleepy_barrier(MPI_COMM_WORLD);
            if (x->rank == 0) rep->points[rep->n_points++] = pt;
        }
    }
}

// ---------------------------------------------------------------------------
// the command

static const char *PROPERTY_NAMES[FC_NPROP] = {
    "", "== local ground truth", "no_shard == full_shard == shard_grad_op", "hybrid == full_shard",
    "prefetch == none", "world-size invariance", "accumulation == joined batch", "checkpoint round trip",
    "clip_grad_norm == local", "mixed precision FSDP == DDP", "comm log == theory", "memory == formula",
    "determinism", "finite differences", "cpu_offload == none"};

static void usage(FILE *f) {
    fputs("usage: mpiexec -n W fsdpcheck sweep [--impl reference|PATH.so] [--cases N] [--seed S]\n"
          "           [--inject FAULT] [--report FILE.md] [--junit FILE.xml] [--keep-going] [--quiet]\n"
          "       mpiexec -n W fsdpcheck sweep --replay 'RUN FLAGS' [--impl X] [--inject FAULT]\n",
          f);
}

static _Noreturn void die_all(int rank, const char *msg) {
    MPI_Finalize();
    if (rank == 0) fc_die(FC_EXIT_USAGE, "%s", msg);
    exit(FC_EXIT_USAGE);
}

int fc_cmd_sweep(int argc, char **argv) {
    mpiCheck(MPI_Init(NULL, NULL));
    sweep_ctx x = {0};
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &x.rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &x.W));
    int cases = 300, keep_going = 0, quiet = 0;
    uint64_t seed = 1;
    const char *impl = "reference", *report = NULL, *junit = NULL, *replay = NULL;
    char msg[600];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end;
        if (!strcmp(a, "--help")) {
            if (x.rank == 0) usage(stdout);
            MPI_Finalize();
            return FC_EXIT_PASS;
        } else if (!strcmp(a, "--keep-going")) {
            keep_going = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!v) {
            snprintf(msg, sizeof msg, "sweep: %s needs a value (or is unknown: see fsdpcheck sweep --help)", a);
            die_all(x.rank, msg);
        } else if (!strcmp(a, "--cases")) {
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1000000) {
                snprintf(msg, sizeof msg, "sweep --cases: '%s' is not an integer in 1..1000000", v);
                die_all(x.rank, msg);
            }
            cases = (int)n, i++;
        } else if (!strcmp(a, "--seed")) {
            unsigned long long n = strtoull(v, &end, 10);
            if (*end || !*v || *v == '-') {
                snprintf(msg, sizeof msg, "sweep --seed: '%s' is not a non-negative integer", v);
                die_all(x.rank, msg);
            }
            seed = n, i++;
        } else if (!strcmp(a, "--impl")) {
            impl = v, i++;
        } else if (!strcmp(a, "--inject")) {
            if (fc_fault_parse(v, &x.inject) || x.inject == FC_FAULT_NONE) {
                snprintf(msg, sizeof msg, "sweep --inject: unknown fault '%s'", v);
                die_all(x.rank, msg);
            }
            i++;
        } else if (!strcmp(a, "--report")) {
            report = v, i++;
        } else if (!strcmp(a, "--junit")) {
            junit = v, i++;
        } else if (!strcmp(a, "--replay")) {
            replay = v, i++;
        } else {
            snprintf(msg, sizeof msg, "sweep: unknown flag %s (see fsdpcheck sweep --help)", a);
            die_all(x.rank, msg);
        }
    }
    fc_error e;
    x.tested = fc_impl_resolve(impl, &e);
    if (!x.tested) die_all(x.rank, e.msg);
    x.ref = fc_reference_impl();
    x.tested_is_ref = x.tested == x.ref;
    if (x.inject != FC_FAULT_NONE && !x.tested_is_ref)
        die_all(x.rank, "sweep --inject: faults are injected into the reference only");

    fc_sweep_report *rep = callocCheck(1, sizeof *rep);
    snprintf(rep->impl, sizeof rep->impl, "%s", impl);
    rep->inject = x.inject;
    rep->seed = seed;
    rep->world = x.W;
    double t0 = now_s();

    if (replay) {  // exactly one case, at this job's W
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", replay);
        char *args[128];
        int n = 0;
        fc_case_ckpt ck = {0};
        for (char *tok = strtok(buf, " \t"); tok && n < 128; tok = strtok(NULL, " \t")) {
            if (strcmp(tok, "--ckpt") != 0) {
                args[n++] = tok;
                continue;
            }
            char *v = strtok(NULL, " \t"), kind[16] = "", strat[32] = "";
            if (!v || sscanf(v, "%15[a-z]:%d:%d:%31[a-z_0-9]", kind, &ck.at, &ck.W, strat) != 4 ||
                (strcmp(kind, "full") && strcmp(kind, "sharded")) || fc_strategy_parse(strat, &ck.strategy) ||
                ck.W < 1 || ck.W > x.W || ck.at < 1)
                die_all(x.rank, "sweep --replay: --ckpt takes full|sharded:AT:W:STRATEGY with W <= the job's size");
            ck.on = 1;
            ck.sharded = !strcmp(kind, "sharded");
        }
        fc_run_args ra;
        if (fc_cli_parse_run(n, args, &ra, &e) != 0) die_all(x.rank, e.msg);
        if (fc_run_config_validate_world(&ra.cfg, x.W, &e)) die_all(x.rank, e.msg);
        if (ck.on && (ck.at >= ra.cfg.steps || ra.cfg.global_batch % (ck.W * ra.cfg.grad_accum)))
            die_all(x.rank, "sweep --replay: --ckpt AT must be below --steps and W must divide the batch");
        fc_case_result r;
        run_case(&x, &ra.cfg, x.W, &ck, &r);
        if (x.rank == 0) {
            for (int p = 1; p < FC_NPROP; p++)
                if (r.checked & (1u << p))
                    printf("P%-2d %-42s %s\n", p, PROPERTY_NAMES[p], r.failed & (1u << p) ? "FAIL" : "pass");
            if (r.failed) printf("%s\ncaught by P%d\n", r.detail, lowest_property(r.failed));
        }
        MPI_Finalize();
        return r.failed ? FC_EXIT_FAIL : FC_EXIT_PASS;
    }

    rep->cases = callocCheck((size_t)cases, sizeof(fc_case_result));
    uint64_t s = seed;
    int tty = isatty(STDERR_FILENO);
    int failed_at = -1;
    for (int i = 0; i < cases; i++) {
        fc_run_config c;
        fc_case_ckpt ck;
        int W;
        draw_case(&s, x.W, &c, &W, &ck);
        fc_case_result *r = &rep->cases[i];
        run_case(&x, &c, W, &ck, r);
        r->index = i;
        rep->n = i + 1;
        if (r->failed) rep->n_failed++;
        if (!quiet && x.rank == 0 && (tty || (i + 1) % 50 == 0 || r->failed || i + 1 == cases)) {
            fprintf(stderr, "%s[%4d/%d] %5.1f s  passed %d  failed %d  (W=%d %s %s)%s", tty ? "\r" : "", i + 1, cases,
                    now_s() - t0, rep->n - rep->n_failed, rep->n_failed, W, fc_strategy_name(c.strategy),
                    c.model.name, tty ? "   " : "\n");
            fflush(stderr);
        }
        if (r->failed && failed_at < 0) failed_at = i;
        if (r->failed && !keep_going) break;
    }
    if (!quiet && x.rank == 0 && tty) fputc('\n', stderr);
    if (failed_at >= 0) {
        rep->have_shrunk = 1;
        rep->shrunk = rep->cases[failed_at];
        if (x.rank == 0) fprintf(stderr, "case %d failed (W=%d): %s\n  %s\n", failed_at, rep->shrunk.W,
                                 rep->shrunk.spec, rep->shrunk.detail);
        shrink(&x, &rep->shrunk, quiet);
        rep->caught_by = lowest_property(rep->shrunk.failed);
        int n = snprintf(rep->repro, sizeof rep->repro, "mpiexec -n %d fsdpcheck sweep --replay '%s'", rep->shrunk.W,
                         rep->shrunk.spec);
        if (strcmp(impl, "reference")) n += snprintf(rep->repro + n, sizeof rep->repro - (size_t)n, " --impl %s", impl);
        if (x.inject) snprintf(rep->repro + n, sizeof rep->repro - (size_t)n, " --inject %s", fc_fault_name(x.inject));
    }
    if (report) memory_profile(&x, rep);
    rep->seconds = now_s() - t0;
    int rc = rep->n_failed ? FC_EXIT_FAIL : FC_EXIT_PASS;
    if (x.rank == 0) {
        printf("fsdpcheck sweep: %d cases over W=1..%d, seed %llu, impl %s%s%s: %d passed, %d failed (%.1f s)\n",
               rep->n, x.W, (unsigned long long)seed, impl, x.inject ? ", injected " : "",
               x.inject ? fc_fault_name(x.inject) : "", rep->n - rep->n_failed, rep->n_failed, rep->seconds);
        if (rep->have_shrunk) {
            printf("minimal failing case (W=%d): %s\n  %s\n", rep->shrunk.W, rep->shrunk.spec, rep->shrunk.detail);
            printf("caught by P%d (%s)\n", rep->caught_by, PROPERTY_NAMES[rep->caught_by]);
            printf("reproduce: %s\n", rep->repro);
        }
        if (report && fc_report_markdown(rep, report, &e)) fprintf(stderr, "fsdpcheck: --report: %s\n", e.msg), rc = FC_EXIT_USAGE;
        if (junit && fc_report_junit(rep, junit, &e)) fprintf(stderr, "fsdpcheck: --junit: %s\n", e.msg), rc = FC_EXIT_USAGE;
        fflush(stdout);
    }
    mpiCheck(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
    free(rep->cases);
    free(rep);
    MPI_Finalize();
    return rc;
}
