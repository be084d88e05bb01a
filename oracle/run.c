// oracle/run.c — `fsdpcheck run`: train and (optionally) write the trace.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "local.h"
#include "trace.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int fc_cmd_run(int argc, char **argv) {
    fc_run_args a;
    fc_error e;
    int rc = fc_cli_parse_run(argc, argv, &a, &e);
    if (rc == 1) {
        fc_cli_usage(stdout);
        return FC_EXIT_PASS;
    }
    if (rc) fc_die(FC_EXIT_USAGE, "%s", e.msg);

    fc_local L;
    if (fc_local_create(&L, &a.cfg, &e)) fc_die(FC_EXIT_USAGE, "%s", e.msg);
    const fc_model *m = &L.model;
    fc_trace_writer tw;
    int tracing = a.trace_dir[0] != '\0';
    if (tracing && fc_trace_begin(&tw, a.trace_dir, m, L.params, &e)) {
        fc_local_free(&L);
        fc_die(FC_EXIT_USAGE, "--trace: %s", e.msg);
    }
    if (!a.quiet)
        printf("fsdpcheck run: model %s (%zu parameters, %d units), strategy %s, W=1, "
               "B=%d, steps %d, %s\n",
               m->cfg.name, m->numel, m->n_units, fc_strategy_name(a.cfg.strategy),
               a.cfg.global_batch, a.cfg.steps, fc_opt_name(a.cfg.optim.kind));
    for (int t = 0; t < a.cfg.steps; t++) {
        double t0 = now_ms();
        fc_local_step(&L);
        double ms = now_ms() - t0;
        if (!a.quiet) printf("step %d: loss %.6f  grad-norm %.6g  (%.1f ms)\n", t, L.loss, L.grad_norm, ms);
        if (tracing) {
            fc_trace_step s = {.step = t, .loss = L.loss, .batch = &L.batch, .grads = L.grads,
                               .params = L.params, .n_state = L.n_state};
            for (int i = 0; i < L.n_state; i++) {
                s.state_names[i] = L.state_names[i];
                s.state[i] = L.state[i];
            }
            if (fc_trace_write_step(&tw, &s, &e)) {
                fc_trace_abort(&tw);
                fc_local_free(&L);
                fc_die(FC_EXIT_USAGE, "--trace: %s", e.msg);
            }
        }
    }
    if (tracing) {
        if (fc_trace_finish(&tw, &a.cfg, 1, &e)) {
            fc_trace_abort(&tw);
            fc_local_free(&L);
            fc_die(FC_EXIT_USAGE, "--trace: %s", e.msg);
        }
        if (!a.quiet) printf("trace written to %s\n", a.trace_dir);
    }
    fc_local_free(&L);
    return FC_EXIT_PASS;
}
