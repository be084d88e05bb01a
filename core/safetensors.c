// core/safetensors.c — see safetensors.h.
//
// Reading happens in two steps. fc_st_open reads the 8-byte length and the
// JSON header only, and validates all of it against the real size of the file
// before anything else is believed: a length, an offset or a shape that came
// from the file is just a claim until it has been checked. After that,
// fc_st_read fetches exactly the bytes of one element range, so a rank loading
// its shard of a large checkpoint never holds the whole file.
//
// Writing builds the header with cJSON, writes everything to a temporary name,
// fsyncs it and renames it into place, so a crash leaves either the old file or
// the complete new one, never a torn one.
#include "safetensors.h"

#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "cJSON.h"

// The data section is raw little-endian bytes and we copy it straight into
// native integers and floats, so a big-endian host would silently read garbage.
// Refuse to build there; hosts whose compiler lacks the macro get the runtime
// check in host_little_endian() instead.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fsdpcheck reads safetensors data as raw little-endian bytes: big-endian is unsupported"
#endif

// Sizes from the file are uint64_t and are multiplied with fc_mul_size, which
// works in size_t: that is only exact when size_t is at least 64 bits.
_Static_assert(SIZE_MAX >= UINT64_MAX, "fsdpcheck needs a 64-bit size_t");

// JSON numbers reach us as doubles. Above 2^53 a double no longer holds every
// integer, so a larger shape or offset could have been rounded: refuse it.
#define ST_MAX_JSON_INT 9007199254740992.0  // 2^53

#define META_KEY "__metadata__"

static int host_little_endian(void) {
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 1;
}

// ----------------------------------------------------------------------------
// error messages

