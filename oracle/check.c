// oracle/check.c — `mpiexec -n W fsdpcheck check --impl X [--against reference] [run flags]`.
//
// Runs the implementation under test and the one it is checked against in one
// MPI job, on the same communicator and config, one step at a time, in
// lockstep (docs/contract.md §8): before each step after the first, the expected
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
#include "flags.h"
#include "rerun.h"
#include "mpicheck.h"
#include "signature.h"
#include "optim.h"
#include "runner.h"
#include "watchdog.h"
#include "threads.h"

// Full tensors of one implementation after a step, on rank 0, and the
// parameters before it (the optimizer allowance of compare.h needs them).
typedef struct {
    float *params, *prev, *grads, *state[2];
    float *start[2], *prev_grads;  // the tested side's state before the step and its gradients of the step before
} full_set;

static void export_all(const fc_impl_ops *ops, fc_impl *im, int n_state, full_set *s, int rank) {
    fc_error e;
    if (ops->export_full(im, FC_EXPORT_PARAMS, s->params, 0, &e) ||
        ops->export_full(im, FC_EXPORT_GRADS, s->grads, 0, &e))
        fc_die_all(rank, "%s", e.msg);
    for (int i = 0; i < n_state; i++)
        if (ops->export_full(im, i ? FC_EXPORT_STATE1 : FC_EXPORT_STATE0, s->state[i], 0, &e))
            fc_die_all(rank, "%s", e.msg);
}

// One check: the two implementations side by side and what judges them.
typedef struct {
    int rank, W;
    fc_run_args a;
    int bitwise;
    const fc_impl_ops *tested, *expected;
    fc_run_config tcfg, ecfg;  // the tested one's (with --inject) and the expected one's
    fc_impl *ti, *ei;
    fc_model m;
    const char *names[2];
    int n_state;
    full_set ts, es;  // on rank 0
    fc_cmp_policy policy;
    fc_cmp_ctx ctx;
    fc_rerun mag;      // 16 bits: the magnitude pass of each step, on rank 0 (compare.h)
    float *mag_buf;    // [numel] or NULL
    char dir[256];     // the lockstep state handover's directory, "" for one step
    long first;        // the first step's number (after a --load)
} check_run;

// check's own flags (--impl, --against, --bitwise); the rest are run's flags.
static void parse_args(check_run *c, int argc, char **argv, const char **impl, const char **against) {
    enum { IMPL, AGAINST, BITWISE };
    static const fc_flag flags[] = {[IMPL] = {"--impl", FC_FLAG_VALUE}, [AGAINST] = {"--against", FC_FLAG_VALUE},
                                    [BITWISE] = {"--bitwise", FC_FLAG_SWITCH}};
    char **rest = callocCheck((size_t)argc + 1, sizeof *rest);
    int n = 0;
    fc_flags it = fc_flags_begin(argc, argv, flags, FC_FLAGS_COUNT(flags), NULL, FC_FLAGS_PASS);
    for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;) {
        if (id == IMPL && it.value) *impl = it.value;
        else if (id == AGAINST && it.value) *against = it.value;
        else if (id == BITWISE) c->bitwise = 1;
        else rest[n++] = (char *)it.arg;  // run's parser says what is wrong with a value flag left without one
    }
    if (!*impl) fc_die_all(c->rank, "check: --impl X is required (reference, or a port's PATH.so)");
    fc_error e;
    int rc = fc_cli_parse_run(n, rest, &c->a, &e);
    free(rest);
    if (rc == 1) fc_die_all(c->rank, "check: see fsdpcheck run --help for the config flags");
    if (rc) fc_die_all(c->rank, "%s", e.msg);
    if (fc_run_config_validate_world(&c->a.cfg, c->W, &e)) fc_die_all(c->rank, "%s", e.msg);
    // check compares in memory and writes nothing: run's output flags would
    // change nothing here, so they are refused rather than ignored
    const fc_run_args *a = &c->a;
    const char *writes = a->trace_dir[0] ? "--trace" : a->comm_log[0] ? "--comm-log" : a->save_dir[0] ? "--save" : NULL;
    if (writes)
        fc_die_all(c->rank, "check: %s is run's (check compares in memory and writes nothing): use fsdpcheck run %s",
                   writes, writes);
}

