// oracle/flags.h — the one flag parser of the fsdpcheck commands.
//
// A command lists its flags in a table and walks argv with fc_flags_next,
// which hands back one flag (with its value) or one other argument at a time:
//
//     enum { RTOL, BITWISE };
//     static const fc_flag FLAGS[] = {[RTOL] = {"--rtol", FC_FLAG_VALUE}, [BITWISE] = {"--bitwise", FC_FLAG_SWITCH}};
//     static const fc_flag_words WORDS = {"compare: ", " (see fsdpcheck compare --help)", "", ""};
//     fc_flags it = fc_flags_begin(argc, argv, FLAGS, FC_FLAGS_COUNT(FLAGS), &WORDS, FC_FLAGS_EQUALS);
//     for (int id; (id = fc_flags_next(&it)) != FC_FLAGS_END;)
//         switch (id) {
//         case FC_FLAGS_ARG: ... it.arg, a positional argument ...; break;
//         case RTOL: rtol = ... it.value ...; break;
//         case BITWISE: bitwise = 1; break;
//         }
//
// A misused flag ends the command with exit 2 and one message of one shape,
// framed by the command's words (prefix + text + suffix):
//     unknown flag --x          a flag not in the table
//     --x needs a value         a value flag that is the last argument
//     --x takes no value        --switch=value (FC_FLAGS_EQUALS)
//     --x: empty value          --x= or --x "" (FC_FLAGS_EQUALS)
// fc_flags_try_next returns the message in an fc_error instead (FC_FLAGS_ERROR),
// for a parser that must not exit (run's, which the sweep and the fuzzer call).
// Values are parsed by the command, with fc_flag_int/u64/double for numbers.
#ifndef FC_FLAGS_H
#define FC_FLAGS_H

#include <stdint.h>

#include "check.h"  // fc_error

typedef enum { FC_FLAG_SWITCH, FC_FLAG_VALUE } fc_flag_kind;

typedef struct {
    const char *name;  // "--rtol"
    fc_flag_kind kind;
} fc_flag;

#define FC_FLAGS_COUNT(table) ((int)(sizeof(table) / sizeof((table)[0])))

// How a command frames the misuse messages, so its users keep the words they know:
// "unknown flag --x" between unknown_pre and unknown_post, the other three
// between value_pre and value_post.
typedef struct {
    const char *unknown_pre, *unknown_post;
    const char *value_pre, *value_post;
} fc_flag_words;

// Options (or them together).
enum {
    FC_FLAGS_EQUALS = 1,  // "--name=value" is accepted, and an empty value refused
    FC_FLAGS_SHORT = 2,   // an argument starting with a single '-' is a flag too (else only "--")
    FC_FLAGS_PASS = 4,    // a flag not in the table comes back as FC_FLAGS_ARG, and a value
                          // flag that is the last argument as its id with value NULL: the
                          // command's own flags, picked out of flags another parser reads;
                          // without FC_FLAGS_EQUALS nothing is a misuse, and words may be NULL
};

// fc_flags_next's answers besides a flag's index in the table.
enum { FC_FLAGS_ARG = -1, FC_FLAGS_END = -2, FC_FLAGS_ERROR = -3 };

typedef struct {
    int argc;
    char **argv;
    const fc_flag *table;
    int n_table;
    const fc_flag_words *words;
    unsigned opts;
    int i;              // the next argument to read
    const char *arg;    // the argument (for a flag, its first) just read
    const char *name;   // the flag's name as the table spells it (NULL for FC_FLAGS_ARG)
    const char *value;  // the flag's value; NULL for a switch
} fc_flags;

fc_flags fc_flags_begin(int argc, char **argv, const fc_flag *table, int n_table, const fc_flag_words *words,
                        unsigned opts);
// The next flag's index in the table, FC_FLAGS_ARG or FC_FLAGS_END; a misuse ends the command (exit 2).
int fc_flags_next(fc_flags *it);
// As fc_flags_next, but a misuse returns FC_FLAGS_ERROR with e set (e NULL: it ends the command).
int fc_flags_try_next(fc_flags *it, fc_error *e);

// Numbers, decimal only; each message names the flag and the value:
// "--steps: 'abc' is not an integer in 1..1000000".
int fc_flag_int(const char *flag, const char *v, int lo, int hi, int *out, fc_error *e);
// "--seed: '-5' is not a non-negative integer"
int fc_flag_u64(const char *flag, const char *v, uint64_t *out, fc_error *e);
// A finite non-negative decimal (strtod's hex floats, inf and nan refused):
// 0, or FC_FLAG_BAD ("is not a finite ... number") or FC_FLAG_RANGE ("is out of range").
enum { FC_FLAG_BAD = -1, FC_FLAG_RANGE = -2 };
int fc_flag_double(const char *flag, const char *v, double *out, fc_error *e);

#endif
