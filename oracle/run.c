// oracle/run.c — `[mpiexec -n W] fsdpcheck run`: train one implementation
// through the contract, and optionally write its trace and comm log.
//
// Every rank parses the same flags and builds the same config, so a bad
// config fails identically everywhere; rank 0 alone prints and writes files,
// and tells the other ranks whether that worked.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "impl.h"
#include "optim.h"
#include "mpicheck.h"
#include "trace.h"

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

// Ends the run on every rank with the usage exit code; rank 0 prints e.
static _Noreturn void fail_all(int rank, const char *prefix, const fc_error *e) {
    if (rank == 0) {
        MPI_Finalize();
        fc_die(FC_EXIT_USAGE, "%s%s", prefix, e->msg);
    }
    MPI_Finalize();
    exit(FC_EXIT_USAGE);
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
static void print_memory(const fc_mem_stats *mine, int rank, int W) {
    fc_mem_stats *all = rank == 0 ? mallocCheck((size_t)W * sizeof *all) : NULL;
    mpiCheck(MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0, MPI_COMM_WORLD));
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
    }
    free(all);
}

int fc_cmd_run(int argc, char **argv) {
    mpiCheck(MPI_Init(NULL, NULL));
    int rank, W;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &W));
    fc_run_args a;
    fc_error e;
    int rc = fc_cli_parse_run(argc, argv, &a, &e);
    if (rc == 1) {
        if (rank == 0) fc_cli_usage(stdout);
        MPI_Finalize();
        return FC_EXIT_PASS;
    }
    if (rc) fail_all(rank, "", &e);
    if (fc_run_config_validate_world(&a.cfg, W, &e)) fail_all(rank, "", &e);

    const fc_impl_ops *ops = fc_reference_impl();
    fc_impl *im = ops->create(&a.cfg, MPI_COMM_WORLD, &e);
    if (!im) fail_all(rank, "", &e);
    fc_model m;  // the shared registry: names, shapes and layout of the trace
    fc_model_build(&m, &a.cfg.model);
    int tracing = a.trace_dir[0] != '\0';
    float *buf = rank == 0 && tracing ? mallocCheck(m.numel * sizeof(float) * 4) : NULL;
    float *params = buf, *grads = buf ? buf + m.numel : NULL;
    float *state[2] = {buf ? buf + 2 * m.numel : NULL, buf ? buf + 3 * m.numel : NULL};
    const char *state_names[2];
    int n_state = fc_optim_state_names(&a.cfg.optim, state_names);
    fc_trace_writer tw;
    fc_batch batch = {0};
    if (tracing) {
        if (ops->export_full(im, FC_EXPORT_PARAMS, params, 0, &e)) fail_all(rank, "", &e);
        int ok = rank != 0 || fc_trace_begin(&tw, a.trace_dir, &m, params, &e) == 0;
        if (!agree(ok)) fail_all(rank, "--trace: ", &e);
        if (rank == 0) fc_batch_alloc(&batch, &a.cfg.model, a.cfg.global_batch, a.cfg.seq_len);
    }
    if (!a.quiet && rank == 0)
        printf("fsdpcheck run: model %s (%zu parameters, %d units), impl %s, strategy %s, W=%d, "
               "B=%d, K=%d, steps %d, %s\n",
               m.cfg.name, m.numel, m.n_units, ops->name, fc_strategy_name(a.cfg.strategy), W,
               a.cfg.global_batch, a.cfg.grad_accum, a.cfg.steps, fc_opt_name(a.cfg.optim.kind));
    for (int t = 0; t < a.cfg.steps; t++) {
        double t0 = now_ms();
        fc_step_info info;
        if (ops->step(im, &info, &e)) fail_all(rank, "", &e);
        double ms = now_ms() - t0;
        if (!a.quiet && rank == 0)
            printf("step %d: loss %.6f  grad-norm %.6g  (%.1f ms)\n", t, info.loss, info.grad_norm, ms);
        if (!tracing) continue;
        // full tensors for the trace: outside the measured schedule and memory
        if (ops->export_full(im, FC_EXPORT_GRADS, grads, 0, &e) ||
            ops->export_full(im, FC_EXPORT_PARAMS, params, 0, &e))
            fail_all(rank, "", &e);
        for (int i = 0; i < n_state; i++)
            if (ops->export_full(im, i == 0 ? FC_EXPORT_STATE0 : FC_EXPORT_STATE1, state[i], 0, &e))
                fail_all(rank, "", &e);
        int ok = 1;
        if (rank == 0) {
            // the global batch is a pure function of (seed, step): regenerate it
            fc_data_fill(&batch, &a.cfg.model, a.cfg.seed, t, 0);
            fc_trace_step s = {.step = t, .loss = info.loss, .batch = &batch, .grads = grads,
                               .params = params, .n_state = n_state};
            for (int i = 0; i < n_state; i++) {
                s.state_names[i] = state_names[i];
                s.state[i] = state[i];
            }
            if (fc_trace_write_step(&tw, &s, &e)) {
                fc_trace_abort(&tw);
                ok = 0;
            }
        }
        if (!agree(ok)) fail_all(rank, "--trace: ", &e);
    }
    if (tracing) {
        int ok = rank != 0 || fc_trace_finish(&tw, &a.cfg, W, &e) == 0;
        if (!ok) fc_trace_abort(&tw);
        if (!agree(ok)) fail_all(rank, "--trace: ", &e);
        if (!a.quiet && rank == 0) printf("trace written to %s\n", a.trace_dir);
    }
    if (a.comm_log[0] && write_comm_log(ops->comm_log(im), rank, W, a.comm_log, &e))
        fail_all(rank, "", &e);
    fc_mem_stats mem;
    ops->memory(im, &mem);
    if (!a.quiet && a.cfg.strategy != FC_STRATEGY_LOCAL) print_memory(&mem, rank, W);
    ops->destroy(im);
    fc_model_free(&m);
    fc_batch_free(&batch);
    free(buf);
    MPI_Finalize();
    return FC_EXIT_PASS;
}
