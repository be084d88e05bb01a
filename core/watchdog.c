// core/watchdog.c — see watchdog.h.
// pthread_setname_np (glibc): the thread is named "fc-watchdog" in ps, gdb and
// /proc/PID/task/*/comm, where tests/watchdog/watchdog.sh waits for it.
#define _GNU_SOURCE
#include "watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "mpicheck.h"

#define TICK_NS 200000000ull          // the thread wakes five times a second
#define STALE_NS 3000000000ull        // a heartbeat older than this: the process is stopped or dead
#define EXIT_DELAY_NS 1000000000ull   // from the reporter's line to every rank's exit (time for a starved or continued rank to wake)
#define FOLLOWER_GRACE_NS 2000000000ull  // how long a rank that saw the hang waits for the reporter
#define FALLBACK_NS 3000000000ull     // after the reporter's moment, a rank its abort did not end leaves by itself

enum { SLOT_IDLE, SLOT_RUNNING, SLOT_DONE };

// One rank's row of the node's table (shared memory: lock-free atomics only).
typedef struct {
    _Atomic int state;
    _Atomic int pid;
    _Atomic uint64_t beat_ns;       // the watchdog thread's last tick
    _Atomic uint64_t progress_ns;   // the rank's last progress
    _Atomic int64_t step;
    _Atomic int phase, unit;
    _Atomic int op;                 // the last collective issued (fc_op), -1 before any
    _Atomic int waiting;            // it was issued and not yet completed
    _Atomic int64_t seq;            // collectives issued so far
    _Atomic int mark;               // index into MARKS of the last boundary mark
} wd_slot;

// The node's table: a header every rank reads at each tick, then one row per rank.
typedef struct {
    _Atomic uint64_t exit_at_ns;    // set by the reporting rank: every rank exits 3 at this moment
} wd_header;

static const char *MARKS[] = {"", "step", "export", "save", "load", "compare", "create", "destroy", "other"};
#define N_MARKS ((int)(sizeof MARKS / sizeof MARKS[0]))

static struct {
    wd_header *head;    // the mapping: the header, then the rows
    wd_slot *table;     // [n] this node's ranks
    size_t bytes;
    int n, me;          // node size, this rank's row
    int world_rank, world, multi_node;
    int *world_of;      // [n] the world rank of each row
    double timeout;
    uint64_t timeout_ns;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running;
    fc_watchdog_hook hook;
    void *hook_ctx;
} W_ = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  // one clock for every process of the node
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static wd_slot *mine(void) { return W_.table ? &W_.table[W_.me] : NULL; }

void fc_watchdog_event(const fc_event *ev) {
    wd_slot *s = mine();
    if (!s) return;
    atomic_store(&s->step, ev->step);
    atomic_store(&s->phase, (int)ev->phase);
    atomic_store(&s->unit, ev->unit);
    if (ev->op == FC_OP_ALL_GATHER || ev->op == FC_OP_REDUCE_SCATTER || ev->op == FC_OP_ALL_REDUCE) {
        atomic_store(&s->op, (int)ev->op);
        atomic_fetch_add(&s->seq, 1);
        atomic_store(&s->waiting, 1);
    } else if (ev->op == FC_OP_WAIT) {
        atomic_store(&s->waiting, 0);
    }
    atomic_store(&s->progress_ns, now_ns());
}

void fc_watchdog_mark(long step, const char *what) {
    wd_slot *s = mine();
    if (!s) return;
    int k = N_MARKS - 1;
    for (int i = 1; i < N_MARKS; i++)
        if (!strcmp(what, MARKS[i])) k = i;
    atomic_store(&s->step, step);
    atomic_store(&s->mark, k);
    atomic_store(&s->progress_ns, now_ns());
}

void fc_watchdog_on_timeout(fc_watchdog_hook hook, void *ctx) {
    W_.hook = hook;
    W_.hook_ctx = ctx;
}

// ---------------------------------------------------------------------------
// the timeout line

typedef struct {
    char *buf;
    size_t cap, n;
} line_buf;

