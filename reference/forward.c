// reference/forward.c — the mlp and gpt2 models as stages, see forward.h
// (llama's are in forward_llama.c; the entry points here dispatch to them).
//
// Activation memory is one block. For gpt2 (NT = B*T rows, C = n_embd):
//   encoded                         [NT, C]
//   per block l (L times):
//     ln1 [NT,C]  ln1_mean ln1_rstd [NT]  qkv [NT,3C]  atty [NT,C]
//     preatt att [B,NH,T,T]  attproj res2 ln2 [NT,C]  ln2_mean ln2_rstd [NT]
//     fch fch_gelu [NT,4C]  fcproj res3 [NT,C]
//   lnf [NT,C]  lnf_mean lnf_rstd [NT]  logits probs [NT,V]
// For mlp (NT = B rows, d_l = dims[l]):
//   x0 [B,d_0]; per layer l: h_l [B,d_{l+1}] (pre-activation), y_l [B,d_{l+1}]
//   (GELU output; for the last layer the softmax probabilities).
// The gradient half mirrors the same layout.
#include "forward.h"

#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "layers.h"

// ---------------------------------------------------------------------------
// gpt2 activation views

typedef struct {
    real *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *preatt, *att, *attproj, *res2, *ln2,
        *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *res3;
} block_acts;

typedef struct {
    real *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits, *probs;
} gpt2_ends;

static size_t gpt2_block_numel(const fc_model_config *c, int B, int T) {
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd;
    return NT * C * 18 + NT * 4 + 2 * (size_t)B * c->n_head * T * T;
}

static block_acts block_view(const fc_model *m, int B, int T, real *half, int l) {
    const fc_model_config *c = &m->cfg;
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd, att = (size_t)B * c->n_head * T * T;
    real *p = half + NT * C + (size_t)l * gpt2_block_numel(c, B, T);
    block_acts v;
    v.ln1 = p, p += NT * C;
    v.ln1_mean = p, p += NT;
    v.ln1_rstd = p, p += NT;
    v.qkv = p, p += NT * 3 * C;
    v.atty = p, p += NT * C;
    v.preatt = p, p += att;
    v.att = p, p += att;
    v.attproj = p, p += NT * C;
    v.res2 = p, p += NT * C;
    v.ln2 = p, p += NT * C;
    v.ln2_mean = p, p += NT;
    v.ln2_rstd = p, p += NT;
    v.fch = p, p += NT * 4 * C;
    v.fch_gelu = p, p += NT * 4 * C;
    v.fcproj = p, p += NT * C;
    v.res3 = p;
    return v;
}

static gpt2_ends ends_view(const fc_model *m, int B, int T, real *half) {
    const fc_model_config *c = &m->cfg;
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    gpt2_ends v;
    v.encoded = half;
    real *p = half + NT * C + (size_t)c->n_layer * gpt2_block_numel(c, B, T);
    v.lnf = p, p += NT * C;
    v.lnf_mean = p, p += NT;
    v.lnf_rstd = p, p += NT;
    v.logits = p, p += NT * V;
    v.probs = p;
    return v;
}

static size_t gpt2_half_numel(const fc_model_config *c, int B, int T) {
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    return NT * C + (size_t)c->n_layer * gpt2_block_numel(c, B, T) + NT * C + 2 * NT + 2 * NT * V;
}

// ---------------------------------------------------------------------------
// mlp activation views: x0, then (h_l, y_l) per layer

static real *mlp_x0(real *half) { return half; }

static size_t mlp_h_off(const fc_model_config *c, int B, int l) {
    size_t off = (size_t)B * c->dims[0];
    for (int i = 0; i < l; i++) off += 2 * (size_t)B * c->dims[i + 1];
    return off;
}

static real *mlp_h(const fc_model_config *c, int B, real *half, int l) { return half + mlp_h_off(c, B, l); }

static real *mlp_y(const fc_model_config *c, int B, real *half, int l) {
    return mlp_h(c, B, half, l) + (size_t)B * c->dims[l + 1];
}

