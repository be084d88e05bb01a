// optimized/tests/test_engine_host.c — the CUDA port's FSDP engine
// (optimized/engine.c) on a CPU, against the reference engine, at the world
// size it is started with (mpiexec -n W, W = 1..4).
//
// The engine drives the host executor (exec_host.h), which checks every
// buffer the engine hands it and does the reference's arithmetic; so for
// every strategy, prefetch setting, accumulation with and without no_sync,
// clip norm type, divide mode, cpu_offload, optimizer and mixed-precision
// policy, for llama (tied and untied), frozen parameters (a unit mixing
// frozen and trainable ones, and one with none that trains) and LoRA, the
// engine must give the reference's run: losses, norms,
// gradients, parameters and optimizer state bit for bit (fp32; mlp in 16-bit
// too; gpt2 in 16-bit within 1% of each tensor's scale, as the engine
// rounds the tied root unit's gradient between its two stages where the
// reference emulation rounds once), every rank's comm log event for event,
// and the memory figures the theory checks (shards, optimizer state,
// gathered parameters and gradients) byte for byte. Then checkpoints cross
// implementations: the engine's FULL and SHARDED saves load into the
// reference at another strategy and the reference's into the engine, and
// both continue identically.
//
// What this cannot see: the CUDA executor itself (kernels, streams, NCCL).
// MPICH test-suite style: rank 0 prints " No Errors" when every rank passed.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "exec_host.h"
#include "impl.h"
#include "mpicheck.h"
#include "optim.h"

static int errs, rank, W;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            if (errs++ < 40) {                                                   \
                fprintf(stderr, "[rank %d] %s: ", rank, label);                  \
                fprintf(stderr, __VA_ARGS__);                                    \
                fputc('\n', stderr);                                             \
            }                                                                    \
        }                                                                        \
    } while (0)

typedef struct {
    fce *f;
    fcx *x;
} engine;

static int engine_create(engine *en, const fc_run_config *cfg, fc_error *e) {
    fce_comms c;
    fce_comms_make(cfg, MPI_COMM_WORLD, &c);
    en->x = fcx_host_create(cfg, &c);
    en->f = fce_create(cfg, &c, en->x, e);
    if (!en->f) {
        fcx_host_destroy(en->x);
        fce_comms_free(&c);
        return -1;
    }
    return 0;
}

static void engine_destroy(engine *en, const char *label) {
    fce_destroy(en->f);
    const char *first;
    int v = fcx_host_violations(en->x, &first);
    CHECK(v == 0, "%d buffer violation(s); first: %s", v, first);
    CHECK(fcx_host_live(en->x) == 0, "%zu allocation(s) leaked", fcx_host_live(en->x));
    fcx_host_destroy(en->x);
}

// exports of one implementation on rank 0: params, grads, states
typedef struct {
    float *t[4];
} full4;

static void export4(const char *label, full4 *out, size_t n, int n_state,
                    int (*ex)(void *, fc_export, float *, fc_error *), void *ctx) {
    fc_export what[4] = {FC_EXPORT_PARAMS, FC_EXPORT_GRADS, FC_EXPORT_STATE0, FC_EXPORT_STATE1};
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 2 + n_state; i++) {
        out->t[i] = rank == 0 ? callocCheck(n, sizeof(float)) : NULL;
        fc_error e;
        CHECK(ex(ctx, what[i], out->t[i], &e) == 0, "export %d: %s", i, e.msg);
    }
}

static void free4(full4 *a) {
    for (int i = 0; i < 4; i++) free(a->t[i]);
}

static int ex_engine(void *ctx, fc_export w, float *dst, fc_error *e) { return fce_export(ctx, w, dst, 0, e); }
static const fc_impl_ops *REF;
static int ex_ref(void *ctx, fc_export w, float *dst, fc_error *e) { return REF->export_full(ctx, w, dst, 0, e); }

