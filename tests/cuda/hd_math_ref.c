// tests/cuda/hd_math_ref.c — the FC_HD arithmetic of core/round.h and
// core/optim.h compiled by the C compiler, behind plain functions, so that
// test_hd_math.cu can compare nvcc's host and device builds of the same
// inline code with it bit for bit.
#include "hd_math_ref.h"

uint16_t ref_f32_to_bf16(float x) { return fc_f32_to_bf16(x); }
uint16_t ref_f32_to_f16(float x) { return fc_f32_to_f16(x); }
float ref_bf16_to_f32(uint16_t h) { return fc_bf16_to_f32(h); }
float ref_f16_to_f32(uint16_t h) { return fc_f16_to_f32(h); }
float ref_round(fc_prec p, float x) { return fc_round(p, x); }
void ref_adamw(float *p, float g, float *m, float *v, const fc_adamw_coeffs *k) { fc_adamw_elem(p, g, m, v, k); }
void ref_sgd(float *p, float g, float *b, const fc_sgd_coeffs *k) { fc_sgd_elem(p, g, b, k); }
