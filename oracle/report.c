// oracle/report.c — the sweep's reports (see sweep.h): Markdown with an SVG
// plot beside it, and JUnit XML.
//
// Both are built in memory and written crash-safely (fc_write_file_atomic), so
// a failed or interrupted write never leaves a half-written report; the SVG is
// written first and removed again if the Markdown that references it cannot be.
// Nothing here depends on the clock or the locale: the same sweep gives the
// same report, byte for byte, apart from the wall times it records.
//
// Text that comes from the sweep (specs, details, the implementation name, the
// model name, the reproducer) is escaped for where it lands (escape.h): XML
// character escapes in the JUnit and SVG files, backslash escapes in Markdown
// text, code spans with a long-enough fence for specs (with GFM's `\|` inside
// tables).
#include "sweep.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "escape.h"
#include "fileio.h"

// ----------------------------------------------------------------------------
// growable text buffer

typedef struct {
    char *p;
    size_t n, cap;
} rp_buf;

static void rp_put(rp_buf *b, const char *s, size_t len) {
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

static void rp_puts(rp_buf *b, const char *s) { rp_put(b, s, strlen(s)); }

static void rp_printf(rp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rp_printf(rp_buf *b, const char *fmt, ...) {
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

static void rp_xml(rp_buf *b, const char *s, size_t max) { rp_esc_put(b, s, max, FC_ESC_XML); }
static void rp_md(rp_buf *b, const char *s, size_t max) { rp_esc_put(b, s, max, FC_ESC_MD_TEXT); }

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
static void rp_md_code(rp_buf *b, const char *s, size_t max) {
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
static void rp_md_block(rp_buf *b, const char *s, size_t max, const char *lang) {
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

#define RP_NS (FC_STRATEGY_COUNT + 1)  // the strategies, plus "unknown" for a bad value
#define RP_PMASK ((((unsigned)1 << FC_NPROP) - 1) & ~1u)  // bits 1..15: P1..P15

static int rp_sidx(int s) { return s >= 0 && s < FC_STRATEGY_COUNT ? s : FC_STRATEGY_COUNT; }
static const char *rp_sname(int s) {
    return s >= 0 && s < FC_STRATEGY_COUNT ? fc_strategy_name((fc_strategy)s) : "unknown";
}
static const char *rp_fname(int f) {
    return f >= 0 && f < FC_FAULT_COUNT ? fc_fault_name((fc_fault)f) : "unknown";
}

// One line per property of DESIGN §8 (Markdown; backticks are dropped in XML).
static const char *const RP_PROP_DESC[FC_NPROP] = {
    "",
    "`local` ≡ `no_shard` at every W: loss, gradients, parameters after k steps",
    "`no_shard` ≡ `full_shard` ≡ `shard_grad_op` at the same W",
    "`hybrid_shard(F)` ≡ `full_shard` at the same total W",
    "every prefetch setting ≡ no prefetch",
    "world-size invariance, W = 1..8, uneven and empty shards included",
    "K accumulated micro-batches (with and without `no_sync`) ≡ one step on the joined batch",
    "train k, save, load at any W and strategy, train n ≡ train k+n uninterrupted",
    "`clip_grad_norm`: total norm and clipped gradients ≡ the local model's",
    "mixed precision: FSDP ≡ DDP under the same policy",
    "comm log: collective counts, bytes and issue order match the theory",
    "memory: per-rank peak per category equals the sharded formula",
    "determinism: the same run twice is bitwise identical",
    "analytic gradients ≡ finite differences",
    "`cpu_offload` ≡ no offload",
    "activation checkpointing ≡ none, bitwise",
};

static void rp_xml_desc(rp_buf *b, int p) {
    char plain[256];
    size_t n = 0;
    for (const char *s = RP_PROP_DESC[p]; *s && n + 1 < sizeof plain; s++)
        if (*s != '`') plain[n++] = *s;
    plain[n] = '\0';
    rp_xml(b, plain, sizeof plain);
}

static unsigned rp_checked(const fc_case_result *c) { return (c->v.checked | c->v.failed) & RP_PMASK; }
static unsigned rp_failed(const fc_case_result *c) { return c->v.failed & RP_PMASK; }
static int rp_case_failed(const fc_case_result *c) { return c->v.failed != 0; }

// "P2, P5" (or "P?" when only bits outside P1..P15 are set).
static void rp_props(rp_buf *b, unsigned mask) {
    int any = 0;
    for (int p = 1; p < FC_NPROP; p++)
        if (mask & (1u << p)) rp_printf(b, "%sP%d", any++ ? ", " : "", p);
    if (!any) rp_puts(b, "P?");
}

// Largest value, NaN sticky: a NaN error is the loudest result there is.
static double rp_max(double m, double v) { return (isnan(v) || v > m) ? v : m; }

static void rp_num(rp_buf *b, double v) {
    if (v == 0) rp_puts(b, "0");
    else rp_printf(b, "%.3g", v);
}

static void rp_ulp(rp_buf *b, double v) {
    if (isfinite(v) && v >= 0 && v < 1e15 && v == floor(v)) rp_printf(b, "%.0f", v);
    else rp_printf(b, "%.3g", v);
}

// ZeRO per-rank model-state bytes for fp32 AdamW (4 B params, 4 B grads, 8 B
// Adam moments per element), Rajbhandari et al. 2020, with the gathered full
// parameters ZeRO-2 holds during compute.
enum { RP_DDP, RP_ZERO2, RP_ZERO3, RP_NFORM };
static const char *const RP_FORM_NAME[RP_NFORM] = {"DDP 16Ψ", "ZeRO-2 4Ψ + 12Ψ/W", "ZeRO-3 16Ψ/W"};
static const fc_strategy RP_FORM_STRATEGY[RP_NFORM] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP,
                                                       FC_STRATEGY_FULL_SHARD};
static double rp_formula(int which, double psi, double W) {
    switch (which) {
    case RP_DDP: return 16.0 * psi;
    case RP_ZERO2: return 4.0 * psi + 12.0 * psi / W;
    default: return 16.0 * psi / W;
    }
}

// A wall time as JUnit's time pattern accepts it: finite, not negative.
static double rp_secs(double v) { return isfinite(v) && v > 0 ? v : 0; }

static size_t rp_point_bytes(const fc_mem_point *p) { return p->param + p->grad + p->optim + p->gathered; }

// The plot's x range: 1 .. the largest W among the points (the world size
// when there are none).
static int rp_plot_wmax(const fc_sweep_report *r) {
    int wmax = 0;
    for (int i = 0; i < r->n_points; i++)
        if (r->points[i].W > wmax) wmax = r->points[i].W;
    if (wmax < 1) wmax = r->world;
    return wmax < 1 ? 1 : wmax > 4096 ? 4096 : wmax;
}

// Largest measured bytes of strategy s at W among the points; 0 = none.
static int rp_point_at(const fc_sweep_report *r, int s, int W, size_t *out) {
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

// ----------------------------------------------------------------------------
// (strategy, W) groups of cases, for the comm and memory tables

typedef struct {
    int s, W, n;
    double comm[FC_OP_COUNT];
    double mem[FC_MEM_COUNT];
    double total;
} rp_group;

static int rp_groups(const fc_sweep_report *r, rp_group **out) {
    rp_group *g = callocCheck(r->n > 0 ? (size_t)r->n : 1, sizeof *g);
    int ng = 0;
    for (int i = 0; i < r->n; i++) {
        const fc_case_result *c = &r->cases[i];
        int s = rp_sidx((int)c->cfg.strategy), j = 0;
        while (j < ng && !(g[j].s == s && g[j].W == c->W)) j++;
        if (j == ng) {
            // keep sorted by strategy, then W
            while (j > 0 && (g[j - 1].s > s || (g[j - 1].s == s && g[j - 1].W > c->W))) {
                g[j] = g[j - 1];
                j--;
            }
            memset(&g[j], 0, sizeof g[j]);
            g[j].s = s;
            g[j].W = c->W;
            ng++;
        }
        g[j].n++;
        for (int k = 0; k < FC_OP_COUNT; k++) g[j].comm[k] += (double)c->comm_bytes[k];
        for (int k = 0; k < FC_MEM_COUNT; k++) g[j].mem[k] += (double)c->mem_peak[k];
        g[j].total += (double)c->mem_total;
    }
    for (int j = 0; j < ng; j++) {
        for (int k = 0; k < FC_OP_COUNT; k++) g[j].comm[k] /= g[j].n;
        for (int k = 0; k < FC_MEM_COUNT; k++) g[j].mem[k] /= g[j].n;
        g[j].total /= g[j].n;
    }
    *out = g;
    return ng;
}

// ----------------------------------------------------------------------------
// SVG: per-rank model-state memory against W, with the ZeRO curves

#define SVG_W 920
#define SVG_H 500
#define PX0 100.0  // plot area
#define PX1 610.0
#define PY0 70.0
#define PY1 420.0

static const char *rp_color(int s) {
    static const char *const C[RP_NS] = {"#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e",
                                         "#d62728", "#9467bd", "#8c564b"};
    return C[rp_sidx(s)];
}

typedef struct {
    int wmax;
    double unit, top;  // y axis: bytes per unit, top of the axis in units
    const char *uname;
    double step;       // tick step in units
} rp_axes;

static double rp_sx(const rp_axes *a, double w) { return PX0 + (w - 0.5) / a->wmax * (PX1 - PX0); }
static double rp_sy(const rp_axes *a, double bytes) { return PY1 - bytes / a->unit / a->top * (PY1 - PY0); }

static void rp_plot_axes(const fc_sweep_report *r, rp_axes *a) {
    a->wmax = rp_plot_wmax(r);
    double ymax = 0;
    for (int i = 0; i < r->n_points; i++) ymax = fmax(ymax, (double)rp_point_bytes(&r->points[i]));
    if (r->plot_numel) ymax = fmax(ymax, rp_formula(RP_DDP, (double)r->plot_numel, 1));
    if (!(ymax > 0)) ymax = 1;
    static const char *const UN[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && ymax >= 1024.0 * pow(1024.0, u)) u++;
    a->unit = pow(1024.0, u);
    a->uname = UN[u];
    double v = ymax / a->unit, raw = v / 5;
    double mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    a->step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    a->top = ceil(v / a->step - 1e-9) * a->step;
    if (a->top <= 0) a->top = a->step;
}

static void rp_svg(rp_buf *b, const fc_sweep_report *r) {
    rp_axes a;
    rp_plot_axes(r, &a);
    double psi = (double)r->plot_numel;
    rp_printf(b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
              "viewBox=\"0 0 %d %d\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
              SVG_W, SVG_H, SVG_W, SVG_H);
    rp_puts(b, "<title>Per-rank memory against world size</title>\n<desc>fsdpcheck sweep: per-rank bytes of "
               "model states (parameter, gradient and optimizer shards) plus gathered parameters, measured per "
               "strategy, against the ZeRO formulas for fp32 AdamW.</desc>\n");
    rp_printf(b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, SVG_H);

    // title
    rp_printf(b, "<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">"
                 "Per-rank memory against W: ", (PX0 + PX1) / 2);
    rp_xml(b, r->plot_model[0] ? r->plot_model : "(no model)", sizeof r->plot_model);
    rp_puts(b, "</text>\n");
    rp_printf(b, "<text x=\"%.1f\" y=\"48\" text-anchor=\"middle\" fill=\"#444\">", (PX0 + PX1) / 2);
    if (r->plot_numel)
        rp_printf(b, "Ψ = %zu parameters, fp32 AdamW: params + grads + optimizer state + gathered params",
                  r->plot_numel);
    else
        rp_puts(b, "params + grads + optimizer state + gathered params (Ψ unknown: no formula curves)");
    rp_puts(b, "</text>\n");

    // grid, ticks, axes
    rp_puts(b, "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
    int nyt = (int)floor(a.top / a.step + 0.5);
    for (int k = 0; k <= nyt; k++) {
        double y = rp_sy(&a, k * a.step * a.unit);
        rp_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", PX0, y, PX1, y);
    }
    rp_puts(b, "</g>\n<g text-anchor=\"end\">\n");
    for (int k = 0; k <= nyt; k++) {
        double y = rp_sy(&a, k * a.step * a.unit);
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", PX0 - 8, y + 4, k * a.step);
    }
    rp_puts(b, "</g>\n<g text-anchor=\"middle\">\n");
    int every = (a.wmax + 15) / 16;
    for (int w = 1; w <= a.wmax; w += every) {
        double x = rp_sx(&a, w);
        rp_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x, PY1, x,
                  PY1 + 5);
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%d</text>\n", x, PY1 + 20, w);
    }
    rp_puts(b, "</g>\n");
    rp_printf(b, "<path d=\"M %.1f %.1f V %.1f H %.1f\" fill=\"none\" stroke=\"black\"/>\n", PX0, PY0, PY1, PX1);
    rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">world size W (ranks)</text>\n",
              (PX0 + PX1) / 2, PY1 + 45);
    rp_printf(b, "<text x=\"30\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 30 %.1f)\">"
                 "per-rank bytes (%s)</text>\n", (PY0 + PY1) / 2, (PY0 + PY1) / 2, a.uname);

    // formula curves, sampled finely (1/W is not a straight line)
    if (r->plot_numel) {
        for (int f = 0; f < RP_NFORM; f++) {
            double w0 = 1, w1 = a.wmax;
            if (a.wmax == 1) w0 = 0.8, w1 = 1.2;  // a short level segment at W = 1
            rp_printf(b, "<polyline class=\"formula\" id=\"formula-%s\" fill=\"none\" stroke=\"%s\" "
                         "stroke-width=\"1.5\" stroke-dasharray=\"6 4\" points=\"",
                      f == RP_DDP ? "ddp" : f == RP_ZERO2 ? "zero2" : "zero3", rp_color(RP_FORM_STRATEGY[f]));
            const int N = 120;
            for (int i = 0; i <= N; i++) {
                double w = w0 + (w1 - w0) * i / N;
                double wf = a.wmax == 1 ? 1 : w;
                rp_printf(b, "%s%.1f,%.1f", i ? " " : "", rp_sx(&a, w), rp_sy(&a, rp_formula(f, psi, wf)));
            }
            rp_puts(b, "\"/>\n");
        }
    }

    // measured points: one series per strategy, radii differ so coinciding
    // points (all strategies agree at W = 1) stay visible
    int present[RP_NS] = {0};
    for (int i = 0; i < r->n_points; i++) present[rp_sidx((int)r->points[i].strategy)] = 1;
    for (int s = 0; s < RP_NS; s++) {
        if (!present[s]) continue;
        double rad = s == FC_STRATEGY_NO_SHARD ? 7 : s == FC_STRATEGY_SHARD_GRAD_OP ? 5 : 3.5;
        int hollow = s == FC_STRATEGY_NO_SHARD || s == FC_STRATEGY_SHARD_GRAD_OP;
        rp_printf(b, "<g class=\"series\" id=\"series-%s\" stroke=\"%s\" stroke-width=\"2\" fill=\"%s\">\n",
                  rp_sname(s), rp_color(s), hollow ? "none" : rp_color(s));
        for (int i = 0; i < r->n_points; i++) {
            const fc_mem_point *p = &r->points[i];
            if (rp_sidx((int)p->strategy) != s) continue;
            size_t v = rp_point_bytes(p);
            rp_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\"><title>%s W=%d: %zu bytes</title></circle>\n",
                      rp_sx(&a, p->W), rp_sy(&a, (double)v), rad, rp_sname(s), p->W, v);
        }
        rp_puts(b, "</g>\n");
    }
    if (!r->n_points)
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">no measured points</text>\n",
                  (PX0 + PX1) / 2, (PY0 + PY1) / 2);

    // legend
    double ly = PY0 + 10;
    rp_printf(b, "<g class=\"legend\">\n<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">measured</text>\n",
              PX1 + 25, ly);
    ly += 20;
    for (int s = 0; s < RP_NS; s++) {
        if (!present[s]) continue;
        int hollow = s == FC_STRATEGY_NO_SHARD || s == FC_STRATEGY_SHARD_GRAD_OP;
        rp_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" stroke=\"%s\" stroke-width=\"2\" fill=\"%s\"/>\n",
                  PX1 + 35, ly - 4, rp_color(s), hollow ? "none" : rp_color(s));
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", PX1 + 50, ly, rp_sname(s));
        ly += 20;
    }
    if (r->plot_numel) {
        ly += 10;
        rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">ZeRO formula</text>\n", PX1 + 25, ly);
        ly += 20;
        for (int f = 0; f < RP_NFORM; f++) {
            rp_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
                         "stroke-dasharray=\"6 4\"/>\n",
                      PX1 + 25, ly - 4, PX1 + 45, ly - 4, rp_color(RP_FORM_STRATEGY[f]));
            rp_printf(b, "<text x=\"%.1f\" y=\"%.1f\">%s (%s)</text>\n", PX1 + 50, ly, RP_FORM_NAME[f],
                      rp_sname(RP_FORM_STRATEGY[f]));
            ly += 20;
        }
    }
    rp_puts(b, "</g>\n</svg>\n");
}