// --load: both start from the checkpoint (parameters, optimizer state, the
// step and so the data position), and the steps judged continue from it.
static void load_both(check_run *c) {
    fc_error e;
    fc_watchdog_mark(0, "load");
    const fc_impl_ops *ops[2] = {c->tested, c->expected};
    fc_impl *ims[2] = {c->ti, c->ei};
    for (int k = 0; k < 2; k++) {
        if (!ops[k]->load || !ops[k]->steps_done)
            fc_fail(&e, "implementation %s does not load checkpoints", ops[k]->name);
        else if (ops[k]->load(ims[k], c->a.load_dir, &e) == 0)
            continue;
        c->tested->destroy(c->ti);  // refused: what the two created is released before MPI ends
        c->expected->destroy(c->ei);
        fc_die_all(c->rank, "--load: %s", e.msg);  // the same on every rank
    }
}

// The watchdog, the threads, and both implementations created (and loaded).
static void start(check_run *c, const char *impl, const char *against) {
    fc_error e;
    if (fc_watchdog_start(MPI_COMM_WORLD, c->a.timeout, &e)) fc_die_all(c->rank, "%s", e.msg);
    fc_threads_setup(c->a.threads, fc_mpi_ranks_on_node(MPI_COMM_WORLD));
    c->tested = fc_impl_resolve(impl, &e);
    if (c->tested) c->tested = fc_impl_for(c->tested, &c->a.cfg, &e);
    if (!c->tested) fc_die_all(c->rank, "%s", e.msg);
    c->expected = fc_impl_resolve(against, &e);
    if (!c->expected) fc_die_all(c->rank, "%s", e.msg);
    c->tcfg = c->ecfg = c->a.cfg;
    c->ecfg.inject = FC_FAULT_NONE;
    c->ti = c->tested->create(&c->tcfg, MPI_COMM_WORLD, &e);
    if (!c->ti) fc_die_all(c->rank, "%s", e.msg);
    c->ei = c->expected->create(&c->ecfg, MPI_COMM_WORLD, &e);
    if (!c->ei) {
        c->tested->destroy(c->ti);
        fc_die_all(c->rank, "%s", e.msg);
    }
    if (c->a.load_dir[0]) load_both(c);
}

// Rank 0's full sets, the policy and the context that judge every step.
static void prepare_judging(check_run *c) {
    fc_error e;
    fc_model_build_run(&c->m, &c->a.cfg);
    c->n_state = fc_optim_state_names(&c->a.cfg.optim, c->names);
    if (c->rank == 0) {
        full_set *sets[2] = {&c->ts, &c->es};
        for (int k = 0; k < 2; k++) {
            sets[k]->params = mallocCheck(c->m.numel * sizeof(float));
            sets[k]->prev = mallocCheck(c->m.numel * sizeof(float));
            sets[k]->grads = mallocCheck(c->m.numel * sizeof(float));
            for (int i = 0; i < c->n_state; i++) sets[k]->state[i] = mallocCheck(c->m.numel * sizeof(float));
        }
        // a failure's signature (signature.h) starts where the step did: zero state, or the checkpoint's
        for (int i = 0; i < c->n_state; i++) c->ts.start[i] = callocCheck(c->m.numel, sizeof(float));
        c->ts.prev_grads = mallocCheck(c->m.numel * sizeof(float));
    }
    fc_cmp_policy_defaults(&c->policy, fc_cmp_precision(&c->ecfg, &c->tcfg));
    if (c->bitwise) fc_cmp_policy_bitwise(&c->policy);
    c->ctx = (fc_cmp_ctx){&c->m, &c->policy, &c->tcfg, c->W, &c->ecfg.optim, &c->ecfg, c->W,
                          fc_runner_act32(c->expected), fc_runner_act32(c->tested), 0, 0};
    if (c->rank == 0 && fc_cmp_policy_magnitudes(&c->policy)) {
        if (fc_magnitude_open(&c->mag, &c->ecfg, c->W, NULL, &e))
            fc_die(FC_EXIT_USAGE, "check: the magnitude pass: %s", e.msg);
        c->mag_buf = mallocCheck(c->m.numel * sizeof(float));
    }
    // the parameters both start from (initial, or loaded)
    if (c->tested->export_full(c->ti, FC_EXPORT_PARAMS, c->ts.prev, 0, &e) ||
        c->expected->export_full(c->ei, FC_EXPORT_PARAMS, c->es.prev, 0, &e))
        fc_die_all(c->rank, "%s", e.msg);
    for (int i = 0; i < c->n_state && c->a.load_dir[0]; i++)  // the checkpoint's state, as the expected side read it
        if (c->expected->export_full(c->ei, i ? FC_EXPORT_STATE1 : FC_EXPORT_STATE0, c->ts.start[i], 0, &e))
            fc_die_all(c->rank, "%s", e.msg);
}

