// optimized/model_cu.c — see model_cu.h. The reference's stages
// (reference/forward.c, reference/forward_llama.c), one kernel per layer
// operation, in its order, with its gradient flow: every backward accumulates
// (+=), the activation gradients are cleared once per micro-batch (at the
// first forward stage, since the last forward stage already writes the
// logits' gradient). A parameter's gradient is computed only where it has a
// slot (grad_at / pgrad: not frozen, and its unit given a gradient buffer);
// the activation gradients always flow, since a frozen layer still passes
// the gradient on to what is below it.
//
// Matmul shapes (row-major, kernels.h's fck_matmul):
//   Conv1D (gpt2, w [K,N]):      out = inp w;      dinp += dout w^T;  dw += inp^T dout
//   nn.Linear / tied head ([N,K]): out = inp w^T;  dinp += dout w;    dw += dout^T inp
#include "model_cu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
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

// RoPE's cos and sin [T, hd/2] as the reference builds them (reference/layers.c
// rope_tables, its float build, as LlamaRotaryEmbedding in fp32): inv_freq[i] =
// 1 / theta^((2i) / hd), the angle t * inv_freq[i] (one product), then cos and
// sin of it; the same float operations in the same order through the same
// libm, so the same bits (the device's powf/cosf/sinf are not glibc's).
static void rope_tables(float *cosv, float *sinv, int T, int hd, double theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)hd;
        float inv_freq = 1.0f / powf((float)theta, expo);
        for (int t = 0; t < T; t++) {
            float a = (float)t * inv_freq;
            cosv[(size_t)t * half + i] = cosf(a);
            sinv[(size_t)t * half + i] = sinf(a);
        }
    }
}

static size_t off_of(const fc_model *m, const char *name) {
    return m->params[fc_model_param_index(m, "%s", name)].unit_offset;
}

static size_t block_off(const fc_model *m, int l, const char *what) {
    char name[96];
    snprintf(name, sizeof name, "transformer.h.%d.%s", l, what);
    return off_of(m, name);
}