// ----------------------------------------------------------------------------
// Markdown

// Where the SVG goes: path with ".md" replaced by ".svg", else path + ".svg".
static char *rp_svg_path(const char *path) {
    size_t n = strlen(path);
    char *s = mallocCheck(n + 5);
    memcpy(s, path, n + 1);
    if (n >= 3 && strcmp(path + n - 3, ".md") == 0) n -= 3;
    memcpy(s + n, ".svg", 5);
    return s;
}

static int rp_alnum(unsigned c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// A relative link to name, percent-encoded outside a safe set.
static void rp_md_link(rp_buf *b, const char *name) {
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if (rp_alnum(*p) || strchr("-._~/", *p)) rp_put(b, (const char *)p, 1);
        else rp_printf(b, "%%%02X", *p);
    }
}

static void rp_md_header(rp_buf *b, const fc_sweep_report *r, int nfail) {
    rp_puts(b, "# fsdpcheck sweep report\n\n| | |\n|---|---|\n| implementation | ");
    rp_md_code(b, r->impl, sizeof r->impl);
    rp_puts(b, " |\n| injected fault | ");
    if (r->inject == FC_FAULT_NONE) rp_puts(b, "none");
    else rp_printf(b, "`%s`", rp_fname((int)r->inject));
    int fsdp2 = 0;
    for (int i = 0; i < r->n; i++) fsdp2 += r->cases[i].cfg.fsdp_version == 2;
    rp_printf(b, " |\n| seed | %llu |\n| world size | %d |\n| cases | %d (%d FSDP2) |\n| failures | %d |\n"
                 "| wall time | %.1f s |\n\n",
              (unsigned long long)r->seed, r->world, r->n, fsdp2, nfail, rp_secs(r->seconds));

    if (r->n == 0) {
        rp_puts(b, "**Verdict: NO CASES**: nothing was checked.\n\n");
    } else if (nfail == 0) {
        rp_printf(b, "**Verdict: PASS**: all %d cases passed every property they checked.", r->n);
        if (r->inject != FC_FAULT_NONE)
            rp_printf(b, " The injected fault `%s` was **not** caught.", rp_fname((int)r->inject));
        rp_puts(b, "\n\n");
    } else {
        rp_printf(b, "**Verdict: FAIL**: %d of %d cases failed", nfail, r->n);
        if (r->caught_by >= 1 && r->caught_by < FC_NPROP)
            rp_printf(b, "; the first failure is caught by P%d", r->caught_by);
        rp_puts(b, ".");
        if (r->inject != FC_FAULT_NONE)
            rp_printf(b, " The injected fault `%s` was caught, as it must be.", rp_fname((int)r->inject));
        rp_puts(b, "\n\n");
    }
}

