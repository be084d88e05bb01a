// tests/unit/test_report.c — the sweep's reports (oracle/report*.c): Markdown
// with its SVG plot, and JUnit XML.
//
// oracle/ is not a library, so report*.c are compiled into this test directly.
// Every test builds an fc_sweep_report by hand, writes the files into a
// mkdtemp directory and reads them back as text: table cells are located by
// their column header, XML is checked by a small well-formedness checker
// written here, and the ZeRO formula values are computed here on their own.
#include "../../oracle/report.c"
#include "../../oracle/report_junit.c"
#include "../../oracle/report_md.c"
#include "../../oracle/report_svg.c"
#include "../../oracle/sweep.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// helpers

static char *t_mkdtemp(void) {
    char *dir = strdupCheck("/tmp/fc_test_report_XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp failed: %s", strerror(errno));
    return dir;
}

// Removes a directory tree at most two levels deep (all these tests create).
static void t_rmtree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *ent;
    char p[4096];
    while ((ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) t_rmtree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int t_count_entries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)))
        if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..")) n++;
    closedir(d);
    return n;
}

static char *t_path(const char *dir, const char *name) {
    char *p = mallocCheck(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static int t_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

// The whole file, NUL-terminated; NULL when it cannot be read.
static char *t_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = mallocCheck(cap);
    size_t k;
    while ((k = fread(s + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) s = reallocCheck(s, cap *= 2);
    }
    fclose(f);
    s[n] = '\0';
    if (len) *len = n;
    return s;
}

static int t_count(const char *hay, const char *needle) {
    int n = 0;
    size_t l = strlen(needle);
    for (const char *p = strstr(hay, needle); p; p = strstr(p + l, needle)) n++;
    return n;
}

// Splits the Markdown table line at line (up to its newline) into trimmed
// cells, honouring GFM's "\|" escape. Returns the cell count.
#define T_MAXCELL 24
static int t_cells(const char *line, char cells[][1024], int max) {
    const char *end = strchr(line, '\n');
    if (!end) end = line + strlen(line);
    cr_assert(line[0] == '|', "not a table row: %.60s", line);
    int n = 0;
    const char *p = line + 1;
    while (p < end && n < max) {
        const char *q = p;
        while (q < end && !(*q == '|' && q[-1] != '\\')) q++;
        if (q >= end) break;
        const char *a = p, *b = q;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        snprintf(cells[n], 1024, "%.*s", (int)(b - a), a);
        n++;
        p = q + 1;
    }
    return n;
}

// The text of a "## heading" section, up to the next "## " heading.
static char *t_section(const char *md, const char *heading) {
    char h[256];
    snprintf(h, sizeof h, "\n## %s\n", heading);
    const char *s = strstr(md, h);
    cr_assert_not_null(s, "no section \"%s\" in the Markdown", heading);
    s += 1;
    const char *e = strstr(s + 3, "\n## ");
    size_t n = e ? (size_t)(e - s) + 1 : strlen(s);
    char *out = mallocCheck(n + 1);
    memcpy(out, s, n);
    out[n] = '\0';
    return out;
}

// The first table of a section: its header cells, and the row whose first
// cell is key (cells of that row). Returns the row's cell count, 0 if absent.
static int t_row(const char *sec, const char *key, char header[][1024], int *nheader, char row[][1024]) {
    const char *t = strstr(sec, "\n|");
    cr_assert_not_null(t, "no table in section: %.80s", sec);
    t++;
    *nheader = t_cells(t, header, T_MAXCELL);
    for (const char *l = t; l && *l == '|'; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        int n = t_cells(l, row, T_MAXCELL);
        if (n && strcmp(row[0], key) == 0) return n;
    }
    return 0;
}

// The cell of the row keyed key under the column named col.
static const char *t_cell(const char *md, const char *heading, const char *key, const char *col) {
    static char header[T_MAXCELL][1024], row[T_MAXCELL][1024];
    char *sec = t_section(md, heading);
    int nh = 0, nr = t_row(sec, key, header, &nh, row);
    free(sec);
    cr_assert(nr > 0, "section \"%s\": no row \"%s\"", heading, key);
    cr_assert_eq(nr, nh, "section \"%s\" row \"%s\": %d cells, header has %d", heading, key, nr, nh);
    for (int i = 0; i < nh; i++)
        if (strcmp(header[i], col) == 0) return row[i];
    cr_assert_fail("section \"%s\": no column \"%s\"", heading, col);
    return NULL;
}

static int t_entity_ok(const char *p) {
    static const char *const named[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    for (int i = 0; i < 5; i++)
        if (!strncmp(p, named[i], strlen(named[i]))) return 1;
    if (p[1] != '#') return 0;
    const char *q = p + 2;
    int hex = *q == 'x';
    if (hex) q++;
    const char *d = q;
    while (hex ? strchr("0123456789abcdefABCDEF", *q) && *q : (*q >= '0' && *q <= '9')) q++;
    return q > d && *q == ';';
}

// A small XML well-formedness check: one root element, tags nest and match,
// attribute values quoted with no '<', text and attributes hold only valid
// entity references, no control characters other than tab, LF, CR.
static int t_xml_ok(const char *s, char *why, size_t wn) {
    const char *stack[128];
    size_t lens[128];
    int depth = 0, roots = 0;
    const char *p = s;
#define T_BAD(...) return snprintf(why, wn, __VA_ARGS__), 0
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        if (!p) T_BAD("unterminated XML declaration");
        p += 2;
    }
    while (*p) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') T_BAD("control byte 0x%02x at %td", c, p - s);
        if (c == '<') {
            if (p[1] == '/') {
                const char *name = p + 2;
                size_t len = strcspn(name, " \t\n>");
                if (!depth) T_BAD("close tag with nothing open at %td", p - s);
                depth--;
                if (len != lens[depth] || strncmp(name, stack[depth], len))
                    T_BAD("</%.*s> closes <%.*s>", (int)len, name, (int)lens[depth], stack[depth]);
                p = strchr(p, '>');
                if (!p) T_BAD("unterminated close tag");
                p++;
                continue;
            }
            const char *name = p + 1;
            size_t len = strcspn(name, " \t\n/>");
            if (!len) T_BAD("empty tag name at %td", p - s);
            const char *q = name + len;
            char quote = 0;
            for (; *q; q++) {
                if (quote) {
                    if (*q == quote) quote = 0;
                    else if (*q == '<') T_BAD("'<' in an attribute value at %td", q - s);
                    else if (*q == '&' && !t_entity_ok(q)) T_BAD("bad entity in an attribute at %td", q - s);
                } else if (*q == '"' || *q == '\'') {
                    quote = *q;
                } else if (*q == '>') {
                    break;
                }
            }
            if (!*q) T_BAD("unterminated tag <%.*s", (int)len, name);
            if (!depth) roots++;
            if (q[-1] != '/') {
                if (depth == 128) T_BAD("too deep");
                stack[depth] = name;
                lens[depth++] = len;
            }
            p = q + 1;
            continue;
        }
        if (c == '&' && !t_entity_ok(p)) T_BAD("bad entity at %td: %.12s", p - s, p);
        if (c == '>' ) T_BAD("raw '>' in text at %td", p - s);
        if (!depth && c != ' ' && c != '\n' && c != '\t' && c != '\r') T_BAD("text outside the root at %td", p - s);
        p++;
    }
    if (depth) T_BAD("<%.*s> never closed", (int)lens[depth - 1], stack[depth - 1]);
    if (roots != 1) T_BAD("%d root elements", roots);
    return 1;
#undef T_BAD
}

// ----------------------------------------------------------------------------
// the fixture: a sweep by hand

#define P(k) (1u << (k))
#define PSI 1001
#define SPEC_NASTY "--strategy shard_grad_op --model \"a<b&c>d|e\" --note 'q' \x01x"

static void t_case(fc_case_result *c, int index, fc_strategy s, int W, unsigned checked, unsigned failed,
                   const char *spec) {
    memset(c, 0, sizeof *c);
    c->index = index;
    c->W = W;
    fc_run_config_defaults(&c->cfg);
    c->cfg.strategy = s;
    c->v.checked = checked;
    c->v.failed = failed;
    snprintf(c->spec, sizeof c->spec, "%s", spec);
    c->seconds = 0.25 + index;
}

static size_t t_ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Seven cases over five strategies and W = 1..4, two of them failing; a shrunk
// reproducer; memory points of no_shard, shard_grad_op and full_shard at W = 1..4.
static fc_sweep_report *t_report(void) {
    fc_sweep_report *r = callocCheck(1, sizeof *r);
    snprintf(r->impl, sizeof r->impl, "reference");
    r->inject = FC_FAULT_NONE;
    r->seed = 1234;
    r->world = 4;
    r->seconds = 12.5;
    r->n = 7;
    r->cases = callocCheck((size_t)r->n, sizeof *r->cases);
    fc_case_result *c = r->cases;
    t_case(&c[0], 0, FC_STRATEGY_NO_SHARD, 1, P(1) | P(2) | P(12), 0, "--strategy no_shard --steps 2");
    t_case(&c[1], 1, FC_STRATEGY_FULL_SHARD, 2, P(2) | P(4) | P(10) | P(11), 0, "--strategy full_shard --steps 3");
    c[1].v.max_abs[2] = 1e-7, c[1].v.max_scaled[2] = 2e-6, c[1].v.max_ulp[2] = 3.5, c[1].v.headroom[2] = 0.05;
    t_case(&c[2], 2, FC_STRATEGY_SHARD_GRAD_OP, 2, P(2) | P(11), P(2), SPEC_NASTY);
    c[2].v.max_abs[2] = 0.25, c[2].v.max_scaled[2] = 1, c[2].v.max_ulp[2] = 8388608, c[2].v.headroom[2] = 25000;
    snprintf(c[2].v.detail, sizeof c[2].v.detail, "P2 step 1 tensor fc_0.weight[3]: 0.5 vs 0.25 (rank 1) *bad*");
    t_case(&c[3], 3, FC_STRATEGY_FULL_SHARD, 2, P(2) | P(11), 0, "--strategy full_shard --steps 1");
    c[3].v.max_abs[2] = 3e-7, c[3].v.max_scaled[2] = 1e-6, c[3].v.max_ulp[2] = 2, c[3].v.headroom[2] = 0.025;
    t_case(&c[4], 4, FC_STRATEGY_FULL_SHARD, 3, P(5), P(5) | P(11), "--strategy full_shard --global-batch 6");
    snprintf(c[4].v.detail, sizeof c[4].v.detail, "P5 step 0 loss: 1.5 vs 1.25");
    t_case(&c[5], 5, FC_STRATEGY_HYBRID_SHARD, 4, P(3), 0, "--strategy hybrid_shard --shard-group 2");
    t_case(&c[6], 6, FC_STRATEGY_LOCAL, 1, P(1) | P(13), 0, "--strategy local");
    // comm: the two full_shard W=2 cases average to 200 / 100 / 8
    c[1].comm_bytes[FC_OP_ALL_GATHER] = 100, c[1].comm_bytes[FC_OP_REDUCE_SCATTER] = 50;
    c[1].comm_bytes[FC_OP_ALL_REDUCE] = 8;
    c[3].comm_bytes[FC_OP_ALL_GATHER] = 300, c[3].comm_bytes[FC_OP_REDUCE_SCATTER] = 150;
    c[3].comm_bytes[FC_OP_ALL_REDUCE] = 8;
    c[1].mem_peak[FC_MEM_PARAM_SHARD] = 2000, c[3].mem_peak[FC_MEM_PARAM_SHARD] = 2004;
    c[1].mem_peak[FC_MEM_ACTIVATIONS] = 7, c[3].mem_peak[FC_MEM_ACTIVATIONS] = 8;
    c[1].mem_total = 10000, c[3].mem_total = 10001;
    r->n_failed = 2;

    r->have_shrunk = 1;
    t_case(&r->shrunk, 2, FC_STRATEGY_SHARD_GRAD_OP, 1, P(2), P(2), "--strategy shard_grad_op --steps 1 --model mlp-tiny");
    snprintf(r->shrunk.v.detail, sizeof r->shrunk.v.detail, "P2 step 0 tensor fc_0.bias[0]: 1 vs 2 (rank 0)");
    r->caught_by = 2;
    snprintf(r->repro, sizeof r->repro,
             "mpiexec -n 1 fsdpcheck sweep --replay '--strategy shard_grad_op --steps 1 --model mlp-tiny'");

    snprintf(r->plot_model, sizeof r->plot_model, "mlp-tiny");
    r->plot_numel = PSI;
    fc_strategy ss[3] = {FC_STRATEGY_NO_SHARD, FC_STRATEGY_SHARD_GRAD_OP, FC_STRATEGY_FULL_SHARD};
    for (int k = 0; k < 3; k++)
        for (int W = 1; W <= 4; W++) {
            fc_mem_point *p = &r->points[r->n_points++];
            size_t S = ss[k] == FC_STRATEGY_NO_SHARD ? PSI : t_ceil_div(PSI, (size_t)W);
            *p = (fc_mem_point){ss[k], W, 4 * S, 4 * S, 8 * S, 0};
            if (ss[k] == FC_STRATEGY_SHARD_GRAD_OP) p->gathered = 4 * S * (size_t)W;
            if (ss[k] == FC_STRATEGY_FULL_SHARD) p->gathered = 4 * S * (size_t)W / 2;
        }
    return r;
}

static void t_free(fc_sweep_report *r) {
    free(r->cases);
    free(r);
}

typedef struct {
    char *dir, *md_path, *svg_path, *xml_path;
    char *md, *svg, *xml;
} t_out;

// Writes both reports of r into a fresh directory and reads them back.
static t_out t_write(const fc_sweep_report *r) {
    t_out o = {0};
    o.dir = t_mkdtemp();
    o.md_path = t_path(o.dir, "report.md");
    o.svg_path = t_path(o.dir, "report.svg");
    o.xml_path = t_path(o.dir, "junit.xml");
    fc_error e = {{0}};
    cr_assert_eq(fc_report_markdown(r, o.md_path, &e), 0, "markdown: %s", e.msg);
    cr_assert_eq(fc_report_junit(r, o.xml_path, &e), 0, "junit: %s", e.msg);
    o.md = t_read(o.md_path, NULL);
    o.svg = t_read(o.svg_path, NULL);
    o.xml = t_read(o.xml_path, NULL);
    cr_assert_not_null(o.md, "no %s", o.md_path);
    cr_assert_not_null(o.svg, "no %s", o.svg_path);
    cr_assert_not_null(o.xml, "no %s", o.xml_path);
    cr_assert_eq(t_count_entries(o.dir), 3, "expected exactly report.md, report.svg, junit.xml (no temporaries)");
    return o;
}

static void t_out_free(t_out *o) {
    t_rmtree(o->dir);
    free(o->dir), free(o->md_path), free(o->svg_path), free(o->xml_path);
    free(o->md), free(o->svg), free(o->xml);
}

// ----------------------------------------------------------------------------
// Markdown

Test(report, markdown_header_and_verdict) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    cr_assert(strncmp(o.md, "# fsdpcheck sweep report\n", 25) == 0, "title: %.40s", o.md);
    cr_assert_not_null(strstr(o.md, "| implementation | `reference` |"));
    cr_assert_not_null(strstr(o.md, "| injected fault | none |"));
    cr_assert_not_null(strstr(o.md, "| seed | 1234 |"));
    cr_assert_not_null(strstr(o.md, "| world size | 4 |"));
    cr_assert_not_null(strstr(o.md, "| cases | 7 (0 FSDP2) |"));
    cr_assert_not_null(strstr(o.md, "| failures | 2 |"));
    cr_assert_not_null(strstr(o.md, "| wall time | 12.5 s |"));
    cr_assert_not_null(strstr(o.md, "**Verdict: FAIL**: 2 of 7 cases failed; the first failure is caught by P2."),
                       "verdict line missing:\n%s", o.md);
    t_out_free(&o);
    t_free(r);
}

