// oracle/runner.c — see runner.h.
#include "runner.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "mpicheck.h"
#include "optim.h"
#include "watchdog.h"

// Copies the full parameters, gradients and states of im to rank 0's buffers.
static int export_step(const fc_impl_ops *ops, fc_impl *im, fc_run_result *r, fc_run_step *st, int rank,
                       fc_error *e) {
    if (rank == 0) {
        st->params = callocCheck(r->numel, sizeof(float));
        st->grads = callocCheck(r->numel, sizeof(float));
        for (int i = 0; i < r->n_state; i++) st->state[i] = callocCheck(r->numel, sizeof(float));
    }
    if (ops->export_full(im, FC_EXPORT_PARAMS, st->params, 0, e) || ops->export_full(im, FC_EXPORT_GRADS, st->grads, 0, e))
        return -1;
    for (int i = 0; i < r->n_state; i++)
        if (ops->export_full(im, i ? FC_EXPORT_STATE1 : FC_EXPORT_STATE0, st->state[i], 0, e)) return -1;
    return 0;
}

const fc_export fc_step_set_exports[4] = {FC_EXPORT_GRADS, FC_EXPORT_PARAMS, FC_EXPORT_STATE0, FC_EXPORT_STATE1};

void fc_lockstep_dir(MPI_Comm comm, char *dir, size_t cap) {
    int rank;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    if (rank == 0) {
        const char *tmp = getenv("TMPDIR");
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp && *tmp ? tmp : "/tmp";
        snprintf(dir, cap, "%s/fsdpcheck-lockstep-XXXXXX", base);
        if (!mkdtemp(dir)) dir[0] = '\0';
    }
    fc_mpi_bcast(dir, (int)cap, MPI_CHAR, 0, comm);
}

int fc_lockstep_handover(const fc_impl_ops *ops, fc_impl *im, const fc_run_config *cfg, const float *params,
                         const float *const state[2], long step, const char *dir, MPI_Comm comm, fc_error *e) {
    int rank, ok = 1;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    if (rank == 0) {
        fc_model m;
        fc_model_build_run(&m, cfg);
        fc_ckpt_info info = {cfg, &m, step, 1, FC_STRATEGY_LOCAL};
        ok = fc_ckpt_save_full(dir, &info, params, state, e) == 0;
        fc_model_free(&m);
    }
    if (fc_mpi_agree(comm, ok, e)) return -1;
    if (!ops->load) return fc_fail(e, "%s cannot load checkpoints, so it cannot be stepped in lockstep", ops->name);
    return ops->load(im, dir, e);
}

// A run: cfg->steps steps of ops on comm, after loading load_dir if given. In
// lockstep (from != NULL, fc_runner_lockstep) step t >= 1 first loads from's
// state after its step from0 + t - 1, and step 0 is not run. With save_dir,
// a checkpoint of save_kind is saved there after step save_at - 1.
typedef struct {
    const char *load_dir;
    const fc_run_result *from;
    int from0;
    long first;
    const char *save_dir;
    int save_at;
    fc_state_dict save_kind;
} run_how;

// Creates the instance of a run on comm (loaded from how->load_dir if given)
// and exports the parameters its first step starts from. NULL with r->error
// set when it cannot be created or loaded; r->ok = 0 when the export failed.
static fc_impl *run_open(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, const run_how *how,
                         int rank, fc_run_result *r) {
    fc_error e;
    fc_impl *im = ops ? ops->create(cfg, comm, &e) : NULL;
    if (!im) {
        snprintf(r->error, sizeof r->error, "create: %s", e.msg);
        return NULL;
    }
    if (how->load_dir && (!ops->load || ops->load(im, how->load_dir, &e))) {
        snprintf(r->error, sizeof r->error, "load: %s", ops->load ? e.msg : "the implementation cannot load");
        ops->destroy(im);
        return NULL;
    }
    fc_model m;
    fc_model_build_run(&m, cfg);
    r->numel = m.numel;
    fc_model_free(&m);
    r->steps = cfg->steps;
    r->n_state = fc_optim_state_names(&cfg->optim, r->state_names);
    r->first_step = ops->steps_done ? ops->steps_done(im) : 0;
    r->step = callocCheck((size_t)cfg->steps, sizeof *r->step);
    r->ok = 1;
    // the parameters the first step starts from (export before any step: the
    // initial or loaded ones)
    if (rank == 0) r->init = callocCheck(r->numel, sizeof(float));
    if (ops->export_full(im, FC_EXPORT_PARAMS, r->init, 0, &e)) {
        snprintf(r->error, sizeof r->error, "export before step 0: %s", e.msg);
        r->ok = 0;
    }
    return im;
}