static void rp_md_matrix(rp_buf *b, const fc_sweep_report *r) {
    int nchk[FC_NPROP][RP_NS], nfl[FC_NPROP][RP_NS], seen[RP_NS] = {0};
    memset(nchk, 0, sizeof nchk);
    memset(nfl, 0, sizeof nfl);
    unsigned any = 0;
    for (int i = 0; i < r->n; i++) {
        const fc_case_result *c = &r->cases[i];
        int s = rp_sidx((int)c->cfg.strategy);
        seen[s] = 1;
        unsigned ck = rp_checked(c), fl = rp_failed(c);
        any |= ck;
        for (int p = 1; p < FC_NPROP; p++) {
            if (ck & (1u << p)) nchk[p][s]++;
            if (fl & (1u << p)) nfl[p][s]++;
        }
    }
    rp_puts(b, "## Pass/fail matrix\n\n");
    if (!any) {
        rp_puts(b, "No property was checked.\n\n");
        return;
    }
    rp_puts(b, "Each cell: cases that passed / cases that checked the property, per strategy of the case; "
               "✗ marks a failure, — not checked.\n\n| property | description |");
    for (int s = 0; s < RP_NS; s++)
        if (seen[s]) rp_printf(b, " %s |", rp_sname(s));
    rp_puts(b, " all |\n|---|---|");
    for (int s = 0; s < RP_NS; s++)
        if (seen[s]) rp_puts(b, "---|");
    rp_puts(b, "---|\n");
    for (int p = 1; p < FC_NPROP; p++) {
        if (!(any & (1u << p))) continue;
        rp_printf(b, "| P%d | %s |", p, RP_PROP_DESC[p]);
        int tc = 0, tf = 0;
        for (int s = 0; s < RP_NS; s++) {
            if (!seen[s]) continue;
            tc += nchk[p][s];
            tf += nfl[p][s];
            if (!nchk[p][s]) rp_puts(b, " — |");
            else rp_printf(b, " %d/%d%s |", nchk[p][s] - nfl[p][s], nchk[p][s], nfl[p][s] ? " ✗" : "");
        }
        rp_printf(b, " %d/%d%s |\n", tc - tf, tc, tf ? " ✗" : "");
    }
    rp_puts(b, "\n");

    // cases per world size
    int wmax = 0;
    for (int i = 0; i < r->n; i++)
        if (r->cases[i].W > wmax) wmax = r->cases[i].W;
    rp_puts(b, "## Cases per world size\n\n| W | cases | failed |\n|---|---|---|\n");
    for (int w = 0; w <= wmax; w++) {
        int n = 0, f = 0;
        for (int i = 0; i < r->n; i++)
            if (r->cases[i].W == w) n++, f += rp_case_failed(&r->cases[i]);
        if (n) rp_printf(b, "| %d | %d | %d |\n", w, n, f);
    }
    int odd = 0;
    for (int i = 0; i < r->n; i++) odd += r->cases[i].W < 0;
    if (odd) rp_printf(b, "| (negative) | %d | |\n", odd);
    rp_puts(b, "\n");
}

