// fuzz/fuzz_manifest.c — libFuzzer harness for the checkpoint manifest parser
// and the checkpoint verifier/reader (core/checkpoint.h), from memory.
//
// Every input is first parsed as a manifest (fc_ckpt_manifest_parse). An
// input that starts with "FCKA" is also read as a small archive of checkpoint
// files and opened with fc_ckpt_open_mem:
//
//   "FCKA" flags:u8 { name_len:u8 name size:u32le data }*
//
// flags bit 0 = check the SHA-256s. Without it the fuzzer gets past the
// hashes into the structure checks, exactly as a non-root rank does when it
// opens a checkpoint rank 0 has verified. Whatever is accepted must be safe
// to read: every parameter and state is read back, whole and by unit, and
// both paths must agree. Whatever is refused is refused with one line.
// fuzz/gen_manifest_corpus.py writes the seeds from real checkpoints.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"

#define MAX_FILES 16
#define SLICE 1024

static float a[SLICE], b[SLICE];

static void check(int ok) {
    if (!ok) abort();
}

static void check_refusal(const fc_error *e) { check(e->msg[0] != '\0' && strchr(e->msg, '\n') == NULL); }

static void check_manifest(const fc_ckpt_manifest *m) {
    check(m->version == FC_CKPT_VERSION && m->n_files >= 1 && m->files != NULL);
    check(m->step >= 0 && m->data_position == m->step && m->world_size >= 1);
    check(m->n_state >= 0 && m->n_state <= 2);
    for (int i = 0; i < m->n_files; i++) {
        const fc_ckpt_file *f = &m->files[i];
        check(f->name[0] != '\0' && f->name[0] != '.' && strchr(f->name, '/') == NULL);
        check(strlen(f->sha256) == 64);
    }
}

// Reads every tensor of every parameter in slices, and each unit's first
// slice through the unit path, which must give the same numbers.
static void read_everything(fc_ckpt *c) {
    const fc_model *m = fc_ckpt_model(c);
    const fc_ckpt_manifest *man = fc_ckpt_manifest_of(c);
    fc_error e;
    for (int t = 0; t <= man->n_state; t++) {
        check(fc_ckpt_tensor_index(c, fc_ckpt_tensor_name(c, t)) == t);
        for (int p = 0; p < m->n_params; p++)
            for (size_t first = 0; first < m->params[p].numel; first += SLICE) {
                size_t n = m->params[p].numel - first < SLICE ? m->params[p].numel - first : SLICE;
                uint64_t before = fc_ckpt_bytes_read(c);
                check(fc_ckpt_read(c, p, t, first, n, a, &e) == 0);
                uint64_t read = fc_ckpt_bytes_read(c) - before;
                // a frozen parameter's optimizer state: none in FULL and DCP files (torch writes
                // none), read as zeros without a byte; FSDP1's flat chunks keep it (SHARDED)
                if (t > 0 && m->params[p].frozen && read == 0)
                    for (size_t i = 0; i < n; i++) check(a[i] == 0.0f);
                else
                    check(read == n * sizeof(float));
            }
        for (int u = 0; u < m->n_units; u++) {
            const fc_unit *U = &m->units[u];
            size_t n = U->numel < SLICE ? U->numel : SLICE;
            check(fc_ckpt_read_unit(c, u, t, 0, n, a, &e) == 0);
            // the same elements parameter by parameter
            size_t done = 0;
            for (int k = 0; k < U->n_params && done < n; k++) {
                const fc_param *P = &m->params[m->unit_params[U->first_param + k]];
                size_t take = P->numel < n - done ? P->numel : n - done;
                check(fc_ckpt_read(c, m->unit_params[U->first_param + k], t, 0, take, b + done, &e) == 0);
                done += take;
            }
            check(memcmp(a, b, n * sizeof(float)) == 0);
            // past the end is refused
            check(fc_ckpt_read_unit(c, u, t, U->numel, 1, a, &e) == -1);
        }
    }
    check(fc_ckpt_read(c, m->n_params, 0, 0, 1, a, &e) == -1);
    check(fc_ckpt_read(c, 0, man->n_state + 1, 0, 1, a, &e) == -1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fc_ckpt_manifest m;
    fc_error e;
    if (fc_ckpt_manifest_parse((const char *)data, size, NULL, &m, &e) == 0) {
        check_manifest(&m);
        fc_ckpt_manifest_free(&m);
    } else {
        check_refusal(&e);
        check(m.files == NULL);
    }
    if (size < 5 || memcmp(data, "FCKA", 4) != 0) return 0;
    int check_hashes = data[4] & 1;
    fc_ckpt_mem_file files[MAX_FILES];
    char names[MAX_FILES][256];
    int n = 0;
    size_t at = 5;
    while (n < MAX_FILES && at < size) {
        size_t len = data[at++];
        if (at + len + 4 > size) break;
        memcpy(names[n], data + at, len);
        names[n][len] = '\0';
        at += len;
        uint32_t fs = (uint32_t)data[at] | (uint32_t)data[at + 1] << 8 | (uint32_t)data[at + 2] << 16 |
                      (uint32_t)data[at + 3] << 24;
        at += 4;
        if (fs > size - at) fs = (uint32_t)(size - at);  // a short last file: what is there
        files[n] = (fc_ckpt_mem_file){names[n], data + at, fs};
        at += fs;
        n++;
    }
    fc_ckpt *c;
    if (fc_ckpt_open_mem(files, n, check_hashes, &c, &e) != 0) {
        check_refusal(&e);
        check(c == NULL);
        return 0;
    }
    check_manifest(fc_ckpt_manifest_of(c));
    read_everything(c);
    fc_ckpt_close(c);
    return 0;
}