// Every refusal of a file is "<source>: <what is wrong>", one line.
static int st_fail(const char *src, fc_error *e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int st_fail(const char *src, fc_error *e, const char *fmt, ...) {
    char what[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fc_fail(e, "%s: %s", src, what);
}

// A name from a file can be long or hold newlines and other control bytes;
// shown in a message it is cut to 64 bytes and made printable so the message
// stays one readable line. Returned by value: C11 keeps the array alive until
// the end of the full expression, i.e. through the fc_fail call that prints it.
typedef struct {
    char s[80];
} shown_name;

static shown_name show(const char *name) {
    shown_name r;
    size_t len = strlen(name), n = len < 64 ? len : 64, i;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        r.s[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (len > n) memcpy(r.s + i, "...", 4);
    else r.s[i] = '\0';
    return r;
}

// "[2,3]" for messages; "[]" for a scalar.
typedef struct {
    char s[8 * 21 + 4];
} shown_shape;

static shown_shape show_shape(const uint64_t *shape, int ndim) {
    shown_shape r;
    size_t at = 0;
    r.s[at++] = '[';
    for (int i = 0; i < ndim; i++) {
        at += (size_t)snprintf(r.s + at, sizeof r.s - at, "%s%" PRIu64, i ? "," : "", shape[i]);
    }
    snprintf(r.s + at, sizeof r.s - at, "]");
    return r;
}

static const char *json_type_name(const cJSON *v) {
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "an invalid value";
}

// ----------------------------------------------------------------------------
// header validation

// The header must be UTF-8 (the spec says so, and names are compared byte-wise,
// so a malformed sequence would make a name nobody can look up). Also refuses
// control bytes: JSON allows none inside strings and only tab, newline and
// carriage return between tokens, but cJSON lets them through inside strings,
// where a NUL would silently cut a name short. String boundaries are tracked
// lexically ('"' not preceded by an escaping backslash), which is all JSON
// needs. Returns -1 if all is well, else the offset of the first bad byte.
static long long bad_header_byte(const uint8_t *s, size_t n, int *is_control) {
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
    if (!(d <= ST_MAX_JSON_INT)) {  // also catches inf, which "1e999" parses to
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

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// cJSON keeps every duplicate key of an object, and a lookup would quietly
// pick the first, so duplicates are found explicitly: sort the keys and
// compare neighbours. Returns the duplicated key, or NULL.
static const char *find_duplicate(const char **keys, int n) {
    if (n < 2) return NULL;
    qsort(keys, (size_t)n, sizeof keys[0], cmp_str_ptr);
    for (int i = 1; i < n; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) return keys[i];
    }
    return NULL;
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

// Frees what fc_st_open may have filled in so far and zeroes f.
static void free_contents(fc_st_file *f) {
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    memset(f, 0, sizeof *f);
}

static int parse_metadata(const char *src, const cJSON *obj, fc_st_file *f, fc_error *e) {
    if (!cJSON_IsObject(obj)) {
        return st_fail(src, e, "__metadata__ is %s, not an object of strings", json_type_name(obj));
    }
    int n = cJSON_GetArraySize(obj);
    const char **keys = mallocCheck((size_t)(n > 0 ? n : 1) * sizeof *keys);
    int k = 0;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, obj) {
        if (!cJSON_IsString(kv) || !kv->valuestring) {
            int rc = st_fail(src, e, "__metadata__ value for key '%s' is %s, not a string",
                             show(kv->string).s, json_type_name(kv));
            free(keys);
            return rc;
        }
        keys[k++] = kv->string;
    }
    const char *dup = find_duplicate(keys, k);
    if (dup) {
        int rc = st_fail(src, e, "duplicate __metadata__ key '%s'", show(dup).s);
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

// Validates one tensor entry {"dtype","shape","data_offsets"} on its own:
// everything except how it sits next to the other tensors.
static int parse_tensor(const char *src, const cJSON *obj, uint64_t data_len, fc_st_tensor *t,
                        fc_error *e) {
    const shown_name nm = show(obj->string);
    // every message below starts "tensor 'NAME': "; the first argument is nm.s
#define TFAIL(...) st_fail(src, e, "tensor '%s': " __VA_ARGS__)
    if (!cJSON_IsObject(obj)) {
        return TFAIL("entry is %s, not an object", nm.s, json_type_name(obj));
    }
    // exactly the three known keys, each once: an unknown key may mean a
    // format we do not understand, and a repeated one is ambiguous
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL, *kv;
    cJSON_ArrayForEach(kv, obj) {
        const cJSON **slot = NULL;
        if (strcmp(kv->string, "dtype") == 0) slot = &dtype;
        else if (strcmp(kv->string, "shape") == 0) slot = &shape;
        else if (strcmp(kv->string, "data_offsets") == 0) slot = &offsets;
        else return TFAIL("unknown key '%s'", nm.s, show(kv->string).s);
        if (*slot) return TFAIL("duplicate key '%s'", nm.s, kv->string);
        *slot = kv;
    }
    if (!dtype) return TFAIL("missing key 'dtype'", nm.s);
    if (!shape) return TFAIL("missing key 'shape'", nm.s);
    if (!offsets) return TFAIL("missing key 'data_offsets'", nm.s);

    if (!cJSON_IsString(dtype) || !dtype->valuestring) {
        return TFAIL("dtype is %s, not a string", nm.s, json_type_name(dtype));
    }
    if (fc_dtype_parse(dtype->valuestring, &t->dtype) != 0) {
        return TFAIL("unknown dtype '%s'", nm.s, show(dtype->valuestring).s);
    }

    if (!cJSON_IsArray(shape)) {
        return TFAIL("shape is %s, not an array", nm.s, json_type_name(shape));
    }
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > FC_ST_MAX_DIMS) {
        return TFAIL("shape has %d dimensions, at most %d are supported", nm.s,
                     ndim, FC_ST_MAX_DIMS);
    }
    t->ndim = 0;
    const cJSON *dim;
    char why[96];
    cJSON_ArrayForEach(dim, shape) {
        if (json_uint(dim, &t->shape[t->ndim], why, sizeof why) != 0) {
            return TFAIL("shape[%d]%s", nm.s, t->ndim, why);
        }
        t->ndim++;
    }
    // numel and the byte size are products of untrusted numbers: check for
    // overflow before comparing them with anything
    size_t numel = 1, nbytes;
    for (int i = 0; i < t->ndim; i++) {
        if (fc_mul_size(numel, (size_t)t->shape[i], &numel) != 0) {
            return TFAIL("shape %s has more elements than fit in 64 bits", nm.s,
                         show_shape(t->shape, t->ndim).s);
        }
    }
    t->numel = numel;
    if (fc_mul_size(numel, fc_dtype_size(t->dtype), &nbytes) != 0) {
        return TFAIL("%s %s is too large: its byte size overflows 64 bits", nm.s,
                     fc_dtype_name(t->dtype), show_shape(t->shape, t->ndim).s);
    }

    if (!cJSON_IsArray(offsets)) {
        return TFAIL("data_offsets is %s, not an array [begin,end]", nm.s,
                     json_type_name(offsets));
    }
    int n_off = cJSON_GetArraySize(offsets);
    if (n_off != 2) {
        return TFAIL("data_offsets has %d elements, expected exactly 2 [begin,end]",
                     nm.s, n_off);
    }
    if (json_uint(cJSON_GetArrayItem(offsets, 0), &t->begin, why, sizeof why) != 0) {
        return TFAIL("data_offsets[0]%s", nm.s, why);
    }
    if (json_uint(cJSON_GetArrayItem(offsets, 1), &t->end, why, sizeof why) != 0) {
        return TFAIL("data_offsets[1]%s", nm.s, why);
    }
    if (t->begin > t->end) {
        return TFAIL("data_offsets [%" PRIu64 ",%" PRIu64 "] have begin > end",
                     nm.s, t->begin, t->end);
    }
    if (t->end > data_len) {
        return TFAIL("data_offsets [%" PRIu64 ",%" PRIu64
                     "] run past the end of the data section (%" PRIu64 " bytes)",
                     nm.s, t->begin, t->end, data_len);
    }
    if (t->end - t->begin != nbytes) {
        return TFAIL("data_offsets [%" PRIu64 ",%" PRIu64 "] hold %" PRIu64
                     " bytes but %s %s needs %zu",
                     nm.s, t->begin, t->end, t->end - t->begin,
                     fc_dtype_name(t->dtype), show_shape(t->shape, t->ndim).s, nbytes);
    }
#undef TFAIL
    t->name = strdupCheck(obj->string);
    return 0;
}

// The spec requires the data section to be entirely indexed: sorted by
// offset, the tensors must tile [0, data_len) with no overlap (two tensors
// sharing bytes) and no hole (bytes nobody owns, e.g. a truncated or spliced
// file whose header still parses).
static int check_tiling(const char *src, const fc_st_file *f, uint64_t data_len, fc_error *e) {
    uint64_t cursor = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const fc_st_tensor *t = &f->tensors[i];
        if (t->begin > cursor) {
            return st_fail(src, e,
                           "bytes [%" PRIu64 ",%" PRIu64 ") of the data section belong to no "
                           "tensor (a hole before tensor '%s')",
                           cursor, t->begin, show(t->name).s);
        }
        if (t->begin < cursor) {
            // sorted by begin, so the tensor that moved cursor here is the one before
            const fc_st_tensor *p = &f->tensors[i - 1];
            return st_fail(src, e,
                           "tensor '%s' data_offsets [%" PRIu64 ",%" PRIu64 "] overlap tensor "
                           "'%s' [%" PRIu64 ",%" PRIu64 "]",
                           show(t->name).s, t->begin, t->end, show(p->name).s, p->begin, p->end);
        }
        cursor = t->end;
    }
    if (cursor != data_len) {
        return st_fail(src, e,
                       "data section has %" PRIu64 " bytes but the tensors cover only [0,%" PRIu64
                       "): %" PRIu64 " trailing bytes belong to no tensor",
                       data_len, cursor, data_len - cursor);
    }
    return 0;
}

// Parses and validates header bytes hdr[0..n) (hdr[n] is a NUL we added) for a
// data section of data_len bytes, filling f's tensors and metadata. On failure
// f is left empty.
static int parse_header(const char *src, const char *hdr, size_t n, uint64_t data_len,
                        fc_st_file *f, fc_error *e) {
    int is_control;
    long long bad = bad_header_byte((const uint8_t *)hdr, n, &is_control);
    if (bad >= 0) {
        if (is_control) {
            return st_fail(src, e, "header contains control byte 0x%02x at offset %lld",
                           (unsigned char)hdr[bad], bad);
        }
        return st_fail(src, e, "header is not valid UTF-8 (byte 0x%02x at offset %lld)",
                       (unsigned char)hdr[bad], bad);
    }

    // Parse without requiring a terminator so we learn where the JSON ended:
    // the only thing allowed after it is the writer's space padding.
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, n, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - hdr) : 0;
        return st_fail(src, e, "header is not valid JSON (parse error near byte %zu of %zu)", at,
                       n);
    }
    for (const char *p = end; p < hdr + n; p++) {
        if (*p != ' ') {
            cJSON_Delete(root);
            return st_fail(src, e,
                           "header has trailing byte 0x%02x at offset %zu after the JSON; only "
                           "space padding may follow it",
                           (unsigned char)*p, (size_t)(p - hdr));
        }
    }
    if (!cJSON_IsObject(root)) {
        int rc = st_fail(src, e, "header is %s, not a JSON object", json_type_name(root));
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
            rc = st_fail(src, e, "empty tensor name in header");
            break;
        }
        keys[k++] = item->string;
        if (strcmp(item->string, META_KEY) != 0) n_tensors++;
    }
    const char *dup = rc == 0 ? find_duplicate(keys, k) : NULL;
    if (dup && strcmp(dup, META_KEY) == 0) rc = st_fail(src, e, "duplicate __metadata__ in header");
    else if (dup) rc = st_fail(src, e, "duplicate tensor name '%s'", show(dup).s);
    free(keys);

    if (rc == 0) {
        f->tensors = callocCheck((size_t)(n_tensors > 0 ? n_tensors : 1), sizeof *f->tensors);
        cJSON_ArrayForEach(item, root) {
            if (strcmp(item->string, META_KEY) == 0) {
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
    if (rc != 0) free_contents(f);
    return rc;
}

// Checks the header length N against the file before it is used for anything
// (in particular before N bytes are allocated).
static int check_header_len(const char *src, uint64_t file_size, uint64_t n, fc_error *e) {
    if (n == 0) return st_fail(src, e, "header length is 0; a header holds at least \"{}\"");
    if (n > FC_ST_MAX_HEADER) {
        return st_fail(src, e, "header length %" PRIu64 " exceeds the limit of %u bytes", n,
                       FC_ST_MAX_HEADER);
    }
    if (n > file_size - 8) {
        return st_fail(src, e,
                       "header length %" PRIu64 " runs past the end of the file (%" PRIu64
                       " bytes, so at most %" PRIu64 " are left after the length)",
                       n, file_size, file_size - 8);
    }
    return 0;
}

static uint64_t le64(const uint8_t b[8]) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static int check_file_size(const char *src, uint64_t size, fc_error *e) {
    if (!host_little_endian()) {
        return st_fail(src, e, "this host is big-endian; safetensors data is little-endian");
    }
    if (size < 8) {
        return st_fail(src, e, "file is %" PRIu64 " bytes, shorter than the 8-byte header length",
                       size);
    }
    return 0;
}

int fc_st_open(const char *path, fc_st_file *f, fc_error *e) {
    memset(f, 0, sizeof *f);
    if (!path) return fc_fail(e, "fc_st_open: no path");
    FILE *fp = fopen(path, "rb");
    if (!fp) return st_fail(path, e, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        int rc = st_fail(path, e, "cannot stat: %s", strerror(errno));
        fclose(fp);
        return rc;
    }
    // the size must be real for the checks to mean anything: no pipes or devices
    if (!S_ISREG(st.st_mode)) {
        fclose(fp);
        return st_fail(path, e, "not a regular file");
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t len_bytes[8];
    if (check_file_size(path, size, e) != 0) {
        fclose(fp);
        return -1;
    }
    if (fread(len_bytes, 1, 8, fp) != 8) {
        fclose(fp);
        return st_fail(path, e, "cannot read the header length");
    }
    uint64_t n = le64(len_bytes);
    if (check_header_len(path, size, n, e) != 0) {
        fclose(fp);
        return -1;
    }
    char *hdr = mallocCheck((size_t)n + 1);
    if (fread(hdr, 1, (size_t)n, fp) != (size_t)n) {
        free(hdr);
        fclose(fp);
        return st_fail(path, e, "short read of the %" PRIu64 "-byte header", n);
    }
    hdr[n] = '\0';
    int rc = parse_header(path, hdr, (size_t)n, size - 8 - n, f, e);
    free(hdr);
    if (rc != 0) {
        fclose(fp);
        return -1;
    }
    f->fp = fp;
    f->file_size = size;
    f->data_start = 8 + n;
    return 0;
}

int fc_st_open_mem(const uint8_t *data, size_t size, fc_st_file *f, fc_error *e) {
    const char *src = "(memory)";
    memset(f, 0, sizeof *f);
    if (!data && size > 0) return st_fail(src, e, "no buffer");
    if (check_file_size(src, size, e) != 0) return -1;
    uint64_t n = le64(data);
    if (check_header_len(src, size, n, e) != 0) return -1;
    // A NUL-terminated private copy: cJSON then cannot run off the end of the
    // caller's buffer whatever the header holds.
    char *hdr = mallocCheck((size_t)n + 1);
    memcpy(hdr, data + 8, (size_t)n);
    hdr[n] = '\0';
    int rc = parse_header(src, hdr, (size_t)n, size - 8 - n, f, e);
    free(hdr);
    if (rc != 0) return -1;
    f->mem = data;
    f->file_size = size;
    f->data_start = 8 + n;
    return 0;
}

void fc_st_close(fc_st_file *f) {
    if (!f) return;
    if (f->fp) fclose(f->fp);  // read-only: nothing to lose if this fails
    free_contents(f);
}

const fc_st_tensor *fc_st_find(const fc_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    }
    return NULL;
}

const char *fc_st_meta(const fc_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++) {
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// reading tensor data

// Range checks shared by both readers. first+count is never formed, so huge
// values cannot wrap around into a valid-looking range.
static int check_range(const fc_st_file *f, const fc_st_tensor *t, uint64_t first, uint64_t count,
                       const void *dst, fc_error *e) {
    if (!f || (!f->fp && !f->mem)) return fc_fail(e, "safetensors file is not open");
    uintptr_t p = (uintptr_t)t, lo = (uintptr_t)f->tensors,
              hi = (uintptr_t)(f->tensors + f->n_tensors);
    if (!t || p < lo || p >= hi) {
        return fc_fail(e, "tensor does not belong to this safetensors file");
    }
    if (first > t->numel || count > t->numel - first) {
        return fc_fail(e,
                       "tensor '%s': elements [%" PRIu64 ", +%" PRIu64
                       ") are out of range (it has %" PRIu64 " elements)",
                       show(t->name).s, first, count, t->numel);
    }
    if (count > 0 && !dst) return fc_fail(e, "tensor '%s': no destination buffer", show(t->name).s);
    return 0;
}

int fc_st_read(fc_st_file *f, const fc_st_tensor *t, uint64_t first, uint64_t count, void *dst,
               fc_error *e) {
    if (check_range(f, t, first, count, dst, e) != 0) return -1;
    if (count == 0) return 0;
    // cannot overflow: count <= numel and numel * size was checked at open
    size_t esize = fc_dtype_size(t->dtype), nbytes = (size_t)count * esize;
    uint64_t off = f->data_start + t->begin + first * esize;
    if (f->mem) {
        memcpy(dst, f->mem + off, nbytes);
        return 0;
    }
    if (fseeko(f->fp, (off_t)off, SEEK_SET) != 0) {
        return fc_fail(e, "tensor '%s': cannot seek to byte %" PRIu64 ": %s", show(t->name).s, off,
                       strerror(errno));
    }
    if (fread(dst, 1, nbytes, f->fp) != nbytes) {
        // validated at open, so the file must have changed (been truncated) since
        return fc_fail(e, "tensor '%s': short read of %zu bytes at byte %" PRIu64
                          " (file truncated since it was opened?)",
                       show(t->name).s, nbytes, off);
    }
    return 0;
}

int fc_st_read_f32(fc_st_file *f, const fc_st_tensor *t, uint64_t first, uint64_t count,
                   float *dst, fc_error *e) {
    if (check_range(f, t, first, count, dst, e) != 0) return -1;
    if (t->dtype == FC_DT_F32) return fc_st_read(f, t, first, count, dst, e);
    if (t->dtype != FC_DT_BF16 && t->dtype != FC_DT_F16) {
        return fc_fail(e, "tensor '%s' is %s; only F32, BF16 and F16 convert to float",
                       show(t->name).s, fc_dtype_name(t->dtype));
    }
    // 16-bit values go through a small stack buffer, a chunk at a time, so no
    // second full-size allocation is needed for a large tensor
    uint16_t buf[2048];
    uint64_t done = 0;
    while (done < count) {
        uint64_t k = count - done < 2048 ? count - done : 2048;
        if (fc_st_read(f, t, first + done, k, buf, e) != 0) return -1;
        for (uint64_t i = 0; i < k; i++) {
            dst[done + i] = t->dtype == FC_DT_BF16 ? fc_bf16_to_f32(buf[i]) : fc_f16_to_f32(buf[i]);
        }
        done += k;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// writing

// cJSON reports allocation failure by returning NULL/false; like mallocCheck
// that is an internal failure, not a problem with the caller's input.
static void json_oom(int ok, int line) {
    if (!ok) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory building JSON", __FILE__, line);
}
#define jsonCheck(x) json_oom((x) != 0, __LINE__)

// Integers go in as raw JSON text: cJSON would print a double, and large
// integral doubles come out as "1e+15", which a strict reader refuses.
static void add_uint_array(cJSON *obj, const char *key, const uint64_t *v, int n) {
    cJSON *arr = cJSON_CreateArray();
    jsonCheck(arr);
    for (int i = 0; i < n; i++) {
        char num[24];
        snprintf(num, sizeof num, "%" PRIu64, v[i]);
        cJSON *item = cJSON_CreateRaw(num);
        jsonCheck(item);
        jsonCheck(cJSON_AddItemToArray(arr, item));
    }
    jsonCheck(cJSON_AddItemToObject(obj, key, arr));
}

// Everything a reader would refuse is refused here first, so fc_st_write
// never produces a file that fc_st_open rejects. Also returns the byte size
// of each entry in sizes[].
// need_data: each entry's data must be there (fc_st_write); a stream's come later.
static int validate_entries(const char *path, const fc_st_entry *entries, int n,
                            const fc_st_meta_kv *meta, int n_meta, size_t *sizes, int need_data, fc_error *e) {
    if (n < 0 || n_meta < 0) return st_fail(path, e, "negative tensor or metadata count");
    if ((n > 0 && !entries) || (n_meta > 0 && !meta)) {
        return st_fail(path, e, "NULL entries or metadata with a nonzero count");
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const fc_st_entry *en = &entries[i];
        if (!en->name || en->name[0] == '\0') return st_fail(path, e, "entry %d has no name", i);
        if (strcmp(en->name, META_KEY) == 0) {
            return st_fail(path, e, "entry %d: '__metadata__' is reserved, not a tensor name", i);
        }
        if ((unsigned)en->dtype >= (unsigned)FC_DT_COUNT) {
            return st_fail(path, e, "tensor '%s': invalid dtype %d", show(en->name).s,
                           (int)en->dtype);
        }
        if (en->ndim < 0 || en->ndim > FC_ST_MAX_DIMS) {
            return st_fail(path, e, "tensor '%s': ndim %d is outside [0,%d]", show(en->name).s,
                           en->ndim, FC_ST_MAX_DIMS);
        }
        size_t numel = 1;
        for (int d = 0; d < en->ndim; d++) {
            if (en->shape[d] > (uint64_t)ST_MAX_JSON_INT ||
                fc_mul_size(numel, (size_t)en->shape[d], &numel) != 0) {
                return st_fail(path, e, "tensor '%s': shape %s is too large", show(en->name).s,
                               show_shape(en->shape, en->ndim).s);
            }
        }
        if (fc_mul_size(numel, fc_dtype_size(en->dtype), &sizes[i]) != 0 ||
            fc_add_size(total, sizes[i], &total) != 0 || total > (uint64_t)ST_MAX_JSON_INT) {
            return st_fail(path, e, "tensor '%s': data too large", show(en->name).s);
        }
        if (need_data && sizes[i] > 0 && !en->data) {
            return st_fail(path, e, "tensor '%s': NULL data", show(en->name).s);
        }
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value) return st_fail(path, e, "metadata entry %d is NULL", i);
    }

    int most = n > n_meta ? n : n_meta;
    const char **names = mallocCheck((size_t)(most > 0 ? most : 1) * sizeof *names);
    for (int i = 0; i < n; i++) names[i] = entries[i].name;
    const char *dup = find_duplicate(names, n);
    int rc = dup ? st_fail(path, e, "duplicate tensor name '%s'", show(dup).s) : 0;
    if (rc == 0) {
        for (int i = 0; i < n_meta; i++) names[i] = meta[i].key;
        dup = find_duplicate(names, n_meta);
        if (dup) rc = st_fail(path, e, "duplicate metadata key '%s'", show(dup).s);
    }
    free(names);
    return rc;
}

// Builds the header JSON; returns a string to free with cJSON_free.
static char *build_header(const fc_st_entry *entries, int n, const fc_st_meta_kv *meta, int n_meta,
                          const size_t *sizes) {
    cJSON *root = cJSON_CreateObject();
    jsonCheck(root);
    if (n_meta > 0) {
        cJSON *m = cJSON_CreateObject();
        jsonCheck(m);
        for (int i = 0; i < n_meta; i++) {
            jsonCheck(cJSON_AddStringToObject(m, meta[i].key, meta[i].value));
        }
        jsonCheck(cJSON_AddItemToObject(root, META_KEY, m));
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_CreateObject();
        jsonCheck(t);
        jsonCheck(cJSON_AddStringToObject(t, "dtype", fc_dtype_name(entries[i].dtype)));
        add_uint_array(t, "shape", entries[i].shape, entries[i].ndim);
        uint64_t offs[2] = {offset, offset + sizes[i]};
        add_uint_array(t, "data_offsets", offs, 2);
        jsonCheck(cJSON_AddItemToObject(root, entries[i].name, t));
        offset += sizes[i];
    }
    char *s = cJSON_PrintUnformatted(root);
    jsonCheck(s);
    cJSON_Delete(root);
    return s;
}

// fc_st_stream: the header first, then each entry's bytes in entry order.
static int stream_open(fc_st_stream *s, const char *path, const fc_st_entry *entries, int n,
                       const fc_st_meta_kv *meta, int n_meta, int need_data, fc_error *e) {
    memset(s, 0, sizeof *s);
    if (!path) return fc_fail(e, "fc_st_write: no path");
    if (!host_little_endian()) {
        return st_fail(path, e, "this host is big-endian; safetensors data is little-endian");
    }
    size_t *sizes = mallocCheck((size_t)(n > 0 ? n : 1) * sizeof *sizes);
    if (validate_entries(path, entries, n, meta, n_meta, sizes, need_data, e) != 0) {
        free(sizes);
        return -1;
    }

    // Header padded with spaces so the data section starts 8-byte aligned
    // (a reader that maps the file can then use the data in place).
    char *json = build_header(entries, n, meta, n_meta, sizes);
    size_t json_len = strlen(json), pad = (8 - (8 + json_len) % 8) % 8, hdr_len = json_len + pad;
    // cJSON escapes control characters but copies other bytes as they are, so
    // a name that is not UTF-8 would make a file every reader refuses
    int is_control;
    long long bad = bad_header_byte((const uint8_t *)json, json_len, &is_control);
    int rc = 0;
    if (bad >= 0) {
        rc = st_fail(path, e, "a tensor name or metadata string is not valid UTF-8 (byte 0x%02x)",
                     (unsigned char)json[bad]);
    } else if (hdr_len > FC_ST_MAX_HEADER) {
        rc = st_fail(path, e, "header of %zu bytes exceeds the limit of %u", hdr_len, FC_ST_MAX_HEADER);
    }
    size_t tmp_cap = strlen(path) + 32;
    char *tmp = mallocCheck(tmp_cap);
    FILE *fp = rc ? NULL : fc_open_tmp(path, tmp, tmp_cap, e);
    if (fp) {
        uint8_t len_bytes[8];
        for (int i = 0; i < 8; i++) len_bytes[i] = (uint8_t)((uint64_t)hdr_len >> (8 * i));
        int ok = fwrite(len_bytes, 1, 8, fp) == 8 && fwrite(json, 1, json_len, fp) == json_len;
        for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', fp) != EOF;
        if (!ok) {
            int err = errno;
            fc_abort_tmp(fp, tmp);
            fp = NULL;
            st_fail(path, e, "cannot write %s: %s", tmp, strerror(err));
        }
    }
    cJSON_free(json);
    if (!fp) {
        free(tmp);
        free(sizes);
        return -1;
    }
    *s = (fc_st_stream){fp, tmp, strdupCheck(path), sizes, n, 0, FC_DURABLE};
    return 0;
}

int fc_st_stream_open(fc_st_stream *s, const char *path, const fc_st_entry *entries, int n,
                      const fc_st_meta_kv *meta, int n_meta, fc_commit_kind kind, fc_error *e) {
    if (stream_open(s, path, entries, n, meta, n_meta, 0, e)) return -1;
    s->kind = kind;
    return 0;
}

int fc_st_stream_put(fc_st_stream *s, const void *data, fc_error *e) {
    if (!s->fp) return fc_fail(e, "fc_st_stream_put: the stream is not open");
    if (s->next >= s->n) {
        fc_st_stream_abort(s);
        return fc_fail(e, "fc_st_stream_put: all entries were already written");
    }
    size_t size = s->sizes[s->next];
    if (size == 0 || (data && fwrite(data, 1, size, s->fp) == size)) {
        s->next++;
        return 0;
    }
    int err = errno, entry = s->next;
    char path[1100];
    snprintf(path, sizeof path, "%s", s->path);
    fc_st_stream_abort(s);
    if (!data) return st_fail(path, e, "entry %d: NULL data", entry);
    return st_fail(path, e, "cannot write it: %s", strerror(err));
}

int fc_st_stream_commit(fc_st_stream *s, fc_error *e) {
    if (!s->fp) return fc_fail(e, "fc_st_stream_commit: the stream is not open");
    if (s->next != s->n) {
        char path[1100];
        snprintf(path, sizeof path, "%s", s->path);
        int got = s->next, want = s->n;
        fc_st_stream_abort(s);
        return st_fail(path, e, "%d of %d entries written: not committed", got, want);
    }
    int rc = fc_commit_tmp(s->fp, s->tmp, s->path, s->kind, e);
    s->fp = NULL;
    fc_st_stream_abort(s);  // frees the rest
    return rc;
}

void fc_st_stream_abort(fc_st_stream *s) {
    if (s->fp) fc_abort_tmp(s->fp, s->tmp);
    free(s->tmp);
    free(s->path);
    free(s->sizes);
    memset(s, 0, sizeof *s);
}

int fc_st_write(const char *path, const fc_st_entry *entries, int n, const fc_st_meta_kv *meta,
                int n_meta, fc_error *e) {
    return fc_st_write_as(path, entries, n, meta, n_meta, FC_DURABLE, e);
}

int fc_st_write_as(const char *path, const fc_st_entry *entries, int n, const fc_st_meta_kv *meta,
                   int n_meta, fc_commit_kind kind, fc_error *e) {
    fc_st_stream s;
    if (stream_open(&s, path, entries, n, meta, n_meta, 1, e)) return -1;
    s.kind = kind;
    for (int i = 0; i < n; i++)
        if (fc_st_stream_put(&s, entries[i].data, e)) return -1;
    return fc_st_stream_commit(&s, e);
}
