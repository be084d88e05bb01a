// core/layout.h — FSDP's layout and schedule rules, written once (docs/contract.md §4, §5).
//
// Everything an implementation must agree on to be FSDP, and that the oracle
// needs to predict what it will see, is here: which ranks shard a unit and
// which replicate it, where a rank's shard starts and how much of it is
// padding, which stages use a unit, when a unit is resharded, which unit is
// prefetched next, whether the all-gather limiter lets a prefetch go, and the
// gradient divide factors. The reference engine, a hardware port, checkpoints,
// `compare` (who owns an element) and the sweep's theory all call these.
//
// Groups (docs/contract.md §5). W ranks; the shard group has F ranks: W for full_shard
// and shard_grad_op, the --shard-group for hybrid (W when it is 0), and 1 for
// no_shard. Shard groups are consecutive ranks (group g = ranks g*F..g*F+F-1);
// the R = W/F replicas of a shard are the ranks at the same position in every
// group. Gradients are reduced over G ranks: the shard group when sharded, the
// whole world for no_shard (whose all-reduce is a reduce-scatter over W plus an
// all-gather), so every strategy has one "reduction layout" of G chunks.
//
// Flat layout of unit u with N elements over G: S = ceil(N / G) elements per
// chunk, padded size P = S*G, chunk j = [j*S, (j+1)*S); the last chunks may be
// partly or wholly padding (N < P), never stored, reduced or normed.
#ifndef FC_LAYOUT_H
#define FC_LAYOUT_H

#include <stddef.h>

#include "config.h"
#include "model.h"
#include "hd.h"

FC_BEGIN_DECLS

int fc_strategy_sharded(fc_strategy s);         // gathers parameters: not local, not no_shard
int fc_strategy_hybrid(fc_strategy s);          // hybrid_shard, hybrid_shard_zero2
int fc_strategy_reshards(fc_strategy s);        // frees after forward: full_shard, hybrid_shard

// Where one rank sits in a run's groups.
typedef struct {
    int W, rank;
    int sharded, hybrid;
    int F;             // shard-group size: W, the hybrid shard group, or 1 (no_shard, local)
    int R;             // replicas of a shard: W / F (no_shard: W)
    int shard_rank;    // position in the shard group: rank % F
    int replica;       // which shard group: rank / F
    int G;             // ranks of the reduction layout: F when sharded, else W
    int idx;           // this rank's chunk in the reduction layout: shard_rank, or rank (no_shard)
    int PF;            // FSDP2's integer reshard_after_forward: groups of PF consecutive ranks (0: none)
    int pf_rank;       // position in that group: rank % PF (0 without)
} fc_groups;

// The groups of cfg's strategy at world size W, seen from `rank`.
fc_groups fc_groups_of(const fc_run_config *cfg, int W, int rank);

// One unit's flat layout as one rank holds it.
typedef struct {
    size_t numel;      // N: real elements
    size_t shard;      // S = ceil(N / G): elements per chunk
    size_t padded;     // P = S * G
    size_t own_off;    // first element of this rank's chunk: idx * S
    size_t own_valid;  // elements of that chunk that are not padding (may be 0)
    size_t store;      // elements this rank keeps: S when sharded, N for no_shard
} fc_unit_layout;

fc_unit_layout fc_unit_layout_of(size_t numel, const fc_groups *g);

// ---------------------------------------------------------------------------
// The two layouts of a unit's shards (docs/contract.md §5), one interface: FSDP1's flat
// FlatParameter chunks (core/layout_flat.c) and FSDP2's per-parameter dim-0
// rows (core/layout_per_param.c). Each rank's chunk of a unit has S elements
// (padding included), and the wire buffer of an all-gather or reduce-scatter
// is the G chunks in rank order, P = S * G. Where the real elements of chunk
// j sit in the unit's natural order (its parameters concatenated in
// registration order) is a list of pieces. Every copy between the two
// orders, every byte count and every owner lookup goes through these; nothing
// else computes padding.

typedef enum { FC_LAYOUT_FLAT, FC_LAYOUT_PER_PARAM, FC_LAYOUT_COUNT } fc_layout_kind;

// A run of real elements: unit elements [unit_off, unit_off + count) are a
// chunk's elements [chunk_off, chunk_off + count).
typedef struct {
    size_t unit_off, chunk_off, count;
} fc_piece;

