// tests/mpi/test_checkpoint.c — P7 (docs/contract.md §8): train k, save (FULL or
// SHARDED), load in a fresh instance at the same or another W and strategy,
// train n more  ==  train k+n uninterrupted. The implementation under test
// (--impl, default the reference) saves, loads and trains through the runner
// (fc_runner_save, fc_runner_resume, fc_runner_run); the resumed steps 0..n-1
// are judged against the uninterrupted run's steps k..k+n-1 by the one
// comparison engine (fc_props_compare: loss, norm, gradients, parameters and
// optimizer state of every step).
//
// The matrix, at the communicator's W, for mlp-tiny and gpt2-tiny with AdamW
// (SGD with momentum: the rows marked *), FULL and SHARDED state dicts (k = n = 2):
//   saved from full_shard at W, loaded into
//   * full_shard at W                              bitwise (the same run)
//   * no_shard (and shard_grad_op) at W            bitwise (same reduction tree, P2)
//     full_shard at every W' < W dividing B        tolerance (sub-communicators; * W' = 1)
//   * local (one process)                          tolerance
//     hybrid_shard(F = W/2) at W                   tolerance
//   saved from no_shard, hybrid_shard (replica 0 writes) and local, loaded
//   into full_shard at W                           bitwise / tolerance / tolerance
//   (each judged against its saver's uninterrupted run: the resumed run starts
//   from the saver's parameters, and the engine checks that first)
// FSDP2's sharded checkpoint is DCP's (check_dcp): saved from FSDP2
// full_shard at W, loaded into FSDP2 at W (bitwise), FSDP1 full_shard and
// no_shard at W (bitwise: FSDP2 trains as FSDP1 and DDP do), FSDP2 at every
// W' < W and local (tolerance); saved from FSDP2 hybrid_shard (replica 0
// writes W/2 files); and the dcp_saved_offsets fault's checkpoint refused.
// "Bitwise" is the reference's claim; another implementation is judged by the
// default policy. Every loaded run must report steps_done() == k right after
// the load (the runner's first_step).
//
// The test must be able to fail: the checkpoint faults of docs/contract.md §9
// (ckpt_drop_optim, ckpt_swap, adam_step_reset: the reference's fault build,
// injected into the loader) must each make P7 fail under the default policy,
// and so must a load of a checkpoint whose optimizer state was zeroed (with a
// valid manifest, so it verifies). A directory that held a SHARDED checkpoint
// and is saved FULL keeps no stale shard file.
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "mpicheck.h"
#include "mpitest.h"

#define K_STEPS 2
#define N_STEPS 2

static int W, rank;
static char g_dir[512];  // a fresh temporary directory, the same path on every rank

// The first w ranks of the world (MPI_COMM_NULL on the others, which then
// wait in sub_done without spinning).
static MPI_Comm sub_of(int w) {
    MPI_Comm sub;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, rank < w ? 0 : MPI_UNDEFINED, rank, &sub));
    return sub;
}

static void sub_done(MPI_Comm *sub) {
    if (*sub != MPI_COMM_NULL) mpiCheck(MPI_Comm_free(sub));
    fc_mpi_barrier(MPI_COMM_WORLD);
}

// Trains `steps` steps of ops with cfg on the first w ranks and saves into
// dir. Counts an error if the save fails.
static void save_on(const fc_impl_ops *ops, int w, const fc_run_config *cfg, int steps, const char *dir,
                    fc_state_dict kind) {
    MPI_Comm sub = sub_of(w);
    if (sub != MPI_COMM_NULL) {
        fc_error e = {{0}};
        int rc = fc_runner_save(ops, cfg, sub, steps, dir, kind, &e);
        MT_CHECK(rc == 0, "save (%s at W=%d, %s, impl %s) into %s failed: %s", fc_strategy_name(cfg->strategy), w,
                 fc_state_dict_name(kind), ops->name, dir, e.msg);
    }
    sub_done(&sub);
}

// Loads dir into a fresh instance of ops with cfg on the first w ranks and
// trains cfg->steps steps. Full tensors on rank 0.
static void resume_on(const fc_impl_ops *ops, int w, const fc_run_config *cfg, const char *dir, mt_result *r) {
    memset(r, 0, sizeof *r);
    MPI_Comm sub = sub_of(w);
    if (sub != MPI_COMM_NULL) fc_runner_resume(ops, cfg, sub, dir, r);
    sub_done(&sub);
}

