// core/checkpoint.h — checkpoints (docs/contract.md §6), below every implementation.
//
// A checkpoint is a directory. Three layouts, one manifest:
//
//   FULL_STATE_DICT          SHARDED_STATE_DICT (FSDP1)   FSDP2 SHARDED (DCP)
//   config.json              config.json                  config.json
//   model.safetensors        shard-RRRRR.safetensors      shard-SSSSS-model-00001-of-00001.safetensors
//   optimizer.safetensors    fsdpcheck.json               fsdpcheck.json
//   fsdpcheck.json
//
//  - model.safetensors: every parameter under its model name, F32, the tied
//    GPT-2 head not repeated, __metadata__ {"format": "pt"}: with config.json
//    (Hugging Face fields) transformers.GPT2LMHeadModel.from_pretrained(DIR)
//    loads it.
//  - optimizer.safetensors: "<state>.<name>" per parameter and state
//    ("exp_avg", "exp_avg_sq" | "momentum_buffer"), F32, plus "step" (I64 scalar).
//  - shard-RRRRR.safetensors: rank R's flat chunks, one 1-D F32 tensor
//    "unit<U>.<T>" per unit U and tensor T ("param" or a state name), holding
//    elements [first, first+count) of unit U's FlatParameter (padding never
//    stored). Each tensor's layout is a metadata entry under its own name:
//    {"unit": U, "unit_name": "...", "tensor": T, "first": F, "count": N,
//    "unit_numel": M}. The chunks of all files tile every unit exactly, so the
//    checkpoint loads at any world size and strategy.
//  - shard-SSSSS-model-00001-of-00001.safetensors: what torch.distributed.
//    checkpoint writes with HuggingFaceStorageWriter(save_distributed=True)
//    for writing rank S-1 (torch's shard index counts from 1): every tensor
//    a dim-0 block of rows [r0, r0 + rows) of a full tensor, under the full
//    tensor's name: the parameter's model name, "state.<name>.<state>" for
//    an optimizer state (get_optimizer_state_dict's flattened names) and
//    "state.<name>.step" (F32 scalar, AdamW only, each once in all files).
//    __metadata__: {"format": "pt", "DCP_VERSION": "1.0",
//    "DCP_SHARDING_INFO": JSON {name: {"saved_offsets": [r0, 0...]}}}, so
//    torch's HuggingFaceStorageReader loads it at any W. The optimizer's
//    param_groups (lr, betas: not tensors) are not stored: DCP's Hugging
//    Face storage writes a non-tensor as raw bytes in front of the
//    safetensors header, which no reader can then open; the manifest's
//    config holds them. Blocks of rows of any W tile every tensor, so the
//    checkpoint loads at any world size, strategy and FSDP version.
//  - fsdpcheck.json, the manifest, written last: format, version, state dict,
//    step (= the data position: data is a pure function of (seed, step,
//    sample)), the full run config, the world size and strategy it was saved
//    from, the optimizer's state names, and every file's byte size and SHA-256.
//
// Crash safety: every file is written to a temporary, fsynced and renamed; a
// save into an existing checkpoint first removes its manifest; the manifest
// goes last. So a directory holds a complete, verifiable checkpoint, or one
// that is refused: a checkpoint is only read after its manifest parsed, every
// listed file is present with the listed size and SHA-256, every header is
// valid and every parameter and state is present with its shape.
//
// Reading serves "elements [first, first+n) of parameter p's tensor T" from
// either layout by reading exactly those bytes, so a rank loading its shard
// holds O(shard) memory, never the whole checkpoint.
#ifndef FC_CHECKPOINT_H
#define FC_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "config.h"
#include "model.h"
#include "safetensors.h"
#include "sha256.h"
#include "hd.h"

FC_BEGIN_DECLS

#define FC_CKPT_FORMAT "fsdpcheck-checkpoint"
#define FC_CKPT_SHARD_FORMAT "fsdpcheck-checkpoint-shard"
#define FC_CKPT_VERSION 1
#define FC_CKPT_MANIFEST "fsdpcheck.json"
#define FC_CKPT_MAX_NAME 64