static size_t mlp_half_numel(const fc_model_config *c, int B) {
    size_t n = (size_t)B * c->dims[0];
    for (int l = 0; l < c->n_layers; l++) n += 2 * (size_t)B * c->dims[l + 1];
    return n;
}

// ---------------------------------------------------------------------------

size_t RN(fc_acts_numel)(const fc_model *m, int B, int T) {
    if (m->cfg.kind == FC_MODEL_MLP) return 2 * mlp_half_numel(&m->cfg, B);
    if (m->cfg.kind == FC_MODEL_LLAMA) return 2 * RN(fc_llama_half_numel)(&m->cfg, B, T);
    return 2 * gpt2_half_numel(&m->cfg, B, T);
}

fc_stage_region RN(fc_stage_acts_region)(const fc_model *m, int s, int B, int T) {
    const fc_model_config *c = &m->cfg;
    const fc_stage *st = &m->stages[s];
    if (st->kind == FC_STAGE_LINEAR) {  // x0 (layer 0, the data's copy), h_l | y_l
        size_t h = mlp_h_off(c, B, st->layer);
        size_t out = (size_t)B * c->dims[st->layer + 1];
        return (fc_stage_region){st->layer == 0 ? 0 : h, h + out, h + 2 * out};
    }
    // gpt2 and llama share the layout's shape: encoded, the blocks (each its
    // output last), the head's
    int llama = c->kind == FC_MODEL_LLAMA;
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd;
    size_t blk = llama ? RN(fc_llama_block_numel)(c, B, T) : gpt2_block_numel(c, B, T);
    size_t L = (size_t)c->n_layer, end = llama ? RN(fc_llama_half_numel)(c, B, T) : gpt2_half_numel(c, B, T);
    switch (st->kind) {
    case FC_STAGE_EMBED:  // encoded
        return (fc_stage_region){0, 0, NT * C};
    case FC_STAGE_BLOCK: {  // block l's activations, res3 last
        size_t lo = NT * C + (size_t)st->layer * blk;
        return (fc_stage_region){lo, lo + blk - NT * C, lo + blk};
    }
    default:  // the head: lnf .. probs, its output the loss alone
        return (fc_stage_region){NT * C + L * blk, end, end};
    }
}

void RN(fc_acts_init)(RN(fc_acts) *a, const fc_model *m, int B, int T, real *mem) {
    memset(a, 0, sizeof *a);
    a->B = B;
    a->T = m->cfg.kind == FC_MODEL_MLP ? 1 : T;
    a->NT = B * a->T;
    a->numel = RN(fc_acts_numel)(m, B, a->T);
    a->mem = mem;
    a->acts = mem;
    a->grads = mem + a->numel / 2;
}

// ---------------------------------------------------------------------------
// forward

static void mlp_forward(const fc_model *m, int l, const real *const *up, const fc_batch *batch,
                        RN(fc_acts) *a) {
    const fc_model_config *c = &m->cfg;
    int B = a->B, in = c->dims[l], out = c->dims[l + 1];
    real *x;  // [B, in]
    if (l == 0) {
        x = mlp_x0(a->acts);
        for (size_t i = 0; i < (size_t)B * in; i++) x[i] = (real)batch->features[i];
    } else {
        x = mlp_y(c, B, a->acts, l - 1);
    }
    real *h = mlp_h(c, B, a->acts, l);  // [B, out]
    real *y = mlp_y(c, B, a->acts, l);  // [B, out]
    RN(fc_matmul_forward)(h, x, P("layers.%d.weight", l), P("layers.%d.bias", l), B, in, out, FC_W_NK);
    if (l < c->n_layers - 1)
        RN(fc_gelu_forward)(y, h, (size_t)B * out);
    else
        a->loss_sum = RN(fc_crossentropy_forward)(y, h, batch->target, B, out);
}

