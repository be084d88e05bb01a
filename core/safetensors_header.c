// core/safetensors_header.c — a safetensors header, validated: UTF-8 and JSON,
// every tensor's dtype, shape and offsets, the metadata, and the tensors
// tiling the data section. See safetensors.h (the reader trusts nothing).
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cJSON.h"
#include "safetensors_internal.h"

static const char *json_type_name(const cJSON *v) {
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "an invalid value";
}

// The header must be UTF-8 (the spec says so, and names are compared byte-wise,
// so a malformed sequence would make a name nobody can look up). Also refuses
// control bytes: JSON allows none inside strings and only tab, newline and
// carriage return between tokens, but cJSON lets them through inside strings,
// where a NUL would silently cut a name short. String boundaries are tracked
// lexically ('"' not preceded by an escaping backslash), which is all JSON
// needs. Returns -1 if all is well, else the offset of the first bad byte.
long long fc_st_bad_header_byte(const uint8_t *s, size_t n, int *is_control) {
    size_t i = 0;
    int in_string = 0, escaped = 0;
    *is_control = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            int whitespace = c == '\t' || c == '\n' || c == '\r';
            if (c < 0x20 && (in_string || !whitespace)) {
                *is_control = 1;
                return (long long)i;
            }
            if (in_string && escaped) escaped = 0;
            else if (in_string && c == '\\') escaped = 1;
            else if (c == '"') in_string = !in_string;
            i++;
            continue;
        }
        escaped = 0;
        // lead byte: how many continuation bytes, and the smallest code point
        // that may use this length (anything smaller is an overlong encoding)
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return (long long)i;
        if (len > n - i) return (long long)i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return (long long)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (long long)i;
        i += len;
    }
    return -1;
}

// Reads a JSON number that must be a size or an offset: a non-negative integer
// a double holds exactly. On refusal writes the reason (" = 1.5 is not an
// integer") to why and returns -1; nothing is ever rounded or truncated.
static int json_uint(const cJSON *v, uint64_t *out, char *why, size_t why_cap) {
    if (!cJSON_IsNumber(v)) {
        snprintf(why, why_cap, " is %s, not a number", json_type_name(v));
        return -1;
    }
    double d = v->valuedouble;
    if (d < 0) {
        snprintf(why, why_cap, " = %.17g is negative", d);
        return -1;
    }
    if (!(d <= FC_ST_MAX_JSON_INT)) {  // also catches inf, which "1e999" parses to
        snprintf(why, why_cap, " = %.17g is larger than 2^53", d);
        return -1;
    }
    uint64_t u = (uint64_t)d;  // defined: 0 <= d <= 2^53
    if ((double)u != d) {
        snprintf(why, why_cap, " = %.17g is not an integer", d);
        return -1;
    }
    *out = u;
    return 0;
}

// Data-offset order; zero-size tensors can share an offset with their
// neighbour, so ties go by end and then by (unique) name, which keeps the order
// deterministic.
static int cmp_tensor(const void *a, const void *b) {
    const fc_st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int parse_metadata(const char *src, const cJSON *obj, fc_st_file *f, fc_error *e) {
    if (!cJSON_IsObject(obj)) {
        return fc_st_fail(src, e, "__metadata__ is %s, not an object of strings", json_type_name(obj));
    }
    int n = cJSON_GetArraySize(obj);
    const char **keys = mallocCheck((size_t)(n > 0 ? n : 1) * sizeof *keys);
    int k = 0;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, obj) {
        if (!cJSON_IsString(kv) || !kv->valuestring) {
            int rc = fc_st_fail(src, e, "__metadata__ value for key '%s' is %s, not a string",
                             fc_st_show(kv->string).s, json_type_name(kv));
            free(keys);
            return rc;
        }
        keys[k++] = kv->string;
    }
    const char *dup = fc_st_find_duplicate(keys, k);
    if (dup) {
        int rc = fc_st_fail(src, e, "duplicate __metadata__ key '%s'", fc_st_show(dup).s);
        free(keys);
        return rc;
    }
    free(keys);
    f->meta = callocCheck((size_t)(n > 0 ? n : 1), sizeof *f->meta);
    cJSON_ArrayForEach(kv, obj) {
        f->meta[f->n_meta].key = strdupCheck(kv->string);
        f->meta[f->n_meta].value = strdupCheck(kv->valuestring);
        f->n_meta++;
    }
    return 0;
}

