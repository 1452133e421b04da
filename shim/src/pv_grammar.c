/* The grammar of limits, the one implementation: sizes (README, "Sizes"), compute shares, device indices,
 * priorities, on/off switches and the per-device specs of --memory/--sm ("4G" or "0=2G,1=6G").
 *
 * The shim reads HAMi's variables with it (pv_env.c) inside a program that may have no interpreter, and
 * `pyvgpu wrap`, `limits set` and the device plugin reach it through libpyvgpu_group.so and ctypes
 * (pyvgpu/native/grouplib.py), so every reader gives the same values and the same refusals, word for word.
 * A value is shown in a message as Python's repr() shows it (pv_repr); a character outside ASCII is shown
 * with its code point, and the Python binding adds the character's Unicode name, which C has no table of.
 *
 * Values come as (text, length): an option may hold any byte. No allocation, no locale: this runs inside
 * the program, at its first CUDA or NVML call. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "pv_shim.h"

#define PV_MAX_SIZE ((uint64_t)INT64_MAX)

int pv_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }
static int digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int letter(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }

int pv_fail(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* One code point of UTF-8 at s (at most len bytes); *used: its bytes. A byte that starts no valid sequence
 * is 0xDC00 + the byte, as Python's surrogateescape decodes it (how os.environ holds it). */
static uint32_t utf8_at(const unsigned char *s, size_t len, size_t *used) {
    unsigned c = s[0], k = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : 0;
    uint32_t cp = k == 3 ? c & 7 : k == 2 ? c & 15 : c & 31;
    *used = 1;
    if (c < 0x80)
        return c;
    if (k == 0 || k >= len)
        return 0xDC00 + c;
    for (unsigned i = 1; i <= k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0xDC00 + c;
        cp = cp << 6 | (s[i] & 63);
    }
    if ((k == 2 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0xDC00 + c;
    *used = k + 1;
    return cp;
}

/* Code points Python's repr() escapes although they are not ASCII: controls, spaces other than ' ', format
 * characters, separators (str.isprintable() is false), for the characters a value plausibly holds. */
static int unprintable(uint32_t cp) {
    return cp < 0xA1 || cp == 0xAD || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
           (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || (cp >= 0xD800 && cp < 0xE000) ||
           (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0x1680 || cp == 0x180E;
}

void pv_repr(const char *text, size_t len, char *out, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    int single = memchr(text, '\'', len) != NULL, dbl = memchr(text, '"', len) != NULL;
    char q = single && !dbl ? '"' : '\'';
    size_t o = 0;
#define PUT(...) (o += (size_t)snprintf(out + (o < n ? o : n), o < n ? n - o : 0, __VA_ARGS__))
    PUT("%c", q);
    for (size_t i = 0, used; i < len; i += used) {
        uint32_t cp = utf8_at(s + i, len - i, &used);
        if (cp == '\\' || cp == (uint32_t)q)
            PUT("\\%c", (char)cp);
        else if (cp == '\t' || cp == '\n' || cp == '\r')
            PUT("\\%c", cp == '\t' ? 't' : cp == '\n' ? 'n' : 'r');
        else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && unprintable(cp)))
            PUT(cp < 0x100 ? "\\x%02x" : "\\u%04x", cp);
        else
            PUT("%.*s", (int)used, text + i);
    }
    PUT("%c", q);
#undef PUT
    if (n && o >= n)
        out[n - 1] = 0;
}

int pv_check_ascii(const char *text, size_t len, const char *where, const char *what, const char *example,
                   char *err, size_t n) {
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)text[i] < 0x80)
            continue;
        size_t used;
        uint32_t cp = utf8_at((const unsigned char *)text + i, len - i, &used);
        char shown[256], ch[32];
        pv_repr(text, len, shown, sizeof shown);
        pv_repr(text + i, used, ch, sizeof ch);
        return pv_fail(err, n, "%s: %s has the character %s (U+%04X); write %s with ASCII digits and letters "
                       "only, e.g. %s", where, shown, ch, cp, what, example);
    }
    return 0;
}

/* [*b, *e) of text without the spaces around it */
void pv_strip(const char *text, size_t len, const char **b, const char **e) {
    *b = text;
    *e = text + len;
    while (*b < *e && pv_space((unsigned char)**b))
        (*b)++;
    while (*e > *b && pv_space((unsigned char)(*e)[-1]))
        (*e)--;
}