// The resumed run `got` (config lc at w ranks) against the uninterrupted run
// `want` (config c at W): steps_done() == k after the load, and the n steps
// through the engine. Rank 0 only.
static void judge_resumed(const char *what, const fc_run_config *lc, int w, const mt_result *got,
                          const fc_run_config *c, const mt_result *want, int bitwise, int same_compute) {
    if (rank != 0) return;
    MT_CHECK(got->ok, "P7 %s [%s %s]: the resumed run failed: %s", what, c->model.name, fc_opt_name(c->optim.kind),
             got->error);
    if (!got->ok) return;
    MT_CHECK(got->first_step == K_STEPS, "P7 %s [%s]: steps_done() after the load is %ld, not %d", what,
             c->model.name, got->first_step, K_STEPS);
    char against[256];
    snprintf(against, sizeof against, "uninterrupted (%s, %s)", what, fc_opt_name(c->optim.kind));
    mt_judge(&(mt_judgement){.p = FC_P7_CHECKPOINT, .what = against, .tested = {lc, w, got, 0},
                             .expected = {c, 0, want, K_STEPS}, .n = N_STEPS, .bitwise = bitwise,
                             .same_compute = same_compute});
}

// A broken load must be caught: P7 fails under the default policy (not only
// bitwise), or the resumed run reports the wrong step (adam_step_reset under
// SGD, whose update does not read the step count). Rank 0 only.
static void expect_caught(const char *what, const fc_run_config *lc, const mt_result *got, const fc_run_config *c,
                          const mt_result *want) {
    if (rank != 0) return;
    MT_CHECK(got->ok, "%s: the resumed run failed: %s", what, got->error);
    if (!got->ok) return;
    char detail[800] = "";
    mt_judgement j = {.p = FC_P7_CHECKPOINT, .what = what, .tested = {lc, W, got, 0},
                      .expected = {c, 0, want, K_STEPS}, .n = N_STEPS, .bitwise = MT_POLICY};
    int agrees = mt_agrees(&j, detail, sizeof detail);
    MT_CHECK(!agrees || got->first_step != K_STEPS,
             "P7 cannot fail: %s [%s %s] passed against the uninterrupted run (steps_done() %ld)", what, c->model.name,
             fc_opt_name(c->optim.kind), got->first_step);
    if (!agrees) printf("caught: %.400s\n", detail);
    else printf("caught: %s: steps_done() after the load is %ld, not %d\n", what, got->first_step, K_STEPS);
    fflush(stdout);
}

static const char *sub_dir(const char *fmt, const char *a) {
    static char bufs[4][700];
    static int next;
    char *b = bufs[next++ % 4];
    char name[128];
    snprintf(name, sizeof name, fmt, a);
    snprintf(b, 700, "%s/%s", g_dir, name);
    return b;
}