static void gpt2_block_forward(const fc_model *m, int l, const real *const *up, RN(fc_acts) *a) {
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, NH = c->n_head;
    block_acts v = block_view(m, B, T, a->acts, l);
    // the residual stream entering this block [NT, C]
    real *res = l == 0 ? ends_view(m, B, T, a->acts).encoded : block_view(m, B, T, a->acts, l - 1).res3;
    real eps = (real)c->layer_norm_epsilon;
    RN(fc_layernorm_forward)(v.ln1, v.ln1_mean, v.ln1_rstd, res, P("transformer.h.%d.ln_1.weight", l),
                             P("transformer.h.%d.ln_1.bias", l), NT, C, eps);
    RN(fc_matmul_forward)(v.qkv, v.ln1, P("transformer.h.%d.attn.c_attn.weight", l),
                          P("transformer.h.%d.attn.c_attn.bias", l), NT, C, 3 * C, FC_W_KN);
    RN(fc_attention_forward)(v.atty, v.preatt, v.att, v.qkv, B, T, C, NH);
    RN(fc_matmul_forward)(v.attproj, v.atty, P("transformer.h.%d.attn.c_proj.weight", l),
                          P("transformer.h.%d.attn.c_proj.bias", l), NT, C, C, FC_W_KN);
    RN(fc_residual_forward)(v.res2, res, v.attproj, (size_t)NT * C);
    RN(fc_layernorm_forward)(v.ln2, v.ln2_mean, v.ln2_rstd, v.res2, P("transformer.h.%d.ln_2.weight", l),
                             P("transformer.h.%d.ln_2.bias", l), NT, C, eps);
    RN(fc_matmul_forward)(v.fch, v.ln2, P("transformer.h.%d.mlp.c_fc.weight", l),
                          P("transformer.h.%d.mlp.c_fc.bias", l), NT, C, 4 * C, FC_W_KN);
    RN(fc_gelu_forward)(v.fch_gelu, v.fch, (size_t)NT * 4 * C);
    RN(fc_matmul_forward)(v.fcproj, v.fch_gelu, P("transformer.h.%d.mlp.c_proj.weight", l),
                          P("transformer.h.%d.mlp.c_proj.bias", l), NT, 4 * C, C, FC_W_KN);
    RN(fc_residual_forward)(v.res3, v.res2, v.fcproj, (size_t)NT * C);
}

void RN(fc_stage_forward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                          RN(fc_acts) *a) {
    if (m->cfg.kind == FC_MODEL_LLAMA) {
        RN(fc_llama_stage_forward)(m, s, up, batch, a);
        return;
    }
    const fc_stage *st = &m->stages[s];
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, V = c->vocab_size;
    switch (st->kind) {
    case FC_STAGE_LINEAR:
        mlp_forward(m, st->layer, up, batch, a);
        break;
    case FC_STAGE_EMBED:
        RN(fc_encoder_forward)(ends_view(m, B, T, a->acts).encoded, batch->input,
                               P("%s", "transformer.wte.weight"), P("%s", "transformer.wpe.weight"),
                               B, T, C);
        break;
    case FC_STAGE_BLOCK:
        gpt2_block_forward(m, st->layer, up, a);
        break;
    case FC_STAGE_HEAD: {
        gpt2_ends v = ends_view(m, B, T, a->acts);
        real *x = block_view(m, B, T, a->acts, c->n_layer - 1).res3;  // [NT, C]
        RN(fc_layernorm_forward)(v.lnf, v.lnf_mean, v.lnf_rstd, x, P("%s", "transformer.ln_f.weight"),
                                 P("%s", "transformer.ln_f.bias"), NT, C, (real)c->layer_norm_epsilon);
        // the LM head is tied to wte [V, C]: logits = lnf @ wte^T, no bias
        RN(fc_matmul_forward)(v.logits, v.lnf, P("%s", "transformer.wte.weight"), NULL, NT, C, V, FC_W_NK);
        a->loss_sum = RN(fc_crossentropy_forward)(v.probs, v.logits, batch->target, NT, V);
        break;
    }
    }
}

