// core/model.h — the parameter registry: names, shapes, FSDP units, stages.
//
// This is the one description of a model that every implementation, the
// checkpoint code and the oracle share. Layout decisions (docs/contract.md §2, §5):
//  - Parameters are registered in PyTorch module order and keep Hugging Face
//    names (gpt2) or nn.Sequential-style names (mlp).
//  - Each parameter belongs to one FSDP unit. A unit's FlatParameter is its
//    parameters concatenated in registration order.
//  - The "full flat buffer" of a model is the units' flat parameters, unpadded,
//    in unit order. So a gathered unit is exactly a contiguous region of the
//    full buffer, and param.offset indexes that buffer.
//  - A forward pass is a list of stages, each computed with one unit's
//    parameters gathered; backward runs them in reverse. gpt2's root unit
//    (wte, wpe, ln_f) serves two stages: the embedding first and the head last.
#ifndef FC_MODEL_H
#define FC_MODEL_H

#include <regex.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "hd.h"

FC_BEGIN_DECLS

// Called with a piece [p, p + n) of a model-layout array once its reader is done with it: a
// view of a mapped trace drops the piece's pages (oracle/tracefile.c). arg is the caller's.
typedef void (*fc_release_fn)(const void *arg, const float *p, size_t n);

typedef enum { FC_INIT_ZEROS, FC_INIT_ONES, FC_INIT_NORMAL, FC_INIT_UNIFORM } fc_init_kind;

typedef struct {
    char name[96];
    int ndim;            // 1 or 2
    int64_t shape[2];
    size_t numel;
    int unit;            // FSDP unit index
    size_t offset;       // element offset in the full flat buffer
    size_t unit_offset;  // element offset inside its unit's FlatParameter
    fc_init_kind init;
    float init_scale;    // std (normal) or bound (uniform)
    int frozen;          // requires_grad=False (--freeze): no gradient, optimizer state, decay or norm
    int lora;            // a LoRA adapter's lora_A or lora_B (fc_model_config.lora_r)
} fc_param;

typedef struct {
    char name[64];       // module path: "" (root), "layers.0", "transformer.h.3"
    int first_param;     // the unit's parameters, in FlatParameter order, are
    int n_params;        //   unit_params[first_param .. first_param+n_params)
    size_t offset;       // element offset of the unit in the full flat buffer
    size_t numel;        // unpadded FlatParameter size
} fc_unit;

typedef enum {
    FC_STAGE_LINEAR,     // mlp layer l (GELU after it unless last; loss after the last)
    FC_STAGE_EMBED,      // gpt2 wte[ids] + wpe[pos]
    FC_STAGE_BLOCK,      // gpt2 transformer block l
    FC_STAGE_HEAD        // gpt2 ln_f, tied LM head, loss
} fc_stage_kind;

typedef struct {
    fc_stage_kind kind;
    int layer;           // mlp layer / gpt2 block index
    int unit;            // the unit whose parameters it needs
} fc_stage;

typedef struct {
    fc_model_config cfg;
    int n_params;
    fc_param *params;    // registration order
    int *unit_params;    // [n_params] parameter indices grouped by unit
    int n_units;
    fc_unit *units;
    int n_stages;
    fc_stage *stages;
    size_t numel;        // total parameters (the tied wte counted once)
    int root_unit;       // the unit of the root module's own parameters, -1 if none (mlp)
    int n_frozen;        // parameters with fc_param.frozen set
    // LoRA: lora[i] is the index of base weight i's lora_A (its lora_B is the
    // next one), -1 for a weight without an adapter; lora_scale is alpha / r
    // (alpha in the fault catalogue's engine: lora_alpha).
    int *lora;           // [n_params]
    double lora_scale;
    // llama: the direction RoPE rotates q and k: +1, as Hugging Face's
    // rotate_half does. -1 only in the fault catalogue's engine (rope_half).
    int rope_sign;
} fc_model;

// Builds the registry of a validated config. Never fails on a valid config.
void fc_model_build(fc_model *m, const fc_model_config *cfg);
void fc_model_free(fc_model *m);

// The registry of a validated run config: fc_model_build, then the
// parameters --freeze names frozen. Never fails on a config that
// fc_run_config_validate accepted.
void fc_model_build_run(fc_model *m, const fc_run_config *c);

// Marks frozen every parameter whose name `regex` matches (POSIX extended
// regex, searched anywhere in the name, as Python's re.search does;
// "[0-9]" where Python writes "\d"). Refuses (-1, e set, nothing marked) a
// regex that does not compile, one that matches no parameter or every one
// (torch.optim refuses an empty parameter list).
int fc_model_freeze(fc_model *m, const char *regex, fc_error *e);
// regcomp(re, rx, REG_EXTENDED | REG_NOSUB) for a user's pattern (`what`:
// "--freeze 'x'", "LoRA target 'x'"), refusing first what would make glibc's
// regcomp build an enormous tree: a quantifier right after another (t++...,
// which Python's re, the adapter's, also refuses), and repeat counts {m,n}
// whose bounds multiply past FC_REGEX_REPEAT_MAX (found by fuzz.cli: 't+'
// followed by 100 '+' took over 2 GB). 0, or -1 with e set and nothing to free.
#define FC_REGEX_REPEAT_MAX 1024
int fc_regex_compile(regex_t *re, const char *what, const char *rx, fc_error *e);

// The run of unit u's natural order that starts at element `off` and stays
// in one parameter, at most n elements: returns its length and sets *frozen
// to that parameter's. Loops over a shard's pieces step through these runs.
size_t fc_model_run_at(const fc_model *m, int u, size_t off, size_t n, int *frozen);
// Whether unit u has a trainable parameter. One without (LoRA's root: every
// base parameter frozen) has no gradient at all: FSDP reduces nothing for it
// (FSDP1's FlatParameter has requires_grad=False, FSDP2 has no gradient to
// reduce) and keeps neither a gradient nor optimizer state.
int fc_unit_trains(const fc_model *m, int u);
// Trainable (not frozen) elements of unit u's natural-order range [off, off + n).
size_t fc_model_trainable_in(const fc_model *m, int u, size_t off, size_t n);

// Index of a parameter by exact name, -1 if none.
int fc_model_find(const fc_model *m, const char *name);
// The parameter index of a named role, for the model math (e.g. block 3's
// "attn.c_attn.weight"). Aborts on a bad name: that is a programming error.
int fc_model_param_index(const fc_model *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

FC_END_DECLS

#endif