// Step t of a run: in lockstep, first the handover of how->from's state
// through dir; then the step and the export of its tensors. 0, or -1 with
// r->error set.
static int run_step(const fc_impl_ops *ops, fc_impl *im, const fc_run_config *cfg, MPI_Comm comm,
                    const run_how *how, const char *dir, int rank, fc_run_result *r, int t) {
    fc_error e;
    if (how->from) {
        int s = how->from0 + t - 1;
        fc_watchdog_mark(r->first_step + t, "lockstep load");
        // its tensors are on rank 0 alone (elsewhere `from` may not even have run)
        const fc_run_step *from = rank == 0 ? &how->from->step[s] : NULL;
        const float *const state[2] = {from ? from->state[0] : NULL, from ? from->state[1] : NULL};
        if (fc_lockstep_handover(ops, im, cfg, from ? from->params : NULL, state, r->first_step + t, dir, comm, &e)) {
            snprintf(r->error, sizeof r->error, "lockstep load before step %d: %s", t, e.msg);
            return -1;
        }
        if (rank == 0) r->step[t].start = how->from->step[s].params;
    }
    fc_step_info info;
    fc_watchdog_mark(r->first_step + t, "step");
    if (ops->step(im, &info, &e)) {
        snprintf(r->error, sizeof r->error, "step %d: %s", t, e.msg);
        return -1;
    }
    r->step[t].loss = info.loss;
    r->step[t].norm = info.grad_norm;
    fc_watchdog_mark(r->first_step + t, "export");
    if (export_step(ops, im, r, &r->step[t], rank, &e)) {
        snprintf(r->error, sizeof r->error, "export after step %d: %s", t, e.msg);
        return -1;
    }
    return 0;
}

static void run(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, const run_how *how,
                fc_run_result *r) {
    memset(r, 0, sizeof *r);
    fc_log_init(&r->log);
    fc_error e;
    int rank;
    mpiCheck(MPI_Comm_rank(comm, &rank));
    ops = fc_impl_for(ops, cfg, &e);
    r->act32 = fc_runner_act32(ops);
    if (!ops) {
        snprintf(r->error, sizeof r->error, "create: %s", e.msg);
        return;
    }
    fc_impl *im = run_open(ops, cfg, comm, how, rank, r);
    if (!im) return;
    char dir[256] = "";
    if (how->from) {
        r->first_step = how->first;
        fc_lockstep_dir(comm, dir, sizeof dir);
        if (!dir[0]) {
            snprintf(r->error, sizeof r->error, "lockstep: cannot create a directory for the state handover");
            r->ok = 0;
        }
    }
    for (int t = how->from ? 1 : 0; t < cfg->steps && r->ok; t++) {
        if (run_step(ops, im, cfg, comm, how, dir, rank, r, t)) r->ok = 0;
        if (r->ok && how->save_dir && t + 1 == how->save_at && ops->save(im, how->save_dir, how->save_kind, &e)) {
            snprintf(r->error, sizeof r->error, "save after step %d: %s", t, e.msg);
            r->ok = 0;
        }
    }
    const fc_comm_log *log = ops->comm_log(im);
    for (size_t i = 0; i < log->n; i++) {
        fc_log_add(&r->log, log->ev[i]);
        r->log.ev[i] = log->ev[i];  // keep the implementation's step/micro/order
    }
    ops->memory(im, &r->mem);
    ops->destroy(im);
    if (dir[0] && rank == 0) fc_remove_flat_dir(dir);
}

fc_trace_step fc_run_trace_step(const fc_run_result *r, int t) {
    const fc_run_step *s = &r->step[t];
    fc_trace_step ts = {0};
    ts.step = r->first_step + t;
    ts.loss = s->loss;
    ts.has_norm = 1;
    ts.grad_norm = s->norm;
    ts.grads = s->grads;
    ts.params = s->params;
    ts.prev_params = s->start ? s->start : t == 0 ? r->init : r->step[t - 1].params;
    ts.n_state = r->n_state;
    for (int i = 0; i < r->n_state; i++) {
        ts.state_names[i] = r->state_names[i];
        ts.state[i] = s->state[i];
    }
    return ts;
}

