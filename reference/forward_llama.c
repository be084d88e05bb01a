// reference/forward_llama.c — Llama (Hugging Face LlamaForCausalLM, eager
// attention) as stages, see forward.h and forward_internal.h.
//
// Activation memory of a micro-batch (NT = B*T rows, C = hidden_size,
// Q = num_attention_heads * head_dim, KV = num_key_value_heads * head_dim,
// I = intermediate_size, NH heads):
//   encoded                                    [NT, C]   embed_tokens[ids]
//   per decoder layer l (L times):
//     ln1 [NT,C]  ln1_rstd [NT]                input_layernorm (RMSNorm)
//     qp [NT,Q]  kp [NT,KV]                    q_proj, k_proj outputs
//     q [NT,Q]  k [NT,KV]                      the same after RoPE
//     v [NT,KV]                                v_proj
//     preatt att [B,NH,T,T]                    scores, softmax
//     atty [NT,Q]  attproj res2 [NT,C]         heads merged, o_proj, residual
//     ln2 [NT,C]  ln2_rstd [NT]                post_attention_layernorm
//     gate up h [NT,I]                         gate_proj, up_proj, silu(gate) * up
//     down res3 [NT,C]                         down_proj, residual: the layer's output
//   lnf [NT,C]  lnf_rstd [NT]  logits probs [NT,V]   model.norm, lm_head, softmax
// The gradient half mirrors it. RoPE is linear, so its backward needs no
// inputs; qp and kp are kept so that their gradients have their own place
// (q's gradient is rotated back into qp's).
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "layers.h"

typedef struct {
    real *ln1, *ln1_rstd, *qp, *kp, *q, *k, *v, *preatt, *att, *atty, *attproj, *res2, *ln2, *ln2_rstd, *gate,
        *up, *h, *down, *res3;
} layer_acts;

typedef struct {
    real *encoded, *lnf, *lnf_rstd, *logits, *probs;
} llama_ends;

size_t RN(fc_llama_block_numel)(const fc_model_config *c, int B, int T) {
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd, I = (size_t)c->intermediate_size;
    size_t Q = (size_t)c->n_head * c->head_dim, KV = (size_t)c->n_kv_head * c->head_dim;
    return NT * (6 * C + 3 * Q + 3 * KV + 3 * I) + 2 * NT + 2 * (size_t)B * c->n_head * T * T;
}

size_t RN(fc_llama_half_numel)(const fc_model_config *c, int B, int T) {
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    return NT * C + (size_t)c->n_layer * RN(fc_llama_block_numel)(c, B, T) + NT * C + NT + 2 * NT * V;
}

static layer_acts layer_view(const fc_model_config *c, int B, int T, real *half, int l) {
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd, I = (size_t)c->intermediate_size;
    size_t Q = (size_t)c->n_head * c->head_dim, KV = (size_t)c->n_kv_head * c->head_dim;
    size_t att = (size_t)B * c->n_head * T * T;
    real *p = half + NT * C + (size_t)l * RN(fc_llama_block_numel)(c, B, T);
    layer_acts v;
    v.ln1 = p, p += NT * C;
    v.ln1_rstd = p, p += NT;
    v.qp = p, p += NT * Q;
    v.kp = p, p += NT * KV;
    v.q = p, p += NT * Q;
    v.k = p, p += NT * KV;
    v.v = p, p += NT * KV;
    v.preatt = p, p += att;
    v.att = p, p += att;
    v.atty = p, p += NT * Q;
    v.attproj = p, p += NT * C;
    v.res2 = p, p += NT * C;
    v.ln2 = p, p += NT * C;
    v.ln2_rstd = p, p += NT;
    v.gate = p, p += NT * I;
    v.up = p, p += NT * I;
    v.h = p, p += NT * I;
    v.down = p, p += NT * C;
    v.res3 = p;  // the last NT*C of the block: its output (forward.h's region tail)
    return v;
}

static llama_ends ends_view(const fc_model_config *c, int B, int T, real *half) {
    size_t NT = (size_t)B * T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    llama_ends v;
    v.encoded = half;
    real *p = half + NT * C + (size_t)c->n_layer * RN(fc_llama_block_numel)(c, B, T);
    v.lnf = p, p += NT * C;
    v.lnf_rstd = p, p += NT;
    v.logits = p, p += NT * V;
    v.probs = p;
    return v;
}

