// oracle/cli.c — flag parsing for `fsdpcheck run`.
//
// One table lists every flag of DESIGN §7. A flag whose capability is not in
// this build is listed with the reason and refused with exit 2: a flag that is
// accepted always changes what runs.
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "threads.h"

typedef enum { ARG_NONE, ARG_INT, ARG_U64, ARG_DOUBLE, ARG_STR } arg_kind;

typedef struct {
    const char *name;
    arg_kind kind;
    const char *unavailable;  // non-NULL: refused, with this reason
} flag_spec;

static const flag_spec FLAGS[] = {
    {"--impl", ARG_STR, NULL},
    {"--model", ARG_STR, NULL},
    {"--strategy", ARG_STR, NULL},
    {"--fsdp-version", ARG_INT, NULL},
    {"--steps", ARG_INT, NULL},
    {"--seed", ARG_U64, NULL},
    {"--global-batch", ARG_INT, NULL},
    {"--seq-len", ARG_INT, NULL},
    {"--optimizer", ARG_STR, NULL},
    {"--lr", ARG_DOUBLE, NULL},
    {"--weight-decay", ARG_DOUBLE, NULL},
    {"--momentum", ARG_DOUBLE, NULL},
    {"--grad-accum", ARG_INT, NULL},
    {"--clip-grad-norm", ARG_DOUBLE, NULL},
    {"--norm-type", ARG_STR, NULL},
    {"--init", ARG_STR, NULL},
    {"--freeze", ARG_STR, NULL},
    {"--lora", ARG_STR, NULL},
    {"--trace", ARG_STR, NULL},
    {"--trace-tensors", ARG_STR, NULL},
    {"--quiet", ARG_NONE, NULL},
    {"--help", ARG_NONE, NULL},
    {"--shard-group", ARG_INT, NULL},
    {"--reshard-after-forward", ARG_INT, NULL},
    {"--backward-prefetch", ARG_STR, NULL},
    {"--forward-prefetch", ARG_NONE, NULL},
    {"--forward-prefetch-units", ARG_INT, NULL},
    {"--backward-prefetch-units", ARG_INT, NULL},
    {"--gradient-divide-factor", ARG_DOUBLE, NULL},
    {"--limit-all-gathers", ARG_NONE, NULL},
    {"--param-dtype", ARG_STR, NULL},
    {"--reduce-dtype", ARG_STR, NULL},
    {"--divide", ARG_STR, NULL},
    {"--no-sync", ARG_NONE, NULL},
    {"--cpu-offload", ARG_NONE, NULL},
    {"--activation-checkpointing", ARG_STR, NULL},
    {"--gradient-checkpointing", ARG_NONE, NULL},
    {"--comm-log", ARG_STR, NULL},
    {"--fsdp-config", ARG_STR, NULL},
    {"--save", ARG_STR, NULL},
    {"--save-at", ARG_INT, NULL},
    {"--state-dict", ARG_STR, NULL},
    {"--load", ARG_STR, NULL},
    {"--inject", ARG_STR, NULL},
    {"--comm", ARG_STR, NULL},
    {"--timeout", ARG_DOUBLE, NULL},
    {"--threads", ARG_STR, NULL},
};

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

static const flag_spec *find_flag(const char *name) {
    for (size_t i = 0; i < sizeof FLAGS / sizeof FLAGS[0]; i++)
        if (strcmp(FLAGS[i].name, name) == 0) return &FLAGS[i];
    return NULL;
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out, fc_error *e) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return fc_fail(e, "%s: '%s' is not an integer in %d..%d", flag, v, lo, hi);
    *out = (int)x;
    return 0;
}

static int parse_u64(const char *flag, const char *v, uint64_t *out, fc_error *e) {
    char *end;
    errno = 0;
    if (*v == '-' || *v == '+') return fc_fail(e, "%s: '%s' is not a non-negative integer", flag, v);
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end) return fc_fail(e, "%s: '%s' is not a non-negative integer", flag, v);
    *out = x;
    return 0;
}

static int parse_double(const char *flag, const char *v, double *out, fc_error *e) {
    char *end;
    // plain decimal only: strtod would also take hex floats, "inf" and "nan"
    if (strpbrk(v, "xXiInN")) return fc_fail(e, "%s: '%s' is not a finite decimal number", flag, v);
    errno = 0;
    double x = strtod(v, &end);
    if (errno == ERANGE) return fc_fail(e, "%s: '%s' is out of range", flag, v);
    if (errno || end == v || *end || !isfinite(x) || x < 0)
        return fc_fail(e, "%s: '%s' is not a finite non-negative number", flag, v);
    *out = x;
    return 0;
}