// Files in dir whose names start with prefix (rank 0).
static int count_files(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)))
        if (!strncmp(ent->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

// The global batch: divisible by every W' we load at.
static int batch_for(int w) { return w <= 4 ? 12 : 4 * w; }

static fc_run_config with_steps(fc_run_config c, int steps) {
    c.steps = steps;
    return c;
}

// The checkpoint faults of the loader, each caught by P7. dir_of(kind) holds
// a checkpoint of the reference at step k; want_ref is the reference's
// uninterrupted run of c.
static void check_faults(const fc_run_config *c, const char *dirs[2], const mt_result *want_ref) {
    const fc_fault faults[] = {FC_FAULT_CKPT_DROP_OPTIM, FC_FAULT_CKPT_SWAP, FC_FAULT_ADAM_STEP_RESET};
    for (int i = 0; i < 3; i++) {
        for (int kind = 0; kind < 2; kind++) {
            fc_run_config d = with_steps(*c, N_STEPS);
            d.inject = faults[i];  // fc_impl_for: the reference's fault-catalogue build
            mt_result got;
            resume_on(fc_reference_impl(), W, &d, dirs[kind], &got);
            char what[128];
            snprintf(what, sizeof what, "fault %s (%s, full_shard W=%d)", fc_fault_name(faults[i]),
                     fc_state_dict_name((fc_state_dict)kind), W);
            expect_caught(what, &d, &got, c, want_ref);
            mt_result_free(&got);
        }
    }
}

// The uninterrupted run of cfg on the first w ranks (full tensors on rank 0):
// what a checkpoint saved by cfg at step k continues. A resumed run starts
// from the saver's parameters, so it is judged against the saver's run, never
// against another strategy's, whose parameters legitimately drifted apart.
static void run_on(int w, const fc_run_config *cfg, mt_result *r) {
    memset(r, 0, sizeof *r);
    MPI_Comm sub = sub_of(w);
    if (sub != MPI_COMM_NULL) mt_run(cfg, sub, r);
    sub_done(&sub);
}

// full: the whole matrix; otherwise (SGD, to keep the test short on small
// machines) the same-W strategies, W' = 1, local and the faults.
static void check_matrix(const char *model, fc_opt_kind opt, int full) {
    const fc_impl_ops *ops = mt_impl();
    int B = batch_for(W);
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, K_STEPS + N_STEPS);
    c.global_batch = B;
    c.optim.kind = opt;
    if (opt == FC_OPT_SGD) c.optim.lr = 0.05;  // momentum 0.9: a momentum_buffer to restore
    const char *tag = fc_opt_name(opt);
    if (!full)
        mt_skip("P7 [%s %s]: the short matrix (loads at W, at W'=1, into local; the faults): loads at other W' > 1, "
                "into hybrid_shard and saves from other strategies are checked with adamw",
                model, tag);
    mt_result want;
    mt_run(&c, MPI_COMM_WORLD, &want);
    const fc_run_config n = with_steps(c, N_STEPS);
    const char *dirs[2];
    char dirbuf[2][700];
    for (int kind = 0; kind < 2; kind++) {
        const char *kname = fc_state_dict_name((fc_state_dict)kind);
        snprintf(dirbuf[kind], sizeof dirbuf[kind], "%s", sub_dir("%s", kname));
        const char *dir = dirs[kind] = dirbuf[kind];
        save_on(ops, W, &c, K_STEPS, dir, (fc_state_dict)kind);
        if (rank == 0 && kind == FC_STATE_DICT_SHARDED)
            MT_CHECK(count_files(dir, "shard-") == W, "full_shard at W=%d wrote %d shard files", W,
                     count_files(dir, "shard-"));
        char what[256];
        mt_result got;
        // the same W and strategy: the same run
        resume_on(ops, W, &n, dir, &got);
        snprintf(what, sizeof what, "%s full_shard W=%d -> full_shard W=%d", kname, W, W);
        judge_resumed(what, &n, W, &got, &c, &want, MT_BITWISE_REF, 1);
        mt_result_free(&got);
        // another strategy with the same reduction tree
        const fc_strategy same_tree[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP};
        for (int i = 0; i < (full ? 2 : 1); i++) {
            fc_run_config d = n;
            d.strategy = same_tree[i];
            resume_on(ops, W, &d, dir, &got);
            snprintf(what, sizeof what, "%s full_shard W=%d -> %s W=%d", kname, W, fc_strategy_name(d.strategy), W);
            judge_resumed(what, &d, W, &got, &c, &want, MT_BITWISE_REF, 1);
            mt_result_free(&got);
        }
        // another world size
        if (W == 1) mt_skip("P7 %s [%s %s]: no world size below W=1 to load at", kname, model, tag);
        for (int w = 1; w < W; w++) {
            if (B % w) {
                mt_skip("P7 %s [%s %s]: load at W'=%d: the global batch %d does not split over %d ranks", kname, model,
                        tag, w, B, w);
                continue;
            }
            if (!full && w > 1) continue;  // the short matrix loads at W' = 1 only (its SKIP line above)
            resume_on(ops, w, &n, dir, &got);
            snprintf(what, sizeof what, "%s full_shard W=%d -> full_shard W'=%d", kname, W, w);
            judge_resumed(what, &n, w, &got, &c, &want, MT_POLICY, 0);
            mt_result_free(&got);
        }
        // the one-process trainer
        fc_run_config l = n;
        l.strategy = FC_STRATEGY_LOCAL;
        resume_on(ops, 1, &l, dir, &got);
        snprintf(what, sizeof what, "%s full_shard W=%d -> local", kname, W);
        judge_resumed(what, &l, 1, &got, &c, &want, MT_POLICY, 0);
        mt_result_free(&got);
        // hybrid sharding
        if (full && W >= 2 && W % 2 == 0) {
            fc_run_config h = n;
            h.strategy = FC_STRATEGY_HYBRID_SHARD;
            h.shard_group = W / 2;
            resume_on(ops, W, &h, dir, &got);
            snprintf(what, sizeof what, "%s full_shard W=%d -> hybrid_shard(F=%d) W=%d", kname, W, W / 2, W);
            judge_resumed(what, &h, W, &got, &c, &want, MT_POLICY, 1);
            mt_result_free(&got);
        } else if (full) {
            mt_skip("P7 %s [%s %s]: load into hybrid_shard needs an even W, not %d", kname, model, tag, W);
        }
    }
    // saved from other strategies, loaded into full_shard at W
    if (full) {
        const char *dir = sub_dir("from-%s", tag);
        char what[256];
        mt_result got;
        fc_run_config d = c;
        d.strategy = FC_STRATEGY_NO_SHARD;  // every rank writes its W-way chunk of its full copy
        save_on(ops, W, &d, K_STEPS, dir, FC_STATE_DICT_SHARDED);
        if (rank == 0)
            MT_CHECK(count_files(dir, "shard-") == W, "no_shard at W=%d wrote %d shard files", W,
                     count_files(dir, "shard-"));
        resume_on(ops, W, &n, dir, &got);
        snprintf(what, sizeof what, "sharded no_shard W=%d -> full_shard W=%d", W, W);
        if (mt_tested_is_ref() || fc_impl_claims_same_bits(mt_impl())) {
            judge_resumed(what, &n, W, &got, &c, &want, MT_BITWISE_REF, 1);
        } else {  // its no_shard's arithmetic is not its full_shard's: the saver's own run is uninterrupted
            mt_result saver;
            run_on(W, &d, &saver);
            judge_resumed(what, &n, W, &got, &d, &saver, MT_POLICY, 0);
            mt_result_free(&saver);
        }
        mt_result_free(&got);
        if (W >= 2 && W % 2 == 0) {  // replica 0's shard ranks write
            d.strategy = FC_STRATEGY_HYBRID_SHARD;
            d.shard_group = W / 2;
            save_on(ops, W, &d, K_STEPS, dir, FC_STATE_DICT_SHARDED);
            if (rank == 0)
                MT_CHECK(count_files(dir, "shard-") == W / 2, "hybrid_shard(F=%d) wrote %d shard files (stale ones?)",
                         W / 2, count_files(dir, "shard-"));
            resume_on(ops, W, &n, dir, &got);
            mt_result saver;
            run_on(W, &d, &saver);
            snprintf(what, sizeof what, "sharded hybrid_shard(F=%d) W=%d -> full_shard W=%d", W / 2, W, W);
            judge_resumed(what, &n, W, &got, &d, &saver, MT_POLICY, 0);
            mt_result_free(&got);
            mt_result_free(&saver);
        } else {
            mt_skip("P7 [%s %s]: a save from hybrid_shard needs an even W, not %d", model, tag, W);
        }
        fc_run_config l = c;
        l.strategy = FC_STRATEGY_LOCAL;
        mt_result saver;
        run_on(1, &l, &saver);
        for (int kind = 0; kind < 2; kind++) {
            save_on(ops, 1, &l, K_STEPS, dir, (fc_state_dict)kind);
            if (rank == 0 && kind == FC_STATE_DICT_FULL)  // the old shard files are gone
                MT_CHECK(count_files(dir, "shard-") == 0, "a FULL save left %d stale shard files",
                         count_files(dir, "shard-"));
            resume_on(ops, W, &n, dir, &got);
            snprintf(what, sizeof what, "%s local -> full_shard W=%d", fc_state_dict_name((fc_state_dict)kind), W);
            judge_resumed(what, &n, W, &got, &l, &saver, MT_POLICY, 0);
            mt_result_free(&got);
        }
        mt_result_free(&saver);
    }
    // the test can fail: each checkpoint fault of the loader is caught, on
    // checkpoints and a baseline of the reference (the faults are its builds)
    if (mt_tested_is_ref()) {
        check_faults(&c, dirs, &want);
    } else {
        const char *rdirs[2];
        char rbuf[2][700];
        for (int kind = 0; kind < 2; kind++) {
            snprintf(rbuf[kind], sizeof rbuf[kind], "%s", sub_dir("ref-%s", fc_state_dict_name((fc_state_dict)kind)));
            rdirs[kind] = rbuf[kind];
            save_on(fc_reference_impl(), W, &c, K_STEPS, rdirs[kind], (fc_state_dict)kind);
        }
        mt_result want_ref;
        mt_run_ref(&c, MPI_COMM_WORLD, &want_ref);
        check_faults(&c, rdirs, &want_ref);
        mt_result_free(&want_ref);
    }
    mt_result_free(&want);
}

// FSDP2's SHARDED_STATE_DICT: DCP's files, one per writing rank, loaded at
// any W, strategy and FSDP version; a checkpoint whose saved_offsets are a
// row off (the reference's dcp_saved_offsets fault) must be refused.
static void check_dcp(const char *model, fc_opt_kind opt, int full) {
    const fc_impl_ops *ops = mt_impl();
    if (!(ops->fsdp_versions & FC_IMPL_FSDP(2))) {
        mt_skip("P7 dcp [%s]: --impl %s does not implement FSDP2", model, ops->name);
        return;
    }
    int B = batch_for(W);
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, K_STEPS + N_STEPS);
    c.fsdp_version = 2;
    c.global_batch = B;
    c.optim.kind = opt;
    if (opt == FC_OPT_SGD) c.optim.lr = 0.05;
    const char *tag = fc_opt_name(opt);
    mt_result want, got;
    mt_run(&c, MPI_COMM_WORLD, &want);
    const char *dir = sub_dir("dcp-%s", tag);
    char what[256];
    save_on(ops, W, &c, K_STEPS, dir, FC_STATE_DICT_DCP);
    if (rank == 0)
        MT_CHECK(count_files(dir, "shard-") == W, "FSDP2 full_shard at W=%d wrote %d DCP files", W,
                 count_files(dir, "shard-"));
    struct {
        fc_strategy s;
        int version;
    } same[] = {{FC_STRATEGY_FULL_SHARD, 2}, {FC_STRATEGY_FULL_SHARD, 1}, {FC_STRATEGY_NO_SHARD, 1}};
    for (int i = 0; i < (full ? 3 : 1); i++) {
        fc_run_config d = with_steps(c, N_STEPS);
        d.strategy = same[i].s;
        d.fsdp_version = same[i].version;
        resume_on(ops, W, &d, dir, &got);
        snprintf(what, sizeof what, "dcp FSDP2 full_shard W=%d -> FSDP%d %s W=%d", W, d.fsdp_version,
                 fc_strategy_name(d.strategy), W);
        judge_resumed(what, &d, W, &got, &c, &want, MT_BITWISE_REF, 1);
        mt_result_free(&got);
    }
    for (int w = 1; w < W; w++) {
        if (B % w || (!full && w > 1)) continue;
        fc_run_config d = with_steps(c, N_STEPS);
        if (w == 1) d.strategy = FC_STRATEGY_LOCAL, d.fsdp_version = 1;
        resume_on(ops, w, &d, dir, &got);
        snprintf(what, sizeof what, "dcp FSDP2 full_shard W=%d -> %s W'=%d", W, fc_strategy_name(d.strategy), w);
        judge_resumed(what, &d, w, &got, &c, &want, MT_POLICY, 0);
        mt_result_free(&got);
    }
    if (full && W >= 2 && W % 2 == 0) {  // replica 0's shard ranks write
        fc_run_config h = c;
        h.strategy = FC_STRATEGY_HYBRID_SHARD;
        h.shard_group = W / 2;
        const char *hdir = sub_dir("dcp-hsdp-%s", tag);
        save_on(ops, W, &h, K_STEPS, hdir, FC_STATE_DICT_DCP);
        if (rank == 0)
            MT_CHECK(count_files(hdir, "shard-") == W / 2, "FSDP2 hybrid_shard(F=%d) wrote %d DCP files", W / 2,
                     count_files(hdir, "shard-"));
        mt_result saver;
        run_on(W, &h, &saver);
        fc_run_config d = with_steps(c, N_STEPS);
        resume_on(ops, W, &d, hdir, &got);
        snprintf(what, sizeof what, "dcp FSDP2 hybrid_shard(F=%d) W=%d -> FSDP2 full_shard W=%d", W / 2, W, W);
        judge_resumed(what, &d, W, &got, &h, &saver, MT_POLICY, 0);
        mt_result_free(&got);
        mt_result_free(&saver);
    }
    // the test can fail: saved_offsets a row off overlap the previous rank's rows
    if (W > 1) {
        fc_run_config f = c;
        f.inject = FC_FAULT_DCP_SAVED_OFFSETS;  // the reference's fault-catalogue build saves
        const char *fdir = sub_dir("dcp-offsets-%s", tag);
        save_on(fc_reference_impl(), W, &f, K_STEPS, fdir, FC_STATE_DICT_DCP);
        fc_run_config d = with_steps(c, N_STEPS);
        resume_on(ops, W, &d, fdir, &got);
        if (rank == 0) {
            MT_CHECK(!got.ok && strstr(got.error, "two shard files"),
                     "P7 cannot fail: a DCP checkpoint with saved_offsets a row off %s", got.ok ? "loaded" : got.error);
            if (!got.ok) printf("caught: dcp_saved_offsets [%s %s]: %.300s\n", model, tag, got.error);
        }
        mt_result_free(&got);
    }
    mt_result_free(&want);
}

