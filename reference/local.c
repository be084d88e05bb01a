// reference/local.c — see local.h.
#include "local.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_collective.h"
#include "clip.h"
#include "init.h"
#include "layout.h"
#include "optim.h"
#include "weights.h"

int RN(fc_local_create)(fc_local *L, const fc_run_config *cfg, fc_error *e) {
    memset(L, 0, sizeof *L);
    if (fc_run_config_validate(cfg, e) || fc_run_config_validate_world(cfg, 1, e)) return -1;
    L->cfg = *cfg;
    fc_model_build_run(&L->model, cfg);
    size_t n = L->model.numel;
    int T = fc_model_has_tokens(&cfg->model) ? cfg->seq_len : 0;
    int micro = cfg->global_batch / cfg->grad_accum;
    size_t an = RN(fc_acts_numel)(&L->model, micro, T);
    // A configuration that cannot fit is bad input, not an out-of-memory crash.
    double need = ((double)n * (2 + 2) + (double)an) * sizeof(float);
    double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (have > 0 && need > have) {
        fc_model_free(&L->model);
        return fc_fail(e, "this run needs %.1f GiB of memory (B=%d, T=%d) but the machine has %.1f GiB",
                       need / (1 << 30), micro, T, have / (1 << 30));
    }
    L->params = mallocCheck(n * sizeof(float));
    if (cfg->init_path[0]) {
        if (fc_weights_load(&L->model, cfg->init_path, L->params, e)) {
            RN(fc_local_free)(L);
            return -1;
        }
    } else {
        fc_init_full(&L->model, cfg->seed, L->params);
    }
    L->grads = callocCheck(n, sizeof(float));
    L->n_state = fc_optim_state_names(&cfg->optim, L->state_names);
    for (int i = 0; i < L->n_state; i++) L->state[i] = callocCheck(n, sizeof(float));
    fc_batch_alloc(&L->batch, &cfg->model, cfg->global_batch, T);
    return 0;
}

// Elements of a parameter clipped at a time: the update is element-wise, so
// chunks of it change no bit, and a clipped copy of the gradients is not kept.
#define CLIP_CHUNK ((size_t)1 << 18)

// The optimizer step of the trainable parameters with the gradients, each
// times *coef (a float multiply) where coef is not NULL.
static void step_clipped(fc_local *L, const float *coef) {
    const fc_optim_config *oc = &L->cfg.optim;
    float *buf = coef ? mallocCheck(CLIP_CHUNK * sizeof(float)) : NULL;
    for (int i = 0; i < L->model.n_params; i++) {
        const fc_param *p = &L->model.params[i];
        if (p->frozen) continue;
        for (size_t o = p->offset, end = p->offset + p->numel; o < end; o += CLIP_CHUNK) {
            size_t k = end - o < CLIP_CHUNK ? end - o : CLIP_CHUNK;
            const float *g = L->grads + o;
            if (coef) {
                for (size_t j = 0; j < k; j++) buf[j] = g[j] * *coef;
                g = buf;
            }
            fc_optim_update(oc, L->step, L->params + o, g, L->state[0] ? L->state[0] + o : NULL,
                            L->state[1] ? L->state[1] + o : NULL, k);
        }
    }
    free(buf);
}

void RN(fc_local_step)(fc_local *L) {
    const fc_run_config *c = &L->cfg;
    size_t n = L->model.numel;
    int K = c->grad_accum, micro = c->global_batch / K;
    int T = fc_model_has_tokens(&c->model) ? c->seq_len : 0;
    if (!L->act_mem) {  // the first step, or the first since fc_local_drop_acts
        L->act_mem = mallocCheck(RN(fc_acts_numel)(&L->model, micro, T) * sizeof(float));
        RN(fc_acts_init)(&L->acts, &L->model, micro, T, L->act_mem);
    }
    fc_data_fill(&L->batch, &c->model, c->seed, L->step, 0);
    memset(L->grads, 0, n * sizeof(float));
    // Each micro-batch's loss is the mean over its rows, scaled by 1/K, so K
    // micro-batches add up to the mean over the whole batch (docs/contract.md §4).
    double loss = 0;
    for (int k = 0; k < K; k++) {
        fc_batch mb = fc_batch_slice(&L->batch, k * micro, micro);
        float l = RN(fc_model_forward)(&L->model, L->params, &mb, &L->acts);
        RN(fc_model_backward)(&L->model, L->params, &mb, &L->acts, L->grads, 1.0f / (float)L->acts.NT / (float)K);
        loss += l;
    }
    L->loss = (float)(loss / K);
    // FSDP2's set_gradient_divide_factor (config.h): one rank whose mean is the
    // whole batch's, divided by F as the data-parallel engines divide the
    // sum of their ranks' means (pre before the sum, post after it)
    if (c->gradient_divide_factor > 0) {
        double pre, post;
        fc_divide_factors(c->divide, fc_divide_by(c, 1), &pre, &post);
        for (size_t i = 0; i < n; i++) L->grads[i] = L->grads[i] / (float)pre / (float)post;
    }
    // A frozen parameter has no gradient (docs/contract.md §2): none is kept, so none is
    // normed or stepped. The magnitude pass keeps its magnitudes: its layer's
    // outputs still round, which the loss's allowance counts (oracle/compare_model.c).
#ifndef FC_MAGNITUDE
    for (int i = 0; i < L->model.n_params && L->model.n_frozen; i++)
        if (L->model.params[i].frozen) memset(L->grads + L->model.params[i].offset, 0, L->model.params[i].numel * sizeof(float));
#endif
    // clip_grad_norm: coefficient max_norm / (total + 1e-6), clamped to 1.
    L->grad_norm = fc_grad_norm(L->grads, n, c->norm_type);
    float coef = fc_clip_coef(c->clip_grad_norm, L->grad_norm);
    L->step++;
    step_clipped(L, fc_clip_applies(c->clip_grad_norm, coef) ? &coef : NULL);
}

