// fuzz/fuzz_safetensors.c — libFuzzer harness for the safetensors reader.
//
// Feeds the input to fc_st_open_mem as a whole file image. Whatever is
// accepted must then be safe to use: every tensor is read back (raw, and as
// float where the dtype converts) and the invariants the rest of fsdpcheck
// relies on are checked, so a header that slips past validation with an
// inconsistent tensor shows up as a crash here, not as a bad read later.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

// Reads are done in slices of at most this many elements, so the harness
// needs little memory whatever sizes the input claims.
#define SLICE 4096

static uint8_t raw[SLICE * 8];
static float conv[SLICE];

static void check(int ok) {
    if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fc_st_file f;
    fc_error e;
    if (fc_st_open_mem(data, size, &f, &e) != 0) {
        // a refusal leaves nothing behind and says why in one line
        check(f.tensors == NULL && f.meta == NULL && f.n_tensors == 0 && f.mem == NULL);
        check(e.msg[0] != '\0' && strchr(e.msg, '\n') == NULL);
        return 0;
    }
    check(f.data_start >= 8 && f.data_start <= size && f.file_size == size);
    uint64_t data_len = size - f.data_start, cursor = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const fc_st_tensor *t = &f.tensors[i];
        size_t esize = fc_dtype_size(t->dtype);
        // the tensors tile the data section in order, each holding exactly its shape
        check(esize > 0 && t->ndim >= 0 && t->ndim <= FC_ST_MAX_DIMS);
        check(t->begin == cursor && t->end >= t->begin && t->end <= data_len);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        check(numel == t->numel && t->end - t->begin == numel * esize);
        check(t->name[0] != '\0' && fc_st_find(&f, t->name) == t);
        cursor = t->end;

        for (uint64_t first = 0; first < t->numel; first += SLICE) {
            uint64_t count = t->numel - first < SLICE ? t->numel - first : SLICE;
            check(fc_st_read(&f, t, first, count, raw, &e) == 0);
            check(memcmp(raw, data + f.data_start + t->begin + first * esize, count * esize) == 0);
            int is_float = t->dtype == FC_DT_F32 || t->dtype == FC_DT_BF16 || t->dtype == FC_DT_F16;
            check((fc_st_read_f32(&f, t, first, count, conv, &e) == 0) == is_float);
        }
        // one past the end is always refused
        check(fc_st_read(&f, t, t->numel, 1, raw, &e) == -1);
        check(fc_st_read(&f, t, UINT64_MAX, 2, raw, &e) == -1);
    }
    check(cursor == data_len);
    for (int i = 0; i < f.n_meta; i++) {
        const char *v = fc_st_meta(&f, f.meta[i].key);
        check(v != NULL && strcmp(v, f.meta[i].value) == 0);
    }
    fc_st_close(&f);
    return 0;
}
