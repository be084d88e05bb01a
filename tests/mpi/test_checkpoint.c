// tests/mpi/test_checkpoint.c — P7 (DESIGN §8): train k, save (FULL or
// SHARDED), load in a fresh implementation at the same or another W and
// strategy, train n more  ==  train k+n uninterrupted.
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
// Every loaded run must report steps_done() == k right after the load, and
// its losses, gradients, parameters and optimizer state after the n steps
// must match the uninterrupted run's.
//
// The test must be able to fail: the checkpoint faults of DESIGN §9
// (ckpt_drop_optim, ckpt_swap, adam_step_reset, injected into the loader)
// must each make the comparison differ, and a load of a checkpoint whose
// optimizer state was zeroed must too. A directory that held a SHARDED
// checkpoint and is saved FULL keeps no stale shard file.
//
// Tolerance: PyTorch's assert_close fp32 defaults (rtol 1.3e-6, atol 1e-5),
// as in test_equivalence.c, where a different W or hybrid changes the
// reduction order.
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "mpicheck.h"
#include "mpitest.h"
#include "optim.h"

#define RTOL 1.3e-6
#define ATOL 1e-5
#define K_STEPS 2
#define N_STEPS 2

static int W, rank;
static char g_dir[512];  // a fresh temporary directory, the same path on every rank

// What one run left behind, full tensors on rank 0 of its communicator.
typedef struct {
    int ok;
    long steps_at_load;          // steps_done() right after the load (-1: no load)
    int steps, n_state;
    float loss[8];
    float *params, *grads, *state[2];
} run_out;

static void out_free(run_out *o) {
    free(o->params);
    free(o->grads);
    free(o->state[0]);
    free(o->state[1]);
    memset(o, 0, sizeof *o);
}

// Creates cfg on comm; loads load_dir if given; trains `steps`; saves into
// save_dir if given; exports everything to rank 0 of comm.
static void train(const fc_run_config *cfg, MPI_Comm comm, int steps, const char *load_dir, const char *save_dir,
                  fc_state_dict kind, run_out *o) {
    memset(o, 0, sizeof *o);
    o->steps_at_load = -1;
    fc_error e;
    const fc_impl_ops *ops = fc_impl_for(fc_reference_impl(), cfg, &e);
    fc_impl *im = ops ? ops->create(cfg, comm, &e) : NULL;
    if (!im) {
        MT_CHECK(0, "create (%s) failed: %s", fc_strategy_name(cfg->strategy), e.msg);
        return;
    }
    int r;
    mpiCheck(MPI_Comm_rank(comm, &r));
    o->ok = 1;
    if (load_dir) {
        if (ops->load(im, load_dir, &e)) {
            MT_CHECK(0, "load %s into %s failed: %s", load_dir, fc_strategy_name(cfg->strategy), e.msg);
            o->ok = 0;
        }
        o->steps_at_load = ops->steps_done(im);
    }
    for (int t = 0; o->ok && t < steps; t++) {
        fc_step_info info;
        if (ops->step(im, &info, &e)) {
            MT_CHECK(0, "step failed: %s", e.msg);
            o->ok = 0;
        }
        o->loss[t] = info.loss;
    }
    o->steps = steps;
    if (o->ok && save_dir && ops->save(im, save_dir, kind, &e)) {
        MT_CHECK(0, "save (%s, %s) into %s failed: %s", fc_strategy_name(cfg->strategy), fc_state_dict_name(kind),
                 save_dir, e.msg);
        o->ok = 0;
    }
    fc_model m;
    fc_model_build(&m, &cfg->model);
    const char *names[2];
    o->n_state = fc_optim_state_names(&cfg->optim, names);
    if (r == 0) {
        o->params = callocCheck(m.numel, sizeof(float));
        o->grads = callocCheck(m.numel, sizeof(float));
        for (int s = 0; s < o->n_state; s++) o->state[s] = callocCheck(m.numel, sizeof(float));
    }
    if (ops->export_full(im, FC_EXPORT_PARAMS, o->params, 0, &e) ||
        ops->export_full(im, FC_EXPORT_GRADS, o->grads, 0, &e))
        MT_CHECK(0, "export failed: %s", e.msg);
    for (int s = 0; s < o->n_state; s++)
        if (ops->export_full(im, s ? FC_EXPORT_STATE1 : FC_EXPORT_STATE0, o->state[s], 0, &e))
            MT_CHECK(0, "export failed: %s", e.msg);
    ops->destroy(im);
    fc_model_free(&m);
}

