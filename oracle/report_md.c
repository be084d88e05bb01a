// oracle/report_md.c — the sweep's Markdown report (see sweep.h): verdict,
// pass/fail matrix, failing cases, the shrunk reproducer, error magnitudes,
// comm volume and memory tables, and the plot of report_svg.c beside it.
//
// Both files are built in memory and written crash-safely
// (fc_write_file_atomic), so a failed or interrupted write never leaves a
// half-written report; the SVG is written first and removed again if the
// Markdown that references it cannot be. Nothing here depends on the clock or
// the locale: the same sweep gives the same report, byte for byte, apart from
// the wall times it records.
#include "report_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fileio.h"

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
    rp_puts(b, " |\n| judged | ");
    rp_md_code(b, r->judged, sizeof r->judged);
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
        if (r->caught_by >= FC_P1_LOCAL && r->caught_by < FC_NPROP)
            rp_printf(b, "; the first failure is caught by P%d", r->caught_by);
        rp_puts(b, ".");
        if (r->inject != FC_FAULT_NONE)
            rp_printf(b, " The injected fault `%s` was caught, as it must be.", rp_fname((int)r->inject));
        rp_puts(b, "\n\n");
    }
}

// Cases and failures per world size.
static void rp_md_worlds(rp_buf *b, const fc_sweep_report *r) {
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

// The pass/fail matrix (property x the strategy of the case), then the cases per world size.
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
        for (int p = FC_P1_LOCAL; p < FC_NPROP; p++) {
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
    for (int p = FC_P1_LOCAL; p < FC_NPROP; p++) {
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
    rp_md_worlds(b, r);
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
        if (p >= FC_P1_LOCAL && p < FC_NPROP) rp_printf(b, "- property: **P%d**: %s\n", p, RP_PROP_DESC[p]);
        else rp_puts(b, "- property: unknown\n");
        rp_printf(b, "- minimal case, at W = %d: ", c->W);
        rp_md_code(b, c->spec, sizeof c->spec);
        rp_puts(b, "\n");
        if (c->v.detail[0]) {
            rp_puts(b, "- first divergence: ");
            rp_md(b, c->v.detail, sizeof c->v.detail);
            rp_puts(b, "\n");
        }
        if (c->v.signature[0]) {
            rp_puts(b, "- signature: ");
            rp_md(b, c->v.signature, sizeof c->v.signature);
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
    for (int p = FC_P1_LOCAL; p < FC_NPROP; p++) {
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