// The tensor entry being checked: where it is from, its shown name, and where
// a failure goes.
typedef struct {
    const char *src;
    const char *nm;
    fc_error *e;
} tensor_ctx;

// Every message of the tensor checks below starts "tensor 'NAME': "; the
// first argument is x->nm.
#define TFAIL(...) fc_st_fail(x->src, x->e, "tensor '%s': " __VA_ARGS__)

// Exactly the three known keys, each once: an unknown key may mean a format
// we do not understand, and a repeated one is ambiguous.
static int tensor_keys(const tensor_ctx *x, const cJSON *obj, const cJSON **dtype, const cJSON **shape,
                       const cJSON **offsets) {
    const cJSON *kv;
    cJSON_ArrayForEach(kv, obj) {
        const cJSON **slot = NULL;
        if (strcmp(kv->string, "dtype") == 0) slot = dtype;
        else if (strcmp(kv->string, "shape") == 0) slot = shape;
        else if (strcmp(kv->string, "data_offsets") == 0) slot = offsets;
        else return TFAIL("unknown key '%s'", x->nm, fc_st_show(kv->string).s);
        if (*slot) return TFAIL("duplicate key '%s'", x->nm, kv->string);
        *slot = kv;
    }
    if (!*dtype) return TFAIL("missing key 'dtype'", x->nm);
    if (!*shape) return TFAIL("missing key 'shape'", x->nm);
    if (!*offsets) return TFAIL("missing key 'data_offsets'", x->nm);
    return 0;
}

// The dtype and shape, and from them numel; numel times the dtype's size
// (the byte size) is checked to fit too, so later code may compute it.
static int tensor_shape(const tensor_ctx *x, const cJSON *dtype, const cJSON *shape, fc_st_tensor *t) {
    if (!cJSON_IsString(dtype) || !dtype->valuestring) {
        return TFAIL("dtype is %s, not a string", x->nm, json_type_name(dtype));
    }
    if (fc_dtype_parse(dtype->valuestring, &t->dtype) != 0) {
        return TFAIL("unknown dtype '%s'", x->nm, fc_st_show(dtype->valuestring).s);
    }

    if (!cJSON_IsArray(shape)) {
        return TFAIL("shape is %s, not an array", x->nm, json_type_name(shape));
    }
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > FC_ST_MAX_DIMS) {
        return TFAIL("shape has %d dimensions, at most %d are supported", x->nm,
                     ndim, FC_ST_MAX_DIMS);
    }
    t->ndim = 0;
    const cJSON *dim;
    char why[96];
    cJSON_ArrayForEach(dim, shape) {
        if (json_uint(dim, &t->shape[t->ndim], why, sizeof why) != 0) {
            return TFAIL("shape[%d]%s", x->nm, t->ndim, why);
        }
        t->ndim++;
    }
    // numel and the byte size are products of untrusted numbers: check for
    // overflow before comparing them with anything
    size_t numel = 1, nbytes;
    for (int i = 0; i < t->ndim; i++) {
        if (fc_mul_size(numel, (size_t)t->shape[i], &numel) != 0) {
            return TFAIL("shape %s has more elements than fit in 64 bits", x->nm,
                         fc_st_show_shape(t->shape, t->ndim).s);
        }
    }
    t->numel = numel;
    if (fc_mul_size(numel, fc_dtype_size(t->dtype), &nbytes) != 0) {
        return TFAIL("%s %s is too large: its byte size overflows 64 bits", x->nm,
                     fc_dtype_name(t->dtype), fc_st_show_shape(t->shape, t->ndim).s);
    }
    return 0;
}

