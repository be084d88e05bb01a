// core/safetensors_write.c — writing a safetensors file: the header built
// with cJSON, everything written to a temporary name, fsynced and renamed into
// place (core/fileio.h), so a crash leaves either the old file or the complete
// new one, never a torn one. See safetensors.h.
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cJSON.h"
#include "fileio.h"
#include "safetensors_internal.h"

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
    if (n < 0 || n_meta < 0) return fc_st_fail(path, e, "negative tensor or metadata count");
    if ((n > 0 && !entries) || (n_meta > 0 && !meta)) {
        return fc_st_fail(path, e, "NULL entries or metadata with a nonzero count");
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const fc_st_entry *en = &entries[i];
        if (!en->name || en->name[0] == '\0') return fc_st_fail(path, e, "entry %d has no name", i);
        if (strcmp(en->name, FC_ST_META_KEY) == 0) {
            return fc_st_fail(path, e, "entry %d: '__metadata__' is reserved, not a tensor name", i);
        }
        if ((unsigned)en->dtype >= (unsigned)FC_DT_COUNT) {
            return fc_st_fail(path, e, "tensor '%s': invalid dtype %d", fc_st_show(en->name).s,
                           (int)en->dtype);
        }
        if (en->ndim < 0 || en->ndim > FC_ST_MAX_DIMS) {
            return fc_st_fail(path, e, "tensor '%s': ndim %d is outside [0,%d]", fc_st_show(en->name).s,
                           en->ndim, FC_ST_MAX_DIMS);
        }
        size_t numel = 1;
        for (int d = 0; d < en->ndim; d++) {
            if (en->shape[d] > (uint64_t)FC_ST_MAX_JSON_INT ||
                fc_mul_size(numel, (size_t)en->shape[d], &numel) != 0) {
                return fc_st_fail(path, e, "tensor '%s': shape %s is too large", fc_st_show(en->name).s,
                               fc_st_show_shape(en->shape, en->ndim).s);
            }
        }
        if (fc_mul_size(numel, fc_dtype_size(en->dtype), &sizes[i]) != 0 ||
            fc_add_size(total, sizes[i], &total) != 0 || total > (uint64_t)FC_ST_MAX_JSON_INT) {
            return fc_st_fail(path, e, "tensor '%s': data too large", fc_st_show(en->name).s);
        }
        if (need_data && sizes[i] > 0 && !en->data) {
            return fc_st_fail(path, e, "tensor '%s': NULL data", fc_st_show(en->name).s);
        }
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value) return fc_st_fail(path, e, "metadata entry %d is NULL", i);
    }

    int most = n > n_meta ? n : n_meta;
    const char **names = mallocCheck((size_t)(most > 0 ? most : 1) * sizeof *names);
    for (int i = 0; i < n; i++) names[i] = entries[i].name;
    const char *dup = fc_st_find_duplicate(names, n);
    int rc = dup ? fc_st_fail(path, e, "duplicate tensor name '%s'", fc_st_show(dup).s) : 0;
    if (rc == 0) {
        for (int i = 0; i < n_meta; i++) names[i] = meta[i].key;
        dup = fc_st_find_duplicate(names, n_meta);
        if (dup) rc = fc_st_fail(path, e, "duplicate metadata key '%s'", fc_st_show(dup).s);
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
        jsonCheck(cJSON_AddItemToObject(root, FC_ST_META_KEY, m));
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
    if (!fc_st_host_little_endian()) {
        return fc_st_fail(path, e, "this host is big-endian; safetensors data is little-endian");
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
    long long bad = fc_st_bad_header_byte((const uint8_t *)json, json_len, &is_control);
    int rc = 0;
    if (bad >= 0) {
        rc = fc_st_fail(path, e, "a tensor name or metadata string is not valid UTF-8 (byte 0x%02x)",
                     (unsigned char)json[bad]);
    } else if (hdr_len > FC_ST_MAX_HEADER) {
        rc = fc_st_fail(path, e, "header of %zu bytes exceeds the limit of %u", hdr_len, FC_ST_MAX_HEADER);
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
            fc_st_fail(path, e, "cannot write %s: %s", tmp, strerror(err));
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
    if (!data) return fc_st_fail(path, e, "entry %d: NULL data", entry);
    return fc_st_fail(path, e, "cannot write it: %s", strerror(err));
}

int fc_st_stream_commit(fc_st_stream *s, fc_error *e) {
    if (!s->fp) return fc_fail(e, "fc_st_stream_commit: the stream is not open");
    if (s->next != s->n) {
        char path[1100];
        snprintf(path, sizeof path, "%s", s->path);
        int got = s->next, want = s->n;
        fc_st_stream_abort(s);
        return fc_st_fail(path, e, "%d of %d entries written: not committed", got, want);
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