#define RP_MAX_FAIL_ROWS 50

static void rp_md_failures(rp_buf *b, const fc_sweep_report *r, int nfail) {
    rp_puts(b, "## Failing cases\n\n");
    if (!nfail) {
        rp_puts(b, "None.\n\n");
        return;
    }
    rp_puts(b, "| case | W | strategy | properties | spec | detail |\n|---|---|---|---|---|---|\n");
    int shown = 0;
    for (int i = 0; i < r->n && shown < RP_MAX_FAIL_ROWS; i++) {
        const fc_case_result *c = &r->cases[i];
        if (!rp_case_failed(c)) continue;
        rp_printf(b, "| %d | %d | %s | ", c->index, c->W, rp_sname((int)c->cfg.strategy));
        rp_props(b, rp_failed(c));
        rp_puts(b, " | ");
        rp_md_code(b, c->spec, sizeof c->spec);
        rp_puts(b, " | ");
        rp_md(b, c->v.detail, sizeof c->v.detail);
        rp_puts(b, " |\n");
        shown++;
    }
    if (nfail > shown)
        rp_printf(b, "\n… and %d more failing cases, not shown (the JUnit report lists every case).\n",
                  nfail - shown);
    rp_puts(b, "\n");
}

static void rp_md_repro(rp_buf *b, const fc_sweep_report *r, int nfail) {
    rp_puts(b, "## Shrunk reproducer\n\n");
    if (!nfail) {
        rp_puts(b, "No failure: nothing to shrink.\n\n");
        return;
    }
    if (!r->have_shrunk) {
        rp_puts(b, "The first failure was not shrunk.\n\n");
    } else {
        const fc_case_result *c = &r->shrunk;
        int p = r->caught_by;
        if (p >= 1 && p < FC_NPROP) rp_printf(b, "- property: **P%d**: %s\n", p, RP_PROP_DESC[p]);
        else rp_puts(b, "- property: unknown\n");
        rp_printf(b, "- minimal case, at W = %d: ", c->W);
        rp_md_code(b, c->spec, sizeof c->spec);
        rp_puts(b, "\n");
        if (c->v.detail[0]) {
            rp_puts(b, "- first divergence: ");
            rp_md(b, c->v.detail, sizeof c->v.detail);
            rp_puts(b, "\n");
        }
        rp_puts(b, "\n");
    }
    if (strnlen(r->repro, sizeof r->repro)) {
        rp_puts(b, "Reproduce it with:\n\n");
        rp_md_block(b, r->repro, sizeof r->repro, "sh");
        rp_puts(b, "\n");
    }
}