typedef struct {
    const char *name;        // "flat" (FSDP1), "per_param" (FSDP2)
    // the wire order is the natural order, padding at the end (FSDP1's
    // FlatParameter): a gathered buffer is the unit's parameters as it is
    int wire_is_natural;
    // S: the elements of each of G chunks of unit u
    size_t (*chunk_size)(const fc_model *m, int u, int G);
    // the pieces of chunk j in chunk order (at most max(1, the unit's
    // parameter count)); returns how many, 0 for a chunk of padding only
    int (*pieces)(const fc_model *m, int u, int G, int j, fc_piece *out);
    // the chunk that holds the unit's element i
    int (*owner)(const fc_model *m, int u, int G, size_t i);
    // the stretch of chunk j that each of the unit's parameters owns, in
    // parameter order (unit_off: the parameter's first element): FSDP2 a
    // parameter's padded rows, one per parameter in every chunk; FSDP1 its
    // real elements in the chunk (the padding at the end is no parameter's).
    // Returns how many (at most the unit's parameter count).
    int (*slots)(const fc_model *m, int u, int G, int j, fc_piece *out);
} fc_layout_ops;

const fc_layout_ops *fc_layout_of(fc_layout_kind k);
// The layout of a run: FSDP1's flat chunks, or FSDP2's rows (fsdp_version 2).
fc_layout_kind fc_layout_kind_of(const fc_run_config *cfg);
// The most pieces a chunk of unit u can have.
int fc_layout_max_pieces(const fc_model *m, int u);
// One unit's layout as rank g->idx holds it, in layout `lay`: for FLAT the
// same as fc_unit_layout_of; for PER_PARAM own_off is the unit element of
// the chunk's first piece (the chunk is not one range: use the pieces).
fc_unit_layout fc_unit_layout_in(const fc_layout_ops *lay, const fc_model *m, int u, const fc_groups *g);

// Elements of what this rank stores of unit u (fc_unit_layout_in's store)
// that have no optimizer state because they are frozen: the frozen
// parameters' real elements in its flat chunk (FSDP1, whose FlatParameter
// keeps them beside trainable ones), or all of it when no parameter of the
// unit trains (the FlatParameter itself is frozen); the frozen parameters'
// padded rows (FSDP2, one tensor per parameter). Optimizer state, and under
// FSDP2 the gradient too, exist for the rest only; FSDP1 keeps a gradient
// for the whole store of a unit that trains (fc_unit_trains), none otherwise.
size_t fc_unit_frozen_store(const fc_layout_ops *lay, const fc_model *m, int u, const fc_groups *g);
// Where they are, for a unit that trains: the stretches of the store that
// frozen parameters own (lay->slots; no_shard: their elements of the whole
// unit), in store order, at most the unit's parameter count. Their counts add
// up to fc_unit_frozen_store. A framework keeps the rest (FSDP2's gradient,
// both versions' optimizer state) as one array with these stretches left out.
int fc_unit_frozen_slots(const fc_layout_ops *lay, const fc_model *m, int u, const fc_groups *g, fc_piece *out);

// Copies between one unit's natural order [N] and its wire order [P]:
// wire[j*S + piece.chunk_off + k] <-> natural[piece.unit_off + k] for every
// chunk j. Gathering leaves padding alone; scattering writes zeros there.
void fc_layout_to_natural(const fc_layout_ops *lay, const fc_model *m, int u, int G, const float *wire,
                          float *natural);
void fc_layout_to_wire(const fc_layout_ops *lay, const fc_model *m, int u, int G, const float *natural,
                       float *wire);
// Every chunk's pieces of unit u in wire order, chunk_off counted from the
// wire's start (j * S + the piece's offset in chunk j): the map both copies
// above follow, and a device's copy kernel too. out holds at most G *
// fc_layout_max_pieces(m, u); returns how many.
int fc_layout_wire_pieces(const fc_layout_ops *lay, const fc_model *m, int u, int G, fc_piece *out);
// S = ceil(n / G): the chunk size of an n-element buffer over G ranks.
size_t fc_chunk_size(size_t n, int G);
// Chunk j of G of an n-element buffer, padding excluded: [j*S, j*S + count).
void fc_flat_chunk(size_t n, int G, int j, size_t *first, size_t *count);

