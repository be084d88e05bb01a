// oracle/cli.c — flag parsing for `fsdpcheck run`.
//
// One table lists every flag of docs/contract.md §7 (flags.h walks it); each flag is
// applied by the group it configures: the run, the optimizer, FSDP, files.
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "threads.h"

enum {
    F_IMPL, F_MODEL, F_STRATEGY, F_FSDP_VERSION, F_STEPS, F_SEED, F_GLOBAL_BATCH, F_SEQ_LEN, F_OPTIMIZER, F_LR,
    F_WEIGHT_DECAY, F_MOMENTUM, F_GRAD_ACCUM, F_CLIP_GRAD_NORM, F_NORM_TYPE, F_INIT, F_FREEZE, F_LORA, F_TRACE,
    F_TRACE_TENSORS, F_QUIET, F_HELP, F_SHARD_GROUP, F_RESHARD_AFTER_FORWARD, F_BACKWARD_PREFETCH, F_FORWARD_PREFETCH,
    F_FORWARD_PREFETCH_UNITS, F_BACKWARD_PREFETCH_UNITS, F_GRADIENT_DIVIDE_FACTOR, F_LIMIT_ALL_GATHERS, F_PARAM_DTYPE,
    F_REDUCE_DTYPE, F_DIVIDE, F_NO_SYNC, F_CPU_OFFLOAD, F_ACTIVATION_CHECKPOINTING, F_GRADIENT_CHECKPOINTING,
    F_COMM_LOG, F_FSDP_CONFIG, F_SAVE, F_SAVE_AT, F_STATE_DICT, F_LOAD, F_INJECT, F_COMM, F_TIMEOUT, F_THREADS,
    F_COUNT
};

#define V FC_FLAG_VALUE
#define S FC_FLAG_SWITCH
static const fc_flag FLAGS[F_COUNT] = {
    [F_IMPL] = {"--impl", V},
    [F_MODEL] = {"--model", V},
    [F_STRATEGY] = {"--strategy", V},
    [F_FSDP_VERSION] = {"--fsdp-version", V},
    [F_STEPS] = {"--steps", V},
    [F_SEED] = {"--seed", V},
    [F_GLOBAL_BATCH] = {"--global-batch", V},
    [F_SEQ_LEN] = {"--seq-len", V},
    [F_OPTIMIZER] = {"--optimizer", V},
    [F_LR] = {"--lr", V},
    [F_WEIGHT_DECAY] = {"--weight-decay", V},
    [F_MOMENTUM] = {"--momentum", V},
    [F_GRAD_ACCUM] = {"--grad-accum", V},
    [F_CLIP_GRAD_NORM] = {"--clip-grad-norm", V},
    [F_NORM_TYPE] = {"--norm-type", V},
    [F_INIT] = {"--init", V},
    [F_FREEZE] = {"--freeze", V},
    [F_LORA] = {"--lora", V},
    [F_TRACE] = {"--trace", V},
    [F_TRACE_TENSORS] = {"--trace-tensors", V},
    [F_QUIET] = {"--quiet", S},
    [F_HELP] = {"--help", S},
    [F_SHARD_GROUP] = {"--shard-group", V},
    [F_RESHARD_AFTER_FORWARD] = {"--reshard-after-forward", V},
    [F_BACKWARD_PREFETCH] = {"--backward-prefetch", V},
    [F_FORWARD_PREFETCH] = {"--forward-prefetch", S},
    [F_FORWARD_PREFETCH_UNITS] = {"--forward-prefetch-units", V},
    [F_BACKWARD_PREFETCH_UNITS] = {"--backward-prefetch-units", V},
    [F_GRADIENT_DIVIDE_FACTOR] = {"--gradient-divide-factor", V},
    [F_LIMIT_ALL_GATHERS] = {"--limit-all-gathers", S},
    [F_PARAM_DTYPE] = {"--param-dtype", V},
    [F_REDUCE_DTYPE] = {"--reduce-dtype", V},
    [F_DIVIDE] = {"--divide", V},
    [F_NO_SYNC] = {"--no-sync", S},
    [F_CPU_OFFLOAD] = {"--cpu-offload", S},
    [F_ACTIVATION_CHECKPOINTING] = {"--activation-checkpointing", V},
    [F_GRADIENT_CHECKPOINTING] = {"--gradient-checkpointing", S},
    [F_COMM_LOG] = {"--comm-log", V},
    [F_FSDP_CONFIG] = {"--fsdp-config", V},
    [F_SAVE] = {"--save", V},
    [F_SAVE_AT] = {"--save-at", V},
    [F_STATE_DICT] = {"--state-dict", V},
    [F_LOAD] = {"--load", V},
    [F_INJECT] = {"--inject", V},
    [F_COMM] = {"--comm", V},
    [F_TIMEOUT] = {"--timeout", V},
    [F_THREADS] = {"--threads", V},
};
#undef V
#undef S