static void put(line_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(line_buf *b, const char *fmt, ...) {
    if (b->n >= b->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->buf + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    if (k > 0) b->n += (size_t)k;
}

static const char *op_text(int op) { return op < 0 ? "no collective yet" : fc_op_name((fc_op)op); }

// Where row i is: "step 3, backward, unit 2, after all_gather #14".
static void where(line_buf *b, const wd_slot *s) {
    int op = atomic_load(&s->op), mark = atomic_load(&s->mark);
    put(b, "step %lld, %s", (long long)atomic_load(&s->step), fc_phase_name((fc_phase)atomic_load(&s->phase)));
    if (atomic_load(&s->unit) >= 0) put(b, ", unit %d", atomic_load(&s->unit));
    if (op >= 0)
        put(b, ", %s %s #%lld", atomic_load(&s->waiting) ? "in" : "after", op_text(op),
            (long long)atomic_load(&s->seq));
    if (mark > 0 && op < 0) put(b, ", %s", MARKS[mark]);
}

static void compose(char *out, size_t cap, uint64_t t) {
    line_buf b = {out, cap, 0};
    int n = W_.n;
    long long frontier = -1;
    for (int i = 0; i < n; i++) {
        const wd_slot *s = &W_.table[i];
        if (atomic_load(&s->state) == SLOT_RUNNING && t - atomic_load(&s->beat_ns) < STALE_NS)
            frontier = atomic_load(&s->seq) > frontier ? atomic_load(&s->seq) : frontier;
    }
    put(&b, "fsdpcheck: timeout: no rank made progress for %g s (--timeout %g)", W_.timeout, W_.timeout);
    // the live ranks furthest ahead: what they wait in
    int lead = -1, nwait = 0;
    char ranks[512] = "";
    size_t rn = 0;
    for (int i = 0; i < n; i++) {
        const wd_slot *s = &W_.table[i];
        if (atomic_load(&s->state) != SLOT_RUNNING || t - atomic_load(&s->beat_ns) >= STALE_NS) continue;
        if (atomic_load(&s->seq) != frontier) continue;
        if (lead < 0) lead = i;
        nwait++;
        if (rn < sizeof ranks) rn += (size_t)snprintf(ranks + rn, sizeof ranks - rn, "%s%d", rn ? "," : "", W_.world_of[i]);
    }
    if (lead >= 0) {
        put(&b, "; rank%s %s at ", nwait > 1 ? "s" : "", ranks);
        where(&b, &W_.table[lead]);
    }
    put(&b, "; ranks that did not arrive:");
    int missing = 0;
    for (int i = 0; i < n; i++) {
        const wd_slot *s = &W_.table[i];
        int st = atomic_load(&s->state);
        if (st == SLOT_DONE) continue;
        uint64_t age = t - atomic_load(&s->beat_ns);
        if (st == SLOT_RUNNING && age < STALE_NS && atomic_load(&s->seq) == frontier) continue;
        put(&b, "%s %d (", missing++ ? "," : "", W_.world_of[i]);
        if (st != SLOT_RUNNING) put(&b, "never started its watchdog");
        else if (age >= STALE_NS) put(&b, "no heartbeat for %.1f s: stopped or dead, pid %d", (double)age / 1e9, atomic_load(&s->pid));
        else where(&b, s);
        put(&b, ")");
    }
    if (!missing) put(&b, " none: every live rank is blocked (mismatched collectives, or a collective outside the comm log)");
    if (W_.multi_node) put(&b, " [this node's ranks only]");
}

// A rank that leaves without the reporter's MPI_Abort (see timed_out): at
// the moment the reporter set, with FC_EXIT_TIMEOUT. Under MPICH's hydra the
// abort ends every rank first; this is the fallback for a launcher that does
// not, and for a node whose reporter is gone.
static _Noreturn void leave_at(uint64_t when) {
    uint64_t t = now_ns();
    if (when > t) {
        struct timespec ts = {(time_t)((when - t) / 1000000000ull), (long)((when - t) % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
    fflush(stdout);
    fflush(stderr);
    _exit(FC_EXIT_TIMEOUT);
}

static void timed_out(uint64_t t) {
    // the lowest live rank speaks; the others wait for its word
    int reporter = -1;
    for (int i = 0; i < W_.n && reporter < 0; i++) {
        const wd_slot *s = &W_.table[i];
        if (atomic_load(&s->state) == SLOT_RUNNING && t - atomic_load(&s->beat_ns) < STALE_NS) reporter = i;
    }
    if (reporter != W_.me) {
        for (uint64_t waited = 0; waited < FOLLOWER_GRACE_NS; waited += TICK_NS / 4) {
            uint64_t when = atomic_load(&W_.head->exit_at_ns);
            if (when) leave_at(when + FALLBACK_NS);
            struct timespec ts = {0, (long)(TICK_NS / 4)};
            nanosleep(&ts, NULL);
        }
        leave_at(0);  // no word came: the reporter is gone too
    }
    static char line[2048];
    compose(line, sizeof line, t);
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
    if (W_.hook) W_.hook(line, W_.hook_ctx);
    fflush(stdout);
    fflush(stderr);
    uint64_t when = now_ns() + EXIT_DELAY_NS;
    atomic_store(&W_.head->exit_at_ns, when);
    // a stopped rank is continued, so that its own watchdog leaves with the rest
    for (int i = 0; i < W_.n; i++) {
        const wd_slot *s = &W_.table[i];
        if (i != W_.me && atomic_load(&s->state) == SLOT_RUNNING && t - atomic_load(&s->beat_ns) >= STALE_NS)
            kill((pid_t)atomic_load(&s->pid), SIGCONT);
    }
    // The job ends by MPI_Abort with FC_EXIT_TIMEOUT: the launcher ends every
    // rank and exits with that code. Ranks that merely exit 3 "together" do
    // not get there: MPICH's hydra kills the rest as soon as one process
    // exits, and one rank it kills before that rank's own exit makes the job's
    // code 9 (seen at W=4 on 2 cores in 4 runs of 10, with a common exit
    // moment and with a futex that released every rank at once alike; 0 in
    // 20 with the abort). Called from this thread while the rank's own thread
    // is inside MPI: MPI_Abort is the one call MPICH makes safe for that (it
    // only tells the launcher). main.c sets MPIR_CVAR_SUPPRESS_ABORT_MESSAGE,
    // so the line above stays the job's one line but for hydra's own prefix.
    // First the moment set above: the launcher forwards the line from this
    // rank's stderr pipe only while the rank lives (an abort right after the
    // line lost it, seen once under check).
    uint64_t now = now_ns();
    if (when > now) {
        struct timespec ts = {(time_t)((when - now) / 1000000000ull), (long)((when - now) % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
    MPI_Abort(MPI_COMM_WORLD, FC_EXIT_TIMEOUT);
    leave_at(when);
}

static void *watch(void *arg) {
    (void)arg;
    pthread_mutex_lock(&W_.mu);
    while (W_.running) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);  // pthread_cond_timedwait's clock
        until.tv_nsec += (long)TICK_NS;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&W_.cv, &W_.mu, &until);
        if (!W_.running) break;
        uint64_t t = now_ns();
        atomic_store(&mine()->beat_ns, t);
        uint64_t when = atomic_load(&W_.head->exit_at_ns);
        if (when) leave_at(when + FALLBACK_NS);  // another rank reported the hang: its abort ends this one
        // the newest progress of any live rank: a job in which some rank still
        // works (alone, while the others wait for it) is not hung
        uint64_t newest = 0;
        int live = 0;
        for (int i = 0; i < W_.n; i++) {
            const wd_slot *s = &W_.table[i];
            if (atomic_load(&s->state) != SLOT_RUNNING || t - atomic_load(&s->beat_ns) >= STALE_NS) continue;
            live++;
            uint64_t p = atomic_load(&s->progress_ns);
            newest = p > newest ? p : newest;
        }
        if (live && t > newest && t - newest > W_.timeout_ns) timed_out(t);
    }
    pthread_mutex_unlock(&W_.mu);
    return NULL;
}

int fc_watchdog_start(MPI_Comm comm, double timeout_s, fc_error *e) {
    if (!(timeout_s > 0) || W_.table) return 0;
    MPI_Comm node;
    mpiCheck(MPI_Comm_rank(comm, &W_.world_rank));
    mpiCheck(MPI_Comm_size(comm, &W_.world));
    mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, W_.world_rank, MPI_INFO_NULL, &node));
    mpiCheck(MPI_Comm_rank(node, &W_.me));
    mpiCheck(MPI_Comm_size(node, &W_.n));
    W_.multi_node = W_.n != W_.world;
    // the node's table: its first rank creates it, the others map it, then it
    // is unlinked at once (the mappings keep it; nothing is left behind)
    static int generation = 0;
    char name[96];
    int pid0 = (int)getpid();
    mpiCheck(MPI_Bcast(&pid0, 1, MPI_INT, 0, node));
    snprintf(name, sizeof name, "/fsdpcheck-watchdog-%d-%d", pid0, generation++);
    W_.bytes = sizeof(wd_header) + (size_t)W_.n * sizeof(wd_slot);
    int ok = 1, fd = -1;
    if (W_.me == 0) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)W_.bytes) != 0) ok = 0;
    }
    mpiCheck(MPI_Bcast(&ok, 1, MPI_INT, 0, node));
    if (ok && W_.me != 0) fd = shm_open(name, O_RDWR, 0600);
    void *p = ok && fd >= 0 ? mmap(NULL, W_.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd);
    int mapped = p != MAP_FAILED, all = 0;
    mpiCheck(MPI_Allreduce(&mapped, &all, 1, MPI_INT, MPI_MIN, node));
    if (W_.me == 0 && ok) shm_unlink(name);
    if (!all) {
        if (mapped) munmap(p, W_.bytes);
        mpiCheck(MPI_Comm_free(&node));
        return fc_fail(e, "--timeout: cannot share the watchdog's table through POSIX shared memory (%s)", strerror(errno));
    }
    W_.head = p;
    W_.table = (wd_slot *)(W_.head + 1);
    W_.world_of = callocCheck((size_t)W_.n, sizeof(int));
    mpiCheck(MPI_Allgather(&W_.world_rank, 1, MPI_INT, W_.world_of, 1, MPI_INT, node));
    mpiCheck(MPI_Comm_free(&node));
    wd_slot *s = mine();
    uint64_t t = now_ns();
    atomic_store(&s->pid, (int)getpid());
    atomic_store(&s->op, -1);
    atomic_store(&s->unit, -1);
    atomic_store(&s->beat_ns, t);
    atomic_store(&s->progress_ns, t);
    atomic_store(&s->state, SLOT_RUNNING);
    W_.timeout = timeout_s;
    W_.timeout_ns = (uint64_t)(timeout_s * 1e9);
    W_.running = 1;
    if (pthread_create(&W_.thread, NULL, watch, NULL) != 0)
        fc_die(FC_EXIT_INTERNAL, "%s:%d: cannot start the watchdog thread", __FILE__, __LINE__);
    (void)pthread_setname_np(W_.thread, "fc-watchdog");  // a name is a convenience: failing to set it changes nothing
    mpiCheck(MPI_Barrier(comm));  // every row is RUNNING before anyone judges the table
    return 0;
}

void fc_watchdog_stop(void) {
    if (!W_.table) return;
    pthread_mutex_lock(&W_.mu);
    W_.running = 0;
    pthread_cond_signal(&W_.cv);
    pthread_mutex_unlock(&W_.mu);
    pthread_join(W_.thread, NULL);
    atomic_store(&mine()->state, SLOT_DONE);
    munmap(W_.head, W_.bytes);
    W_.head = NULL;
    W_.table = NULL;
    free(W_.world_of);
    W_.world_of = NULL;
}
