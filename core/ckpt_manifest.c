// core/ckpt_manifest.c — the checkpoint manifest (fsdpcheck.json): the names
// it uses, the JSON helpers its parser and the shard layout parser share, and
// the parser, which validates everything a reader relies on before anyone
// opens a listed file. See checkpoint.h.
#include <cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_internal.h"
#include "layout.h"
#include "optim.h"

#define MAX_WORLD 65536
#define MAX_STEP 1e12  // far beyond any run, far below 2^53

// ---------------------------------------------------------------------------
// names

static const char *STATE_DICT_NAMES[] = {"full", "sharded", "dcp"};
#define N_STATE_DICTS ((int)(sizeof STATE_DICT_NAMES / sizeof STATE_DICT_NAMES[0]))

const char *fc_state_dict_name(fc_state_dict k) { return STATE_DICT_NAMES[k]; }

int fc_state_dict_parse(const char *s, fc_state_dict *out) {
    for (int i = 0; i < N_STATE_DICTS; i++)
        if (s && strcmp(s, STATE_DICT_NAMES[i]) == 0) {
            *out = (fc_state_dict)i;
            return 0;
        }
    return -1;
}

fc_state_dict fc_ckpt_sharded_kind(const fc_run_config *cfg) {
    return fc_layout_kind_of(cfg) == FC_LAYOUT_PER_PARAM ? FC_STATE_DICT_DCP : FC_STATE_DICT_SHARDED;
}

// A file name a manifest may list: a plain name inside the directory, never
// a path ("../x", "/etc/x") and never hidden.
static int safe_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= FC_CKPT_MAX_NAME || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

// "shard-RRRRR.safetensors" -> R (five or more digits), -1 otherwise.
long fc_ckpt_shard_index(const char *s) {
    const char *pre = "shard-", *suf = ".safetensors";
    size_t n = strlen(s), np = strlen(pre), ns = strlen(suf);
    if (n < np + 5 + ns || strncmp(s, pre, np) != 0 || strcmp(s + n - ns, suf) != 0) return -1;
    long r = 0;
    for (size_t i = np; i < n - ns; i++) {
        if (s[i] < '0' || s[i] > '9' || r > 100000000) return -1;
        r = r * 10 + (s[i] - '0');
    }
    return r;
}

// Digits at *p (at most 9), advancing p; -1 if none.
static long digits(const char **p) {
    long r = 0;
    int n = 0;
    for (; **p >= '0' && **p <= '9'; (*p)++, n++) {
        if (n == 9) return -1;
        r = r * 10 + (**p - '0');
    }
    return n ? r : -1;
}

long fc_ckpt_dcp_index(const char *s) {
    const char *p = s;
    if (strncmp(p, "shard-", 6) != 0) return -1;
    p += 6;
    long shard = digits(&p);
    if (shard < 1 || strncmp(p, "-model-", 7) != 0) return -1;
    p += 7;
    long idx = digits(&p);
    if (idx < 1 || strncmp(p, "-of-", 4) != 0) return -1;
    p += 4;
    long of = digits(&p);
    if (of < idx || strcmp(p, ".safetensors") != 0) return -1;
    return shard;
}

