// optimized/acts.h — the port's activation memory layout, pure host
// arithmetic (the memory estimate at create and the model code share it).
//
// One device allocation holds two halves of `half` bytes each: activations,
// then their gradients at the same offsets (the reference's layout idea,
// reference/forward.c). Tensors are in the compute type (param_dtype, `esz`
// bytes) except LayerNorm's mean/rstd and the per-row losses, fp32. Every
// tensor starts on a 256-byte boundary (cuBLASLt's preferred alignment).
// gpt2 (NT = B*T rows, C = n_embd, NH heads):
//   encoded [NT,C]; per block: ln1 [NT,C], ln1_mean ln1_rstd [NT] f32,
//   qkv [NT,3C], atty [NT,C], att [B,NH,T,T] (softmax; its gradient half holds
//   dpreatt), attproj res2 ln2 [NT,C], ln2_mean ln2_rstd [NT] f32,
//   fch fch_gelu [NT,4C], fcproj res3 [NT,C];
//   lnf [NT,C], lnf_mean lnf_rstd [NT] f32, logits [NT,V], losses [NT] f32.
// llama (reference/forward_llama.c's tensors; Q = NH*hd, KV = NKV*hd, I the
// MLP's width): encoded [NT,C]; per layer: ln1 [NT,C], ln1_rstd [NT] f32,
//   qp [NT,Q], kp [NT,KV] (q_proj, k_proj), q [NT,Q], k [NT,KV] (after RoPE),
//   v [NT,KV], att [B,NH,T,T] (gradient half: dpreatt), atty [NT,Q],
//   attproj res2 ln2 [NT,C], ln2_rstd [NT] f32, gate up h [NT,I], down res3
//   [NT,C]; lnf [NT,C], lnf_rstd [NT] f32, logits [NT,V], losses [NT] f32;
//   RoPE's tables rope_cos rope_sin [T,hd/2] f32 (activation half only,
//   filled once at create); with LoRA (r > 0) the adapters' scratch, shared by
//   every adapted linear in turn: lora_u [NT,r] (x A^T; gradient half: du) and
//   lora_t [NT,max(C,Q,KV,I)] (u B^T; gradient half: dout * scale).
// mlp (NT = B rows): x0 [B,d0]; per layer l: h_l y_l [B,d_{l+1}]; losses [B] f32.
#ifndef FC_CUDA_ACTS_H
#define FC_CUDA_ACTS_H

#include <stddef.h>

#include "config.h"
#include "hd.h"

FC_BEGIN_DECLS

typedef struct {
    size_t ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj,
        res3;
} fc_cu_block_off;

typedef struct {
    size_t ln1, ln1_rstd, qp, kp, q, k, v, att, atty, attproj, res2, ln2, ln2_rstd, gate, up, h, down, res3;
} fc_cu_layer_off;  // one llama decoder layer

typedef struct {
    fc_model_kind kind;
    int B, T, NT;        // samples, tokens per sample (1 for mlp), rows
    size_t esz;          // bytes per element of the compute type
    size_t half;         // bytes of one half
    // byte offsets inside a half
    size_t encoded, lnf, lnf_mean, lnf_rstd, logits, losses;
    fc_cu_block_off *blk;  // [n_layer] gpt2
    fc_cu_layer_off *lay;  // [n_layer] llama
    size_t rope_cos, rope_sin, lora_u, lora_t;  // llama
    size_t x0;
    size_t *mlp_h, *mlp_y;  // [n_layers] mlp
    int n;                  // blocks or layers
} fc_cu_acts;

void fc_cu_acts_layout(fc_cu_acts *a, const fc_model_config *c, int B, int T, fc_prec p);
void fc_cu_acts_free(fc_cu_acts *a);

FC_END_DECLS

#endif
