// oracle/report_internal.h — what the sweep's report files share (report.c
// the buffer, escaping, names and numbers; report_md.c the Markdown;
// report_svg.c its plot; report_junit.c the JUnit XML). Nothing outside the
// reports uses it.
#ifndef FC_REPORT_INTERNAL_H
#define FC_REPORT_INTERNAL_H

#include <stddef.h>

#include "sweep.h"

// A growable text buffer, always NUL-terminated.
typedef struct {
    char *p;
    size_t n, cap;
} rp_buf;

void rp_put(rp_buf *b, const char *s, size_t len);
void rp_puts(rp_buf *b, const char *s);
void rp_printf(rp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// The first max bytes of s (or up to its NUL), escaped: as XML character
// data, as Markdown text, as an inline code span (CommonMark: a fence longer
// than any backtick run inside), and as a fenced block of one command line.
void rp_xml(rp_buf *b, const char *s, size_t max);
void rp_md(rp_buf *b, const char *s, size_t max);
void rp_md_code(rp_buf *b, const char *s, size_t max);
void rp_md_block(rp_buf *b, const char *s, size_t max, const char *lang);

#define RP_NS (FC_STRATEGY_COUNT + 1)                     // the strategies, plus "unknown" for a bad value
#define RP_PMASK ((((unsigned)1 << FC_NPROP) - 1) & ~1u)  // bits 1..15: P1..P15

// A strategy's column (RP_NS - 1 for a bad value), and strategy and fault names ("unknown" for a bad value).
int rp_sidx(int s);
const char *rp_sname(int s);
const char *rp_fname(int f);

// One line per property of docs/contract.md §8 (Markdown; rp_xml_desc drops the backticks for XML).
extern const char *const RP_PROP_DESC[FC_NPROP];
void rp_xml_desc(rp_buf *b, int p);

// A case's checked (failed ones included) and failed properties, P1..P15 only.
unsigned rp_checked(const fc_case_result *c);
unsigned rp_failed(const fc_case_result *c);
int rp_case_failed(const fc_case_result *c);
// "P2, P5" (or "P?" when only bits outside P1..P15 are set).
void rp_props(rp_buf *b, unsigned mask);

// Largest value, NaN sticky: a NaN error is the loudest result there is.
double rp_max(double m, double v);
void rp_num(rp_buf *b, double v);
void rp_ulp(rp_buf *b, double v);
// A wall time as JUnit's time pattern accepts it: finite, not negative.
double rp_secs(double v);

// ZeRO per-rank model-state bytes for fp32 AdamW (Rajbhandari et al.): the
// formulas, their names, and the strategy each describes.
enum { RP_DDP, RP_ZERO2, RP_ZERO3, RP_NFORM };
extern const char *const RP_FORM_NAME[RP_NFORM];
extern const fc_strategy RP_FORM_STRATEGY[RP_NFORM];
double rp_formula(int which, double psi, double W);

// The memory points of the plot: a point's bytes, the x range 1 .. wmax, and
// the largest measured bytes of strategy s at W (0 when there is none).
size_t rp_point_bytes(const fc_mem_point *p);
int rp_plot_wmax(const fc_sweep_report *r);
int rp_point_at(const fc_sweep_report *r, int s, int W, size_t *out);

// 0, or -1 with e set when r cannot be written to path.
int rp_check(const fc_sweep_report *r, const char *path, fc_error *e);
int rp_count_failed(const fc_sweep_report *r);

// The SVG plot of per-rank memory against W (report_svg.c).
void rp_svg(rp_buf *b, const fc_sweep_report *r);

#endif