// Runs train() on the first w ranks of the world (the others skip).
static void train_on(int w, const fc_run_config *cfg, int steps, const char *load_dir, const char *save_dir,
                     fc_state_dict kind, run_out *o) {
    memset(o, 0, sizeof *o);
    MPI_Comm sub;
    mpiCheck(MPI_Comm_split(MPI_COMM_WORLD, rank < w ? 0 : MPI_UNDEFINED, rank, &sub));
    if (sub == MPI_COMM_NULL) return;
    train(cfg, sub, steps, load_dir, save_dir, kind, o);
    mpiCheck(MPI_Comm_free(&sub));
}

// The number of elements of a and b (n each) that differ.
static size_t ndiff(const float *a, const float *b, size_t n, int bitwise) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += bitwise ? memcmp(&a[i], &b[i], sizeof(float)) != 0
                       : !(fabs((double)a[i] - b[i]) <= ATOL + RTOL * fabs((double)b[i]));
    return bad;
}

// A resumed run `got` (n steps after loading at step k) against the
// uninterrupted run `want` (k+n steps). Rank 0 only.
static void compare(const char *what, const fc_run_config *cfg, const run_out *got, const run_out *want, int bitwise) {
    if (rank != 0) return;
    MT_CHECK(got->ok, "%s: the resumed run failed", what);
    if (!got->ok) return;
    MT_CHECK(got->steps_at_load == K_STEPS, "%s: steps_done() after the load is %ld, not %d", what,
             got->steps_at_load, K_STEPS);
    fc_model m;
    fc_model_build(&m, &cfg->model);
    char name[512];
    snprintf(name, sizeof name, "P7 %s [%s %s] params", what, cfg->model.name, fc_opt_name(cfg->optim.kind));
    mt_compare(name, &m, got->params, want->params, bitwise, RTOL, ATOL);
    snprintf(name, sizeof name, "P7 %s [%s %s] grads", what, cfg->model.name, fc_opt_name(cfg->optim.kind));
    mt_compare(name, &m, got->grads, want->grads, bitwise, RTOL, ATOL);
    for (int s = 0; s < got->n_state; s++) {
        snprintf(name, sizeof name, "P7 %s [%s %s] optimizer state %d", what, cfg->model.name,
                 fc_opt_name(cfg->optim.kind), s);
        mt_compare(name, &m, got->state[s], want->state[s], bitwise, RTOL, ATOL);
    }
    for (int t = 0; t < N_STEPS; t++) {
        float a = got->loss[t], b = want->loss[K_STEPS + t];
        int same = bitwise ? memcmp(&a, &b, sizeof a) == 0 : fabs((double)a - b) <= ATOL + RTOL * fabs((double)b);
        MT_CHECK(same, "P7 %s [%s] loss at step %d: %.9g vs %.9g", what, cfg->model.name, K_STEPS + t, (double)a,
                 (double)b);
    }
    fc_model_free(&m);
}

