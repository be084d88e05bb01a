// core/checkpoint.c — see checkpoint.h.
//
// Read it in four parts: names and SHA-256; the manifest parser; opening a
// checkpoint (verify everything before a single tensor byte is trusted) and
// reading element ranges from it; writing.
#include "checkpoint.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "optim.h"

#define MAX_MANIFEST (16u << 20)      // a manifest of 65536 shard files is ~8 MiB
#define MAX_CONFIG (1u << 20)
#define MAX_WORLD 65536
#define MAX_STEP 1e12                 // far beyond any run, far below 2^53
#define JSON_MAX_INT 9007199254740992.0  // 2^53: every integer below is exact in a double

static const char *CONFIG_NAME = "config.json";
static const char *MODEL_NAME = "model.safetensors";
static const char *OPTIM_NAME = "optimizer.safetensors";

static void json_oom(const void *p, int line) {
    if (!p) fc_die(FC_EXIT_INTERNAL, "%s:%d: out of memory building JSON", __FILE__, line);
}
#define jsonCheck(p) json_oom((const void *)(p), __LINE__)

// ---------------------------------------------------------------------------
// names

static const char *STATE_DICT_NAMES[] = {"full", "sharded"};

const char *fc_state_dict_name(fc_state_dict k) { return STATE_DICT_NAMES[k]; }

int fc_state_dict_parse(const char *s, fc_state_dict *out) {
    for (int i = 0; i < 2; i++)
        if (s && strcmp(s, STATE_DICT_NAMES[i]) == 0) {
            *out = (fc_state_dict)i;
            return 0;
        }
    return -1;
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
static long shard_index(const char *s) {
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

// ---------------------------------------------------------------------------
// SHA-256 through OpenSSL's EVP interface

static EVP_MD_CTX *sha_begin(void) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: OpenSSL cannot start a SHA-256 digest", __FILE__, __LINE__);
    return ctx;
}

static void sha_update(EVP_MD_CTX *ctx, const void *p, size_t n) {
    if (n && EVP_DigestUpdate(ctx, p, n) != 1)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: OpenSSL SHA-256 update failed", __FILE__, __LINE__);
}

static void sha_end(EVP_MD_CTX *ctx, char hex[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx, md, &len) != 1 || len != 32)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: OpenSSL SHA-256 final failed", __FILE__, __LINE__);
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

void fc_sha256_mem(const void *data, size_t n, char hex[65]) {
    EVP_MD_CTX *ctx = sha_begin();
    sha_update(ctx, data, n);
    sha_end(ctx, hex);
}

// Hashes everything left in fp, counting the bytes.
static int sha256_fp(FILE *fp, const char *path, uint64_t *size, char hex[65], fc_error *e) {
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = mallocCheck(CHUNK);
    EVP_MD_CTX *ctx = sha_begin();
    uint64_t total = 0;
    size_t k;
    while ((k = fread(buf, 1, CHUNK, fp)) > 0) {
        sha_update(ctx, buf, k);
        total += k;
    }
    int bad = ferror(fp);
    sha_end(ctx, hex);
    free(buf);
    if (bad) return fc_fail(e, "%s: read error while computing its SHA-256", path);
    *size = total;
    return 0;
}

int fc_sha256_file(const char *path, uint64_t *size, char hex[65], fc_error *e) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return fc_fail(e, "%s: cannot open: %s", path, strerror(errno));
    int rc = sha256_fp(fp, path, size, hex, e);
    fclose(fp);
    return rc;
}