// Checkpoint formats (docs/contract.md §6).
typedef enum {
    FC_STATE_DICT_FULL,     // FULL_STATE_DICT: rank 0 writes HF-loadable model + optimizer files
    FC_STATE_DICT_SHARDED,  // SHARDED_STATE_DICT: one file per rank with its flat shards and layout
    FC_STATE_DICT_DCP       // FSDP2's SHARDED_STATE_DICT: DCP's Hugging Face safetensors, one file per rank
} fc_state_dict;

const char *fc_state_dict_name(fc_state_dict k);   // "full", "sharded", "dcp"
// The SHARDED_STATE_DICT format of a run's layout: FSDP1's flat shard files,
// or DCP's for FSDP2's per-parameter rows (docs/contract.md §6).
fc_state_dict fc_ckpt_sharded_kind(const fc_run_config *cfg);
int fc_state_dict_parse(const char *s, fc_state_dict *out);

// SHA-256 (fc_sha256_mem, fc_sha256_file): sha256.h, included above.

// One file of a checkpoint, as the manifest lists it.
typedef struct {
    char name[FC_CKPT_MAX_NAME];   // a plain file name inside the directory
    uint64_t bytes;
    char sha256[65];
} fc_ckpt_file;

typedef struct {
    int version;
    fc_state_dict kind;
    long step;                 // optimizer steps taken = global index of the next step
    long data_position;        // the next step of the data stream (== step)
    fc_run_config cfg;         // the run that saved it
    int world_size;            // where it was saved from (for a sharded file set: its layout)
    fc_strategy strategy;
    int n_state;
    const char *state_names[2];
    int n_files;
    fc_ckpt_file *files;
} fc_ckpt_manifest;

// Parses and validates a manifest held in memory (len bytes, no NUL needed).
// src names it in messages ("DIR/fsdpcheck.json"); NULL means "manifest".
// On failure m holds nothing to free.
int fc_ckpt_manifest_parse(const char *text, size_t len, const char *src, fc_ckpt_manifest *m,
                           fc_error *e);
void fc_ckpt_manifest_free(fc_ckpt_manifest *m);

// ---------------------------------------------------------------------------
// reading

typedef struct fc_ckpt fc_ckpt;

// A checkpoint file held in memory (for fuzzing and tests).
typedef struct {
    const char *name;
    const uint8_t *data;
    size_t size;
} fc_ckpt_mem_file;

// Opens and verifies the checkpoint in dir: the manifest, every listed file's
// presence and size, with check_hashes also every SHA-256, every safetensors
// header, config.json, and every parameter and state with its shape. Anything
// wrong is refused with one line naming the file and the problem.
int fc_ckpt_open(const char *dir, int check_hashes, fc_ckpt **out, fc_error *e);
// The same over files in memory (one of them named FC_CKPT_MANIFEST). The
// buffers must outlive the checkpoint.
int fc_ckpt_open_mem(const fc_ckpt_mem_file *files, int n, int check_hashes, fc_ckpt **out,
                     fc_error *e);
void fc_ckpt_close(fc_ckpt *c);

const fc_ckpt_manifest *fc_ckpt_manifest_of(const fc_ckpt *c);
const fc_model *fc_ckpt_model(const fc_ckpt *c);
// SHA-256 of the manifest's bytes: ranks that opened the same checkpoint agree on it.
const char *fc_ckpt_manifest_sha256(const fc_ckpt *c);
// The open safetensors file of a listed file name, NULL for none (config.json).
const fc_st_file *fc_ckpt_st(const fc_ckpt *c, const char *name);
// Bytes of tensor data read so far through fc_ckpt_read / fc_ckpt_read_unit.
uint64_t fc_ckpt_bytes_read(const fc_ckpt *c);

// Tensor index of a name: 0 = "param", 1.. = the optimizer's states in order;
// -1 if the checkpoint has no such tensor.
int fc_ckpt_tensor_index(const fc_ckpt *c, const char *name);
const char *fc_ckpt_tensor_name(const fc_ckpt *c, int t);

// Elements [first, first+n) of parameter p's tensor t, as floats.
int fc_ckpt_read(fc_ckpt *c, int p, int t, uint64_t first, uint64_t n, float *dst, fc_error *e);
// Elements [first, first+n) of unit u's FlatParameter (unpadded) for tensor t.
int fc_ckpt_read_unit(fc_ckpt *c, int u, int t, uint64_t first, uint64_t n, float *dst, fc_error *e);