// A broken load must be caught: the resumed run differs from the
// uninterrupted one (or reports the wrong step). Rank 0 only.
static void expect_caught(const char *what, const fc_run_config *cfg, const run_out *got, const run_out *want) {
    if (rank != 0) return;
    fc_model m;
    fc_model_build(&m, &cfg->model);
    size_t d = ndiff(got->params, want->params, m.numel, 1);
    for (int s = 0; s < got->n_state; s++) d += ndiff(got->state[s], want->state[s], m.numel, 1);
    MT_CHECK(got->ok && (d > 0 || got->steps_at_load != K_STEPS),
             "P7 cannot fail: %s [%s %s] gave the uninterrupted result bitwise", what, cfg->model.name,
             fc_opt_name(cfg->optim.kind));
    fc_model_free(&m);
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

// Files in dir (rank 0).
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

// full: the whole matrix; otherwise (SGD, to keep the test short on small
// machines) the same-W strategies, W' = 1, local and the faults.
static void check_matrix(const char *model, fc_opt_kind opt, int full) {
    int B = batch_for(W);
    fc_run_config c = mt_config(model, FC_STRATEGY_FULL_SHARD, W, K_STEPS + N_STEPS);
    c.global_batch = B;
    c.optim.kind = opt;
    if (opt == FC_OPT_SGD) c.optim.lr = 0.05;  // momentum 0.9: a momentum_buffer to restore
    run_out want;
    train(&c, MPI_COMM_WORLD, K_STEPS + N_STEPS, NULL, NULL, 0, &want);
    const char *tag = fc_opt_name(opt);
    for (int kind = 0; kind < 2; kind++) {
        const char *kname = fc_state_dict_name((fc_state_dict)kind);
        char dir[700];
        snprintf(dir, sizeof dir, "%s", sub_dir("%s", kname));
        run_out saved, got;
        train(&c, MPI_COMM_WORLD, K_STEPS, NULL, dir, (fc_state_dict)kind, &saved);
        out_free(&saved);
        if (rank == 0 && kind == FC_STATE_DICT_SHARDED)
            MT_CHECK(count_files(dir, "shard-") == W, "full_shard at W=%d wrote %d shard files", W,
                     count_files(dir, "shard-"));
        char what[256];
        // the same W and strategy: the same run
        train(&c, MPI_COMM_WORLD, N_STEPS, dir, NULL, 0, &got);
        snprintf(what, sizeof what, "%s full_shard W=%d -> full_shard W=%d", kname, W, W);
        compare(what, &c, &got, &want, 1);
        out_free(&got);
        // another strategy with the same reduction tree
        const fc_strategy same_tree[] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP};
        for (int i = 0; i < (full ? 2 : 1); i++) {
            fc_run_config d = c;
            d.strategy = same_tree[i];
            train(&d, MPI_COMM_WORLD, N_STEPS, dir, NULL, 0, &got);
            snprintf(what, sizeof what, "%s full_shard W=%d -> %s W=%d", kname, W, fc_strategy_name(d.strategy), W);
            compare(what, &c, &got, &want, 1);
            out_free(&got);
        }
        // another world size
        for (int w = 1; w < W; w++) {
            if (B % w || (!full && w > 1)) continue;
            train_on(w, &c, N_STEPS, dir, NULL, 0, &got);
            snprintf(what, sizeof what, "%s full_shard W=%d -> full_shard W'=%d", kname, W, w);
            compare(what, &c, &got, &want, 0);
            out_free(&got);
        }
        // the one-process trainer
        fc_run_config l = c;
        l.strategy = FC_STRATEGY_LOCAL;
        train_on(1, &l, N_STEPS, dir, NULL, 0, &got);
        snprintf(what, sizeof what, "%s full_shard W=%d -> local", kname, W);
        compare(what, &c, &got, &want, 0);
        out_free(&got);
        // hybrid sharding
        if (full && W >= 2 && W % 2 == 0) {
            fc_run_config h = c;
            h.strategy = FC_STRATEGY_HYBRID_SHARD;
            h.shard_group = W / 2;
            train(&h, MPI_COMM_WORLD, N_STEPS, dir, NULL, 0, &got);
            snprintf(what, sizeof what, "%s full_shard W=%d -> hybrid_shard(F=%d) W=%d", kname, W, W / 2, W);
            compare(what, &c, &got, &want, 0);
            out_free(&got);
        }
    }
    // saved from other strategies, loaded into full_shard at W
    if (full) {
        const char *dir = sub_dir("from-%s", tag);
        run_out saved, got;
        char what[256];
        fc_run_config d = c;
        d.strategy = FC_STRATEGY_NO_SHARD;  // every rank writes its W-way chunk of its full copy
        train(&d, MPI_COMM_WORLD, K_STEPS, NULL, dir, FC_STATE_DICT_SHARDED, &saved);
        out_free(&saved);
        if (rank == 0)
            MT_CHECK(count_files(dir, "shard-") == W, "no_shard at W=%d wrote %d shard files", W,
                     count_files(dir, "shard-"));
        train(&c, MPI_COMM_WORLD, N_STEPS, dir, NULL, 0, &got);
        snprintf(what, sizeof what, "sharded no_shard W=%d -> full_shard W=%d", W, W);
        compare(what, &c, &got, &want, 1);
        out_free(&got);
        if (W >= 2 && W % 2 == 0) {  // replica 0's shard ranks write
            d.strategy = FC_STRATEGY_HYBRID_SHARD;
            d.shard_group = W / 2;
            train(&d, MPI_COMM_WORLD, K_STEPS, NULL, dir, FC_STATE_DICT_SHARDED, &saved);
            out_free(&saved);
            if (rank == 0)
                MT_CHECK(count_files(dir, "shard-") == W / 2, "hybrid_shard(F=%d) wrote %d shard files (stale ones?)",
                         W / 2, count_files(dir, "shard-"));
            train(&c, MPI_COMM_WORLD, N_STEPS, dir, NULL, 0, &got);
            snprintf(what, sizeof what, "sharded hybrid_shard(F=%d) W=%d -> full_shard W=%d", W / 2, W, W);
            compare(what, &c, &got, &want, 0);
            out_free(&got);
        }
        fc_run_config l = c;
        l.strategy = FC_STRATEGY_LOCAL;
        for (int kind = 0; kind < 2; kind++) {
            train_on(1, &l, K_STEPS, NULL, dir, (fc_state_dict)kind, &saved);
            out_free(&saved);
            if (rank == 0 && kind == FC_STATE_DICT_FULL)  // the old shard files are gone
                MT_CHECK(count_files(dir, "shard-") == 0, "a FULL save left %d stale shard files",
                         count_files(dir, "shard-"));
            train(&c, MPI_COMM_WORLD, N_STEPS, dir, NULL, 0, &got);
            snprintf(what, sizeof what, "%s local -> full_shard W=%d", fc_state_dict_name((fc_state_dict)kind), W);
            compare(what, &c, &got, &want, 0);
            out_free(&got);
        }
    }
    // the test can fail: each checkpoint fault of the loader is caught
    {
        const fc_fault faults[] = {FC_FAULT_CKPT_DROP_OPTIM, FC_FAULT_CKPT_SWAP, FC_FAULT_ADAM_STEP_RESET};
        for (int i = 0; i < 3; i++) {
            for (int kind = 0; kind < 2; kind++) {
                fc_run_config d = c;
                d.inject = faults[i];
                run_out got;
                train(&d, MPI_COMM_WORLD, N_STEPS, sub_dir("%s", fc_state_dict_name((fc_state_dict)kind)), NULL, 0,
                      &got);
                char what[128];
                snprintf(what, sizeof what, "fault %s (%s)", fc_fault_name(faults[i]),
                         fc_state_dict_name((fc_state_dict)kind));
                expect_caught(what, &c, &got, &want);
                out_free(&got);
            }
        }
    }
    out_free(&want);
}

