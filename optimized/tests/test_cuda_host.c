// optimized/tests/test_cuda_host.c — unit tests (Criterion, label unit) of the
// CUDA port's host-side logic, which runs without a device: the collective
// backend choice, the tagged allocator's book and its cross-checks, the
// row-major -> column-major matmul plan (checked by running the planned
// column-major product on the host), the embedding backward's buckets, the
// staged backend's canonical sums, the refusals and the memory estimate, and
// the activation layout.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "acts.h"
#include "alloc_book.h"
#include "comm_choice.h"
#include "cuda_config.h"
#include "enc_buckets.h"
#include "mm_plan.h"
#include "staged.h"

// ---------------------------------------------------------------------------
// backend choice

Test(comm_choice, automatic) {
    fc_comm_kind k;
    char why[256];
    fc_error e;
    cr_assert_eq(fc_comm_choose(FC_COMM_AUTO, 0, 4, 4, &k, why, sizeof why, &e), 0);
    cr_assert_eq(k, FC_COMM_NCCL);
    cr_assert(strstr(why, "own GPU"), "%s", why);
    cr_assert_eq(fc_comm_choose(FC_COMM_AUTO, 1, 4, 1, &k, why, sizeof why, &e), 0);
    cr_assert_eq(k, FC_COMM_MPI);
    cr_assert(strstr(why, "4 rank(s) on 1 device(s)"), "%s", why);
}

Test(comm_choice, forced) {
    fc_comm_kind k;
    char why[256];
    fc_error e;
    cr_assert_eq(fc_comm_choose(FC_COMM_MPI, 0, 2, 2, &k, why, sizeof why, &e), 0);
    cr_assert_eq(k, FC_COMM_MPI);
    cr_assert_eq(fc_comm_choose(FC_COMM_MPI, 1, 2, 1, &k, why, sizeof why, &e), 0);
    cr_assert_eq(k, FC_COMM_MPI);
    cr_assert_eq(fc_comm_choose(FC_COMM_NCCL, 0, 2, 2, &k, why, sizeof why, &e), 0);
    cr_assert_eq(k, FC_COMM_NCCL);
    cr_assert(strstr(why, "forced"), "%s", why);
}

Test(comm_choice, refusals) {
    fc_comm_kind k;
    char why[256];
    fc_error e;
    cr_assert_eq(fc_comm_choose(FC_COMM_NCCL, 1, 3, 1, &k, why, sizeof why, &e), -1);
    cr_assert(strstr(e.msg, "NCCL refuses two ranks on one device"), "%s", e.msg);
    cr_assert(strstr(e.msg, "--comm mpi"), "%s", e.msg);
    cr_assert_str_eq(fc_comm_name(FC_COMM_NCCL), "nccl");
    cr_assert_str_eq(fc_comm_name(FC_COMM_MPI), "mpi");
}

Test(comm_choice, devices) {
    cr_assert_eq(fc_device_for_rank(0, 1), 0);
    cr_assert_eq(fc_device_for_rank(3, 1), 0);
    cr_assert_eq(fc_device_for_rank(3, 2), 1);
    cr_assert_eq(fc_device_for_rank(5, 8), 5);
    cr_assert_eq(fc_device_for_rank(0, 0), -1);
    char ids[4][FC_BUS_ID_LEN] = {"0000:17:00.0", "0000:65:00.0", "0000:17:00.0", "0000:ca:00.0"};
    cr_assert_eq(fc_count_distinct_ids(&ids[0][0], 4), 3);
    cr_assert_eq(fc_count_distinct_ids(&ids[0][0], 2), 2);
    cr_assert_eq(fc_count_distinct_ids(&ids[0][0], 0), 0);
    char one[3][FC_BUS_ID_LEN] = {"0000:17:00.0", "0000:17:00.0", "0000:17:00.0"};
    cr_assert_eq(fc_count_distinct_ids(&one[0][0], 3), 1);
}