// ---------------------------------------------------------------------------
// backward

static void mlp_backward(const fc_model *m, int l, const real *const *up, const fc_batch *batch,
                         RN(fc_acts) *a, real *const *ug, real loss_scale) {
    const fc_model_config *c = &m->cfg;
    int B = a->B, in = c->dims[l], out = c->dims[l + 1];
    real *dh = mlp_h(c, B, a->grads, l);  // [B, out]
    if (l == c->n_layers - 1) {
        RN(fc_crossentropy_backward)(dh, mlp_y(c, B, a->acts, l), batch->target, B, out, loss_scale);
    } else {
        RN(fc_gelu_backward)(dh, mlp_h(c, B, a->acts, l), mlp_y(c, B, a->grads, l), (size_t)B * out);
    }
    const real *x = l == 0 ? mlp_x0(a->acts) : mlp_y(c, B, a->acts, l - 1);
    real *dx = l == 0 ? NULL : mlp_y(c, B, a->grads, l - 1);  // no gradient w.r.t. the data
    RN(fc_matmul_backward)(dx, G("layers.%d.weight", l), G("layers.%d.bias", l), dh, x,
                           P("layers.%d.weight", l), B, in, out, FC_W_NK);
}

static void gpt2_block_backward(const fc_model *m, int l, const real *const *up, RN(fc_acts) *a,
                                real *const *ug) {
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, NH = c->n_head;
    block_acts v = block_view(m, B, T, a->acts, l);
    block_acts d = block_view(m, B, T, a->grads, l);
    real *res = l == 0 ? ends_view(m, B, T, a->acts).encoded : block_view(m, B, T, a->acts, l - 1).res3;
    real *dres = l == 0 ? ends_view(m, B, T, a->grads).encoded : block_view(m, B, T, a->grads, l - 1).res3;
    size_t n = (size_t)NT * C;
    // res3 = res2 + fcproj: the gradient flows unchanged into both
    RN(fc_residual_forward)(d.res2, d.res2, d.res3, n);
    RN(fc_residual_forward)(d.fcproj, d.fcproj, d.res3, n);
    RN(fc_matmul_backward)(d.fch_gelu, G("transformer.h.%d.mlp.c_proj.weight", l),
                           G("transformer.h.%d.mlp.c_proj.bias", l), d.fcproj, v.fch_gelu,
                           P("transformer.h.%d.mlp.c_proj.weight", l), NT, 4 * C, C, FC_W_KN);
    RN(fc_gelu_backward)(d.fch, v.fch, d.fch_gelu, n * 4);
    RN(fc_matmul_backward)(d.ln2, G("transformer.h.%d.mlp.c_fc.weight", l),
                           G("transformer.h.%d.mlp.c_fc.bias", l), d.fch, v.ln2,
                           P("transformer.h.%d.mlp.c_fc.weight", l), NT, C, 4 * C, FC_W_KN);
    RN(fc_layernorm_backward)(d.res2, G("transformer.h.%d.ln_2.weight", l),
                              G("transformer.h.%d.ln_2.bias", l), d.ln2, v.res2,
                              P("transformer.h.%d.ln_2.weight", l), v.ln2_mean, v.ln2_rstd, NT, C);
    // res2 = res + attproj
    RN(fc_residual_forward)(dres, dres, d.res2, n);
    RN(fc_residual_forward)(d.attproj, d.attproj, d.res2, n);
    RN(fc_matmul_backward)(d.atty, G("transformer.h.%d.attn.c_proj.weight", l),
                           G("transformer.h.%d.attn.c_proj.bias", l), d.attproj, v.atty,
                           P("transformer.h.%d.attn.c_proj.weight", l), NT, C, C, FC_W_KN);
    RN(fc_attention_backward)(d.qkv, d.preatt, d.att, d.atty, v.qkv, v.att, B, T, C, NH);
    RN(fc_matmul_backward)(d.ln1, G("transformer.h.%d.attn.c_attn.weight", l),
                           G("transformer.h.%d.attn.c_attn.bias", l), d.qkv, v.ln1,
                           P("transformer.h.%d.attn.c_attn.weight", l), NT, C, 3 * C, FC_W_KN);
    RN(fc_layernorm_backward)(dres, G("transformer.h.%d.ln_1.weight", l),
                              G("transformer.h.%d.ln_1.bias", l), d.ln1, res,
                              P("transformer.h.%d.ln_1.weight", l), v.ln1_mean, v.ln1_rstd, NT, C);
}