// ---------------------------------------------------------------------------
// JSON helpers

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// A non-negative integer field no larger than max.
int fc_ckpt_json_uint(const cJSON *obj, const char *key, double max, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d > max || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

void fc_ckpt_json_check(const void *p, const char *file, int line) {
    if (!p) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory building JSON", file, line);
}

const char *fc_ckpt_json_str(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int is_sha256_hex(const char *s) {
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

fc_ckpt_shown fc_ckpt_show(const char *str) {
    fc_ckpt_shown r;
    size_t n = strlen(str), i;
    for (i = 0; i < n && i < 60; i++) {
        unsigned char c = (unsigned char)str[i];
        r.s[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    if (n > 60) memcpy(r.s + i, "...", 4);
    else r.s[i] = '\0';
    return r;
}

// A refusal is one line, whatever a file made other modules echo into it
// (a config value with a newline, say): control bytes become '?'.
int fc_ckpt_one_line(fc_error *e) {
    if (e)
        for (char *p = e->msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    return -1;
}

// ---------------------------------------------------------------------------
// the manifest

void fc_ckpt_manifest_free(fc_ckpt_manifest *m) {
    free(m->files);
    memset(m, 0, sizeof *m);
}

static int parse_files(const char *src, const cJSON *arr, fc_ckpt_manifest *m, fc_error *e) {
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
    if (n < 1 || n > MAX_WORLD + 3)
        return fc_fail(e, "%s: \"files\" must be an array of 1 to %d file entries", src, MAX_WORLD + 3);
    m->files = callocCheck((size_t)n, sizeof *m->files);
    m->n_files = n;
    int i = 0;
    for (const cJSON *f = arr->child; f; f = f->next, i++) {
        if (!cJSON_IsObject(f) || cJSON_GetArraySize(f) != 3)
            return fc_fail(e, "%s: files[%d] must be an object with \"name\", \"bytes\" and \"sha256\"", src, i);
        const char *name = fc_ckpt_json_str(f, "name"), *sha = fc_ckpt_json_str(f, "sha256");
        if (!name || !safe_name(name))
            return fc_fail(e, "%s: files[%d]: \"name\" must be a plain file name (letters, digits, '.', '_', '-')",
                           src, i);
        fc_ckpt_file *F = &m->files[i];
        snprintf(F->name, sizeof F->name, "%s", name);
        if (fc_ckpt_json_uint(f, "bytes", FC_CKPT_JSON_MAX_INT, &F->bytes))
            return fc_fail(e, "%s: files[%d] (%s): \"bytes\" must be a non-negative integer", src, i, name);
        if (!sha || !is_sha256_hex(sha))
            return fc_fail(e, "%s: files[%d] (%s): \"sha256\" must be 64 lowercase hex digits", src, i, name);
        memcpy(F->sha256, sha, 65);
    }
    const char **names = mallocCheck((size_t)n * sizeof *names);
    for (int k = 0; k < n; k++) names[k] = m->files[k].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    const char *dup = NULL;
    for (int k = 1; k < n && !dup; k++)
        if (strcmp(names[k - 1], names[k]) == 0) dup = names[k];
    free(names);
    if (dup) return fc_fail(e, "%s: file %s is listed twice", src, dup);
    // the set of files each layout consists of, nothing more or less
    int has_config = 0, has_model = 0, has_optim = 0, shards = 0;
    for (int k = 0; k < n; k++) {
        const char *nm = m->files[k].name;
        long r = fc_ckpt_shard_index(nm), d = fc_ckpt_dcp_index(nm);
        if (!strcmp(nm, FC_CKPT_CONFIG)) has_config = 1;
        else if (m->kind == FC_STATE_DICT_FULL && !strcmp(nm, FC_CKPT_MODEL)) has_model = 1;
        else if (m->kind == FC_STATE_DICT_FULL && !strcmp(nm, FC_CKPT_OPTIM)) has_optim = 1;
        // PEFT's two files, beside a LoRA model's FULL checkpoint (whether the
        // model has LoRA, and so needs them, is checked once it is built)
        else if (m->kind == FC_STATE_DICT_FULL && (!strcmp(nm, FC_CKPT_PEFT_MODEL) || !strcmp(nm, FC_CKPT_PEFT_CONFIG)))
            continue;
        else if (m->kind == FC_STATE_DICT_SHARDED && r >= 0) {
            if (r >= m->world_size)
                return fc_fail(e, "%s: %s: rank %ld is outside the world of %d ranks", src, nm, r, m->world_size);
            shards++;
        } else if (m->kind == FC_STATE_DICT_DCP && d >= 0) {
            if (d > m->world_size)
                return fc_fail(e, "%s: %s: shard %ld is outside the world of %d ranks", src, nm, d, m->world_size);
            shards++;
        } else {
            return fc_fail(e, "%s: file %s does not belong in a %s checkpoint", src, nm,
                           fc_state_dict_name(m->kind));
        }
    }
    if (!has_config) return fc_fail(e, "%s: \"files\" does not list %s", src, FC_CKPT_CONFIG);
    if (m->kind == FC_STATE_DICT_FULL && (!has_model || !has_optim))
        return fc_fail(e, "%s: \"files\" does not list %s", src, has_model ? FC_CKPT_OPTIM : FC_CKPT_MODEL);
    if (m->kind == FC_STATE_DICT_SHARDED && shards == 0)
        return fc_fail(e, "%s: \"files\" lists no shard-RRRRR.safetensors", src);
    if (m->kind == FC_STATE_DICT_DCP && shards == 0)
        return fc_fail(e, "%s: \"files\" lists no shard-SSSSS-model-IIIII-of-NNNNN.safetensors", src);
    return 0;
}

static int parse_manifest(const char *src, const cJSON *j, fc_ckpt_manifest *m, fc_error *e) {
    if (!cJSON_IsObject(j)) return fc_fail(e, "%s: not a JSON object", src);
    const char *dup = fc_json_duplicate_key(j);
    if (dup) return fc_fail(e, "%s: key \"%s\" appears twice in one object", src, fc_ckpt_show(dup).s);
    const char *format = fc_ckpt_json_str(j, "format");
    if (!format || strcmp(format, FC_CKPT_FORMAT) != 0)
        return fc_fail(e, "%s: \"format\" is not \"%s\": not an fsdpcheck checkpoint manifest", src, FC_CKPT_FORMAT);
    uint64_t u = 0;
    if (fc_ckpt_json_uint(j, "version", 1e6, &u)) return fc_fail(e, "%s: \"version\" missing or not an integer", src);
    if (u != FC_CKPT_VERSION)
        return fc_fail(e, "%s: version %" PRIu64 " (this build reads version %d)", src, u, FC_CKPT_VERSION);
    m->version = (int)u;
    const char *sd = fc_ckpt_json_str(j, "state_dict");
    if (!sd || fc_state_dict_parse(sd, &m->kind))
        return fc_fail(e, "%s: \"state_dict\" must be \"full\", \"sharded\" or \"dcp\"", src);
    if (fc_ckpt_json_uint(j, "step", MAX_STEP, &u))
        return fc_fail(e, "%s: \"step\" missing or not a non-negative integer", src);
    m->step = (long)u;
    if (fc_ckpt_json_uint(j, "data_position", MAX_STEP, &u))
        return fc_fail(e, "%s: \"data_position\" missing or not a non-negative integer", src);
    m->data_position = (long)u;
    // data is a pure function of (seed, step, sample): the next step is the position
    if (m->data_position != m->step)
        return fc_fail(e, "%s: \"data_position\" %ld differs from \"step\" %ld", src, m->data_position, m->step);
    if (fc_ckpt_json_uint(j, "world_size", MAX_WORLD, &u) || u < 1)
        return fc_fail(e, "%s: \"world_size\" must be an integer in 1..%d", src, MAX_WORLD);
    m->world_size = (int)u;
    const char *strat = fc_ckpt_json_str(j, "strategy");
    if (!strat || fc_strategy_parse(strat, &m->strategy))
        return fc_fail(e, "%s: \"strategy\" missing or unknown", src);
    if (!fc_ckpt_json_str(j, "model")) return fc_fail(e, "%s: \"model\" missing or not a string", src);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    if (!cJSON_IsObject(cfg)) return fc_fail(e, "%s: \"config\" missing or not an object", src);
    fc_error ce;
    if (fc_run_config_from_json(cfg, &m->cfg, &ce)) return fc_fail(e, "%s: %s", src, ce.msg);
    // the optimizer state the files must hold follows from the config
    m->n_state = fc_optim_state_names(&m->cfg.optim, m->state_names);
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
    const char *kind = opt ? fc_ckpt_json_str(opt, "kind") : NULL;
    const cJSON *st = opt ? cJSON_GetObjectItemCaseSensitive(opt, "state") : NULL;
    if (!cJSON_IsObject(opt) || !kind || !cJSON_IsArray(st))
        return fc_fail(e, "%s: \"optimizer\" must be {\"kind\": ..., \"state\": [...]}", src);
    int same = strcmp(kind, fc_opt_name(m->cfg.optim.kind)) == 0 && cJSON_GetArraySize(st) == m->n_state;
    for (int i = 0; same && i < m->n_state; i++) {
        const cJSON *s = cJSON_GetArrayItem(st, i);
        same = cJSON_IsString(s) && strcmp(s->valuestring, m->state_names[i]) == 0;
    }
    if (!same)
        return fc_fail(e, "%s: \"optimizer\" does not match the config's %s optimizer and its state", src,
                       fc_opt_name(m->cfg.optim.kind));
    return parse_files(src, cJSON_GetObjectItemCaseSensitive(j, "files"), m, e);
}

int fc_ckpt_manifest_parse(const char *text, size_t len, const char *src, fc_ckpt_manifest *m,
                           fc_error *e) {
    memset(m, 0, sizeof *m);
    if (!src) src = "manifest";
    if (len > FC_CKPT_MAX_MANIFEST)
        return fc_fail(e, "%s: %zu bytes, over the %u-byte limit", src, len, FC_CKPT_MAX_MANIFEST);
    if (len && memchr(text, '\0', len)) return fc_fail(e, "%s: holds a NUL byte: not a JSON manifest", src);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) return fc_fail(e, "%s: not valid JSON (a truncated or corrupted manifest)", src);
    for (const char *p = end; p && p < text + len; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
            cJSON_Delete(j);
            return fc_fail(e, "%s: text after the JSON object", src);
        }
    int rc = parse_manifest(src, j, m, e);
    cJSON_Delete(j);
    if (rc) {
        fc_ckpt_manifest_free(m);
        return fc_ckpt_one_line(e);
    }
    return 0;
}
