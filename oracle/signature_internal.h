// oracle/signature_internal.h — what the signatures' three files share:
// signature.c (the driver) calls signature_shapes.c (the candidates), and
// both call signature_engine.c (a candidate finished into a step and judged).
#ifndef FC_SIGNATURE_INTERNAL_H
#define FC_SIGNATURE_INTERNAL_H

#include "signature.h"

typedef struct {
    const fc_sig_input *in;
    const fc_model *m;
    size_t n;                 // numel
    int W, K;                 // world, micro-batches
    int F, R, sharded;        // shard group size, replicas, a sharded layout
    long t;                   // the optimizer step count of this step's update
    unsigned char *bad;       // [n_params] some tensor of parameter i failed against A
    unsigned char *bad_grad;  // [n_params] its gradient did
    int n_bad, n_bad_grad, n_trained;
    fc_cmp_policy pol;        // the signature's judge: the step's policy, never bitwise
    fc_cmp_ctx ctx;
    float *g, *p, *st[2], *clip;  // [numel] the candidate: gradient, parameters, state; the clipped gradient
    const float *start[2];    // [numel] the state the step started from (zeros where none)
    float *zeros;             // [numel]
    int *owner;               // [numel] the rank in shard group 0 that holds element i, or NULL
    double loss;              // the candidate's loss where it is not A's (NAN: A's), for the next try only
    fc_signature *out;
} fc_sig;

typedef struct {
    int updates;               // optimizer updates applied: 1, or 0 (not stepped), 2 (twice)
    long t;                    // the first update's step count
    int unclipped;             // 1: clip_grad_norm_ not applied
    int zero_state;            // 1: the updates start from zero state
    const double *rank_coef;   // [W] each owner's clip coefficient (a rank's own norm), or NULL
    double norm;               // < 0: the candidate gradient's own total norm; else the norm reported
} fc_sig_finish;

// The state of one signature: which parameters failed, the judge, the candidate's buffers.
void fc_sig_init(fc_sig *s, const fc_sig_input *in, fc_signature *out);
void fc_sig_free(fc_sig *s);
// Whether B is within the signature's policy of A (a failure only bitwise comparison sees).
int fc_sig_near_a(fc_sig *s);
// The default finish: one update at s->t, clipped by the gradient's own norm.
fc_sig_finish fc_sig_finish_default(const fc_sig *s);
// Judges s->g (A's values kept where the gradient did not fail), finished as
// h says, against B; on a match, text names it. Candidates whose gradient is
// A's in every failing tensor are skipped (they would only repeat A).
void fc_sig_try_grad(fc_sig *s, const char *text);
// The same with A's gradient and the finish h (the optimizer's shapes).
void fc_sig_try_step(fc_sig *s, const fc_sig_finish *h, const char *text);
// s->g's failing tensors lie on prec's grid, and A's mostly do not.
int fc_sig_on_grid(const fc_sig *s, fc_prec prec);
// Records a match (signature_shapes.c's dtype shape has no step to judge).
void fc_sig_record(fc_sig *s, const char *text);

// The shapes, in the order they are tried (signature_shapes.c).
void fc_sig_shapes_grad(fc_sig *s);
void fc_sig_shapes_step(fc_sig *s);
void fc_sig_shape_dtype(fc_sig *s);  // also where B is within the tolerances of A (a bitwise failure)

#endif