// ---------------------------------------------------------------------------
// the tagged allocator's book

Test(alloc_book, accounting) {
    fc_book b;
    fc_book_init(&b);
    fc_error e;
    char mem[3][64];
    cr_assert_eq(fc_book_add(&b, mem[0], 40, FC_LOC_DEVICE, FC_MEM_PARAM_SHARD, &e), 0);
    cr_assert_eq(fc_book_add(&b, mem[1], 64, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, &e), 0);
    cr_assert_eq(fc_book_add(&b, mem[2], 16, FC_LOC_HOST, FC_MEM_COMM_BUFFERS, &e), 0);
    cr_assert_eq(fc_book_bytes(&b, FC_LOC_DEVICE), 104);
    cr_assert_eq(fc_book_bytes(&b, FC_LOC_HOST), 16);
    cr_assert_eq(b.live[FC_LOC_DEVICE], 2);
    fc_book_entry ent;
    cr_assert_eq(fc_book_remove(&b, mem[1], &ent, &e), 0);
    cr_assert_eq(ent.bytes, 64);
    cr_assert_eq(ent.cat, FC_MEM_GATHERED_PARAMS);
    cr_assert_eq(b.stats.cur[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS], 0);
    cr_assert_eq(b.stats.peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS], 64);
    cr_assert_eq(b.stats.peak_total[FC_LOC_DEVICE], 104);
    cr_assert_eq(fc_book_add(&b, mem[1], 8, FC_LOC_DEVICE, FC_MEM_GATHERED_PARAMS, &e), 0);
    cr_assert_eq(b.stats.peak[FC_LOC_DEVICE][FC_MEM_GATHERED_PARAMS], 64);
    fc_book_free(&b);
}

Test(alloc_book, misuse) {
    fc_book b;
    fc_book_init(&b);
    fc_error e;
    char mem[64];
    cr_assert_eq(fc_book_add(&b, NULL, 4, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, &e), -1);
    cr_assert_eq(fc_book_add(&b, mem, 4, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, &e), 0);
    cr_assert_eq(fc_book_add(&b, mem, 4, FC_LOC_DEVICE, FC_MEM_ACTIVATIONS, &e), -1);
    cr_assert(strstr(e.msg, "already live"), "%s", e.msg);
    cr_assert_eq(fc_book_remove(&b, mem + 1, NULL, &e), -1);
    cr_assert(strstr(e.msg, "not a live allocation"), "%s", e.msg);
    cr_assert_eq(fc_book_remove(&b, mem, NULL, &e), 0);
    cr_assert_eq(fc_book_remove(&b, mem, NULL, &e), -1);  // a double free
    fc_book_free(&b);
}

Test(alloc_book, find) {
    fc_book b;
    fc_book_init(&b);
    fc_error e;
    char mem[128];
    cr_assert_eq(fc_book_add(&b, mem + 16, 32, FC_LOC_DEVICE, FC_MEM_GRAD_SHARD, &e), 0);
    cr_assert_not_null(fc_book_find(&b, mem + 16, 32));
    cr_assert_not_null(fc_book_find(&b, mem + 40, 8));
    cr_assert_not_null(fc_book_find(&b, mem + 48, 0));   // the end, empty
    cr_assert_null(fc_book_find(&b, mem + 40, 9));       // past the end
    cr_assert_null(fc_book_find(&b, mem + 8, 4));        // before it
    cr_assert_null(fc_book_find(&b, mem + 49, 0));
    fc_book_free(&b);
}

Test(alloc_book, crosscheck) {
    fc_error e;
    cr_assert_eq(fc_book_crosscheck(1000, 2, 1000, 512, &e), 0);
    cr_assert_eq(fc_book_crosscheck(1000, 2, 2024, 512, &e), 0);
    cr_assert_eq(fc_book_crosscheck(1000, 2, 2025, 512, &e), -1);
    cr_assert(strstr(e.msg, "untagged device memory"), "%s", e.msg);
    cr_assert_eq(fc_book_crosscheck(1000, 2, 999, 512, &e), -1);
    cr_assert(strstr(e.msg, "only 999"), "%s", e.msg);
    cr_assert_eq(fc_book_crosscheck_device(1000, 5000, &e), 0);
    cr_assert_eq(fc_book_crosscheck_device(1000, 10, &e), -1);
    cr_assert(strstr(e.msg, "cudaMemGetInfo"), "%s", e.msg);
}