// The residual stream entering layer l [NT, C]: the embedding or the previous layer's output.
static real *layer_input(const fc_model_config *c, int B, int T, real *half, int l) {
    return l == 0 ? ends_view(c, B, T, half).encoded : layer_view(c, B, T, half, l - 1).res3;
}

// The LM head's weight [V, C]: lm_head.weight, or embed_tokens.weight when tied.
static const char *head_name(const fc_model_config *c) {
    return c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
}

// RoPE of H heads, x [B,T,H,head_dim] -> out. m->rope_sign -1 (the fault
// catalogue's rope_half) rotates by -angle, the transpose rotation, which is
// fc_rope_backward's added onto a zeroed out; its backward is then the +angle
// rotation, written onto the gradient (zero there: only this writes it).
static void rope(const fc_model *m, real *out, const real *x, int B, int T, int H) {
    const fc_model_config *c = &m->cfg;
    if (m->rope_sign > 0) {
        RN(fc_rope_forward)(out, x, B, T, H, c->head_dim, c->rope_theta);
        return;
    }
    memset(out, 0, (size_t)B * T * H * c->head_dim * sizeof(real));
    RN(fc_rope_backward)(out, x, B, T, H, c->head_dim, c->rope_theta);
}

// dx [B,T,H,head_dim] += the gradient through rope(): the transpose rotation.
static void rope_backward(const fc_model *m, real *dx, const real *dout, int B, int T, int H) {
    const fc_model_config *c = &m->cfg;
    if (m->rope_sign > 0)
        RN(fc_rope_backward)(dx, dout, B, T, H, c->head_dim, c->rope_theta);
    else
        RN(fc_rope_forward)(dx, dout, B, T, H, c->head_dim, c->rope_theta);
}

// ---------------------------------------------------------------------------
// the decoder layer's linears, with LoRA where the model has an adapter

// Parameter i's values and gradient in its unit's buffers.
#define PI(i) ((real *)up[m->params[i].unit] + m->params[i].unit_offset)
#define GI(i) (ug[m->params[i].unit] + m->params[i].unit_offset)

// Layer l's linear `module` (its weight W [N, K]): out [NT, N] = x [NT, K] W^T,
// plus, with a LoRA adapter (A [r, K], B [N, r]), PEFT's
// result + lora_B(lora_A(x)) * scaling: u = x A^T [NT, r], out += (u B^T) s.
static void linear_forward(const fc_model *m, const real *const *up, real *out, const real *x, int NT, int K, int N,
                           int l, const char *module) {
    int w = fc_model_param_index(m, "model.layers.%d.%s.weight", l, module), a = m->lora[w], r = m->cfg.lora_r;
    RN(fc_matmul_forward)(out, x, PI(w), NULL, NT, K, N, FC_W_NK);
    if (a < 0) return;
    real *u = mallocCheck((size_t)NT * r * sizeof(real)), *t = mallocCheck((size_t)NT * N * sizeof(real));
    RN(fc_matmul_forward)(u, x, PI(a), NULL, NT, K, r, FC_W_NK);
    RN(fc_matmul_forward)(t, u, PI(a + 1), NULL, NT, r, N, FC_W_NK);
    real s = (real)m->lora_scale;
    for (size_t i = 0; i < (size_t)NT * N; i++) out[i] += t[i] * s;
    free(u);
    free(t);
}

// Its backward: dx [NT, K] += dout W and dW += dout^T x; with LoRA, u = x A^T
// recomputed from x, dB += (s dout)^T u, du = (s dout) B, dA += du^T x, dx += du A.
static void linear_backward(const fc_model *m, const real *const *up, real *const *ug, real *dx, const real *dout,
                            const real *x, int NT, int K, int N, int l, const char *module) {
    int w = fc_model_param_index(m, "model.layers.%d.%s.weight", l, module), a = m->lora[w], r = m->cfg.lora_r;
    RN(fc_matmul_backward)(dx, GI(w), NULL, dout, x, PI(w), NT, K, N, FC_W_NK);
    if (a < 0) return;
    size_t nu = (size_t)NT * r, nd = (size_t)NT * N;
    real *u = mallocCheck(nu * sizeof(real)), *du = callocCheck(nu, sizeof(real)), *ds = mallocCheck(nd * sizeof(real));
    real s = (real)m->lora_scale;
    RN(fc_matmul_forward)(u, x, PI(a), NULL, NT, K, r, FC_W_NK);
    for (size_t i = 0; i < nd; i++) ds[i] = dout[i] * s;
    RN(fc_matmul_backward)(du, GI(a + 1), NULL, ds, u, PI(a + 1), NT, r, N, FC_W_NK);
    RN(fc_matmul_backward)(dx, GI(a), NULL, du, x, PI(a), NT, K, r, FC_W_NK);
    free(u);
    free(du);
    free(ds);
}

