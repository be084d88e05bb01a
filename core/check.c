// core/check.c — see check.h.
#define _DEFAULT_SOURCE  // madvise
#include "check.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int fc_fail(fc_error *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void fc_die(int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    // One line, whatever a file name or flag value held: escape control bytes.
    fputs("fsdpcheck: ", stderr);
    for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
        if (*p == '\n')
            fputs("\\n", stderr);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(stderr, "\\x%02x", *p);
        else
            fputc(*p, stderr);
    }
    fputc('\n', stderr);
    exit(code);
}

static _Noreturn void oom(size_t size, const char *file, int line) {
    fprintf(stderr, "%s:%d: out of memory allocating %zu bytes\n", file, line, size);
    exit(FC_EXIT_INTERNAL);
}

// Asks the kernel to back a large block with transparent huge pages before
// anything touches it. A gpt2-124m check touches ~30 GB of fresh memory (every
// [numel] set, shard, gathered buffer and activation), and first touch is the
// kernel zeroing pages: 4 KiB at a time that ran at ~2.5 GB/s on the CI-sized
// VM, 2 MiB at a time ~12 GB/s (the same loop, madvised; README "Huge pages").
// Only whole pages inside the block are advised; the block is glibc's own
// (its mmap of a large request, or the heap) and is freed with free() as ever.
// Advice only: a kernel without THP (or THP "never") refuses or ignores it and
// the memory is the same memory, so a failure here is not one of ours.
#define HUGE_ADVICE_MIN ((size_t)8 << 20)
static void advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
    if (size < HUGE_ADVICE_MIN) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) / page * page, hi = ((uintptr_t)p + size) / page * page;
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_HUGEPAGE) != 0) {
        // EINVAL without CONFIG_TRANSPARENT_HUGEPAGE: 4 KiB pages, as without the advice
    }
#else
    (void)p, (void)size;
#endif
}

void *fc_malloc_check(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);  // malloc(0) may return NULL legitimately
    if (!p) oom(size, file, line);
    advise_huge(p, size);
    return p;
}

void *fc_calloc_check(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size, file, line);
    // calloc of a large block is a fresh mapping it leaves untouched (already zero), so the advice is in time
    advise_huge(p, n * size);
    return p;
}

void *fc_realloc_check(void *p, size_t size, const char *file, int line) {
    void *q = realloc(p, size ? size : 1);
    if (!q) oom(size, file, line);
    return q;
}

char *fc_strdup_check(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = fc_malloc_check(n, file, line);
    memcpy(p, s, n);
    return p;
}

int fc_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}

int fc_add_size(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return -1;
    *out = a + b;
    return 0;
}