// A checkpoint whose optimizer state is all zeros (rewritten with a valid
// manifest, so it verifies) must not resume the run: the comparison sees
// whether the state was restored at all.
static void check_state_matters(void) {
    fc_run_config c = mt_config("gpt2-tiny", FC_STRATEGY_FULL_SHARD, W, K_STEPS + N_STEPS);
    c.global_batch = batch_for(W);
    mt_result want;
    mt_run(&c, MPI_COMM_WORLD, &want);
    const char *dir = sub_dir("%s", "zeroed");
    save_on(mt_impl(), W, &c, K_STEPS, dir, FC_STATE_DICT_FULL);
    fc_run_config n = with_steps(c, N_STEPS);
    for (int zeroed = 0; zeroed < 2; zeroed++) {
        // rank 0 rewrites it from the uninterrupted run's tensors after k steps:
        // first with the real moments (the rewrite itself resumes the run), then zeros
        if (rank == 0 && want.ok) {
            fc_model m;
            fc_model_build(&m, &c.model);
            float *zero = callocCheck(m.numel, sizeof(float));
            const fc_run_step *k = &want.step[K_STEPS - 1];
            const float *const real[2] = {k->state[0], k->state[1]}, *const zeros[2] = {zero, zero};
            fc_ckpt_info info = {&c, &m, K_STEPS, W, c.strategy};
            fc_error e;
            MT_CHECK(fc_ckpt_save_full(dir, &info, k->params, zeroed ? zeros : real, &e) == 0, "rewrite failed: %s",
                     e.msg);
            free(zero);
            fc_model_free(&m);
        }
        fc_mpi_barrier(MPI_COMM_WORLD);
        mt_result got;
        resume_on(mt_impl(), W, &n, dir, &got);
        if (zeroed) expect_caught("zeroed optimizer state in the checkpoint", &n, &got, &c, &want);
        else judge_resumed("a FULL checkpoint rewritten from the uninterrupted run's tensors", &n, W, &got, &c, &want,
                           MT_BITWISE_REF, 1);
        mt_result_free(&got);
    }
    mt_result_free(&want);
}