// ---------------------------------------------------------------------------
// JSON helpers

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// cJSON keeps duplicate keys and a lookup silently takes the first, so a
// manifest with two "step"s would mean whatever the reader picked: refused.
// Checks obj and every object inside it; returns a duplicated key or NULL.
static const char *duplicate_key(const cJSON *obj) {
    if (!cJSON_IsObject(obj) && !cJSON_IsArray(obj)) return NULL;
    int n = cJSON_GetArraySize(obj);
    const char *dup = NULL;
    if (cJSON_IsObject(obj) && n > 1) {
        const char **keys = mallocCheck((size_t)n * sizeof *keys);
        int k = 0;
        for (const cJSON *c = obj->child; c; c = c->next) keys[k++] = c->string ? c->string : "";
        qsort(keys, (size_t)k, sizeof *keys, cmp_str_ptr);
        for (int i = 1; i < k && !dup; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
        free(keys);
    }
    for (const cJSON *c = obj->child; c && !dup; c = c->next) dup = duplicate_key(c);
    return dup;
}

// A non-negative integer field no larger than max.
static int json_uint(const cJSON *obj, const char *key, double max, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d > max || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static const char *json_str(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int is_sha256_hex(const char *s) {
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

// A JSON value printed into a message: short, one line.
typedef struct {
    char s[72];
} shown;

static shown show(const char *str) {
    shown r;
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
static int one_line(fc_error *e) {
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
        const char *name = json_str(f, "name"), *sha = json_str(f, "sha256");
        if (!name || !safe_name(name))
            return fc_fail(e, "%s: files[%d]: \"name\" must be a plain file name (letters, digits, '.', '_', '-')",
                           src, i);
        fc_ckpt_file *F = &m->files[i];
        snprintf(F->name, sizeof F->name, "%s", name);
        if (json_uint(f, "bytes", JSON_MAX_INT, &F->bytes))
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
        long r = shard_index(nm);
        if (!strcmp(nm, CONFIG_NAME)) has_config = 1;
        else if (m->kind == FC_STATE_DICT_FULL && !strcmp(nm, MODEL_NAME)) has_model = 1;
        else if (m->kind == FC_STATE_DICT_FULL && !strcmp(nm, OPTIM_NAME)) has_optim = 1;
        else if (m->kind == FC_STATE_DICT_SHARDED && r >= 0) {
            if (r >= m->world_size)
                return fc_fail(e, "%s: %s: rank %ld is outside the world of %d ranks", src, nm, r, m->world_size);
            shards++;
        } else {
            return fc_fail(e, "%s: file %s does not belong in a %s checkpoint", src, nm,
                           fc_state_dict_name(m->kind));
        }
    }
    if (!has_config) return fc_fail(e, "%s: \"files\" does not list %s", src, CONFIG_NAME);
    if (m->kind == FC_STATE_DICT_FULL && (!has_model || !has_optim))
        return fc_fail(e, "%s: \"files\" does not list %s", src, has_model ? OPTIM_NAME : MODEL_NAME);
    if (m->kind == FC_STATE_DICT_SHARDED && shards == 0)
        return fc_fail(e, "%s: \"files\" lists no shard-RRRRR.safetensors", src);
    return 0;
}

static int parse_manifest(const char *src, const cJSON *j, fc_ckpt_manifest *m, fc_error *e) {
    if (!cJSON_IsObject(j)) return fc_fail(e, "%s: not a JSON object", src);
    const char *dup = duplicate_key(j);
    if (dup) return fc_fail(e, "%s: key \"%s\" appears twice in one object", src, show(dup).s);
    const char *format = json_str(j, "format");
    if (!format || strcmp(format, FC_CKPT_FORMAT) != 0)
        return fc_fail(e, "%s: \"format\" is not \"%s\": not an fsdpcheck checkpoint manifest", src, FC_CKPT_FORMAT);
    uint64_t u = 0;
    if (json_uint(j, "version", 1e6, &u)) return fc_fail(e, "%s: \"version\" missing or not an integer", src);
    if (u != FC_CKPT_VERSION)
        return fc_fail(e, "%s: version %" PRIu64 " (this build reads version %d)", src, u, FC_CKPT_VERSION);
    m->version = (int)u;
    const char *sd = json_str(j, "state_dict");
    if (!sd || fc_state_dict_parse(sd, &m->kind))
        return fc_fail(e, "%s: \"state_dict\" must be \"full\" or \"sharded\"", src);
    if (json_uint(j, "step", MAX_STEP, &u)) return fc_fail(e, "%s: \"step\" missing or not a non-negative integer", src);
    m->step = (long)u;
    if (json_uint(j, "data_position", MAX_STEP, &u))
        return fc_fail(e, "%s: \"data_position\" missing or not a non-negative integer", src);
    m->data_position = (long)u;
    // data is a pure function of (seed, step, sample): the next step is the position
    if (m->data_position != m->step)
        return fc_fail(e, "%s: \"data_position\" %ld differs from \"step\" %ld", src, m->data_position, m->step);
    if (json_uint(j, "world_size", MAX_WORLD, &u) || u < 1)
        return fc_fail(e, "%s: \"world_size\" must be an integer in 1..%d", src, MAX_WORLD);
    m->world_size = (int)u;
    const char *strat = json_str(j, "strategy");
    if (!strat || fc_strategy_parse(strat, &m->strategy))
        return fc_fail(e, "%s: \"strategy\" missing or unknown", src);
    if (!json_str(j, "model")) return fc_fail(e, "%s: \"model\" missing or not a string", src);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    if (!cJSON_IsObject(cfg)) return fc_fail(e, "%s: \"config\" missing or not an object", src);
    fc_error ce;
    if (fc_run_config_from_json(cfg, &m->cfg, &ce)) return fc_fail(e, "%s: %s", src, ce.msg);
    // the optimizer state the files must hold follows from the config
    m->n_state = fc_optim_state_names(&m->cfg.optim, m->state_names);
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
    const char *kind = opt ? json_str(opt, "kind") : NULL;
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
    if (len > MAX_MANIFEST) return fc_fail(e, "%s: %zu bytes, over the %u-byte limit", src, len, MAX_MANIFEST);
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
        return one_line(e);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// opening and verifying

// One flat chunk of a sharded checkpoint: elements [first, first+count) of
// unit `unit`'s tensor t, stored in file `file` as tensor st.
typedef struct {
    int unit, t, file;
    const fc_st_tensor *st;
    uint64_t first, count;
} piece;

struct fc_ckpt {
    char src[1024];                 // the directory ("" for memory)
    const fc_ckpt_mem_file *mem;
    int n_mem;
    fc_ckpt_manifest man;
    char manifest_sha[65];
    fc_model model;
    int model_built;
    int n_tensors;                  // 1 + n_state
    const char *tensor_names[3];
    fc_st_file *st;                 // [n_files], aligned with man.files; open for .safetensors
    int model_file, optim_file;     // FULL: indices into st
    const fc_st_tensor **full;      // FULL: [n_tensors * n_params]
    piece *pieces;                  // SHARDED: sorted by (unit, t, first)
    int n_pieces;
    int *piece_at;                  // [n_units * n_tensors + 1]: pieces of (u, t) start here
    uint64_t bytes_read;
};

// The name of file i (or of the manifest) in messages: DIR/name, or name.
static const char *where(const fc_ckpt *c, const char *name, char *buf, size_t cap) {
    if (c->src[0]) snprintf(buf, cap, "%s/%s", c->src, name);
    else snprintf(buf, cap, "%s", name);
    return buf;
}

static const fc_ckpt_mem_file *mem_find(const fc_ckpt *c, const char *name) {
    for (int i = 0; i < c->n_mem; i++)
        if (c->mem[i].name && strcmp(c->mem[i].name, name) == 0) return &c->mem[i];
    return NULL;
}

// The manifest: a regular file, as a save writes it, refused by its size
// before it is read.
static int read_manifest(const fc_ckpt *c, const char *path, char **text, size_t *len, fc_error *e) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return fc_fail(e, "%s: no %s manifest: not a checkpoint, or one whose save did not finish", c->src,
                           FC_CKPT_MANIFEST);
        return fc_fail(e, "%s: cannot open: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return fc_fail(e, "%s: not a regular file", path);
    if ((uint64_t)st.st_size > MAX_MANIFEST)
        return fc_fail(e, "%s: %lld bytes, over the %zu-byte limit", path, (long long)st.st_size,
                       (size_t)MAX_MANIFEST);
    return fc_read_file_limited(path, MAX_MANIFEST, text, len, e) ? -1 : 0;
}

typedef struct {
    char s[200];
} described;

static described describe(const fc_model_config *m) {
    described d;
    if (m->kind == FC_MODEL_MLP) {
        int k = snprintf(d.s, sizeof d.s, "%.60s: mlp ", m->name);
        for (int i = 0; i <= m->n_layers && k < (int)sizeof d.s; i++)
            k += snprintf(d.s + k, sizeof d.s - (size_t)k, "%s%d", i ? "-" : "", m->dims[i]);
    } else {
        snprintf(d.s, sizeof d.s, "%.60s: gpt2 vocab %d, positions %d, n_embd %d, n_layer %d, n_head %d", m->name,
                 m->vocab_size, m->n_positions, m->n_embd, m->n_layer, m->n_head);
    }
    return d;
}

// config.json must describe the model of the manifest's config.
static int check_config_json(fc_ckpt *c, const char *text, const char *path, fc_error *e) {
    fc_model_config mc;
    fc_error ce;
    if (fc_model_config_parse(text, path, &mc, &ce)) return fc_fail(e, "%s", ce.msg);
    if (!fc_model_config_equal(&mc, &c->man.cfg.model))
        return fc_fail(e, "%s: describes another model than the manifest's config (%s)", path,
                       describe(&c->man.cfg.model).s);
    return 0;
}

// Presence, size and (with check_hashes) SHA-256 of listed file i, then its
// contents: a safetensors header, or config.json.
static int verify_file(fc_ckpt *c, int i, int check_hashes, fc_error *e) {
    const fc_ckpt_file *F = &c->man.files[i];
    char path[1200];
    where(c, F->name, path, sizeof path);
    int is_config = strcmp(F->name, CONFIG_NAME) == 0;
    char hex[65];
    if (!c->src[0]) {  // in memory
        const fc_ckpt_mem_file *mf = mem_find(c, F->name);
        if (!mf) return fc_fail(e, "%s: listed in the manifest but missing", path);
        if ((uint64_t)mf->size != F->bytes)
            return fc_fail(e, "%s: %zu bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path, mf->size,
                           F->bytes);
        if (check_hashes) {
            fc_sha256_mem(mf->data, mf->size, hex);
            if (strcmp(hex, F->sha256) != 0)
                return fc_fail(e, "%s: SHA-256 %.12s... does not match the manifest's %.12s... (corrupted)", path,
                               hex, F->sha256);
        }
        if (is_config) {
            if (mf->size > MAX_CONFIG || (mf->size && memchr(mf->data, '\0', mf->size)))
                return fc_fail(e, "%s: not a config.json", path);
            char *text = mallocCheck(mf->size + 1);
            if (mf->size) memcpy(text, mf->data, mf->size);
            text[mf->size] = '\0';
            int rc = check_config_json(c, text, path, e);
            free(text);
            return rc;
        }
        fc_error se;
        if (fc_st_open_mem(mf->data, mf->size, &c->st[i], &se)) return fc_fail(e, "%s: %s", path, se.msg);
        return 0;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return fc_fail(e, "%s: listed in the manifest but missing", path);
        return fc_fail(e, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return fc_fail(e, "%s: not a regular file", path);
    if ((uint64_t)st.st_size != F->bytes)
        return fc_fail(e, "%s: %lld bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path,
                       (long long)st.st_size, F->bytes);
    if (is_config) {
        char *text;
        size_t len;
        if (F->bytes > MAX_CONFIG) return fc_fail(e, "%s: too large for a config.json", path);
        if (fc_read_file_limited(path, MAX_CONFIG, &text, &len, e)) return -1;
        int rc = 0;
        if (len != F->bytes) rc = fc_fail(e, "%s: changed size while being verified", path);
        if (!rc && check_hashes) {
            fc_sha256_mem(text, len, hex);
            if (strcmp(hex, F->sha256) != 0)
                rc = fc_fail(e, "%s: SHA-256 %.12s... does not match the manifest's %.12s... (corrupted)", path, hex,
                             F->sha256);
        }
        if (!rc) rc = check_config_json(c, text, path, e);
        free(text);
        return rc;
    }
    // Hash first (a flipped byte is reported as corruption, not as whatever
    // the header parser makes of it), then open, and make sure the file we
    // opened is the inode we hashed: the bytes read later are the verified ones.
    struct stat hashed = st;
    if (check_hashes) {
        FILE *fp = fopen(path, "rb");
        if (!fp) return fc_fail(e, "%s: cannot open: %s", path, strerror(errno));
        uint64_t size = 0;
        int rc = fstat(fileno(fp), &hashed) != 0 ? fc_fail(e, "%s: cannot stat: %s", path, strerror(errno))
                                                  : sha256_fp(fp, path, &size, hex, e);
        fclose(fp);
        if (rc) return -1;
        if (size != F->bytes)
            return fc_fail(e, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (truncated or rewritten)", path,
                           size, F->bytes);
        if (strcmp(hex, F->sha256) != 0)
            return fc_fail(e, "%s: SHA-256 %.12s... does not match the manifest's %.12s... (corrupted)", path, hex,
                           F->sha256);
    }
    if (fc_st_open(path, &c->st[i], e)) return -1;
    struct stat now;
    if (fstat(fileno(c->st[i].fp), &now) != 0 || now.st_ino != hashed.st_ino || now.st_dev != hashed.st_dev ||
        c->st[i].file_size != F->bytes)
        return fc_fail(e, "%s: replaced while being verified (another save into this directory?)", path);
    return 0;
}

static int check_shape(const char *path, const fc_st_tensor *t, const fc_param *p, fc_error *e) {
    if (t->dtype != FC_DT_F32)
        return fc_fail(e, "%s: tensor '%s' is %s, not F32", path, show(t->name).s, fc_dtype_name(t->dtype));
    int same = t->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == (uint64_t)p->shape[d];
    if (!same) {
        char want[64];
        if (p->ndim == 2) snprintf(want, sizeof want, "[%lld, %lld]", (long long)p->shape[0], (long long)p->shape[1]);
        else snprintf(want, sizeof want, "[%lld]", (long long)p->shape[0]);
        return fc_fail(e, "%s: tensor '%s' does not have %s's shape %s", path, show(t->name).s, p->name, want);
    }
    return 0;
}

static int find_file(const fc_ckpt *c, const char *name) {
    for (int i = 0; i < c->man.n_files; i++)
        if (strcmp(c->man.files[i].name, name) == 0) return i;
    return -1;
}

// FULL: every parameter in model.safetensors, every state and the step in
// optimizer.safetensors, with their shapes, and nothing else.
static int check_full(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    int np = m->n_params;
    c->model_file = find_file(c, MODEL_NAME);
    c->optim_file = find_file(c, OPTIM_NAME);
    c->full = callocCheck((size_t)(c->n_tensors * np), sizeof *c->full);
    char path[1200];
    const fc_st_file *ms = &c->st[c->model_file];
    where(c, MODEL_NAME, path, sizeof path);
    const char *fmt = fc_st_meta(ms, "format");
    if (!fmt || strcmp(fmt, "pt") != 0)
        return fc_fail(e, "%s: __metadata__ has no \"format\": \"pt\" (transformers would not load it)", path);
    for (int k = 0; k < ms->n_tensors; k++) {
        const fc_st_tensor *t = &ms->tensors[k];
        int p = fc_model_find(m, t->name);
        if (p < 0) return fc_fail(e, "%s: tensor '%s' is not a parameter of model %s", path, show(t->name).s, m->cfg.name);
        if (check_shape(path, t, &m->params[p], e)) return -1;
        c->full[p] = t;
    }
    for (int p = 0; p < np; p++)
        if (!c->full[p]) return fc_fail(e, "%s: parameter %s is missing", path, m->params[p].name);

    fc_st_file *os = &c->st[c->optim_file];
    where(c, OPTIM_NAME, path, sizeof path);
    int have_step = 0;
    for (int k = 0; k < os->n_tensors; k++) {
        const fc_st_tensor *t = &os->tensors[k];
        if (strcmp(t->name, "step") == 0) {
            if (t->dtype != FC_DT_I64 || t->ndim != 0)
                return fc_fail(e, "%s: \"step\" must be an I64 scalar", path);
            int64_t step = 0;
            if (fc_st_read(os, t, 0, 1, &step, e)) return -1;
            if (step != c->man.step)
                return fc_fail(e, "%s: step %lld, the manifest says %ld", path, (long long)step, c->man.step);
            have_step = 1;
            continue;
        }
        const char *dot = strchr(t->name, '.');
        int ti = -1, p = -1;
        if (dot) {
            for (int s = 1; s < c->n_tensors; s++)
                if ((size_t)(dot - t->name) == strlen(c->tensor_names[s]) &&
                    strncmp(t->name, c->tensor_names[s], (size_t)(dot - t->name)) == 0)
                    ti = s;
            p = fc_model_find(m, dot + 1);
        }
        if (ti < 0 || p < 0)
            return fc_fail(e, "%s: tensor '%s' is not a state of the %s optimizer for a parameter of %s", path,
                           show(t->name).s, fc_opt_name(c->man.cfg.optim.kind), m->cfg.name);
        if (check_shape(path, t, &m->params[p], e)) return -1;
        c->full[ti * np + p] = t;
    }
    if (!have_step) return fc_fail(e, "%s: no \"step\" tensor", path);
    for (int s = 1; s < c->n_tensors; s++)
        for (int p = 0; p < np; p++)
            if (!c->full[s * np + p])
                return fc_fail(e, "%s: optimizer state %s.%s is missing", path, c->tensor_names[s], m->params[p].name);
    return 0;
}

static int cmp_piece(const void *a, const void *b) {
    const piece *x = a, *y = b;
    if (x->unit != y->unit) return x->unit < y->unit ? -1 : 1;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return 0;
}

// One tensor of a shard file and its layout entry.
static int parse_piece(fc_ckpt *c, int file, const fc_st_tensor *t, const char *path, piece *out, fc_error *e) {
    const fc_st_file *s = &c->st[file];
    const fc_model *m = &c->model;
    const char *layout = fc_st_meta(s, t->name);
    if (!layout) return fc_fail(e, "%s: tensor '%s' has no layout entry in __metadata__", path, show(t->name).s);
    cJSON *j = cJSON_Parse(layout);
    int rc = -1;
    uint64_t unit, first, count, numel;
    const char *uname = j ? json_str(j, "unit_name") : NULL, *tname = j ? json_str(j, "tensor") : NULL;
    if (!cJSON_IsObject(j) || duplicate_key(j) || cJSON_GetArraySize(j) != 6 || !uname || !tname ||
        json_uint(j, "unit", 1e6, &unit) || json_uint(j, "first", JSON_MAX_INT, &first) ||
        json_uint(j, "count", JSON_MAX_INT, &count) || json_uint(j, "unit_numel", JSON_MAX_INT, &numel)) {
        fc_fail(e, "%s: the layout of tensor '%s' is not {unit, unit_name, tensor, first, count, unit_numel}", path,
                show(t->name).s);
        goto done;
    }
    int ti = fc_ckpt_tensor_index(c, tname);
    char canon[96];
    snprintf(canon, sizeof canon, "unit%" PRIu64 ".%s", unit, tname);
    if (unit >= (uint64_t)m->n_units || strcmp(uname, m->units[unit].name) != 0 || numel != m->units[unit].numel) {
        fc_fail(e, "%s: tensor '%s' claims unit %" PRIu64 " '%s' of %" PRIu64 " elements, which model %s does not have",
                path, show(t->name).s, unit, show(uname).s, numel, m->cfg.name);
    } else if (ti < 0) {
        fc_fail(e, "%s: tensor '%s' holds '%s', which the %s optimizer does not keep", path, show(t->name).s,
                show(tname).s, fc_opt_name(c->man.cfg.optim.kind));
    } else if (strcmp(t->name, canon) != 0) {
        fc_fail(e, "%s: tensor '%s' is described as %s", path, show(t->name).s, canon);
    } else if (count == 0 || first > numel || count > numel - first) {
        fc_fail(e, "%s: tensor '%s': elements [%" PRIu64 ", +%" PRIu64 ") are outside the unit's %" PRIu64, path,
                show(t->name).s, first, count, numel);
    } else if (t->dtype != FC_DT_F32 || t->ndim != 1 || t->shape[0] != count) {
        fc_fail(e, "%s: tensor '%s' is not F32 [%" PRIu64 "] as its layout says", path, show(t->name).s, count);
    } else {
        *out = (piece){(int)unit, ti, file, t, first, count};
        rc = 0;
    }
done:
    cJSON_Delete(j);
    return rc;
}

// SHARDED: every shard file's tensors have a layout, and the chunks of all
// files tile every unit's every tensor exactly once.
static int check_sharded(fc_ckpt *c, fc_error *e) {
    const fc_model *m = &c->model;
    int total = 0;
    for (int i = 0; i < c->man.n_files; i++) total += c->st[i].n_tensors;
    c->pieces = callocCheck((size_t)(total ? total : 1), sizeof *c->pieces);
    char path[1200], step[32];
    snprintf(step, sizeof step, "%ld", c->man.step);
    for (int i = 0; i < c->man.n_files; i++) {
        if (shard_index(c->man.files[i].name) < 0) continue;
        const fc_st_file *s = &c->st[i];
        where(c, c->man.files[i].name, path, sizeof path);
        const char *fmt = fc_st_meta(s, "format"), *st = fc_st_meta(s, "step");
        if (!fmt || strcmp(fmt, FC_CKPT_SHARD_FORMAT) != 0)
            return fc_fail(e, "%s: __metadata__ \"format\" is not \"%s\"", path, FC_CKPT_SHARD_FORMAT);
        if (!st || strcmp(st, step) != 0)
            return fc_fail(e, "%s: saved at step %s, the manifest says %ld", path, st ? show(st).s : "(none)",
                           c->man.step);
        for (int k = 0; k < s->n_meta; k++) {
            const char *key = s->meta[k].key;
            if (!strcmp(key, "format") || !strcmp(key, "step") || !strcmp(key, "rank") || !strcmp(key, "world_size"))
                continue;
            if (!fc_st_find(s, key)) return fc_fail(e, "%s: __metadata__ '%s' describes no tensor", path, show(key).s);
        }
        for (int k = 0; k < s->n_tensors; k++)
            if (parse_piece(c, i, &s->tensors[k], path, &c->pieces[c->n_pieces++], e)) return -1;
    }
    qsort(c->pieces, (size_t)c->n_pieces, sizeof *c->pieces, cmp_piece);
    int groups = m->n_units * c->n_tensors;
    c->piece_at = callocCheck((size_t)groups + 1, sizeof *c->piece_at);
    int k = 0;
    for (int g = 0; g < groups; g++) {
        int u = g / c->n_tensors, t = g % c->n_tensors;
        c->piece_at[g] = k;
        uint64_t next = 0, numel = m->units[u].numel;
        const char *uname = m->units[u].name[0] ? m->units[u].name : "(root)";
        for (; k < c->n_pieces && c->pieces[k].unit == u && c->pieces[k].t == t; k++) {
            const piece *p = &c->pieces[k];
            if (p->first > next)
                return fc_fail(e, "%s: elements [%" PRIu64 ", %" PRIu64 ") of unit %d (%s) %s are in no shard file",
                               c->src[0] ? c->src : "checkpoint", next, p->first, u, uname, c->tensor_names[t]);
            if (p->first < next)
                return fc_fail(e, "%s: elements from %" PRIu64 " of unit %d (%s) %s are in two shard files (%s, %s)",
                               c->src[0] ? c->src : "checkpoint", p->first, u, uname, c->tensor_names[t],
                               c->man.files[c->pieces[k - 1].file].name, c->man.files[p->file].name);
            next = p->first + p->count;
        }
        if (next != numel)
            return fc_fail(e, "%s: elements [%" PRIu64 ", %" PRIu64 ") of unit %d (%s) %s are in no shard file",
                           c->src[0] ? c->src : "checkpoint", next, numel, u, uname, c->tensor_names[t]);
    }
    c->piece_at[groups] = k;
    return 0;
}

static int open_common(fc_ckpt *c, int check_hashes, fc_error *e) {
    char path[1200];
    where(c, FC_CKPT_MANIFEST, path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    if (c->src[0]) {
        struct stat st;
        if (stat(c->src, &st) != 0 || !S_ISDIR(st.st_mode))
            return fc_fail(e, "%s: no such checkpoint directory", c->src);
        if (read_manifest(c, path, &text, &len, e)) return -1;
    } else {
        const fc_ckpt_mem_file *mf = mem_find(c, FC_CKPT_MANIFEST);
        if (!mf) return fc_fail(e, "(memory): no %s manifest", FC_CKPT_MANIFEST);
        text = mallocCheck(mf->size + 1);
        if (mf->size) memcpy(text, mf->data, mf->size);
        len = mf->size;
    }
    fc_sha256_mem(text, len, c->manifest_sha);
    int rc = fc_ckpt_manifest_parse(text, len, path, &c->man, e);
    free(text);
    if (rc) return -1;
    fc_model_build(&c->model, &c->man.cfg.model);
    c->model_built = 1;
    c->n_tensors = 1 + c->man.n_state;
    c->tensor_names[0] = "param";
    for (int s = 0; s < c->man.n_state; s++) c->tensor_names[1 + s] = c->man.state_names[s];
    c->st = callocCheck((size_t)c->man.n_files, sizeof *c->st);
    for (int i = 0; i < c->man.n_files; i++)
        if (verify_file(c, i, check_hashes, e)) return -1;
    return c->man.kind == FC_STATE_DICT_FULL ? check_full(c, e) : check_sharded(c, e);
}

static int finish_open(fc_ckpt *c, int rc, fc_ckpt **out, fc_error *e) {
    if (rc) {
        fc_ckpt_close(c);
        *out = NULL;
        return one_line(e);
    }
    *out = c;
    return 0;
}

int fc_ckpt_open(const char *dir, int check_hashes, fc_ckpt **out, fc_error *e) {
    fc_ckpt *c = callocCheck(1, sizeof *c);
    if (!dir || !*dir || snprintf(c->src, sizeof c->src, "%s", dir) >= (int)sizeof c->src) {
        free(c);
        *out = NULL;
        return fc_fail(e, "checkpoint directory name empty or too long");
    }
    // "DIR/" and "DIR" name the same checkpoint; messages read better without the slash
    for (size_t n = strlen(c->src); n > 1 && c->src[n - 1] == '/'; n--) c->src[n - 1] = '\0';
    return finish_open(c, open_common(c, check_hashes, e), out, e);
}

int fc_ckpt_open_mem(const fc_ckpt_mem_file *files, int n, int check_hashes, fc_ckpt **out, fc_error *e) {
    fc_ckpt *c = callocCheck(1, sizeof *c);
    c->mem = files;
    c->n_mem = n;
    return finish_open(c, open_common(c, check_hashes, e), out, e);
}

void fc_ckpt_close(fc_ckpt *c) {
    if (!c) return;
    if (c->st)
        for (int i = 0; i < c->man.n_files; i++) fc_st_close(&c->st[i]);
    free(c->st);
    free(c->full);
    free(c->pieces);
    free(c->piece_at);
    if (c->model_built) fc_model_free(&c->model);
    fc_ckpt_manifest_free(&c->man);
    free(c);
}

const fc_ckpt_manifest *fc_ckpt_manifest_of(const fc_ckpt *c) { return &c->man; }
const fc_model *fc_ckpt_model(const fc_ckpt *c) { return &c->model; }
const char *fc_ckpt_manifest_sha256(const fc_ckpt *c) { return c->manifest_sha; }
uint64_t fc_ckpt_bytes_read(const fc_ckpt *c) { return c->bytes_read; }

const fc_st_file *fc_ckpt_st(const fc_ckpt *c, const char *name) {
    int i = find_file(c, name);
    return i >= 0 && strcmp(name, CONFIG_NAME) != 0 ? &c->st[i] : NULL;
}

int fc_ckpt_tensor_index(const fc_ckpt *c, const char *name) {
    for (int t = 0; t < c->n_tensors; t++)
        if (strcmp(name, c->tensor_names[t]) == 0) return t;
    return -1;
}

const char *fc_ckpt_tensor_name(const fc_ckpt *c, int t) {
    return t >= 0 && t < c->n_tensors ? c->tensor_names[t] : "?";
}

// ---------------------------------------------------------------------------
// reading element ranges

static int st_read(fc_ckpt *c, int file, const fc_st_tensor *t, uint64_t first, uint64_t n, float *dst,
                   fc_error *e) {
    char path[1200];
    fc_error re;
    if (fc_st_read_f32(&c->st[file], t, first, n, dst, &re))
        return fc_fail(e, "%s: %s", where(c, c->man.files[file].name, path, sizeof path), re.msg);
    c->bytes_read += n * sizeof(float);
    return 0;
}

static int read_unit_sharded(fc_ckpt *c, int u, int t, uint64_t first, uint64_t n, float *dst, fc_error *e) {
    int g = u * c->n_tensors + t;
    uint64_t end = first + n;
    for (int k = c->piece_at[g]; k < c->piece_at[g + 1]; k++) {
        const piece *p = &c->pieces[k];
        uint64_t lo = p->first > first ? p->first : first;
        uint64_t hi = p->first + p->count < end ? p->first + p->count : end;
        if (lo >= hi) continue;
        if (st_read(c, p->file, p->st, lo - p->first, hi - lo, dst + (lo - first), e)) return -1;
    }
    return 0;
}

int fc_ckpt_read(fc_ckpt *c, int p, int t, uint64_t first, uint64_t n, float *dst, fc_error *e) {
    if (p < 0 || p >= c->model.n_params || t < 0 || t >= c->n_tensors)
        return fc_fail(e, "checkpoint read: no parameter %d tensor %d", p, t);
    const fc_param *P = &c->model.params[p];
    if (first > P->numel || n > P->numel - first)
        return fc_fail(e, "checkpoint read: %s elements [%" PRIu64 ", +%" PRIu64 ") out of range", P->name, first, n);
    if (n == 0) return 0;
    if (c->man.kind == FC_STATE_DICT_FULL)
        return st_read(c, t == 0 ? c->model_file : c->optim_file, c->full[t * c->model.n_params + p], first, n, dst, e);
    return read_unit_sharded(c, P->unit, t, P->unit_offset + first, n, dst, e);
}

int fc_ckpt_read_unit(fc_ckpt *c, int u, int t, uint64_t first, uint64_t n, float *dst, fc_error *e) {
    if (u < 0 || u >= c->model.n_units || t < 0 || t >= c->n_tensors)
        return fc_fail(e, "checkpoint read: no unit %d tensor %d", u, t);
    const fc_unit *U = &c->model.units[u];
    if (first > U->numel || n > U->numel - first)
        return fc_fail(e, "checkpoint read: unit %d elements [%" PRIu64 ", +%" PRIu64 ") out of range", u, first, n);
    if (n == 0) return 0;
    if (c->man.kind == FC_STATE_DICT_SHARDED) return read_unit_sharded(c, u, t, first, n, dst, e);
    uint64_t end = first + n;
    for (int k = 0; k < U->n_params; k++) {
        int pi = c->model.unit_params[U->first_param + k];
        const fc_param *p = &c->model.params[pi];
        uint64_t a = p->unit_offset, b = a + p->numel;
        uint64_t lo = a > first ? a : first, hi = b < end ? b : end;
        if (lo >= hi) continue;
        if (fc_ckpt_read(c, pi, t, lo - a, hi - lo, dst + (lo - first), e)) return -1;
    }
    return 0;
}

int fc_ckpt_check_compatible(const fc_ckpt *c, const fc_run_config *cfg, fc_error *e) {
    const char *src = c->src[0] ? c->src : "checkpoint";
    const fc_run_config *saved = &c->man.cfg;
    if (!fc_model_config_equal(&saved->model, &cfg->model))
        return fc_fail(e, "%s: saved from model %s; this run's --model is %s", src, describe(&saved->model).s,
                       describe(&cfg->model).s);
    const char *names[2];
    int n = fc_optim_state_names(&cfg->optim, names);
    int same = saved->optim.kind == cfg->optim.kind && n == c->man.n_state;
    for (int i = 0; same && i < n; i++) same = strcmp(names[i], c->man.state_names[i]) == 0;
    if (!same)
        return fc_fail(e, "%s: saved with optimizer %s keeping %d state tensor(s); this run's %s keeps %d",
                       src, fc_opt_name(saved->optim.kind), c->man.n_state, fc_opt_name(cfg->optim.kind), n);
    return 0;
}

// ---------------------------------------------------------------------------
// writing

void fc_ckpt_chunk(size_t n, int W, int r, size_t *first, size_t *count) {
    size_t S = (n + (size_t)W - 1) / (size_t)W, a = (size_t)r * S;
    *first = a;
    *count = a >= n ? 0 : (n - a < S ? n - a : S);
}

// Names an earlier checkpoint (or an interrupted save) may have left.
static int is_ckpt_file(const char *name) {
    const char *known[] = {FC_CKPT_MANIFEST, "config.json", "model.safetensors", "optimizer.safetensors"};
    char base[256];
    snprintf(base, sizeof base, "%s", name);
    char *tmp = strstr(base, ".tmp.");  // "<name>.tmp.<pid>": a temporary of a crashed write
    if (tmp) *tmp = '\0';
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(base, known[i])) return 1;
    return shard_index(base) >= 0;
}

int fc_ckpt_prepare_dir(const char *dir, fc_error *e) {
    if (fc_mkdir_p(dir, e)) return -1;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, FC_CKPT_MANIFEST);
    // the manifest goes first: from here on the old checkpoint no longer verifies
    int was_ckpt = unlink(path) == 0;
    if (!was_ckpt && errno != ENOENT)
        return fc_fail(e, "%s: cannot remove the old manifest: %s", path, strerror(errno));
    fc_fsync_dir(dir);
    // then the old checkpoint's files, so no stale shard outlives it, and
    // temporaries of interrupted saves; a directory that held no checkpoint
    // keeps its files (a model.safetensors of someone else's, say)
    DIR *d = opendir(dir);
    if (!d) return fc_fail(e, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (!is_ckpt_file(ent->d_name) || (!was_ckpt && !strstr(ent->d_name, ".tmp."))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (unlink(path) != 0 && errno != ENOENT) {
            int err = errno;
            closedir(d);
            return fc_fail(e, "%s: cannot remove: %s", path, strerror(err));
        }
    }
    closedir(d);
    return 0;
}

// Size and SHA-256 of a file just written, read back from what is on disk.
static int describe_file(const char *dir, const char *name, fc_ckpt_file *out, fc_error *e) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(out->name, sizeof out->name, "%s", name);
    return fc_sha256_file(path, &out->bytes, out->sha256, e);
}

int fc_ckpt_write_config(const char *dir, const fc_ckpt_info *info, fc_ckpt_file *out, fc_error *e) {
    cJSON *j = fc_model_config_to_json(&info->cfg->model);
    char *text = cJSON_Print(j);
    jsonCheck(text);
    cJSON_Delete(j);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, CONFIG_NAME);
    size_t len = strlen(text);
    int rc = fc_write_file_atomic(path, text, len, e);
    if (!rc) {
        snprintf(out->name, sizeof out->name, "%s", CONFIG_NAME);
        out->bytes = len;
        fc_sha256_mem(text, len, out->sha256);
    }
    free(text);
    return rc;
}

static fc_st_entry param_entry(const fc_param *p, const char *name, const float *base) {
    return (fc_st_entry){name, FC_DT_F32, p->ndim, {(uint64_t)p->shape[0], (uint64_t)p->shape[1]}, base + p->offset};
}

int fc_ckpt_write_full_files(const char *dir, const fc_ckpt_info *info, const float *params,
                             const float *const state[2], fc_ckpt_file out[2], fc_error *e) {
    const fc_model *m = info->m;
    const char *names[2];
    int n_state = fc_optim_state_names(&info->cfg->optim, names);
    // room for the model's entries, and for the step plus every state's
    fc_st_entry *ent = callocCheck((size_t)(m->n_params + 1 + n_state * m->n_params), sizeof *ent);
    char **owned = callocCheck((size_t)(n_state * m->n_params + 1), sizeof *owned);
    char path[1200], step_text[32];
    // model.safetensors: model names in registration order (Hugging Face's)
    for (int i = 0; i < m->n_params; i++) ent[i] = param_entry(&m->params[i], m->params[i].name, params);
    fc_st_meta_kv pt[] = {{"format", "pt"}};
    snprintf(path, sizeof path, "%s/%s", dir, MODEL_NAME);
    int rc = fc_st_write(path, ent, m->n_params, pt, 1, e);
    if (!rc) rc = describe_file(dir, MODEL_NAME, &out[0], e);
    // optimizer.safetensors: the step, then "<state>.<name>" per state and parameter
    int64_t step = info->step;
    int n = 0, k = 0;
    ent[n++] = (fc_st_entry){"step", FC_DT_I64, 0, {0}, &step};
    for (int s = 0; s < n_state; s++)
        for (int i = 0; i < m->n_params; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s.%s", names[s], m->params[i].name);
            owned[k] = strdupCheck(name);
            ent[n++] = param_entry(&m->params[i], owned[k++], state[s]);
        }
    char opt_name[32];
    snprintf(step_text, sizeof step_text, "%ld", info->step);
    snprintf(opt_name, sizeof opt_name, "%s", fc_opt_name(info->cfg->optim.kind));
    fc_st_meta_kv meta[] = {{"format", "fsdpcheck-optimizer"}, {"optimizer", opt_name}, {"step", step_text}};
    snprintf(path, sizeof path, "%s/%s", dir, OPTIM_NAME);
    if (!rc) rc = fc_st_write(path, ent, n, meta, 3, e);
    if (!rc) rc = describe_file(dir, OPTIM_NAME, &out[1], e);
    for (int i = 0; i < k; i++) free(owned[i]);
    free(owned);
    free(ent);
    return rc;
}

int fc_ckpt_write_shard(const char *dir, int index, const fc_ckpt_info *info,
                        const fc_ckpt_chunk_data *chunks, int n, fc_ckpt_file *out, fc_error *e) {
    const fc_model *m = info->m;
    const char *names[2];
    int n_state = fc_optim_state_names(&info->cfg->optim, names);
    int cap = n * (1 + n_state);
    fc_st_entry *ent = callocCheck((size_t)(cap ? cap : 1), sizeof *ent);
    fc_st_meta_kv *meta = callocCheck((size_t)cap + 4, sizeof *meta);
    char step[32], rank[32], world[32];
    snprintf(step, sizeof step, "%ld", info->step);
    snprintf(rank, sizeof rank, "%d", index);
    snprintf(world, sizeof world, "%d", info->world_size);
    int ne = 0, nm = 0;
    meta[nm++] = (fc_st_meta_kv){"format", FC_CKPT_SHARD_FORMAT};
    meta[nm++] = (fc_st_meta_kv){"step", step};
    meta[nm++] = (fc_st_meta_kv){"rank", rank};
    meta[nm++] = (fc_st_meta_kv){"world_size", world};
    for (int c = 0; c < n; c++) {
        const fc_ckpt_chunk_data *ch = &chunks[c];
        if (ch->count == 0) continue;
        const fc_unit *U = &m->units[ch->unit];
        for (int t = 0; t <= n_state; t++) {
            const char *tname = t == 0 ? "param" : names[t - 1];
            char name[96];
            snprintf(name, sizeof name, "unit%d.%s", ch->unit, tname);
            // the layout of this chunk, under the tensor's own name
            cJSON *j = cJSON_CreateObject();
            jsonCheck(j);
            jsonCheck(cJSON_AddNumberToObject(j, "unit", ch->unit));
            jsonCheck(cJSON_AddStringToObject(j, "unit_name", U->name));
            jsonCheck(cJSON_AddStringToObject(j, "tensor", tname));
            jsonCheck(cJSON_AddNumberToObject(j, "first", (double)ch->first));
            jsonCheck(cJSON_AddNumberToObject(j, "count", (double)ch->count));
            jsonCheck(cJSON_AddNumberToObject(j, "unit_numel", (double)U->numel));
            char *layout = cJSON_PrintUnformatted(j);
            jsonCheck(layout);
            cJSON_Delete(j);
            char *owned = strdupCheck(name);
            meta[nm++] = (fc_st_meta_kv){owned, layout};
            ent[ne++] = (fc_st_entry){owned, FC_DT_F32, 1, {ch->count}, t == 0 ? ch->param : ch->state[t - 1]};
        }
    }
    char file[64], path[1200];
    snprintf(file, sizeof file, "shard-%05d.safetensors", index);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = fc_st_write(path, ent, ne, meta, nm, e);
    if (!rc) rc = describe_file(dir, file, out, e);
    for (int i = 4; i < nm; i++) {
        free(meta[i].key);  // also the entry's name
        cJSON_free(meta[i].value);
    }
    free(meta);
    free(ent);
    return rc;
}

static cJSON *raw_uint(uint64_t v) {
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64, v);
    cJSON *r = cJSON_CreateRaw(num);  // exact, never "1e+15"
    jsonCheck(r);
    return r;
}

int fc_ckpt_write_manifest(const char *dir, const fc_ckpt_info *info, fc_state_dict kind,
                           const fc_ckpt_file *files, int n, fc_error *e) {
    const fc_run_config *cfg = info->cfg;
    cJSON *j = cJSON_CreateObject();
    jsonCheck(j);
    cJSON_AddStringToObject(j, "format", FC_CKPT_FORMAT);
    cJSON_AddNumberToObject(j, "version", FC_CKPT_VERSION);
    cJSON_AddStringToObject(j, "state_dict", fc_state_dict_name(kind));
    cJSON_AddItemToObject(j, "step", raw_uint((uint64_t)info->step));
    // data is a pure function of (seed, step, sample): the next step is the position
    cJSON_AddItemToObject(j, "data_position", raw_uint((uint64_t)info->step));
    cJSON_AddNumberToObject(j, "world_size", info->world_size);
    cJSON_AddStringToObject(j, "strategy", fc_strategy_name(info->strategy));
    cJSON_AddStringToObject(j, "model", cfg->model.name);
    cJSON *opt = cJSON_AddObjectToObject(j, "optimizer");
    jsonCheck(opt);
    cJSON_AddStringToObject(opt, "kind", fc_opt_name(cfg->optim.kind));
    const char *names[2];
    int n_state = fc_optim_state_names(&cfg->optim, names);
    cJSON *st = cJSON_AddArrayToObject(opt, "state");
    jsonCheck(st);
    for (int i = 0; i < n_state; i++) cJSON_AddItemToArray(st, cJSON_CreateString(names[i]));
    cJSON_AddItemToObject(j, "config", fc_run_config_to_json(cfg));
    cJSON *arr = cJSON_AddArrayToObject(j, "files");
    jsonCheck(arr);
    for (int i = 0; i < n; i++) {
        cJSON *f = cJSON_CreateObject();
        jsonCheck(f);
        cJSON_AddStringToObject(f, "name", files[i].name);
        cJSON_AddItemToObject(f, "bytes", raw_uint(files[i].bytes));
        cJSON_AddStringToObject(f, "sha256", files[i].sha256);
        cJSON_AddItemToArray(arr, f);
    }
    char *text = cJSON_Print(j);
    jsonCheck(text);
    cJSON_Delete(j);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, FC_CKPT_MANIFEST);
    int rc = fc_write_file_atomic(path, text, strlen(text), e);
    free(text);
    return rc;
}

int fc_ckpt_save_full(const char *dir, const fc_ckpt_info *info, const float *params,
                      const float *const state[2], fc_error *e) {
    fc_ckpt_file files[3];
    if (fc_ckpt_prepare_dir(dir, e) || fc_ckpt_write_config(dir, info, &files[0], e) ||
        fc_ckpt_write_full_files(dir, info, params, state, &files[1], e))
        return -1;
    return fc_ckpt_write_manifest(dir, info, FC_STATE_DICT_FULL, files, 3, e);
}