void fc_cli_usage(FILE *f) {
    fputs("usage: fsdpcheck run [flags]\n"
          "  --model mlp-tiny|gpt2-tiny|gpt2-124m|llama-micro|llama-tiny|CONFIG.json   (default mlp-tiny)\n"
          "  --strategy local|no_shard|full_shard|shard_grad_op|hybrid_shard|hybrid_shard_zero2\n"
          "  --fsdp-version 1|2        FSDP1 (FlatParameter, default) or FSDP2 (fully_shard: per-parameter\n"
          "                            rows, one unit ahead in backward, no limiter; divide avg unless fp16;\n"
          "                            --forward-prefetch: each unit's explicit forward prefetch list, the next unit)\n"
          "  --reshard-after-forward R FSDP2's integer reshard_after_forward: keep a 1/R slice after forward,\n"
          "                            all-gather it in backward within groups of R consecutive ranks\n"
          "  --forward-prefetch-units N, --backward-prefetch-units N\n"
          "                            FSDP2's explicit lists: every unit's set_modules_to_forward_prefetch\n"
          "                            (set_modules_to_backward_prefetch) of the next N units of the pass\n"
          "  --gradient-divide-factor F  FSDP2's set_gradient_divide_factor(F) on every unit: divide the\n"
          "                            reduced gradient by F instead of the data-parallel size\n"
          "  --shard-group F (hybrid)  --backward-prefetch pre|post|none  --forward-prefetch\n"
          "  --limit-all-gathers  --param-dtype fp32|bf16|fp16  --reduce-dtype fp32|bf16|fp16\n"
          "  --divide prepost|avg|sum-then-divide  --no-sync  --cpu-offload  --comm-log FILE\n"
          "  --activation-checkpointing none|inside|outside\n"
          "                            recompute every non-root unit's forward in backward, the checkpoint\n"
          "                            wrapper inside the FSDP unit or outside it (FSDP1: a second all-gather)\n"
          "  --gradient-checkpointing  Hugging Face's: --activation-checkpointing inside\n"
          "  --impl reference|cuda|PATH.so  the implementation that runs (default reference)\n"
          "  --comm auto|nccl|mpi      a port's collective backend (the CUDA port: NCCL, or host-staged MPI)\n"
          "  --steps N (3)  --seed S (1234)  --global-batch B (8)  --seq-len T (16, gpt2)\n"
          "  --optimizer adamw|sgd  --lr X (1e-3)  --weight-decay X (0.01)  --momentum X (0.9, sgd)\n"
          "  --grad-accum K (1)  --clip-grad-norm X (off)  --norm-type 1|2|inf (2)\n"
          "  --init FILE.safetensors   start from these weights instead of the seeded init\n"
          "  --lora R:ALPHA:REGEX      LoRA (PEFT) of rank R, scaling ALPHA/R, on llama's decoder-layer linears\n"
          "                            whose module path REGEX matches ('[qv]_proj'); every base parameter frozen\n"
          "  --freeze REGEX            freeze (requires_grad=False) the parameters whose name it matches (POSIX\n"
          "                            extended regex, searched as re.search: 'embed_tokens|wte'; [0-9], not \\d)\n"
          "  --trace DIR               write trace.json, init.safetensors, step-NNNNNN.safetensors\n"
          "  --trace-tensors all|first the tensor sets of every step (all), or of the first only, the later\n"
          "                            steps' loss, norm and batch (what compare's lockstep reads of them)\n"
          "  --save DIR [--save-at K] [--state-dict full|sharded]\n"
          "                            checkpoint after step K of this run (default: the last; full)\n"
          "  --load DIR                resume from a checkpoint: weights, optimizer state, step, data\n"
          "  --fsdp-config FILE        a Hugging Face fsdp_config.json; applied where it stands:\n"
          "                            flags after it override it, flags before it are overridden\n"
          "  --timeout S               abort every rank (exit 3) when no rank made progress for S\n"
          "                            seconds: a hung rank or collective (default 600)\n"
          "  --threads N               OpenMP threads per rank for the reference's layers (default: the\n"
          "                            node's cores / its ranks, at least 1); no result depends on it\n"
          "  --quiet                   no per-step lines\n",
          f);
}