static void rp_md_errors(rp_buf *b, const fc_sweep_report *r) {
    rp_puts(b, "## Error magnitudes\n\nLargest error over the cases that checked each property "
               "(0 everywhere = bitwise agreement). Errors are relative to each tensor's scale (max |A|, |B|); "
               "\"of tolerance\" is the largest error as a fraction of what the policy allowed (above 1 fails).\n\n");
    int rows = 0;
    for (int p = 1; p < FC_NPROP; p++) {
        int n = 0, nf = 0, worst = -1;
        double ma = 0, mr = 0, mu = 0, hr = 0;
        for (int i = 0; i < r->n; i++) {
            const fc_case_result *c = &r->cases[i];
            if (!(rp_checked(c) & (1u << p))) continue;
            n++;
            nf += (rp_failed(c) >> p) & 1;
            ma = rp_max(ma, c->v.max_abs[p]);
            mr = rp_max(mr, c->v.max_scaled[p]);
            hr = rp_max(hr, c->v.headroom[p]);
            double v = c->v.max_ulp[p];
            if (worst < 0 || (!isnan(mu) && (isnan(v) || v > mu))) worst = c->index;
            mu = rp_max(mu, v);
        }
        if (!n) continue;
        if (!rows++)
            rp_puts(b, "| property | cases | failed | max abs | max error / tensor scale | max ULP at scale | "
                       "of tolerance | case of max ULP |\n|---|---|---|---|---|---|---|---|\n");
        rp_printf(b, "| P%d | %d | %d | ", p, n, nf);
        rp_num(b, ma);
        rp_puts(b, " | ");
        rp_num(b, mr);
        rp_puts(b, " | ");
        rp_ulp(b, mu);
        rp_puts(b, " | ");
        rp_num(b, hr);
        if (mu == 0) rp_puts(b, " | — |\n");
        else rp_printf(b, " | %d |\n", worst);
    }
    rp_puts(b, rows ? "\n" : "No property was checked.\n\n");
}

