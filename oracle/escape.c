// oracle/escape.c — see escape.h.
#include "escape.h"

#include <stdio.h>
#include <string.h>

// Length of the valid UTF-8 sequence at s (at most left bytes) of a character
// XML 1.0 allows, or 0 when s starts an invalid sequence.
static size_t utf8_len(const unsigned char *s, size_t left) {
    unsigned c = s[0];
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) k = 2;
    else if (c == 0xE0) k = 3, lo = 0xA0;
    else if (c == 0xED) k = 3, hi = 0x9F;  // no UTF-16 surrogates
    else if (c >= 0xE1 && c <= 0xEF) k = 3;
    else if (c == 0xF0) k = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) k = 4;
    else if (c == 0xF4) k = 4, hi = 0x8F;
    else return 0;
    if (left < k) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (c == 0xEF && s[1] == 0xBF && (s[2] == 0xBE || s[2] == 0xBF)) return 0;  // U+FFFE, U+FFFF
    return k;
}

static int alnum(unsigned c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// A byte that cannot be written as is: an XML character reference &#N;, or
// visibly \xNN.
static void put_code(fc_esc_put put, void *to, int xml_ref, unsigned c) {
    char buf[16];
    int n = xml_ref ? snprintf(buf, sizeof buf, "&#%u;", c) : snprintf(buf, sizeof buf, "\\x%02x", c);
    put(to, buf, (size_t)n);
}

void fc_escape(const char *s, size_t max, fc_esc mode, fc_esc_put put, void *to) {
    size_t len = strnlen(s, max);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        if (c >= 0x80) {
            size_t k = utf8_len(u + i, len - i);
            if (k) put(to, s + i, k);
            else put_code(put, to, 0, c);
            i += k ? k : 1;
            continue;
        }
        unsigned prev = i > 0 ? u[i - 1] : 0, next = i + 1 < len ? u[i + 1] : 0;
        i++;
        if (c < 0x20 || c == 0x7f) {
            int ws = c == '\t' || c == '\n' || c == '\r';
            if (ws && mode == FC_ESC_XML) put_code(put, to, 1, c);
            else if (ws) put(to, " ", 1);  // Markdown rows and commands stay on one line
            else put_code(put, to, 0, c);
            continue;
        }
        char ch = (char)c;
        switch (mode) {
        case FC_ESC_XML:
            if (c == '&') put(to, "&amp;", 5);
            else if (c == '<') put(to, "&lt;", 4);
            else if (c == '>') put(to, "&gt;", 4);
            else if (c == '"') put(to, "&quot;", 6);
            else if (c == '\'') put(to, "&apos;", 6);
            else put(to, &ch, 1);
            break;
        case FC_ESC_MD_TEXT:
            // intraword underscores (c_attn) never start emphasis: leave them readable
            if (strchr("\\`*[]<>&|~", ch) || (c == '_' && !(alnum(prev) && alnum(next))))
                put(to, "\\", 1);
            put(to, &ch, 1);
            break;
        case FC_ESC_MD_CODE:
            if (c == '|') put(to, "\\", 1);
            put(to, &ch, 1);
            break;
        case FC_ESC_MD_BLOCK:
            put(to, &ch, 1);
            break;
        }
    }
}

void fc_esc_to_file(void *to, const char *s, size_t n) { fwrite(s, 1, n, (FILE *)to); }