fc_run_config fc_runner_local_of(fc_run_config c, int W) {
    c.strategy = FC_STRATEGY_LOCAL;
    c.fsdp_version = 1;
    c.reshard_after_forward = 0;
    c.shard_group = 0;
    c.backward_prefetch = FC_PREFETCH_NONE;
    c.forward_prefetch = c.backward_prefetch_depth = c.limit_all_gathers = c.no_sync = c.cpu_offload = 0;
    c.divide = FC_DIVIDE_PREPOST;  // one rank: every divide mode divides by 1 (or by F / W, the same value)
    if (c.gradient_divide_factor > 0) c.gradient_divide_factor /= W;
    c.inject = FC_FAULT_NONE;
    c.act_ckpt = FC_ACT_CKPT_NONE;  // a recompute changes no bit (P15)
    return c;
}

int fc_runner_act32(const fc_impl_ops *ops) { return ops && (ops == fc_reference_impl() || ops == fc_reference_faults_impl()); }

void fc_runner_run(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, fc_run_result *r) {
    run_how how = {0};
    run(ops, cfg, comm, &how, r);
}

void fc_runner_run_saving(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, int at, const char *dir,
                          fc_state_dict kind, fc_run_result *r) {
    run_how how = {.save_dir = dir, .save_at = at, .save_kind = kind};
    if (ops && !ops->save) {
        memset(r, 0, sizeof *r);
        fc_log_init(&r->log);
        snprintf(r->error, sizeof r->error, "the implementation cannot save checkpoints");
        return;
    }
    run(ops, cfg, comm, &how, r);
}

void fc_runner_resume(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, const char *load_dir,
                      fc_run_result *r) {
    run_how how = {.load_dir = load_dir};
    run(ops, cfg, comm, &how, r);
}

void fc_runner_lockstep(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, const fc_run_result *from,
                        int from0, long first, fc_run_result *r) {
    run_how how = {.from = from, .from0 = from0, .first = first};
    run(ops, cfg, comm, &how, r);
}