Test(report, markdown_matrix_cells) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    const char *H = "Pass/fail matrix";
    cr_assert_str_eq(t_cell(o.md, H, "P2", "no_shard"), "1/1");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "full_shard"), "2/2");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "shard_grad_op"), "0/1 ✗");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "local"), "—");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "all"), "3/4 ✗");
    cr_assert_str_eq(t_cell(o.md, H, "P1", "local"), "1/1");
    cr_assert_str_eq(t_cell(o.md, H, "P1", "all"), "2/2");
    // P11 failed in case 4 without being listed in its checked mask: still counted as checked
    cr_assert_str_eq(t_cell(o.md, H, "P11", "full_shard"), "2/3 ✗");
    cr_assert_str_eq(t_cell(o.md, H, "P11", "shard_grad_op"), "1/1");
    cr_assert_str_eq(t_cell(o.md, H, "P5", "full_shard"), "0/1 ✗");
    cr_assert_str_eq(t_cell(o.md, H, "P3", "hybrid_shard"), "1/1");
    cr_assert_not_null(strstr(t_cell(o.md, H, "P12", "description"), "bitwise identical"));
    // rows only for checked properties, columns only for strategies seen
    char *sec = t_section(o.md, H);
    cr_assert_null(strstr(sec, "| P6 |"), "P6 was never checked");
    cr_assert_null(strstr(sec, "| P14 |"), "P14 was never checked");
    cr_assert_null(strstr(sec, "hybrid_shard_zero2"), "hybrid_shard_zero2 was never run");
    free(sec);
    cr_assert_str_eq(t_cell(o.md, "Cases per world size", "3", "failed"), "1");
    cr_assert_str_eq(t_cell(o.md, "Cases per world size", "2", "cases"), "3");
    t_out_free(&o);
    t_free(r);
}

