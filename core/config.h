// core/config.h — model and run configuration, shared by every implementation.
//
// A run is fully described by an fc_run_config: every implementation, every
// rank and every trace derives its behaviour from it alone (and trace.json
// records it), so a divergence can always be reproduced from the config.
#ifndef FC_CONFIG_H
#define FC_CONFIG_H

#include <stdint.h>

#include "check.h"
#include "dtype.h"
#include "hd.h"

FC_BEGIN_DECLS

struct cJSON;

#define FC_MLP_MAX_LAYERS 16

typedef enum { FC_MODEL_MLP, FC_MODEL_GPT2, FC_MODEL_LLAMA } fc_model_kind;

typedef struct {
    fc_model_kind kind;
    char name[256];  // preset name or the config.json path it came from
    // mlp: n_layers Linear layers, dims[0] inputs ... dims[n_layers] classes
    int n_layers;
    int dims[FC_MLP_MAX_LAYERS + 1];
    // gpt2: Hugging Face GPT2Config names. llama uses the same fields for its
    // LlamaConfig counterparts: n_embd = hidden_size, n_layer =
    // num_hidden_layers, n_head = num_attention_heads, n_positions =
    // max_position_embeddings, layer_norm_epsilon = rms_norm_eps.
    int vocab_size, n_positions, n_embd, n_layer, n_head;
    float layer_norm_epsilon;
    // llama only: num_key_value_heads (dividing n_head), head_dim (even, for
    // RoPE's halves), intermediate_size of the SwiGLU MLP, tie_word_embeddings,
    // rope_theta, and initializer_range (the std of every Linear and Embedding
    // weight at init, LlamaPreTrainedModel._init_weights).
    int n_kv_head, head_dim, intermediate_size, tie_word_embeddings;
    double rope_theta;
    float initializer_range;
    // LoRA (PEFT, docs/contract.md §2; --lora R:ALPHA:REGEX), llama only: lora_r > 0
    // adds adapters A [r, in] and B [out, r] to every decoder-layer linear
    // (q/k/v/o_proj, gate/up/down_proj) whose module path lora_target matches
    // (POSIX extended, searched as re.search), scaled by lora_alpha / lora_r,
    // and freezes every other parameter of the model.
    int lora_r;
    double lora_alpha;
    char lora_target[128];
} fc_model_config;

// "mlp", "gpt2", "llama".
const char *fc_model_kind_name(fc_model_kind k);
// The class of the modules that are FSDP units, as auto_wrap's
// transformer_layer_cls names it: "Linear", "GPT2Block", "LlamaDecoderLayer".
const char *fc_model_unit_class(fc_model_kind k);
// One line naming the model and its sizes, for messages: "gpt2-tiny: gpt2
// vocab 97, positions 32, n_embd 16, n_layer 2, n_head 4", "mlp-tiny: mlp 13-17-11-7".
void fc_model_config_describe(const fc_model_config *c, char *buf, size_t cap);
// A language model (gpt2, llama): token ids in, a sequence of T, an LM head.
static inline int fc_model_has_tokens(const fc_model_config *c) { return c->kind != FC_MODEL_MLP; }
// Whether the LM head is the token embedding (gpt2 always; llama with tie_word_embeddings).
static inline int fc_model_tied(const fc_model_config *c) {
    return c->kind == FC_MODEL_GPT2 || (c->kind == FC_MODEL_LLAMA && c->tie_word_embeddings);
}

// A preset ("mlp-tiny", "gpt2-tiny", "gpt2-124m", "llama-micro", "llama-tiny")
// or a path to a config.json: Hugging Face GPT-2 ("model_type": "gpt2"), Llama
// ("model_type": "llama") or fsdpcheck's own MLP ("model_type":
// "fsdpcheck-mlp", "dims": [in, hidden..., classes]).
int fc_model_config_load(const char *name_or_path, fc_model_config *out, fc_error *e);
// Parses a config.json already in memory (path is only used in messages).
int fc_model_config_parse(const char *json, const char *path, fc_model_config *out, fc_error *e);
// Whether two configs describe the same model (kind and every size; not the name).
int fc_model_config_equal(const fc_model_config *a, const fc_model_config *b);
// llama's decoder-layer linears, module paths under model.layers.N, in
// registration order (core/model.c); LoRA may adapt any of them.
#define FC_LLAMA_N_LINEAR 7
extern const char *const FC_LLAMA_LINEAR[FC_LLAMA_N_LINEAR];
// Parses --lora R:ALPHA:REGEX into c (llama only; the regex must match a
// decoder-layer linear). Returns -1 with e set on bad input.
int fc_model_config_set_lora(fc_model_config *c, const char *spec, fc_error *e);
// Checks the sizes make a model (positive, heads divide n_embd, ...).
int fc_model_config_validate(const fc_model_config *c, fc_error *e);
// The config as Hugging Face config.json fields (gpt2, llama) or fsdpcheck-mlp fields.
struct cJSON *fc_model_config_to_json(const fc_model_config *c);

