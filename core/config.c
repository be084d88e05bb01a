// core/config.c — the enum names, the fault catalogue's tables, run-config
// defaults and validation. The model config is config_model.c, the run
// config's JSON round trip config_json.c. See config.h.
#include "config.h"
#include "layout.h"
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// ---------------------------------------------------------------------------
// enum names

static const char *STRATEGY_NAMES[FC_STRATEGY_COUNT] = {
    "local", "no_shard", "full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"};
static const char *PREFETCH_NAMES[] = {"none", "pre", "post"};
static const char *OPT_NAMES[] = {"adamw", "sgd"};
static const char *DIVIDE_NAMES[] = {"prepost", "avg", "sum-then-divide"};
static const char *NORM_NAMES[] = {"1", "2", "inf"};
static const char *COMM_NAMES[] = {"auto", "nccl", "mpi"};
static const char *ACT_CKPT_NAMES[] = {"none", "inside", "outside"};
static const char *FAULT_NAMES[FC_FAULT_COUNT] = {
    "none", "no_divide", "divide_twice", "shard_offset", "padding_leak", "stale_gather",
    "skip_root_reduce", "hsdp_no_replicate", "no_sync_overwrite", "clip_local_norm",
    "clip_double_count", "ckpt_drop_optim", "ckpt_swap", "tied_untied", "bf16_truncate",
    "reduce_dtype_ignored", "adam_step_reset", "data_overlap", "avg_tail", "clip_eps_per_rank",
    "clip_hsdp_shard_norm", "recompute_dtype", "fsdp2_avg_twice", "fsdp2_even_rows", "fsdp2_padding_norm",
    "fsdp2_post_forward_group", "dcp_saved_offsets", "rope_half", "frozen_decay",
    "frozen_in_norm", "frozen_stepped", "lora_alpha"};

// The property of docs/contract.md §8 expected to catch each fault (the fault catalogue,
// reference/faults/faults.c, has each bug beside the same number): the sweep
// shrinks an injected fault's case while this property still fails, and the
// gate's fault tests require it.
static const int FAULT_PROPERTY[FC_FAULT_COUNT] = {
    [FC_FAULT_NONE] = 0,
    [FC_FAULT_NO_DIVIDE] = 1,             // gradients W times the local model's
    [FC_FAULT_DIVIDE_TWICE] = 1,
    [FC_FAULT_SHARD_OFFSET] = 2,          // a sharded layout that no_shard does not have
    [FC_FAULT_PADDING_LEAK] = 5,          // padding exists only where shards are uneven
    [FC_FAULT_STALE_GATHER] = 4,          // only prefetched gathers go stale
    [FC_FAULT_SKIP_ROOT_REDUCE] = 1,
    [FC_FAULT_HSDP_NO_REPLICATE] = 3,     // hybrid against full_shard over the same world
    [FC_FAULT_NO_SYNC_OVERWRITE] = 6,     // accumulation against the joined batch
    [FC_FAULT_CLIP_LOCAL_NORM] = 8,
    [FC_FAULT_CLIP_DOUBLE_COUNT] = 8,
    [FC_FAULT_CKPT_DROP_OPTIM] = 7,       // the checkpoint round trip
    [FC_FAULT_CKPT_SWAP] = 7,
    [FC_FAULT_TIED_UNTIED] = 1,
    [FC_FAULT_BF16_TRUNCATE] = 9,         // mixed precision against DDP under the same policy
    [FC_FAULT_REDUCE_DTYPE_IGNORED] = 9,
    [FC_FAULT_ADAM_STEP_RESET] = 7,
    [FC_FAULT_DATA_OVERLAP] = 1,
    [FC_FAULT_AVG_TAIL] = 1,
    [FC_FAULT_CLIP_EPS_PER_RANK] = 8,     // only the norm (and the clip coefficient) moves
    [FC_FAULT_CLIP_HSDP_SHARD_NORM] = 8,
    [FC_FAULT_RECOMPUTE_DTYPE] = 15,      // only the recompute moves: checkpointing against none
    [FC_FAULT_FSDP2_AVG_TWICE] = 1,       // gradients 1/W of the local model's
    [FC_FAULT_FSDP2_EVEN_ROWS] = 10,      // the same math on another split: only the rows each rank steps show it
    [FC_FAULT_FSDP2_PADDING_NORM] = 8,    // only the norm (and the clip coefficient) moves
    [FC_FAULT_FSDP2_POST_FORWARD_GROUP] = 1,  // backward computes with other rows' parameters
    [FC_FAULT_DCP_SAVED_OFFSETS] = 7,     // only a DCP checkpoint's round trip reads the offsets
    [FC_FAULT_ROPE_HALF] = 1,             // the model's math: every loss against the local model's
    [FC_FAULT_FROZEN_DECAY] = 1,          // a frozen parameter moves: the parameters against the local model's
    [FC_FAULT_FROZEN_IN_NORM] = 8,        // only the norm (and the clip coefficient) moves
    [FC_FAULT_FROZEN_STEPPED] = 1,        // a frozen parameter gets a gradient and moves
    [FC_FAULT_LORA_ALPHA] = 1,            // the model's math: LoRA's gradients r times the local model's
};