// ---------------------------------------------------------------------------
// the matmul plan: the planned column-major product equals the row-major one

// D[m x n] (column-major, ld c.ld) = op(a) op(b), as cuBLAS computes it
static void colmajor_gemm(const fc_mm_plan *pl, const float *a, const float *b, float *d) {
    for (uint64_t j = 0; j < pl->n; j++)
        for (uint64_t i = 0; i < pl->m; i++) {
            double s = 0;
            for (uint64_t l = 0; l < pl->k; l++) {
                float x = pl->a.trans ? a[l + i * pl->a.ld] : a[i + l * pl->a.ld];
                float y = pl->b.trans ? b[j + l * pl->b.ld] : b[l + j * pl->b.ld];
                s += (double)x * y;
            }
            d[i + j * pl->c.ld] = (float)s;
        }
}

Test(mm_plan, rowmajor_products) {
    srand(7);
    for (int trial = 0; trial < 64; trial++) {
        int M = 1 + rand() % 7, N = 1 + rand() % 9, K = 1 + rand() % 6, ta = trial & 1, tb = (trial >> 1) & 1;
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
        float *C = malloc(sizeof(float) * M * N), *D = malloc(sizeof(float) * M * N);
        for (int i = 0; i < M * K; i++) A[i] = (float)(rand() % 17 - 8);
        for (int i = 0; i < K * N; i++) B[i] = (float)(rand() % 13 - 6);
        // the row-major product with A stored [M,K] or [K,M], B stored [K,N] or [N,K]
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)(ta ? A[k * M + m] : A[m * K + k]) * (tb ? B[n * K + k] : B[k * N + n]);
                C[m * N + n] = (float)s;
            }
        fc_mm_plan pl = fc_mm_plan_rowmajor(M, N, K, ta, tb);
        cr_assert_eq(pl.m, (uint64_t)N);
        cr_assert_eq(pl.n, (uint64_t)M);
        cr_assert_eq(pl.k, (uint64_t)K);
        // cuBLAS's layouts describe the stored matrices: rows x cols with ld >= rows
        cr_assert_eq(pl.a.rows * pl.a.cols, (uint64_t)K * N);
        cr_assert_eq(pl.b.rows * pl.b.cols, (uint64_t)M * K);
        cr_assert_geq(pl.a.ld, (int64_t)pl.a.rows);
        cr_assert_geq(pl.b.ld, (int64_t)pl.b.rows);
        colmajor_gemm(&pl, B, A, D);  // cuBLAS's a is our B, its b our A
        for (int i = 0; i < M * N; i++) cr_assert_eq(D[i], C[i], "M=%d N=%d K=%d ta=%d tb=%d at %d", M, N, K, ta, tb, i);
        free(A);
        free(B);
        free(C);
        free(D);
    }
}

Test(mm_plan, alignment) {
    cr_assert_eq(fc_mm_alignment((void *)0x1000), 256);
    cr_assert_eq(fc_mm_alignment((void *)0x1010), 16);
    cr_assert_eq(fc_mm_alignment((void *)0x1002), 2);
    cr_assert_eq(fc_mm_alignment((void *)0x1001), 1);
}

// ---------------------------------------------------------------------------
// the embedding backward's buckets