// Rank 0 judges step t from both implementations' exported sets: the verdict.
static int judge_step(check_run *c, long step, const fc_step_info *ti_info, const fc_step_info *ei_info) {
    full_set *ts = &c->ts, *es = &c->es;
    fc_trace_step sa = {.step = step, .loss = ei_info->loss, .has_norm = 1, .grad_norm = ei_info->grad_norm,
                        .grads = es->grads, .params = es->params, .prev_params = es->prev, .n_state = c->n_state};
    fc_trace_step sb = {.step = step, .loss = ti_info->loss, .has_norm = 1, .grad_norm = ti_info->grad_norm,
                        .grads = ts->grads, .params = ts->params, .prev_params = ts->prev, .n_state = c->n_state};
    for (int i = 0; i < c->n_state; i++) {
        sa.state_names[i] = sb.state_names[i] = c->names[i];
        sa.state[i] = es->state[i];
        sb.state[i] = ts->state[i];
    }
    fc_error e;
    if (c->mag_buf) {
        if (fc_magnitude_step(&c->mag, step, es->prev, (const float *const *)sa.state, c->mag_buf, &e))
            fc_die(FC_EXIT_USAGE, "check: the magnitude pass of step %ld: %s", step, e.msg);
        sa.grad_mag = c->mag_buf;
    }
    fc_cmp_result r;
    fc_cmp_result_init(&r, step);
    fc_compare_add(&c->ctx, &sa, &sb, FC_CMP_ALL & ~FC_CMP_MASK(FC_CMP_BATCH), &r);
    if (!c->a.quiet || !r.pass)  // --quiet: the failing step and the verdict only
        printf("step %ld: loss %.6f vs %.6f  %s\n", step, (double)ti_info->loss, (double)ei_info->loss,
               r.pass ? "pass" : "FAIL");
    int verdict = FC_EXIT_PASS;
    if (!r.pass) {
        fc_cmp_print_policy(stdout, &c->policy);
        fc_cmp_print_header(stdout);
        fc_cmp_print_rows(stdout, &r);
        fc_cmp_print_divergence(stdout, &r.first);
        fc_sig_input in = {&c->m, &c->tcfg, c->W, &c->ctx, &r, &sa, &sb, {ts->start[0], ts->start[1]},
                           step > c->first ? ts->prev_grads : NULL, NULL, 1};
        fc_signature sig;
        fc_signature_find(&in, &sig);
        fc_signature_print(stdout, &sig);
        verdict = FC_EXIT_FAIL;
    }
    fc_cmp_result_free(&r);
    for (int k = 0; k < 2; k++) {  // this step's parameters are the next one's previous
        full_set *fs = k ? ts : es;
        float *tmp = fs->prev;
        fs->prev = fs->params;
        fs->params = tmp;
    }
    return verdict;
}