typedef enum {
    FC_STRATEGY_LOCAL,
    FC_STRATEGY_NO_SHARD,
    FC_STRATEGY_FULL_SHARD,
    FC_STRATEGY_SHARD_GRAD_OP,
    FC_STRATEGY_HYBRID_SHARD,
    FC_STRATEGY_HYBRID_SHARD_ZERO2,
    FC_STRATEGY_COUNT
} fc_strategy;

typedef enum { FC_PREFETCH_NONE, FC_PREFETCH_PRE, FC_PREFETCH_POST } fc_prefetch;
typedef enum { FC_OPT_ADAMW, FC_OPT_SGD } fc_opt_kind;
// Gradient divide policy (docs/contract.md §4): PyTorch FSDP1's pre/post factors, one
// divide by W after the sum, or the sum divided at the end.
typedef enum { FC_DIVIDE_PREPOST, FC_DIVIDE_AVG, FC_DIVIDE_SUM_THEN_DIVIDE } fc_divide;
// Norm type of clip_grad_norm: 1, 2, or infinity.
typedef enum { FC_NORM_1, FC_NORM_2, FC_NORM_INF } fc_norm_type;
// Activation checkpointing (docs/contract.md §5) of every unit but the root: none, or
// the checkpoint wrapper inside the FSDP unit (FSDP1's
// apply_activation_checkpointing, Accelerate's fsdp_activation_checkpointing,
// XLA's xla_fsdp_grad_ckpt, Hugging Face's gradient_checkpointing, which
// checkpoints the block's forward) or outside it (checkpoint(FSDP(layer))). Outside costs FSDP1 a second all-gather of
// a unit it freed after forward; FSDP2's pre-forward skips the unshard while
// its unit is in backward, so there both placements gather once.
typedef enum { FC_ACT_CKPT_NONE, FC_ACT_CKPT_INSIDE, FC_ACT_CKPT_OUTSIDE } fc_act_ckpt;

// Hyperparameters are doubles, as they are Python floats in torch.optim: the
// coefficients are computed in double and rounded to fp32 where torch does.
typedef struct {
    fc_opt_kind kind;
    double lr;
    double weight_decay;
    double beta1, beta2, eps;   // AdamW
    double momentum, dampening; // SGD
    int nesterov;
} fc_optim_config;