static void rp_md_comm_mem(rp_buf *b, const fc_sweep_report *r) {
    rp_group *g = NULL;
    int ng = rp_groups(r, &g);
    static const fc_op OPS[3] = {FC_OP_ALL_GATHER, FC_OP_REDUCE_SCATTER, FC_OP_ALL_REDUCE};
    rp_puts(b, "## Communication volume\n\nMean bytes issued per step on rank 0, by collective, over the cases "
               "of each strategy and W.\n\n");
    if (!ng) {
        rp_puts(b, "No cases.\n\n");
    } else {
        rp_puts(b, "| strategy | W | cases |");
        for (int k = 0; k < 3; k++) rp_printf(b, " %s |", fc_op_name(OPS[k]));
        rp_puts(b, " total |\n|---|---|---|---|---|---|---|\n");
        for (int j = 0; j < ng; j++) {
            double t = 0;
            rp_printf(b, "| %s | %d | %d |", rp_sname(g[j].s), g[j].W, g[j].n);
            for (int k = 0; k < 3; k++) {
                rp_printf(b, " %.0f |", g[j].comm[OPS[k]]);
                t += g[j].comm[OPS[k]];
            }
            rp_printf(b, " %.0f |\n", t);
        }
        rp_puts(b, "\n");
    }

    rp_puts(b, "## Per-rank peak memory\n\nMean over the cases of each strategy and W of the per-rank peak bytes "
               "per category (device + host, the largest over ranks), and of the peak of their sum.\n\n");
    if (!ng) {
        rp_puts(b, "No cases.\n\n");
    } else {
        rp_puts(b, "| strategy | W | cases |");
        for (int k = 0; k < FC_MEM_COUNT; k++) rp_printf(b, " %s |", fc_mem_cat_name((fc_mem_cat)k));
        rp_puts(b, " total |\n|---|---|---|");
        for (int k = 0; k <= FC_MEM_COUNT; k++) rp_puts(b, "---|");
        rp_puts(b, "\n");
        for (int j = 0; j < ng; j++) {
            rp_printf(b, "| %s | %d | %d |", rp_sname(g[j].s), g[j].W, g[j].n);
            for (int k = 0; k < FC_MEM_COUNT; k++) rp_printf(b, " %.0f |", g[j].mem[k]);
            rp_printf(b, " %.0f |\n", g[j].total);
        }
        rp_puts(b, "\n");
    }
    free(g);
}