Test(enc_buckets, grouped_in_order) {
    enum { N = 200, V = 13 };
    int32_t ids[N], count[V], tok[N], off[N + 1], pos[N];
    srand(3);
    for (int i = 0; i < N; i++) ids[i] = rand() % V == 0 ? 5 : rand() % (V - 1);
    int n_tok = fc_enc_buckets(ids, N, V, count, tok, off, pos);
    cr_assert_gt(n_tok, 0);
    cr_assert_eq(off[0], 0);
    cr_assert_eq(off[n_tok], N);
    int seen[N] = {0};
    for (int j = 0; j < n_tok; j++) {
        if (j) cr_assert_lt(tok[j - 1], tok[j]);
        cr_assert_lt(off[j], off[j + 1]);  // no empty bucket
        for (int g = off[j]; g < off[j + 1]; g++) {
            cr_assert_eq(ids[pos[g]], tok[j]);
            if (g > off[j]) cr_assert_lt(pos[g - 1], pos[g]);  // positions ascending: (b, t) order
            seen[pos[g]]++;
        }
    }
    for (int i = 0; i < N; i++) cr_assert_eq(seen[i], 1);
    int distinct = 0, present[V] = {0};
    for (int i = 0; i < N; i++) distinct += !present[ids[i]]++;
    cr_assert_eq(n_tok, distinct);
}

// ---------------------------------------------------------------------------
// staged sums: rank order, every partial rounded

Test(staged, fp32_rank_order) {
    float in[3][2] = {{1e8f, 1.0f}, {1.0f, 1e8f}, {-1e8f, -1e8f}}, out[2];
    fc_staged_sum(FC_PREC_FP32, in, 3, 2, out);
    cr_assert_eq(out[0], (1e8f + 1.0f) + -1e8f);  // = 0: the 1 is lost at rank 1
    cr_assert_eq(out[0], 0.0f);
    cr_assert_eq(out[1], (1.0f + 1e8f) + -1e8f);
}

Test(staged, bf16_partials_rounded) {
    // bf16 has 8 significant bits: 256 + 1 rounds back to 256 at every step
    float v[4] = {256.0f, 1.0f, 1.0f, 1.0f};
    uint16_t in[4], out;
    for (int j = 0; j < 4; j++) in[j] = fc_f32_to_bf16(v[j]);
    fc_staged_sum(FC_PREC_BF16, in, 4, 1, &out);
    cr_assert_eq(fc_bf16_to_f32(out), 256.0f);
    // the other order rounds differently: 1 + 1 + 1 = 3, then 259 -> 260 (ties to even)
    float w[4] = {1.0f, 1.0f, 1.0f, 256.0f};
    for (int j = 0; j < 4; j++) in[j] = fc_f32_to_bf16(w[j]);
    fc_staged_sum(FC_PREC_BF16, in, 4, 1, &out);
    cr_assert_eq(fc_bf16_to_f32(out), 260.0f);
}

Test(staged, fp16_matches_reference_formula) {
    enum { G = 5, S = 33 };
    uint16_t in[G * S], out[S];
    srand(11);
    for (int i = 0; i < G * S; i++) in[i] = fc_f32_to_f16((float)(rand() % 2001 - 1000) / 37.0f);
    fc_staged_sum(FC_PREC_FP16, in, G, S, out);
    for (int i = 0; i < S; i++) {
        float acc = fc_f16_to_f32(in[i]);
        for (int j = 1; j < G; j++) acc = fc_round(FC_PREC_FP16, acc + fc_f16_to_f32(in[j * S + i]));
        cr_assert_eq(out[i], fc_f32_to_f16(acc));
    }
}

// ---------------------------------------------------------------------------
// refusals and the memory estimate

static fc_run_config cfg_of(const char *model, fc_strategy s) {
    fc_run_config c;
    fc_run_config_defaults(&c);
    fc_error e;
    cr_assert_eq(fc_model_config_load(model, &c.model, &e), 0);
    c.strategy = s;
    return c;
}

