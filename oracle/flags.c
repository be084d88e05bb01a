// oracle/flags.c — the one flag parser of the fsdpcheck commands (flags.h).
#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

fc_flags fc_flags_begin(int argc, char **argv, const fc_flag *table, int n_table, const fc_flag_words *words,
                        unsigned opts) {
    fc_flags it = {argc, argv, table, n_table, words, opts, 0, NULL, NULL, NULL};
    return it;
}

static int is_flag(const fc_flags *it, const char *arg) {
    return it->opts & FC_FLAGS_SHORT ? arg[0] == '-' : !strncmp(arg, "--", 2);
}

// The table's entry for the name arg[0, len), or -1.
static int lookup(const fc_flags *it, const char *arg, size_t len) {
    for (int k = 0; k < it->n_table; k++)
        if (strlen(it->table[k].name) == len && !strncmp(it->table[k].name, arg, len)) return k;
    return -1;
}

// One misuse, framed by the command's words: pre + lead + the flag's name + tail + post;
// without e it ends the command (fc_die's line holds more than an fc_error).
static int misuse(fc_error *e, const char *pre, const char *lead, const char *name, size_t len, const char *tail,
                  const char *post) {
    if (!e) fc_die(FC_EXIT_USAGE, "%s%s%.*s%s%s", pre, lead, (int)len, name, tail, post);
    fc_fail(e, "%s%s%.*s%s%s", pre, lead, (int)len, name, tail, post);
    return FC_FLAGS_ERROR;
}

int fc_flags_try_next(fc_flags *it, fc_error *e) {
    if (it->i >= it->argc) return FC_FLAGS_END;
    const char *arg = it->argv[it->i++];
    it->arg = arg, it->name = NULL, it->value = NULL;
    if (!is_flag(it, arg)) return FC_FLAGS_ARG;
    const char *eq = it->opts & FC_FLAGS_EQUALS ? strchr(arg, '=') : NULL;
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    int id = lookup(it, arg, len);
    const fc_flag_words *w = it->words;
    if (id < 0) {
        if (it->opts & FC_FLAGS_PASS) return FC_FLAGS_ARG;
        return misuse(e, w->unknown_pre, "unknown flag ", arg, len, "", w->unknown_post);
    }
    it->name = it->table[id].name;
    if (it->table[id].kind == FC_FLAG_SWITCH) {
        if (eq) return misuse(e, w->value_pre, "", arg, len, " takes no value", w->value_post);
        return id;
    }
    if (eq) it->value = eq + 1;
    else if (it->i < it->argc) it->value = it->argv[it->i++];
    else if (it->opts & FC_FLAGS_PASS) return id;
    else return misuse(e, w->value_pre, "", arg, len, " needs a value", w->value_post);
    if (it->opts & FC_FLAGS_EQUALS && !*it->value)
        return misuse(e, w->value_pre, "", arg, len, ": empty value", w->value_post);
    return id;
}

int fc_flags_next(fc_flags *it) {
    return fc_flags_try_next(it, NULL);  // no fc_error: a misuse ends the command
}

int fc_flag_int(const char *flag, const char *v, int lo, int hi, int *out, fc_error *e) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return fc_fail(e, "%s: '%s' is not an integer in %d..%d", flag, v, lo, hi);
    *out = (int)x;
    return 0;
}

int fc_flag_u64(const char *flag, const char *v, uint64_t *out, fc_error *e) {
    char *end;
    errno = 0;
    if (*v == '-' || *v == '+') return fc_fail(e, "%s: '%s' is not a non-negative integer", flag, v);
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end) return fc_fail(e, "%s: '%s' is not a non-negative integer", flag, v);
    *out = x;
    return 0;
}

int fc_flag_double(const char *flag, const char *v, double *out, fc_error *e) {
    char *end;
    // plain decimal only: strtod would also take hex floats, "inf" and "nan"
    if (strpbrk(v, "xXiInN")) return fc_fail(e, "%s: '%s' is not a finite decimal number", flag, v), FC_FLAG_BAD;
    errno = 0;
    double x = strtod(v, &end);
    if (errno == ERANGE) return fc_fail(e, "%s: '%s' is out of range", flag, v), FC_FLAG_RANGE;
    if (errno || end == v || *end || !isfinite(x) || x < 0)
        return fc_fail(e, "%s: '%s' is not a finite non-negative number", flag, v), FC_FLAG_BAD;
    *out = x;
    return 0;
}
