// oracle/report.c — the sweep's reports (see sweep.h): what the Markdown
// (report_md.c), its SVG plot (report_svg.c) and the JUnit XML
// (report_junit.c) share: a growable text buffer, the escaping of text for
// where it lands, and the names, properties and numbers they print.
//
// Text that comes from the sweep (specs, details, the implementation name, the
// model name, the reproducer) is escaped for where it lands (escape.h): XML
// character escapes in the JUnit and SVG files, backslash escapes in Markdown
// text, code spans with a long-enough fence for specs (with GFM's `\|` inside
// tables).
#include "report_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "escape.h"

// ----------------------------------------------------------------------------
// growable text buffer

void rp_put(rp_buf *b, const char *s, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len + 1) cap *= 2;
        b->p = reallocCheck(b->p, cap);
        b->cap = cap;
    }
    if (len) memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

void rp_puts(rp_buf *b, const char *s) { rp_put(b, s, strlen(s)); }

void rp_printf(rp_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof small) {
        rp_put(b, small, (size_t)n);
    } else if (n >= 0) {
        char *big = mallocCheck((size_t)n + 1);
        vsnprintf(big, (size_t)n + 1, fmt, ap2);
        rp_put(b, big, (size_t)n);
        free(big);
    }
    va_end(ap2);
}

// ----------------------------------------------------------------------------
// escaping

static void rp_sink(void *b, const char *s, size_t n) { rp_put(b, s, n); }

// Writes the first max bytes of s (or up to its NUL) escaped for mode.
static void rp_esc_put(rp_buf *b, const char *s, size_t max, fc_esc mode) {
    fc_escape(s, max, mode, rp_sink, b);
}

void rp_xml(rp_buf *b, const char *s, size_t max) { rp_esc_put(b, s, max, FC_ESC_XML); }
void rp_md(rp_buf *b, const char *s, size_t max) { rp_esc_put(b, s, max, FC_ESC_MD_TEXT); }

static size_t rp_longest_backticks(const char *s, size_t len) {
    size_t run = 0, longest = 0;
    for (size_t i = 0; i < len; i++) {
        run = s[i] == '`' ? run + 1 : 0;
        if (run > longest) longest = run;
    }
    return longest;
}

static void rp_repeat(rp_buf *b, char c, size_t n) {
    for (size_t i = 0; i < n; i++) rp_put(b, &c, 1);
}

