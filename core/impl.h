// core/impl.h — the implementation contract: the only door between the oracle
// and an FSDP implementation (docs/contract.md §1).
//
// An implementation is a table of functions (fc_impl_ops). The reference is
// one (reference/impl_reference.c), a hardware port is another, built as its
// own shared library exporting
//
//     const fc_impl_ops *fsdpcheck_impl_v1(void);
//
// and loaded by path (--impl ./libmyport.so). Everything crosses as plain
// data: the config (core/config.h), full tensors in the model layout of
// core/model.h, the comm log and memory figures (core/schedule.h).
//
// Collective semantics: create, step, export and destroy are collective over
// the communicator passed to create (every rank calls them, in the same order).
#ifndef FC_IMPL_H
#define FC_IMPL_H

#include <mpi.h>

#include "check.h"
#include "checkpoint.h"  // fc_state_dict (FULL / SHARDED)
#include "config.h"
#include "model.h"
#include "schedule.h"
#include "hd.h"

FC_BEGIN_DECLS

// The contract's ABI version. A port's table carries the FC_IMPL_ABI_VERSION
// it was compiled against (abi_version); fsdpcheck loads a port only when it
// equals its own, and otherwise refuses it with one line and exit 2 ("contract
// version N, this fsdpcheck speaks M"), as it refuses a library without the
// entry point FC_IMPL_ENTRY and a table with NULL where create, step,
// export_full, comm_log, memory or destroy belongs. `fsdpcheck --version`
// prints it; the installed CMake package sets fsdpcheck_IMPL_ABI_VERSION.
//
// What bumps it: any change after which a port compiled against the old
// headers would be called wrongly or would compute something else:
//  - fc_impl_ops: a member added, removed, reordered or retyped;
//  - a type that crosses the contract changes layout or meaning: fc_run_config
//    and what it holds (config.h: fc_model_config, the optimizer config, the
//    order of every enum such as fc_strategy, fc_prec, fc_fault, fc_comm),
//    fc_step_info, fc_export, fc_error, fc_state_dict, fc_comm_log / its
//    events, fc_mem_stats and its categories (schedule.h);
//  - what a port must compute changes: the model layout and parameter order
//    of model.h, what export_full copies, the checkpoint files a port writes
//    (checkpoint.h), the collective semantics below.
// It does not bump for the oracle (new properties, tolerances, CLI flags),
// for core functions the contract does not use, or for the reference's
// internals. It is bumped together with the package's version (0.x: the minor,
// so find_package(fsdpcheck 0.N) never hands a port another contract), and
// FC_IMPL_ENTRY keeps its name, so an old port gets the version line above
// rather than "no entry point".
//
// What a port does on a bump: read what changed (the release notes name the
// types above that did), build against the new package (find_package(fsdpcheck
// 0.N)), adapt its functions, and run the gate again; until then every
// fsdpcheck of the new version refuses its old library with exit 2, so a CI
// gate fails loudly instead of comparing through a mismatched table. The port
// template pins the version it implements (a static assertion in plugin.c and
// a check of fsdpcheck_IMPL_ABI_VERSION in its CMakeLists.txt), so the build
// itself says which contract it was written for.
#define FC_IMPL_ABI_VERSION 5
#define FC_IMPL_ENTRY "fsdpcheck_impl_v1"

typedef struct fc_impl fc_impl;  // an implementation's own state, opaque here

// What export_full copies out, each as a full fp32 tensor set in model layout
// (m->numel floats, the unpadded full flat buffer).
typedef enum {
    FC_EXPORT_PARAMS,   // parameters after the last optimizer step
    FC_EXPORT_GRADS,    // gradients of the last step: reduced, divided, accumulated, before clipping;
                        // 0 for a frozen parameter, which has none (as its optimizer state)
    FC_EXPORT_STATE0,   // optimizer state 0 (exp_avg | momentum_buffer)
    FC_EXPORT_STATE1    // optimizer state 1 (exp_avg_sq)
} fc_export;

typedef struct {
    float loss;          // global mean loss of the last step
    double grad_norm;    // clip_grad_norm's total norm of the last step's gradient
} fc_step_info;

// The FSDP versions a port implements, as bits of fc_impl_ops.fsdp_versions.
#define FC_IMPL_FSDP(v) (1u << (v))
// Optional features a port implements, as bits of fc_impl_ops.features.
#define FC_IMPL_ACT_CKPT (1u << 0)  // fc_run_config.act_ckpt: activation checkpointing (docs/contract.md §5)
#define FC_IMPL_LLAMA (1u << 1)     // model kind llama: RMSNorm, RoPE, grouped-query attention, SwiGLU
#define FC_IMPL_FREEZE (1u << 2)    // fc_run_config.freeze: frozen parameters (fc_param.frozen)
// What a port's arithmetic guarantees, as bits of features. The oracle judges
// two runs of one port bitwise only where the port claims it (docs/contract.md
// §8); elsewhere by the per-element policy it uses against another arithmetic.
// Claim a bit only when it holds on every device and input the port supports.
#define FC_IMPL_LAYOUT_INVARIANT (1u << 3)  // the same step on the same data gives the same bits under every
                                            // strategy, prefetch, offload and buffer placement at one W
                                            // with one reduction tree