// May a run with cfg load this checkpoint? The same model (sizes, not the
// name) and the same optimizer state; world size and strategy may differ.
int fc_ckpt_check_compatible(const fc_ckpt *c, const fc_run_config *cfg, fc_error *e);

// ---------------------------------------------------------------------------
// writing

// What a checkpoint records about the run that saves it.
typedef struct {
    const fc_run_config *cfg;
    const fc_model *m;
    long step;               // optimizer steps taken
    int world_size;          // saved from (sharded: the world of its chunk layout)
    fc_strategy strategy;
} fc_ckpt_info;

// Makes dir ready for a new checkpoint: creates it, removes its manifest
// first (a half-rewritten checkpoint must never verify), then, if there was
// one, the files of that checkpoint, and always temporaries of interrupted
// saves (checkpoint file names only: nothing else is touched).
int fc_ckpt_prepare_dir(const char *dir, fc_error *e);
// config.json (Hugging Face fields for gpt2).
int fc_ckpt_write_config(const char *dir, const fc_ckpt_info *info, fc_ckpt_file *out, fc_error *e);
// model.safetensors and optimizer.safetensors from full tensors in model
// layout (state[i]: [numel], the optimizer's states in order), and for a LoRA
// model PEFT's adapter_model.safetensors and adapter_config.json after them:
// fc_ckpt_full_files(m) files in out, at most FC_CKPT_FULL_FILES_MAX.
#define FC_CKPT_FULL_FILES_MAX 4
int fc_ckpt_full_files(const fc_model *m);
int fc_ckpt_write_full_files(const char *dir, const fc_ckpt_info *info, const float *params,
                             const float *const state[2], fc_ckpt_file out[FC_CKPT_FULL_FILES_MAX], fc_error *e);

// One unit chunk of a shard file: elements [first, first+count) of the unit.
typedef struct {
    int unit;
    size_t first, count;
    const float *param;       // [count]
    const float *state[2];    // [count] each, the optimizer's states in order
} fc_ckpt_chunk_data;

// shard-<index>.safetensors with these chunks (count 0 chunks are skipped).
int fc_ckpt_write_shard(const char *dir, int index, const fc_ckpt_info *info,
                        const fc_ckpt_chunk_data *chunks, int n, fc_ckpt_file *out, fc_error *e);
// One block of a DCP file: rows [row0, row0 + rows) of parameter `param`
// (1-D parameters: elements), with the optimizer's states of those rows.
typedef struct {
    int param;
    size_t row0, rows;
    const float *data;        // [rows * cols]
    const float *state[2];    // [rows * cols] each, the optimizer's states in order
} fc_ckpt_rows;

// The block of unit u's elements [unit_off, unit_off + count): rows of one
// parameter (an FSDP2 piece, core/layout.h), data and states unset. Anything
// else is an internal error.
fc_ckpt_rows fc_ckpt_rows_of_piece(const fc_model *m, int u, size_t unit_off, size_t count);
// The DCP file name of writing rank `rank` (torch's shard index rank + 1).
void fc_ckpt_dcp_name(int rank, char *out, size_t cap);
// That file with these blocks (0-row blocks are skipped); with_steps adds
// every parameter's "state.<name>.step" (AdamW: one file of a checkpoint
// holds them). skew_offsets > 0 records every block that does not start at
// row 0 that many rows early: the fault catalogue's dcp_saved_offsets.
int fc_ckpt_write_dcp(const char *dir, int rank, const fc_ckpt_info *info, const fc_ckpt_rows *blocks, int n,
                      int with_steps, int skew_offsets, fc_ckpt_file *out, fc_error *e);
// The manifest, last.
int fc_ckpt_write_manifest(const char *dir, const fc_ckpt_info *info, fc_state_dict kind,
                           const fc_ckpt_file *files, int n, fc_error *e);
// A whole FULL checkpoint from one process: prepare, config, files, manifest.
int fc_ckpt_save_full(const char *dir, const fc_ckpt_info *info, const float *params,
                      const float *const state[2], fc_error *e);

FC_END_DECLS

#endif
