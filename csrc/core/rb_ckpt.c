/*
 * rb_ckpt.c - format v1 codecs: container header, slot header, JSON writer/reader helpers
 * (see rb_ckpt.h).
 */
#include "rb_ckpt.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

void rb_ckpt_header_encode(const rb_ckpt_header *h, uint8_t out[RB_CKPT_HEADER_LEN])
{
    memcpy(out, h->magic, 8);
    rb_put_le(out + 8, h->version, 4);
    rb_put_le(out + 12, h->seq, 8);
    rb_put_le(out + 20, h->payload_len, 8);
    rb_put_le(out + 28, h->crc, 4);
}

void rb_ckpt_header_decode(const uint8_t in[RB_CKPT_HEADER_LEN], rb_ckpt_header *h)
{
    memcpy(h->magic, in, 8);
    h->version = (uint32_t)rb_get_le(in + 8, 4);
    h->seq = rb_get_le(in + 12, 8);
    h->payload_len = rb_get_le(in + 20, 8);
    h->crc = (uint32_t)rb_get_le(in + 28, 4);
}

uint32_t rb_crc32(const void *buf, size_t len)
{
    uLong c = crc32(0L, Z_NULL, 0);
    const Bytef *p = buf;
    while (len) {
        uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, n);
        p += n;
        len -= n;
    }
    return (uint32_t)c;
}

void rb_slot_header_encode(uint8_t *out, size_t hdr_len, const rb_slot_hdr *h)
{
    memset(out, 0, hdr_len);
    memcpy(out, RB_SLOT_MAGIC, 8);
    rb_put_le(out + 8, h->identity, 8);
    rb_put_le(out + 16, h->payload_len, 8);
    if (h->has_sum && hdr_len >= RB_SUM_END) {
        memcpy(out + 24, RB_SUM_MAGIC, 8);
        rb_put_le(out + 32, h->sum, 8);
    }
    if (hdr_len >= RB_KEYHASH_END)
        rb_put_le(out + RB_KEYHASH_OFF, h->key_hash, 8);
}

int rb_slot_header_decode(const uint8_t *in, size_t len, rb_slot_hdr *h)
{
    if (len < RB_SLOT_HEADER_LEN || memcmp(in, RB_SLOT_MAGIC, 8) != 0)
        return -1;
    h->identity = rb_get_le(in + 8, 8);
    h->payload_len = rb_get_le(in + 16, 8);
    h->has_sum = 0;
    h->sum = 0;
    if (len >= RB_SUM_END && memcmp(in + 24, RB_SUM_MAGIC, 8) == 0) {
        h->has_sum = 1;
        h->sum = rb_get_le(in + 32, 8);
    }
    h->key_hash = len >= RB_KEYHASH_END ? rb_get_le(in + RB_KEYHASH_OFF, 8) : 0;
    return 0;
}

void rb_buf_free(rb_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

int rb_buf_reserve(rb_buf *b, size_t extra)
{
    if (b->oom)
        return -ENOMEM;
    if (extra <= b->cap - b->len)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->oom = 1;
        return -ENOMEM;
    }
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + extra)
        nc *= 2;
    char *p = realloc(b->data, nc);
    if (!p) {
        b->oom = 1;
        return -ENOMEM;
    }
    b->data = p;
    b->cap = nc;
    return 0;
}

