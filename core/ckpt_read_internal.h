// core/ckpt_read_internal.h — an open checkpoint (struct fc_ckpt) and what
// the files that open and read one share, nothing outside them uses:
// ckpt_read.c (opening, reading element ranges), ckpt_verify.c (each listed
// file, and a FULL checkpoint's tensors) and ckpt_pieces.c (the pieces of a
// SHARDED or DCP checkpoint).
#ifndef FC_CKPT_READ_INTERNAL_H
#define FC_CKPT_READ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "model.h"
#include "safetensors.h"

// One chunk of a sharded checkpoint: elements [first, first+count) of
// tensor t of `key` (SHARDED: a unit's FlatParameter; DCP: a parameter, a
// block of its rows), stored in file `file` as tensor st.
typedef struct {
    int key, t, file;
    const fc_st_tensor *st;
    uint64_t first, count;
} fc_ckpt_piece;

struct fc_ckpt {
    char src[1024];                 // the directory ("" for memory)
    const fc_ckpt_mem_file *mem;
    int n_mem;
    fc_ckpt_manifest man;
    char manifest_sha[65];
    fc_model model;
    int model_built;
    int n_tensors;                  // 1 + n_state
    const char *tensor_names[3];
    fc_st_file *st;                 // [n_files], aligned with man.files; open for .safetensors
    int model_file, optim_file;     // FULL: indices into st
    const fc_st_tensor **full;      // FULL: [n_tensors * n_params]
    fc_ckpt_piece *pieces;                  // SHARDED, DCP: sorted by (key, t, first)
    int n_pieces;
    int *piece_at;                  // [n_keys * n_tensors + 1]: pieces of (key, t) start here
    uint64_t bytes_read;
};

// The checkpoint in messages: its directory, or "checkpoint" for memory.
static inline const char *fc_ckpt_src_name(const fc_ckpt *c) { return c->src[0] ? c->src : "checkpoint"; }

// The name of file name (or of the manifest) in messages: DIR/name, or name.
const char *fc_ckpt_where(const fc_ckpt *c, const char *name, char *buf, size_t cap);
// The in-memory file of that name, or NULL.
const fc_ckpt_mem_file *fc_ckpt_mem_find(const fc_ckpt *c, const char *name);
// The manifest's index of file name, or -1.
int fc_ckpt_find_file(const fc_ckpt *c, const char *name);

// A model config described in one line, for messages.
typedef struct {
    char s[300];
} fc_ckpt_described;
fc_ckpt_described fc_ckpt_describe(const fc_model_config *m);

// Listed file i as the manifest says it is, opened into c->st[i] if it is a
// safetensors file (ckpt_verify.c).
int fc_ckpt_verify_file(fc_ckpt *c, int i, int check_hashes, fc_error *e);
// Each kind's tensors, once every file is verified: FULL (ckpt_verify.c),
// SHARDED and DCP (ckpt_pieces.c).
int fc_ckpt_check_full(fc_ckpt *c, fc_error *e);
int fc_ckpt_check_sharded(fc_ckpt *c, fc_error *e);
int fc_ckpt_check_dcp(fc_ckpt *c, fc_error *e);

#endif
