// oracle/report_junit.c — the sweep's JUnit XML report (see sweep.h): one
// testsuite, one testcase per case, a <failure> naming the properties of
// each failed case. Built in memory and written crash-safely.
#include "report_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fileio.h"

// ----------------------------------------------------------------------------
// JUnit XML (the common Jenkins/GitLab schema)

// The testsuite's head and its properties: the implementation, the fault,
// the seed, the world size, and for a failed sweep what caught it and the
// line that reproduces it.
static void junit_head(rp_buf *b, const fc_sweep_report *r, int nfail) {
    rp_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<testsuites name=\"fsdpcheck\" tests=\"%d\" failures=\"%d\" errors=\"0\" time=\"%.3f\">\n"
                 "  <testsuite name=\"fsdpcheck-sweep\" tests=\"%d\" failures=\"%d\" errors=\"0\" skipped=\"0\" "
                 "time=\"%.3f\">\n    <properties>\n      <property name=\"impl\" value=\"",
              r->n, nfail, rp_secs(r->seconds), r->n, nfail, rp_secs(r->seconds));
    rp_xml(b, r->impl, sizeof r->impl);
    rp_printf(b, "\"/>\n      <property name=\"inject\" value=\"%s\"/>\n"
                 "      <property name=\"seed\" value=\"%llu\"/>\n"
                 "      <property name=\"world_size\" value=\"%d\"/>\n",
              rp_fname((int)r->inject), (unsigned long long)r->seed, r->world);
    if (nfail && r->caught_by >= FC_P1_LOCAL && r->caught_by < FC_NPROP)
        rp_printf(b, "      <property name=\"caught_by\" value=\"P%d\"/>\n", r->caught_by);
    if (nfail && strnlen(r->repro, sizeof r->repro)) {
        rp_puts(b, "      <property name=\"repro\" value=\"");
        rp_xml(b, r->repro, sizeof r->repro);
        rp_puts(b, "\"/>\n");
    }
    rp_puts(b, "    </properties>\n");
}

// One testcase; a failed one names its properties, its detail and the case,
// and the first failure also the shrunk reproducer.
static void junit_case(rp_buf *b, const fc_sweep_report *r, const fc_case_result *c, int first_failure) {
    rp_printf(b, "    <testcase classname=\"fsdpcheck.sweep.%s\" name=\"case %03d W=%d ",
              rp_sname((int)c->cfg.strategy), c->index, c->W);
    rp_xml(b, c->spec, sizeof c->spec);
    rp_printf(b, "\" time=\"%.3f\"", rp_secs(c->seconds));
    if (!rp_case_failed(c)) {
        rp_puts(b, "/>\n");
        return;
    }
    unsigned fl = rp_failed(c);
    rp_puts(b, ">\n      <failure message=\"");
    rp_props(b, fl);
    rp_puts(b, " failed\" type=\"property\">");
    rp_xml(b, c->v.detail, sizeof c->v.detail);
    rp_puts(b, "&#10;");
    for (int p = FC_P1_LOCAL; p < FC_NPROP; p++) {
        if (!(fl & (1u << p))) continue;
        rp_printf(b, "P%d: ", p);
        rp_xml_desc(b, p);
        rp_puts(b, "&#10;");
    }
    rp_printf(b, "case %d at W=%d: ", c->index, c->W);
    rp_xml(b, c->spec, sizeof c->spec);
    if (first_failure && strnlen(r->repro, sizeof r->repro)) {
        rp_puts(b, "&#10;shrunk reproducer of this first failure: ");
        rp_xml(b, r->repro, sizeof r->repro);
    }
    rp_puts(b, "</failure>\n    </testcase>\n");
}

int fc_report_junit(const fc_sweep_report *r, const char *path, fc_error *e) {
    if (rp_check(r, path, e)) return -1;
    int nfail = rp_count_failed(r);
    rp_buf b = {0};
    junit_head(&b, r, nfail);
    int first_failure = 1;
    for (int i = 0; i < r->n; i++) {
        junit_case(&b, r, &r->cases[i], first_failure);
        if (rp_case_failed(&r->cases[i])) first_failure = 0;
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