// a and b on rank 0: bitwise, or within tol of each tensor's largest |b|
static void compare4(const char *label, const char *when, const full4 *a, const full4 *b, size_t n, int n_state,
                     int exact, double tol) {
    if (rank != 0) return;
    static const char *names[4] = {"params", "grads", "state0", "state1"};
    for (int i = 0; i < 2 + n_state; i++) {
        double scale = 0;
        for (size_t k = 0; k < n; k++) scale = fmax(scale, fabs((double)b->t[i][k]));
        size_t bad = 0, first = 0;
        for (size_t k = 0; k < n; k++) {
            int ok = exact ? memcmp(&a->t[i][k], &b->t[i][k], sizeof(float)) == 0
                           : fabs((double)a->t[i][k] - (double)b->t[i][k]) <= tol * scale;
            if (!ok && bad++ == 0) first = k;
        }
        CHECK(bad == 0, "%s %s: %zu element(s) differ, first [%zu]: engine %.9g, reference %.9g", when, names[i], bad, first,
              (double)a->t[i][first], (double)b->t[i][first]);
    }
}

static void compare_logs(const char *label, const fc_comm_log *a, const fc_comm_log *b) {
    CHECK(a->n == b->n, "comm log: %zu events, the reference logged %zu", a->n, b->n);
    size_t n = a->n < b->n ? a->n : b->n;
    for (size_t i = 0; i < n; i++) {
        const fc_event *x = &a->ev[i], *y = &b->ev[i];
        int same = x->step == y->step && x->micro == y->micro && x->order == y->order && x->op == y->op &&
                   (x->op != FC_OP_WAIT || x->of == y->of) && x->unit == y->unit && x->stage == y->stage &&
                   x->group == y->group && x->bytes == y->bytes && x->dtype == y->dtype && x->phase == y->phase &&
                   x->prefetch == y->prefetch;
        if (!same) {
            CHECK(0, "comm log event %zu: engine %s unit %d stage %d group %s bytes %zu prefetch %d (step %ld micro %d); "
                     "reference %s unit %d stage %d group %s bytes %zu prefetch %d (step %ld micro %d)",
                  i, fc_op_name(x->op), x->unit, x->stage, fc_group_name(x->group), x->bytes, x->prefetch, x->step, x->micro,
                  fc_op_name(y->op), y->unit, y->stage, fc_group_name(y->group), y->bytes, y->prefetch, y->step, y->micro);
            return;
        }
    }
}

static void compare_memory(const char *label, const fc_mem_stats *a, const fc_mem_stats *b) {
    fc_mem_cat cats[] = {FC_MEM_PARAM_SHARD, FC_MEM_GRAD_SHARD, FC_MEM_OPTIM_STATE, FC_MEM_GATHERED_PARAMS,
                         FC_MEM_GATHERED_GRADS};
    for (int l = 0; l < FC_LOC_COUNT; l++)
        for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
            CHECK(a->peak[l][cats[i]] == b->peak[l][cats[i]], "peak %s %s: engine %zu bytes, reference %zu",
                  fc_mem_loc_name((fc_mem_loc)l), fc_mem_cat_name(cats[i]), a->peak[l][cats[i]], b->peak[l][cats[i]]);
}

static fc_run_config base(const char *model, fc_strategy s) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_error e;
    if (fc_model_config_load(model, &c.model, &e)) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
    c.strategy = s;
    c.steps = 2;
    c.global_batch = 2 * W;
    c.seq_len = 8;
    if (s == FC_STRATEGY_HYBRID_SHARD || s == FC_STRATEGY_HYBRID_SHARD_ZERO2) c.shard_group = W % 2 == 0 ? 2 : W;
    return c;
}