int fc_fault_property(fc_fault f) { return (unsigned)f < FC_FAULT_COUNT ? FAULT_PROPERTY[f] : 0; }

// A 16-bit reduction of gradients a port already produced in 16 bits errs by
// less than the port's own activation rounding, which P9's model must allow
// (docs/measurements/hwlike-gate.md); the comm log shows the reduction's dtype.
int fc_fault_property_act16(fc_fault f) {
    return f == FC_FAULT_REDUCE_DTYPE_IGNORED ? 10 : fc_fault_property(f);
}

// Which FSDP versions each fault's seam acts in (reference/faults/faults.c):
// FSDP1's flat chunks unless listed (their seams read the FlatParameter's
// padding and offsets), both where the bug is in no layout, FSDP2's own.
#define V1 (1u << 1)
#define V2 (1u << 2)
static const unsigned FAULT_VERSIONS[FC_FAULT_COUNT] = {
    // bugs of the divide, the data and the checkpoint loader: no layout in them
    [FC_FAULT_NO_DIVIDE] = V1 | V2,
    [FC_FAULT_DIVIDE_TWICE] = V1 | V2,
    [FC_FAULT_DATA_OVERLAP] = V1 | V2,
    [FC_FAULT_CKPT_DROP_OPTIM] = V1 | V2,
    [FC_FAULT_CKPT_SWAP] = V1 | V2,
    [FC_FAULT_ADAM_STEP_RESET] = V1 | V2,
    [FC_FAULT_RECOMPUTE_DTYPE] = V1 | V2,
    [FC_FAULT_FSDP2_AVG_TWICE] = V2,
    [FC_FAULT_FSDP2_EVEN_ROWS] = V2,
    [FC_FAULT_FSDP2_PADDING_NORM] = V2,
    [FC_FAULT_FSDP2_POST_FORWARD_GROUP] = V2,
    [FC_FAULT_DCP_SAVED_OFFSETS] = V2,
    [FC_FAULT_ROPE_HALF] = V1 | V2,
    [FC_FAULT_FROZEN_DECAY] = V1 | V2,
    [FC_FAULT_FROZEN_IN_NORM] = V1 | V2,
    [FC_FAULT_FROZEN_STEPPED] = V1 | V2,
    [FC_FAULT_LORA_ALPHA] = V1 | V2,
};

unsigned fc_fault_versions(fc_fault f) {
    if ((unsigned)f >= FC_FAULT_COUNT || f == FC_FAULT_NONE) return 0;
    return FAULT_VERSIONS[f] ? FAULT_VERSIONS[f] : V1;
}
#undef V1
#undef V2

static int parse_name(const char *s, const char **names, int n) {
    if (!s) return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

#define NAME_FUNCS(fn, type, table)                                            \
    const char *fc_##fn##_name(type v) { return table[v]; }                    \
    int fc_##fn##_parse(const char *s, type *out) {                            \
        int i = parse_name(s, table, (int)(sizeof table / sizeof table[0]));   \
        if (i < 0) return -1;                                                  \
        *out = (type)i;                                                        \
        return 0;                                                              \
    }
NAME_FUNCS(strategy, fc_strategy, STRATEGY_NAMES)
NAME_FUNCS(prefetch, fc_prefetch, PREFETCH_NAMES)
NAME_FUNCS(opt, fc_opt_kind, OPT_NAMES)
NAME_FUNCS(divide, fc_divide, DIVIDE_NAMES)
NAME_FUNCS(comm, fc_comm, COMM_NAMES)
NAME_FUNCS(norm, fc_norm_type, NORM_NAMES)
NAME_FUNCS(fault, fc_fault, FAULT_NAMES)
NAME_FUNCS(act_ckpt, fc_act_ckpt, ACT_CKPT_NAMES)

// ---------------------------------------------------------------------------
// run config

