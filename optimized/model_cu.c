// optimized/model_cu.c — see model_cu.h. The reference's stages
// (reference/forward.c), one kernel per layer operation, in its order, with
// its gradient flow: every backward accumulates (+=), the activation
// gradients are cleared once per micro-batch (at the first forward stage,
// since the last forward stage already writes the logits' gradient).
//
// Matmul shapes (row-major, kernels.h's fck_matmul):
//   Conv1D (gpt2, w [K,N]):      out = inp w;      dinp += dout w^T;  dw += inp^T dout
//   nn.Linear / tied head ([N,K]): out = inp w^T;  dinp += dout w;    dw += dout^T inp
#include "model_cu.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

typedef struct {
    size_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
} block_params;  // element offsets inside the block's unit

struct fc_cu_model {
    const fc_model *m;
    fc_cu_acts L;    // the layout
    char *acts;      // [half] activations
    char *grads;     // [half] their gradients
    fc_prec p;
    size_t esz;
    fck_mm *mm;
    // parameter offsets (elements) inside their unit
    block_params *blk;  // [n_layer] gpt2
    size_t wte, wpe, lnf_w, lnf_b;  // gpt2 root unit
    size_t *mlp_w, *mlp_b;          // [n_layers] mlp
};

static size_t off_of(const fc_model *m, const char *name) {
    return m->params[fc_model_param_index(m, "%s", name)].unit_offset;
}

static size_t block_off(const fc_model *m, int l, const char *what) {
    char name[96];
    snprintf(name, sizeof name, "transformer.h.%d.%s", l, what);
    return off_of(m, name);
}

fc_cu_model *fc_cu_model_create(const fc_model *m, const fc_cu_acts *layout, void *acts, fc_prec p, fck_mm *mm) {
    fc_cu_model *cm = callocCheck(1, sizeof *cm);
    cm->m = m;
    cm->L = *layout;  // shares the offset arrays with the caller's layout
    cm->acts = acts;
    cm->grads = (char *)acts + layout->half;
    cm->p = p;
    cm->esz = p == FC_PREC_FP32 ? 4 : 2;
    cm->mm = mm;
    const fc_model_config *c = &m->cfg;
    if (c->kind == FC_MODEL_GPT2) {
        cm->blk = callocCheck((size_t)c->n_layer, sizeof *cm->blk);
        for (int l = 0; l < c->n_layer; l++) {
            block_params *b = &cm->blk[l];
            b->ln1_w = block_off(m, l, "ln_1.weight");
            b->ln1_b = block_off(m, l, "ln_1.bias");
            b->attn_w = block_off(m, l, "attn.c_attn.weight");
            b->attn_b = block_off(m, l, "attn.c_attn.bias");
            b->proj_w = block_off(m, l, "attn.c_proj.weight");
            b->proj_b = block_off(m, l, "attn.c_proj.bias");
            b->ln2_w = block_off(m, l, "ln_2.weight");
            b->ln2_b = block_off(m, l, "ln_2.bias");
            b->fc_w = block_off(m, l, "mlp.c_fc.weight");
            b->fc_b = block_off(m, l, "mlp.c_fc.bias");
            b->mproj_w = block_off(m, l, "mlp.c_proj.weight");
            b->mproj_b = block_off(m, l, "mlp.c_proj.bias");
        }
        cm->wte = off_of(m, "transformer.wte.weight");
        cm->wpe = off_of(m, "transformer.wpe.weight");
        cm->lnf_w = off_of(m, "transformer.ln_f.weight");
        cm->lnf_b = off_of(m, "transformer.ln_f.bias");
    } else {
        cm->mlp_w = callocCheck((size_t)c->n_layers, sizeof(size_t));
        cm->mlp_b = callocCheck((size_t)c->n_layers, sizeof(size_t));
        for (int l = 0; l < c->n_layers; l++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.weight", l);
            cm->mlp_w[l] = off_of(m, name);
            snprintf(name, sizeof name, "layers.%d.bias", l);
            cm->mlp_b[l] = off_of(m, name);
        }
    }
    return cm;
}

void fc_cu_model_destroy(fc_cu_model *cm) {
    if (!cm) return;
    free(cm->blk);
    free(cm->mlp_w);
    free(cm->mlp_b);
    free(cm);
}

const float *fc_cu_losses(const fc_cu_model *cm) { return (const float *)(cm->acts + cm->L.losses); }

