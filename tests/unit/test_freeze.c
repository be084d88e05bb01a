// Frozen parameters (--freeze, docs/contract.md §2): which parameters a regex freezes,
// what it refuses, the runs and shard counts the engines and the P11
// formulas step through, and the one-process trainer's semantics: a frozen
// parameter has no gradient, no optimizer state, no decay and no part in the
// clip norm, while the others train exactly as without it.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "clip.h"
#include "config.h"
#include "layout.h"
#include "local.h"
#include "model.h"

#include <cJSON.h>

static fc_model_config preset(const char *name) {
    fc_model_config c;
    fc_error e;
    cr_assert_eq(fc_model_config_load(name, &c, &e), 0, "%s", e.msg);
    return c;
}

static fc_run_config run_cfg(const char *model, const char *freeze) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    c.model = preset(model);
    c.global_batch = 4;
    c.seq_len = 8;
    c.seed = 7;
    snprintf(c.freeze, sizeof c.freeze, "%s", freeze);
    return c;
}

Test(freeze, marks_the_matched_names_anywhere_in_the_name) {
    fc_run_config c = run_cfg("gpt2-tiny", "wte|ln_1");
    fc_error e;
    cr_assert_eq(fc_run_config_validate(&c, &e), 0, "%s", e.msg);
    fc_model m;
    fc_model_build_run(&m, &c);
    int n = 0;
    for (int i = 0; i < m.n_params; i++) {
        const char *s = m.params[i].name;
        int want = strstr(s, "wte") != NULL || strstr(s, "ln_1") != NULL;
        cr_expect_eq(m.params[i].frozen, want, "%s", s);
        n += want;
    }
    cr_expect_eq(m.n_frozen, n);
    cr_expect_eq(n, 1 + 2 * m.cfg.n_layer, "wte, and ln_1's weight and bias in every block");
    fc_model_free(&m);
    // anchors and classes are POSIX extended regex, as in Python's re.search
    c = run_cfg("llama-tiny", "^model\\.layers\\.[0-9]+\\.self_attn\\.[qv]_proj\\.weight$");
    cr_assert_eq(fc_run_config_validate(&c, &e), 0, "%s", e.msg);
    fc_model_build_run(&m, &c);
    cr_expect_eq(m.n_frozen, 2 * m.cfg.n_layer);
    cr_expect(m.params[fc_model_find(&m, "model.layers.1.self_attn.v_proj.weight")].frozen);
    cr_expect(!m.params[fc_model_find(&m, "model.layers.1.self_attn.k_proj.weight")].frozen);
    fc_model_free(&m);
    // without --freeze nothing is frozen
    c = run_cfg("gpt2-tiny", "");
    fc_model_build_run(&m, &c);
    cr_expect_eq(m.n_frozen, 0);
    fc_model_free(&m);
}