void RN(fc_stage_backward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                           RN(fc_acts) *a, real *const *ug, real loss_scale) {
    const fc_stage *st = &m->stages[s];
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, V = c->vocab_size;
    // Backward always starts at the last stage: every activation gradient is
    // accumulated (+=), so clear them all once, there.
    if (s == m->n_stages - 1) memset(a->grads, 0, (a->numel / 2) * sizeof(real));
    if (c->kind == FC_MODEL_LLAMA) {
        RN(fc_llama_stage_backward)(m, s, up, batch, a, ug, loss_scale);
        return;
    }
    switch (st->kind) {
    case FC_STAGE_LINEAR:
        mlp_backward(m, st->layer, up, batch, a, ug, loss_scale);
        break;
    case FC_STAGE_EMBED:
        RN(fc_encoder_backward)(G("%s", "transformer.wte.weight"), G("%s", "transformer.wpe.weight"),
                                ends_view(m, B, T, a->grads).encoded, batch->input, B, T, C);
        break;
    case FC_STAGE_BLOCK:
        gpt2_block_backward(m, st->layer, up, a, ug);
        break;
    case FC_STAGE_HEAD: {
        gpt2_ends v = ends_view(m, B, T, a->acts), d = ends_view(m, B, T, a->grads);
        real *x = block_view(m, B, T, a->acts, c->n_layer - 1).res3;
        real *dx = block_view(m, B, T, a->grads, c->n_layer - 1).res3;
        RN(fc_crossentropy_backward)(d.logits, v.probs, batch->target, NT, V, loss_scale);
        // first of the two gradient paths into the tied wte (the other is the embedding)
        RN(fc_matmul_backward)(d.lnf, G("%s", "transformer.wte.weight"), NULL, d.logits, v.lnf,
                               P("%s", "transformer.wte.weight"), NT, C, V, FC_W_NK);
        RN(fc_layernorm_backward)(dx, G("%s", "transformer.ln_f.weight"), G("%s", "transformer.ln_f.bias"),
                                  d.lnf, x, P("%s", "transformer.ln_f.weight"), v.lnf_mean, v.lnf_rstd,
                                  NT, C);
        break;
    }
    }
}

// Per-unit base pointers into a full flat buffer.
static void unit_bases(const fc_model *m, const real *full, const real **up) {
    for (int u = 0; u < m->n_units; u++) up[u] = full + m->units[u].offset;
}

real RN(fc_model_forward)(const fc_model *m, const real *params, const fc_batch *batch,
                          RN(fc_acts) *a) {
    const real **up = mallocCheck((size_t)m->n_units * sizeof *up);
    unit_bases(m, params, up);
    for (int s = 0; s < m->n_stages; s++) RN(fc_stage_forward)(m, s, up, batch, a);
    free(up);
    return a->loss_sum / (real)a->NT;
}

void RN(fc_model_backward)(const fc_model *m, const real *params, const fc_batch *batch,
                           RN(fc_acts) *a, real *grads, real loss_scale) {
    const real **up = mallocCheck((size_t)m->n_units * sizeof *up);
    real **ug = mallocCheck((size_t)m->n_units * sizeof *ug);
    unit_bases(m, params, up);
    for (int u = 0; u < m->n_units; u++) ug[u] = grads + m->units[u].offset;
    for (int s = m->n_stages - 1; s >= 0; s--)
        RN(fc_stage_backward)(m, s, up, batch, a, ug, loss_scale);
    free(up);
    free(ug);
}