// ---------------------------------------------------------------------------
// forward

static void layer_forward(const fc_model *m, int l, const real *const *up, RN(fc_acts) *a) {
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head, hd = c->head_dim;
    int Q = NH * hd, KV = NKV * hd, I = c->intermediate_size;
    layer_acts v = layer_view(c, B, T, a->acts, l);
    real *res = layer_input(c, B, T, a->acts, l);  // [NT, C]
    real eps = (real)c->layer_norm_epsilon;
    RN(fc_rmsnorm_forward)(v.ln1, v.ln1_rstd, res, P("model.layers.%d.input_layernorm.weight", l), NT, C, eps);
    linear_forward(m, up, v.qp, v.ln1, NT, C, Q, l, "self_attn.q_proj");
    linear_forward(m, up, v.kp, v.ln1, NT, C, KV, l, "self_attn.k_proj");
    linear_forward(m, up, v.v, v.ln1, NT, C, KV, l, "self_attn.v_proj");
    rope(m, v.q, v.qp, B, T, NH);
    rope(m, v.k, v.kp, B, T, NKV);
    RN(fc_gqa_attention_forward)(v.atty, v.preatt, v.att, v.q, v.k, v.v, B, T, NH, NKV, hd);
    linear_forward(m, up, v.attproj, v.atty, NT, Q, C, l, "self_attn.o_proj");
    RN(fc_residual_forward)(v.res2, res, v.attproj, (size_t)NT * C);
    RN(fc_rmsnorm_forward)(v.ln2, v.ln2_rstd, v.res2, P("model.layers.%d.post_attention_layernorm.weight", l), NT,
                           C, eps);
    linear_forward(m, up, v.gate, v.ln2, NT, C, I, l, "mlp.gate_proj");
    linear_forward(m, up, v.up, v.ln2, NT, C, I, l, "mlp.up_proj");
    RN(fc_swiglu_forward)(v.h, v.gate, v.up, (size_t)NT * I);
    linear_forward(m, up, v.down, v.h, NT, I, C, l, "mlp.down_proj");
    RN(fc_residual_forward)(v.res3, v.res2, v.down, (size_t)NT * C);
}

void RN(fc_llama_stage_forward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                                RN(fc_acts) *a) {
    const fc_stage *st = &m->stages[s];
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, V = c->vocab_size;
    switch (st->kind) {
    case FC_STAGE_EMBED:  // no position embedding: RoPE rotates q and k inside each layer
        RN(fc_encoder_forward)(ends_view(c, B, T, a->acts).encoded, batch->input,
                               P("%s", "model.embed_tokens.weight"), NULL, B, T, C);
        break;
    case FC_STAGE_BLOCK:
        layer_forward(m, st->layer, up, a);
        break;
    case FC_STAGE_HEAD: {
        llama_ends v = ends_view(c, B, T, a->acts);
        real *x = layer_view(c, B, T, a->acts, c->n_layer - 1).res3;  // [NT, C]
        RN(fc_rmsnorm_forward)(v.lnf, v.lnf_rstd, x, P("%s", "model.norm.weight"), NT, C,
                               (real)c->layer_norm_epsilon);
        RN(fc_matmul_forward)(v.logits, v.lnf, P("%s", head_name(c)), NULL, NT, C, V, FC_W_NK);
        a->loss_sum = RN(fc_crossentropy_forward)(v.probs, v.logits, batch->target, NT, V);
        break;
    }
    default:
        fc_die(FC_EXIT_INTERNAL, "%s:%d: llama has no stage of kind %d", __FILE__, __LINE__, (int)st->kind);
    }
}

// ---------------------------------------------------------------------------
// backward