// Runs cfg on both implementations and compares everything.
static void run_case(const char *label, fc_run_config cfg, int exact, double tol) {
    if (cfg.strategy == FC_STRATEGY_LOCAL && W != 1) return;
    fc_error e;
    fc_impl *ri = REF->create(&cfg, MPI_COMM_WORLD, &e);
    CHECK(ri != NULL, "reference create: %s", e.msg);
    engine en;
    int rc = engine_create(&en, &cfg, &e);
    CHECK(rc == 0, "engine create: %s", e.msg);
    if (!ri || rc) {
        if (!rc) engine_destroy(&en, label);
        if (ri) REF->destroy(ri);
        return;
    }
    fc_model m;
    fc_model_build(&m, &cfg.model);
    const char *sn[2];
    int n_state = fc_optim_state_names(&cfg.optim, sn);
    for (int t = 0; t < cfg.steps; t++) {
        fc_step_info a, b;
        CHECK(fce_step(en.f, &a, &e) == 0, "engine step %d: %s", t, e.msg);
        CHECK(REF->step(ri, &b, &e) == 0, "reference step %d: %s", t, e.msg);
        if (exact) {
            CHECK(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0, "step %d loss %.9g, reference %.9g", t, (double)a.loss,
                  (double)b.loss);
            CHECK(memcmp(&a.grad_norm, &b.grad_norm, sizeof a.grad_norm) == 0, "step %d norm %.17g, reference %.17g", t,
                  a.grad_norm, b.grad_norm);
        } else {
            CHECK(fabs(a.loss - b.loss) <= tol * fabs(b.loss), "step %d loss %.9g, reference %.9g", t, (double)a.loss,
                  (double)b.loss);
        }
        full4 x, y;
        export4(label, &x, m.numel, n_state, ex_engine, en.f);
        export4(label, &y, m.numel, n_state, ex_ref, ri);
        char when[32];
        snprintf(when, sizeof when, "step %d", t);
        compare4(label, when, &x, &y, m.numel, n_state, exact, tol);
        free4(&x);
        free4(&y);
    }
    if (cfg.strategy != FC_STRATEGY_LOCAL) {  // the reference's local keeps no log or accounting
        compare_logs(label, fce_log(en.f), REF->comm_log(ri));
        fc_mem_stats ma, mb;
        fce_memory(en.f, &ma);
        REF->memory(ri, &mb);
        compare_memory(label, &ma, &mb);
    }
    CHECK(fce_steps(en.f) == REF->steps_done(ri), "steps done %ld, reference %ld", fce_steps(en.f), REF->steps_done(ri));
    engine_destroy(&en, label);
    REF->destroy(ri);
    fc_model_free(&m);
}

// A fresh checkpoint directory name, the same on every rank.
static void tmpdir(char *dir, size_t n) {
    if (rank == 0) {
        snprintf(dir, n, "/tmp/fc-cuda-engine-XXXXXX");
        if (!mkdtemp(dir)) fc_die(FC_EXIT_INTERNAL, "mkdtemp failed");
    }
    mpiCheck(MPI_Bcast(dir, (int)n, MPI_CHAR, 0, MPI_COMM_WORLD));
}