void fc_remove_flat_dir(const char *dir) {
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

int fc_runner_save(const fc_impl_ops *ops, const fc_run_config *cfg, MPI_Comm comm, int steps, const char *dir,
                   fc_state_dict kind, fc_error *e) {
    ops = fc_impl_for(ops, cfg, e);
    if (!ops) return -1;
    if (!ops->save) return fc_fail(e, "the implementation cannot save checkpoints");
    fc_impl *im = ops->create(cfg, comm, e);
    if (!im) return -1;
    int rc = 0;
    for (int t = 0; t < steps && rc == 0; t++) {
        fc_step_info info;
        rc = ops->step(im, &info, e);
    }
    if (rc == 0) rc = ops->save(im, dir, kind, e);
    ops->destroy(im);
    return rc;
}

void fc_runner_free(fc_run_result *r) {
    for (int t = 0; r->step && t < r->steps; t++) {
        free(r->step[t].params);
        free(r->step[t].grads);
        free(r->step[t].state[0]);
        free(r->step[t].state[1]);
    }
    free(r->step);
    free(r->init);
    fc_log_free(&r->log);
    memset(r, 0, sizeof *r);
}

const fc_impl_ops *fc_impl_for(const fc_impl_ops *ops, const fc_run_config *cfg, fc_error *e) {
    // a port built before llama existed has never seen the model kind: refused
    // here, from its table, rather than handed a config it would misread
    if (ops && cfg->model.kind == FC_MODEL_LLAMA && !(ops->features & FC_IMPL_LLAMA)) {
        fc_fail(e, "--model %s: %s does not implement llama (its table's features lack FC_IMPL_LLAMA)",
                cfg->model.name, ops->name);
        return NULL;
    }
    if (ops && cfg->freeze[0] && !(ops->features & FC_IMPL_FREEZE)) {
        fc_fail(e, "--freeze: %s does not implement frozen parameters (its table's features lack FC_IMPL_FREEZE)",
                ops->name);
        return NULL;
    }
    if (cfg->inject == FC_FAULT_NONE) return ops;
    if (ops && ops != fc_reference_impl() && (ops->features & FC_IMPL_FAULTS)) return ops;
    if (ops != fc_reference_impl()) {
        fc_fail(e, "--inject %s: %s has no fault catalogue built in (its table's features lack FC_IMPL_FAULTS); "
                   "inject into the reference or into a port built with it",
                fc_fault_name(cfg->inject), ops ? ops->name : "the implementation");
        return NULL;
    }
    return fc_reference_faults_impl();
}

int fc_impl_claims_same_bits(const fc_impl_ops *ops) {
    unsigned both = FC_IMPL_LAYOUT_INVARIANT | FC_IMPL_DETERMINISTIC;
    return (ops->features & both) == both;
}

int fc_impl_claims_repeatable(const fc_impl_ops *ops) { return (ops->features & FC_IMPL_DETERMINISTIC) != 0; }

// The CUDA port is its own library (optimized/, libfsdpcheck_cuda.so), so the
// fsdpcheck binary never depends on CUDA: `--impl cuda` finds it in
// $FSDPCHECK_CUDA_LIB, beside the binary, in the build tree's optimized/, or
// in the install tree's lib/fsdpcheck/, and loads it like any port.
static int find_cuda_port(char *path, size_t cap) {
    const char *env = getenv("FSDPCHECK_CUDA_LIB");
    if (env && *env) {
        snprintf(path, cap, "%s", env);
        return 0;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return -1;
    *slash = '\0';
    const char *rel[] = {"libfsdpcheck_cuda.so", "../optimized/libfsdpcheck_cuda.so", "../lib/fsdpcheck/libfsdpcheck_cuda.so"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        snprintf(path, cap, "%s/%s", exe, rel[i]);
        if (access(path, R_OK) == 0) return 0;
    }
    return -1;
}

const fc_impl_ops *fc_impl_resolve(const char *impl, fc_error *e) {
    if (!impl[0] || strcmp(impl, "reference") == 0) return fc_reference_impl();
    if (strcmp(impl, "cuda") == 0) {
        char path[4200];
        if (find_cuda_port(path, sizeof path)) {
            fc_fail(e, "--impl cuda: the CUDA port is not built here (no libfsdpcheck_cuda.so beside fsdpcheck: "
                       "build where nvcc is, or set FSDPCHECK_CUDA_LIB)");
            return NULL;
        }
        return fc_impl_resolve(path, e);
    }
    if (!strchr(impl, '/')) {
        fc_fail(e, "--impl %s: not 'reference' and not a path to a shared library (use ./%s)", impl, impl);
        return NULL;
    }
    void *h = dlopen(impl, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fc_fail(e, "--impl %s: cannot load: %s", impl, dlerror());
        return NULL;
    }
    fc_impl_entry entry;
    *(void **)&entry = dlsym(h, FC_IMPL_ENTRY);  // POSIX: function pointers via void *
    if (!entry) {
        fc_fail(e, "--impl %s: no entry point %s()", impl, FC_IMPL_ENTRY);
        dlclose(h);
        return NULL;
    }
    const fc_impl_ops *ops = entry();
    if (!ops || ops->abi_version != FC_IMPL_ABI_VERSION) {
        fc_fail(e, "--impl %s: contract version %d, this fsdpcheck speaks %d", impl, ops ? ops->abi_version : -1,
                FC_IMPL_ABI_VERSION);
        dlclose(h);
        return NULL;
    }
    if (!(ops->fsdp_versions & FC_IMPL_FSDP(1))) {
        fc_fail(e, "--impl %s: the operations table's fsdp_versions (%#x) lacks FC_IMPL_FSDP(1): every port "
                   "implements FSDP1", impl, ops->fsdp_versions);
        dlclose(h);
        return NULL;
    }
    const char *null_fn = !ops->create ? "create" : !ops->step ? "step" : !ops->export_full ? "export_full"
                        : !ops->comm_log ? "comm_log" : !ops->memory ? "memory" : !ops->destroy ? "destroy" : NULL;
    if (null_fn) {
        fc_fail(e, "--impl %s: the operations table's %s is NULL (create, step, export_full, comm_log, memory and "
                   "destroy are required)", impl, null_fn);
        dlclose(h);
        return NULL;
    }
    return ops;  // the library stays loaded for the life of the process
}

void fc_die_all(int rank, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fc_watchdog_stop();
    MPI_Finalize();
    if (rank == 0) fc_die(FC_EXIT_USAGE, "%s", msg);
    exit(FC_EXIT_USAGE);
}