#define FC_IMPL_DETERMINISTIC (1u << 4)     // the same run twice gives the same bits, and so does a forward
                                            // recomputed for activation checkpointing
#define FC_IMPL_FAULTS (1u << 5)            // honours fc_run_config.inject: the fault catalogue is built in

typedef struct {
    int abi_version;     // FC_IMPL_ABI_VERSION
    const char *name;
    // FC_IMPL_FSDP(1) | FC_IMPL_FSDP(2): the layouts it implements (config.h's
    // fsdp_version). The sweep draws only these; create refuses the others.
    // A table without FSDP1 is refused when it is loaded.
    unsigned fsdp_versions;
    // FC_IMPL_ACT_CKPT | ...: the optional features it implements. The sweep
    // draws only these; create refuses a config that asks for another.
    unsigned features;
    // Builds the model from cfg on comm (which it may dup/split), initial
    // weights from cfg->seed or cfg->init_path. Returns NULL with e set on bad input.
    fc_impl *(*create)(const fc_run_config *cfg, MPI_Comm comm, fc_error *e);
    // Trains one step (all micro-batches, clip, optimizer).
    int (*step)(fc_impl *im, fc_step_info *out, fc_error *e);
    // Copies a full tensor set to dst on rank `root` (dst unused elsewhere).
    // Not part of the measured schedule or memory.
    int (*export_full)(fc_impl *im, fc_export what, float *dst, int root, fc_error *e);
    // Writes a checkpoint of the state after the last step into dir (crash
    // safe: temporaries, fsync, rename, manifest last). Collective.
    int (*save)(fc_impl *im, const char *dir, fc_state_dict kind, fc_error *e);
    // Replaces the state just created with dir's: parameters, optimizer state
    // and step count, so the next step() continues the saved run (at any W
    // and strategy). Refuses a checkpoint that fails verification
    // (core/checkpoint.h) or does not fit cfg, on every rank and before any
    // state changes; each rank reads only what it stores. Collective.
    int (*load)(fc_impl *im, const char *dir, fc_error *e);
    // Optimizer steps taken (the global step number of the next step).
    long (*steps_done)(const fc_impl *im);
    // This rank's comm log (all steps so far) and memory figures.
    const fc_comm_log *(*comm_log)(const fc_impl *im);
    void (*memory)(const fc_impl *im, fc_mem_stats *out);
    void (*destroy)(fc_impl *im);
} fc_impl_ops;

typedef const fc_impl_ops *(*fc_impl_entry)(void);

// The built-in reference implementation, and the fault catalogue: the same
// reference compiled a second time with the known bugs of docs/contract.md §9, one of
// which a run's config may name (--inject).
const fc_impl_ops *fc_reference_impl(void);
const fc_impl_ops *fc_reference_faults_impl(void);
// The magnitude pass (reference/magnitude.c): `local` only; its exported
// gradients are, per element, the sum of |terms| that formed each gradient,
// the scale of 16-bit rounding error the oracle judges against.
const fc_impl_ops *fc_reference_magnitude_impl(void);
// The sets a `local` reference of fc_reference_impl() holds, in place: what
// export_full would copy, without the copy. sets[0] the gradients (before
// clipping), sets[1] the parameters, sets[2 + i] optimizer state i (NULL where
// the optimizer keeps none), each [numel] in model layout, valid until the
// next step, load or destroy of im; the reference's activations are freed until
// its next step, which makes them again. -1 for any other table or strategy (then
// export_full is the way). For the oracle's own re-runs (oracle/rerun.c); not
// part of the contract a port implements.
int fc_reference_local_sets(const fc_impl_ops *ops, fc_impl *im, const float *sets[4]);
// Into such a reference, what load reads from a FULL checkpoint of params and
// state ([numel] each, model layout) saved at `step` (oracle/runner.h's
// lockstep handover), without the file: the parameters, the trainable
// parameters' optimizer state (a frozen one's reads as 0) and the step count.
// release (NULL: none) gets each piece of params and state once copied (a
// mapped trace's pages can go tensor by tensor). -1 for any other table or
// strategy (then the handover goes through load).
int fc_reference_local_load(const fc_impl_ops *ops, fc_impl *im, const float *params, const float *const state[2],
                            long step, fc_release_fn release, const void *arg);
// Into out [numel], the gradient of the mean loss over samples [first, first
// + n) of step `step`'s data at such a reference's parameters: the per-rank
// and per-micro-batch pieces of a step that the oracle's failure signatures
// assemble into the wrong answers FSDP implementations produce, and into
// *loss the mean loss over those samples. -1 as above.
int fc_reference_piece_grad(const fc_impl_ops *ops, fc_impl *im, long step, int first, int n, float *out, float *loss);

FC_END_DECLS

#endif