// A checkpoint whose optimizer state is all zeros (rewritten with a valid
// manifest, so it verifies) must not resume the run: the comparison sees
// whether the state was restored at all.
static void check_state_matters(void) {
    fc_run_config c = mt_config("gpt2-tiny", FC_STRATEGY_FULL_SHARD, W, K_STEPS + N_STEPS);
    c.global_batch = batch_for(W);
    run_out want, saved, got;
    train(&c, MPI_COMM_WORLD, K_STEPS + N_STEPS, NULL, NULL, 0, &want);
    const char *dir = sub_dir("%s", "zeroed");
    train(&c, MPI_COMM_WORLD, K_STEPS, NULL, dir, FC_STATE_DICT_FULL, &saved);
    if (rank == 0) {  // rank 0 has the full state after the export: rewrite it with zero moments
        fc_model m;
        fc_model_build(&m, &c.model);
        float *zero = callocCheck(m.numel, sizeof(float));
        const float *state[2] = {zero, zero};
        fc_ckpt_info info = {&c, &m, K_STEPS, W, c.strategy};
        fc_error e;
        MT_CHECK(fc_ckpt_save_full(dir, &info, saved.params, state, &e) == 0, "rewrite failed: %s", e.msg);
        free(zero);
        fc_model_free(&m);
    }
    out_free(&saved);
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
    train(&c, MPI_COMM_WORLD, N_STEPS, dir, NULL, 0, &got);
    expect_caught("zeroed optimizer state in the checkpoint", &c, &got, &want);
    out_free(&got);
    out_free(&want);
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
    }
    check_state_matters();
    mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0) remove_tree(g_dir);
    return mt_finalize();
}
