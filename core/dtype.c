// core/dtype.c — see dtype.h (the bit conversions are inline in round.h).
#include "dtype.h"

#include <string.h>

// ----------------------------------------------------------------------------
// element types

// Indexed by fc_dtype; the names are the safetensors header spellings.
static const struct {
    const char *name;
    size_t size;
} dtype_info[FC_DT_COUNT] = {
    [FC_DT_F64] = {"F64", 8},  [FC_DT_F32] = {"F32", 4},   [FC_DT_F16] = {"F16", 2},
    [FC_DT_BF16] = {"BF16", 2}, [FC_DT_I64] = {"I64", 8},  [FC_DT_I32] = {"I32", 4},
    [FC_DT_I16] = {"I16", 2},  [FC_DT_I8] = {"I8", 1},     [FC_DT_U64] = {"U64", 8},
    [FC_DT_U32] = {"U32", 4},  [FC_DT_U16] = {"U16", 2},   [FC_DT_U8] = {"U8", 1},
    [FC_DT_BOOL] = {"BOOL", 1},
};

// An enum can hold any int value, so out-of-range values are checked instead of
// trusted: a corrupted tag must not index past the table.
static int dtype_valid(fc_dtype t) { return (unsigned)t < (unsigned)FC_DT_COUNT; }

size_t fc_dtype_size(fc_dtype t) { return dtype_valid(t) ? dtype_info[t].size : 0; }

// "?" rather than NULL for an invalid tag so that diagnostics printing it with
// %s stay well defined.
const char *fc_dtype_name(fc_dtype t) { return dtype_valid(t) ? dtype_info[t].name : "?"; }

int fc_dtype_parse(const char *name, fc_dtype *out) {
    if (!name) return -1;
    for (int i = 0; i < FC_DT_COUNT; i++) {
        // exact and case-sensitive: safetensors only ever writes upper case, and
        // accepting "f32" would hide a malformed header
        if (strcmp(name, dtype_info[i].name) == 0) {
            if (out) *out = (fc_dtype)i;
            return 0;
        }
    }
    return -1;
}

// ----------------------------------------------------------------------------
// precisions

static const char *const prec_names[] = {
    [FC_PREC_FP32] = "fp32",
    [FC_PREC_BF16] = "bf16",
    [FC_PREC_FP16] = "fp16",
};
#define PREC_COUNT ((int)(sizeof prec_names / sizeof prec_names[0]))

const char *fc_prec_name(fc_prec p) {
    return (unsigned)p < (unsigned)PREC_COUNT ? prec_names[p] : "?";
}

int fc_prec_parse(const char *name, fc_prec *out) {
    if (!name) return -1;
    for (int i = 0; i < PREC_COUNT; i++) {
        if (strcmp(name, prec_names[i]) == 0) {
            if (out) *out = (fc_prec)i;
            return 0;
        }
    }
    return -1;
}

void fc_round_buffer(fc_prec p, float *x, size_t n) {
    if (p == FC_PREC_FP32) return;  // identity; skip the pass over memory
    for (size_t i = 0; i < n; i++) x[i] = fc_round(p, x[i]);
}
