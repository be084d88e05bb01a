// reference/plain/seams.h — the seams of the reference engine in the plain
// build, the one the oracle trusts: every seam is the identity.
//
// reference/fsdp.c is compiled twice. This build includes this file and is
// plain FSDP; the fault catalogue (docs/contract.md §9) includes reference/faults/seams.h
// instead, which puts one known bug behind each seam. Each macro names the
// point of the engine it stands at; its arguments are evaluated for their
// value only.
#ifndef FC_SEAMS_H
#define FC_SEAMS_H

// bf16 rounding: round to nearest, ties to even
#define seam_to_bf16(f, x) ((void)(f), fc_f32_to_bf16(x))
// the divide factors f->pre, f->post were set
#define seam_divide(f) ((void)(f))
// the engine was created / is being destroyed
#define seam_created(f) ((void)(f))
#define seam_destroy(f) ((void)(f))
// the data-parallel rank whose samples this rank reads
#define seam_data_rank(f, rank) ((void)(f), (rank))
// unit u's all-gather completed into f->u[u].gathered
#define seam_gathered(f, u) ((void)(f), (void)(u))
// unit u's backward is about to start (its unsharded gradient may exist from
// earlier micro-batches under no_sync)
#define seam_backward_begin(f, u) ((void)(f), (void)(u))
// the backward compute of stage s
#define seam_stage_backward(f, s, mb, scale) \
    fc_stage_backward(&(f)->m, (s), (f)->up, (mb), &(f)->acts, (f)->ug, (scale))
// the parameters activation checkpointing recomputes unit u's forward with
// (its gathered compute parameters), and the end of that recompute
#define seam_recompute_params(f, u) ((const float *)(f)->u[u].gathered)
#define seam_recompute_done(f, u, p) ((void)(f), (void)(u), (void)(p))
// whether unit u's gradient skips its reduction (it never does)
#define seam_skip_reduce(f, u) ((void)(f), (void)(u), 0)
// unit u's unsharded gradient in wire order before the reduction: its padding
// (FSDP1: [numel, padded); FSDP2: each parameter's rows' tail in each chunk) is zero
#define seam_padding(f, u, wire, numel, padded) \
    ((void)(f), (void)(u), (void)(wire), (void)(numel), (void)(padded))
// which post-forward group (FSDP2's integer reshard_after_forward) this rank
// joins: the row of PF consecutive ranks it is in
#define seam_post_forward_group(f, row) ((void)(f), (row))
// the layout of the run's shards (core/layout.h)
#define seam_layout(f, lay) ((void)(f), (lay))
// the precision gradients are reduced in
#define seam_reduce_dtype(f, rd) ((void)(f), (rd))
// whether hybrid replicas all-reduce the reduced shard (they do)
#define seam_replicate(f) ((void)(f), 1)
// the elements of a reduced chunk that enter the gradient: the non-padding ones
#define seam_valid(f, own_valid, S) ((void)(f), (void)(S), (own_valid))
// grad[0..n) += sum[i] / post was done
#define seam_divided(f, grad, sum, n, rd) ((void)(f), (void)(grad), (void)(sum), (void)(n), (void)(rd))
// the piece of unit u's gradient this rank adds to the norm
#define seam_norm_piece(f, u, g, n) ((void)(f), (void)(u), (void)(g), (void)(n))
// the communicator and group size the partial norms are gathered over
#define seam_norm_group(f, comm, G) ((void)(f), (void)(comm), (void)(G))
// the gathered partial norms, before they are combined
#define seam_norm_parts(f, parts, G, part) ((void)(f), (void)(parts), (void)(G), (void)(part))
// the total norm of G partials, as combined
#define seam_norm_total(f, total, G) ((void)(f), (void)(total), (void)(G))
// hybrid: unit u's reduced chunk acc[0..n) (the shard group's sum), before the replicas' all-reduce
#define seam_pre_replicate(f, u, acc, n) ((void)(f), (void)(u), (void)(acc), (void)(n))
// which checkpoint tensor fills each parameter's tensor on load: itself
#define seam_ckpt_source(f) ((void)(f), (fc_ckpt_source_fn)0)
// the step count a load continues from
#define seam_loaded(f, step) ((void)(f), (step))
#define seam_saved_offsets(f) ((void)(f), 0)
// whether frozen parameters' gradients are still kept at this phase (clip,
// optimizer) rather than dropped: never
#define seam_keep_frozen_grads(f, phase) ((void)(f), (void)(phase), 0)
// whether the optimizer steps the frozen elements p[0..n) (it leaves them alone)
#define seam_step_frozen(f, p, n) ((void)(f), (void)(p), (void)(n), 0)
// the implementation's features beyond the reference's own: none
#define seam_features 0u

#endif