fc_cu_model *fc_cu_model_create(const fc_model *m, const fc_cu_acts *layout, void *acts, fc_prec p, fck_mm *mm,
                                cudaStream_t st) {
    fc_cu_model *cm = callocCheck(1, sizeof *cm);
    cm->m = m;
    cm->L = *layout;  // shares the offset arrays with the caller's layout
    cm->acts = acts;
    cm->grads = (char *)acts + layout->half;
    cm->p = p;
    cm->esz = fc_prec_size(p);
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
    } else if (c->kind == FC_MODEL_LLAMA) {
        // llama looks its parameters up by name per stage, as the reference
        // does; here only RoPE's tables, built once
        int T = layout->T, half = c->head_dim / 2;
        size_t n = (size_t)T * half;
        float *tab = mallocCheck((2 * n + 1) * sizeof(float));
        rope_tables(tab, tab + n, T, c->head_dim, c->rope_theta);
        cudaCheck(cudaMemcpyAsync(cm->acts + layout->rope_cos, tab, n * sizeof(float), cudaMemcpyHostToDevice, st));
        cudaCheck(cudaMemcpyAsync(cm->acts + layout->rope_sin, tab + n, n * sizeof(float), cudaMemcpyHostToDevice, st));
        cudaCheck(cudaStreamSynchronize(st));  // before the host table goes
        free(tab);
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
#define PGR(u, off) grad_at(cm, ug, u, off)

// The gradient slot of the parameter at element `off` of unit u, or NULL when
// no gradient is computed for it: the unit has no gradient buffer (no
// trainable parameter, model_cu.h) or the parameter is frozen.
static void *grad_at(const fc_cu_model *cm, void *const *ug, int u, size_t off) {
    if (!ug[u]) return NULL;
    int frozen;
    fc_model_run_at(cm->m, u, off, 1, &frozen);
    return frozen ? NULL : (char *)ug[u] + off * cm->esz;
}

// Parameter i's values, and its gradient slot (NULL as grad_at's)
static void *param(const fc_cu_model *cm, void *const *up, int i) {
    const fc_param *q = &cm->m->params[i];
    return (char *)up[q->unit] + q->unit_offset * cm->esz;
}
static void *pgrad(const fc_cu_model *cm, void *const *ug, int i) {
    return grad_at(cm, ug, cm->m->params[i].unit, cm->m->params[i].unit_offset);
}

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
// llama (reference/forward_llama.c: the same stages, operations and order)

// Layer l's parameter `what` ("self_attn.q_proj.weight", ...)
static int layer_param(const fc_model *m, int l, const char *what) {
    return fc_model_param_index(m, "model.layers.%d.%s", l, what);
}

// The LM head's weight [V, C]: lm_head.weight, or embed_tokens.weight when tied.
static int head_param(const fc_model *m) {
    return fc_model_param_index(m, "%s", m->cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
}

// Layer l's linear `module` (its weight W [N,K]): out [NT,N] = x [NT,K] W^T,
// plus, with a LoRA adapter (A [r,K], B [N,r]), PEFT's result +
// lora_B(lora_A(x)) * scaling: u = x A^T [NT,r], t = u B^T [NT,N], out += t s.
static void lin_forward(fc_cu_model *cm, void *const *up, void *out, const void *x, int NT, int K, int N, int l,
                        const char *module, cudaStream_t st) {
    const fc_model *m = cm->m;
    int w = fc_model_param_index(m, "model.layers.%d.%s.weight", l, module), a = m->lora[w], r = m->cfg.lora_r;
    linear_forward(cm, out, x, param(cm, up, w), NULL, NT, K, N, 0, st);
    if (a < 0) return;
    void *u = ACT(cm->L.lora_u), *t = ACT(cm->L.lora_t);  // u [NT,r], t [NT,N]
    linear_forward(cm, u, x, param(cm, up, a), NULL, NT, K, r, 0, st);
    linear_forward(cm, t, u, param(cm, up, a + 1), NULL, NT, r, N, 0, st);
    fck_lora_add(out, t, (float)m->lora_scale, (size_t)NT * N, cm->p, st);
}

// Its backward: dx [NT,K] += dout W, dW += dout^T x (not for a frozen W);
// with LoRA, u = x A^T recomputed (as the reference does), ds = dout s,
// du = ds B, dB += ds^T u, dA += du^T x, dx += du A.
static void lin_backward(fc_cu_model *cm, void *const *up, void *const *ug, void *dx, const void *dout, const void *x,
                         int NT, int K, int N, int l, const char *module, cudaStream_t st) {
    const fc_model *m = cm->m;
    int w = fc_model_param_index(m, "model.layers.%d.%s.weight", l, module), a = m->lora[w], r = m->cfg.lora_r;
    linear_backward(cm, dx, pgrad(cm, ug, w), NULL, dout, x, param(cm, up, w), NT, K, N, 0, st);
    if (a < 0) return;
    void *u = ACT(cm->L.lora_u), *du = GRD(cm->L.lora_u), *ds = GRD(cm->L.lora_t);  // u, du [NT,r]; ds [NT,N]
    linear_forward(cm, u, x, param(cm, up, a), NULL, NT, K, r, 0, st);
    fck_scale(ds, dout, (float)m->lora_scale, (size_t)NT * N, cm->p, st);
    cudaCheck(cudaMemsetAsync(du, 0, (size_t)NT * r * cm->esz, st));  // du is a fresh gradient, not an accumulation
    linear_backward(cm, du, pgrad(cm, ug, a + 1), NULL, ds, u, param(cm, up, a + 1), NT, r, N, 0, st);
    linear_backward(cm, dx, pgrad(cm, ug, a), NULL, du, x, param(cm, up, a), NT, K, r, 0, st);
}

// The residual stream entering layer l [NT, C]: the embedding or the previous layer's output
static size_t layer_input(const fc_cu_model *cm, int l) { return l == 0 ? cm->L.encoded : cm->L.lay[l - 1].res3; }

static void llama_layer_forward(fc_cu_model *cm, int l, void *const *up, cudaStream_t st) {
    const fc_model *m = cm->m;
    const fc_model_config *c = &m->cfg;
    int B = cm->L.B, T = cm->L.T, NT = cm->L.NT, C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head, hd = c->head_dim;
    int Q = NH * hd, KV = NKV * hd, I = c->intermediate_size;
    const fc_cu_layer_off *v = &cm->L.lay[l];
    const float *cosv = FACT(cm->L.rope_cos), *sinv = FACT(cm->L.rope_sin);  // [T, hd/2]
    void *res = ACT(layer_input(cm, l));  // [NT, C]
    float eps = c->layer_norm_epsilon;    // rms_norm_eps
    fck_rmsnorm_forward(ACT(v->ln1), FACT(v->ln1_rstd), res, param(cm, up, layer_param(m, l, "input_layernorm.weight")),
                        NT, C, eps, cm->p, st);
    lin_forward(cm, up, ACT(v->qp), ACT(v->ln1), NT, C, Q, l, "self_attn.q_proj", st);
    lin_forward(cm, up, ACT(v->kp), ACT(v->ln1), NT, C, KV, l, "self_attn.k_proj", st);
    lin_forward(cm, up, ACT(v->v), ACT(v->ln1), NT, C, KV, l, "self_attn.v_proj", st);
    fck_rope_forward(ACT(v->q), ACT(v->qp), cosv, sinv, B, T, NH, hd, cm->p, st);
    fck_rope_forward(ACT(v->k), ACT(v->kp), cosv, sinv, B, T, NKV, hd, cm->p, st);
    fck_gqa_attention_forward(ACT(v->atty), ACT(v->att), ACT(v->q), ACT(v->k), ACT(v->v), B, T, NH, NKV, hd, cm->p, st);
    lin_forward(cm, up, ACT(v->attproj), ACT(v->atty), NT, Q, C, l, "self_attn.o_proj", st);
    fck_residual(ACT(v->res2), res, ACT(v->attproj), (size_t)NT * C, cm->p, st);
    fck_rmsnorm_forward(ACT(v->ln2), FACT(v->ln2_rstd), ACT(v->res2),
                        param(cm, up, layer_param(m, l, "post_attention_layernorm.weight")), NT, C, eps, cm->p, st);
    lin_forward(cm, up, ACT(v->gate), ACT(v->ln2), NT, C, I, l, "mlp.gate_proj", st);
    lin_forward(cm, up, ACT(v->up), ACT(v->ln2), NT, C, I, l, "mlp.up_proj", st);
    fck_swiglu_forward(ACT(v->h), ACT(v->gate), ACT(v->up), (size_t)NT * I, cm->p, st);
    lin_forward(cm, up, ACT(v->down), ACT(v->h), NT, I, C, l, "mlp.down_proj", st);
    fck_residual(ACT(v->res3), ACT(v->res2), ACT(v->down), (size_t)NT * C, cm->p, st);
}

static void llama_layer_backward(fc_cu_model *cm, int l, void *const *up, void *const *ug, cudaStream_t st) {
    const fc_model *m = cm->m;
    const fc_model_config *c = &m->cfg;
    int B = cm->L.B, T = cm->L.T, NT = cm->L.NT, C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head, hd = c->head_dim;
    int Q = NH * hd, KV = NKV * hd, I = c->intermediate_size;
    const fc_cu_layer_off *v = &cm->L.lay[l];
    const float *cosv = FACT(cm->L.rope_cos), *sinv = FACT(cm->L.rope_sin);
    void *res = ACT(layer_input(cm, l)), *dres = GRD(layer_input(cm, l));
    size_t n = (size_t)NT * C;
    int ln1 = layer_param(m, l, "input_layernorm.weight"), ln2 = layer_param(m, l, "post_attention_layernorm.weight");
    // res3 = res2 + down: the gradient flows unchanged into both
    fck_residual(GRD(v->res2), GRD(v->res2), GRD(v->res3), n, cm->p, st);
    fck_residual(GRD(v->down), GRD(v->down), GRD(v->res3), n, cm->p, st);
    lin_backward(cm, up, ug, GRD(v->h), GRD(v->down), ACT(v->h), NT, I, C, l, "mlp.down_proj", st);
    fck_swiglu_backward(GRD(v->gate), GRD(v->up), GRD(v->h), ACT(v->gate), ACT(v->up), (size_t)NT * I, cm->p, st);
    lin_backward(cm, up, ug, GRD(v->ln2), GRD(v->up), ACT(v->ln2), NT, C, I, l, "mlp.up_proj", st);
    lin_backward(cm, up, ug, GRD(v->ln2), GRD(v->gate), ACT(v->ln2), NT, C, I, l, "mlp.gate_proj", st);
    fck_rmsnorm_backward(GRD(v->res2), pgrad(cm, ug, ln2), GRD(v->ln2), ACT(v->res2), param(cm, up, ln2),
                         FACT(v->ln2_rstd), NT, C, cm->p, st);
    // res2 = res + attproj
    fck_residual(dres, dres, GRD(v->res2), n, cm->p, st);
    fck_residual(GRD(v->attproj), GRD(v->attproj), GRD(v->res2), n, cm->p, st);
    lin_backward(cm, up, ug, GRD(v->atty), GRD(v->attproj), ACT(v->atty), NT, Q, C, l, "self_attn.o_proj", st);
    // the gradient half's att holds dpreatt (scratch)
    fck_gqa_attention_backward(GRD(v->q), GRD(v->k), GRD(v->v), GRD(v->att), GRD(v->atty), ACT(v->q), ACT(v->k),
                               ACT(v->v), ACT(v->att), B, T, NH, NKV, hd, cm->p, st);
    // RoPE is linear: q's gradient rotated back into qp's, k's into kp's
    fck_rope_backward(GRD(v->qp), GRD(v->q), cosv, sinv, B, T, NH, hd, cm->p, st);
    fck_rope_backward(GRD(v->kp), GRD(v->k), cosv, sinv, B, T, NKV, hd, cm->p, st);
    lin_backward(cm, up, ug, GRD(v->ln1), GRD(v->v), ACT(v->ln1), NT, C, KV, l, "self_attn.v_proj", st);
    lin_backward(cm, up, ug, GRD(v->ln1), GRD(v->kp), ACT(v->ln1), NT, C, KV, l, "self_attn.k_proj", st);
    lin_backward(cm, up, ug, GRD(v->ln1), GRD(v->qp), ACT(v->ln1), NT, C, Q, l, "self_attn.q_proj", st);
    fck_rmsnorm_backward(dres, pgrad(cm, ug, ln1), GRD(v->ln1), res, param(cm, up, ln1), FACT(v->ln1_rstd), NT, C, cm->p,
                         st);
}

static void llama_stage_forward(fc_cu_model *cm, const fc_stage *sg, void *const *up, const fc_cu_batch *b,
                                float loss_scale, cudaStream_t st) {
    const fc_model *m = cm->m;
    const fc_model_config *c = &m->cfg;
    int NT = cm->L.NT, C = c->n_embd, V = c->vocab_size;
    switch (sg->kind) {
    case FC_STAGE_EMBED:  // no position embedding: RoPE rotates q and k inside each layer
        fck_encoder_forward(ACT(cm->L.encoded), b->input, param(cm, up, fc_model_param_index(m, "%s", "model.embed_tokens.weight")),
                            NULL, cm->L.B, cm->L.T, C, cm->p, st);
        break;
    case FC_STAGE_BLOCK:
        llama_layer_forward(cm, sg->layer, up, st);
        break;
    case FC_STAGE_HEAD: {
        void *x = ACT(cm->L.lay[c->n_layer - 1].res3);  // [NT, C]
        fck_rmsnorm_forward(ACT(cm->L.lnf), FACT(cm->L.lnf_rstd), x,
                            param(cm, up, fc_model_param_index(m, "%s", "model.norm.weight")), NT, C,
                            c->layer_norm_epsilon, cm->p, st);
        // logits = lnf head^T, head [V, C] (lm_head, or embed_tokens tied), no bias
        linear_forward(cm, ACT(cm->L.logits), ACT(cm->L.lnf), param(cm, up, head_param(m)), NULL, NT, C, V, 0, st);
        fck_classifier(FACT(cm->L.losses), GRD(cm->L.logits), ACT(cm->L.logits), b->target, NT, V, loss_scale, cm->p,
                       st);
        break;
    }
    default:
        fc_die(FC_EXIT_INTERNAL, "%s:%d: llama has no stage of kind %d", __FILE__, __LINE__, (int)sg->kind);
    }
}

static void llama_stage_backward(fc_cu_model *cm, const fc_stage *sg, void *const *up, void *const *ug,
                                 const fc_cu_batch *b, cudaStream_t st) {
    const fc_model *m = cm->m;
    const fc_model_config *c = &m->cfg;
    int NT = cm->L.NT, C = c->n_embd, V = c->vocab_size;
    switch (sg->kind) {
    case FC_STAGE_EMBED: {  // with a tied head, the second of embed_tokens' two gradient paths
        void *dwte = pgrad(cm, ug, fc_model_param_index(m, "%s", "model.embed_tokens.weight"));
        fck_encoder_backward(dwte, NULL, GRD(cm->L.encoded), b->tok, b->off, b->pos, b->n_tok, cm->L.B, cm->L.T, C,
                             cm->p, st);
        break;
    }
    case FC_STAGE_BLOCK:
        llama_layer_backward(cm, sg->layer, up, ug, st);
        break;
    case FC_STAGE_HEAD: {
        int head = head_param(m), norm = fc_model_param_index(m, "%s", "model.norm.weight");
        void *x = ACT(cm->L.lay[c->n_layer - 1].res3), *dx = GRD(cm->L.lay[c->n_layer - 1].res3);
        // dlogits came from the fused classifier
        linear_backward(cm, GRD(cm->L.lnf), pgrad(cm, ug, head), NULL, GRD(cm->L.logits), ACT(cm->L.lnf),
                        param(cm, up, head), NT, C, V, 0, st);
        fck_rmsnorm_backward(dx, pgrad(cm, ug, norm), GRD(cm->L.lnf), x, param(cm, up, norm), FACT(cm->L.lnf_rstd), NT,
                             C, cm->p, st);
        break;
    }
    default:
        fc_die(FC_EXIT_INTERNAL, "%s:%d: llama has no stage of kind %d", __FILE__, __LINE__, (int)sg->kind);
    }
}

// ---------------------------------------------------------------------------

void fc_cu_stage_forward(fc_cu_model *cm, int s, void *const *up, const fc_cu_batch *b, float loss_scale,
                         cudaStream_t st) {
    const fc_model *m = cm->m;
    const fc_stage *sg = &m->stages[s];
    const fc_model_config *c = &m->cfg;
    int u = sg->unit;
    if (s == 0) cudaCheck(cudaMemsetAsync(cm->grads, 0, cm->L.half, st));  // a new micro-batch's gradients
    if (c->kind == FC_MODEL_LLAMA) {
        llama_stage_forward(cm, sg, up, b, loss_scale, st);
        return;
    }
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
    if (c->kind == FC_MODEL_LLAMA) {
        llama_stage_backward(cm, sg, up, ug, b, st);
        return;
    }
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
