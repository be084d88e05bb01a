// core/check.c — see check.h.
#include "check.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

void *fc_malloc_check(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);  // malloc(0) may return NULL legitimately
    if (!p) oom(size, file, line);
    return p;
}

void *fc_calloc_check(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size, file, line);
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