// The stages that use unit u: forward runs first_fwd..last_fwd among others,
// backward runs stages from high to low, so its first use there is first_bwd
// (= last_fwd) and its last last_bwd (= first_fwd). -1 when u has no stage.
typedef struct {
    int first_fwd, last_fwd, first_bwd, last_bwd;
} fc_unit_stages;

fc_unit_stages fc_unit_stages_of(const fc_model *m, int u);

// FULL_SHARD and HYBRID_SHARD free a unit's gathered parameters after its last
// forward stage, except the root, which backward uses again at once (FSDP1
// keeps the root unsharded between forward and backward).
int fc_reshard_after_forward(fc_strategy s, const fc_model *m, int u);

// Activation checkpointing (docs/contract.md §5): whether unit u recomputes its forward
// in backward (every unit but the root), and whether that recompute gathers
// the unit itself: FSDP1 with the checkpoint outside the unit
// (checkpoint(FSDP(layer))) runs the unit's forward, all-gather and reshard
// included, before its pre-backward gathers it again; inside the unit, or
// under FSDP2 (whose pre-forward does not unshard a unit in backward), the
// recompute uses backward's all-gather.
int fc_unit_checkpointed(const fc_run_config *c, const fc_model *m, int u);
int fc_recompute_gathers(const fc_run_config *c, const fc_model *m, int u);

// Prefetch order: the next unit whose first use in forward (backward) comes
// after stage s, or -1. `stages` holds fc_unit_stages_of for every unit.
int fc_next_forward_unit(const fc_model *m, const fc_unit_stages *stages, int s);
int fc_next_backward_unit(const fc_model *m, const fc_unit_stages *stages, int s);

// The units an all-gather prefetch at stage s issues, in issue order, into
// out[] (room for m->n_units); returns how many. Forward: at a unit's first
// forward stage (its pre-forward), the next fc_forward_prefetch_count units
// of the forward order. Backward: at the stage where the backward prefetch
// policy acts (FSDP1 pre: the unit's first backward stage, post: its last;
// FSDP2: its pre-backward), the next fc_backward_prefetch_count units of the
// backward order. FSDP2's lists (set_modules_to_forward_prefetch,
// set_modules_to_backward_prefetch) are set on every unit, the root included;
// a unit already gathered or in flight is skipped where the call is made
// (torch's unshard is a no-op then).
int fc_prefetch_units(const fc_model *m, const fc_unit_stages *stages, int s, int forward, int n, int *out);
int fc_forward_prefetch_count(const fc_run_config *cfg);
int fc_backward_prefetch_count(const fc_run_config *cfg);

// The backward prefetch a run does: FSDP1's backward_prefetch, or under
// FSDP2 (fsdp_version 2) its implicit one: each unit's pre-backward issues
// the next backward unit's all-gather, as BACKWARD_PRE does.
fc_prefetch fc_backward_prefetch_of(const fc_run_config *cfg);

// The limiter (limit_all_gathers): at most two units' gathered parameters may
// exist (in flight or not yet freed), so a prefetch is issued only while fewer
// than two are alive; a unit whose prefetch was held back is gathered when it
// is reached.
int fc_limiter_allows_prefetch(const fc_run_config *cfg, int alive);

// PyTorch's gradient pre-divide factor of a divide factor F
// (_get_gradient_predivide_factor; FSDP2's _get_gradient_divide_factors for
// fp16): starting at 1, double f while F % f == 0 and F / f > f.
double fc_predivide_factor(double F);
// What a run divides its summed gradient by: FSDP2's set_gradient_divide_factor
// (cfg->gradient_divide_factor) when set, else its W data-parallel ranks.
double fc_divide_by(const fc_run_config *cfg, int W);
// The divide factors of a divide mode for a divide factor F (fc_divide_by):
// each rank divides its gradient by pre before the sum and the sum by post
// after it, pre * post = F. prepost: FSDP1's (F=3: 2 and 1.5); avg: F and 1;
// sum-then-divide: 1 and F.
void fc_divide_factors(fc_divide d, double F, double *pre, double *post);

// The sample range of data-parallel rank `rank`: [first, first + count) of
// the global batch (docs/contract.md §3).
void fc_rank_samples(const fc_run_config *cfg, int W, int rank, int *first, int *count);

FC_END_DECLS

#endif