static void rmdir_flat(const char *dir) {
    if (rank != 0) return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

// The saver trains 2 steps at cfg_s and saves (kind); the loader is created at
// cfg_l, loads, and must export the saver's parameters and states bit for
// bit; then both train one more step and must agree: bitwise when both
// strategies reduce over the same tree (same_tree), else within 1e-4 of each
// tensor's scale (a hybrid's two-level sum rounds differently).
static void ckpt_case(const char *label, fc_run_config cfg_s, int engine_saves, fc_run_config cfg_l, fc_state_dict kind,
                      int same_tree) {
    char dir[256];
    tmpdir(dir, sizeof dir);
    fc_error e;
    fc_model m;
    fc_model_build(&m, &cfg_s.model);
    const char *sn[2];
    int n_state = fc_optim_state_names(&cfg_s.optim, sn);
    engine en;
    fc_impl *ri = NULL;
    int ok = 1;
    if (engine_saves) {
        ok = engine_create(&en, &cfg_s, &e) == 0 && (ri = REF->create(&cfg_l, MPI_COMM_WORLD, &e)) != NULL;
    } else {
        ok = (ri = REF->create(&cfg_s, MPI_COMM_WORLD, &e)) != NULL && engine_create(&en, &cfg_l, &e) == 0;
    }
    CHECK(ok, "create: %s", e.msg);
    if (!ok) return;
    fc_step_info info;
    for (int t = 0; t < 2; t++) {
        int rc = engine_saves ? fce_step(en.f, &info, &e) : REF->step(ri, &info, &e);
        CHECK(rc == 0, "step: %s", e.msg);
    }
    int rc = engine_saves ? fce_save(en.f, dir, kind, &e) : REF->save(ri, dir, kind, &e);
    CHECK(rc == 0, "save: %s", e.msg);
    rc = engine_saves ? REF->load(ri, dir, &e) : fce_load(en.f, dir, &e);
    CHECK(rc == 0, "load: %s", e.msg);
    CHECK(fce_steps(en.f) == REF->steps_done(ri), "steps after load: engine %ld, reference %ld", fce_steps(en.f),
          REF->steps_done(ri));
    full4 x, y;
    export4(label, &x, m.numel, n_state, ex_engine, en.f);
    export4(label, &y, m.numel, n_state, ex_ref, ri);
    // gradients are not part of a checkpoint: compare params and states only
    if (rank == 0) {
        memcpy(x.t[1], y.t[1], m.numel * sizeof(float));
    }
    compare4(label, "after load", &x, &y, m.numel, n_state, 1, 0);
    free4(&x);
    free4(&y);
    fc_step_info a, b;
    CHECK(fce_step(en.f, &a, &e) == 0, "engine step after load: %s", e.msg);
    CHECK(REF->step(ri, &b, &e) == 0, "reference step after load: %s", e.msg);
    CHECK(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0, "loss after load %.9g, reference %.9g", (double)a.loss,
          (double)b.loss);  // the forward of the loaded parameters: no reduction yet
    export4(label, &x, m.numel, n_state, ex_engine, en.f);
    export4(label, &y, m.numel, n_state, ex_ref, ri);
    compare4(label, "the step after load", &x, &y, m.numel, n_state, same_tree, 1e-4);
    free4(&x);
    free4(&y);
    engine_destroy(&en, label);
    REF->destroy(ri);
    fc_model_free(&m);
    rmdir_flat(dir);
}

int main(int argc, char **argv) {
    mpiCheck(MPI_Init(&argc, &argv));
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &W));
    REF = fc_reference_impl();
    static const fc_strategy strategies[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP,
                                             FC_STRATEGY_HYBRID_SHARD, FC_STRATEGY_HYBRID_SHARD_ZERO2};
    char label[200];
    const char *models[] = {"mlp-tiny", "gpt2-tiny"};
    // every strategy x prefetch setting, both models, fp32: bitwise
    for (int mi = 0; mi < 2; mi++)
        for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++)
            for (int pf = 0; pf < (strategies[si] == FC_STRATEGY_NO_SHARD ? 1 : 4); pf++) {
                fc_run_config c = base(models[mi], strategies[si]);
                c.backward_prefetch = pf == 1 ? FC_PREFETCH_PRE : pf == 2 ? FC_PREFETCH_POST : FC_PREFETCH_NONE;
                c.forward_prefetch = pf == 1 || pf == 3;
                c.limit_all_gathers = pf >= 2;
                snprintf(label, sizeof label, "%s %s prefetch#%d", models[mi], fc_strategy_name(c.strategy), pf);
                run_case(label, c, 1, 0);
            }
    {
        fc_run_config c = base("gpt2-tiny", FC_STRATEGY_LOCAL);
        run_case("gpt2-tiny local", c, 1, 0);
    }
    // accumulation with and without no_sync, clip norms, divide modes, offload, SGD
    for (int mi = 0; mi < 2; mi++) {
        for (int ns = 0; ns < 2; ns++) {
            fc_run_config c = base(models[mi], FC_STRATEGY_FULL_SHARD);
            c.grad_accum = 2;
            c.global_batch = 4 * W;
            c.no_sync = ns;
            c.backward_prefetch = FC_PREFETCH_PRE;
            snprintf(label, sizeof label, "%s accumulation K=2 no_sync=%d", models[mi], ns);
            run_case(label, c, 1, 0);
            c.strategy = FC_STRATEGY_HYBRID_SHARD_ZERO2;
            c.shard_group = W % 2 == 0 ? 2 : W;
            snprintf(label, sizeof label, "%s hybrid_zero2 accumulation K=2 no_sync=%d", models[mi], ns);
            run_case(label, c, 1, 0);
        }
        for (int nt = 0; nt < 3; nt++) {
            fc_run_config c = base(models[mi], nt == 1 ? FC_STRATEGY_NO_SHARD : FC_STRATEGY_SHARD_GRAD_OP);
            c.clip_grad_norm = 0.05f;
            c.norm_type = (fc_norm_type)nt;
            snprintf(label, sizeof label, "%s clip norm %s", models[mi], fc_norm_name(c.norm_type));
            run_case(label, c, 1, 0);
        }
        for (int d = 1; d < 3; d++) {
            fc_run_config c = base(models[mi], FC_STRATEGY_FULL_SHARD);
            c.divide = (fc_divide)d;
            snprintf(label, sizeof label, "%s divide %s", models[mi], fc_divide_name(c.divide));
            run_case(label, c, 1, 0);
        }
        for (size_t si = 0; si < 3; si++) {
            fc_run_config c = base(models[mi], strategies[si]);
            c.cpu_offload = 1;
            c.forward_prefetch = strategies[si] != FC_STRATEGY_NO_SHARD;
            snprintf(label, sizeof label, "%s %s cpu_offload", models[mi], fc_strategy_name(c.strategy));
            run_case(label, c, 1, 0);
        }
        for (int mom = 0; mom < 2; mom++) {
            fc_run_config c = base(models[mi], FC_STRATEGY_FULL_SHARD);
            c.optim.kind = FC_OPT_SGD;
            c.optim.momentum = mom ? 0.9 : 0.0;
            c.optim.weight_decay = mom ? 0.01 : 0.0;
            snprintf(label, sizeof label, "%s sgd momentum %d", models[mi], mom);
            run_case(label, c, 1, 0);
        }
    }
    // llama (RMSNorm, RoPE, GQA, SwiGLU; llama-micro's head tied, llama-tiny's
    // untied), frozen parameters and LoRA: fp32, bitwise, every strategy
    const char *llamas[] = {"llama-micro", "llama-tiny"};
    for (int li = 0; li < 2; li++)
        for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++) {
            fc_run_config c = base(llamas[li], strategies[si]);
            int sharded = strategies[si] != FC_STRATEGY_NO_SHARD;
            c.backward_prefetch = sharded ? FC_PREFETCH_PRE : FC_PREFETCH_NONE;
            c.forward_prefetch = sharded;
            snprintf(label, sizeof label, "%s %s", llamas[li], fc_strategy_name(c.strategy));
            run_case(label, c, 1, 0);
        }
    {
        // frozen and trainable parameters in one unit (the embeddings and a
        // decoder layer's attention), and a unit with none that trains (layer 1)
        static const char *freeze = "^model\\.embed_tokens|^model\\.layers\\.0\\.self_attn|^model\\.layers\\.1\\.";
        for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++) {
            fc_run_config c = base("llama-tiny", strategies[si]);
            snprintf(c.freeze, sizeof c.freeze, "%s", freeze);
            c.clip_grad_norm = 0.05f;
            c.optim.weight_decay = 0.1;
            snprintf(label, sizeof label, "llama-tiny --freeze %s", fc_strategy_name(c.strategy));
            run_case(label, c, 1, 0);
        }
        fc_run_config c = base("llama-tiny", FC_STRATEGY_FULL_SHARD);
        snprintf(c.freeze, sizeof c.freeze, "%s", freeze);
        c.cpu_offload = 1;
        c.grad_accum = 2;
        c.global_batch = 4 * W;
        run_case("llama-tiny --freeze cpu_offload accumulation", c, 1, 0);
        for (int si = 0; si < 2; si++) {  // FSDP2: no gradient and no state for a frozen parameter's rows
            fc_run_config v = base("llama-tiny", si ? FC_STRATEGY_HYBRID_SHARD : FC_STRATEGY_FULL_SHARD);
            snprintf(v.freeze, sizeof v.freeze, "%s", freeze);
            v.fsdp_version = 2;
            v.cpu_offload = si;
            v.clip_grad_norm = 0.05f;
            v.optim.weight_decay = 0.1;
            snprintf(label, sizeof label, "llama-tiny FSDP2 --freeze %s%s", fc_strategy_name(v.strategy),
                     si ? " cpu_offload" : "");
            run_case(label, v, 1, 0);
        }
        fc_error e;
        for (int si = 0; si < 4; si++) {
            fc_run_config l = base("llama-tiny", si == 3 ? FC_STRATEGY_FULL_SHARD : strategies[si]);
            if (fc_model_config_set_lora(&l.model, "4:8:q_proj|v_proj", &e)) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
            l.optim.weight_decay = 0.1;
            l.fsdp_version = si == 3 ? 2 : 1;
            snprintf(label, sizeof label, "llama-tiny LoRA r=4 q_proj|v_proj FSDP%d %s", l.fsdp_version,
                     fc_strategy_name(l.strategy));
            run_case(label, l, 1, 0);
        }
    }
    // FSDP2 (fully_shard): per-parameter dim-0 rows, copy-in/copy-out, the
    // root kept after forward, implicit backward prefetch, and an integer
    // reshard_after_forward gathering over its PF ranks in backward
    for (int mi = 0; mi < 3; mi++) {
        const char *model = mi == 2 ? "llama-tiny" : models[mi];
        static const fc_strategy v2s[] = {FC_STRATEGY_FULL_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_HYBRID_SHARD,
                                          FC_STRATEGY_HYBRID_SHARD_ZERO2};
        for (size_t si = 0; si < sizeof v2s / sizeof v2s[0]; si++) {
            fc_run_config c = base(model, v2s[si]);
            c.fsdp_version = 2;
            c.forward_prefetch = si == 0;
            snprintf(label, sizeof label, "%s FSDP2 %s", model, fc_strategy_name(c.strategy));
            run_case(label, c, 1, 0);
        }
        {  // explicit prefetch lists of two units in both passes, and
           // set_gradient_divide_factor (2W: avg, and fp16's pre/post from it)
            fc_run_config c = base(model, FC_STRATEGY_FULL_SHARD);
            c.fsdp_version = 2;
            c.forward_prefetch = c.backward_prefetch_depth = 2;
            c.gradient_divide_factor = 2.0 * W;
            snprintf(label, sizeof label, "%s FSDP2 prefetch lists of 2, gradient divide factor %d", model, 2 * W);
            run_case(label, c, 1, 0);
            c.param_dtype = c.reduce_dtype = FC_PREC_FP16;
            c.divide = fc_default_divide(&c);
            c.steps = 1;
            snprintf(label, sizeof label, "%s FSDP2 fp16 gradient divide factor %d", model, 2 * W);
            run_case(label, c, mi != 1, 1e-2);
            fc_run_config l = base(model, FC_STRATEGY_LOCAL);  // local: the mean over F
            l.gradient_divide_factor = 1.5;
            snprintf(label, sizeof label, "%s local gradient divide factor 1.5", model);
            run_case(label, l, 1, 0);
        }
        for (int pf = 2; pf <= W && W % pf == 0 && pf < W; pf++) {
            fc_run_config c = base(model, FC_STRATEGY_FULL_SHARD);
            c.fsdp_version = 2;
            c.reshard_after_forward = pf;
            snprintf(label, sizeof label, "%s FSDP2 reshard_after_forward=%d", model, pf);
            run_case(label, c, 1, 0);
        }
        fc_run_config c = base(model, FC_STRATEGY_FULL_SHARD);
        c.fsdp_version = 2;
        c.cpu_offload = 1;
        c.grad_accum = 2;
        c.global_batch = 4 * W;
        c.clip_grad_norm = 0.05f;
        snprintf(label, sizeof label, "%s FSDP2 cpu_offload accumulation clip", model);
        run_case(label, c, 1, 0);
        c = base(model, FC_STRATEGY_FULL_SHARD);
        c.fsdp_version = 2;
        c.param_dtype = c.reduce_dtype = FC_PREC_BF16;
        c.steps = 1;
        snprintf(label, sizeof label, "%s FSDP2 bf16", model);
        // bitwise but for gpt2, whose tied root gradient the engine rounds
        // between its two stages (the 1% row above); llama-tiny is untied
        run_case(label, c, mi != 1, 1e-2);
    }
    // mixed precision: mlp bitwise, gpt2 within 1% of each tensor's scale
    const fc_prec pol[][2] = {{FC_PREC_BF16, FC_PREC_FP32}, {FC_PREC_BF16, FC_PREC_BF16}, {FC_PREC_FP16, FC_PREC_FP16},
                              {FC_PREC_FP16, FC_PREC_FP32}};
    for (int mi = 0; mi < 2; mi++)
        for (size_t k = 0; k < sizeof pol / sizeof pol[0]; k++)
            for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++) {
                fc_run_config c = base(models[mi], strategies[si]);
                c.param_dtype = pol[k][0];
                c.reduce_dtype = pol[k][1];
                if (strategies[si] != FC_STRATEGY_NO_SHARD) c.backward_prefetch = FC_PREFETCH_POST;
                if (mi == 1) c.steps = 1;
                snprintf(label, sizeof label, "%s %s param %s reduce %s", models[mi], fc_strategy_name(c.strategy),
                         fc_prec_name(c.param_dtype), fc_prec_name(c.reduce_dtype));
                run_case(label, c, mi == 0, 1e-2);
            }
    // checkpoints across implementations and strategies
    for (int kind = 0; kind < 2; kind++) {
        fc_state_dict sd = kind ? FC_STATE_DICT_SHARDED : FC_STATE_DICT_FULL;
        fc_run_config s = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD), l = base("gpt2-tiny", FC_STRATEGY_SHARD_GRAD_OP);
        l.steps = s.steps = 3;
        snprintf(label, sizeof label, "checkpoint %s: engine full_shard saves, reference shard_grad_op loads",
                 fc_state_dict_name(sd));
        ckpt_case(label, s, 1, l, sd, 1);
        fc_run_config h = base("mlp-tiny", FC_STRATEGY_HYBRID_SHARD), n = base("mlp-tiny", FC_STRATEGY_NO_SHARD);
        h.cpu_offload = 1;
        snprintf(label, sizeof label, "checkpoint %s: reference no_shard saves, engine hybrid_shard (offload) loads",
                 fc_state_dict_name(sd));
        ckpt_case(label, n, 0, h, sd, W / h.shard_group == 1);
        fc_run_config z = base("gpt2-tiny", FC_STRATEGY_HYBRID_SHARD_ZERO2), f = base("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
        snprintf(label, sizeof label, "checkpoint %s: engine hybrid_zero2 saves, reference hybrid_shard loads",
                 fc_state_dict_name(sd));
        f.strategy = FC_STRATEGY_HYBRID_SHARD;
        f.shard_group = z.shard_group;
        ckpt_case(label, z, 1, f, sd, 1);
        // a frozen model: the engine's compact optimizer state in and out
        fc_run_config a = base("llama-tiny", FC_STRATEGY_FULL_SHARD), b = base("llama-tiny", FC_STRATEGY_NO_SHARD);
        snprintf(a.freeze, sizeof a.freeze, "^model\\.embed_tokens|^model\\.layers\\.0\\.self_attn|^model\\.layers\\.1\\.");
        snprintf(b.freeze, sizeof b.freeze, "%s", a.freeze);
        a.steps = b.steps = 3;
        snprintf(label, sizeof label, "checkpoint %s --freeze: engine full_shard saves, reference no_shard loads",
                 fc_state_dict_name(sd));
        ckpt_case(label, a, 1, b, sd, 1);
        b.cpu_offload = 1;
        b.strategy = FC_STRATEGY_SHARD_GRAD_OP;
        snprintf(label, sizeof label, "checkpoint %s --freeze: reference full_shard saves, engine shard_grad_op "
                 "(offload) loads", fc_state_dict_name(sd));
        ckpt_case(label, a, 0, b, sd, 1);
        // FSDP2's rows in and out (its sharded checkpoint: DCP's per-rank files)
        fc_state_dict sd2 = kind ? FC_STATE_DICT_DCP : FC_STATE_DICT_FULL;
        fc_run_config v = base("llama-tiny", FC_STRATEGY_FULL_SHARD), r1 = base("llama-tiny", FC_STRATEGY_FULL_SHARD);
        v.fsdp_version = 2;
        v.steps = r1.steps = 3;
        snprintf(label, sizeof label, "checkpoint %s: engine FSDP2 saves, reference FSDP1 loads", fc_state_dict_name(sd2));
        ckpt_case(label, v, 1, r1, sd2, 1);
        // the compact FSDP2 gradient and state of a frozen model, in and out
        fc_run_config vf = v, rf = r1;
        snprintf(vf.freeze, sizeof vf.freeze, "^model\\.embed_tokens|^model\\.layers\\.0\\.self_attn");
        snprintf(rf.freeze, sizeof rf.freeze, "%s", vf.freeze);
        snprintf(label, sizeof label, "checkpoint %s --freeze: engine FSDP2 saves, reference FSDP1 loads",
                 fc_state_dict_name(sd2));
        ckpt_case(label, vf, 1, rf, sd2, 1);
        rf.fsdp_version = 2;
        snprintf(label, sizeof label, "checkpoint %s --freeze: reference FSDP2 saves, engine FSDP2 loads",
                 fc_state_dict_name(sd2));
        ckpt_case(label, rf, 0, vf, sd2, 1);
        r1.fsdp_version = 2;
        r1.strategy = FC_STRATEGY_SHARD_GRAD_OP;
        snprintf(label, sizeof label, "checkpoint %s: reference FSDP2 shard_grad_op saves, engine FSDP2 loads",
                 fc_state_dict_name(sd2));
        ckpt_case(label, r1, 0, v, sd2, 1);
    }
    int total = 0;
    mpiCheck(MPI_Reduce(&errs, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD));
    if (rank == 0) {
        if (total)
            printf(" Found %d errors\n", total);
        else
            printf(" No Errors\n");
        fflush(stdout);
    }
    MPI_Finalize();
    return total ? 1 : 0;
}