// The fault catalogue (docs/contract.md §9): a run configured with one of these carries
// exactly that known bug class, so the oracle can prove it catches each one.
typedef enum {
    FC_FAULT_NONE,
    FC_FAULT_NO_DIVIDE,            // gradients summed, not averaged
    FC_FAULT_DIVIDE_TWICE,         // pre/post divide factors applied inconsistently
    FC_FAULT_SHARD_OFFSET,         // one unit's shard read at the neighbour rank's offset
    FC_FAULT_PADDING_LEAK,         // padding elements enter gradients, norms or the optimizer
    FC_FAULT_STALE_GATHER,         // compute uses a unit buffer before its all-gather completed
    FC_FAULT_SKIP_ROOT_REDUCE,     // the root unit's gradients are never reduced
    FC_FAULT_HSDP_NO_REPLICATE,    // hybrid sharding skips the all-reduce across replicas
    FC_FAULT_NO_SYNC_OVERWRITE,    // accumulation overwrites instead of adding
    FC_FAULT_CLIP_LOCAL_NORM,      // clipping uses the local shard's norm
    FC_FAULT_CLIP_DOUBLE_COUNT,    // unsharded gradients counted W times in the norm
    FC_FAULT_CKPT_DROP_OPTIM,      // the optimizer state is not restored on load
    FC_FAULT_CKPT_SWAP,            // two same-shaped tensors swapped in the state dict
    FC_FAULT_TIED_UNTIED,          // the tied embedding gets only one of its two gradient paths
    FC_FAULT_BF16_TRUNCATE,        // bf16 rounding by truncation instead of nearest-even
    FC_FAULT_REDUCE_DTYPE_IGNORED, // gradients reduced in param_dtype when reduce_dtype asks for fp32
    FC_FAULT_ADAM_STEP_RESET,      // the optimizer step count restarts after a checkpoint load
    FC_FAULT_DATA_OVERLAP,         // a rank reads its neighbour's samples
    FC_FAULT_AVG_TAIL,             // an average leaves the last elements of a shard unscaled
    FC_FAULT_CLIP_EPS_PER_RANK,    // the norm's eps added once per rank of the norm group (pytorch#149768)
    FC_FAULT_CLIP_HSDP_SHARD_NORM, // hybrid: the norm over the shard group's gradient, before the replicas' all-reduce
    FC_FAULT_RECOMPUTE_DTYPE,      // activation checkpointing recomputes with fp32 weights under mixed precision
    FC_FAULT_FSDP2_AVG_TWICE,      // FSDP2: ReduceOp.AVG's gradient divided by the world again
    FC_FAULT_FSDP2_EVEN_ROWS,      // FSDP2: uneven rows split evenly (remainder on the last rank), not by torch.chunk
    FC_FAULT_FSDP2_PADDING_NORM,   // FSDP2: unzeroed per-parameter padding reduced and counted in the norm
    FC_FAULT_FSDP2_POST_FORWARD_GROUP,  // FSDP2: an integer reshard_after_forward gathers over strided ranks
    FC_FAULT_DCP_SAVED_OFFSETS,    // FSDP2: a DCP checkpoint's saved_offsets one row early
    FC_FAULT_ROPE_HALF,            // llama: RoPE's rotate_half with the halves swapped (cat(x2, -x1)): q, k rotated by -angle
    FC_FAULT_FROZEN_DECAY,         // weight decay applied to frozen parameters
    FC_FAULT_FROZEN_IN_NORM,       // frozen parameters' gradients counted in the clip norm
    FC_FAULT_FROZEN_STEPPED,       // a frozen parameter's stale gradient reduced and stepped
    FC_FAULT_LORA_ALPHA,           // LoRA scaled by alpha instead of alpha / r
    FC_FAULT_COUNT
} fc_fault;

// The CUDA port's collective backend (--comm): NCCL when every rank has its
// own GPU, host-staged MPI when ranks share one; auto picks.
typedef enum { FC_COMM_AUTO, FC_COMM_NCCL, FC_COMM_MPI } fc_comm;

typedef struct {
    fc_model_config model;
    char impl[256];            // "reference", "cuda" or a path to a .so
    fc_comm comm;              // --comm: a port's backend choice (the reference has none)
    fc_strategy strategy;
    int fsdp_version;          // 1: FSDP1 (FlatParameter), 2: FSDP2 (fully_shard, per-parameter rows)
    int shard_group;           // F; 0 = the whole world
    // FSDP2's integer reshard_after_forward R (2 <= R < F, R dividing F): after
    // forward a unit keeps a 1/R slice and backward all-gathers it within
    // groups of R consecutive ranks. 0: true or false, as the strategy says.
    int reshard_after_forward;
    fc_prefetch backward_prefetch;
    // Forward prefetch: 0 none; 1 FSDP1's forward_prefetch, or FSDP2's
    // set_modules_to_forward_prefetch([the next unit]) on every unit; N > 1
    // (FSDP2 only) each unit's list of the next N units of the forward order.
    int forward_prefetch;
    // FSDP2's explicit backward lists: 0 the implicit prefetch (one unit
    // ahead); N >= 1 every unit's set_modules_to_backward_prefetch of the next
    // N units of the backward order (N = 1 is the implicit schedule).
    int backward_prefetch_depth;
    int limit_all_gathers;
    fc_prec param_dtype, reduce_dtype;
    fc_divide divide;
    // FSDP2's set_gradient_divide_factor(F) on every unit: the reduction
    // divides by F where it would divide by the data-parallel size (the
    // divide mode stays: avg's per-rank divide, force-sum's divide after the
    // sum, fp16's pre/post factors taken from F). The gradient is then the sum
    // of the ranks' mean gradients over F. 0: not set (the data-parallel
    // size). For local, one rank whose mean is the whole batch's: the mean / F.
    double gradient_divide_factor;
    int grad_accum;            // K micro-batches per step
    int no_sync;
    float clip_grad_norm;      // 0 = off
    fc_norm_type norm_type;
    int cpu_offload;
    fc_act_ckpt act_ckpt;      // --activation-checkpointing
    fc_optim_config optim;
    int steps;
    int global_batch;          // B: samples per step over all data-parallel ranks
    int seq_len;               // T (gpt2 only)
    uint64_t seed;
    char init_path[1024];      // --init FILE.safetensors, "" = counter-based init
    // --freeze REGEX: parameters whose name it matches (POSIX extended regex,
    // searched anywhere in the name, as Python's re.search) are frozen
    // (requires_grad=False, docs/contract.md §2): no gradient, no optimizer state, no
    // weight decay, no part in the clip norm. "" = every parameter trains.
    char freeze[256];
    fc_fault inject;           // --inject NAME: a known bug, FC_FAULT_NONE for a correct run
} fc_run_config;

