// core/check.h — checked wrappers, in the style of llm.c's mallocCheck/fopenCheck.
//
// Two kinds of failure exist in fsdpcheck and they are reported differently:
//  - internal failures (out of memory, a failed write to a file we created):
//    the *Check macros below print "file:line: what" and exit FC_EXIT_INTERNAL;
//  - bad input (a malformed file, a bad flag): library code fills an fc_error
//    and returns -1, so the caller prints one line and exits FC_EXIT_USAGE.
#ifndef FC_CHECK_H
#define FC_CHECK_H

#include <stddef.h>
#include <stdio.h>

#include "hd.h"

FC_BEGIN_DECLS

// Exit codes of every fsdpcheck program (docs/contract.md §7).
#define FC_EXIT_PASS 0
#define FC_EXIT_FAIL 1      // a property or comparison failed
#define FC_EXIT_USAGE 2     // bad input, bad flag, bad config
#define FC_EXIT_TIMEOUT 3   // a hung rank or collective (core/watchdog.h)
#define FC_EXIT_INTERNAL 4  // out of memory, I/O failure on our own output, an MPI error

// An error message carried back to whoever can report it as one line.
typedef struct {
    char msg[512];
} fc_error;

// Formats msg into e (if e is not NULL) and returns -1, so callers can write
// `return fc_fail(e, "...", ...);`.
int fc_fail(fc_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Prints "fsdpcheck: <msg>" to stderr and exits with code.
FC_NORETURN void fc_die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void *fc_malloc_check(size_t size, const char *file, int line);
void *fc_calloc_check(size_t n, size_t size, const char *file, int line);
void *fc_realloc_check(void *p, size_t size, const char *file, int line);
char *fc_strdup_check(const char *s, const char *file, int line);
#define mallocCheck(size) fc_malloc_check((size), __FILE__, __LINE__)
#define callocCheck(n, size) fc_calloc_check((n), (size), __FILE__, __LINE__)
#define reallocCheck(p, size) fc_realloc_check((p), (size), __FILE__, __LINE__)
#define strdupCheck(s) fc_strdup_check((s), __FILE__, __LINE__)

// size_t arithmetic that cannot silently wrap: returns 0 and sets *out on
// success, -1 on overflow. Used wherever a size comes from a file.
int fc_mul_size(size_t a, size_t b, size_t *out);
int fc_add_size(size_t a, size_t b, size_t *out);

FC_END_DECLS

#endif