/* 1-30 ASCII digits between spaces: 0 and the value (capped), else -1 */
int pv_ascii_int(const char *b, const char *e, uint64_t *out) {
    pv_strip(b, (size_t)(e - b), &b, &e);
    if (b == e || e - b > 30)
        return -1;
    uint64_t v = 0;
    for (const char *p = b; p < e; p++) {
        if (!digit((unsigned char)*p))
            return -1;
        v = v > UINT64_MAX / 16 ? UINT64_MAX / 16 : v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return 0;
}

static const struct { const char *unit; unsigned shift; } UNITS[] = {
    {"", 0}, {"b", 0}, {"k", 10}, {"ki", 10}, {"kib", 10}, {"m", 20}, {"mi", 20}, {"mib", 20},
    {"g", 30}, {"gi", 30}, {"gib", 30}, {"t", 40}, {"ti", 40}, {"tib", 40},
};
static const char *const DECIMAL_UNITS[] = {"kb", "mb", "gb", "tb"};
#define SIZE_HELP "a number of bytes, or a number with a binary unit K, M, G or T (also Ki, Mi, Gi, Ti), e.g. 4G, " \
                  "4.5G or 512Mi"

void pv_human(uint64_t v, char *out, size_t n) {
    static const struct { const char *name; unsigned shift; } U[] = {{"TiB", 40}, {"GiB", 30}, {"MiB", 20},
                                                                    {"KiB", 10}};
    for (unsigned i = 0; i < sizeof U / sizeof *U; i++) {
        uint64_t div = 1ull << U[i].shift;
        if (v >= div) {
            if (v % div == 0)
                snprintf(out, n, "%llu %s", (unsigned long long)(v / div), U[i].name);
            else
                snprintf(out, n, "%.2f %s", (double)v / (double)div, U[i].name);
            return;
        }
    }
    snprintf(out, n, "%llu B", (unsigned long long)v);
}

/* "4.5" times 10^(3 * power) in bytes, as digits: the point moves right, no arithmetic that could overflow */
static void decimal_bytes(const char *num, const char *end, int power, char *out, size_t n) {
    const char *point = memchr(num, '.', (size_t)(end - num));
    const char *frac = point ? point + 1 : end;
    char digits[96];
    size_t k = 0;
    for (const char *p = num; p < (point ? point : end); p++)
        digits[k++] = *p;
    for (int i = 0; i < 3 * power; i++)
        digits[k++] = frac + i < end ? frac[i] : '0';
    size_t lead = 0;
    while (lead + 1 < k && digits[lead] == '0')
        lead++;
    snprintf(out, n, "%.*s", k ? (int)(k - lead) : 1, k ? digits + lead : "0");
}

int pv_parse_size(const char *text, size_t len, const char *where, uint64_t *out, char *err, size_t n) {
    if (pv_check_ascii(text, len, where, "sizes", "4G", err, n))
        return -1;
    char shown[256];
    pv_repr(text, len, shown, sizeof shown);
    const char *b, *e;
    pv_strip(text, len, &b, &e);
    const char *p = b;
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    int nint = 0, nfrac = 0, point = 0;
    while (p < e && digit((unsigned char)*p) && nint <= 30) {
        whole = whole * 10 + (unsigned)(*p++ - '0');
        nint++;
    }
    if (p < e && *p == '.' && nint <= 30) {
        point = 1;
        p++;
        while (p < e && digit((unsigned char)*p) && nfrac <= 30) {
            frac = frac * 10 + (unsigned)(*p++ - '0');
            scale *= 10;
            nfrac++;
        }
    }
    const char *num_end = p;
    int number = nint <= 30 && nfrac <= 30 && (nint > 0 || (point && nfrac > 0));
    while (p < e && pv_space((unsigned char)*p))
        p++;
    char unit[4] = {0};
    int nunit = 0;
    while (p < e && letter((unsigned char)*p) && nunit < 3)
        unit[nunit++] = (char)(*p++ | 32);
    if (number && p == e) {
        for (int i = 0; i < 4; i++) {
            if (strcmp(unit, DECIMAL_UNITS[i]))
                continue;
            char dec[96], L = (char)(unit[0] & ~32);
            decimal_bytes(b, num_end, i + 1, dec, sizeof dec);
            int nl = (int)(num_end - b);
            return pv_fail(err, n, "%s: %s is ambiguous (Kubernetes reads %cB as powers of 10, HAMi and nvidia-smi "
                           "as powers of 2); write %.*s%c or %.*s%ci for binary units, as pyvgpu reads them, or %s "
                           "(bytes) for decimal ones", where, shown, L, nl, b, L, nl, b, L, dec);
        }
        for (unsigned i = 0; i < sizeof UNITS / sizeof *UNITS; i++) {
            if (strcmp(unit, UNITS[i].unit))
                continue;
            if (whole > PV_MAX_SIZE)
                return pv_fail(err, n, "%s: %s is too large (the most is 9223372036854775807 bytes)", where, shown);
            /* floor(0.frac * 2^shift), exactly: binary long division of frac by 10^nfrac */
            unsigned __int128 rem = frac, bits = 0;
            for (unsigned k = 0; k < UNITS[i].shift; k++) {
                rem *= 2;
                bits = bits * 2 + (rem >= scale);
                if (rem >= scale)
                    rem -= scale;
            }
            unsigned __int128 v = (whole << UNITS[i].shift) + bits;
            if (v > PV_MAX_SIZE)
                return pv_fail(err, n, "%s: %s is too large (the most is 9223372036854775807 bytes)", where, shown);
            if (v == 0)
                return pv_fail(err, n, "%s: %s would refuse every allocation; give a positive size, or leave the "
                               "limit out for no limit", where, shown);
            *out = (uint64_t)v;
            return 0;
        }
    }
    return pv_fail(err, n, "%s: %s is not a size; give %s", where, shown, SIZE_HELP);
}

int pv_parse_cap(const char *text, size_t len, const char *where, uint64_t floor, uint64_t *out, char *err,
                 size_t n) {
    if (pv_parse_size(text, len, where, out, err, n))
        return -1;
    if (*out >= floor)
        return 0;
    char have[32], least[32], hint[160];
    pv_human(*out, have, sizeof have);
    pv_human(floor, least, sizeof least);
    const char *b, *e;
    uint64_t bare;
    pv_strip(text, len, &b, &e);
    if (!pv_ascii_int(b, e, &bare))
        snprintf(hint, sizeof hint, "; a bare number is bytes: did you mean %.*sM or %.*sMi?", (int)(e - b), b,
                 (int)(e - b), b);
    else
        snprintf(hint, sizeof hint, "; give a larger cap");
    return pv_fail(err, n, "%s: %s is below the smallest memory cap, %s: a CUDA context alone takes more (PyTorch's "
                   "took 524 MiB on an H100), so the program would fail at its first CUDA call%s", where, have, least,
                   hint);
}

int pv_parse_percent(const char *text, size_t len, const char *where, uint32_t *out, char *err, size_t n) {
    if (pv_check_ascii(text, len, where, "a compute share", "30", err, n))
        return -1;
    const char *b, *e;
    uint64_t v;
    pv_strip(text, len, &b, &e);
    if (e > b && e[-1] == '%')
        e--;
    if (pv_ascii_int(b, e, &v) || v < 1 || v > 100) {
        char shown[256];
        pv_repr(text, len, shown, sizeof shown);
        return pv_fail(err, n, "%s: %s is not a compute share; give a whole percent from 1 to 100 (100 = the whole "
                       "device), or leave the limit out", where, shown);
    }
    *out = (uint32_t)v;
    return 0;
}

int pv_parse_device(const char *text, size_t len, const char *where, int *out, char *err, size_t n) {
    if (pv_check_ascii(text, len, where, "device indices", "0=2G,1=6G", err, n))
        return -1;
    uint64_t d;
    if (pv_ascii_int(text, text + len, &d) || d >= PV_MAX_DEVICES) {
        char shown[256];
        pv_repr(text, len, shown, sizeof shown);
        return pv_fail(err, n, "%s: %s is not a device index 0..%d", where, shown, PV_MAX_DEVICES - 1);
    }
    *out = (int)d;
    return 0;
}

/* the index of text (spaces around it ignored, any case) among words, or -1 */
int pv_word(const char *text, size_t len, const char *const *words, int count) {
    const char *b, *e;
    pv_strip(text, len, &b, &e);
    for (int i = 0; i < count; i++)
        if ((size_t)(e - b) == strlen(words[i]) && !strncasecmp(b, words[i], (size_t)(e - b)))
            return i;
    return -1;
}

int pv_parse_priority(const char *text, size_t len, const char *where, int *out, char *err, size_t n) {
    static const char *const words[] = {"high", "0", "low", "1"};
    if (pv_check_ascii(text, len, where, "a priority", "high", err, n))
        return -1;
    int w = pv_word(text, len, words, 4);
    if (w < 0) {
        char shown[256];
        pv_repr(text, len, shown, sizeof shown);
        return pv_fail(err, n, "%s: %s is not a priority; give high (HAMi's 0) or low (HAMi's 1, the default)", where,
                       shown);
    }
    *out = w / 2;
    return 0;
}

int pv_parse_switch(const char *text, size_t len, const char *where, int *out, char *err, size_t n) {
    static const char *const words[] = {"off", "on", "0", "1", "false", "true", "no", "yes"};
    int w = pv_word(text, len, words, 8);
    if (w < 0) {
        char shown[256];
        pv_repr(text, len, shown, sizeof shown);
        return pv_fail(err, n, "%s: %s is neither on nor off; give on (or 1) or off (or 0)", where, shown);
    }
    *out = w % 2;
    return 0;
}

/* --memory/--sm: "V" for every device or "0=V,1=W"; kind 0 = caps of at least floor bytes, 1 = shares;
 * | PV_SPEC_NONE: none, off or 0 (`limits set`) is no limit on every device (*dflt 0).
 * *dflt: the plain value or -1; per[d] and bit d of *mask: the devices given. */
int pv_parse_spec(const char *text, size_t len, const char *where, int kind, uint64_t floor, int64_t *dflt,
                  uint64_t *per, uint32_t *mask, char *err, size_t n) {
    static const char *const none[] = {"none", "off", "0"};
    *dflt = -1;
    *mask = 0;
    if (kind & PV_SPEC_NONE && pv_word(text, len, none, 3) >= 0) {
        *dflt = 0;
        return 0;
    }
    kind &= ~PV_SPEC_NONE;
    const char *what = kind ? "percent" : "size", *one = kind ? "30" : "4G", *pairs = kind ? "0=30,1=50" : "0=2G,1=6G";
    int parts = 1, blank = len == 0;
    for (size_t i = 0; i < len; i++)
        parts += text[i] == ',';
    for (const char *p = text, *end = text + len; p <= end && !blank;) {
        const char *c = memchr(p, ',', (size_t)(end - p)), *stop = c ? c : end, *b, *e;
        pv_strip(p, (size_t)(stop - p), &b, &e);
        blank = b == e;
        p = stop + 1;
    }
    if (blank)
        return pv_fail(err, n, "%s: give a %s (%s) or device=%s pairs (%s)", where, what, one, what, pairs);
    for (const char *p = text, *end = text + len; p <= end;) {
        const char *c = memchr(p, ',', (size_t)(end - p)), *stop = c ? c : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p)), *value = eq ? eq + 1 : p;
        char at[320];
        uint64_t v = 0;
        uint32_t pct = 0;
        int d = -1;
        if (eq) {
            if (pv_parse_device(p, (size_t)(eq - p), where, &d, err, n))
                return -1;
            if (*mask >> d & 1)
                return pv_fail(err, n, "%s: device %d is given twice", where, d);
            snprintf(at, sizeof at, "%s, device %d", where, d);
        } else {
            if (*dflt >= 0 || parts > 1)
                return pv_fail(err, n, "%s: a plain %s mixed with device=%s pairs; give either %s or %s", where, what,
                               what, one, pairs);
            snprintf(at, sizeof at, "%s", where);
        }
        if (kind ? pv_parse_percent(value, (size_t)(stop - value), at, &pct, err, n)
                 : pv_parse_cap(value, (size_t)(stop - value), at, floor, &v, err, n))
            return -1;
        if (kind)
            v = pct;
        if (eq) {
            per[d] = v;
            *mask |= 1u << d;
        } else {
            *dflt = (int64_t)v;
        }
        p = stop + 1;
    }
    return 0;
}
