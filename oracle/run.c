// oracle/run.c — `[mpiexec -n W] fsdpcheck run`: train one implementation
// through the contract, and optionally write its trace and comm log.
//
// Every rank parses the same flags and builds the same config, so a bad
// config fails identically everywhere; rank 0 alone prints and writes files,
// and tells the other ranks whether that worked.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "fileio.h"
#include "impl.h"
#include "optim.h"
#include "mpicheck.h"
#include "runner.h"
#include "threads.h"
#include "trace.h"
#include "watchdog.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Rank 0 decided ok (1) or not (0); every rank learns it.
static int agree(int ok) {
    mpiCheck(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return ok;
}

// Gathers every rank's comm log to rank 0 and writes it as JSON lines.
static int write_comm_log(const fc_comm_log *log, int rank, int W, const char *path, fc_error *e) {
    int n = (int)log->n, bytes = n * (int)sizeof(fc_event);
    int *counts = NULL, *displs = NULL;
    fc_event *all = NULL;
    if (rank == 0) {
        counts = mallocCheck((size_t)W * sizeof(int));
        displs = mallocCheck((size_t)W * sizeof(int));
    }
    mpiCheck(MPI_Gather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
    size_t total = 0;
    if (rank == 0) {
        for (int r = 0; r < W; r++) {
            displs[r] = (int)total;
            total += (size_t)counts[r];
        }
        all = mallocCheck(total ? total : 1);
    }
    // fc_event is plain data and every rank runs the same binary
    mpiCheck(MPI_Gatherv(log->ev, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD));
    int ok = 1;
    if (rank == 0) {
        FILE *f = fopen(path, "w");
        if (!f) {
            ok = 0;
            fc_fail(e, "--comm-log %s: cannot write", path);
        } else {
            for (int r = 0; r < W; r++) {
                fc_comm_log view = {0};
                view.ev = (fc_event *)((char *)all + displs[r]);
                view.n = (size_t)counts[r] / sizeof(fc_event);
                fc_log_write_jsonl(&view, r, f);
            }
            if (fclose(f) != 0) ok = 0, fc_fail(e, "--comm-log %s: write failed", path);
        }
    }
    free(counts);
    free(displs);
    free(all);
    return agree(ok) ? 0 : -1;
}

// Per-rank peak memory by category, as a table on rank 0.
static void proc_usage(long *peak_kib, long long *rchar);

// The implementation's own accounting per category, and beside it the whole
// process's peak resident set (getrusage: what the OS saw, trace buffers and
// all; rank 0 alone holds the trace's full tensors).
static void print_memory(const fc_mem_stats *mine, int rank, int W) {
    fc_mem_stats *all = rank == 0 ? mallocCheck((size_t)W * sizeof *all) : NULL;
    mpiCheck(MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0, MPI_COMM_WORLD));
    long kib;
    long long rchar, *rss = rank == 0 ? mallocCheck((size_t)W * sizeof *rss) : NULL;
    proc_usage(&kib, &rchar);
    long long my_kib = kib;
    mpiCheck(MPI_Gather(&my_kib, 1, MPI_LONG_LONG, rss, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD));
    if (rank == 0) {
        printf("peak memory per rank (bytes):\n%-5s %-7s", "rank", "where");
        for (int c = 0; c < FC_MEM_COUNT; c++) printf(" %15s", fc_mem_cat_name(c));
        printf(" %15s\n", "total");
        for (int r = 0; r < W; r++)
            for (int l = 0; l < FC_LOC_COUNT; l++) {
                if (all[r].peak_total[l] == 0) continue;
                printf("%-5d %-7s", r, fc_mem_loc_name(l));
                for (int c = 0; c < FC_MEM_COUNT; c++) printf(" %15zu", all[r].peak[l][c]);
                printf(" %15zu\n", all[r].peak_total[l]);
            }
        printf("peak RSS per rank (MiB):");
        for (int r = 0; r < W; r++) printf("%s %d: %.1f", r ? "," : "", r, rss[r] / 1024.0);
        printf("\n");
    }
    free(all);
    free(rss);
}

// This process's peak resident memory so far (KiB) and the bytes it has read
// through system calls (Linux /proc/self/io rchar; -1 where unavailable).
static void proc_usage(long *peak_kib, long long *rchar) {
    struct rusage ru;
    *peak_kib = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
    *rchar = -1;
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return;
    char line[128];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %lld", rchar) == 1) break;
    fclose(f);
}

// --load: the checkpoint replaces the state just created (parameters,
// optimizer state, step count and so the data position). Rank 0 then prints
// every rank's peak memory and bytes read around the load: a rank that reads
// only its own shard shows O(shard) in both, whatever the model size.
static int load_checkpoint(const fc_impl_ops *ops, fc_impl *im, const fc_run_args *a, const fc_model *m,
                           int rank, int W, fc_error *e) {
    if (!ops->load || !ops->steps_done) return fc_fail(e, "implementation %s does not load checkpoints", ops->name);
    long long use[4];  // peak KiB before, peak KiB after, bytes read, this rank's load time (us)
    long kib;
    long long rchar0, rchar1;
    proc_usage(&kib, &rchar0);
    use[0] = kib;
    double t0 = now_ms();
    fc_watchdog_mark(0, "load");
    if (ops->load(im, a->load_dir, e)) return -1;  // the same on every rank
    use[3] = (long long)((now_ms() - t0) * 1e3);
    proc_usage(&kib, &rchar1);
    use[1] = kib;
    use[2] = rchar0 >= 0 && rchar1 >= 0 ? rchar1 - rchar0 : -1;
    long long *all = rank == 0 ? mallocCheck((size_t)W * sizeof use) : NULL;
    mpiCheck(MPI_Gather(use, 4, MPI_LONG_LONG, all, 4, MPI_LONG_LONG, 0, MPI_COMM_WORLD));
    if (!a->quiet && rank == 0) {
        const char *names[2];
        int n_state = fc_optim_state_names(&a->cfg.optim, names);
        double state_mib = (double)m->numel * sizeof(float) * (1 + n_state) / (1 << 20);
        printf("loaded checkpoint %s: next step %ld; model state (parameters + optimizer) %.1f MiB\n",
               a->load_dir, ops->steps_done(im), state_mib);
        printf("%-5s %22s %22s %20s %10s\n", "rank", "peak RSS before (MiB)", "peak RSS after (MiB)",
               "read by load (MiB)", "load (ms)");
        for (int r = 0; r < W; r++)
            printf("%-5d %22.1f %22.1f %20.1f %10.1f\n", r, all[4 * r] / 1024.0, all[4 * r + 1] / 1024.0,
                   all[4 * r + 2] / (double)(1 << 20), all[4 * r + 3] / 1e3);
    }
    free(all);
    return 0;
}

// --save: a checkpoint of the state after this step (collective).
static int save_checkpoint(const fc_impl_ops *ops, fc_impl *im, const fc_run_args *a, int rank, fc_error *e) {
    if (!ops->save) return fc_fail(e, "implementation %s does not save checkpoints", ops->name);
    double t0 = now_ms();
    fc_watchdog_mark(ops->steps_done ? ops->steps_done(im) : 0, "save");
    if (ops->save(im, a->save_dir, a->state_dict, e)) return -1;
    if (!a->quiet && rank == 0)
        printf("checkpoint (%s state dict) saved to %s (%.1f ms)\n", fc_state_dict_name(a->state_dict), a->save_dir,
               now_ms() - t0);
    return 0;
}

// One run: the implementation, the model, and what it writes.
typedef struct {
    int rank, W, threads;
    fc_run_args a;
    const fc_impl_ops *ops;
    fc_impl *im;
    fc_model m;          // the shared registry: names, shapes and layout of the trace
    long first_step;     // global step numbers continue a loaded run (step files, data, messages)
    int tracing;
    float *set;          // [numel] on rank 0: one full tensor set at a time, exported then written
    const char *state_names[2];
    int n_state;
    fc_trace_writer tw;
    fc_batch batch;
} run_state;

// Flags, config, watchdog, threads, the implementation created (and loaded);
// 1 when --help was asked for (and printed).
static int start(run_state *r, int argc, char **argv) {
    fc_error e;
    int rc = fc_cli_parse_run(argc, argv, &r->a, &e);
    if (rc == 1) {
        if (r->rank == 0) fc_cli_usage(stdout);
        MPI_Finalize();
        return 1;
    }
    if (rc) fc_die_all(r->rank, "%s", e.msg);
    if (fc_run_config_validate_world(&r->a.cfg, r->W, &e)) fc_die_all(r->rank, "%s", e.msg);
    if (fc_watchdog_start(MPI_COMM_WORLD, r->a.timeout, &e)) fc_die_all(r->rank, "%s", e.msg);
    r->threads = fc_threads_setup(r->a.threads, fc_mpi_ranks_on_node(MPI_COMM_WORLD));
    r->ops = fc_impl_resolve(r->a.cfg.impl, &e);
    if (r->ops) r->ops = fc_impl_for(r->ops, &r->a.cfg, &e);
    fc_watchdog_mark(0, "create");
    r->im = r->ops ? r->ops->create(&r->a.cfg, MPI_COMM_WORLD, &e) : NULL;
    if (!r->im) fc_die_all(r->rank, "%s", e.msg);
    fc_model_build_run(&r->m, &r->a.cfg);
    if (r->a.load_dir[0] && load_checkpoint(r->ops, r->im, &r->a, &r->m, r->rank, r->W, &e)) {
        r->ops->destroy(r->im);  // refused: nothing was written, nothing is left
        fc_die_all(r->rank, "--load: %s", e.msg);
    }
    r->first_step = r->ops->steps_done ? r->ops->steps_done(r->im) : 0;
    if (r->a.save_dir[0]) {  // an unusable --save path fails now, before any training
        int ok = r->rank != 0 || fc_mkdir_p(r->a.save_dir, &e) == 0;
        if (!agree(ok)) {
            r->ops->destroy(r->im);
            fc_die_all(r->rank, "--save: %s", e.msg);
        }
    }
    return 0;
}

// --trace: the initial parameters written, the batch that each step regenerates.
static void begin_trace(run_state *r) {
    fc_error e;
    r->tracing = r->a.trace_dir[0] != '\0';
    r->set = r->rank == 0 && r->tracing ? mallocCheck(r->m.numel * sizeof(float)) : NULL;
    r->n_state = fc_optim_state_names(&r->a.cfg.optim, r->state_names);
    if (!r->tracing) return;
    if (r->ops->export_full(r->im, FC_EXPORT_PARAMS, r->set, 0, &e)) fc_die_all(r->rank, "%s", e.msg);
    int ok = r->rank != 0 || fc_trace_begin(&r->tw, r->a.trace_dir, &r->m, r->set, &e) == 0;
    if (!agree(ok)) fc_die_all(r->rank, "--trace: %s", e.msg);
    if (r->rank == 0) fc_batch_alloc(&r->batch, &r->a.cfg.model, r->a.cfg.global_batch, r->a.cfg.seq_len);
}

static void print_header(const run_state *r) {
    const fc_run_config *c = &r->a.cfg;
    char extra[96] = "";  // what the strategy's name does not say
    int n = 0;
    if (c->reshard_after_forward)
        n += snprintf(extra + n, sizeof extra - (size_t)n, ", reshard_after_forward %d", c->reshard_after_forward);
    if (c->act_ckpt != FC_ACT_CKPT_NONE)
        snprintf(extra + n, sizeof extra - (size_t)n, ", activation checkpointing %s the unit",
                 fc_act_ckpt_name(c->act_ckpt));
    printf("fsdpcheck run: model %s (%zu parameters, %d units), impl %s, strategy %s (FSDP%d%s), W=%d, "
           "B=%d, K=%d, steps %d, %s, threads %d per rank\n",
           r->m.cfg.name, r->m.numel, r->m.n_units, r->ops->name, fc_strategy_name(c->strategy), c->fsdp_version,
           extra, r->W, c->global_batch, c->grad_accum, c->steps, fc_opt_name(c->optim.kind), r->threads);
}

// Step t's full tensors into the trace: outside the measured schedule and
// memory (--trace-tensors first: the first step's alone, every rank agreeing).
static void trace_step(run_state *r, int t, const fc_step_info *info) {
    fc_error e;
    long step = r->first_step + t;
    fc_watchdog_mark(step, "export");
    int ok = 1, sets = !r->a.trace_tensor_steps || t < r->a.trace_tensor_steps;
    if (r->rank == 0) {
        // the global batch is a pure function of (seed, step): regenerate it
        fc_data_fill(&r->batch, &r->a.cfg.model, r->a.cfg.seed, step, 0);
        fc_trace_step s = {.step = step, .loss = info->loss, .has_norm = 1, .grad_norm = info->grad_norm,
                           .batch = &r->batch, .n_state = r->n_state};
        for (int i = 0; i < r->n_state; i++) s.state_names[i] = r->state_names[i];
        ok = fc_trace_write_open(&r->tw, &s, sets, &e) == 0;
    }
    // the sets in the step file's order; a rank 0 that failed to write
    // still exports every set, since every rank takes part in each
    for (int k = 0; sets && k < 2 + r->n_state; k++) {
        if (r->ops->export_full(r->im, fc_step_set_exports[k], r->set, 0, &e)) fc_die_all(r->rank, "%s", e.msg);
        if (r->rank == 0 && ok) ok = fc_trace_write_put(&r->tw, r->set, &e) == 0;
    }
    if (r->rank == 0 && ok) ok = fc_trace_write_commit(&r->tw, &e) == 0;
    if (r->rank == 0 && !ok) fc_trace_abort(&r->tw);
    if (!agree(ok)) fc_die_all(r->rank, "--trace: %s", e.msg);
}

static void run_step(run_state *r, int t) {
    fc_error e;
    double t0 = now_ms();
    fc_step_info info;
    fc_watchdog_mark(r->first_step + t, "step");
    if (r->ops->step(r->im, &info, &e)) fc_die_all(r->rank, "%s", e.msg);
    double ms = now_ms() - t0;
    if (!r->a.quiet && r->rank == 0)
        printf("step %ld: loss %.6f  grad-norm %.6g  (%.1f ms)\n", r->first_step + t, info.loss, info.grad_norm, ms);
    if (r->a.save_dir[0] && t + 1 == r->a.save_at && save_checkpoint(r->ops, r->im, &r->a, r->rank, &e)) {
        if (r->tracing && r->rank == 0) fc_trace_abort(&r->tw);
        r->ops->destroy(r->im);
        fc_die_all(r->rank, "--save: %s", e.msg);
    }
    if (r->tracing) trace_step(r, t, &info);
}

// The trace's trace.json, the comm log and the memory table.
static void finish(run_state *r) {
    fc_error e;
    if (r->tracing) {
        int ok = r->rank != 0 || fc_trace_finish(&r->tw, &r->a.cfg, r->W, &e) == 0;
        if (!ok) fc_trace_abort(&r->tw);
        if (!agree(ok)) fc_die_all(r->rank, "--trace: %s", e.msg);
        if (!r->a.quiet && r->rank == 0) printf("trace written to %s\n", r->a.trace_dir);
    }
    if (r->a.comm_log[0] && write_comm_log(r->ops->comm_log(r->im), r->rank, r->W, r->a.comm_log, &e))
        fc_die_all(r->rank, "%s", e.msg);
    fc_mem_stats mem;
    r->ops->memory(r->im, &mem);
    if (!r->a.quiet && r->a.cfg.strategy != FC_STRATEGY_LOCAL) print_memory(&mem, r->rank, r->W);
}

int fc_cmd_run(int argc, char **argv) {
    mpiCheck(MPI_Init(NULL, NULL));
    run_state run = {0}, *r = &run;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &r->rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &r->W));
    if (start(r, argc, argv)) return FC_EXIT_PASS;
    begin_trace(r);
    if (!r->a.quiet && r->rank == 0) print_header(r);
    for (int t = 0; t < r->a.cfg.steps; t++) run_step(r, t);
    finish(r);
    r->ops->destroy(r->im);
    fc_model_free(&r->m);
    fc_batch_free(&r->batch);
    free(r->set);
    fc_watchdog_stop();
    MPI_Finalize();
    return FC_EXIT_PASS;
}