// Each group applies its own flags and answers NOT_MINE for the others.
#define NOT_MINE 1

// a path into a fixed buffer, refused when it does not fit
#define COPY_PATH(dst, v, ...) \
    (snprintf(dst, sizeof dst, "%s", v) >= (int)sizeof dst ? fc_fail(e, __VA_ARGS__) : 0)

// What runs and on what: the implementation, the model, the data, the steps.
static int apply_run(fc_run_args *a, int id, const char *v, fc_error *e) {
    fc_run_config *c = &a->cfg;
    switch (id) {
    case F_IMPL:  // resolved (and refused if it cannot be loaded) by the command, on every rank
        return COPY_PATH(c->impl, v, "--impl: path too long (%zu bytes)", strlen(v));
    case F_COMM:
        if (fc_comm_parse(v, &c->comm)) return fc_fail(e, "--comm: unknown backend '%s' (auto, nccl, mpi)", v);
        return 0;
    case F_MODEL: return fc_model_config_load(v, &c->model, e) ? -1 : 0;
    case F_STEPS: return fc_flag_int(FLAGS[id].name, v, 1, 1000000, &c->steps, e);
    case F_SEED: return fc_flag_u64(FLAGS[id].name, v, &c->seed, e);
    case F_GLOBAL_BATCH: return fc_flag_int(FLAGS[id].name, v, 1, 1 << 20, &c->global_batch, e);
    case F_SEQ_LEN: return fc_flag_int(FLAGS[id].name, v, 1, 1 << 20, &c->seq_len, e);
    case F_GRAD_ACCUM: return fc_flag_int(FLAGS[id].name, v, 1, 1 << 20, &c->grad_accum, e);
    case F_INIT: {
        if (COPY_PATH(c->init_path, v, "--init: path too long")) return -1;
        FILE *f = fopen(v, "rb");
        if (!f) return fc_fail(e, "--init %s: cannot open: %s", v, strerror(errno));
        fclose(f);
        return 0;
    }
    case F_FREEZE:
        if (!*v) return fc_fail(e, "--freeze: give a regex of parameter names");
        return COPY_PATH(c->freeze, v, "--freeze: regex longer than %zu characters", sizeof c->freeze - 1);
    case F_INJECT:
        if (fc_fault_parse(v, &c->inject) || c->inject == FC_FAULT_NONE)
            return fc_fail(e, "--inject: unknown fault '%s' (see docs/contract.md §9)", v);
        return 0;
    case F_QUIET: a->quiet = 1; return 0;
    case F_THREADS: return fc_flag_int(FLAGS[id].name, v, 1, FC_THREADS_MAX, &a->threads, e);
    case F_TIMEOUT:
        if (fc_flag_double(FLAGS[id].name, v, &a->timeout, e)) return -1;
        if (a->timeout < 1 || a->timeout > 604800)
            return fc_fail(e, "--timeout: %s s is outside 1 s .. one week (the watchdog aborts every rank after "
                              "that long without progress)", v);
        return 0;
    }
    return NOT_MINE;
}

