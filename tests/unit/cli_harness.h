// tests/unit/cli_harness.h — helpers shared by the tests that run the
// fsdpcheck binary (test_cli.c, test_checkpoint_files.c, test_cli_compare.c).
//
// Each Criterion test file is its own executable, so these are static
// functions in a header: every including file gets its own private copy.
// They are marked unused so that a file needing only some of them still
// builds under -Wall -Wextra -Werror.
//
//  - a process runner: fork + exec, stdin from /dev/null, stdout and stderr
//    captured separately through pipes, exit code or signal, a kill after
//    RUN_TIMEOUT_S seconds (define it before including to change it), and
//    HWLOC_COMPONENTS=-pci,-x86 in the child's environment unless already set
//    (as ctest runs the MPI programs: hwloc's PCI discovery leaks under ASan);
//  - a temporary directory per test (tmp_setup in the suite's .init,
//    tmp_teardown as its .fini) and paths and files inside it.
#ifndef FC_TESTS_CLI_HARNESS_H
#define FC_TESTS_CLI_HARNESS_H

#include <criterion/criterion.h>

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef RUN_TIMEOUT_S
#define RUN_TIMEOUT_S 30
#endif

#define HARNESS_FN __attribute__((unused)) static

// ----------------------------------------------------------------------------
// process runner

typedef struct {
    int code;        // exit status, or -1 when killed by a signal
    int signal;      // the signal that ended it, 0 if it exited
    int timed_out;
    char *out, *err; // NUL-terminated captures
    size_t out_len, err_len;
    char cmd[2048];  // the command line, for messages
} result;

// The fsdpcheck binary: FC_FSDPCHECK_BIN from the environment, else the one
// CMake built.
HARNESS_FN const char *binary(void) {
    const char *b = getenv("FC_FSDPCHECK_BIN");
    return b && *b ? b : FC_FSDPCHECK_BIN;
}

HARNESS_FN void append(char **buf, size_t *len, const char *src, size_t n) {
    *buf = realloc(*buf, *len + n + 1);
    cr_assert_not_null(*buf, "out of memory capturing output");
    memcpy(*buf + *len, src, n);
    *len += n;
    (*buf)[*len] = '\0';
}

HARNESS_FN double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