Test(report, markdown_failing_cases_and_escaping) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    const char *H = "Failing cases";
    cr_assert_str_eq(t_cell(o.md, H, "2", "W"), "2");
    cr_assert_str_eq(t_cell(o.md, H, "2", "properties"), "P2");
    cr_assert_str_eq(t_cell(o.md, H, "4", "properties"), "P5, P11");
    // the spec as a code span: < & " ' verbatim (code spans show them literally),
    // the pipe escaped for the table, the control byte made visible
    cr_assert_str_eq(t_cell(o.md, H, "2", "spec"),
                     "`--strategy shard_grad_op --model \"a<b&c>d\\|e\" --note 'q' \\x01x`");
    // detail as text: Markdown specials escaped, intraword underscore kept
    cr_assert_str_eq(t_cell(o.md, H, "2", "detail"),
                     "P2 step 1 tensor fc_0.weight\\[3\\]: 0.5 vs 0.25 (rank 1) \\*bad\\*");
    cr_assert_eq(t_count(o.md, "\x01"), 0, "a raw control byte reached the Markdown");
    char *sec = t_section(o.md, H);
    cr_assert_null(strstr(sec, "| 0 |"), "passing case 0 listed as failing");
    free(sec);
    t_out_free(&o);
    t_free(r);
}

