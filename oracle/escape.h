// oracle/escape.h — text that comes from input (specs, details, model and
// implementation names, trace paths, tensor names and notes) escaped for the
// reports fsdpcheck writes, one set of rules for every report: the sweep's
// Markdown, SVG and JUnit (report.c) and `compare --report` (compare_cmd.c).
//
// Control bytes and invalid UTF-8 come out visibly as `\xNN`, which keeps
// every output valid (XML 1.0 forbids most control characters outright);
// tab, CR and LF become a space in Markdown (a table row or a command stays
// on one line) and character references in XML.
#ifndef FC_ESCAPE_H
#define FC_ESCAPE_H

#include <stddef.h>

typedef enum {
    FC_ESC_XML,       // XML text and attribute values: & < > " ' as entities
    FC_ESC_MD_TEXT,   // Markdown inline text (also inside table cells): backslash escapes
    FC_ESC_MD_CODE,   // inside a Markdown code span in a table cell: only | escaped (GFM)
    FC_ESC_MD_BLOCK,  // inside a fenced code block: as is
} fc_esc;

// Where escaped bytes go: put(to, bytes, n).
typedef void (*fc_esc_put)(void *to, const char *s, size_t n);

// Writes the first max bytes of s (or up to its NUL) escaped for mode.
void fc_escape(const char *s, size_t max, fc_esc mode, fc_esc_put put, void *to);
// A put that writes to the FILE * to.
void fc_esc_to_file(void *to, const char *s, size_t n);

#endif