// data_offsets [begin,end]: inside the data section and exactly the byte size
// of t's dtype and shape (which tensor_shape checked does not overflow).
static int tensor_offsets(const tensor_ctx *x, const cJSON *offsets, uint64_t data_len, fc_st_tensor *t) {
    char why[96];
    if (!cJSON_IsArray(offsets)) {
        return TFAIL("data_offsets is %s, not an array [begin,end]", x->nm,
                     json_type_name(offsets));
    }
    int n_off = cJSON_GetArraySize(offsets);
    if (n_off != 2) {
        return TFAIL("data_offsets has %d elements, expected exactly 2 [begin,end]",
                     x->nm, n_off);
    }
    if (json_uint(cJSON_GetArrayItem(offsets, 0), &t->begin, why, sizeof why) != 0) {
        return TFAIL("data_offsets[0]%s", x->nm, why);
    }
    if (json_uint(cJSON_GetArrayItem(offsets, 1), &t->end, why, sizeof why) != 0) {
        return TFAIL("data_offsets[1]%s", x->nm, why);
    }
    if (t->begin > t->end) {
        return TFAIL("data_offsets [%" PRIu64 ",%" PRIu64 "] have begin > end",
                     x->nm, t->begin, t->end);
    }
    if (t->end > data_len) {
        return TFAIL("data_offsets [%" PRIu64 ",%" PRIu64
                     "] run past the end of the data section (%" PRIu64 " bytes)",
                     x->nm, t->begin, t->end, data_len);
    }
    size_t nbytes = (size_t)t->numel * fc_dtype_size(t->dtype);
    if (t->end - t->begin != nbytes) {
        return TFAIL("data_offsets [%" PRIu64 ",%" PRIu64 "] hold %" PRIu64
                     " bytes but %s %s needs %zu",
                     x->nm, t->begin, t->end, t->end - t->begin,
                     fc_dtype_name(t->dtype), fc_st_show_shape(t->shape, t->ndim).s, nbytes);
    }
    return 0;
}

// Validates one tensor entry {"dtype","shape","data_offsets"} on its own:
// everything except how it sits next to the other tensors.
static int parse_tensor(const char *src, const cJSON *obj, uint64_t data_len, fc_st_tensor *t,
                        fc_error *e) {
    const fc_st_shown nm = fc_st_show(obj->string);
    const tensor_ctx ctx = {src, nm.s, e}, *x = &ctx;
    if (!cJSON_IsObject(obj)) {
        return TFAIL("entry is %s, not an object", x->nm, json_type_name(obj));
    }
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    if (tensor_keys(x, obj, &dtype, &shape, &offsets) || tensor_shape(x, dtype, shape, t) ||
        tensor_offsets(x, offsets, data_len, t))
        return -1;
    t->name = strdupCheck(obj->string);
    return 0;
}
#undef TFAIL

// The spec requires the data section to be entirely indexed: sorted by
// offset, the tensors must tile [0, data_len) with no overlap (two tensors
// sharing bytes) and no hole (bytes nobody owns, e.g. a truncated or spliced
// file whose header still parses).
static int check_tiling(const char *src, const fc_st_file *f, uint64_t data_len, fc_error *e) {
    uint64_t cursor = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const fc_st_tensor *t = &f->tensors[i];
        if (t->begin > cursor) {
            return fc_st_fail(src, e,
                           "bytes [%" PRIu64 ",%" PRIu64 ") of the data section belong to no "
                           "tensor (a hole before tensor '%s')",
                           cursor, t->begin, fc_st_show(t->name).s);
        }
        if (t->begin < cursor) {
            // sorted by begin, so the tensor that moved cursor here is the one before
            const fc_st_tensor *p = &f->tensors[i - 1];
            return fc_st_fail(src, e,
                           "tensor '%s' data_offsets [%" PRIu64 ",%" PRIu64 "] overlap tensor "
                           "'%s' [%" PRIu64 ",%" PRIu64 "]",
                           fc_st_show(t->name).s, t->begin, t->end, fc_st_show(p->name).s, p->begin, p->end);
        }
        cursor = t->end;
    }
    if (cursor != data_len) {
        return fc_st_fail(src, e,
                       "data section has %" PRIu64 " bytes but the tensors cover only [0,%" PRIu64
                       "): %" PRIu64 " trailing bytes belong to no tensor",
                       data_len, cursor, data_len - cursor);
    }
    return 0;
}