Test(cuda_config, accepts) {
    fc_error e;
    fc_run_config c = cfg_of("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
    cr_assert_eq(fc_cuda_config_check(&c, 4, &e), 0, "%s", e.msg);
    c = cfg_of("mlp-tiny", FC_STRATEGY_LOCAL);
    cr_assert_eq(fc_cuda_config_check(&c, 1, &e), 0, "%s", e.msg);
}

// llama (tied and untied), --freeze and LoRA run on the port since issue 19 part 5
Test(cuda_config, accepts_llama_frozen_lora) {
    fc_error e;
    fc_run_config c = cfg_of("llama-micro", FC_STRATEGY_FULL_SHARD);  // tied head
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), 0, "%s", e.msg);
    c = cfg_of("llama-tiny", FC_STRATEGY_HYBRID_SHARD);  // untied head, GQA 4:2, head_dim 6
    c.shard_group = 2;
    cr_assert_eq(fc_cuda_config_check(&c, 4, &e), 0, "%s", e.msg);
    c = cfg_of("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
    snprintf(c.freeze, sizeof c.freeze, "%s", "wte|ln_1");
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), 0, "%s", e.msg);
    c = cfg_of("mlp-tiny", FC_STRATEGY_NO_SHARD);
    snprintf(c.freeze, sizeof c.freeze, "%s", "layers[.]0");
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), 0, "%s", e.msg);
    c = cfg_of("llama-tiny", FC_STRATEGY_SHARD_GRAD_OP);
    cr_assert_eq(fc_model_config_set_lora(&c.model, "2:4:q_proj|v_proj", &e), 0, "%s", e.msg);
    cr_assert_eq(fc_cuda_config_check(&c, 4, &e), 0, "%s", e.msg);
}

// what stays refused for llama: the attention's sequence limit and recompute (FSDP2 is accepted)
Test(cuda_config, llama_refusals) {
    fc_error e;
    fc_run_config c = cfg_of("llama-tiny", FC_STRATEGY_FULL_SHARD);
    c.model.n_positions = 9000;
    c.seq_len = 8500;
    cr_assert_eq(fc_cuda_config_check(&c, 1, &e), -1);
    cr_assert(strstr(e.msg, "--seq-len 8500: the CUDA attention kernels take at most 8192 tokens"), "%s", e.msg);
    c = cfg_of("llama-micro", FC_STRATEGY_FULL_SHARD);
    cr_assert_eq(fc_model_config_set_lora(&c.model, "2:4:q_proj", &e), 0, "%s", e.msg);
    c.fsdp_version = 2;  // FSDP2's rows, frozen base and all: accepted
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), 0, "%s", e.msg);
    c.act_ckpt = FC_ACT_CKPT_INSIDE;
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), -1);
    cr_assert(strstr(e.msg, "--activation-checkpointing"), "%s", e.msg);
}

Test(cuda_config, refusals) {
    fc_error e;
    fc_run_config c = cfg_of("mlp-tiny", FC_STRATEGY_LOCAL);
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), -1);
    cr_assert(strstr(e.msg, "one process"), "%s", e.msg);
    c = cfg_of("mlp-tiny", FC_STRATEGY_FULL_SHARD);
    c.inject = FC_FAULT_NO_DIVIDE;
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), -1);
    cr_assert(strstr(e.msg, "--inject no_divide"), "%s", e.msg);
    c = cfg_of("gpt2-124m", FC_STRATEGY_FULL_SHARD);
    c.model.n_positions = 9000;
    c.seq_len = 8500;
    cr_assert_eq(fc_cuda_config_check(&c, 1, &e), -1);
    cr_assert(strstr(e.msg, "attention"), "%s", e.msg);
    c = cfg_of("mlp-tiny", FC_STRATEGY_FULL_SHARD);
    c.global_batch = 3;  // core's own check, first
    cr_assert_eq(fc_cuda_config_check(&c, 2, &e), -1);
    cr_assert(strstr(e.msg, "not divisible"), "%s", e.msg);
}