// The defaults every run starts from.
void fc_run_config_defaults(fc_run_config *c);
// The gradient divide a run gets when none is given: FSDP1's pre/post
// factors, or FSDP2's ReduceOp.AVG (pre/post again when it reduces in fp16).
fc_divide fc_default_divide(const fc_run_config *c);
// Checks the whole config against itself (not against a world size).
int fc_run_config_validate(const fc_run_config *c, fc_error *e);
// Checks it against a data-parallel world: B divisible, shard group fits.
int fc_run_config_validate_world(const fc_run_config *c, int world, fc_error *e);
// The config as a JSON object (trace.json, checkpoints) and back.
struct cJSON *fc_run_config_to_json(const fc_run_config *c);
int fc_run_config_from_json(const struct cJSON *j, fc_run_config *c, fc_error *e);
// cJSON keeps every duplicate key of an object and a lookup silently takes
// the first, so a file with two "step"s or two "n_embd"s would mean whatever
// the reader picked: the JSON readers refuse them. Returns a key that appears
// twice in one object of obj (at any depth), or NULL.
const char *fc_json_duplicate_key(const struct cJSON *obj);

// Names <-> enums; parse returns -1 for an unknown name.
const char *fc_comm_name(fc_comm c);
int fc_comm_parse(const char *s, fc_comm *out);
const char *fc_strategy_name(fc_strategy s);
int fc_strategy_parse(const char *s, fc_strategy *out);
const char *fc_prefetch_name(fc_prefetch p);
int fc_prefetch_parse(const char *s, fc_prefetch *out);
const char *fc_opt_name(fc_opt_kind k);
int fc_opt_parse(const char *s, fc_opt_kind *out);
const char *fc_divide_name(fc_divide d);
int fc_divide_parse(const char *s, fc_divide *out);
const char *fc_norm_name(fc_norm_type n);
int fc_norm_parse(const char *s, fc_norm_type *out);
const char *fc_act_ckpt_name(fc_act_ckpt a);
int fc_act_ckpt_parse(const char *s, fc_act_ckpt *out);
const char *fc_fault_name(fc_fault f);
int fc_fault_parse(const char *s, fc_fault *out);
// The property (docs/contract.md §8, 1..15) expected to catch fault f; 0 for none.
int fc_fault_property(fc_fault f);
// The same in an implementation that computes its activations in 16 bits
// (any but the built-in reference), where its own rounding can hide a fault
// the reference's fp32 activations show (reduce_dtype_ignored: P10, not P9).
int fc_fault_property_act16(fc_fault f);
// The FSDP versions fault f applies to, as bits 1 << fsdp_version (the
// encoding of impl.h's FC_IMPL_FSDP): FSDP1's flat-layout faults, FSDP2's
// per-parameter ones, or both. --inject refuses a run of another version.
unsigned fc_fault_versions(fc_fault f);

FC_END_DECLS

#endif