void RN(fc_local_drop_acts)(fc_local *L) {
    free(L->act_mem);
    L->act_mem = NULL;
}

void RN(fc_local_free)(fc_local *L) {
    free(L->act_mem);
    free(L->params);
    free(L->grads);
    for (int i = 0; i < 2; i++) free(L->state[i]);
    fc_batch_free(&L->batch);
    fc_model_free(&L->model);
    memset(L, 0, sizeof *L);
}

// Checkpoints of the one-process trainer: the core protocol on MPI_COMM_SELF,
// one rank holding every unit whole (a SHARDED save is one file).
static void ckpt_view(fc_local *L, fc_ckpt_unit_view *units, fc_ckpt_rank_view *v) {
    const fc_model *m = &L->model;
    for (int u = 0; u < m->n_units; u++) {
        size_t off = m->units[u].offset, n = m->units[u].numel;
        units[u] = (fc_ckpt_unit_view){n, 0, n, n, 1, L->params + off,
                                       {L->state[0] ? L->state[0] + off : NULL, L->state[1] ? L->state[1] + off : NULL},
                                       NULL, 0, 0};
    }
    *v = (fc_ckpt_rank_view){MPI_COMM_SELF, &L->cfg, m, FC_STRATEGY_LOCAL, L->step, 1, units, 0};
}

int RN(fc_local_save)(fc_local *L, const char *dir, fc_state_dict kind, fc_error *e) {
    fc_ckpt_unit_view *units = callocCheck((size_t)L->model.n_units, sizeof *units);
    fc_ckpt_rank_view v;
    ckpt_view(L, units, &v);
    int rc = fc_ckpt_save_collective(&v, dir, kind, e);
    free(units);
    return rc;
}

// Elements of the parameters copied between releases of the source's pages.
#define SET_CHUNK ((size_t)1 << 22)

void RN(fc_local_set)(fc_local *L, const float *params, const float *const state[2], long step,
                      fc_release_fn release, const void *arg) {
    const fc_model *m = &L->model;
    for (size_t o = 0; o < m->numel; o += SET_CHUNK) {
        size_t k = m->numel - o < SET_CHUNK ? m->numel - o : SET_CHUNK;
        memcpy(L->params + o, params + o, k * sizeof(float));
        if (release) release(arg, params + o, k);
    }
    for (int s = 0; s < L->n_state; s++)
        for (int i = 0; i < m->n_params; i++) {
            const fc_param *p = &m->params[i];
            float *dst = L->state[s] + p->offset;
            if (p->frozen) {
                memset(dst, 0, p->numel * sizeof(float));
                continue;
            }
            memcpy(dst, state[s] + p->offset, p->numel * sizeof(float));
            if (release) release(arg, state[s] + p->offset, p->numel);
        }
    L->step = step;
}

float RN(fc_local_piece_grad)(fc_local *L, long step, int first, int n, float *out) {
    const fc_run_config *c = &L->cfg;
    const fc_model *m = &L->model;
    int T = fc_model_has_tokens(&c->model) ? c->seq_len : 0;
    fc_batch b;
    fc_batch_alloc(&b, &c->model, n, T);
    fc_data_fill(&b, &c->model, c->seed, step, first);
    size_t an = RN(fc_acts_numel)(m, n, T);
    real *mem = mallocCheck(an * sizeof(real));
    RN(fc_acts) a;
    RN(fc_acts_init)(&a, m, n, T, mem);
    memset(out, 0, m->numel * sizeof(float));
    float loss = RN(fc_model_forward)(m, L->params, &b, &a);
    RN(fc_model_backward)(m, L->params, &b, &a, out, 1.0f / (float)a.NT);
    for (int i = 0; i < m->n_params && m->n_frozen; i++)
        if (m->params[i].frozen) memset(out + m->params[i].offset, 0, m->params[i].numel * sizeof(float));
    free(mem);
    fc_batch_free(&b);
    return loss;
}

int RN(fc_local_load)(fc_local *L, const char *dir, fc_error *e) {
    fc_ckpt_unit_view *units = callocCheck((size_t)L->model.n_units, sizeof *units);
    fc_ckpt_rank_view v;
    ckpt_view(L, units, &v);
    long step = 0;
    int rc = fc_ckpt_load_collective(&v, dir, NULL, NULL, &step, e);
    free(units);
    if (rc == 0) L->step = step;
    return rc;
}
