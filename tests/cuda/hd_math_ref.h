// tests/cuda/hd_math_ref.h — see hd_math_ref.c.
#ifndef FC_HD_MATH_REF_H
#define FC_HD_MATH_REF_H

#include <stdint.h>

#include "dtype.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif
uint16_t ref_f32_to_bf16(float x);
uint16_t ref_f32_to_f16(float x);
float ref_bf16_to_f32(uint16_t h);
float ref_f16_to_f32(uint16_t h);
float ref_round(fc_prec p, float x);
void ref_adamw(float *p, float g, float *m, float *v, const fc_adamw_coeffs *k);
void ref_sgd(float *p, float g, float *b, const fc_sgd_coeffs *k);
#ifdef __cplusplus
}
#endif

#endif