Test(freeze, refuses_what_torch_or_fsdpcheck_cannot_train) {
    const struct {
        const char *model, *re, *says;
    } bad[] = {
        {"gpt2-tiny", "(", "is not a POSIX extended regex"},
        {"gpt2-tiny", "q_proj", "matches no parameter of model gpt2-tiny"},
        {"gpt2-tiny", ".", "freezes every parameter of model"},
        // what would make glibc's regcomp build an enormous tree (fuzz.cli: 't' and 100 '+' took 2.8 GB)
        {"gpt2-tiny", "wte++++++++++++++++++++++++++++++++++++++++++++++++++", "a quantifier right after another"},
        {"gpt2-tiny", "wte*?", "a quantifier right after another"},
        {"gpt2-tiny", "wte{2}{3}", "a quantifier right after another"},
        {"gpt2-tiny", "w{1025}", "multiply past 1024"},
        {"gpt2-tiny", "((w{8}){8}){17}", "multiply past 1024"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fc_run_config c = run_cfg(bad[i].model, bad[i].re);
        fc_error e;
        cr_expect_neq(fc_run_config_validate(&c, &e), 0, "%s", bad[i].re);
        cr_expect(strstr(e.msg, bad[i].says) != NULL, "'%s': %s", bad[i].re, e.msg);
    }
    // an escaped or bracketed quantifier is an atom, and small counts pass
    const char *good[] = {"h\\.0\\.+attn", "[+*]|wte", "(h\\.[0-9]){1}\\.ln_1", "^transformer\\.h\\.0\\.attn\\.c_[a-z]{4}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fc_run_config g = run_cfg("gpt2-tiny", good[i]);
        fc_error ge;
        cr_expect_eq(fc_run_config_validate(&g, &ge), 0, "'%s': %s", good[i], ge.msg);
    }
    // the LoRA target goes through the same compile
    fc_model_config lm = preset("llama-tiny");
    fc_error le;
    cr_expect_neq(fc_model_config_set_lora(&lm, "4:8:q_proj++", &le), 0);
    cr_expect(strstr(le.msg, "a quantifier right after another") != NULL, "%s", le.msg);
    // the frozen-parameter faults need frozen parameters (and frozen_decay a decay)
    fc_run_config c = run_cfg("gpt2-tiny", "");
    c.strategy = FC_STRATEGY_FULL_SHARD;
    c.inject = FC_FAULT_FROZEN_STEPPED;
    fc_error e;
    cr_expect_neq(fc_run_config_validate(&c, &e), 0);
    snprintf(c.freeze, sizeof c.freeze, "wte");
    cr_expect_eq(fc_run_config_validate(&c, &e), 0, "%s", e.msg);
    c.inject = FC_FAULT_FROZEN_DECAY;
    c.optim.weight_decay = 0;
    cr_expect_neq(fc_run_config_validate(&c, &e), 0);
    cr_expect(strstr(e.msg, "--weight-decay") != NULL, "%s", e.msg);
}

Test(freeze, survives_the_run_config_json_round_trip) {
    fc_run_config c = run_cfg("llama-micro", "embed_tokens");
    struct cJSON *j = fc_run_config_to_json(&c);
    fc_run_config back;
    fc_error e;
    cr_assert_eq(fc_run_config_from_json(j, &back, &e), 0, "%s", e.msg);
    cr_expect_str_eq(back.freeze, "embed_tokens");
    cJSON_Delete(j);
}

// Brute force over every element of every unit: the runs, the trainable
// counts, and what each rank stores of frozen parameters in both layouts.
Test(freeze, runs_and_frozen_store_match_element_by_element) {
    // the last two freeze whole units: gpt2's root, mlp's layers.1
    const char *models[][2] = {{"gpt2-tiny", "wte|ln_"},
                               {"llama-tiny", "norm|k_proj"},
                               {"mlp-tiny", "bias"},
                               {"gpt2-tiny", "wte|wpe|ln_f|h[.]0[.]ln_1"},
                               {"mlp-tiny", "layers[.]1|0[.]bias"}};
    for (size_t mi = 0; mi < 5; mi++) {
        fc_run_config c = run_cfg(models[mi][0], models[mi][1]);
        fc_model m;
        fc_model_build_run(&m, &c);
        for (int u = 0; u < m.n_units; u++) {
            size_t N = m.units[u].numel;
            unsigned char *fz = calloc(N, 1);  // [N] frozen, element by element
            for (int k = 0; k < m.units[u].n_params; k++) {
                const fc_param *p = &m.params[m.unit_params[m.units[u].first_param + k]];
                memset(fz + p->unit_offset, p->frozen, p->numel);
            }
            for (size_t off = 0, r; off < N; off += r) {  // the runs tile the unit, one parameter each
                int f;
                r = fc_model_run_at(&m, u, off, N - off, &f);
                cr_assert(r > 0 && off + r <= N);
                for (size_t i = off; i < off + r; i++) cr_assert_eq(fz[i], f, "unit %d element %zu", u, i);
                int ends_a_param = off + r == N;  // maximal: it stops only where a parameter ends
                for (int k = 0; k < m.units[u].n_params; k++)
                    ends_a_param |= m.params[m.unit_params[m.units[u].first_param + k]].unit_offset == off + r;
                cr_assert(ends_a_param, "unit %d: the run at %zu stops at %zu, inside a parameter", u, off, off + r);
                cr_assert_eq(fc_model_run_at(&m, u, off, 1, &f), 1, "a run is cut at n");
            }
            for (int G = 1; G <= 7; G++) {
                fc_run_config cg = c;
                cg.strategy = G == 1 ? FC_STRATEGY_NO_SHARD : FC_STRATEGY_FULL_SHARD;
                for (int rank = 0; rank < G; rank++) {
                    fc_groups g = fc_groups_of(&cg, G, rank);
                    for (int L = 0; L < FC_LAYOUT_COUNT; L++) {
                        const fc_layout_ops *lay = fc_layout_of((fc_layout_kind)L);
                        size_t want = 0;
                        if (!g.sharded) {
                            for (size_t i = 0; i < N; i++) want += fz[i];
                        } else if (lay->wire_is_natural) {
                            size_t first, count;
                            fc_flat_chunk(N, g.G, g.idx, &first, &count);
                            for (size_t i = first; i < first + count; i++) want += fz[i];
                            cr_expect_eq(fc_model_trainable_in(&m, u, first, count), count - want);
                            if (!fc_unit_trains(&m, u)) want = fc_chunk_size(N, g.G);  // a frozen FlatParameter
                        } else {  // FSDP2: a frozen parameter's padded rows
                            for (int k = 0; k < m.units[u].n_params; k++) {
                                const fc_param *p = &m.params[m.unit_params[m.units[u].first_param + k]];
                                size_t d0 = (size_t)p->shape[0];
                                if (p->frozen) want += (d0 + (size_t)G - 1) / (size_t)G * (p->numel / d0);
                            }
                        }
                        cr_expect_eq(fc_unit_frozen_store(lay, &m, u, &g), want, "%s unit %d G=%d rank %d layout %s",
                                     models[mi][0], u, G, rank, lay->name);
                        if (!fc_unit_trains(&m, u)) continue;
                        // where: in store order, inside the store, each a frozen parameter's,
                        // every frozen real element of the chunk in one, adding up to the count
                        fc_unit_layout l = fc_unit_layout_in(lay, &m, u, &g);
                        fc_piece sl[64], pc[64];
                        int ns = fc_unit_frozen_slots(lay, &m, u, &g, sl), np = 0;
                        size_t sum = 0, end = 0;
                        for (int k = 0; k < ns; k++) {
                            cr_expect(sl[k].chunk_off >= end && sl[k].chunk_off + sl[k].count <= l.store,
                                      "%s unit %d G=%d rank %d %s: slot %d [%zu, +%zu) of a store of %zu", models[mi][0],
                                      u, G, rank, lay->name, k, sl[k].chunk_off, sl[k].count, l.store);
                            cr_expect(fz[sl[k].unit_off], "slot %d is a trainable parameter's", k);
                            end = sl[k].chunk_off + sl[k].count;
                            sum += sl[k].count;
                        }
                        cr_expect_eq(sum, want, "%s unit %d G=%d rank %d %s: slots of %zu elements, want %zu",
                                     models[mi][0], u, G, rank, lay->name, sum, want);
                        if (g.sharded) np = lay->pieces(&m, u, g.G, g.idx, pc);
                        else pc[np++] = (fc_piece){0, 0, N};
                        for (int q = 0; q < np; q++)
                            for (size_t i = 0; i < pc[q].count; i++) {
                                if (!fz[pc[q].unit_off + i]) continue;
                                size_t at = pc[q].chunk_off + i;
                                int in = 0;
                                for (int k = 0; k < ns; k++) in |= at >= sl[k].chunk_off && at < sl[k].chunk_off + sl[k].count;
                                cr_expect(in, "%s unit %d G=%d rank %d %s: frozen element at %zu in no slot",
                                          models[mi][0], u, G, rank, lay->name, at);
                            }
                    }
                }
            }
            free(fz);
        }
        if (mi >= 3) cr_expect(!fc_unit_trains(&m, mi == 3 ? 0 : 1), "%s", models[mi][1]);
        fc_model_free(&m);
    }
}

// The one-process trainer: three AdamW steps with decay and clipping. Frozen
// parameters keep their bits, their gradient and optimizer state are zero;
// the clip norm is the trainable gradient's; every trainable parameter moves.
Test(freeze, the_local_trainer_never_touches_a_frozen_parameter) {
    fc_run_config c = run_cfg("gpt2-tiny", "wte|ln_1|c_fc\\.bias");
    c.clip_grad_norm = 0.05f;
    fc_local L;
    fc_error e;
    cr_assert_eq(fc_local_create(&L, &c, &e), 0, "%s", e.msg);
    size_t n = L.model.numel;
    float *start = malloc(n * sizeof(float));
    memcpy(start, L.params, n * sizeof(float));
    for (int s = 0; s < 3; s++) {
        fc_local_step(&L);
        cr_assert_eq(L.grad_norm, fc_grad_norm(L.grads, n, c.norm_type), "the norm is of what is kept");
    }
    int trained_moved = 0, trained = 0;
    for (int i = 0; i < L.model.n_params; i++) {
        const fc_param *p = &L.model.params[i];
        const float *a = start + p->offset, *b = L.params + p->offset;
        if (p->frozen) {
            cr_expect_eq(memcmp(a, b, p->numel * sizeof(float)), 0, "%s moved", p->name);
            for (size_t k = 0; k < p->numel; k++) {
                cr_expect_eq(L.grads[p->offset + k], 0.0f, "%s has a gradient", p->name);
                cr_expect_eq(L.state[0][p->offset + k], 0.0f, "%s has exp_avg", p->name);
                cr_expect_eq(L.state[1][p->offset + k], 0.0f, "%s has exp_avg_sq", p->name);
            }
        } else {
            trained++;
            trained_moved += memcmp(a, b, p->numel * sizeof(float)) != 0;
        }
    }
    cr_expect_eq(trained_moved, trained, "every trainable parameter moved");
    // without the freeze, the same run's frozen gradients are not zero: the
    // zeros above are the freeze's, not the model's
    fc_run_config c2 = c;
    c2.freeze[0] = '\0';
    fc_local L2;
    cr_assert_eq(fc_local_create(&L2, &c2, &e), 0, "%s", e.msg);
    fc_local_step(&L2);
    const fc_param *wte = &L2.model.params[fc_model_find(&L2.model, "transformer.wte.weight")];
    double s = 0;
    for (size_t k = 0; k < wte->numel; k++) s += fabs(L2.grads[wte->offset + k]);
    cr_expect_gt(s, 0);
    fc_local_free(&L2);
    fc_local_free(&L);
    free(start);
}

// LoRA (--lora R:ALPHA:REGEX, docs/contract.md §2): PEFT's names, shapes and order,
// every base parameter frozen, the init (lora_B zero, so the adapted model
// starts as the base model, bit for bit), and the config's round trip.
Test(lora, registry_is_pefts_and_freezes_the_base) {
    fc_model_config c = preset("llama-tiny");
    fc_error e;
    cr_assert_eq(fc_model_config_set_lora(&c, "4:8:[qv]_proj", &e), 0, "%s", e.msg);
    fc_model m, base;
    fc_model_build(&m, &c);
    fc_model_config bc = preset("llama-tiny");
    fc_model_build(&base, &bc);
    cr_expect_eq(m.n_params, base.n_params + 4 * c.n_layer, "two adapters of two tensors per layer");
    cr_expect_eq(m.lora_scale, 2.0);
    int adapters = 0;
    for (int i = 0; i < m.n_params; i++) {
        const fc_param *p = &m.params[i];
        cr_expect_eq(p->frozen, !p->lora, "%s", p->name);
        if (m.lora[i] >= 0) {  // a base weight with an adapter: A then B right after it
            const fc_param *A = &m.params[m.lora[i]], *B = &m.params[m.lora[i] + 1];
            char want[160];
            snprintf(want, sizeof want, "%.*s.lora_A.default.weight", (int)strlen(p->name) - 7, p->name);
            cr_expect_str_eq(A->name, want);
            cr_expect_eq(m.lora[i], i + 1);
            cr_expect(A->shape[0] == 4 && A->shape[1] == p->shape[1] && B->shape[0] == p->shape[0] && B->shape[1] == 4,
                      "%s: A [%lld, %lld], B [%lld, %lld]", p->name, (long long)A->shape[0], (long long)A->shape[1],
                      (long long)B->shape[0], (long long)B->shape[1]);
            cr_expect(A->init == FC_INIT_UNIFORM && fabsf(A->init_scale - 1.0f / sqrtf((float)p->shape[1])) < 1e-7f);
            cr_expect_eq(B->init, FC_INIT_ZEROS);
            cr_expect_eq(A->unit, p->unit);
            adapters++;
        }
    }
    cr_expect_eq(adapters, 2 * c.n_layer);
    cr_expect(!fc_unit_trains(&m, 0), "the root (embed, norm, head) trains nothing");
    // the base parameters' names and init are the base model's
    for (int i = 0; i < base.n_params; i++) {
        int j = fc_model_find(&m, base.params[i].name);
        cr_assert_geq(j, 0, "%s", base.params[i].name);
        cr_expect_eq(m.params[j].init, base.params[i].init);
    }
    fc_model_free(&m);
    fc_model_free(&base);
    // the config keeps it through JSON
    struct cJSON *j = fc_model_config_to_json(&c);
    char *txt = cJSON_PrintUnformatted(j);
    fc_model_config back;
    cr_assert_eq(fc_model_config_parse(txt, "lora.json", &back, &e), 0, "%s", e.msg);
    cr_expect(fc_model_config_equal(&c, &back));
    cr_expect(!fc_model_config_equal(&c, &bc), "a LoRA model is not its base model");
    free(txt);
    cJSON_Delete(j);
}

Test(lora, refuses_what_peft_would_not_build) {
    const struct {
        const char *model, *spec, *says;
    } bad[] = {
        {"gpt2-tiny", "4:8:c_attn", "applies to llama"},
        {"llama-tiny", "0:8:q_proj", "outside 1..4096"},
        {"llama-tiny", "4:0:q_proj", "above 0"},
        {"llama-tiny", "4:8:lm_head", "matches no decoder-layer linear"},
        {"llama-tiny", "4:8:(", "not a POSIX extended regex"},
        {"llama-tiny", "4:8", "expected R:ALPHA:REGEX"},
        {"llama-tiny", "four:8:q_proj", "expected R:ALPHA:REGEX"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fc_model_config c = preset(bad[i].model);
        fc_error e;
        cr_expect_neq(fc_model_config_set_lora(&c, bad[i].spec, &e), 0, "%s", bad[i].spec);
        cr_expect(strstr(e.msg, bad[i].says) != NULL, "'%s': %s", bad[i].spec, e.msg);
        cr_expect_eq(c.lora_r, 0, "a refused spec leaves the config alone");
    }
    fc_run_config c = run_cfg("llama-tiny", "embed_tokens");
    fc_error e;
    cr_assert_eq(fc_model_config_set_lora(&c.model, "2:4:q_proj", &e), 0, "%s", e.msg);
    cr_expect_neq(fc_run_config_validate(&c, &e), 0, "--freeze with --lora");
    c.freeze[0] = '\0';
    c.strategy = FC_STRATEGY_FULL_SHARD;
    c.inject = FC_FAULT_LORA_ALPHA;
    cr_expect_eq(fc_run_config_validate(&c, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_model_config_set_lora(&c.model, "1:4:q_proj", &e), 0, "%s", e.msg);
    cr_expect_neq(fc_run_config_validate(&c, &e), 0, "lora_alpha at r = 1 changes nothing");
}

// Step 0 of the adapted model is the base model's (lora_B = 0: the adapter
// adds exact zeros), and three steps later only the adapters have moved.
Test(lora, starts_as_the_base_model_and_trains_only_the_adapters) {
    fc_run_config c = run_cfg("llama-tiny", ""), b = c;
    fc_error e;
    cr_assert_eq(fc_model_config_set_lora(&c.model, "2:4:proj", &e), 0, "%s", e.msg);
    fc_local L, Lb;
    cr_assert_eq(fc_local_create(&L, &c, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_local_create(&Lb, &b, &e), 0, "%s", e.msg);
    float *start = malloc(L.model.numel * sizeof(float));
    memcpy(start, L.params, L.model.numel * sizeof(float));
    fc_local_step(&L);
    fc_local_step(&Lb);
    cr_expect_eq(memcmp(&L.loss, &Lb.loss, sizeof L.loss), 0, "step 0 loss %.9g vs the base model's %.9g", L.loss,
                 Lb.loss);
    fc_local_step(&L);
    fc_local_step(&L);
    int moved = 0;
    for (int i = 0; i < L.model.n_params; i++) {
        const fc_param *p = &L.model.params[i];
        int same = memcmp(start + p->offset, L.params + p->offset, p->numel * sizeof(float)) == 0;
        if (p->lora) moved += !same;
        else cr_expect(same, "%s (frozen) moved", p->name);
    }
    cr_expect_eq(moved, 4 * 7 * L.model.cfg.n_layer / 2, "every adapter tensor moved (%d)", moved);
    fc_local_free(&L);
    fc_local_free(&Lb);
    free(start);
}