HARNESS_FN void result_free(result *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

// Runs argv (NULL-terminated; argv[0] is a path, or a name looked up in PATH
// such as mpiexec) in directory cwd (NULL = ours). Returns the exit code;
// fills r (which must not hold live captures: result_free it first).
HARNESS_FN int run_argv(const char *cwd, const char *const *argv, result *r) {
    memset(r, 0, sizeof *r);
    r->out = calloc(1, 1);
    r->err = calloc(1, 1);
    cr_assert(r->out && r->err, "out of memory");
    // the command line for messages; the binary itself is named "fsdpcheck"
    size_t used = (size_t)snprintf(r->cmd, sizeof r->cmd, "%s", strcmp(argv[0], binary()) ? argv[0] : "fsdpcheck");
    for (int i = 1; argv[i]; i++)
        if (used < sizeof r->cmd)
            used += (size_t)snprintf(r->cmd + used, sizeof r->cmd - used, " %s",
                                     strcmp(argv[i], binary()) ? argv[i] : "fsdpcheck");

    int po[2], pe[2];
    cr_assert_eq(pipe(po), 0, "pipe: %s", strerror(errno));
    cr_assert_eq(pipe(pe), 0, "pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        if (in < 0 || dup2(in, 0) < 0 || dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0) _exit(126);
        close(in);
        close(po[0]);
        close(po[1]);
        close(pe[0]);
        close(pe[1]);
        if (cwd && chdir(cwd) != 0) _exit(126);
        setenv("HWLOC_COMPONENTS", "-pci,-x86", 0);  // as ctest runs MPI programs
        if (strchr(argv[0], '/')) execv(argv[0], (char *const *)argv);
        else execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    struct pollfd fds[2] = {{.fd = po[0], .events = POLLIN}, {.fd = pe[0], .events = POLLIN}};
    int open_fds = 2;
    double deadline = now_s() + RUN_TIMEOUT_S;
    while (open_fds > 0) {
        double left = deadline - now_s();
        if (left <= 0) {
            r->timed_out = 1;
            kill(pid, SIGKILL);
            break;
        }
        int pr = poll(fds, 2, (int)(left * 1000) + 1);
        if (pr < 0) {
            if (errno == EINTR) continue;
            cr_assert_fail("poll: %s", strerror(errno));
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char buf[4096];
            ssize_t k = read(fds[i].fd, buf, sizeof buf);
            if (k > 0) {
                if (i == 0) append(&r->out, &r->out_len, buf, (size_t)k);
                else append(&r->err, &r->err_len, buf, (size_t)k);
            } else if (k == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0) close(fds[i].fd);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) cr_assert_fail("waitpid: %s", strerror(errno));
    }
    if (WIFEXITED(status)) {
        r->code = WEXITSTATUS(status);
    } else {
        r->code = -1;
        r->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    if (r->timed_out || r->code == 127) {
        int timed_out = r->timed_out;
        result_free(r);
        cr_assert_not(timed_out, "%s: killed after %d s", r->cmd, RUN_TIMEOUT_S);
        cr_assert_fail("%s: could not exec %s", r->cmd, argv[0]);
    }
    return r->code;
}

// Runs the fsdpcheck binary with args (NULL-terminated, without argv[0]) in
// directory cwd (NULL = ours). Returns the exit code; fills r.
HARNESS_FN int run_in(const char *cwd, const char *const *args, result *r) {
    const char *argv[64];
    int n = 0;
    argv[n++] = binary();
    for (; args[n - 1]; n++) {
        cr_assert_lt(n, 63, "too many arguments");
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    return run_argv(cwd, argv, r);
}

HARNESS_FN int run(const char *const *args, result *r) { return run_in(NULL, args, r); }

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

// ----------------------------------------------------------------------------
// temporary directory (one per test) and file helpers

static char g_tmp[256];

HARNESS_FN void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *ent;
            while ((ent = readdir(d))) {
                if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
                char p[2048];
                snprintf(p, sizeof p, "%s/%s", path, ent->d_name);
                remove_tree(p);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

// Creates this test's directory, $TMPDIR/<tag>_XXXXXX (for a suite's .init).
HARNESS_FN void tmp_setup(const char *tag) {
    const char *base = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/%s_XXXXXX", base && *base ? base : "/tmp", tag);
    cr_assert_not_null(mkdtemp(g_tmp), "mkdtemp %s: %s", g_tmp, strerror(errno));
}

// Removes it and everything in it (a suite's .fini).
HARNESS_FN void tmp_teardown(void) {
    if (g_tmp[0]) remove_tree(g_tmp);
    g_tmp[0] = '\0';
}

// A path inside this test's temporary directory (a few rotating buffers, so
// several can be live in one expression).
HARNESS_FN const char *tmp_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
HARNESS_FN const char *tmp_path(const char *fmt, ...) {
    static char bufs[16][1024];
    static int next;
    char *b = bufs[next++ % 16];
    int k = snprintf(b, 1024, "%s/", g_tmp);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + k, (size_t)(1024 - k), fmt, ap);
    va_end(ap);
    return b;
}

HARNESS_FN void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

HARNESS_FN void make_dir(const char *path) {
    cr_assert_eq(mkdir(path, 0777), 0, "mkdir %s: %s", path, strerror(errno));
}

HARNESS_FN int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

// The whole file, NUL-terminated (not counted in *len); free() it.
HARNESS_FN unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            buf = realloc(buf, cap + 1);
            cr_assert_not_null(buf);
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    cr_assert_not(ferror(f), "read error on %s", path);
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

HARNESS_FN int same_bytes(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

HARNESS_FN cJSON *load_json(const char *path) {
    size_t n;
    unsigned char *text = read_all(path, &n);
    cJSON *j = cJSON_ParseWithLength((const char *)text, n);
    cr_assert_not_null(j, "%s does not parse as JSON", path);
    free(text);
    return j;
}

// The names in a directory, sorted, joined with single spaces ("" if empty).
HARNESS_FN int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
HARNESS_FN void dir_listing(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open directory %s: %s", dir, strerror(errno));
    char *names[256];
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        cr_assert_lt(n, 256);
        names[n++] = strdup(ent->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    out[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(out + used, used < cap ? cap - used : 0, "%s%s", i ? " " : "", names[i]);
        free(names[i]);
    }
}

HARNESS_FN void expect_listing(const char *dir, const char *want) {
    char got[8192];
    dir_listing(dir, got, sizeof got);
    cr_expect_str_eq(got, want, "directory %s holds [%s], want [%s]", dir, got, want);
}

HARNESS_FN int count_lines(const char *s, size_t len) {
    int n = 0;
    for (size_t i = 0; i < len; i++) n += s[i] == '\n';
    return n;
}

#undef HARNESS_FN

#endif
