// tests/unit/test_safetensors.c — the safetensors reader and writer.
//
// Malformed files are built on the fly (header text + a data section of a
// chosen length) into a mkdtemp directory and into memory, so no binary test
// data is committed. Every malformed case asserts on a distinctive piece of
// its own message: if a different check fires first, the test fails.
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

// ----------------------------------------------------------------------------
// helpers

static char *make_tmpdir(void) {
    char *dir = strdupCheck("/tmp/fc_test_st_XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp failed");
    return dir;
}

// Removes a directory tree that is at most two levels deep (all we create).
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..")) n++;
    }
    closedir(d);
    return n;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "cannot create %s", path);
    cr_assert_eq(fwrite(p, 1, n, fp), n);
    cr_assert_eq(fclose(fp), 0);
}

static uint8_t *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = mallocCheck((size_t)len + 1);
    cr_assert_eq(fread(buf, 1, (size_t)len, fp), (size_t)len);
    buf[len] = '\0';  // so the header can be searched with strstr
    fclose(fp);
    *n = (size_t)len;
    return buf;
}

static int is_zeroed(const fc_st_file *f) {
    return f->fp == NULL && f->mem == NULL && f->tensors == NULL && f->meta == NULL &&
           f->n_tensors == 0 && f->n_meta == 0 && f->file_size == 0 && f->data_start == 0;
}

// One file image to build: the 8-byte length, the header, then data_len bytes
// of data. Headers are written with ' for " to keep the table readable.
typedef struct {
    const char *what;      // what is wrong, for failure messages
    const char *header;    // header text, ' standing for "
    size_t header_len;     // 0: strlen(header); set for headers with a NUL byte
    size_t data_len;       // bytes of data after the header
    int raw_n;             // 1: write n_field as the length instead of the real one
    uint64_t n_field;
    size_t keep;           // nonzero: cut the image to its first keep bytes
    const char *expect;    // a distinctive piece of the expected message
} image_spec;

static uint8_t *build_image(const image_spec *s, size_t *size) {
    size_t hl = s->header_len ? s->header_len : strlen(s->header);
    size_t total = 8 + hl + s->data_len;
    uint8_t *img = mallocCheck(total);
    uint64_t n = s->raw_n ? s->n_field : hl;
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)(n >> (8 * i));
    for (size_t i = 0; i < hl; i++) img[8 + i] = s->header[i] == '\'' ? '"' : (uint8_t)s->header[i];
    for (size_t i = 0; i < s->data_len; i++) img[8 + hl + i] = (uint8_t)(i * 7 + 1);
    *size = s->keep ? s->keep : total;
    return img;
}

// ----------------------------------------------------------------------------
// malformed files

#define T_A "'a':{'dtype':'F32','shape':[2,2],'data_offsets':[0,16]}"