void fc_run_config_defaults(fc_run_config *c) {
    memset(c, 0, sizeof *c);
    fc_error e;
    if (fc_model_config_load("mlp-tiny", &c->model, &e) != 0) fc_die(FC_EXIT_INTERNAL, "%s", e.msg);
    snprintf(c->impl, sizeof c->impl, "reference");
    c->strategy = FC_STRATEGY_LOCAL;
    c->fsdp_version = 1;
    c->backward_prefetch = FC_PREFETCH_NONE;
    c->param_dtype = c->reduce_dtype = FC_PREC_FP32;
    c->divide = FC_DIVIDE_PREPOST;
    c->grad_accum = 1;
    c->norm_type = FC_NORM_2;
    // torch.optim.AdamW defaults, except lr (1e-3 there too) and weight decay 0.01.
    c->optim.kind = FC_OPT_ADAMW;
    c->optim.lr = 1e-3;
    c->optim.weight_decay = 0.01;
    c->optim.beta1 = 0.9;
    c->optim.beta2 = 0.999;
    c->optim.eps = 1e-8;
    c->optim.momentum = 0.9;
    c->steps = 3;
    c->global_batch = 8;
    c->seq_len = 16;
    c->seed = 1234;
}

fc_divide fc_default_divide(const fc_run_config *c) {
    return c->fsdp_version == 2 && c->reduce_dtype != FC_PREC_FP16 ? FC_DIVIDE_AVG : FC_DIVIDE_PREPOST;
}

// The sizes of the run and the optimizer's hyperparameters.
static int validate_numbers(const fc_run_config *c, fc_error *e) {
    if (c->steps < 1) return fc_fail(e, "--steps must be at least 1");
    if (c->global_batch < 1) return fc_fail(e, "--global-batch must be at least 1");
    if (c->grad_accum < 1) return fc_fail(e, "--grad-accum must be at least 1");
    if (c->no_sync && c->grad_accum < 2)
        return fc_fail(e, "--no-sync needs --grad-accum K with K >= 2");
    if (c->model.kind == FC_MODEL_GPT2 && (c->seq_len < 1 || c->seq_len > c->model.n_positions))
        return fc_fail(e, "--seq-len %d is outside 1..n_positions (%d)", c->seq_len,
                       c->model.n_positions);
    const fc_optim_config *o = &c->optim;
    if (!(o->lr >= 0) || !isfinite(o->lr)) return fc_fail(e, "--lr must be a finite number >= 0");
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return fc_fail(e, "--weight-decay must be a finite number >= 0");
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        return fc_fail(e, "AdamW betas must be in [0, 1)");
    if (!(o->eps >= 0) || !isfinite(o->eps)) return fc_fail(e, "AdamW eps must be >= 0");
    if (!(o->momentum >= 0) || !isfinite(o->momentum)) return fc_fail(e, "--momentum must be >= 0");
    if (!(o->dampening >= 0 && o->dampening <= 1)) return fc_fail(e, "SGD dampening must be in [0, 1]");
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return fc_fail(e, "Nesterov momentum requires a momentum and zero dampening");
    if (!(c->clip_grad_norm >= 0) || !isfinite(c->clip_grad_norm))
        return fc_fail(e, "--clip-grad-norm must be >= 0");
    if (c->shard_group < 0) return fc_fail(e, "--shard-group must be positive");
    if (c->comm != FC_COMM_AUTO && !strcmp(c->impl, "reference"))
        return fc_fail(e, "--comm %s chooses a port's collective backend (--impl cuda); the reference "
                          "communicates through MPI only", fc_comm_name(c->comm));
    return 0;
}

