// core/safetensors.h — reader and writer for the safetensors format.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian
// header length N, N bytes of UTF-8 JSON, then the raw little-endian data.
// The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin,end]}
// (offsets relative to the start of the data section) plus an optional
// "__metadata__" object of string -> string.
//
// The reader trusts nothing: every length, offset, dtype, shape product, name
// and overlap is checked against the real file size before anything is read,
// and a bad file is refused with one line in fc_error. Opening reads only the
// header; tensors (or element ranges of a tensor, for a shard) are read on
// demand, so a rank loading its shard never holds the whole file.
#ifndef FC_SAFETENSORS_H
#define FC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "dtype.h"
#include "fileio.h"
#include "hd.h"

FC_BEGIN_DECLS

#define FC_ST_MAX_DIMS 8
// Same limit as the Python package: a header larger than this is refused.
#define FC_ST_MAX_HEADER (100u * 1000u * 1000u)

typedef struct {
    char *name;
    fc_dtype dtype;
    int ndim;                        // 0 for a scalar
    uint64_t shape[FC_ST_MAX_DIMS];
    uint64_t numel;                  // product of shape (1 for a scalar)
    uint64_t begin, end;             // byte offsets into the data section
} fc_st_tensor;

typedef struct {
    char *key, *value;
} fc_st_meta_kv;

typedef struct {
    // source: exactly one of fp (a file) or mem (a buffer, for fuzzing) is set
    FILE *fp;
    const uint8_t *mem;
    uint64_t file_size;
    uint64_t data_start;             // 8 + header length
    int n_tensors;
    fc_st_tensor *tensors;           // in data-offset order
    int n_meta;
    fc_st_meta_kv *meta;
} fc_st_file;

// Opens and validates a file. On failure returns -1, e names the problem, and
// *f holds nothing that needs closing.
int fc_st_open(const char *path, fc_st_file *f, fc_error *e);
// Same for a file image in memory (not copied: must outlive f).
int fc_st_open_mem(const uint8_t *data, size_t size, fc_st_file *f, fc_error *e);
void fc_st_close(fc_st_file *f);

const fc_st_tensor *fc_st_find(const fc_st_file *f, const char *name);
const char *fc_st_meta(const fc_st_file *f, const char *key);  // NULL if absent

// Reads elements [first, first+count) of t, raw, into dst (count * dtype size
// bytes). Only those bytes are read from the file.
int fc_st_read(fc_st_file *f, const fc_st_tensor *t, uint64_t first, uint64_t count, void *dst,
               fc_error *e);
// Reads elements [first, first+count) of a F32, BF16 or F16 tensor as float.
int fc_st_read_f32(fc_st_file *f, const fc_st_tensor *t, uint64_t first, uint64_t count,
                   float *dst, fc_error *e);

// One tensor to write. data holds numel * dtype size bytes, little-endian.
typedef struct {
    const char *name;
    fc_dtype dtype;
    int ndim;
    uint64_t shape[FC_ST_MAX_DIMS];
    const void *data;
} fc_st_entry;

// Writes a complete file crash-safely: to "<path>.tmp.<pid>", fsync, rename.
// meta is n_meta key/value pairs (may be NULL). The header is padded with
// spaces so the data section starts 8-byte aligned. Returns -1 with e set on
// any failure, and then leaves neither path nor the temporary behind.
int fc_st_write(const char *path, const fc_st_entry *entries, int n, const fc_st_meta_kv *meta,
                int n_meta, fc_error *e);
// The same, committed as kind says (core/fileio.h); fc_st_write is FC_DURABLE.
int fc_st_write_as(const char *path, const fc_st_entry *entries, int n, const fc_st_meta_kv *meta,
                   int n_meta, fc_commit_kind kind, fc_error *e);

// The same file written as its tensors become available, so a writer never
// holds them all at once: open validates the entries (their data is not read)
// and writes the header to the temporary; put appends the next entry's data,
// in entry order; commit, once every entry is in, does what fc_st_write does
// last, as durably as kind says (core/fileio.h: fc_st_write is FC_DURABLE). A
// failed put or commit removes the temporary (as abort does) and leaves nothing
// at path; abort after a failure is harmless.
typedef struct {
    FILE *fp;        // the temporary, NULL once committed or aborted
    char *tmp, *path;
    size_t *sizes;   // [n] bytes of each entry
    int n, next;     // entries, and the next one put writes
    fc_commit_kind kind;
} fc_st_stream;
int fc_st_stream_open(fc_st_stream *s, const char *path, const fc_st_entry *entries, int n,
                      const fc_st_meta_kv *meta, int n_meta, fc_commit_kind kind, fc_error *e);
int fc_st_stream_put(fc_st_stream *s, const void *data, fc_error *e);
int fc_st_stream_commit(fc_st_stream *s, fc_error *e);
void fc_st_stream_abort(fc_st_stream *s);

FC_END_DECLS

#endif