static const image_spec bad_cases[] = {
    {"file shorter than 8 bytes", "{}", 0, 0, 0, 0, 5, "5 bytes, shorter than the 8-byte header length"},
    {"header length 0", "", 0, 0, 1, 0, 0, "header length is 0"},
    {"header length above the limit", "{}", 0, 0, 1, UINT64_MAX, 0, "exceeds the limit of 100000000 bytes"},
    {"header length past end of file", "{}", 0, 0, 1, 100, 0, "header length 100 runs past the end of the file (10 bytes"},
    {"invalid JSON", "{'a':", 0, 0, 0, 0, 0, "header is not valid JSON (parse error near byte 4 of 5)"},
    {"JSON array, not object", "[1,2]", 0, 0, 0, 0, 0, "header is an array, not a JSON object"},
    {"trailing garbage after JSON", "{}  x", 0, 0, 0, 0, 0, "trailing byte 0x78 at offset 4"},
    {"trailing newline after JSON", "{}\n ", 0, 0, 0, 0, 0, "trailing byte 0x0a at offset 2"},
    {"invalid UTF-8 byte", "{'\xff':{}}", 0, 0, 0, 0, 0, "not valid UTF-8 (byte 0xff at offset 2)"},
    {"overlong UTF-8", "{'\xc0\xaf':{}}", 0, 0, 0, 0, 0, "not valid UTF-8 (byte 0xc0 at offset 2)"},
    {"UTF-8 surrogate", "{'\xed\xa0\x80':{}}", 0, 0, 0, 0, 0, "not valid UTF-8 (byte 0xed"},
    {"NUL byte in header", "{'a\0b':{}}", 10, 0, 0, 0, 0, "control byte 0x00 at offset 3"},
    {"entry not an object", "{'a':5}", 0, 0, 0, 0, 0, "tensor 'a': entry is a number, not an object"},
    {"missing dtype", "{'a':{'shape':[2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': missing key 'dtype'"},
    {"missing shape", "{'a':{'dtype':'F32','data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': missing key 'shape'"},
    {"missing data_offsets", "{'a':{'dtype':'F32','shape':[2]}}", 0, 8, 0, 0, 0, "tensor 'a': missing key 'data_offsets'"},
    {"unknown key", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8],'extra':1}}", 0, 8, 0, 0, 0, "tensor 'a': unknown key 'extra'"},
    {"key in the wrong case", "{'a':{'DType':'F32','shape':[2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': unknown key 'DType'"},
    {"duplicate key in entry", "{'a':{'dtype':'F32','dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': duplicate key 'dtype'"},
    {"unknown dtype", "{'a':{'dtype':'F8','shape':[2],'data_offsets':[0,2]}}", 0, 2, 0, 0, 0, "tensor 'a': unknown dtype 'F8'"},
    {"lower-case dtype", "{'a':{'dtype':'f32','shape':[2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': unknown dtype 'f32'"},
    {"dtype not a string", "{'a':{'dtype':4,'shape':[2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': dtype is a number, not a string"},
    {"shape not an array", "{'a':{'dtype':'F32','shape':2,'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': shape is a number, not an array"},
    {"too many dimensions", "{'a':{'dtype':'U8','shape':[1,1,1,1,1,1,1,1,1],'data_offsets':[0,1]}}", 0, 1, 0, 0, 0, "shape has 9 dimensions, at most 8"},
    {"negative dimension", "{'a':{'dtype':'F32','shape':[1,-2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': shape[1] = -2 is negative"},
    {"fractional dimension", "{'a':{'dtype':'F32','shape':[1.5],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': shape[0] = 1.5 is not an integer"},
    {"dimension above 2^53", "{'a':{'dtype':'F32','shape':[1e300],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "shape[0] = 1.0000000000000001e+300 is larger than 2^53"},
    {"dimension not a number", "{'a':{'dtype':'F32','shape':['2'],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "tensor 'a': shape[0] is a string, not a number"},
    {"element count overflows", "{'a':{'dtype':'U8','shape':[4294967296,4294967296],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "shape [4294967296,4294967296] has more elements than fit in 64 bits"},
    {"byte size overflows", "{'a':{'dtype':'F64','shape':[2147483648,2147483648],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "F64 [2147483648,2147483648] is too large: its byte size overflows"},
    {"data_offsets not an array", "{'a':{'dtype':'F32','shape':[2],'data_offsets':'0-8'}}", 0, 8, 0, 0, 0, "tensor 'a': data_offsets is a string, not an array"},
    {"data_offsets of 3 elements", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8,8]}}", 0, 8, 0, 0, 0, "data_offsets has 3 elements, expected exactly 2"},
    {"negative data offset", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[-1,8]}}", 0, 8, 0, 0, 0, "tensor 'a': data_offsets[0] = -1 is negative"},
    {"fractional data offset", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8.5]}}", 0, 8, 0, 0, 0, "tensor 'a': data_offsets[1] = 8.5 is not an integer"},
    {"begin after end", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[8,0]}}", 0, 8, 0, 0, 0, "data_offsets [8,0] have begin > end"},
    {"offsets past the data section", "{'a':{'dtype':'F32','shape':[2,2],'data_offsets':[0,16]}}", 0, 12, 0, 0, 0, "data_offsets [0,16] run past the end of the data section (12 bytes)"},
    {"byte count does not match shape", "{'a':{'dtype':'F32','shape':[2,2],'data_offsets':[0,12]}}", 0, 12, 0, 0, 0, "tensor 'a': data_offsets [0,12] hold 12 bytes but F32 [2,2] needs 16"},
    {"overlapping tensors", "{" T_A ",'b':{'dtype':'F32','shape':[2],'data_offsets':[8,16]}}", 0, 16, 0, 0, 0, "tensor 'b' data_offsets [8,16] overlap tensor 'a' [0,16]"},
    {"zero-size tensor inside another", "{" T_A ",'z':{'dtype':'F32','shape':[0],'data_offsets':[4,4]}}", 0, 16, 0, 0, 0, "tensor 'z' data_offsets [4,4] overlap tensor 'a' [0,16]"},
    {"hole between tensors", "{'a':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},'b':{'dtype':'F32','shape':[2],'data_offsets':[12,20]}}", 0, 20, 0, 0, 0, "bytes [8,12) of the data section belong to no tensor (a hole before tensor 'b')"},
    {"trailing data bytes", "{" T_A "}", 0, 20, 0, 0, 0, "data section has 20 bytes but the tensors cover only [0,16): 4 trailing bytes"},
    {"data with no tensors", "{}", 0, 8, 0, 0, 0, "cover only [0,0): 8 trailing bytes"},
    {"duplicate tensor name", "{" T_A "," T_A "}", 0, 16, 0, 0, 0, "duplicate tensor name 'a'"},
    {"empty tensor name", "{'':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "empty tensor name"},
    {"__metadata__ not an object", "{'__metadata__':['x']," T_A "}", 0, 16, 0, 0, 0, "__metadata__ is an array, not an object of strings"},
    {"__metadata__ value not a string", "{'__metadata__':{'step':7}," T_A "}", 0, 16, 0, 0, 0, "__metadata__ value for key 'step' is a number, not a string"},
    {"duplicate __metadata__", "{'__metadata__':{},'__metadata__':{}," T_A "}", 0, 16, 0, 0, 0, "duplicate __metadata__ in header"},
    {"duplicate __metadata__ key", "{'__metadata__':{'k':'1','k':'2'}," T_A "}", 0, 16, 0, 0, 0, "duplicate __metadata__ key 'k'"},
    {"control character in a name", "{'a\nb':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 0, 8, 0, 0, 0, "control byte 0x0a at offset 3"},
    {"lone surrogate escape", "{'\\ud800':{}}", 0, 0, 0, 0, 0, "not valid JSON (parse error near byte 2 of 13)"},
};
#define N_BAD_CASES ((int)(sizeof bad_cases / sizeof bad_cases[0]))

// The base of most cases, unbroken, opens: so each case above fails for its
// own defect and not because the builder is wrong.
Test(safetensors, builder_baseline_opens) {
    const image_spec specs[] = {
        {"baseline", "{" T_A "}", 0, 16, 0, 0, 0, NULL},
        {"trailing spaces", "{" T_A "}     ", 0, 16, 0, 0, 0, NULL},
        {"whitespace inside", " {\n\t'a' : {'dtype':'F32', 'shape':[2, 2],\r\n'data_offsets':[0, 16]}}", 0, 16, 0, 0, 0, NULL},
        {"empty", "{}", 0, 0, 0, 0, 0, NULL},
        {"metadata only", "{'__metadata__':{'k':'v','':''}}", 0, 0, 0, 0, 0, NULL},
        {"utf-8 name", "{'\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80':{'dtype':'U8','shape':[3],'data_offsets':[0,3]}}", 0, 3, 0, 0, 0, NULL},
        {"zero-size at both ends", "{'z0':{'dtype':'F32','shape':[0,3],'data_offsets':[0,0]}," T_A ",'z1':{'dtype':'I8','shape':[5,0],'data_offsets':[16,16]}}", 0, 16, 0, 0, 0, NULL},
        {"1e1 as a dimension", "{'a':{'dtype':'U8','shape':[1e1],'data_offsets':[0,10]}}", 0, 10, 0, 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        size_t size;
        uint8_t *img = build_image(&specs[i], &size);
        fc_st_file f;
        fc_error e = {{0}};
        cr_expect_eq(fc_st_open_mem(img, size, &f, &e), 0, "%s: %s", specs[i].what, e.msg);
        fc_st_close(&f);
        free(img);
    }
}

Test(safetensors, malformed_files_refused_with_specific_messages) {
    char *dir = make_tmpdir();
    for (int i = 0; i < N_BAD_CASES; i++) {
        const image_spec *c = &bad_cases[i];
        size_t size;
        uint8_t *img = build_image(c, &size);

        // in memory
        fc_st_file f;
        memset(&f, 0x5a, sizeof f);  // garbage in: open must zero it even on failure
        fc_error e = {{0}};
        int rc = fc_st_open_mem(img, size, &f, &e);
        cr_expect_eq(rc, -1, "case '%s' (mem): accepted", c->what);
        cr_expect(strstr(e.msg, c->expect) != NULL, "case '%s' (mem): message '%s' lacks '%s'",
                  c->what, e.msg, c->expect);
        cr_expect(strncmp(e.msg, "(memory): ", 10) == 0, "case '%s': '%s'", c->what, e.msg);
        cr_expect(strchr(e.msg, '\n') == NULL, "case '%s': message is not one line", c->what);
        cr_expect(is_zeroed(&f), "case '%s' (mem): f not zeroed after failure", c->what);
        if (rc == 0) fc_st_close(&f);

        // as a file
        char path[256];
        snprintf(path, sizeof path, "%s/bad%02d.safetensors", dir, i);
        write_bytes(path, img, size);
        memset(&f, 0x5a, sizeof f);
        memset(&e, 0, sizeof e);
        rc = fc_st_open(path, &f, &e);
        cr_expect_eq(rc, -1, "case '%s' (file): accepted", c->what);
        cr_expect(strstr(e.msg, c->expect) != NULL, "case '%s' (file): message '%s' lacks '%s'",
                  c->what, e.msg, c->expect);
        cr_expect(strncmp(e.msg, path, strlen(path)) == 0, "case '%s': message '%s' lacks the path",
                  c->what, e.msg);
        cr_expect(is_zeroed(&f), "case '%s' (file): f not zeroed after failure", c->what);
        if (rc == 0) fc_st_close(&f);
        free(img);
    }
    remove_tree(dir);
    free(dir);
}

// Every case has its own message: no two expectations are the same text, so
// a check that fires for the wrong reason cannot pass by accident.
Test(safetensors, malformed_cases_are_distinct) {
    cr_assert_geq(N_BAD_CASES, 40);
    for (int i = 0; i < N_BAD_CASES; i++) {
        for (int j = i + 1; j < N_BAD_CASES; j++) {
            cr_expect(strcmp(bad_cases[i].expect, bad_cases[j].expect) != 0, "cases %d and %d", i, j);
        }
    }
}

Test(safetensors, open_refuses_missing_file_and_directory) {
    fc_st_file f;
    fc_error e = {{0}};
    cr_assert_eq(fc_st_open("/nonexistent/dir/x.safetensors", &f, &e), -1);
    cr_expect(strstr(e.msg, "/nonexistent/dir/x.safetensors: cannot open") != NULL, "%s", e.msg);
    cr_expect(is_zeroed(&f));
    char *dir = make_tmpdir();
    cr_assert_eq(fc_st_open(dir, &f, &e), -1);
    cr_expect(strstr(e.msg, "not a regular file") != NULL, "%s", e.msg);
    cr_expect(is_zeroed(&f));
    remove_tree(dir);
    free(dir);
}

// ----------------------------------------------------------------------------
// round trip

static const float w_vals[6] = {0.0f, 0.5f, -1.0f, 1.5f, 2.0f, -3.25f};
static const uint16_t bf_bits[5] = {0x3F80, 0xC000, 0x3FC0, 0x0000, 0x7F80};  // 1 -2 1.5 0 inf
static const float bf_vals[5] = {1.0f, -2.0f, 1.5f, 0.0f, INFINITY};
static const uint16_t h_bits[4] = {0x3C00, 0xC000, 0x3E00, 0x7BFF};  // 1 -2 1.5 65504
static const float h_vals[4] = {1.0f, -2.0f, 1.5f, 65504.0f};
static const float scalar_val = 42.5f;
static const int64_t ids_vals[3] = {-1, 0, (int64_t)1 << 40};
static const uint8_t mask_vals[3] = {1, 0, 1};
static const uint8_t bytes_vals[5] = {1, 2, 3, 4, 5};
static const double d_vals[2] = {3.141592653589793, -1e300};

#define N_RT 10
static void rt_entries(fc_st_entry en[N_RT]) {
    memset(en, 0, N_RT * sizeof en[0]);
    en[0] = (fc_st_entry){"w", FC_DT_F32, 2, {2, 3}, w_vals};
    en[1] = (fc_st_entry){"bf", FC_DT_BF16, 1, {5}, bf_bits};
    en[2] = (fc_st_entry){"bytes", FC_DT_U8, 1, {5}, bytes_vals};  // odd size: misaligns the rest
    en[3] = (fc_st_entry){"h", FC_DT_F16, 2, {2, 2}, h_bits};
    en[4] = (fc_st_entry){"scalar", FC_DT_F32, 0, {0}, &scalar_val};
    en[5] = (fc_st_entry){"empty", FC_DT_F32, 2, {0, 4}, NULL};
    en[6] = (fc_st_entry){"ids", FC_DT_I64, 1, {3}, ids_vals};
    en[7] = (fc_st_entry){"mask", FC_DT_BOOL, 1, {3}, mask_vals};
    en[8] = (fc_st_entry){"d", FC_DT_F64, 1, {2}, d_vals};
    en[9] = (fc_st_entry){"layer.0.empty", FC_DT_I8, 1, {0}, NULL};
}

static const fc_st_meta_kv rt_meta[2] = {{"format", "pt"}, {"step", "7"}};

static void check_round_trip(fc_st_file *f) {
    fc_st_entry en[N_RT];
    rt_entries(en);
    fc_error e = {{0}};
    cr_assert_eq(f->n_tensors, N_RT);
    cr_assert_eq(f->n_meta, 2);
    cr_expect_str_eq(fc_st_meta(f, "format"), "pt");
    cr_expect_str_eq(fc_st_meta(f, "step"), "7");
    cr_expect_null(fc_st_meta(f, "absent"));
    cr_expect_eq(f->data_start % 8, 0, "data section not 8-byte aligned");
    // kept in data-offset order, and here that is the order of writing
    for (int i = 0; i < N_RT; i++) {
        cr_expect_str_eq(f->tensors[i].name, en[i].name);
        if (i > 0) cr_expect_geq(f->tensors[i].begin, f->tensors[i - 1].end);
    }
    cr_expect_null(fc_st_find(f, "absent"));
    for (int i = 0; i < N_RT; i++) {
        const fc_st_tensor *t = fc_st_find(f, en[i].name);
        cr_assert_not_null(t, "%s missing", en[i].name);
        cr_expect_eq(t->dtype, en[i].dtype, "%s", en[i].name);
        cr_expect_eq(t->ndim, en[i].ndim, "%s", en[i].name);
        uint64_t numel = 1;
        for (int d = 0; d < en[i].ndim; d++) {
            cr_expect_eq(t->shape[d], en[i].shape[d]);
            numel *= en[i].shape[d];
        }
        cr_expect_eq(t->numel, numel, "%s", en[i].name);
        size_t nbytes = numel * fc_dtype_size(t->dtype);
        cr_expect_eq(t->end - t->begin, nbytes);
        uint8_t buf[64];
        cr_assert_leq(nbytes, sizeof buf);
        cr_assert_eq(fc_st_read(f, t, 0, numel, buf, &e), 0, "%s: %s", en[i].name, e.msg);
        if (nbytes) cr_expect(memcmp(buf, en[i].data, nbytes) == 0, "%s data differs", en[i].name);
    }
    // an element range of a tensor, raw and as float
    float got[6];
    const fc_st_tensor *w = fc_st_find(f, "w");
    cr_assert_eq(fc_st_read(f, w, 2, 3, got, &e), 0, "%s", e.msg);
    for (int i = 0; i < 3; i++) cr_expect_eq(got[i], w_vals[2 + i]);
    cr_assert_eq(fc_st_read_f32(f, w, 1, 5, got, &e), 0, "%s", e.msg);
    for (int i = 0; i < 5; i++) cr_expect_eq(got[i], w_vals[1 + i]);
    cr_assert_eq(fc_st_read_f32(f, fc_st_find(f, "bf"), 0, 5, got, &e), 0, "%s", e.msg);
    for (int i = 0; i < 5; i++) cr_expect_eq(got[i], bf_vals[i], "bf[%d] = %g", i, got[i]);
    cr_assert_eq(fc_st_read_f32(f, fc_st_find(f, "bf"), 3, 2, got, &e), 0, "%s", e.msg);
    cr_expect_eq(got[0], 0.0f);
    cr_expect(isinf(got[1]) && got[1] > 0);
    cr_assert_eq(fc_st_read_f32(f, fc_st_find(f, "h"), 0, 4, got, &e), 0, "%s", e.msg);
    for (int i = 0; i < 4; i++) cr_expect_eq(got[i], h_vals[i], "h[%d] = %g", i, got[i]);
    cr_assert_eq(fc_st_read_f32(f, fc_st_find(f, "scalar"), 0, 1, got, &e), 0, "%s", e.msg);
    cr_expect_eq(got[0], scalar_val);
    cr_expect_eq(fc_st_read_f32(f, fc_st_find(f, "empty"), 0, 0, got, &e), 0, "%s", e.msg);
    // only float types convert
    cr_expect_eq(fc_st_read_f32(f, fc_st_find(f, "ids"), 0, 1, got, &e), -1);
    cr_expect(strstr(e.msg, "tensor 'ids' is I64; only F32, BF16 and F16") != NULL, "%s", e.msg);
    cr_expect_eq(fc_st_read_f32(f, fc_st_find(f, "d"), 0, 1, got, &e), -1);
    cr_expect(strstr(e.msg, "is F64") != NULL, "%s", e.msg);
}

Test(safetensors, round_trip_file_and_memory) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    fc_st_entry en[N_RT];
    rt_entries(en);
    fc_error e = {{0}};
    cr_assert_eq(fc_st_write(path, en, N_RT, rt_meta, 2, &e), 0, "%s", e.msg);
    cr_expect_eq(count_entries(dir), 1, "temporary file left behind");

    fc_st_file f;
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    cr_expect_not_null(f.fp);
    check_round_trip(&f);
    fc_st_close(&f);
    cr_expect(is_zeroed(&f));
    fc_st_close(&f);  // closing twice is harmless

    size_t size;
    uint8_t *img = read_bytes(path, &size);
    cr_assert_eq(fc_st_open_mem(img, size, &f, &e), 0, "%s", e.msg);
    cr_expect_eq(f.file_size, size);
    check_round_trip(&f);
    fc_st_close(&f);

    // the layout: length, header starting with the metadata, space padding to
    // an 8-byte boundary, then the data
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | img[i];
    cr_expect_eq((8 + n) % 8, 0);
    cr_expect(memcmp(img + 8, "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"7\"},", 43) == 0,
              "header starts '%.50s'", (const char *)img + 8);
    cr_expect(strstr((const char *)img + 8,
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}") != NULL);
    cr_expect(strstr((const char *)img + 8,
                     "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[") != NULL);
    size_t json_end = 8 + (size_t)n;
    while (img[json_end - 1] == ' ') json_end--;
    cr_expect_eq(img[json_end - 1], '}');
    cr_expect_lt(8 + n - json_end, 8, "more padding than needed");
    free(img);
    remove_tree(dir);
    free(dir);
}

// A stream put entry by entry writes fc_st_write's bytes exactly; nothing is at
// the path until commit, and the only file beside it meanwhile is the temporary.
Test(safetensors, stream_writes_the_same_bytes) {
    char *dir = make_tmpdir();
    char path[256], streamed[256];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    snprintf(streamed, sizeof streamed, "%s/streamed.safetensors", dir);
    fc_st_entry en[N_RT], nodata[N_RT];
    rt_entries(en);
    memcpy(nodata, en, sizeof en);
    for (int i = 0; i < N_RT; i++) nodata[i].data = NULL;  // open never reads them
    fc_error e = {{0}};
    cr_assert_eq(fc_st_write(path, en, N_RT, rt_meta, 2, &e), 0, "%s", e.msg);
    fc_st_stream st;
    cr_assert_eq(fc_st_stream_open(&st, streamed, nodata, N_RT, rt_meta, 2, FC_ATOMIC, &e), 0, "%s", e.msg);
    for (int i = 0; i < N_RT; i++) {
        cr_expect_eq(count_entries(dir), 2, "entry %d: the temporary and rt.safetensors", i);
        cr_assert_eq(fc_st_stream_put(&st, en[i].data, &e), 0, "%s", e.msg);
    }
    cr_assert_eq(fc_st_stream_commit(&st, &e), 0, "%s", e.msg);
    cr_expect_eq(count_entries(dir), 2);
    size_t na, nb;
    uint8_t *a = read_bytes(path, &na), *b = read_bytes(streamed, &nb);
    cr_expect(na == nb && memcmp(a, b, na) == 0, "%zu vs %zu bytes, or other bytes", na, nb);
    free(a);
    free(b);
    fc_st_stream_abort(&st);  // after a commit: harmless
    remove_tree(dir);
    free(dir);
}

// Too few entries at commit, one too many, or a NULL one: -1 naming it, and
// nothing left (no file at path, no temporary).
Test(safetensors, stream_misuse_leaves_nothing) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    const uint8_t v[2] = {1, 2};
    fc_st_entry en[2] = {{"a", FC_DT_U8, 1, {2}, NULL}, {"b", FC_DT_U8, 1, {2}, NULL}};
    fc_error e = {{0}};
    fc_st_stream st;
    cr_assert_eq(fc_st_stream_open(&st, path, en, 2, NULL, 0, FC_ATOMIC, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_st_stream_put(&st, v, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_st_stream_commit(&st, &e), -1);
    cr_expect(strstr(e.msg, "1 of 2 entries written: not committed"), "%s", e.msg);
    cr_expect_eq(count_entries(dir), 0);
    cr_expect_eq(fc_st_stream_put(&st, v, &e), -1);  // aborted: closed
    cr_expect(strstr(e.msg, "the stream is not open"), "%s", e.msg);

    cr_assert_eq(fc_st_stream_open(&st, path, en, 2, NULL, 0, FC_ATOMIC, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_st_stream_put(&st, v, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_st_stream_put(&st, v, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_st_stream_put(&st, v, &e), -1);
    cr_expect(strstr(e.msg, "all entries were already written"), "%s", e.msg);
    cr_expect_eq(count_entries(dir), 0);

    cr_assert_eq(fc_st_stream_open(&st, path, en, 2, NULL, 0, FC_ATOMIC, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_st_stream_put(&st, NULL, &e), -1);
    cr_expect(strstr(e.msg, "entry 0: NULL data"), "%s", e.msg);
    cr_expect_eq(count_entries(dir), 0);
    fc_st_stream_abort(&st);
    remove_tree(dir);
    free(dir);
}

Test(safetensors, write_without_metadata_and_empty_file) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    fc_error e = {{0}};
    fc_st_file f;
    // no tensors at all: "{}" padded, no data
    cr_assert_eq(fc_st_write(path, NULL, 0, NULL, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    cr_expect_eq(f.n_tensors, 0);
    cr_expect_eq(f.n_meta, 0);
    cr_expect_eq(f.file_size, 16);
    fc_st_close(&f);
    // overwriting an existing file replaces it
    const uint8_t v[3] = {9, 8, 7};
    fc_st_entry one = {"v", FC_DT_U8, 1, {3}, v};
    cr_assert_eq(fc_st_write(path, &one, 1, NULL, 0, &e), 0, "%s", e.msg);
    size_t size;
    uint8_t *img = read_bytes(path, &size);
    cr_expect(strstr((const char *)img + 8, "__metadata__") == NULL);
    free(img);
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    cr_expect_eq(f.n_tensors, 1);
    uint8_t got[3];
    cr_assert_eq(fc_st_read(&f, &f.tensors[0], 0, 3, got, &e), 0, "%s", e.msg);
    cr_expect(memcmp(got, v, 3) == 0);
    fc_st_close(&f);
    cr_expect_eq(count_entries(dir), 1);
    remove_tree(dir);
    free(dir);
}

// The header need not list tensors in data order; tensors[] is sorted.
Test(safetensors, tensors_sorted_by_offset) {
    const image_spec s = {"reordered",
                          "{'c':{'dtype':'U8','shape':[2],'data_offsets':[6,8]},"
                          "'a':{'dtype':'U8','shape':[4],'data_offsets':[2,6]},"
                          "'b':{'dtype':'U8','shape':[2],'data_offsets':[0,2]}}",
                          0, 8, 0, 0, 0, NULL};
    size_t size;
    uint8_t *img = build_image(&s, &size);
    fc_st_file f;
    fc_error e = {{0}};
    cr_assert_eq(fc_st_open_mem(img, size, &f, &e), 0, "%s", e.msg);
    cr_expect_str_eq(f.tensors[0].name, "b");
    cr_expect_str_eq(f.tensors[1].name, "a");
    cr_expect_str_eq(f.tensors[2].name, "c");
    uint8_t got[4];
    cr_assert_eq(fc_st_read(&f, fc_st_find(&f, "a"), 1, 3, got, &e), 0, "%s", e.msg);
    // data byte i is i*7+1 (see build_image); a starts at byte 2
    for (int i = 0; i < 3; i++) cr_expect_eq(got[i], (uint8_t)((3 + i) * 7 + 1));
    fc_st_close(&f);
    free(img);
}

// Conversion in chunks: a range that crosses the internal buffer boundaries.
Test(safetensors, large_bf16_range_as_float) {
    enum { N = 5000 };
    uint16_t *bits = mallocCheck(N * sizeof *bits);
    for (int i = 0; i < N; i++) bits[i] = (uint16_t)(0x3F80 + (i % 128));  // 1 + k/128
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    fc_st_entry en = {"big", FC_DT_BF16, 2, {50, 100}, bits};
    fc_error e = {{0}};
    cr_assert_eq(fc_st_write(path, &en, 1, NULL, 0, &e), 0, "%s", e.msg);
    fc_st_file f;
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    float *got = mallocCheck(N * sizeof *got);
    cr_assert_eq(fc_st_read_f32(&f, &f.tensors[0], 1000, 3500, got, &e), 0, "%s", e.msg);
    for (int i = 0; i < 3500; i++) {
        float want = 1.0f + (float)((1000 + i) % 128) / 128.0f;
        if (got[i] != want) cr_assert_fail("element %d: %g != %g", 1000 + i, got[i], want);
    }
    fc_st_close(&f);
    free(got);
    free(bits);
    remove_tree(dir);
    free(dir);
}

// ----------------------------------------------------------------------------
// out-of-range reads

Test(safetensors, read_out_of_range_refused) {
    const image_spec s = {"two", "{" T_A ",'b':{'dtype':'BF16','shape':[3],'data_offsets':[16,22]}}",
                          0, 22, 0, 0, 0, NULL};
    size_t size;
    uint8_t *img = build_image(&s, &size);
    fc_st_file f, g;
    fc_error e = {{0}};
    cr_assert_eq(fc_st_open_mem(img, size, &f, &e), 0, "%s", e.msg);
    const fc_st_tensor *a = fc_st_find(&f, "a"), *b = fc_st_find(&f, "b");
    float buf[8];
    cr_expect_eq(fc_st_read(&f, a, 0, 4, buf, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, a, 4, 0, NULL, &e), 0, "an empty range at the end is fine");

    cr_expect_eq(fc_st_read(&f, a, 0, 5, buf, &e), -1);
    cr_expect(strstr(e.msg, "tensor 'a': elements [0, +5) are out of range (it has 4 elements)"), "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, a, 5, 0, buf, &e), -1);
    cr_expect(strstr(e.msg, "elements [5, +0) are out of range"), "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, a, 3, 2, buf, &e), -1);
    cr_expect(strstr(e.msg, "[3, +2) are out of range"), "%s", e.msg);
    // first + count would wrap around to a small number
    cr_expect_eq(fc_st_read(&f, a, UINT64_MAX, 2, buf, &e), -1);
    cr_expect(strstr(e.msg, "out of range"), "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, a, 2, UINT64_MAX - 1, buf, &e), -1);
    cr_expect(strstr(e.msg, "out of range"), "%s", e.msg);
    cr_expect_eq(fc_st_read_f32(&f, b, 1, 3, buf, &e), -1);
    cr_expect(strstr(e.msg, "tensor 'b': elements [1, +3) are out of range (it has 3"), "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, a, 0, 1, NULL, &e), -1);
    cr_expect(strstr(e.msg, "no destination buffer"), "%s", e.msg);

    // a tensor of another file, or no tensor
    cr_assert_eq(fc_st_open_mem(img, size, &g, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, fc_st_find(&g, "a"), 0, 1, buf, &e), -1);
    cr_expect(strstr(e.msg, "does not belong to this safetensors file"), "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, NULL, 0, 1, buf, &e), -1);
    fc_st_close(&g);
    fc_st_close(&f);
    // a closed file
    cr_expect_eq(fc_st_read(&f, a, 0, 1, buf, &e), -1);
    cr_expect(strstr(e.msg, "not open"), "%s", e.msg);
    free(img);
}

// The file shrinks after it was validated: the read reports it, not garbage.
Test(safetensors, read_after_truncation_refused) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    const image_spec s = {"t", "{" T_A "}", 0, 16, 0, 0, 0, NULL};
    size_t size;
    uint8_t *img = build_image(&s, &size);
    write_bytes(path, img, size);
    fc_st_file f;
    fc_error e = {{0}};
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    cr_assert_eq(truncate(path, (off_t)(size - 4)), 0);
    float buf[4];
    cr_expect_eq(fc_st_read(&f, &f.tensors[0], 0, 2, buf, &e), 0, "%s", e.msg);
    cr_expect_eq(fc_st_read(&f, &f.tensors[0], 0, 4, buf, &e), -1);
    cr_expect(strstr(e.msg, "tensor 'a': short read of 16 bytes"), "%s", e.msg);
    fc_st_close(&f);
    free(img);
    remove_tree(dir);
    free(dir);
}

// ----------------------------------------------------------------------------
// writer failures leave nothing behind

Test(safetensors, write_into_missing_directory_fails_cleanly) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", dir);
    const uint8_t v[2] = {1, 2};
    fc_st_entry en = {"v", FC_DT_U8, 1, {2}, v};
    fc_error e = {{0}};
    cr_assert_eq(fc_st_write(path, &en, 1, NULL, 0, &e), -1);
    cr_expect(strstr(e.msg, "cannot create") && strstr(e.msg, "x.safetensors.tmp."), "%s", e.msg);
    cr_expect_eq(count_entries(dir), 0);
    remove_tree(dir);
    free(dir);
}

// The rename is the last step; when it fails the complete temporary is removed.
Test(safetensors, write_rename_failure_removes_temporary) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    cr_assert_eq(mkdir(path, 0700), 0);  // a directory where the file should go
    const uint8_t v[2] = {1, 2};
    fc_st_entry en = {"v", FC_DT_U8, 1, {2}, v};
    fc_error e = {{0}};
    cr_assert_eq(fc_st_write(path, &en, 1, NULL, 0, &e), -1);
    cr_expect(strstr(e.msg, "cannot rename"), "%s", e.msg);
    cr_expect_eq(count_entries(dir), 1, "temporary left behind");
    remove_tree(dir);
    free(dir);
}

Test(safetensors, write_refuses_bad_entries) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    const uint8_t v[4] = {1, 2, 3, 4};
    fc_error e = {{0}};
    struct {
        fc_st_entry en[2];
        int n;
        const char *expect;
    } cases[] = {
        {{{"a", FC_DT_U8, 1, {2}, v}, {"a", FC_DT_U8, 1, {2}, v}}, 2, "duplicate tensor name 'a'"},
        {{{NULL, FC_DT_U8, 1, {2}, v}}, 1, "entry 0 has no name"},
        {{{"", FC_DT_U8, 1, {2}, v}}, 1, "entry 0 has no name"},
        {{{"__metadata__", FC_DT_U8, 1, {2}, v}}, 1, "'__metadata__' is reserved"},
        {{{"a", FC_DT_U8, 9, {1, 1, 1, 1, 1, 1, 1, 1}, v}}, 1, "tensor 'a': ndim 9 is outside [0,8]"},
        {{{"a", FC_DT_U8, -1, {0}, v}}, 1, "tensor 'a': ndim -1 is outside [0,8]"},
        {{{"a", FC_DT_COUNT, 1, {2}, v}}, 1, "tensor 'a': invalid dtype"},
        {{{"a", FC_DT_U8, 1, {2}, NULL}}, 1, "tensor 'a': NULL data"},
        {{{"a", FC_DT_U8, 2, {UINT64_MAX, 2}, v}}, 1, "tensor 'a': shape [18446744073709551615,2] is too large"},
        {{{"a", FC_DT_F64, 2, {1u << 30, 1u << 30}, v}}, 1, "tensor 'a': data too large"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&e, 0, sizeof e);
        cr_expect_eq(fc_st_write(path, cases[i].en, cases[i].n, NULL, 0, &e), -1, "case %zu", i);
        cr_expect(strstr(e.msg, cases[i].expect), "case %zu: '%s' lacks '%s'", i, e.msg, cases[i].expect);
    }
    const fc_st_entry bad_utf8 = {"caf\xe9", FC_DT_U8, 1, {2}, v};  // Latin-1, not UTF-8
    cr_expect_eq(fc_st_write(path, &bad_utf8, 1, NULL, 0, &e), -1);
    cr_expect(strstr(e.msg, "not valid UTF-8 (byte 0xe9)"), "%s", e.msg);
    const fc_st_meta_kv bad_meta[1] = {{"k", "\xff"}};
    cr_expect_eq(fc_st_write(path, NULL, 0, bad_meta, 1, &e), -1);
    cr_expect(strstr(e.msg, "not valid UTF-8 (byte 0xff)"), "%s", e.msg);
    const fc_st_meta_kv dup_meta[2] = {{"k", "1"}, {"k", "2"}};
    cr_expect_eq(fc_st_write(path, NULL, 0, dup_meta, 2, &e), -1);
    cr_expect(strstr(e.msg, "duplicate metadata key 'k'"), "%s", e.msg);
    const fc_st_meta_kv null_meta[1] = {{"k", NULL}};
    cr_expect_eq(fc_st_write(path, NULL, 0, null_meta, 1, &e), -1);
    cr_expect(strstr(e.msg, "metadata entry 0 is NULL"), "%s", e.msg);
    cr_expect_eq(count_entries(dir), 0, "a refused write left a file");
    remove_tree(dir);
    free(dir);
}

// Names with JSON-special characters survive the round trip through cJSON.
Test(safetensors, names_with_special_characters) {
    char *dir = make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/n.safetensors", dir);
    const uint8_t v[1] = {7};
    const char *names[] = {"quote\"d", "back\\slash", "new\nline", "caf\xc3\xa9", "h.0.attn/c_attn"};
    fc_st_entry en[5];
    memset(en, 0, sizeof en);
    for (int i = 0; i < 5; i++) en[i] = (fc_st_entry){names[i], FC_DT_U8, 1, {1}, v};
    const fc_st_meta_kv meta[1] = {{"json", "{\"a\": [1, 2]}"}};
    fc_error e = {{0}};
    cr_assert_eq(fc_st_write(path, en, 5, meta, 1, &e), 0, "%s", e.msg);
    fc_st_file f;
    cr_assert_eq(fc_st_open(path, &f, &e), 0, "%s", e.msg);
    for (int i = 0; i < 5; i++) cr_expect_not_null(fc_st_find(&f, names[i]), "%s", names[i]);
    cr_expect_str_eq(fc_st_meta(&f, "json"), "{\"a\": [1, 2]}");
    fc_st_close(&f);
    remove_tree(dir);
    free(dir);
}

// fsync, counted: this binary is linked with -Wl,--wrap=fsync (tests/CMakeLists.txt),
// so every fsync core makes comes here first.
int __real_fsync(int fd);
int __wrap_fsync(int fd);
static int n_fsync;
int __wrap_fsync(int fd) {
    n_fsync++;
    return __real_fsync(fd);
}

// FC_DURABLE fsyncs the file and its directory (checkpoints, manifests, reports,
// trace.json); FC_ATOMIC, a trace's tensor files, fsyncs nothing; the bytes are the same.
Test(safetensors, durable_commits_fsync_atomic_ones_do_not) {
    char *dir = make_tmpdir();
    char durable[256], atomic[256], streamed[256], text[256];
    snprintf(durable, sizeof durable, "%s/durable.safetensors", dir);
    snprintf(atomic, sizeof atomic, "%s/atomic.safetensors", dir);
    snprintf(streamed, sizeof streamed, "%s/streamed.safetensors", dir);
    snprintf(text, sizeof text, "%s/manifest.json", dir);
    fc_st_entry en[N_RT];
    rt_entries(en);
    fc_error e = {{0}};
    n_fsync = 0;
    cr_assert_eq(fc_st_write(durable, en, N_RT, rt_meta, 2, &e), 0, "%s", e.msg);
    cr_expect_eq(n_fsync, 2, "fc_st_write: the file and its directory");
    n_fsync = 0;
    cr_assert_eq(fc_write_file_atomic(text, "{}", 2, &e), 0, "%s", e.msg);
    cr_expect_eq(n_fsync, 2, "fc_write_file_atomic: the file and its directory");
    n_fsync = 0;
    cr_assert_eq(fc_st_write_as(atomic, en, N_RT, rt_meta, 2, FC_ATOMIC, &e), 0, "%s", e.msg);
    fc_st_stream st;
    cr_assert_eq(fc_st_stream_open(&st, streamed, en, N_RT, rt_meta, 2, FC_ATOMIC, &e), 0, "%s", e.msg);
    for (int i = 0; i < N_RT; i++) cr_assert_eq(fc_st_stream_put(&st, en[i].data, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_st_stream_commit(&st, &e), 0, "%s", e.msg);
    cr_expect_eq(n_fsync, 0, "FC_ATOMIC commits fsync nothing");
    cr_assert_eq(fc_st_stream_open(&st, streamed, en, N_RT, rt_meta, 2, FC_DURABLE, &e), 0, "%s", e.msg);
    for (int i = 0; i < N_RT; i++) cr_assert_eq(fc_st_stream_put(&st, en[i].data, &e), 0, "%s", e.msg);
    cr_assert_eq(fc_st_stream_commit(&st, &e), 0, "%s", e.msg);
    cr_expect_eq(n_fsync, 2, "an FC_DURABLE stream: the file and its directory");
    size_t na, nb, nc;
    uint8_t *a = read_bytes(durable, &na), *b = read_bytes(atomic, &nb), *c = read_bytes(streamed, &nc);
    cr_expect(na == nb && memcmp(a, b, na) == 0, "durable and atomic files differ");
    cr_expect(na == nc && memcmp(a, c, na) == 0, "written and streamed files differ");
    free(a);
    free(b);
    free(c);
    remove_tree(dir);
    free(dir);
}
