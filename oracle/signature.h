// oracle/signature.h — what kind of wrong a failed step is (docs/oracle.md, "Signatures").
//
// When a step fails, the first divergence says where. The signature says
// what: it rebuilds, from the reference's own pieces of that step (each
// rank's and each micro-batch's gradient, recomputed by the local reference
// from the step's start), the wrong answers FSDP implementations actually
// produce, finishes each into a whole step (norm, clipping, optimizer) and
// asks the comparison engine whether B is that answer within the policy:
//   gradients: c x A; one rank's local gradient, never reduced; reduced over
//     the shard group only, or over the replica group only; the previous
//     step's; missing one micro-batch of an accumulation; reduced in 16 bits;
//   the step: unclipped, clipped by one rank's norm or by a wrong total norm;
//     stepped twice or not at all; another optimizer step count (AdamW's bias
//     correction); optimizer state restarted from zero.
// A shape of the gradients is tried on the parameters whose tensors failed
// (the rest keep A's values, which B matched), so a bug confined to one unit
// is named with the tensors it touched. Nothing here changes a verdict.
#ifndef FC_SIGNATURE_H
#define FC_SIGNATURE_H

#include <stdio.h>

#include "compare.h"

typedef struct {
    const fc_model *m;
    const fc_run_config *cfg;      // B's run: layout, batch, accumulation, clipping, optimizer
    int world;                     // B's world size
    const fc_cmp_ctx *ctx;         // how the step was judged
    const fc_cmp_result *verdict;  // the failed step (which tensors failed)
    const fc_trace_step *a, *b;    // expected and tested; a->prev_params is where both started
    const float *state[2];         // [numel] the optimizer state the step started from; NULL: zeros
    const float *b_prev_grads;     // [numel] B's gradients of the step before; NULL: none
    const char *init;              // weights the piece reference opens with (NULL: the seed's)
    int pieces;                    // 1: recompute the per-rank pieces (MPI is up or may start here)
} fc_sig_input;

#define FC_SIG_TEXT 480
typedef struct {
    int n_match;                   // shapes B matched (0: none)
    char text[FC_SIG_TEXT];        // the first match, with the others named after it
} fc_signature;

// The signature of a failed step.
void fc_signature_find(const fc_sig_input *in, fc_signature *out);
// "signature: <text>\n"
void fc_signature_print(FILE *f, const fc_signature *s);

#endif