int rb_buf_put(rb_buf *b, const void *p, size_t n)
{
    if (rb_buf_reserve(b, n) < 0)
        return -ENOMEM;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int rb_buf_puts(rb_buf *b, const char *s)
{
    return rb_buf_put(b, s, strlen(s));
}

int rb_buf_i64(rb_buf *b, int64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
    return rb_buf_put(b, tmp, (size_t)n);
}

int rb_buf_u64(rb_buf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    return rb_buf_put(b, tmp, (size_t)n);
}

static const char hexdig[] = "0123456789abcdef";

int rb_buf_sum_hex(rb_buf *b, uint64_t v)
{
    char tmp[16];
    for (int i = 15; i >= 0; i--, v >>= 4)
        tmp[i] = hexdig[v & 0xf];
    return rb_buf_put(b, tmp, sizeof tmp);
}

int rb_sum_parse_hex(const char *s, size_t n, uint64_t *out)
{
    if (n != 16)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        unsigned d;
        if (ch >= '0' && ch <= '9')
            d = (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            d = (unsigned)(ch - 'a' + 10);
        else
            return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

static void put_u16esc(char *o, unsigned v)
{
    o[0] = '\\';
    o[1] = 'u';
    o[2] = hexdig[(v >> 12) & 15];
    o[3] = hexdig[(v >> 8) & 15];
    o[4] = hexdig[(v >> 4) & 15];
    o[5] = hexdig[v & 15];
}

/* Decode one UTF-8 sequence at s[0..n); returns its length or 0 when invalid. */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    size_t l;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xe0) == 0xc0) {
        l = 2, v = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        l = 3, v = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
        l = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (l > n)
        return 0;
    for (size_t i = 1; i < l; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff)
        return 0;
    *cp = v;
    return l;
}

/* The escape of ASCII byte c (a control character, '"' or '\\') at o, as json.dumps writes
 * it; returns its length. */
static size_t ascii_escape(char *o, unsigned c)
{
    char e;
    switch (c) {
    case '"':
        e = '"';
        break;
    case '\\':
        e = '\\';
        break;
    case '\n':
        e = 'n';
        break;
    case '\r':
        e = 'r';
        break;
    case '\t':
        e = 't';
        break;
    case '\b':
        e = 'b';
        break;
    case '\f':
        e = 'f';
        break;
    default:
        put_u16esc(o, c);
        return 6;
    }
    o[0] = '\\';
    o[1] = e;
    return 2;
}

/* The escape of the non-ASCII sequence at s[0..n) at o: \uXXXX, a surrogate pair past the
 * BMP, or \u00XX of the lone byte when it is not valid UTF-8. *used: the input bytes it
 * covers. Returns its length (at most 12). */
static size_t utf8_escape(char *o, const unsigned char *s, size_t n, size_t *used)
{
    uint32_t cp;
    size_t l = utf8_next(s, n, &cp);
    if (l == 0) {
        put_u16esc(o, s[0]);
        *used = 1;
        return 6;
    }
    *used = l;
    if (cp < 0x10000) {
        put_u16esc(o, cp);
        return 6;
    }
    uint32_t v = cp - 0x10000;
    put_u16esc(o, 0xd800 | (v >> 10));
    put_u16esc(o + 6, 0xdc00 | (v & 0x3ff));
    return 12;
}

int rb_buf_json_str(rb_buf *b, const char *str, size_t n)
{
    /* Worst case 12 output bytes per input byte (a lone byte as \u00XX is 6). */
    if (rb_buf_reserve(b, 2 + n * 6 + 8) < 0)
        return -ENOMEM;
    const unsigned char *s = (const unsigned char *)str;
    char *o = b->data + b->len;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
            *o++ = (char)c;
            i++;
        } else if (c < 0x80) {
            o += ascii_escape(o, c);
            i++;
        } else {
            size_t used;
            o += utf8_escape(o, s + i, n - i, &used);
            i += used;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
    return 0;
}

struct json_object *rb_json_parse(const char *buf, size_t len)
{
    if (len > INT32_MAX)
        return NULL;
    struct json_tokener *tok = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    if (!tok)
        return NULL;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    struct json_object *o = json_tokener_parse_ex(tok, buf, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!o || jerr != json_tokener_success) {
        if (o)
            json_object_put(o);
        return NULL;
    }
    /* Trailing whitespace only. */
    for (size_t i = used; i < len; i++) {
        char c = buf[i];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
            json_object_put(o);
            return NULL;
        }
    }
    return o;
}

/* int() of a JSON float: truncated toward zero. 0, or -1 when not finite or out of range. */
static int double_as_i64(double d, int64_t *out)
{
    if (!isfinite(d) || d < -9.2e18 || d > 9.2e18)
        return -1;
    *out = (int64_t)d;
    return 0;
}

/* int() of a JSON string: a decimal integer, leading white space (strtoll's) and trailing
 * spaces, tabs and newlines allowed. 0 or -1. */
static int string_as_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\n')
        end++;
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

int rb_json_as_i64(struct json_object *o, int64_t *out)
{
    if (!o)
        return -1;
    switch (json_object_get_type(o)) {
    case json_type_int:
        errno = 0;
        *out = json_object_get_int64(o);
        return errno ? -1 : 0;
    case json_type_double:
        return double_as_i64(json_object_get_double(o), out);
    case json_type_boolean:
        *out = json_object_get_boolean(o) ? 1 : 0;
        return 0;
    case json_type_string:
        return string_as_i64(json_object_get_string(o), out);
    default:
        return -1;
    }
}