// activation / gradient at a layout offset; parameter / gradient of unit u
#define ACT(off) ((void *)(cm->acts + (off)))
#define GRD(off) ((void *)(cm->grads + (off)))
#define FACT(off) ((float *)(cm->acts + (off)))
#define PRM(u, off) ((void *)((char *)up[u] + (off) * cm->esz))
#define PGR(u, off) ((void *)((char *)ug[u] + (off) * cm->esz))

// out [M,N] = inp [M,K] w (+ bias): w is [K,N] (Conv1D, kn = 1) or [N,K] (Linear)
static void linear_forward(fc_cu_model *cm, void *out, const void *inp, const void *w, const void *bias, int M, int K,
                           int N, int kn, cudaStream_t st) {
    fck_matmul(cm->mm, out, inp, w, bias, M, N, K, 0, !kn, 0, cm->p, st);
}

// dinp [M,K] += dout w^T (or dout w); dw += inp^T dout (or dout^T inp); dbias [N] += colsum dout
static void linear_backward(fc_cu_model *cm, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                            const void *w, int M, int K, int N, int kn, cudaStream_t st) {
    if (dinp) fck_matmul(cm->mm, dinp, dout, w, NULL, M, K, N, 0, kn, 1, cm->p, st);
    if (dw) {
        if (kn)
            fck_matmul(cm->mm, dw, inp, dout, NULL, K, N, M, 1, 0, 1, cm->p, st);  // dw [K,N] = inp^T dout
        else
            fck_matmul(cm->mm, dw, dout, inp, NULL, N, K, M, 1, 0, 1, cm->p, st);  // dw [N,K] = dout^T inp
    }
    if (dbias) fck_bias_backward(dbias, dout, M, N, cm->p, st);
}

// ---------------------------------------------------------------------------
// mlp

static void mlp_forward(fc_cu_model *cm, int l, void *const *up, const fc_cu_batch *b, float scale, cudaStream_t st) {
    const fc_model_config *c = &cm->m->cfg;
    int B = cm->L.B, in = c->dims[l], out = c->dims[l + 1], u = l;
    const void *x = l == 0 ? ACT(cm->L.x0) : ACT(cm->L.mlp_y[l - 1]);  // [B, in]
    if (l == 0) fck_cast(ACT(cm->L.x0), cm->p, b->features, (size_t)B * in, st);
    void *h = ACT(cm->L.mlp_h[l]);  // [B, out]
    linear_forward(cm, h, x, PRM(u, cm->mlp_w[l]), PRM(u, cm->mlp_b[l]), B, in, out, 0, st);
    if (l < c->n_layers - 1)
        fck_gelu_forward(ACT(cm->L.mlp_y[l]), h, (size_t)B * out, cm->p, st);
    else
        fck_classifier(FACT(cm->L.losses), GRD(cm->L.mlp_h[l]), h, b->target, B, out, scale, cm->p, st);
}

static void mlp_backward(fc_cu_model *cm, int l, void *const *up, void *const *ug, cudaStream_t st) {
    const fc_model_config *c = &cm->m->cfg;
    int B = cm->L.B, in = c->dims[l], out = c->dims[l + 1], u = l;
    void *dh = GRD(cm->L.mlp_h[l]);  // [B, out]; the last layer's came from the classifier
    if (l < c->n_layers - 1) fck_gelu_backward(dh, ACT(cm->L.mlp_h[l]), GRD(cm->L.mlp_y[l]), (size_t)B * out, cm->p, st);
    const void *x = l == 0 ? ACT(cm->L.x0) : ACT(cm->L.mlp_y[l - 1]);
    void *dx = l == 0 ? NULL : GRD(cm->L.mlp_y[l - 1]);  // no gradient w.r.t. the data
    linear_backward(cm, dx, PGR(u, cm->mlp_w[l]), PGR(u, cm->mlp_b[l]), dh, x, PRM(u, cm->mlp_w[l]), B, in, out, 0, st);
}

// ---------------------------------------------------------------------------
// gpt2