static int rp_spaceish(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// An inline code span (CommonMark): a fence longer than any backtick run
// inside, padded with spaces when the content starts or ends with a backtick
// or with a space on both ends (the renderer strips one space each side).
void rp_md_code(rp_buf *b, const char *s, size_t max) {
    size_t len = strnlen(s, max);
    if (len == 0) {
        rp_puts(b, "(empty)");
        return;
    }
    size_t fence = rp_longest_backticks(s, len) + 1;
    int pad = s[0] == '`' || s[len - 1] == '`' || (rp_spaceish(s[0]) && rp_spaceish(s[len - 1]));
    rp_repeat(b, '`', fence);
    if (pad) rp_puts(b, " ");
    rp_esc_put(b, s, len, FC_ESC_MD_CODE);
    if (pad) rp_puts(b, " ");
    rp_repeat(b, '`', fence);
}

// A fenced code block holding one command line.
void rp_md_block(rp_buf *b, const char *s, size_t max, const char *lang) {
    size_t len = strnlen(s, max);
    size_t fence = rp_longest_backticks(s, len) + 1;
    if (fence < 3) fence = 3;
    rp_repeat(b, '`', fence);
    rp_printf(b, "%s\n", lang);
    rp_esc_put(b, s, len, FC_ESC_MD_BLOCK);
    rp_puts(b, "\n");
    rp_repeat(b, '`', fence);
    rp_puts(b, "\n");
}

// ----------------------------------------------------------------------------
// names, properties, numbers

int rp_sidx(int s) { return s >= 0 && s < FC_STRATEGY_COUNT ? s : FC_STRATEGY_COUNT; }
const char *rp_sname(int s) {
    return s >= 0 && s < FC_STRATEGY_COUNT ? fc_strategy_name((fc_strategy)s) : "unknown";
}
const char *rp_fname(int f) {
    return f >= 0 && f < FC_FAULT_COUNT ? fc_fault_name((fc_fault)f) : "unknown";
}

// One line per property of docs/contract.md §8 (Markdown; backticks are dropped in XML).
const char *const RP_PROP_DESC[FC_NPROP] = {
    [FC_P0_UNFINISHED] = "",
    [FC_P1_LOCAL] = "`local` ≡ `no_shard` at every W: loss, gradients, parameters after k steps",
    [FC_P2_NO_SHARD] = "`no_shard` ≡ `full_shard` ≡ `shard_grad_op` at the same W",
    [FC_P3_HYBRID] = "`hybrid_shard(F)` ≡ `full_shard` at the same total W",
    [FC_P4_PREFETCH] = "every prefetch setting ≡ no prefetch",
    [FC_P5_WORLD_SIZE] = "world-size invariance, W = 1..8, uneven and empty shards included",
    [FC_P6_ACCUMULATION] = "K accumulated micro-batches (with and without `no_sync`) ≡ one step on the joined batch",
    [FC_P7_CHECKPOINT] = "train k, save, load at any W and strategy, train n ≡ train k+n uninterrupted",
    [FC_P8_CLIP] = "`clip_grad_norm`: total norm and clipped gradients ≡ the local model's",
    [FC_P9_MIXED_PRECISION] = "mixed precision: FSDP ≡ DDP under the same policy",
    [FC_P10_COMM_LOG] = "comm log: collective counts, bytes and issue order match the theory",
    [FC_P11_MEMORY] = "memory: per-rank peak per category equals the sharded formula",
    [FC_P12_DETERMINISM] = "determinism: the same run twice is bitwise identical",
    [FC_P13_FINITE_DIFF] = "analytic gradients ≡ finite differences",
    [FC_P14_CPU_OFFLOAD] = "`cpu_offload` ≡ no offload",
    [FC_P15_ACT_CKPT] = "activation checkpointing ≡ none, bitwise",
};

void rp_xml_desc(rp_buf *b, int p) {
    char plain[256];
    size_t n = 0;
    for (const char *s = RP_PROP_DESC[p]; *s && n + 1 < sizeof plain; s++)
        if (*s != '`') plain[n++] = *s;
    plain[n] = '\0';
    rp_xml(b, plain, sizeof plain);
}

unsigned rp_checked(const fc_case_result *c) { return (c->v.checked | c->v.failed) & RP_PMASK; }
unsigned rp_failed(const fc_case_result *c) { return c->v.failed & RP_PMASK; }
int rp_case_failed(const fc_case_result *c) { return c->v.failed != 0; }

// "P2, P5" (or "P?" when only bits outside P1..P15 are set).
void rp_props(rp_buf *b, unsigned mask) {
    int any = 0;
    for (int p = FC_P1_LOCAL; p < FC_NPROP; p++)
        if (mask & (1u << p)) rp_printf(b, "%sP%d", any++ ? ", " : "", p);
    if (!any) rp_puts(b, "P?");
}

// Largest value, NaN sticky: a NaN error is the loudest result there is.
double rp_max(double m, double v) { return (isnan(v) || v > m) ? v : m; }

void rp_num(rp_buf *b, double v) {
    if (v == 0) rp_puts(b, "0");
    else rp_printf(b, "%.3g", v);
}

void rp_ulp(rp_buf *b, double v) {
    if (isfinite(v) && v >= 0 && v < 1e15 && v == floor(v)) rp_printf(b, "%.0f", v);
    else rp_printf(b, "%.3g", v);
}

// ZeRO per-rank model-state bytes for fp32 AdamW (4 B params, 4 B grads, 8 B
// Adam moments per element), Rajbhandari et al. 2020, with the gathered full
// parameters ZeRO-2 holds during compute.
const char *const RP_FORM_NAME[RP_NFORM] = {"DDP 16Ψ", "ZeRO-2 4Ψ + 12Ψ/W", "ZeRO-3 16Ψ/W"};
const fc_strategy RP_FORM_STRATEGY[RP_NFORM] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP,
                                                       FC_STRATEGY_FULL_SHARD};
double rp_formula(int which, double psi, double W) {
    switch (which) {
    case RP_DDP: return 16.0 * psi;
    case RP_ZERO2: return 4.0 * psi + 12.0 * psi / W;
    default: return 16.0 * psi / W;
    }
}

// A wall time as JUnit's time pattern accepts it: finite, not negative.
double rp_secs(double v) { return isfinite(v) && v > 0 ? v : 0; }

size_t rp_point_bytes(const fc_mem_point *p) { return p->param + p->grad + p->optim + p->gathered; }

// The plot's x range: 1 .. the largest W among the points (the world size
// when there are none).
int rp_plot_wmax(const fc_sweep_report *r) {
    int wmax = 0;
    for (int i = 0; i < r->n_points; i++)
        if (r->points[i].W > wmax) wmax = r->points[i].W;
    if (wmax < 1) wmax = r->world;
    return wmax < 1 ? 1 : wmax > 4096 ? 4096 : wmax;
}

// Largest measured bytes of strategy s at W among the points; 0 = none.
int rp_point_at(const fc_sweep_report *r, int s, int W, size_t *out) {
    int found = 0;
    for (int i = 0; i < r->n_points; i++) {
        const fc_mem_point *p = &r->points[i];
        if (rp_sidx((int)p->strategy) != s || p->W != W) continue;
        size_t v = rp_point_bytes(p);
        if (!found || v > *out) *out = v;
        found = 1;
    }
    return found;
}

int rp_check(const fc_sweep_report *r, const char *path, fc_error *e) {
    if (!path || !*path) return fc_fail(e, "report: empty output path");
    if (!r) return fc_fail(e, "%s: no report to write", path);
    if (r->n < 0 || (r->n > 0 && !r->cases))
        return fc_fail(e, "%s: the report holds %d cases but no case data", path, r->n);
    if (r->n_points < 0 || r->n_points > (int)(sizeof r->points / sizeof r->points[0]))
        return fc_fail(e, "%s: the report holds %d memory points (at most %zu)", path, r->n_points,
                       sizeof r->points / sizeof r->points[0]);
    return 0;
}

int rp_count_failed(const fc_sweep_report *r) {
    int n = 0;
    for (int i = 0; i < r->n; i++) n += rp_case_failed(&r->cases[i]);
    return n;
}