// The optimizer and the gradient clipping.
static int apply_optim(fc_run_args *a, int id, const char *v, fc_error *e) {
    fc_run_config *c = &a->cfg;
    double d = 0;
    switch (id) {
    case F_OPTIMIZER:
        if (fc_opt_parse(v, &c->optim.kind)) return fc_fail(e, "--optimizer: unknown optimizer '%s' (adamw, sgd)", v);
        return 0;
    case F_NORM_TYPE:
        if (fc_norm_parse(v, &c->norm_type)) return fc_fail(e, "--norm-type: '%s' is not 1, 2 or inf", v);
        return 0;
    case F_LR: return fc_flag_double(FLAGS[id].name, v, &c->optim.lr, e) ? -1 : 0;
    case F_WEIGHT_DECAY: return fc_flag_double(FLAGS[id].name, v, &c->optim.weight_decay, e) ? -1 : 0;
    case F_MOMENTUM: return fc_flag_double(FLAGS[id].name, v, &c->optim.momentum, e) ? -1 : 0;
    case F_CLIP_GRAD_NORM:
        if (fc_flag_double(FLAGS[id].name, v, &d, e)) return -1;
        if (d == 0) return fc_fail(e, "--clip-grad-norm: max norm must be positive");
        c->clip_grad_norm = (float)d;
        return 0;
    }
    return NOT_MINE;
}

// How FSDP shards, prefetches, casts, reduces and recomputes.
static int apply_fsdp(fc_run_args *a, int id, const char *v, fc_error *e) {
    fc_run_config *c = &a->cfg;
    fc_prec p;
    switch (id) {
    case F_STRATEGY:
        if (fc_strategy_parse(v, &c->strategy))
            return fc_fail(e, "--strategy: unknown strategy '%s' (local, no_shard, full_shard, "
                              "shard_grad_op, hybrid_shard, hybrid_shard_zero2)", v);
        return 0;
    case F_FSDP_VERSION: return fc_flag_int(FLAGS[id].name, v, 1, 2, &c->fsdp_version, e);
    case F_RESHARD_AFTER_FORWARD: return fc_flag_int(FLAGS[id].name, v, 1, 1 << 20, &c->reshard_after_forward, e);
    case F_SHARD_GROUP: return fc_flag_int(FLAGS[id].name, v, 1, 1 << 20, &c->shard_group, e);
    case F_BACKWARD_PREFETCH:
        if (fc_prefetch_parse(v, &c->backward_prefetch))
            return fc_fail(e, "--backward-prefetch: '%s' is not pre, post or none", v);
        return 0;
    case F_FORWARD_PREFETCH: c->forward_prefetch = 1; return 0;
    case F_FORWARD_PREFETCH_UNITS: return fc_flag_int(FLAGS[id].name, v, 1, 1 << 20, &c->forward_prefetch, e);
    case F_BACKWARD_PREFETCH_UNITS:
        return fc_flag_int(FLAGS[id].name, v, 1, 1 << 20, &c->backward_prefetch_depth, e);
    case F_GRADIENT_DIVIDE_FACTOR:
        if (fc_flag_double(FLAGS[id].name, v, &c->gradient_divide_factor, e)) return -1;
        if (!(c->gradient_divide_factor > 0) || !isfinite(c->gradient_divide_factor))
            return fc_fail(e, "--gradient-divide-factor: '%s' is not a finite number above 0", v);
        return 0;
    case F_LIMIT_ALL_GATHERS: c->limit_all_gathers = 1; return 0;
    case F_PARAM_DTYPE:
    case F_REDUCE_DTYPE:
        if (fc_prec_parse(v, &p)) return fc_fail(e, "%s: '%s' is not fp32, bf16 or fp16", FLAGS[id].name, v);
        *(id == F_PARAM_DTYPE ? &c->param_dtype : &c->reduce_dtype) = p;
        return 0;
    case F_DIVIDE:
        if (fc_divide_parse(v, &c->divide)) return fc_fail(e, "--divide: '%s' is not prepost, avg or sum-then-divide", v);
        return 0;
    case F_NO_SYNC: c->no_sync = 1; return 0;
    case F_CPU_OFFLOAD: c->cpu_offload = 1; return 0;
    case F_ACTIVATION_CHECKPOINTING:
        if (fc_act_ckpt_parse(v, &c->act_ckpt))
            return fc_fail(e, "--activation-checkpointing: '%s' is not none, inside or outside", v);
        return 0;
    case F_GRADIENT_CHECKPOINTING:
        // transformers' gradient_checkpointing checkpoints each block's forward
        // (GradientCheckpointingLayer, modeling_layers.py in 5.23: "module hooks
        // (e.g. FSDP2's) stay outside the checkpoint"), and FSDP1's unit wraps
        // the block: the checkpoint sits inside the FSDP unit
        c->act_ckpt = FC_ACT_CKPT_INSIDE;
        return 0;
    }
    return NOT_MINE;
}