Test(report, markdown_failing_cases_capped_at_50) {
    fc_sweep_report *r = t_report();
    free(r->cases);
    r->n = 60;
    r->cases = callocCheck(60, sizeof *r->cases);
    for (int i = 0; i < 60; i++) t_case(&r->cases[i], i, FC_STRATEGY_FULL_SHARD, 2, P(2), P(2), "--strategy full_shard");
    t_out o = t_write(r);
    char *sec = t_section(o.md, "Failing cases");
    int rows = t_count(sec, "\n| ") - 1;  // less the header row
    cr_assert_eq(rows, 50, "%d failing rows shown", rows);
    cr_assert_not_null(strstr(sec, "10 more failing cases"));
    cr_assert_not_null(strstr(sec, "| 49 |"));
    cr_assert_null(strstr(sec, "| 50 |"));
    free(sec);
    cr_assert_not_null(strstr(o.md, "| failures | 60 |"));
    cr_assert_not_null(strstr(o.xml, "tests=\"60\" failures=\"60\""));
    t_out_free(&o);
    t_free(r);
}

Test(report, markdown_shrunk_reproducer) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    char *sec = t_section(o.md, "Shrunk reproducer");
    cr_assert_not_null(strstr(sec, "- property: **P2**: `no_shard` ≡ `full_shard` ≡ `shard_grad_op`"), "%s", sec);
    cr_assert_not_null(strstr(sec, "- minimal case, at W = 1: `--strategy shard_grad_op --steps 1 --model mlp-tiny`"),
                       "%s", sec);
    cr_assert_not_null(strstr(sec, "```sh\nmpiexec -n 1 fsdpcheck sweep --replay '--strategy shard_grad_op --steps 1 "
                                   "--model mlp-tiny'\n```\n"), "%s", sec);
    free(sec);
    t_out_free(&o);

    // a reproducer holding a backtick fence gets a longer fence
    snprintf(r->repro, sizeof r->repro, "echo ```x``` && fsdpcheck sweep");
    o = t_write(r);
    cr_assert_not_null(strstr(o.md, "````sh\necho ```x``` && fsdpcheck sweep\n````\n"), "%s", o.md);
    t_out_free(&o);
    t_free(r);
}

