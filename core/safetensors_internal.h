// core/safetensors_internal.h — what the safetensors files share and nothing
// outside them uses: safetensors.c (opening, reading, messages),
// safetensors_header.c (the header's validation) and safetensors_write.c.
#ifndef FC_SAFETENSORS_INTERNAL_H
#define FC_SAFETENSORS_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "check.h"
#include "safetensors.h"

// The data section is raw little-endian bytes and we copy it straight into
// native integers and floats, so a big-endian host would silently read garbage.
// Refuse to build there; hosts whose compiler lacks the macro get the runtime
// check in fc_st_host_little_endian() instead.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fsdpcheck reads safetensors data as raw little-endian bytes: big-endian is unsupported"
#endif

// Sizes from the file are uint64_t and are multiplied with fc_mul_size, which
// works in size_t: that is only exact when size_t is at least 64 bits.
_Static_assert(SIZE_MAX >= UINT64_MAX, "fsdpcheck needs a 64-bit size_t");

// JSON numbers reach us as doubles. Above 2^53 a double no longer holds every
// integer, so a larger shape or offset could have been rounded: refuse it.
#define FC_ST_MAX_JSON_INT 9007199254740992.0  // 2^53

#define FC_ST_META_KEY "__metadata__"

static inline int fc_st_host_little_endian(void) {
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 1;
}

// Every refusal of a file is "<source>: <what is wrong>", one line; returns -1.
int fc_st_fail(const char *src, fc_error *e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// A name from a file, cut to 64 bytes and made printable, for a message
// (returned by value: alive through the full expression that prints it).
typedef struct {
    char s[80];
} fc_st_shown;
fc_st_shown fc_st_show(const char *name);

// "[2,3]" for messages; "[]" for a scalar.
typedef struct {
    char s[8 * 21 + 4];
} fc_st_shown_shape;
fc_st_shown_shape fc_st_show_shape(const uint64_t *shape, int ndim);

// -1 if s[0..n) is UTF-8 without control bytes inside strings, else the offset
// of the first bad byte (*is_control: it is a control byte).
long long fc_st_bad_header_byte(const uint8_t *s, size_t n, int *is_control);
// Sorts keys[n] and returns a key that appears twice, or NULL.
const char *fc_st_find_duplicate(const char **keys, int n);

// Validates header bytes hdr[0..n) (hdr[n] == '\0') for a data section of
// data_len bytes and fills f's tensors and metadata; on failure f is empty.
int fc_st_parse_header(const char *src, const char *hdr, size_t n, uint64_t data_len, fc_st_file *f, fc_error *e);
// Frees what fc_st_parse_header filled in and zeroes f.
void fc_st_free_contents(fc_st_file *f);

#endif
