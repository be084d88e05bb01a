// core/dtype.h — element types and bf16/fp16 emulation.
//
// Mixed precision (docs/contract.md §4) is emulated on the CPU: a value "in bf16" is an
// fp32 value that has been rounded to the nearest bf16 (ties to even), exactly
// what a cast to torch.bfloat16 produces. These functions are the only place in
// fsdpcheck that knows the bit layouts.
#ifndef FC_DTYPE_H
#define FC_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "hd.h"

FC_BEGIN_DECLS

// Tensor element types as named in safetensors headers.
typedef enum {
    FC_DT_F64,
    FC_DT_F32,
    FC_DT_F16,
    FC_DT_BF16,
    FC_DT_I64,
    FC_DT_I32,
    FC_DT_I16,
    FC_DT_I8,
    FC_DT_U64,
    FC_DT_U32,
    FC_DT_U16,
    FC_DT_U8,
    FC_DT_BOOL,
    FC_DT_COUNT
} fc_dtype;

size_t fc_dtype_size(fc_dtype t);                    // bytes per element
const char *fc_dtype_name(fc_dtype t);               // "F32", "BF16", ...
int fc_dtype_parse(const char *name, fc_dtype *out); // 0 on success, -1 if unknown

// Compute/communication precisions of a mixed-precision policy.
typedef enum { FC_PREC_FP32, FC_PREC_BF16, FC_PREC_FP16 } fc_prec;

const char *fc_prec_name(fc_prec p);                 // "fp32", "bf16", "fp16"
int fc_prec_parse(const char *name, fc_prec *out);   // 0 on success, -1 if unknown

// Bytes per element of a precision: 4 for fp32, 2 for bf16 and fp16.
static inline FC_HD size_t fc_prec_size(fc_prec p) { return p == FC_PREC_FP32 ? 4 : 2; }

// Bit conversions and rounding (fc_f32_to_bf16, fc_bf16_to_f32, fc_f32_to_f16,
// fc_f16_to_f32, fc_round): inline in core/round.h, for CUDA device code too.
// f32 -> 16-bit rounds to nearest, ties to even; NaN stays a (quiet) NaN with
// its sign, values too large become +-Inf (IEEE overflow under
// round-to-nearest), values too small become signed zero or a subnormal.

// Rounds n values in place.
void fc_round_buffer(fc_prec p, float *x, size_t n);

FC_END_DECLS

#include "round.h"

#endif