// Step t of both, the expected one from the tested state after step t - 1: the verdict, on every rank.
static int run_step(check_run *c, int t) {
    fc_step_info ti_info, ei_info;
    fc_error e;
    long step = c->first + t;
    fc_watchdog_mark(step, "step");
    if (c->tested->step(c->ti, &ti_info, &e)) fc_die_all(c->rank, "%s", e.msg);
    if (t > 0) {
        fc_watchdog_mark(step, "lockstep load");
        const float *const state[2] = {c->ts.state[0], c->ts.state[1]};
        if (fc_lockstep_handover(c->expected, c->ei, &c->ecfg, c->ts.prev, state, step, c->dir, MPI_COMM_WORLD, &e))
            fc_die_all(c->rank, "%s", e.msg);
        if (c->rank == 0) memcpy(c->es.prev, c->ts.prev, c->m.numel * sizeof(float));
    }
    if (c->expected->step(c->ei, &ei_info, &e)) fc_die_all(c->rank, "%s", e.msg);
    fc_watchdog_mark(step, "export");
    if (c->rank == 0 && t > 0) {  // what this step started from, before the export overwrites it
        for (int i = 0; i < c->n_state; i++) memcpy(c->ts.start[i], c->ts.state[i], c->m.numel * sizeof(float));
        memcpy(c->ts.prev_grads, c->ts.grads, c->m.numel * sizeof(float));
    }
    export_all(c->tested, c->ti, c->n_state, &c->ts, c->rank);
    export_all(c->expected, c->ei, c->n_state, &c->es, c->rank);
    int verdict = c->rank == 0 ? judge_step(c, step, &ti_info, &ei_info) : FC_EXIT_PASS;
    mpiCheck(MPI_Bcast(&verdict, 1, MPI_INT, 0, MPI_COMM_WORLD));  // stop together
    return verdict;
}

static void finish(check_run *c) {
    c->tested->destroy(c->ti);
    c->expected->destroy(c->ei);
    if (c->dir[0] && c->rank == 0) fc_remove_flat_dir(c->dir);
    free(c->mag_buf);
    fc_rerun_close(&c->mag);
    full_set *sets[2] = {&c->ts, &c->es};
    for (int k = 0; k < 2; k++) {
        free(sets[k]->params);
        free(sets[k]->prev);
        free(sets[k]->grads);
        free(sets[k]->state[0]);
        free(sets[k]->state[1]);
        free(sets[k]->start[0]);
        free(sets[k]->start[1]);
        free(sets[k]->prev_grads);
    }
    fc_model_free(&c->m);
    fc_watchdog_stop();
    MPI_Finalize();
}

int fc_cmd_check(int argc, char **argv) {
    mpiCheck(MPI_Init(NULL, NULL));
    check_run run = {0}, *c = &run;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &c->W));
    const char *impl = NULL, *against = "reference";
    parse_args(c, argc, argv, &impl, &against);
    start(c, impl, against);
    prepare_judging(c);
    const fc_run_config *cfg = &c->a.cfg;
    if (c->rank == 0 && !c->a.quiet)
        printf("fsdpcheck check: %s against %s, model %s, strategy %s (FSDP%d), W=%d, %d steps, each from the "
               "tested state (lockstep)\n", c->tested->name, c->expected->name, c->m.cfg.name,
               fc_strategy_name(cfg->strategy), cfg->fsdp_version, c->W, cfg->steps);
    if (cfg->steps > 1) {
        fc_lockstep_dir(MPI_COMM_WORLD, c->dir, sizeof c->dir);
        if (!c->dir[0]) fc_die_all(c->rank, "check: cannot create a directory for the lockstep state handover");
    }
    c->first = c->expected->steps_done ? c->expected->steps_done(c->ei) : 0;
    int verdict = FC_EXIT_PASS;
    for (int t = 0; t < cfg->steps && verdict == FC_EXIT_PASS; t++) verdict = run_step(c, t);
    if (c->rank == 0) {
        printf("fsdpcheck check: %s\n", verdict == FC_EXIT_PASS ? "pass" : "FAIL (stopped at the first failing step)");
        fflush(stdout);
    }
    finish(c);
    return verdict;
}
