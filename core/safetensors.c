// core/safetensors.c — see safetensors.h.
//
// Reading happens in two steps. fc_st_open reads the 8-byte length and the
// JSON header only, and validates all of it (safetensors_header.c) against the
// real size of the file before anything else is believed: a length, an offset
// or a shape that came from the file is just a claim until it has been
// checked. After that, fc_st_read fetches exactly the bytes of one element
// range, so a rank loading its shard of a large checkpoint never holds the
// whole file. Writing is safetensors_write.c.
#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "fileio.h"
#include "safetensors_internal.h"

// ----------------------------------------------------------------------------
// error messages

// Every refusal of a file is "<source>: <what is wrong>", one line.
int fc_st_fail(const char *src, fc_error *e, const char *fmt, ...) {
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
fc_st_shown fc_st_show(const char *name) {
    fc_st_shown r;
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
fc_st_shown_shape fc_st_show_shape(const uint64_t *shape, int ndim) {
    fc_st_shown_shape r;
    size_t at = 0;
    r.s[at++] = '[';
    for (int i = 0; i < ndim; i++) {
        at += (size_t)snprintf(r.s + at, sizeof r.s - at, "%s%" PRIu64, i ? "," : "", shape[i]);
    }
    snprintf(r.s + at, sizeof r.s - at, "]");
    return r;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// cJSON keeps every duplicate key of an object, and a lookup would quietly
// pick the first, so duplicates are found explicitly: sort the keys and
// compare neighbours. Returns the duplicated key, or NULL.
const char *fc_st_find_duplicate(const char **keys, int n) {
    if (n < 2) return NULL;
    qsort(keys, (size_t)n, sizeof keys[0], cmp_str_ptr);
    for (int i = 1; i < n; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) return keys[i];
    }
    return NULL;
}

// Frees what fc_st_open may have filled in so far and zeroes f.
void fc_st_free_contents(fc_st_file *f) {
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    memset(f, 0, sizeof *f);
}

// Checks the header length N against the file before it is used for anything
// (in particular before N bytes are allocated).
static int check_header_len(const char *src, uint64_t file_size, uint64_t n, fc_error *e) {
    if (n == 0) return fc_st_fail(src, e, "header length is 0; a header holds at least \"{}\"");
    if (n > FC_ST_MAX_HEADER) {
        return fc_st_fail(src, e, "header length %" PRIu64 " exceeds the limit of %u bytes", n,
                       FC_ST_MAX_HEADER);
    }
    if (n > file_size - 8) {
        return fc_st_fail(src, e,
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
    if (!fc_st_host_little_endian()) {
        return fc_st_fail(src, e, "this host is big-endian; safetensors data is little-endian");
    }
    if (size < 8) {
        return fc_st_fail(src, e, "file is %" PRIu64 " bytes, shorter than the 8-byte header length",
                       size);
    }
    return 0;
}

int fc_st_open(const char *path, fc_st_file *f, fc_error *e) {
    memset(f, 0, sizeof *f);
    if (!path) return fc_fail(e, "fc_st_open: no path");
    FILE *fp = fopen(path, "rb");
    if (!fp) return fc_st_fail(path, e, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        int rc = fc_st_fail(path, e, "cannot stat: %s", strerror(errno));
        fclose(fp);
        return rc;
    }
    // the size must be real for the checks to mean anything: no pipes or devices
    if (!S_ISREG(st.st_mode)) {
        fclose(fp);
        return fc_st_fail(path, e, "not a regular file");
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t len_bytes[8];
    if (check_file_size(path, size, e) != 0) {
        fclose(fp);
        return -1;
    }
    if (fread(len_bytes, 1, 8, fp) != 8) {
        fclose(fp);
        return fc_st_fail(path, e, "cannot read the header length");
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
        return fc_st_fail(path, e, "short read of the %" PRIu64 "-byte header", n);
    }
    hdr[n] = '\0';
    int rc = fc_st_parse_header(path, hdr, (size_t)n, size - 8 - n, f, e);
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
    if (!data && size > 0) return fc_st_fail(src, e, "no buffer");
    if (check_file_size(src, size, e) != 0) return -1;
    uint64_t n = le64(data);
    if (check_header_len(src, size, n, e) != 0) return -1;
    // A NUL-terminated private copy: cJSON then cannot run off the end of the
    // caller's buffer whatever the header holds.
    char *hdr = mallocCheck((size_t)n + 1);
    memcpy(hdr, data + 8, (size_t)n);
    hdr[n] = '\0';
    int rc = fc_st_parse_header(src, hdr, (size_t)n, size - 8 - n, f, e);
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
    fc_st_free_contents(f);
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
                       fc_st_show(t->name).s, first, count, t->numel);
    }
    if (count > 0 && !dst) return fc_fail(e, "tensor '%s': no destination buffer", fc_st_show(t->name).s);
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
        return fc_fail(e, "tensor '%s': cannot seek to byte %" PRIu64 ": %s", fc_st_show(t->name).s, off,
                       strerror(errno));
    }
    if (fread(dst, 1, nbytes, f->fp) != nbytes) {
        // validated at open, so the file must have changed (been truncated) since
        return fc_fail(e, "tensor '%s': short read of %zu bytes at byte %" PRIu64
                          " (file truncated since it was opened?)",
                       fc_st_show(t->name).s, nbytes, off);
    }
    return 0;
}

int fc_st_read_f32(fc_st_file *f, const fc_st_tensor *t, uint64_t first, uint64_t count,
                   float *dst, fc_error *e) {
    if (check_range(f, t, first, count, dst, e) != 0) return -1;
    if (t->dtype == FC_DT_F32) return fc_st_read(f, t, first, count, dst, e);
    if (t->dtype != FC_DT_BF16 && t->dtype != FC_DT_F16) {
        return fc_fail(e, "tensor '%s' is %s; only F32, BF16 and F16 convert to float",
                       fc_st_show(t->name).s, fc_dtype_name(t->dtype));
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