static void block_forward(fc_cu_model *cm, int l, int u, void *const *up, cudaStream_t st) {
    const fc_model_config *c = &cm->m->cfg;
    int B = cm->L.B, T = cm->L.T, NT = cm->L.NT, C = c->n_embd, NH = c->n_head;
    const fc_cu_block_off *v = &cm->L.blk[l];
    const block_params *w = &cm->blk[l];
    void *res = l == 0 ? ACT(cm->L.encoded) : ACT(cm->L.blk[l - 1].res3);  // [NT, C]
    size_t n = (size_t)NT * C;
    fck_layernorm_forward(ACT(v->ln1), FACT(v->ln1_mean), FACT(v->ln1_rstd), res, PRM(u, w->ln1_w), PRM(u, w->ln1_b), NT,
                          C, c->layer_norm_epsilon, cm->p, st);
    linear_forward(cm, ACT(v->qkv), ACT(v->ln1), PRM(u, w->attn_w), PRM(u, w->attn_b), NT, C, 3 * C, 1, st);
    fck_attention_forward(ACT(v->atty), ACT(v->att), ACT(v->qkv), B, T, C, NH, cm->p, st);
    linear_forward(cm, ACT(v->attproj), ACT(v->atty), PRM(u, w->proj_w), PRM(u, w->proj_b), NT, C, C, 1, st);
    fck_residual(ACT(v->res2), res, ACT(v->attproj), n, cm->p, st);
    fck_layernorm_forward(ACT(v->ln2), FACT(v->ln2_mean), FACT(v->ln2_rstd), ACT(v->res2), PRM(u, w->ln2_w),
                          PRM(u, w->ln2_b), NT, C, c->layer_norm_epsilon, cm->p, st);
    linear_forward(cm, ACT(v->fch), ACT(v->ln2), PRM(u, w->fc_w), PRM(u, w->fc_b), NT, C, 4 * C, 1, st);
    fck_gelu_forward(ACT(v->fch_gelu), ACT(v->fch), n * 4, cm->p, st);
    linear_forward(cm, ACT(v->fcproj), ACT(v->fch_gelu), PRM(u, w->mproj_w), PRM(u, w->mproj_b), NT, 4 * C, C, 1, st);
    fck_residual(ACT(v->res3), ACT(v->res2), ACT(v->fcproj), n, cm->p, st);
}

static void block_backward(fc_cu_model *cm, int l, int u, void *const *up, void *const *ug, cudaStream_t st) {
    const fc_model_config *c = &cm->m->cfg;
    int B = cm->L.B, T = cm->L.T, NT = cm->L.NT, C = c->n_embd, NH = c->n_head;
    const fc_cu_block_off *v = &cm->L.blk[l];
    const block_params *w = &cm->blk[l];
    void *res = l == 0 ? ACT(cm->L.encoded) : ACT(cm->L.blk[l - 1].res3);
    void *dres = l == 0 ? GRD(cm->L.encoded) : GRD(cm->L.blk[l - 1].res3);
    size_t n = (size_t)NT * C;
    // res3 = res2 + fcproj: the gradient flows unchanged into both
    fck_residual(GRD(v->res2), GRD(v->res2), GRD(v->res3), n, cm->p, st);
    fck_residual(GRD(v->fcproj), GRD(v->fcproj), GRD(v->res3), n, cm->p, st);
    linear_backward(cm, GRD(v->fch_gelu), PGR(u, w->mproj_w), PGR(u, w->mproj_b), GRD(v->fcproj), ACT(v->fch_gelu),
                    PRM(u, w->mproj_w), NT, 4 * C, C, 1, st);
    fck_gelu_backward(GRD(v->fch), ACT(v->fch), GRD(v->fch_gelu), n * 4, cm->p, st);
    linear_backward(cm, GRD(v->ln2), PGR(u, w->fc_w), PGR(u, w->fc_b), GRD(v->fch), ACT(v->ln2), PRM(u, w->fc_w), NT, C,
                    4 * C, 1, st);
    fck_layernorm_backward(GRD(v->res2), PGR(u, w->ln2_w), PGR(u, w->ln2_b), GRD(v->ln2), ACT(v->res2), PRM(u, w->ln2_w),
                           FACT(v->ln2_mean), FACT(v->ln2_rstd), NT, C, cm->p, st);
    // res2 = res + attproj
    fck_residual(dres, dres, GRD(v->res2), n, cm->p, st);
    fck_residual(GRD(v->attproj), GRD(v->attproj), GRD(v->res2), n, cm->p, st);
    linear_backward(cm, GRD(v->atty), PGR(u, w->proj_w), PGR(u, w->proj_b), GRD(v->attproj), ACT(v->atty),
                    PRM(u, w->proj_w), NT, C, C, 1, st);
    fck_attention_backward(GRD(v->qkv), GRD(v->att), GRD(v->atty), ACT(v->qkv), ACT(v->att), B, T, C, NH, cm->p, st);
    linear_backward(cm, GRD(v->ln1), PGR(u, w->attn_w), PGR(u, w->attn_b), GRD(v->qkv), ACT(v->ln1), PRM(u, w->attn_w),
                    NT, C, 3 * C, 1, st);
    fck_layernorm_backward(dres, PGR(u, w->ln1_w), PGR(u, w->ln1_b), GRD(v->ln1), res, PRM(u, w->ln1_w),
                           FACT(v->ln1_mean), FACT(v->ln1_rstd), NT, C, cm->p, st);
}