Test(report, markdown_error_magnitudes) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    const char *H = "Error magnitudes";
    char *sec = t_section(o.md, H);
    cr_assert_not_null(strstr(sec, "| property | cases | failed | max abs | max error / tensor scale | "
                                   "max ULP at scale | of tolerance | case of max ULP |"), "%s", sec);
    cr_assert_not_null(strstr(sec, "relative to each tensor's scale"), "%s", sec);
    free(sec);
    cr_assert_str_eq(t_cell(o.md, H, "P2", "cases"), "4");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "failed"), "1");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "max abs"), "0.25");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "max error / tensor scale"), "1");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "max ULP at scale"), "8388608");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "of tolerance"), "2.5e+04");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "case of max ULP"), "2");
    cr_assert_str_eq(t_cell(o.md, H, "P1", "max ULP at scale"), "0");
    cr_assert_str_eq(t_cell(o.md, H, "P1", "of tolerance"), "0");
    cr_assert_str_eq(t_cell(o.md, H, "P1", "case of max ULP"), "—");
    t_out_free(&o);
    // ULPs at a scale are not whole numbers: three digits
    r->cases[2].v.max_ulp[2] = 0;
    r->cases[2].v.headroom[2] = 0.5;
    o = t_write(r);
    cr_assert_str_eq(t_cell(o.md, H, "P2", "max ULP at scale"), "3.5");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "case of max ULP"), "1");
    cr_assert_str_eq(t_cell(o.md, H, "P2", "of tolerance"), "0.5");
    t_out_free(&o);
    // NaN is the loudest error: it wins over any number
    r->cases[3].v.max_abs[2] = NAN;
    o = t_write(r);
    cr_assert_str_eq(t_cell(o.md, H, "P2", "max abs"), "nan");
    t_out_free(&o);
    t_free(r);
}

Test(report, markdown_comm_and_memory_means) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    // the (strategy, W) key is two cells: find the full_shard W=2 row by hand
    char *sec = t_section(o.md, "Communication volume");
    cr_assert_not_null(strstr(sec, "| strategy | W | cases | all_gather | reduce_scatter | all_reduce | total |"), "%s", sec);
    cr_assert_not_null(strstr(sec, "| full_shard | 2 | 2 | 200 | 100 | 8 | 308 |"), "%s", sec);
    cr_assert_not_null(strstr(sec, "| full_shard | 3 | 1 | 0 | 0 | 0 | 0 |"), "%s", sec);
    // sorted by strategy (enum order), then W
    cr_assert_lt(strstr(sec, "| local | 1 |"), strstr(sec, "| no_shard | 1 |"));
    cr_assert_lt(strstr(sec, "| full_shard | 2 |"), strstr(sec, "| full_shard | 3 |"));
    cr_assert_lt(strstr(sec, "| full_shard | 3 |"), strstr(sec, "| shard_grad_op | 2 |"));
    free(sec);
    sec = t_section(o.md, "Per-rank peak memory");
    // param_shards mean 2002, activations mean 7.5 rounds to even 8, total mean 10000.5 -> 10000
    cr_assert_not_null(strstr(sec, "| full_shard | 2 | 2 | 2002 | 0 | 0 | 0 | 0 | 8 | 0 | 10000 |"), "%s", sec);
    cr_assert_not_null(strstr(sec, "| param_shards | grad_shards | optim_state | gathered_params | gathered_grads | "
                                   "activations | comm_buffers | total |"), "%s", sec);
    free(sec);
    t_out_free(&o);
    t_free(r);
}