Test(cuda_config, memory) {
    fc_error e;
    fc_run_config c = cfg_of("gpt2-124m", FC_STRATEGY_FULL_SHARD);
    size_t one = fc_cuda_device_bytes(&c, 1, 0), four = fc_cuda_device_bytes(&c, 4, 0);
    cr_assert_gt(one, (size_t)124e6 * 4 * 4, "%zu", one);  // fp32 params, grads, two AdamW states at least
    cr_assert_lt(four, one);                                  // sharded: less per rank
    c.cpu_offload = 1;
    cr_assert_lt(fc_cuda_device_bytes(&c, 4, 0), four);
    c.cpu_offload = 0;
    c.param_dtype = FC_PREC_BF16;
    cr_assert_lt(fc_cuda_device_bytes(&c, 4, 0), four);
    // frozen: wte (38.6M elements, in the root unit) keeps no AdamW state
    c.param_dtype = FC_PREC_FP32;
    snprintf(c.freeze, sizeof c.freeze, "%s", "wte");
    size_t frozen = fc_cuda_device_bytes(&c, 1, 0), wte = (size_t)50257 * 768;
    cr_assert_eq(one - frozen, wte * 4 * 2, "%zu - %zu", one, frozen);  // exactly its two states
    // a whole unit frozen: neither its gradient shard nor its state, nor its gathered gradient
    snprintf(c.freeze, sizeof c.freeze, "%s", "h[.]3[.]");
    size_t block = fc_cuda_device_bytes(&c, 1, 0);
    cr_assert_lt(block, one);
    c.freeze[0] = 0;
    cr_assert_eq(fc_cuda_memory_fits(100, 200, 0, "GPU", &e), 0);
    cr_assert_eq(fc_cuda_memory_fits((size_t)3 << 30, (size_t)1 << 30, 1, "NVIDIA H100", &e), -1);
    cr_assert(strstr(e.msg, "needs about 3.00 GiB of device memory but device 1 (NVIDIA H100) has 1.00 GiB free"), "%s",
              e.msg);
}

// LoRA: the frozen base keeps no gradient and no state; only the adapters train
Test(cuda_config, memory_lora) {
    fc_error e;
    fc_run_config c = cfg_of("llama-tiny", FC_STRATEGY_FULL_SHARD);
    c.model.vocab_size = 32000;  // a root unit (embed, head) worth counting
    size_t full = fc_cuda_device_bytes(&c, 2, 0);
    cr_assert_eq(fc_model_config_set_lora(&c.model, "2:4:q_proj|v_proj", &e), 0, "%s", e.msg);
    size_t lora = fc_cuda_device_bytes(&c, 2, 0);
    // the root's 2 * 32000 * 16 elements: shard 4 B + grad shard 4 B + 2 states 8 B, and its gathered gradient
    cr_assert_lt(lora + (size_t)32000 * 16 * (4 + 8) / 2, full, "%zu %zu", lora, full);
}

// ---------------------------------------------------------------------------
// the activation layout

Test(acts, gpt2_layout) {
    fc_run_config c = cfg_of("gpt2-tiny", FC_STRATEGY_FULL_SHARD);
    fc_cu_acts a, h;
    fc_cu_acts_layout(&a, &c.model, 3, 7, FC_PREC_FP32);
    fc_cu_acts_layout(&h, &c.model, 3, 7, FC_PREC_BF16);
    cr_assert_eq(a.NT, 21);
    cr_assert_eq(a.n, c.model.n_layer);
    size_t NT = 21, C = (size_t)c.model.n_embd, V = (size_t)c.model.vocab_size;
    cr_assert_eq(a.encoded % 256, 0);
    cr_assert_geq(a.blk[0].ln1, a.encoded + NT * C * 4);
    cr_assert_geq(a.blk[0].att, a.blk[0].atty + NT * C * 4);
    cr_assert_geq(a.blk[0].attproj, a.blk[0].att + 3 * (size_t)c.model.n_head * 7 * 7 * 4);
    cr_assert_geq(a.logits, a.lnf_rstd + NT * 4);
    cr_assert_geq(a.losses, a.logits + NT * V * 4);
    cr_assert_geq(a.half, a.losses + NT * 4);
    cr_assert_eq(a.half % 256, 0);
    cr_assert_lt(h.half, a.half);
    cr_assert_eq(h.esz, 2);
    fc_cu_acts_free(&a);
    fc_cu_acts_free(&h);
}