static int apply(fc_run_args *a, const char *flag, const char *v, fc_error *e) {
    fc_run_config *c = &a->cfg;
    double d = 0;
    if (!strcmp(flag, "--impl")) {
        // resolved (and refused if it cannot be loaded) by the command, on every rank
        if (snprintf(c->impl, sizeof c->impl, "%s", v) >= (int)sizeof c->impl)
            return fc_fail(e, "--impl: path too long (%zu bytes)", strlen(v));
    } else if (!strcmp(flag, "--comm")) {
        if (fc_comm_parse(v, &c->comm)) return fc_fail(e, "--comm: unknown backend '%s' (auto, nccl, mpi)", v);
    } else if (!strcmp(flag, "--model")) {
        if (fc_model_config_load(v, &c->model, e)) return -1;
    } else if (!strcmp(flag, "--strategy")) {
        if (fc_strategy_parse(v, &c->strategy))
            return fc_fail(e, "--strategy: unknown strategy '%s' (local, no_shard, full_shard, "
                              "shard_grad_op, hybrid_shard, hybrid_shard_zero2)", v);
    } else if (!strcmp(flag, "--steps")) {
        return parse_int(flag, v, 1, 1000000, &c->steps, e);
    } else if (!strcmp(flag, "--seed")) {
        return parse_u64(flag, v, &c->seed, e);
    } else if (!strcmp(flag, "--global-batch")) {
        return parse_int(flag, v, 1, 1 << 20, &c->global_batch, e);
    } else if (!strcmp(flag, "--seq-len")) {
        return parse_int(flag, v, 1, 1 << 20, &c->seq_len, e);
    } else if (!strcmp(flag, "--grad-accum")) {
        return parse_int(flag, v, 1, 1 << 20, &c->grad_accum, e);
    } else if (!strcmp(flag, "--optimizer")) {
        if (fc_opt_parse(v, &c->optim.kind))
            return fc_fail(e, "--optimizer: unknown optimizer '%s' (adamw, sgd)", v);
    } else if (!strcmp(flag, "--norm-type")) {
        if (fc_norm_parse(v, &c->norm_type))
            return fc_fail(e, "--norm-type: '%s' is not 1, 2 or inf", v);
    } else if (!strcmp(flag, "--lr")) {
        if (parse_double(flag, v, &c->optim.lr, e)) return -1;
    } else if (!strcmp(flag, "--weight-decay")) {
        if (parse_double(flag, v, &c->optim.weight_decay, e)) return -1;
    } else if (!strcmp(flag, "--momentum")) {
        if (parse_double(flag, v, &c->optim.momentum, e)) return -1;
    } else if (!strcmp(flag, "--timeout")) {
        if (parse_double(flag, v, &a->timeout, e)) return -1;
        if (a->timeout < 1 || a->timeout > 604800)
            return fc_fail(e, "--timeout: %s s is outside 1 s .. one week (the watchdog aborts every rank after "
                              "that long without progress)", v);
    } else if (!strcmp(flag, "--clip-grad-norm")) {
        if (parse_double(flag, v, &d, e)) return -1;
        if (d == 0) return fc_fail(e, "--clip-grad-norm: max norm must be positive");
        c->clip_grad_norm = (float)d;
    } else if (!strcmp(flag, "--init")) {
        if (snprintf(c->init_path, sizeof c->init_path, "%s", v) >= (int)sizeof c->init_path)
            return fc_fail(e, "--init: path too long");
        FILE *f = fopen(v, "rb");
        if (!f) return fc_fail(e, "--init %s: cannot open: %s", v, strerror(errno));
        fclose(f);
    } else if (!strcmp(flag, "--freeze")) {
        if (!*v) return fc_fail(e, "--freeze: give a regex of parameter names");
        if (snprintf(c->freeze, sizeof c->freeze, "%s", v) >= (int)sizeof c->freeze)
            return fc_fail(e, "--freeze: regex longer than %zu characters", sizeof c->freeze - 1);
    } else if (!strcmp(flag, "--trace")) {
        if (snprintf(a->trace_dir, sizeof a->trace_dir, "%s", v) >= (int)sizeof a->trace_dir)
            return fc_fail(e, "--trace: path too long");
    } else if (!strcmp(flag, "--trace-tensors")) {
        if (strcmp(v, "all") && strcmp(v, "first"))
            return fc_fail(e, "--trace-tensors: '%s' is not all or first", v);
        a->trace_tensor_steps = !strcmp(v, "first");
    } else if (!strcmp(flag, "--quiet")) {
        a->quiet = 1;
    } else if (!strcmp(flag, "--threads")) {
        return fc_threads_parse(v, &a->threads, e);
    } else if (!strcmp(flag, "--inject")) {
        if (fc_fault_parse(v, &c->inject) || c->inject == FC_FAULT_NONE)
            return fc_fail(e, "--inject: unknown fault '%s' (see DESIGN.md section 9)", v);
    } else if (!strcmp(flag, "--fsdp-version")) {
        return parse_int(flag, v, 1, 2, &c->fsdp_version, e);
    } else if (!strcmp(flag, "--reshard-after-forward")) {
        return parse_int(flag, v, 1, 1 << 20, &c->reshard_after_forward, e);
    } else if (!strcmp(flag, "--shard-group")) {
        return parse_int(flag, v, 1, 1 << 20, &c->shard_group, e);
    } else if (!strcmp(flag, "--backward-prefetch")) {
        if (fc_prefetch_parse(v, &c->backward_prefetch))
            return fc_fail(e, "--backward-prefetch: '%s' is not pre, post or none", v);
    } else if (!strcmp(flag, "--forward-prefetch")) {
        c->forward_prefetch = 1;
    } else if (!strcmp(flag, "--forward-prefetch-units")) {
        return parse_int(flag, v, 1, 1 << 20, &c->forward_prefetch, e);
    } else if (!strcmp(flag, "--backward-prefetch-units")) {
        return parse_int(flag, v, 1, 1 << 20, &c->backward_prefetch_depth, e);
    } else if (!strcmp(flag, "--gradient-divide-factor")) {
        if (parse_double(flag, v, &c->gradient_divide_factor, e)) return -1;
        if (!(c->gradient_divide_factor > 0) || !isfinite(c->gradient_divide_factor))
            return fc_fail(e, "--gradient-divide-factor: '%s' is not a finite number above 0", v);
    } else if (!strcmp(flag, "--limit-all-gathers")) {
        c->limit_all_gathers = 1;
    } else if (!strcmp(flag, "--param-dtype") || !strcmp(flag, "--reduce-dtype")) {
        fc_prec p;
        if (fc_prec_parse(v, &p)) return fc_fail(e, "%s: '%s' is not fp32, bf16 or fp16", flag, v);
        *(flag[2] == 'p' ? &c->param_dtype : &c->reduce_dtype) = p;
    } else if (!strcmp(flag, "--divide")) {
        if (fc_divide_parse(v, &c->divide))
            return fc_fail(e, "--divide: '%s' is not prepost, avg or sum-then-divide", v);
    } else if (!strcmp(flag, "--no-sync")) {
        c->no_sync = 1;
    } else if (!strcmp(flag, "--cpu-offload")) {
        c->cpu_offload = 1;
    } else if (!strcmp(flag, "--activation-checkpointing")) {
        if (fc_act_ckpt_parse(v, &c->act_ckpt))
            return fc_fail(e, "--activation-checkpointing: '%s' is not none, inside or outside", v);
    } else if (!strcmp(flag, "--gradient-checkpointing")) {
        // transformers' gradient_checkpointing checkpoints each block's forward
        // (GradientCheckpointingLayer, modeling_layers.py in 5.23: "module hooks
        // (e.g. FSDP2's) stay outside the checkpoint"), and FSDP1's unit wraps
        // the block: the checkpoint sits inside the FSDP unit
        c->act_ckpt = FC_ACT_CKPT_INSIDE;
    } else if (!strcmp(flag, "--comm-log")) {
        if (snprintf(a->comm_log, sizeof a->comm_log, "%s", v) >= (int)sizeof a->comm_log)
            return fc_fail(e, "--comm-log: path too long");
    } else if (!strcmp(flag, "--save") || !strcmp(flag, "--load")) {
        char *dir = flag[2] == 's' ? a->save_dir : a->load_dir;
        if (snprintf(dir, sizeof a->save_dir, "%s", v) >= (int)sizeof a->save_dir)
            return fc_fail(e, "%s: path too long", flag);
    } else if (!strcmp(flag, "--save-at")) {
        return parse_int(flag, v, 1, 1000000, &a->save_at, e);
    } else if (!strcmp(flag, "--state-dict")) {
        // FSDP2's sharded format (DCP's) follows from --fsdp-version: below
        if (fc_state_dict_parse(v, &a->state_dict) || a->state_dict == FC_STATE_DICT_DCP)
            return fc_fail(e, "--state-dict: '%s' is not full or sharded", v);
        a->state_dict_set = 1;
    } else if (!strcmp(flag, "--fsdp-config")) {
        // Applied where it stands, left to right like every flag: a flag after
        // it overrides what the file set, one before it is overridden.
        if (a->fsdp.path[0])
            return fc_fail(e, "--fsdp-config given twice (%s, %s): give one file", a->fsdp.path, v);
        if (fc_fsdp_config_load(v, &a->fsdp, e)) return -1;
        // a file without fsdp_sharding_strategy still describes an FSDP run:
        // FSDP's default, FULL_SHARD, replaces the one-process default
        if (!a->fsdp.has_strategy && c->strategy == FC_STRATEGY_LOCAL) c->strategy = FC_STRATEGY_FULL_SHARD;
        fc_fsdp_config_apply(&a->fsdp, c);
        // fsdp_state_dict_type: the format --save writes (a --state-dict after it overrides)
        if (a->fsdp.state_dict != FC_FSDP_SD_UNSET)
            a->state_dict = a->fsdp.state_dict == FC_FSDP_SD_FULL ? FC_STATE_DICT_FULL : FC_STATE_DICT_SHARDED;
    }
    return 0;
}