Test(report, markdown_memory_table_formulas) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    const char *H = "Per-rank memory against W";
    char want[64];
    const double psi = PSI;
    for (int W = 1; W <= 4; W++) {
        char key[16];
        snprintf(key, sizeof key, "%d", W);
        snprintf(want, sizeof want, "%.0f", psi * 16);
        cr_assert_str_eq(t_cell(o.md, H, key, "DDP 16Ψ"), want, "W=%d", W);
        snprintf(want, sizeof want, "%.0f", psi * 4 + psi * 12 / W);
        cr_assert_str_eq(t_cell(o.md, H, key, "ZeRO-2 4Ψ + 12Ψ/W"), want, "W=%d", W);
        snprintf(want, sizeof want, "%.0f", psi * 16 / W);
        cr_assert_str_eq(t_cell(o.md, H, key, "ZeRO-3 16Ψ/W"), want, "W=%d", W);
    }
    // by hand for W = 3, Psi = 1001: 16016, 4004 + 4004 = 8008, 5338.67 -> 5339
    cr_assert_str_eq(t_cell(o.md, H, "3", "DDP 16Ψ"), "16016");
    cr_assert_str_eq(t_cell(o.md, H, "3", "ZeRO-2 4Ψ + 12Ψ/W"), "8008");
    cr_assert_str_eq(t_cell(o.md, H, "3", "ZeRO-3 16Ψ/W"), "5339");
    // measured: param + grad + optim + gathered; full_shard at W=3: S = 334 -> 16*334 + 4*334*3/2
    snprintf(want, sizeof want, "%d", 16 * 334 + 4 * 334 * 3 / 2);
    cr_assert_str_eq(t_cell(o.md, H, "3", "full_shard (bytes)"), want);
    cr_assert_str_eq(t_cell(o.md, H, "1", "no_shard (bytes)"), "16016");
    cr_assert_not_null(strstr(o.md, "![Per-rank memory against W](report.svg)"));
    char *sec = t_section(o.md, H);
    cr_assert_null(strstr(sec, "| 5 |"), "x range goes past the largest W of the points");
    free(sec);
    t_out_free(&o);
    t_free(r);
}

// ----------------------------------------------------------------------------
// SVG

Test(report, svg_wellformed_with_curves_and_markers) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    char why[256] = "";
    cr_assert(strncmp(o.svg, "<svg ", 5) == 0, "SVG starts with %.20s", o.svg);
    cr_assert_not_null(strstr(o.svg, "xmlns=\"http://www.w3.org/2000/svg\""));
    cr_assert_not_null(strstr(o.svg, "version=\"1.1\""));
    size_t n = strlen(o.svg);
    cr_assert(n > 7 && strcmp(o.svg + n - 7, "</svg>\n") == 0, "SVG does not end with </svg>");
    cr_assert(t_xml_ok(o.svg, why, sizeof why), "SVG not well-formed: %s", why);
    cr_assert_eq(t_count(o.svg, "<polyline"), 3, "three formula curves");
    cr_assert_not_null(strstr(o.svg, "id=\"formula-ddp\""));
    cr_assert_not_null(strstr(o.svg, "id=\"formula-zero2\""));
    cr_assert_not_null(strstr(o.svg, "id=\"formula-zero3\""));
    // one marker per point, plus one legend marker per series
    cr_assert_eq(t_count(o.svg, "<circle"), r->n_points + 3);
    for (int i = 0; i < r->n_points; i++) {
        const fc_mem_point *p = &r->points[i];
        char t[128];
        snprintf(t, sizeof t, "<title>%s W=%d: %zu bytes</title>", fc_strategy_name(p->strategy), p->W,
                 p->param + p->grad + p->optim + p->gathered);
        cr_assert_not_null(strstr(o.svg, t), "no marker %s", t);
    }
    cr_assert_not_null(strstr(o.svg, "world size W"), "x axis label");
    cr_assert_not_null(strstr(o.svg, "per-rank bytes (KiB)"), "y axis label with its unit");
    cr_assert_not_null(strstr(o.svg, "ZeRO-3 16Ψ/W"), "legend");
    cr_assert_not_null(strstr(o.svg, "Per-rank memory against W: mlp-tiny"), "title");
    t_out_free(&o);
    t_free(r);
}

Test(report, svg_escapes_model_name_and_handles_no_points) {
    fc_sweep_report *r = t_report();
    snprintf(r->plot_model, sizeof r->plot_model, "m<&\"'>\x02");
    r->n_points = 0;
    r->plot_numel = 0;
    t_out o = t_write(r);
    char why[256] = "";
    cr_assert(t_xml_ok(o.svg, why, sizeof why), "SVG not well-formed: %s", why);
    cr_assert_not_null(strstr(o.svg, "m&lt;&amp;&quot;&apos;&gt;\\x02"));
    cr_assert_eq(t_count(o.svg, "<polyline"), 0, "no Psi, no formula curves");
    cr_assert_eq(t_count(o.svg, "<circle"), 0);
    cr_assert_not_null(strstr(o.svg, "no measured points"));
    cr_assert_not_null(strstr(o.md, "| W | no_shard (bytes) | shard_grad_op (bytes) | full_shard (bytes) |"), "%s", o.md);
    t_out_free(&o);
    t_free(r);
}