// Parses and validates header bytes hdr[0..n) (hdr[n] is a NUL we added) for a
// data section of data_len bytes, filling f's tensors and metadata. On failure
// f is left empty.
int fc_st_parse_header(const char *src, const char *hdr, size_t n, uint64_t data_len,
                        fc_st_file *f, fc_error *e) {
    int is_control;
    long long bad = fc_st_bad_header_byte((const uint8_t *)hdr, n, &is_control);
    if (bad >= 0) {
        if (is_control) {
            return fc_st_fail(src, e, "header contains control byte 0x%02x at offset %lld",
                           (unsigned char)hdr[bad], bad);
        }
        return fc_st_fail(src, e, "header is not valid UTF-8 (byte 0x%02x at offset %lld)",
                       (unsigned char)hdr[bad], bad);
    }

    // Parse without requiring a terminator so we learn where the JSON ended:
    // the only thing allowed after it is the writer's space padding.
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - hdr) : 0;
        return fc_st_fail(src, e, "header is not valid JSON (parse error near byte %zu of %zu)", at,
                       n);
    }
    for (const char *p = end; p < hdr + n; p++) {
        if (*p != ' ') {
            cJSON_Delete(root);
            return fc_st_fail(src, e,
                           "header has trailing byte 0x%02x at offset %zu after the JSON; only "
                           "space padding may follow it",
                           (unsigned char)*p, (size_t)(p - hdr));
        }
    }
    if (!cJSON_IsObject(root)) {
        int rc = fc_st_fail(src, e, "header is %s, not a JSON object", json_type_name(root));
        cJSON_Delete(root);
        return rc;
    }

    // Names first, on their own, so the message for a duplicate does not
    // depend on what else is wrong with the entries.
    int n_keys = cJSON_GetArraySize(root), n_tensors = 0, rc = 0;
    const char **keys = mallocCheck((size_t)(n_keys > 0 ? n_keys : 1) * sizeof *keys);
    const cJSON *item;
    int k = 0;
    cJSON_ArrayForEach(item, root) {
        if (!item->string || item->string[0] == '\0') {
            rc = fc_st_fail(src, e, "empty tensor name in header");
            break;
        }
        keys[k++] = item->string;
        if (strcmp(item->string, FC_ST_META_KEY) != 0) n_tensors++;
    }
    const char *dup = rc == 0 ? fc_st_find_duplicate(keys, k) : NULL;
    if (dup && strcmp(dup, FC_ST_META_KEY) == 0) rc = fc_st_fail(src, e, "duplicate __metadata__ in header");
    else if (dup) rc = fc_st_fail(src, e, "duplicate tensor name '%s'", fc_st_show(dup).s);
    free(keys);

    if (rc == 0) {
        f->tensors = callocCheck((size_t)(n_tensors > 0 ? n_tensors : 1), sizeof *f->tensors);
        cJSON_ArrayForEach(item, root) {
            if (strcmp(item->string, FC_ST_META_KEY) == 0) {
                rc = parse_metadata(src, item, f, e);
            } else {
                rc = parse_tensor(src, item, data_len, &f->tensors[f->n_tensors], e);
                if (rc == 0) f->n_tensors++;
            }
            if (rc != 0) break;
        }
    }
    cJSON_Delete(root);
    if (rc == 0) {
        qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor);
        rc = check_tiling(src, f, data_len, e);
    }
    if (rc != 0) fc_st_free_contents(f);
    return rc;
}