// The FSDP options (prefetching, --fsdp-version, the gradient divide factor):
// those that would change nothing under the chosen strategy are refused;
// FSDP1's options under FSDP2 and FSDP2's under FSDP1 too.
static int validate_fsdp_options(const fc_run_config *c, fc_error *e) {
    int sharded = fc_strategy_sharded(c->strategy);
    const char *sname = fc_strategy_name(c->strategy);
    if (!sharded && c->backward_prefetch != FC_PREFETCH_NONE)
        return fc_fail(e, "--backward-prefetch needs a sharded strategy (%s gathers nothing)", sname);
    if (!sharded && c->forward_prefetch)
        return fc_fail(e, "--forward-prefetch needs a sharded strategy (%s gathers nothing)", sname);
    if (!sharded && c->limit_all_gathers)
        return fc_fail(e, "--limit-all-gathers needs a sharded strategy (%s gathers nothing)", sname);
    if (c->limit_all_gathers && !c->forward_prefetch && c->backward_prefetch == FC_PREFETCH_NONE)
        return fc_fail(e, "--limit-all-gathers limits prefetched all-gathers: add --forward-prefetch "
                          "or --backward-prefetch pre|post");
    if (c->forward_prefetch < 0 || c->backward_prefetch_depth < 0)
        return fc_fail(e, "a prefetch list's length must be at least 1");
    if (c->forward_prefetch > 1 && c->fsdp_version != 2)
        return fc_fail(e, "--forward-prefetch-units %d: FSDP1's forward_prefetch prefetches one unit; lists of more "
                          "are FSDP2's set_modules_to_forward_prefetch (give --fsdp-version 2)", c->forward_prefetch);
    if (c->backward_prefetch_depth && c->fsdp_version != 2)
        return fc_fail(e, "--backward-prefetch-units is FSDP2's set_modules_to_backward_prefetch: give --fsdp-version 2 "
                          "(FSDP1 has --backward-prefetch pre|post|none)");
    if (c->gradient_divide_factor != 0 && !(c->gradient_divide_factor > 0 && isfinite(c->gradient_divide_factor)))
        return fc_fail(e, "--gradient-divide-factor must be a finite number above 0");
    // FSDP1 has no set_gradient_divide_factor; the factor stays for the DDP
    // (no_shard) and local runs an FSDP2 run is judged against
    if (c->gradient_divide_factor > 0 && c->fsdp_version == 1 && sharded)
        return fc_fail(e, "--gradient-divide-factor is FSDP2's set_gradient_divide_factor: give --fsdp-version 2 "
                          "(FSDP1 takes its factors from the world size)");
    if (c->fsdp_version != 1 && c->fsdp_version != 2)
        return fc_fail(e, "--fsdp-version %d is not 1 (FSDP1) or 2 (FSDP2, fully_shard)", c->fsdp_version);
    if (c->fsdp_version == 2) {
        // FSDP2 has no NO_SHARD (DDP is the replicated baseline) and none of
        // FSDP1's backward prefetch options or limiter: it prefetches one unit
        // ahead in backward by itself and has no rate limiter. In forward it
        // prefetches only by explicit lists: --forward-prefetch is each unit's
        // set_modules_to_forward_prefetch([the next unit])
        if (!sharded)
            return fc_fail(e, "--fsdp-version 2 needs a sharded strategy (FSDP2 has no %s; compare it with "
                              "--fsdp-version 1 --strategy no_shard, DDP)", sname);
        const char *fsdp1_only = c->backward_prefetch != FC_PREFETCH_NONE ? "--backward-prefetch"
                               : c->limit_all_gathers                  ? "--limit-all-gathers"
                                                                       : NULL;
        if (fsdp1_only)
            return fc_fail(e, "%s is an FSDP1 option, refused with --fsdp-version 2 (FSDP2 prefetches the next "
                              "unit in backward by itself and has no all-gather limiter)", fsdp1_only);
    }
    return 0;
}

// A fault needs the layout, model and frozen parameters it acts on.
static int validate_inject(const fc_run_config *c, fc_error *e) {
    if (c->inject != FC_FAULT_NONE && !(fc_fault_versions(c->inject) & (1u << c->fsdp_version)))
        return fc_fail(e, "--inject %s is a fault of FSDP%d's layout, not of this --fsdp-version %d run%s",
                       fc_fault_name(c->inject), c->fsdp_version == 1 ? 2 : 1, c->fsdp_version,
                       c->fsdp_version == 1 ? " (FSDP2 needs a sharded strategy)" : "");
    if (c->inject == FC_FAULT_ROPE_HALF && c->model.kind != FC_MODEL_LLAMA)
        return fc_fail(e, "--inject rope_half needs a llama model (rotary embeddings); model %s has none",
                       c->model.name);
    if (c->inject == FC_FAULT_TIED_UNTIED && !fc_model_tied(&c->model))
        return fc_fail(e, "--inject tied_untied needs a tied LM head (gpt2, or llama with tie_word_embeddings); "
                          "model %s has none", c->model.name);
    if (c->freeze[0] && c->model.lora_r)
        return fc_fail(e, "--freeze with --lora: LoRA freezes every base parameter itself (PEFT's default)");
    if (c->freeze[0]) {
        fc_model m;
        fc_model_build(&m, &c->model);
        int rc = fc_model_freeze(&m, c->freeze, e);
        fc_model_free(&m);
        if (rc) return -1;
    }
    if (c->inject == FC_FAULT_LORA_ALPHA && !c->model.lora_r)
        return fc_fail(e, "--inject lora_alpha needs LoRA adapters: give --lora R:ALPHA:REGEX with R > 1");
    if (c->inject == FC_FAULT_LORA_ALPHA && c->model.lora_r == 1)
        return fc_fail(e, "--inject lora_alpha needs --lora with R > 1 (at r = 1, alpha and alpha / r agree)");
    int frozen_fault = c->inject == FC_FAULT_FROZEN_DECAY || c->inject == FC_FAULT_FROZEN_IN_NORM ||
                       c->inject == FC_FAULT_FROZEN_STEPPED;
    if (frozen_fault && !c->freeze[0] && !c->model.lora_r)
        return fc_fail(e, "--inject %s needs frozen parameters: give --freeze REGEX or --lora", fc_fault_name(c->inject));
    if (c->inject == FC_FAULT_FROZEN_DECAY && !(c->optim.weight_decay > 0))
        return fc_fail(e, "--inject frozen_decay needs a --weight-decay above 0 (there is no decay to misapply)");
    return 0;
}