Test(report, svg_path_without_md_suffix) {
    fc_sweep_report *r = t_report();
    char *dir = t_mkdtemp();
    char *md = t_path(dir, "my report");
    char *svg = t_path(dir, "my report.svg");
    fc_error e = {{0}};
    cr_assert_eq(fc_report_markdown(r, md, &e), 0, "%s", e.msg);
    cr_assert(t_exists(svg), "no %s", svg);
    char *text = t_read(md, NULL);
    cr_assert_not_null(strstr(text, "![Per-rank memory against W](my%20report.svg)"));
    free(text);
    t_rmtree(dir);
    free(dir), free(md), free(svg);
    t_free(r);
}

// ----------------------------------------------------------------------------
// JUnit

Test(report, junit_counts_cases_and_failures) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    char why[256] = "";
    cr_assert(strncmp(o.xml, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", 39) == 0);
    cr_assert(t_xml_ok(o.xml, why, sizeof why), "JUnit not well-formed: %s\n%s", why, o.xml);
    cr_assert_not_null(strstr(o.xml, "<testsuites name=\"fsdpcheck\" tests=\"7\" failures=\"2\" errors=\"0\""));
    cr_assert_not_null(strstr(o.xml, "<testsuite name=\"fsdpcheck-sweep\" tests=\"7\" failures=\"2\" errors=\"0\" "
                                     "skipped=\"0\" time=\"12.500\">"));
    cr_assert_eq(t_count(o.xml, "<testcase "), 7);
    cr_assert_eq(t_count(o.xml, "<failure "), 2);
    cr_assert_not_null(strstr(o.xml, "<testcase classname=\"fsdpcheck.sweep.no_shard\" "
                                     "name=\"case 000 W=1 --strategy no_shard --steps 2\" time=\"0.250\"/>"));
    cr_assert_not_null(strstr(o.xml, "<testcase classname=\"fsdpcheck.sweep.hybrid_shard\" name=\"case 005 W=4 "));
    cr_assert_not_null(strstr(o.xml, "<failure message=\"P2 failed\" type=\"property\">P2 step 1 tensor"));
    cr_assert_not_null(strstr(o.xml, "<failure message=\"P5, P11 failed\" type=\"property\">P5 step 0 loss"));
    cr_assert_not_null(strstr(o.xml, "<property name=\"caught_by\" value=\"P2\"/>"));
    cr_assert_not_null(strstr(o.xml, "<property name=\"seed\" value=\"1234\"/>"));
    // the shrunk reproducer rides on the first failure only
    cr_assert_eq(t_count(o.xml, "shrunk reproducer of this first failure"), 1);
    cr_assert_lt(strstr(o.xml, "shrunk reproducer of this first failure"), strstr(o.xml, "case 004"));
    t_out_free(&o);
    t_free(r);
}

Test(report, junit_escapes_spec_and_control_bytes) {
    fc_sweep_report *r = t_report();
    t_out o = t_write(r);
    cr_assert_not_null(strstr(o.xml, "name=\"case 002 W=2 --strategy shard_grad_op --model &quot;a&lt;b&amp;c&gt;d|e"
                                     "&quot; --note &apos;q&apos; \\x01x\""), "%s", o.xml);
    cr_assert_null(strstr(o.xml, "a<b"), "raw < from a spec");
    cr_assert_eq(t_count(o.xml, "\x01"), 0, "raw control byte");
    t_out_free(&o);
    // invalid UTF-8 is made visible, valid UTF-8 passes through
    snprintf(r->cases[2].v.detail, sizeof r->cases[2].v.detail, "bad \xff\xfe ok \xce\xa8 end\nline2");
    o = t_write(r);
    char why[256] = "";
    cr_assert(t_xml_ok(o.xml, why, sizeof why), "JUnit not well-formed: %s", why);
    cr_assert_not_null(strstr(o.xml, "bad \\xff\\xfe ok \xce\xa8 end&#10;line2"), "%s", o.xml);
    t_out_free(&o);
    t_free(r);
}

Test(report, pass_verdict_and_uncaught_fault) {
    fc_sweep_report *r = t_report();
    for (int i = 0; i < r->n; i++) r->cases[i].v.failed = 0;
    r->n_failed = 0;
    r->have_shrunk = 0;
    r->caught_by = 0;
    r->repro[0] = '\0';
    t_out o = t_write(r);
    cr_assert_not_null(strstr(o.md, "**Verdict: PASS**: all 7 cases passed every property they checked.\n"));
    cr_assert_not_null(strstr(o.md, "No failure: nothing to shrink."));
    cr_assert_eq(t_count(o.md, " ✗ |"), 0, "a failure marker in a passing sweep");
    cr_assert_not_null(strstr(o.xml, "tests=\"7\" failures=\"0\""));
    cr_assert_eq(t_count(o.xml, "<failure"), 0);
    t_out_free(&o);

    r->inject = FC_FAULT_NO_DIVIDE;
    o = t_write(r);
    cr_assert_not_null(strstr(o.md, "| injected fault | `no_divide` |"));
    cr_assert_not_null(strstr(o.md, "The injected fault `no_divide` was **not** caught."));
    cr_assert_not_null(strstr(o.xml, "<property name=\"inject\" value=\"no_divide\"/>"));
    t_out_free(&o);
    t_free(r);
}

// ----------------------------------------------------------------------------
// failures: -1, one line, nothing left behind

static void t_assert_one_line(const fc_error *e, const char *path) {
    cr_assert(e->msg[0], "no error message");
    cr_assert_null(strchr(e->msg, '\n'), "message spans lines: %s", e->msg);
    cr_assert_not_null(strstr(e->msg, path), "message does not name %s: %s", path, e->msg);
}

Test(report, unwritable_paths_fail_cleanly) {
    fc_sweep_report *r = t_report();
    char *dir = t_mkdtemp();
    char *missing = t_path(dir, "missing/report.md");
    char *file = t_path(dir, "plain");
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    char *under_file = t_path(dir, "plain/report.md");
    const char *paths[2] = {missing, under_file};
    for (int i = 0; i < 2; i++) {
        fc_error e = {{0}};
        cr_assert_eq(fc_report_markdown(r, paths[i], &e), -1, "%s", paths[i]);
        t_assert_one_line(&e, paths[i]);
        memset(&e, 0, sizeof e);
        cr_assert_eq(fc_report_junit(r, paths[i], &e), -1, "%s", paths[i]);
        t_assert_one_line(&e, paths[i]);
    }
    cr_assert_eq(t_count_entries(dir), 1, "only the plain file may remain");

    // the Markdown path is a directory: the SVG could be written, the report
    // cannot, and the SVG must not stay behind
    char *md_dir = t_path(dir, "isdir.md");
    cr_assert_eq(mkdir(md_dir, 0777), 0);
    fc_error e = {{0}};
    cr_assert_eq(fc_report_markdown(r, md_dir, &e), -1);
    t_assert_one_line(&e, md_dir);
    char *svg = t_path(dir, "isdir.svg");
    cr_assert(!t_exists(svg), "orphan SVG left at %s", svg);
    cr_assert_eq(t_count_entries(dir), 2, "only the plain file and the directory may remain");
    cr_assert_eq(t_count_entries(md_dir), 0);

    // a report with cases but no case data is refused before anything is written
    fc_case_result *keep = r->cases;
    r->cases = NULL;
    char *ok = t_path(dir, "ok.md");
    memset(&e, 0, sizeof e);
    cr_assert_eq(fc_report_markdown(r, ok, &e), -1);
    cr_assert(e.msg[0]);
    cr_assert(!t_exists(ok));
    r->cases = keep;

    t_rmtree(dir);
    free(dir), free(missing), free(file), free(under_file), free(md_dir), free(svg), free(ok);
    t_free(r);
}

Test(report, full_fields_without_terminator_and_bad_enums) {
    fc_sweep_report *r = t_report();
    fc_case_result *c = &r->cases[2];
    memset(c->spec, 'x', sizeof c->spec);      // no NUL anywhere: read only within the field
    memset(c->v.detail, 'y', sizeof c->v.detail);
    memset(r->impl, 'z', sizeof r->impl);
    memset(r->repro, 'r', sizeof r->repro);
    memset(r->plot_model, 'm', sizeof r->plot_model);
    r->cases[5].cfg.strategy = (fc_strategy)99;
    r->inject = (fc_fault)-7;
    r->points[0].strategy = (fc_strategy)42;
    r->seconds = NAN;
    t_out o = t_write(r);
    char why[256] = "", x[sizeof c->spec + 64];
    int k = snprintf(x, sizeof x, "name=\"case 002 W=2 ");
    memset(x + k, 'x', sizeof c->spec);
    snprintf(x + k + sizeof c->spec, sizeof x - (size_t)k - sizeof c->spec, "\" time=");
    cr_assert_not_null(strstr(o.xml, x), "not the whole spec, or more than it");
    cr_assert(t_xml_ok(o.xml, why, sizeof why), "JUnit not well-formed: %s", why);
    cr_assert(t_xml_ok(o.svg, why, sizeof why), "SVG not well-formed: %s", why);
    cr_assert_not_null(strstr(o.xml, "classname=\"fsdpcheck.sweep.unknown\""));
    cr_assert_not_null(strstr(o.xml, "<property name=\"inject\" value=\"unknown\"/>"));
    cr_assert_not_null(strstr(o.xml, "time=\"0.000\">"), "a NaN wall time is written as 0");
    cr_assert_not_null(strstr(o.svg, "id=\"series-unknown\""));
    cr_assert_not_null(strstr(t_cell(o.md, "Pass/fail matrix", "P3", "unknown"), "1/1"));
    t_out_free(&o);
    t_free(r);
}