int fc_cli_parse_world(const char *v, int *W) {
    char *end;
    errno = 0;
    long w = strtol(v, &end, 10);
    if (errno || *end || end == v || w < 1 || w > FC_CLI_WORLD_MAX) return -1;
    *W = (int)w;
    return 0;
}

int fc_cli_parse_run(int argc, char **argv, fc_run_args *out, fc_error *e) {
    memset(out, 0, sizeof *out);
    fc_run_config_defaults(&out->cfg);
    out->timeout = FC_DEFAULT_TIMEOUT;
    int seen_momentum = 0, seen_seq_len = 0, seen_norm = 0, seen_reduce = 0, seen_divide = 0;
    const char *lora = NULL;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq = strchr(arg, '=');
        char name[64];
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (strncmp(arg, "--", 2) != 0 || len >= sizeof name)
            return fc_fail(e, "unexpected argument '%s' (flags start with --; see --help)", arg);
        memcpy(name, arg, len);
        name[len] = '\0';
        const flag_spec *f = find_flag(name);
        if (!f) return fc_fail(e, "unknown flag %s (see fsdpcheck run --help)", name);
        if (!strcmp(name, "--help")) {
            if (eq) return fc_fail(e, "--help takes no value");
            return 1;
        }
        if (f->unavailable) return fc_fail(e, "%s %s", name, f->unavailable);
        const char *value = NULL;
        if (f->kind == ARG_NONE) {
            if (eq) return fc_fail(e, "%s takes no value", name);
        } else if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) return fc_fail(e, "%s needs a value", name);
            value = argv[++i];
        }
        if (value && !*value) return fc_fail(e, "%s: empty value", name);
        if (!strcmp(name, "--lora")) {  // the adapters of the model finally chosen: applied after --model
            lora = value;
            continue;
        }
        if (apply(out, name, value ? value : "", e)) return -1;
        seen_momentum |= !strcmp(name, "--momentum");
        seen_seq_len |= !strcmp(name, "--seq-len");
        seen_norm |= !strcmp(name, "--norm-type");
        seen_reduce |= !strcmp(name, "--reduce-dtype");
        seen_divide |= !strcmp(name, "--divide");
        seen_reduce |= !strcmp(name, "--fsdp-config") && out->fsdp.has_reduce_dtype;  // mixed_precision_policy
    }
    if (lora && fc_model_config_set_lora(&out->cfg.model, lora, e)) return -1;
    // As torch's MixedPrecision: without a reduce_dtype, gradients are reduced in param_dtype.
    if (!seen_reduce) out->cfg.reduce_dtype = out->cfg.param_dtype;
    // FSDP2 reduces with ReduceOp.AVG, except in fp16 (DESIGN §5)
    if (!seen_divide) out->cfg.divide = fc_default_divide(&out->cfg);
    // A flag that would change nothing is a mistake worth reporting.
    const fc_run_config *c = &out->cfg;
    if (seen_momentum && c->optim.kind != FC_OPT_SGD)
        return fc_fail(e, "--momentum applies to --optimizer sgd only");
    if (seen_seq_len && !fc_model_has_tokens(&c->model))
        return fc_fail(e, "--seq-len applies to gpt2 and llama models only (model %s is an mlp)", c->model.name);
    if (seen_norm && c->clip_grad_norm == 0)
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
    // its Hugging Face storage), FSDP1's the flat shards (DESIGN §6)
    if (out->state_dict == FC_STATE_DICT_SHARDED) out->state_dict = fc_ckpt_sharded_kind(c);
    if (out->load_dir[0] && c->init_path[0])
        return fc_fail(e, "--init and --load both set the starting weights: give one");
    return fc_run_config_validate(c, e);
}
