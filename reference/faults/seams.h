// reference/faults/seams.h — the seams of the reference engine in the fault
// catalogue build (docs/contract.md §9): reference/fsdp.c and reference/impl_reference.c
// compiled a second time, with a known bug behind each seam, active when the
// run's config names it (--inject). The implementations, each beside the
// property expected to catch it, are in reference/faults/faults.c.
//
// This build is a second implementation of the contract, fc_reference_faults_impl():
// its exported names are renamed here so that both builds link into one binary.
#ifndef FC_SEAMS_H
#define FC_SEAMS_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt_collective.h"
#include "clip.h"
#include "data.h"
#include "dtype.h"
#include "layout.h"
#include "schedule.h"

#define fc_fsdp_create fc_faulty_fsdp_create
#define fc_fsdp_step fc_faulty_fsdp_step
#define fc_fsdp_export fc_faulty_fsdp_export
#define fc_fsdp_log fc_faulty_fsdp_log
#define fc_fsdp_memory fc_faulty_fsdp_memory
#define fc_fsdp_destroy fc_faulty_fsdp_destroy
#define fc_fsdp_save fc_faulty_fsdp_save
#define fc_fsdp_load fc_faulty_fsdp_load
#define fc_fsdp_steps fc_faulty_fsdp_steps
#define fc_reference_impl fc_reference_faults_impl
#define fc_reference_local_sets fc_faulty_reference_local_sets
#define fc_reference_local_load fc_faulty_reference_local_load
#define fc_reference_piece_grad fc_faulty_reference_piece_grad

struct fc_fsdp;

uint16_t fc_fault_to_bf16(const struct fc_fsdp *f, float x);
void fc_fault_divide(struct fc_fsdp *f);
void fc_fault_created(struct fc_fsdp *f);
void fc_fault_destroy(struct fc_fsdp *f);
int fc_fault_data_rank(const struct fc_fsdp *f, int rank);
void fc_fault_gathered(struct fc_fsdp *f, int u);
void fc_fault_backward_begin(struct fc_fsdp *f, int u);
void fc_fault_stage_backward(struct fc_fsdp *f, int s, const fc_batch *mb, float scale);
int fc_fault_skip_reduce(struct fc_fsdp *f, int u);
void fc_fault_padding(const struct fc_fsdp *f, int u, float *wire, size_t numel, size_t padded);
const fc_layout_ops *fc_fault_layout(const struct fc_fsdp *f, const fc_layout_ops *lay);
int fc_fault_post_forward_group(const struct fc_fsdp *f, int row);
fc_prec fc_fault_reduce_dtype(const struct fc_fsdp *f, fc_prec rd);
int fc_fault_replicate(const struct fc_fsdp *f);
size_t fc_fault_valid(const struct fc_fsdp *f, size_t own_valid, size_t S);
void fc_fault_divided(const struct fc_fsdp *f, float *grad, const float *sum, size_t n, fc_prec rd);
void fc_fault_norm_piece(const struct fc_fsdp *f, int u, const float **g, size_t *n);
void fc_fault_norm_group(const struct fc_fsdp *f, MPI_Comm *comm, int *G);
void fc_fault_norm_parts(const struct fc_fsdp *f, fc_norm_part *parts, int *G, const fc_norm_part *part);
void fc_fault_norm_total(const struct fc_fsdp *f, double *total, int G);
void fc_fault_pre_replicate(struct fc_fsdp *f, int u, const float *acc, size_t n);
fc_ckpt_source_fn fc_fault_ckpt_source(const struct fc_fsdp *f);
long fc_fault_loaded(struct fc_fsdp *f, long step);
int fc_fault_saved_offsets(const struct fc_fsdp *f);
int fc_fault_keep_frozen_grads(const struct fc_fsdp *f, fc_phase phase);
int fc_fault_step_frozen(const struct fc_fsdp *f, float *p, size_t n);
const float *fc_fault_recompute_params(struct fc_fsdp *f, int u);
void fc_fault_recompute_done(struct fc_fsdp *f, int u, const float *p);

#define seam_to_bf16(f, x) fc_fault_to_bf16((f), (x))
#define seam_divide(f) fc_fault_divide(f)
#define seam_created(f) fc_fault_created(f)
#define seam_destroy(f) fc_fault_destroy(f)
#define seam_data_rank(f, rank) fc_fault_data_rank((f), (rank))
#define seam_gathered(f, u) fc_fault_gathered((f), (u))
#define seam_backward_begin(f, u) fc_fault_backward_begin((f), (u))
#define seam_stage_backward(f, s, mb, scale) fc_fault_stage_backward((f), (s), (mb), (scale))
#define seam_skip_reduce(f, u) fc_fault_skip_reduce((f), (u))
#define seam_padding(f, u, wire, numel, padded) fc_fault_padding((f), (u), (wire), (numel), (padded))
#define seam_layout(f, lay) fc_fault_layout((f), (lay))
#define seam_post_forward_group(f, row) fc_fault_post_forward_group((f), (row))
#define seam_reduce_dtype(f, rd) fc_fault_reduce_dtype((f), (rd))
#define seam_replicate(f) fc_fault_replicate(f)
#define seam_valid(f, own_valid, S) fc_fault_valid((f), (own_valid), (S))
#define seam_divided(f, grad, sum, n, rd) fc_fault_divided((f), (grad), (sum), (n), (rd))
#define seam_norm_piece(f, u, g, n) fc_fault_norm_piece((f), (u), (g), (n))
#define seam_norm_group(f, comm, G) fc_fault_norm_group((f), (comm), (G))
#define seam_norm_parts(f, parts, G, part) fc_fault_norm_parts((f), (parts), (G), (part))
#define seam_norm_total(f, total, G) fc_fault_norm_total((f), (total), (G))
#define seam_pre_replicate(f, u, acc, n) fc_fault_pre_replicate((f), (u), (acc), (n))
#define seam_ckpt_source(f) fc_fault_ckpt_source(f)
#define seam_loaded(f, step) fc_fault_loaded((f), (step))
#define seam_saved_offsets(f) fc_fault_saved_offsets(f)
#define seam_keep_frozen_grads(f, phase) fc_fault_keep_frozen_grads((f), (phase))
#define seam_step_frozen(f, p, n) fc_fault_step_frozen((f), (p), (n))
#define seam_recompute_params(f, u) fc_fault_recompute_params((f), (u))
#define seam_recompute_done(f, u, p) fc_fault_recompute_done((f), (u), (p))
// this build honours fc_run_config.inject
#define seam_features FC_IMPL_FAULTS

#endif