Test(acts, llama_layout) {
    fc_error e;
    fc_run_config c = cfg_of("llama-tiny", FC_STRATEGY_FULL_SHARD);
    fc_cu_acts a, r;
    fc_cu_acts_layout(&a, &c.model, 3, 7, FC_PREC_FP32);
    size_t NT = 21, C = 16, Q = 4 * 6, KV = 2 * 6, I = 40, V = 97, att = 3 * 4 * 7 * 7;
    cr_assert_eq(a.NT, 21);
    cr_assert_eq(a.n, 2);
    cr_assert_null(a.blk);
    cr_assert_geq(a.lay[0].ln1, a.encoded + NT * C * 4);
    cr_assert_geq(a.lay[0].ln1_rstd, a.lay[0].ln1 + NT * C * 4);
    cr_assert_geq(a.lay[0].qp, a.lay[0].ln1_rstd + NT * 4);
    cr_assert_geq(a.lay[0].kp, a.lay[0].qp + NT * Q * 4);
    cr_assert_geq(a.lay[0].q, a.lay[0].kp + NT * KV * 4);
    cr_assert_geq(a.lay[0].v, a.lay[0].k + NT * KV * 4);
    cr_assert_geq(a.lay[0].atty, a.lay[0].att + att * 4);
    cr_assert_geq(a.lay[0].attproj, a.lay[0].atty + NT * Q * 4);
    cr_assert_geq(a.lay[0].down, a.lay[0].h + NT * I * 4);
    cr_assert_geq(a.lay[1].ln1, a.lay[0].res3 + NT * C * 4);
    cr_assert_geq(a.logits, a.lnf_rstd + NT * 4);
    cr_assert_geq(a.losses, a.logits + NT * V * 4);
    cr_assert_geq(a.rope_sin, a.rope_cos + 7 * 3 * 4);  // [T, hd/2] fp32
    cr_assert_geq(a.half, a.rope_sin + 7 * 3 * 4);
    cr_assert_eq(a.lora_u, 0);  // no LoRA, no scratch
    cr_assert_eq(fc_model_config_set_lora(&c.model, "3:6:o_proj", &e), 0, "%s", e.msg);
    fc_cu_acts_layout(&r, &c.model, 3, 7, FC_PREC_BF16);
    cr_assert_eq(r.esz, 2);
    cr_assert_gt(r.lora_u, 0);
    cr_assert_geq(r.lora_t, r.lora_u + NT * 3 * 2);
    cr_assert_geq(r.half, r.lora_t + NT * I * 2);  // the widest adapted output: I = 40
    cr_assert_eq(r.half % 256, 0);
    fc_cu_acts_free(&a);
    fc_cu_acts_free(&r);
}

Test(acts, mlp_layout) {
    fc_run_config c = cfg_of("mlp-tiny", FC_STRATEGY_FULL_SHARD);
    fc_cu_acts a;
    fc_cu_acts_layout(&a, &c.model, 5, 0, FC_PREC_FP16);
    cr_assert_eq(a.NT, 5);
    cr_assert_eq(a.T, 1);
    cr_assert_geq(a.mlp_h[0], a.x0 + 5 * (size_t)c.model.dims[0] * 2);
    for (int l = 0; l < c.model.n_layers; l++) {
        cr_assert_eq(a.mlp_h[l] % 256, 0);
        cr_assert_geq(a.mlp_y[l], a.mlp_h[l] + 5 * (size_t)c.model.dims[l + 1] * 2);
    }
    cr_assert_geq(a.half, a.losses + 5 * 4);
    fc_cu_acts_free(&a);
}