static void rp_md_plot(rp_buf *b, const fc_sweep_report *r, const char *svg_name) {
    rp_puts(b, "## Per-rank memory against W\n\n![Per-rank memory against W](");
    rp_md_link(b, svg_name);
    rp_puts(b, ")\n\n");
    double psi = (double)r->plot_numel;
    rp_puts(b, "Model ");
    rp_md_code(b, r->plot_model, sizeof r->plot_model);
    if (r->plot_numel) rp_printf(b, ", Ψ = %zu parameters", r->plot_numel);
    rp_puts(b, ". Measured: per-rank peak bytes of parameter, gradient and optimizer-state shards plus gathered "
               "parameters.");
    if (r->plot_numel)
        rp_puts(b, " Formulas (Rajbhandari et al., fp32 AdamW: 4 + 4 + 8 bytes per parameter): DDP 16Ψ; "
                   "ZeRO-2 4Ψ + 12Ψ/W (the gathered full parameters during compute, with gradients and "
                   "optimizer state sharded); ZeRO-3 16Ψ/W. FSDP's `shard_grad_op` also keeps its 4Ψ/W "
                   "parameter shard beside the gathered parameters, and uneven shards are padded, so measured "
                   "points may sit slightly above their curve.");
    rp_puts(b, "\n\n");

    int present[RP_NS] = {0};
    for (int i = 0; i < r->n_points; i++) present[rp_sidx((int)r->points[i].strategy)] = 1;
    int wmax = rp_plot_wmax(r);
    // columns: each ZeRO strategy's measured bytes beside its formula, then
    // any other strategy that was measured
    rp_puts(b, "| W |");
    int ncol = 1;
    for (int f = 0; f < RP_NFORM; f++) {
        rp_printf(b, " %s (bytes) |", rp_sname(RP_FORM_STRATEGY[f]));
        ncol++;
        if (r->plot_numel) rp_printf(b, " %s |", RP_FORM_NAME[f]), ncol++;
    }
    for (int s = 0; s < RP_NS; s++) {
        int zero = s == FC_STRATEGY_NO_SHARD || s == FC_STRATEGY_SHARD_GRAD_OP || s == FC_STRATEGY_FULL_SHARD;
        if (present[s] && !zero) rp_printf(b, " %s (bytes) |", rp_sname(s)), ncol++;
    }
    rp_puts(b, "\n|");
    for (int k = 0; k < ncol; k++) rp_puts(b, "---|");
    rp_puts(b, "\n");
    for (int w = 1; w <= wmax; w++) {
        rp_printf(b, "| %d |", w);
        size_t v = 0;
        for (int f = 0; f < RP_NFORM; f++) {
            if (rp_point_at(r, RP_FORM_STRATEGY[f], w, &v)) rp_printf(b, " %zu |", v);
            else rp_puts(b, " — |");
            if (r->plot_numel) rp_printf(b, " %.0f |", rp_formula(f, psi, w));
        }
        for (int s = 0; s < RP_NS; s++) {
            int zero = s == FC_STRATEGY_NO_SHARD || s == FC_STRATEGY_SHARD_GRAD_OP || s == FC_STRATEGY_FULL_SHARD;
            if (!present[s] || zero) continue;
            if (rp_point_at(r, s, w, &v)) rp_printf(b, " %zu |", v);
            else rp_puts(b, " — |");
        }
        rp_puts(b, "\n");
    }
    rp_puts(b, "\n");
}

static int rp_check(const fc_sweep_report *r, const char *path, fc_error *e) {
    if (!path || !*path) return fc_fail(e, "report: empty output path");
    if (!r) return fc_fail(e, "%s: no report to write", path);
    if (r->n < 0 || (r->n > 0 && !r->cases))
        return fc_fail(e, "%s: the report holds %d cases but no case data", path, r->n);
    if (r->n_points < 0 || r->n_points > (int)(sizeof r->points / sizeof r->points[0]))
        return fc_fail(e, "%s: the report holds %d memory points (at most %zu)", path, r->n_points,
                       sizeof r->points / sizeof r->points[0]);
    return 0;
}

static int rp_count_failed(const fc_sweep_report *r) {
    int n = 0;
    for (int i = 0; i < r->n; i++) n += rp_case_failed(&r->cases[i]);
    return n;
}