static void layer_backward(const fc_model *m, int l, const real *const *up, RN(fc_acts) *a, real *const *ug) {
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, NH = c->n_head, NKV = c->n_kv_head, hd = c->head_dim;
    int Q = NH * hd, KV = NKV * hd, I = c->intermediate_size;
    layer_acts v = layer_view(c, B, T, a->acts, l), d = layer_view(c, B, T, a->grads, l);
    real *res = layer_input(c, B, T, a->acts, l), *dres = layer_input(c, B, T, a->grads, l);
    size_t n = (size_t)NT * C;
    // res3 = res2 + down: the gradient flows unchanged into both
    RN(fc_residual_forward)(d.res2, d.res2, d.res3, n);
    RN(fc_residual_forward)(d.down, d.down, d.res3, n);
    linear_backward(m, up, ug, d.h, d.down, v.h, NT, I, C, l, "mlp.down_proj");
    RN(fc_swiglu_backward)(d.gate, d.up, d.h, v.gate, v.up, (size_t)NT * I);
    linear_backward(m, up, ug, d.ln2, d.up, v.ln2, NT, C, I, l, "mlp.up_proj");
    linear_backward(m, up, ug, d.ln2, d.gate, v.ln2, NT, C, I, l, "mlp.gate_proj");
    RN(fc_rmsnorm_backward)(d.res2, G("model.layers.%d.post_attention_layernorm.weight", l), d.ln2, v.res2,
                            P("model.layers.%d.post_attention_layernorm.weight", l), v.ln2_rstd, NT, C);
    // res2 = res + attproj
    RN(fc_residual_forward)(dres, dres, d.res2, n);
    RN(fc_residual_forward)(d.attproj, d.attproj, d.res2, n);
    linear_backward(m, up, ug, d.atty, d.attproj, v.atty, NT, Q, C, l, "self_attn.o_proj");
    RN(fc_gqa_attention_backward)(d.q, d.k, d.v, d.preatt, d.att, d.atty, v.q, v.k, v.v, v.att, B, T, NH, NKV, hd);
    rope_backward(m, d.qp, d.q, B, T, NH);
    rope_backward(m, d.kp, d.k, B, T, NKV);
    linear_backward(m, up, ug, d.ln1, d.v, v.ln1, NT, C, KV, l, "self_attn.v_proj");
    linear_backward(m, up, ug, d.ln1, d.kp, v.ln1, NT, C, KV, l, "self_attn.k_proj");
    linear_backward(m, up, ug, d.ln1, d.qp, v.ln1, NT, C, Q, l, "self_attn.q_proj");
    RN(fc_rmsnorm_backward)(dres, G("model.layers.%d.input_layernorm.weight", l), d.ln1, res,
                            P("model.layers.%d.input_layernorm.weight", l), v.ln1_rstd, NT, C);
}

void RN(fc_llama_stage_backward)(const fc_model *m, int s, const real *const *up, const fc_batch *batch,
                                 RN(fc_acts) *a, real *const *ug, real loss_scale) {
    const fc_stage *st = &m->stages[s];
    const fc_model_config *c = &m->cfg;
    int B = a->B, T = a->T, NT = a->NT, C = c->n_embd, V = c->vocab_size;
    switch (st->kind) {
    case FC_STAGE_EMBED:  // with a tied head, the second of embed_tokens' two gradient paths
        RN(fc_encoder_backward)(G("%s", "model.embed_tokens.weight"), NULL, ends_view(c, B, T, a->grads).encoded,
                                batch->input, B, T, C);
        break;
    case FC_STAGE_BLOCK:
        layer_backward(m, st->layer, up, a, ug);
        break;
    case FC_STAGE_HEAD: {
        llama_ends v = ends_view(c, B, T, a->acts), d = ends_view(c, B, T, a->grads);
        real *x = layer_view(c, B, T, a->acts, c->n_layer - 1).res3;
        real *dx = layer_view(c, B, T, a->grads, c->n_layer - 1).res3;
        RN(fc_crossentropy_backward)(d.logits, v.probs, batch->target, NT, V, loss_scale);
        RN(fc_matmul_backward)(d.lnf, G("%s", head_name(c)), NULL, d.logits, v.lnf, P("%s", head_name(c)), NT, C, V,
                               FC_W_NK);
        RN(fc_rmsnorm_backward)(dx, G("%s", "model.norm.weight"), d.lnf, x, P("%s", "model.norm.weight"), v.lnf_rstd,
                                NT, C);
        break;
    }
    default:
        fc_die(FC_EXIT_INTERNAL, "%s:%d: llama has no stage of kind %d", __FILE__, __LINE__, (int)st->kind);
    }
}
