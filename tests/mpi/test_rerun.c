// tests/mpi/test_rerun.c — the lockstep re-run's handover (oracle/rerun.c), on
// rank 0 (one process is all a re-run is; the other ranks only take part in
// the verdict).
//
// A re-run of the local reference takes the tested run's state in place
// (fc_reference_local_load) instead of through a FULL checkpoint file and the
// contract's load (fc_lockstep_handover), which every other re-run still uses.
// Both must start the step from the same state, so the step they then take
// must agree bit for bit: gradients, parameters, both optimizer states, loss
// and norm. The state handed over is crafted to tell the paths apart where
// they could differ: the step number is not 0 (AdamW's bias correction reads
// it), every value is nonzero, and a frozen parameter's state holds garbage,
// which a checkpoint does not carry (a frozen parameter has none: it loads as
// 0) and so neither may the state set in place. And the re-run's sets, lent in
// place (bufs NULL), equal the ones it exports.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "mpitest.h"
#include "rerun.h"
#include "runner.h"

#define STEP 3  // the global step number handed over: neither 0 nor 1

static int same_bits(const float *a, const float *b, size_t n, size_t *first) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) {
            *first = i;
            return 0;
        }
    return 1;
}

static void one_case(const char *what, fc_run_config c) {
    fc_error e;
    fc_model m;
    fc_model_build_run(&m, &c);
    size_t n = m.numel;
    float *params = mallocCheck(n * sizeof(float)), *st[2], *direct[4], *file[4];
    fc_init_full(&m, c.seed, params);
    for (int s = 0; s < 2; s++) {
        st[s] = mallocCheck(n * sizeof(float));
        // exp_avg / momentum: either sign; exp_avg_sq: positive
        for (size_t i = 0; i < n; i++) st[s][i] = s ? 1e-4f * (float)(1 + i % 7) : 1e-3f * (float)((int)(i % 11) - 5);
    }
    int n_frozen = 0;
    for (int p = 0; p < m.n_params; p++) n_frozen += m.params[p].frozen;
    for (int i = 0; i < 4; i++) direct[i] = callocCheck(n, sizeof(float)), file[i] = callocCheck(n, sizeof(float));
    const float *const state[2] = {st[0], st[1]};

    // in place: fc_rerun_step, into buffers (exported) and lent (bufs NULL)
    fc_rerun r;
    fc_trace_step a, lent;
    int rc = fc_rerun_open(&r, &c, 1, NULL, &e) || fc_rerun_step(&r, STEP, params, state, direct, &a, &e);
    MT_CHECK(!rc, "%s: re-run in place: %s", what, e.msg);
    if (!rc) {
        rc = fc_rerun_step(&r, STEP, params, state, NULL, &lent, &e);
        MT_CHECK(!rc, "%s: re-run lent: %s", what, e.msg);
        const float *sets[4] = {lent.grads, lent.params, lent.state[0], lent.state[1]};
        for (int i = 0; i < 2 + r.n_state && !rc; i++) {
            size_t at = 0;
            MT_CHECK(same_bits(direct[i], sets[i], n, &at), "%s: set %d lent differs from exported at %zu", what, i, at);
        }
        MT_CHECK(sets[1] != direct[1], "%s: the lent parameters are the caller's buffer", what);
    }
    // through the file: the handover every other re-run takes, into the same reference
    fc_step_info info = {0};
    if (!rc) {
        rc = fc_lockstep_handover(r.ops, r.im, &r.cfg, params, state, STEP, r.dir, MPI_COMM_SELF, &e) ||
             r.ops->step(r.im, &info, &e);
        for (int i = 0; i < 2 + r.n_state && !rc; i++)
            rc = r.ops->export_full(r.im, fc_step_set_exports[i], file[i], 0, &e);
        MT_CHECK(!rc, "%s: re-run through the checkpoint: %s", what, e.msg);
    }
    if (!rc) {
        static const char *names[4] = {"gradients", "parameters", "state 0", "state 1"};
        for (int i = 0; i < 2 + r.n_state; i++) {
            size_t at = 0;
            MT_CHECK(same_bits(direct[i], file[i], n, &at), "%s: %s in place %.9g, through the checkpoint %.9g at %zu",
                     what, names[i], direct[i][at], file[i][at], at);
        }
        MT_CHECK(!memcmp(&a.loss, &info.loss, sizeof a.loss), "%s: loss %.9g in place, %.9g through the checkpoint",
                 what, a.loss, info.loss);
        MT_CHECK(a.grad_norm == info.grad_norm, "%s: norm %.17g in place, %.17g through the checkpoint", what,
                 a.grad_norm, info.grad_norm);
        // the case is one: the state moved the step (not all zero), a frozen parameter's garbage was not carried
        size_t moved = 0;
        for (size_t i = 0; i < n && r.n_state; i++) moved += direct[2][i] != 0;
        MT_CHECK(r.n_state == 0 || moved > n / 2, "%s: %zu of %zu optimizer states nonzero after the step", what, moved,
                 n);
        for (int p = 0; p < m.n_params; p++)
            for (int s = 0; s < r.n_state && m.params[p].frozen; s++)
                MT_CHECK(direct[2 + s][m.params[p].offset] == 0, "%s: frozen %s carries state %d", what,
                         m.params[p].name, s);
    }
    if (c.freeze[0]) MT_CHECK(n_frozen > 0, "%s: --freeze '%s' froze nothing", what, c.freeze);
    fc_rerun_close(&r);
    for (int i = 0; i < 4; i++) free(direct[i]), free(file[i]);
    free(st[0]), free(st[1]), free(params);
    fc_model_free(&m);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    if (mt_rank() == 0) {
        fc_run_config c = mt_config("gpt2-tiny", FC_STRATEGY_FULL_SHARD, 1, 1);
        one_case("gpt2-tiny adamw", c);
        fc_run_config f = c;
        snprintf(f.freeze, sizeof f.freeze, "wte");
        f.clip_grad_norm = 0.5f;
        one_case("gpt2-tiny adamw, wte frozen, clipped", f);
        fc_run_config l = mt_config("llama-micro", FC_STRATEGY_FULL_SHARD, 1, 1);
        snprintf(l.freeze, sizeof l.freeze, "embed_tokens");
        one_case("llama-micro adamw, embed_tokens frozen", l);
        fc_run_config s = mt_config("mlp-tiny", FC_STRATEGY_FULL_SHARD, 1, 1);
        s.optim.kind = FC_OPT_SGD;
        s.optim.momentum = 0.9;
        one_case("mlp-tiny sgd momentum", s);
    }
    return mt_finalize();
}
