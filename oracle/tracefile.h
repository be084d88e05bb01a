// oracle/tracefile.h — reads and validates a trace written by `run --trace DIR`
// (docs/contract.md §6; the writer is trace.h). `compare` trusts nothing in a trace
// directory before this file has checked it:
//
//   trace.json     format "fsdpcheck-trace", version 1, implementation, world
//                  size, first step, step count, the full run config (parsed
//                  and validated by fc_run_config_from_json, then against the
//                  world size) and the unit layout, which must be exactly the
//                  layout the model registry (core/model.h) builds from that config;
//   init.safetensors       exactly the model's parameters, F32, registry shapes;
//   step-NNNNNN.safetensors for every listed step, holding exactly loss, batch.input,
//                  batch.target, grad.<name>, param.<name> and optim.<state>.<name>
//                  for the config's optimizer, each with the dtype and shape the
//                  config implies; and no step file outside the listed steps.
//
// A directory that fails any of these (no trace.json because the run died, a
// missing or extra step file, a missing, extra or mis-shaped tensor) is refused
// with one line in fc_error that names the file and the problem.
#ifndef FC_TRACEFILE_H
#define FC_TRACEFILE_H

#include <stddef.h>

#include "check.h"
#include "config.h"
#include "data.h"
#include "model.h"
#include "safetensors.h"
#include "trace.h"

typedef struct {
    char dir[1024];
    char impl[256];          // "implementation"
    int world_size;
    long first_step, steps;  // the trace holds steps first_step .. first_step+steps-1
    long tensor_steps;       // its first tensor_steps step files hold the tensor sets, the rest loss, norm
                             // and batch only (`run --trace-tensors first`: 1); steps when every one does
    int planned;             // "planned": true (`fsdpcheck plan`): no step run, step files hold the batch
                             // alone (a step read gives loss NaN, no norm), first_step 0, tensor_steps 0
    fc_run_config cfg;
    fc_model model;          // the registry of cfg.model: names, shapes, units
    int n_state;             // optimizer states in every step file (0..2)
    const char *state_names[2];
} fc_trace;

// Parses and validates trace.json text (len bytes; need not be NUL-terminated)
// without touching the file system. `where` names the source in messages. On
// success t holds a built model (release with fc_trace_close); on failure t
// holds nothing that needs releasing.
int fc_trace_parse(const char *text, size_t len, const char *where, fc_trace *t, fc_error *e);

// Opens a trace directory: parses trace.json, then validates the header of
// init.safetensors and of every step file (only headers are read).
int fc_trace_open(const char *dir, fc_trace *t, fc_error *e);
void fc_trace_close(fc_trace *t);

// Opens step `step`'s file and validates its tensor set against the registry.
int fc_trace_step_open(const fc_trace *t, long step, fc_st_file *f, fc_error *e);

// Readers for an open, validated step file.
int fc_trace_read_loss(fc_st_file *f, float *loss, fc_error *e);
// The step's total gradient norm: *has_norm 0 (and *norm 0) when the file has none.
int fc_trace_read_norm(fc_st_file *f, int *has_norm, double *norm, fc_error *e);
// Allocates b (fc_batch_free releases it) and fills it with the global batch.
int fc_trace_read_batch(const fc_trace *t, fc_st_file *f, fc_batch *b, fc_error *e);
// Reads one full tensor set into dst[model.numel] in model layout: prefix is
// "grad", "param" or "optim.<state>" (tensors "<prefix>.<name>").
int fc_trace_read_set(const fc_trace *t, fc_st_file *f, const char *prefix, float *dst, fc_error *e);
// Reads step `step` whole: bufs[0] gradients, bufs[1] parameters, bufs[2 + i]
// optimizer state i ([model.numel] each); prev is the parameters before the
// step (NULL: unknown). batch is allocated (fc_batch_free releases it).
// bufs NULL: the step's loss, norm and batch only (no tensor is read).
int fc_trace_read_step(const fc_trace *t, long step, float *const bufs[4], const float *prev, fc_trace_step *s,
                       fc_batch *batch, fc_error *e);
// The path of the trace's init.safetensors in buf[cap] (cut short where it does not fit).
void fc_trace_init_file(const fc_trace *t, char *buf, size_t cap);
// Reads init.safetensors (the parameters the trace's first step starts from)
// into dst[model.numel] in model layout.
int fc_trace_read_init(const fc_trace *t, float *dst, fc_error *e);

// A step's tensor sets, or init's parameters, in place: the file mapped
// read-only, each set a [model.numel] view into the mapping where the file
// holds the set whole, F32, in layout order (unit by unit: an image of the
// full flat buffer, core/model.h; oracle/trace.c and the torch adapter write
// every set so), else read into memory of the view's own (a file another
// writer laid out otherwise: the safetensors package sorts tensors by name). gpt2-124m's step is 2 GB: read,
// it costs as much again in fresh memory and a copy (issue 18's profile).
typedef struct {
    void *map;
    size_t map_len;
    float *owned;          // the sets read, not mapped ([k][numel]; NULL: none)
    const float *sets[4];  // a step's gradients, parameters, states 0 and 1; init's parameters in sets[0]
} fc_trace_view;

// fc_trace_read_step with the sets in v instead of buffers: s's grads,
// params and state point into v (valid until fc_trace_view_close).
int fc_trace_view_step(const fc_trace *t, long step, const float *prev, fc_trace_view *v, fc_trace_step *s,
                       fc_batch *batch, fc_error *e);
int fc_trace_view_init(const fc_trace *t, fc_trace_view *v, fc_error *e);
// Drops the resident pages of v's mapping under [p, p + n) (the pages around
// its ends too: they are read again from the file when asked); nothing where p
// is not in the mapping (a set read into v->owned, another view's, memory of
// the caller's). The file is mapped as it is read, so that a comparison that
// releases each tensor it has read holds one tensor of a step, not the step.
void fc_trace_view_release(const fc_trace_view *v, const float *p, size_t n);
void fc_trace_view_release_all(const fc_trace_view *v);
// Releases a view (safe on a zeroed one) and zeroes it.
void fc_trace_view_close(fc_trace_view *v);

#endif
