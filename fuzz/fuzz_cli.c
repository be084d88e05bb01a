// fuzz/fuzz_cli.c — libFuzzer harness for the `fsdpcheck run` argument parser
// (fc_cli_parse_run, oracle/cli.c).
//
// The input is split at newlines into argv words (so a seed is a text file,
// one argument a line). The parser opens the files some flags name (--model
// FILE, --fsdp-config FILE, --init FILE) but writes nothing; to keep it away
// from the rest of the file system, a word containing '/' is dropped (the
// input is not run), and "@" in a word stands for a private directory the
// harness fills at start-up with a model config.json for each model kind
// (@mlp.json, @gpt2.json), two fsdp_config.json files (@fsdp_gpt2.json,
// @fsdp_mlp.json) and an @init.safetensors. Bare names resolve in the working
// directory, where they rarely exist.
//
// The parser must never crash, and its answer must be consistent: 1 only for
// --help; a refusal (-1) says why in one line; an acceptance (0) leaves a run
// config that validates, and a --save-at within the run's steps; the same
// words parse the same way twice.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define MAX_WORDS 64

static char sandbox[64];
static int verbose;  // FC_FUZZ_VERBOSE set: print each answer (to check seeds)

static void check(int ok) {
    if (!ok) abort();
}

static void put(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", sandbox, name);
    FILE *f = fopen(path, "w");
    check(f != NULL);
    fputs(text, f);
    check(fclose(f) == 0);
}

static void remove_sandbox(void) {
    static const char *names[] = {"mlp.json", "gpt2.json", "fsdp_gpt2.json", "fsdp_mlp.json", "init.safetensors"};
    char path[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", sandbox, names[i]);
        unlink(path);
    }
    rmdir(sandbox);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    verbose = getenv("FC_FUZZ_VERBOSE") != NULL;
    const char *tmp = getenv("TMPDIR");
    snprintf(sandbox, sizeof sandbox, "%s/fc_fuzz_cli.XXXXXX", tmp && strlen(tmp) < 32 ? tmp : "/tmp");
    check(mkdtemp(sandbox) != NULL);
    put("mlp.json", "{\"model_type\": \"fsdpcheck-mlp\", \"dims\": [13, 17, 11, 7]}");
    put("gpt2.json",
        "{\"model_type\": \"gpt2\", \"vocab_size\": 97, \"n_positions\": 32, \"n_embd\": 16, \"n_layer\": 2, "
        "\"n_head\": 4, \"layer_norm_epsilon\": 1e-05, \"activation_function\": \"gelu_new\", "
        "\"tie_word_embeddings\": true}");
    put("fsdp_gpt2.json",
        "{\"fsdp_sharding_strategy\": \"HYBRID_SHARD\", \"fsdp_backward_prefetch\": \"BACKWARD_PRE\", "
        "\"fsdp_state_dict_type\": \"SHARDED_STATE_DICT\", \"fsdp_transformer_layer_cls_to_wrap\": \"GPT2Block\", "
        "\"mixed_precision\": \"bf16\"}");
    put("fsdp_mlp.json",
        "{\"sharding_strategy\": \"SHARD_GRAD_OP\", \"transformer_layer_cls_to_wrap\": [\"Linear\"], "
        "\"mixed_precision_policy\": {\"param_dtype\": \"bfloat16\", \"reduce_dtype\": \"float32\"}}");
    put("init.safetensors", "");  // run opens it later; the parser only checks that it opens
    atexit(remove_sandbox);
    return 0;
}

// Splits the input into at most MAX_WORDS words, "@" expanded; 0 if the input
// is not to be run (a '/' in it, a NUL, too many words).
static int split(const uint8_t *data, size_t size, char **words, int *n) {
    *n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != '\n') {
            if (data[i] == '/' || data[i] == '\0') return 0;
            continue;
        }
        if (i == size && start == size) break;  // nothing after the last newline: no empty word
        if (*n == MAX_WORDS) return 0;
        size_t len = i - start, ats = 0;
        for (size_t k = start; k < i; k++) ats += data[k] == '@';
        char *w = malloc(len + ats * strlen(sandbox) + 2);
        check(w != NULL);
        size_t o = 0;
        for (size_t k = start; k < i; k++) {
            if (data[k] == '@') {
                o += (size_t)sprintf(w + o, "%s/", sandbox);
            } else {
                w[o++] = (char)data[k];
            }
        }
        w[o] = '\0';
        words[(*n)++] = w;
        start = i + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *words[MAX_WORDS], *copy[MAX_WORDS];
    int n;
    if (!split(data, size, words, &n)) {
        for (int i = 0; i < n; i++) free(words[i]);
        return 0;
    }
    memcpy(copy, words, sizeof words);
    static fc_run_args a, b;  // large: not on the stack
    fc_error e, e2;
    e.msg[0] = '\0';
    int rc = fc_cli_parse_run(n, copy, &a, &e);
    check(rc == -1 || rc == 0 || rc == 1);
    if (verbose) fprintf(stderr, "fuzz_cli: %d words: %d %s\n", n, rc, rc == -1 ? e.msg : "");
    if (rc == 1) {
        int help = 0;
        for (int i = 0; i < n; i++) help |= strcmp(words[i], "--help") == 0;
        check(help);
    } else if (rc == -1) {
        check(e.msg[0] != '\0' && strchr(e.msg, '\n') == NULL);
    } else {
        check(fc_run_config_validate(&a.cfg, &e) == 0);
        check(!a.save_dir[0] ? a.save_at == 0 : a.save_at >= 1 && a.save_at <= a.cfg.steps);
        check(!(a.load_dir[0] && a.cfg.init_path[0]));
        // flags set only with a value: the strings stay NUL-terminated in their buffers
        check(memchr(a.trace_dir, '\0', sizeof a.trace_dir) && memchr(a.save_dir, '\0', sizeof a.save_dir) &&
              memchr(a.load_dir, '\0', sizeof a.load_dir) && memchr(a.comm_log, '\0', sizeof a.comm_log));
    }
    // argv is not modified, and the same words give the same answer
    check(memcmp(copy, words, sizeof(char *) * (size_t)n) == 0);
    e2.msg[0] = '\0';
    int rc2 = fc_cli_parse_run(n, copy, &b, &e2);
    check(rc2 == rc && (rc != -1 || strcmp(e.msg, e2.msg) == 0));
    for (int i = 0; i < n; i++) free(words[i]);
    return 0;
}
