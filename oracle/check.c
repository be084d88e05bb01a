// oracle/check.c — `mpiexec -n W fsdpcheck check --impl X [--against reference] [run flags]`.
//
// Runs the implementation under test and the one it is checked against in one
// MPI job, on the same communicator and config, one step at a time, in
// lockstep (DESIGN §8): before each step after the first, the expected
// implementation loads the tested one's state after the step before (its
// parameters, optimizer state and the step number: runner.h,
// fc_lockstep_handover), so every step is judged from the same starting point
// and a legitimately drifted trajectory never loosens a judgement. After every
// step both export their full gradients, parameters and optimizer state to
// rank 0, where the comparison engine (compare.h) judges them under the
// tolerance policy. The first failing step stops the run and prints the
// report: the per-tensor errors and the first divergence (step, tensor,
// element, both values, and the rank that owns it under the tested layout).
// --inject applies to the tested implementation only.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "rerun.h"
#include "mpicheck.h"
#include "optim.h"
#include "runner.h"
#include "watchdog.h"
#include "threads.h"

static _Noreturn void die_all(int rank, const char *msg) {
    fc_watchdog_stop();
    MPI_Finalize();
    if (rank == 0) fc_die(FC_EXIT_USAGE, "%s", msg);
    exit(FC_EXIT_USAGE);
}

// Full tensors of one implementation after a step, on rank 0, and the
// parameters before it (the optimizer allowance of compare.h needs them).
typedef struct {
    float *params, *prev, *grads, *state[2];
} full_set;

static void export_all(const fc_impl_ops *ops, fc_impl *im, int n_state, full_set *s, int rank) {
    fc_error e;
    if (ops->export_full(im, FC_EXPORT_PARAMS, s->params, 0, &e) ||
        ops->export_full(im, FC_EXPORT_GRADS, s->grads, 0, &e))
        die_all(rank, e.msg);
    for (int i = 0; i < n_state; i++)
        if (ops->export_full(im, i ? FC_EXPORT_STATE1 : FC_EXPORT_STATE0, s->state[i], 0, &e)) die_all(rank, e.msg);
}