int fc_report_markdown(const fc_sweep_report *r, const char *path, fc_error *e) {
    if (rp_check(r, path, e)) return -1;
    char *svg_path = rp_svg_path(path);
    const char *slash = strrchr(svg_path, '/');
    const char *svg_name = slash ? slash + 1 : svg_path;
    int nfail = rp_count_failed(r);

    rp_buf md = {0}, svg = {0};
    rp_md_header(&md, r, nfail);
    rp_md_matrix(&md, r);
    rp_md_failures(&md, r, nfail);
    rp_md_repro(&md, r, nfail);
    rp_md_errors(&md, r);
    rp_md_comm_mem(&md, r);
    rp_md_plot(&md, r, svg_name);
    rp_svg(&svg, r);

    fc_error inner = {{0}};
    int rc = fc_write_file_atomic(svg_path, svg.p, svg.n, &inner);
    if (rc) fc_fail(e, "%s: cannot write its plot: %s", path, inner.msg);
    if (rc == 0) {
        rc = fc_write_file_atomic(path, md.p, md.n, e);
        if (rc) unlink(svg_path);  // no plot without the report that shows it
    }
    free(md.p);
    free(svg.p);
    free(svg_path);
    return rc;
}

// ----------------------------------------------------------------------------
// JUnit XML (the common Jenkins/GitLab schema)

int fc_report_junit(const fc_sweep_report *r, const char *path, fc_error *e) {
    if (rp_check(r, path, e)) return -1;
    int nfail = rp_count_failed(r);
    rp_buf b = {0};
    rp_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                  "<testsuites name=\"fsdpcheck\" tests=\"%d\" failures=\"%d\" errors=\"0\" time=\"%.3f\">\n"
                  "  <testsuite name=\"fsdpcheck-sweep\" tests=\"%d\" failures=\"%d\" errors=\"0\" skipped=\"0\" "
                  "time=\"%.3f\">\n    <properties>\n      <property name=\"impl\" value=\"",
              r->n, nfail, rp_secs(r->seconds), r->n, nfail, rp_secs(r->seconds));
    rp_xml(&b, r->impl, sizeof r->impl);
    rp_printf(&b, "\"/>\n      <property name=\"inject\" value=\"%s\"/>\n"
                  "      <property name=\"seed\" value=\"%llu\"/>\n"
                  "      <property name=\"world_size\" value=\"%d\"/>\n",
              rp_fname((int)r->inject), (unsigned long long)r->seed, r->world);
    if (nfail && r->caught_by >= 1 && r->caught_by < FC_NPROP)
        rp_printf(&b, "      <property name=\"caught_by\" value=\"P%d\"/>\n", r->caught_by);
    if (nfail && strnlen(r->repro, sizeof r->repro)) {
        rp_puts(&b, "      <property name=\"repro\" value=\"");
        rp_xml(&b, r->repro, sizeof r->repro);
        rp_puts(&b, "\"/>\n");
    }
    rp_puts(&b, "    </properties>\n");

    int first_failure = 1;
    for (int i = 0; i < r->n; i++) {
        const fc_case_result *c = &r->cases[i];
        rp_printf(&b, "    <testcase classname=\"fsdpcheck.sweep.%s\" name=\"case %03d W=%d ",
                  rp_sname((int)c->cfg.strategy), c->index, c->W);
        rp_xml(&b, c->spec, sizeof c->spec);
        rp_printf(&b, "\" time=\"%.3f\"", rp_secs(c->seconds));
        if (!rp_case_failed(c)) {
            rp_puts(&b, "/>\n");
            continue;
        }
        unsigned fl = rp_failed(c);
        rp_puts(&b, ">\n      <failure message=\"");
        rp_props(&b, fl);
        rp_puts(&b, " failed\" type=\"property\">");
        rp_xml(&b, c->v.detail, sizeof c->v.detail);
        rp_puts(&b, "&#10;");
        for (int p = 1; p < FC_NPROP; p++) {
            if (!(fl & (1u << p))) continue;
            rp_printf(&b, "P%d: ", p);
            rp_xml_desc(&b, p);
            rp_puts(&b, "&#10;");
        }
        rp_printf(&b, "case %d at W=%d: ", c->index, c->W);
        rp_xml(&b, c->spec, sizeof c->spec);
        if (first_failure && strnlen(r->repro, sizeof r->repro)) {
            rp_puts(&b, "&#10;shrunk reproducer of this first failure: ");
            rp_xml(&b, r->repro, sizeof r->repro);
        }
        first_failure = 0;
        rp_puts(&b, "</failure>\n    </testcase>\n");
    }
    rp_puts(&b, "    <system-out>");
    rp_printf(&b, "fsdpcheck sweep: %d cases, %d failed, seed %llu, world size %d, inject %s", r->n, nfail,
              (unsigned long long)r->seed, r->world, rp_fname((int)r->inject));
    if (nfail && strnlen(r->repro, sizeof r->repro)) {
        rp_puts(&b, "&#10;reproduce: ");
        rp_xml(&b, r->repro, sizeof r->repro);
    }
    rp_puts(&b, "</system-out>\n  </testsuite>\n</testsuites>\n");

    int rc = fc_write_file_atomic(path, b.p, b.n, e);
    free(b.p);
    return rc;
}