// --fsdp-config: applied where it stands, left to right like every flag: a
// flag after it overrides what the file set, one before it is overridden.
static int apply_fsdp_config(fc_run_args *a, const char *v, fc_error *e) {
    fc_run_config *c = &a->cfg;
    if (a->fsdp.path[0]) return fc_fail(e, "--fsdp-config given twice (%s, %s): give one file", a->fsdp.path, v);
    if (fc_fsdp_config_load(v, &a->fsdp, e)) return -1;
    // a file without fsdp_sharding_strategy still describes an FSDP run:
    // FSDP's default, FULL_SHARD, replaces the one-process default
    if (!a->fsdp.has_strategy && c->strategy == FC_STRATEGY_LOCAL) c->strategy = FC_STRATEGY_FULL_SHARD;
    fc_fsdp_config_apply(&a->fsdp, c);
    // fsdp_state_dict_type: the format --save writes (a --state-dict after it overrides)
    if (a->fsdp.state_dict != FC_FSDP_SD_UNSET)
        a->state_dict = a->fsdp.state_dict == FC_FSDP_SD_FULL ? FC_STATE_DICT_FULL : FC_STATE_DICT_SHARDED;
    return 0;
}

// What the run reads and writes: traces, comm logs, checkpoints, an fsdp_config.json.
static int apply_files(fc_run_args *a, int id, const char *v, fc_error *e) {
    switch (id) {
    case F_TRACE: return COPY_PATH(a->trace_dir, v, "--trace: path too long");
    case F_TRACE_TENSORS:
        if (strcmp(v, "all") && strcmp(v, "first")) return fc_fail(e, "--trace-tensors: '%s' is not all or first", v);
        a->trace_tensor_steps = !strcmp(v, "first");
        return 0;
    case F_COMM_LOG: return COPY_PATH(a->comm_log, v, "--comm-log: path too long");
    case F_SAVE: return COPY_PATH(a->save_dir, v, "%s: path too long", FLAGS[id].name);
    case F_LOAD: return COPY_PATH(a->load_dir, v, "%s: path too long", FLAGS[id].name);
    case F_SAVE_AT: return fc_flag_int(FLAGS[id].name, v, 1, 1000000, &a->save_at, e);
    case F_STATE_DICT:
        // FSDP2's sharded format (DCP's) follows from --fsdp-version: in fc_cli_parse_run
        if (fc_state_dict_parse(v, &a->state_dict) || a->state_dict == FC_STATE_DICT_DCP)
            return fc_fail(e, "--state-dict: '%s' is not full or sharded", v);
        a->state_dict_set = 1;
        return 0;
    case F_FSDP_CONFIG: return apply_fsdp_config(a, v, e);
    }
    return NOT_MINE;
}

static int apply(fc_run_args *a, int id, const char *v, fc_error *e) {
    int rc = apply_run(a, id, v, e);
    if (rc == NOT_MINE) rc = apply_optim(a, id, v, e);
    if (rc == NOT_MINE) rc = apply_fsdp(a, id, v, e);
    if (rc == NOT_MINE) rc = apply_files(a, id, v, e);
    return rc == NOT_MINE ? 0 : rc;
}

int fc_cli_parse_world(const char *v, int *W) {
    fc_error ignored;  // each command words its own refusal
    return fc_flag_int("--world", v, 1, FC_CLI_WORLD_MAX, W, &ignored);
}