// ---------------------------------------------------------------------------

void fc_cu_stage_forward(fc_cu_model *cm, int s, void *const *up, const fc_cu_batch *b, float loss_scale,
                         cudaStream_t st) {
    const fc_model *m = cm->m;
    const fc_stage *sg = &m->stages[s];
    const fc_model_config *c = &m->cfg;
    int u = sg->unit;
    if (s == 0) cudaCheck(cudaMemsetAsync(cm->grads, 0, cm->L.half, st));  // a new micro-batch's gradients
    switch (sg->kind) {
    case FC_STAGE_LINEAR:
        mlp_forward(cm, sg->layer, up, b, loss_scale, st);
        break;
    case FC_STAGE_EMBED:
        fck_encoder_forward(ACT(cm->L.encoded), b->input, PRM(u, cm->wte), PRM(u, cm->wpe), cm->L.B, cm->L.T, c->n_embd,
                            cm->p, st);
        break;
    case FC_STAGE_BLOCK:
        block_forward(cm, sg->layer, u, up, st);
        break;
    case FC_STAGE_HEAD: {
        int NT = cm->L.NT, C = c->n_embd, V = c->vocab_size;
        void *x = ACT(cm->L.blk[c->n_layer - 1].res3);  // [NT, C]
        fck_layernorm_forward(ACT(cm->L.lnf), FACT(cm->L.lnf_mean), FACT(cm->L.lnf_rstd), x, PRM(u, cm->lnf_w),
                              PRM(u, cm->lnf_b), NT, C, c->layer_norm_epsilon, cm->p, st);
        // the LM head is tied to wte [V, C]: logits = lnf wte^T, no bias
        linear_forward(cm, ACT(cm->L.logits), ACT(cm->L.lnf), PRM(u, cm->wte), NULL, NT, C, V, 0, st);
        fck_classifier(FACT(cm->L.losses), GRD(cm->L.logits), ACT(cm->L.logits), b->target, NT, V, loss_scale, cm->p,
                       st);
        break;
    }
    }
}

void fc_cu_stage_backward(fc_cu_model *cm, int s, void *const *up, void *const *ug, const fc_cu_batch *b,
                          cudaStream_t st) {
    const fc_model *m = cm->m;
    const fc_stage *sg = &m->stages[s];
    const fc_model_config *c = &m->cfg;
    int u = sg->unit;
    switch (sg->kind) {
    case FC_STAGE_LINEAR:
        mlp_backward(cm, sg->layer, up, ug, st);
        break;
    case FC_STAGE_EMBED:
        // the second of the two gradient paths into the tied wte
        fck_encoder_backward(PGR(u, cm->wte), PGR(u, cm->wpe), GRD(cm->L.encoded), b->tok, b->off, b->pos, b->n_tok,
                             cm->L.B, cm->L.T, c->n_embd, cm->p, st);
        break;
    case FC_STAGE_BLOCK:
        block_backward(cm, sg->layer, u, up, ug, st);
        break;
    case FC_STAGE_HEAD: {
        int NT = cm->L.NT, C = c->n_embd, V = c->vocab_size;
        void *x = ACT(cm->L.blk[c->n_layer - 1].res3), *dx = GRD(cm->L.blk[c->n_layer - 1].res3);
        // the first gradient path into the tied wte; dlogits came from the fused classifier
        linear_backward(cm, GRD(cm->L.lnf), PGR(u, cm->wte), NULL, GRD(cm->L.logits), ACT(cm->L.lnf), PRM(u, cm->wte), NT,
                        C, V, 0, st);
        fck_layernorm_backward(dx, PGR(u, cm->lnf_w), PGR(u, cm->lnf_b), GRD(cm->L.lnf), x, PRM(u, cm->lnf_w),
                               FACT(cm->L.lnf_mean), FACT(cm->L.lnf_rstd), NT, C, cm->p, st);
        break;
    }
    }
}