int fc_cmd_check(int argc, char **argv) {
    mpiCheck(MPI_Init(NULL, NULL));
    int rank, W;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &W));
    // check's own flags; the rest are run flags
    const char *impl = NULL, *against = "reference";
    int bitwise = 0;
    char **rest = callocCheck((size_t)argc + 1, sizeof *rest);
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--impl") && i + 1 < argc)
            impl = argv[++i];
        else if (!strcmp(argv[i], "--against") && i + 1 < argc)
            against = argv[++i];
        else if (!strcmp(argv[i], "--bitwise"))
            bitwise = 1;
        else
            rest[n++] = argv[i];
    }
    if (!impl) die_all(rank, "check: --impl X is required (reference, or a port's PATH.so)");
    fc_run_args a;
    fc_error e;
    int rc = fc_cli_parse_run(n, rest, &a, &e);
    free(rest);
    if (rc == 1) die_all(rank, "check: see fsdpcheck run --help for the config flags");
    if (rc) die_all(rank, e.msg);
    if (fc_run_config_validate_world(&a.cfg, W, &e)) die_all(rank, e.msg);
    // check compares in memory and writes nothing: run's output flags would
    // change nothing here, so they are refused rather than ignored
    const char *writes = a.trace_dir[0] ? "--trace" : a.comm_log[0] ? "--comm-log" : a.save_dir[0] ? "--save" : NULL;
    if (writes) {
        char msg[256];
        snprintf(msg, sizeof msg, "check: %s is run's (check compares in memory and writes nothing): use "
                 "fsdpcheck run %s", writes, writes);
        die_all(rank, msg);
    }
    if (fc_watchdog_start(MPI_COMM_WORLD, a.timeout, &e)) die_all(rank, e.msg);
    fc_threads_setup(a.threads, fc_mpi_ranks_on_node(MPI_COMM_WORLD));
    const fc_impl_ops *tested = fc_impl_resolve(impl, &e);
    if (tested) tested = fc_impl_for(tested, &a.cfg, &e);
    if (!tested) die_all(rank, e.msg);
    const fc_impl_ops *expected = fc_impl_resolve(against, &e);
    if (!expected) die_all(rank, e.msg);

    fc_run_config tcfg = a.cfg, ecfg = a.cfg;
    ecfg.inject = FC_FAULT_NONE;
    fc_impl *ti = tested->create(&tcfg, MPI_COMM_WORLD, &e);
    if (!ti) die_all(rank, e.msg);
    fc_impl *ei = expected->create(&ecfg, MPI_COMM_WORLD, &e);
    if (!ei) {
        tested->destroy(ti);
        die_all(rank, e.msg);
    }
    // --load: both start from the checkpoint (parameters, optimizer state, the
    // step and so the data position), and the steps judged continue from it
    if (a.load_dir[0]) {
        fc_watchdog_mark(0, "load");
        const fc_impl_ops *ops[2] = {tested, expected};
        fc_impl *ims[2] = {ti, ei};
        for (int k = 0; k < 2; k++) {
            if (!ops[k]->load || !ops[k]->steps_done)
                fc_fail(&e, "implementation %s does not load checkpoints", ops[k]->name);
            else if (ops[k]->load(ims[k], a.load_dir, &e) == 0)
                continue;
            char msg[sizeof e.msg + 32];
            snprintf(msg, sizeof msg, "--load: %s", e.msg);  // the same on every rank
            tested->destroy(ti);  // refused: what the two created is released before MPI ends
            expected->destroy(ei);
            die_all(rank, msg);
        }
    }

    fc_model m;
    fc_model_build_run(&m, &a.cfg);
    const char *names[2];
    int n_state = fc_optim_state_names(&a.cfg.optim, names);
    full_set ts = {0}, es = {0};
    if (rank == 0) {
        full_set *sets[2] = {&ts, &es};
        for (int k = 0; k < 2; k++) {
            sets[k]->params = mallocCheck(m.numel * sizeof(float));
            sets[k]->prev = mallocCheck(m.numel * sizeof(float));
            sets[k]->grads = mallocCheck(m.numel * sizeof(float));
            for (int i = 0; i < n_state; i++) sets[k]->state[i] = mallocCheck(m.numel * sizeof(float));
        }
    }
    fc_cmp_policy policy;
    fc_cmp_policy_defaults(&policy, fc_cmp_precision(&ecfg, &tcfg));
    if (bitwise) fc_cmp_policy_bitwise(&policy);
    fc_cmp_ctx ctx = {&m, &policy, &tcfg, W, &ecfg.optim, &ecfg, W, fc_runner_act32(expected), fc_runner_act32(tested), 0, 0};
    // 16 bits: the magnitude pass of each step, on rank 0 (compare.h)
    fc_rerun mag;
    memset(&mag, 0, sizeof mag);
    float *mag_buf = NULL;
    if (rank == 0 && fc_cmp_policy_magnitudes(&policy)) {
        if (fc_magnitude_open(&mag, &ecfg, W, NULL, &e)) fc_die(FC_EXIT_USAGE, "check: the magnitude pass: %s", e.msg);
        mag_buf = mallocCheck(m.numel * sizeof(float));
    }
    // the parameters both start from (initial, or loaded)
    if (tested->export_full(ti, FC_EXPORT_PARAMS, ts.prev, 0, &e) || expected->export_full(ei, FC_EXPORT_PARAMS, es.prev, 0, &e))
        die_all(rank, e.msg);
    if (rank == 0 && !a.quiet)
        printf("fsdpcheck check: %s against %s, model %s, strategy %s (FSDP%d), W=%d, %d steps, each from the "
               "tested state (lockstep)\n", tested->name, expected->name, m.cfg.name, fc_strategy_name(a.cfg.strategy),
               a.cfg.fsdp_version, W,
               a.cfg.steps);
    char dir[256] = "";
    if (a.cfg.steps > 1) {
        fc_lockstep_dir(MPI_COMM_WORLD, dir, sizeof dir);
        if (!dir[0]) die_all(rank, "check: cannot create a directory for the lockstep state handover");
    }
    long first = expected->steps_done ? expected->steps_done(ei) : 0;
    int verdict = FC_EXIT_PASS;
    for (int t = 0; t < a.cfg.steps && verdict == FC_EXIT_PASS; t++) {
        fc_step_info ti_info, ei_info;
        fc_watchdog_mark(first + t, "step");
        if (tested->step(ti, &ti_info, &e)) die_all(rank, e.msg);
        if (t > 0) {  // the expected step starts from the tested state after step t - 1
            fc_watchdog_mark(first + t, "lockstep load");
            const float *const state[2] = {ts.state[0], ts.state[1]};
            if (fc_lockstep_handover(expected, ei, &ecfg, ts.prev, state, first + t, dir, MPI_COMM_WORLD, &e))
                die_all(rank, e.msg);
            if (rank == 0) memcpy(es.prev, ts.prev, m.numel * sizeof(float));
        }
        if (expected->step(ei, &ei_info, &e)) die_all(rank, e.msg);
        fc_watchdog_mark(first + t, "export");
        export_all(tested, ti, n_state, &ts, rank);
        export_all(expected, ei, n_state, &es, rank);
        if (rank == 0) {
            fc_trace_step sa = {.step = first + t, .loss = ei_info.loss, .has_norm = 1, .grad_norm = ei_info.grad_norm,
                                .grads = es.grads, .params = es.params, .prev_params = es.prev, .n_state = n_state};
            fc_trace_step sb = {.step = first + t, .loss = ti_info.loss, .has_norm = 1, .grad_norm = ti_info.grad_norm,
                                .grads = ts.grads, .params = ts.params, .prev_params = ts.prev, .n_state = n_state};
            for (int i = 0; i < n_state; i++) {
                sa.state_names[i] = sb.state_names[i] = names[i];
                sa.state[i] = es.state[i];
                sb.state[i] = ts.state[i];
            }
            if (mag_buf) {
                if (fc_magnitude_step(&mag, first + t, es.prev, (const float *const *)sa.state, mag_buf, &e))
                    fc_die(FC_EXIT_USAGE, "check: the magnitude pass of step %ld: %s", first + t, e.msg);
                sa.grad_mag = mag_buf;
            }
            fc_cmp_result r;
            fc_cmp_result_init(&r, first + t);
            fc_compare_add(&ctx, &sa, &sb, FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH), &r);
            if (!a.quiet || !r.pass)  // --quiet: the failing step and the verdict only
                printf("step %ld: loss %.6f vs %.6f  %s\n", first + t, (double)ti_info.loss, (double)ei_info.loss,
                       r.pass ? "pass" : "FAIL");
            if (!r.pass) {
                fc_cmp_print_policy(stdout, &policy);
                fc_cmp_print_header(stdout);
                fc_cmp_print_rows(stdout, &r);
                fc_cmp_print_divergence(stdout, &r.first);
                verdict = FC_EXIT_FAIL;
            }
            fc_cmp_result_free(&r);
            for (int k = 0; k < 2; k++) {  // this step's parameters are the next one's previous
                full_set *fs = k ? &ts : &es;
                float *tmp = fs->prev;
                fs->prev = fs->params;
                fs->params = tmp;
            }
        }
        mpiCheck(MPI_Bcast(&verdict, 1, MPI_INT, 0, MPI_COMM_WORLD));  // stop together
    }
    if (rank == 0) {
        printf("fsdpcheck check: %s\n", verdict == FC_EXIT_PASS ? "pass" : "FAIL (stopped at the first failing step)");
        fflush(stdout);
    }
    tested->destroy(ti);
    expected->destroy(ei);
    if (dir[0] && rank == 0) fc_remove_flat_dir(dir);
    free(mag_buf);
    fc_rerun_close(&mag);
    full_set *sets[2] = {&ts, &es};
    for (int k = 0; k < 2; k++) {
        free(sets[k]->params);
        free(sets[k]->prev);
        free(sets[k]->grads);
        free(sets[k]->state[0]);
        free(sets[k]->state[1]);
    }
    fc_model_free(&m);
    fc_watchdog_stop();
    MPI_Finalize();
    return verdict;
}