static void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *ent;
            while ((ent = readdir(d))) {
                if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
                char p[1024];
                snprintf(p, sizeof p, "%s/%s", path, ent->d_name);
                remove_tree(p);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &W));
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (!mt_impl()->save || !mt_impl()->load) {
        mt_skip("P7: --impl %s cannot save or load checkpoints (save/load not in its operations table)",
                mt_impl_name());
        MT_CHECK(0, "P7 was not checked: --impl %s has no checkpoint support", mt_impl_name());
        return mt_finalize();
    }
    if (rank == 0) {
        const char *base = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/fc_test_checkpoint_XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_dir)) fc_die(FC_EXIT_INTERNAL, "mkdtemp %s failed", g_dir);
    }
    mpiCheck(MPI_Bcast(g_dir, (int)sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD));
    const char *models[] = {"mlp-tiny", "gpt2-tiny"};
    for (int i = 0; i < 2; i++) {
        check_matrix(models[i], FC_OPT_ADAMW, 1);
        check_matrix(models[i], FC_OPT_SGD, 0);
        check_dcp(models[i], FC_OPT_ADAMW, 1);
        check_dcp(models[i], FC_OPT_SGD, 0);
    }
    check_state_matters();
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0) remove_tree(g_dir);
    return mt_finalize();
}