// The checks after every flag is applied: defaults that follow from others,
// and a flag that would change nothing, which is a mistake worth reporting.
static int finish(fc_run_args *out, const unsigned char *seen, const char *lora, fc_error *e) {
    if (lora && fc_model_config_set_lora(&out->cfg.model, lora, e)) return -1;
    // As torch's MixedPrecision: without a reduce_dtype, gradients are reduced in param_dtype.
    if (!seen[F_REDUCE_DTYPE]) out->cfg.reduce_dtype = out->cfg.param_dtype;
    // FSDP2 reduces with ReduceOp.AVG, except in fp16 (docs/contract.md §5)
    if (!seen[F_DIVIDE]) out->cfg.divide = fc_default_divide(&out->cfg);
    const fc_run_config *c = &out->cfg;
    if (seen[F_MOMENTUM] && c->optim.kind != FC_OPT_SGD)
        return fc_fail(e, "--momentum applies to --optimizer sgd only");
    if (seen[F_SEQ_LEN] && !fc_model_has_tokens(&c->model))
        return fc_fail(e, "--seq-len applies to gpt2 and llama models only (model %s is an mlp)", c->model.name);
    if (seen[F_NORM_TYPE] && c->clip_grad_norm == 0)
        return fc_fail(e, "--norm-type needs --clip-grad-norm");
    // the wrap classes of an fsdp_config must be the units of the model finally chosen
    if (out->fsdp.path[0] && fc_fsdp_config_check_model(&out->fsdp, &c->model, e)) return -1;
    if (out->trace_tensor_steps && !out->trace_dir[0]) return fc_fail(e, "--trace-tensors needs --trace DIR");
    // checkpoints: --save-at and --state-dict belong to --save; one source of starting weights
    if (!out->save_dir[0] && (out->save_at || out->state_dict_set))
        return fc_fail(e, "%s needs --save DIR", out->save_at ? "--save-at" : "--state-dict");
    if (out->save_dir[0] && !out->save_at) out->save_at = c->steps;
    if (out->save_at > c->steps)
        return fc_fail(e, "--save-at %d is after the last step of this run (--steps %d)", out->save_at, c->steps);
    // FSDP2's SHARDED_STATE_DICT is DCP's (torch.distributed.checkpoint with
    // its Hugging Face storage), FSDP1's the flat shards (docs/contract.md §6)
    if (out->state_dict == FC_STATE_DICT_SHARDED) out->state_dict = fc_ckpt_sharded_kind(c);
    if (out->load_dir[0] && c->init_path[0])
        return fc_fail(e, "--init and --load both set the starting weights: give one");
    return fc_run_config_validate(c, e);
}

int fc_cli_parse_run(int argc, char **argv, fc_run_args *out, fc_error *e) {
    static const fc_flag_words words = {"", " (see fsdpcheck run --help)", "", ""};
    memset(out, 0, sizeof *out);
    fc_run_config_defaults(&out->cfg);
    out->timeout = FC_DEFAULT_TIMEOUT;
    unsigned char seen[F_COUNT] = {0};
    const char *lora = NULL;
    fc_flags it = fc_flags_begin(argc, argv, FLAGS, F_COUNT, &words, FC_FLAGS_EQUALS);
    for (int id; (id = fc_flags_try_next(&it, e)) != FC_FLAGS_END;) {
        if (id == FC_FLAGS_ERROR) return -1;
        if (id == FC_FLAGS_ARG) return fc_fail(e, "unexpected argument '%s' (flags start with --; see --help)", it.arg);
        if (id == F_HELP) return 1;
        if (id == F_LORA) {  // the adapters of the model finally chosen: applied after --model
            lora = it.value;
            continue;
        }
        if (apply(out, id, it.value ? it.value : "", e)) return -1;
        seen[id] = 1;
        // an fsdp_config's mixed_precision_policy sets the reduce dtype too
        if (id == F_FSDP_CONFIG && out->fsdp.has_reduce_dtype) seen[F_REDUCE_DTYPE] = 1;
    }
    return finish(out, seen, lora, e);
}