// FSDP2's integer reshard_after_forward, and the hybrid shard group.
static int validate_reshard(const fc_run_config *c, fc_error *e) {
    const char *sname = fc_strategy_name(c->strategy);
    if (c->reshard_after_forward) {
        if (c->fsdp_version != 2)
            return fc_fail(e, "--reshard-after-forward %d is FSDP2's integer reshard_after_forward: give "
                              "--fsdp-version 2", c->reshard_after_forward);
        if (!fc_strategy_reshards(c->strategy))
            return fc_fail(e, "--reshard-after-forward %d needs a strategy that reshards after forward (full_shard, "
                              "hybrid_shard), not %s", c->reshard_after_forward, sname);
        if (c->reshard_after_forward < 2)
            return fc_fail(e, "--reshard-after-forward %d: R must be at least 2 (1 is reshard_after_forward=False: "
                              "--strategy shard_grad_op)", c->reshard_after_forward);
        if (c->cpu_offload)
            return fc_fail(e, "--reshard-after-forward with --cpu-offload is not modelled yet (the post-forward "
                              "slice stays on the device; give one)");
    }
    if (c->shard_group && !fc_strategy_hybrid(c->strategy))
        return fc_fail(e, "--shard-group applies to hybrid_shard and hybrid_shard_zero2 only");
    return 0;
}

// local is the ground truth: nothing data-parallel applies to it.
static int validate_local(const fc_run_config *c, fc_error *e) {
    if (c->strategy != FC_STRATEGY_LOCAL) return 0;
    if (c->param_dtype != FC_PREC_FP32 || c->reduce_dtype != FC_PREC_FP32)
        return fc_fail(e, "mixed precision needs a data-parallel strategy (compare FSDP with no_shard, P9)");
    if (c->no_sync) return fc_fail(e, "--no-sync needs a data-parallel strategy");
    if (c->cpu_offload) return fc_fail(e, "--cpu-offload needs a data-parallel strategy");
    if (c->act_ckpt != FC_ACT_CKPT_NONE)
        return fc_fail(e, "--activation-checkpointing needs a data-parallel strategy (local is the ground truth "
                          "it is checked against)");
    if (c->divide != FC_DIVIDE_PREPOST) return fc_fail(e, "--divide needs a data-parallel strategy");
    if (c->inject != FC_FAULT_NONE)
        return fc_fail(e, "--inject needs a data-parallel strategy (local is the ground truth)");
    return 0;
}

int fc_run_config_validate(const fc_run_config *c, fc_error *e) {
    if (fc_model_config_validate(&c->model, e) || validate_numbers(c, e) || validate_fsdp_options(c, e) ||
        validate_inject(c, e) || validate_reshard(c, e) || validate_local(c, e))
        return -1;
    return 0;
}

int fc_run_config_validate_world(const fc_run_config *c, int world, fc_error *e) {
    if (c->strategy == FC_STRATEGY_LOCAL && world != 1)
        return fc_fail(e, "--strategy local runs as one process, not %d", world);
    int F = c->shard_group ? c->shard_group : world;
    if (F > world || world % F != 0)
        return fc_fail(e, "--shard-group %d does not divide the world size %d", F, world);
    int R = c->reshard_after_forward;
    if (R && (R >= F || F % R != 0))
        return fc_fail(e, "--reshard-after-forward %d must divide the shard group's %d ranks and be smaller (%d is "
                          "reshard_after_forward=True: leave it out)", R, F, F);
    // Every rank is a data-parallel rank: each takes B/W samples, in K micro-batches.
    if (c->global_batch % world != 0)
        return fc_fail(e, "--global-batch %d is not divisible by the data-parallel size %d",
                       c->global_batch, world);
    if ((c->global_batch / world) % c->grad_accum != 0)
        return fc_fail(e, "per-rank batch %d is not divisible by --grad-accum %d",
                       c->global_batch / world, c->grad_accum);
    return 0;
}
