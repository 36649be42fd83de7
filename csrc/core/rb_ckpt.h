/*
 * rb_ckpt.h - the on-disk codecs of format v1: checkpoint container header (LMCIDX01-style,
 * packed little-endian <8sIQQI>, CRC-32), slot header (LMCBLK01 + identity + length, plus our
 * optional checksum record in bytes LMCache never reads), a growable byte buffer with
 * Python-json-compatible string escaping for the state v1 writer, and json-c helpers for
 * the reader.
 */
#ifndef RB_CKPT_H
#define RB_CKPT_H

#include <stddef.h>
#include <stdint.h>

struct json_object;

#define RB_CKPT_HEADER_LEN 32
#define RB_SLOT_HEADER_LEN 24
#define RB_SLOT_MAGIC "LMCBLK01"
/* Ours, at slot-header bytes 24..40: marker then xxh3-64 of the payload (LE). */
#define RB_SUM_MAGIC "RBXXH3v1"
#define RB_SUM_END 40

typedef struct rb_ckpt_header {
    uint8_t magic[8];
    uint32_t version;
    uint64_t seq;
    uint64_t payload_len;
    uint32_t crc;
} rb_ckpt_header;

void rb_ckpt_header_encode(const rb_ckpt_header *h, uint8_t out[RB_CKPT_HEADER_LEN]);
void rb_ckpt_header_decode(const uint8_t in[RB_CKPT_HEADER_LEN], rb_ckpt_header *h);
uint32_t rb_crc32(const void *buf, size_t len);

/* Slot header: writes all hdr_len bytes (zero beyond the fields). has_sum: write our record. */
void rb_slot_header_encode(uint8_t *out, size_t hdr_len, uint64_t identity, uint64_t payload_len, int has_sum,
                           uint64_t sum);
/* 0 if the bytes hold a slot header (fills identity/len and, when present, *sum with
 * *has_sum = 1), -1 otherwise ("no header"). */
int rb_slot_header_decode(const uint8_t *in, size_t len, uint64_t *identity, uint64_t *payload_len, int *has_sum,
                          uint64_t *sum);

/* Little-endian fields of n bytes (n <= 8), as every on-disk structure packs them. */
static inline void rb_put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t rb_get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Growable buffer. Functions return 0 or -ENOMEM (sticky: later appends are no-ops). */
typedef struct rb_buf {
    char *data;
    size_t len, cap;
    int oom;
} rb_buf;

void rb_buf_free(rb_buf *b);
/* Room for extra more bytes (capacity doubling from 4 KiB); -ENOMEM, sticky, when it cannot be
 * had or the size would overflow. */
int rb_buf_reserve(rb_buf *b, size_t extra);
int rb_buf_put(rb_buf *b, const void *p, size_t n);
int rb_buf_puts(rb_buf *b, const char *s);
int rb_buf_i64(rb_buf *b, int64_t v);
int rb_buf_u64(rb_buf *b, uint64_t v);
/* A JSON string literal of UTF-8 bytes, escaped exactly like Python's json.dumps with
 * ensure_ascii=True (\uXXXX lowercase, surrogate pairs). Invalid UTF-8 bytes are emitted as
 * \u00XX of the byte (Python strings cannot hold them; this keeps output ASCII). */
int rb_buf_json_str(rb_buf *b, const char *s, size_t n);

/* Our checkpoint entry field "xxh3": the payload checksum as exactly 16 lowercase hex digits
 * (a JSON string, so no reader has to hold a 64-bit unsigned number). parse: 0, or -1 when the
 * text is anything else. */
#define RB_ENT_SUM_FIELD "xxh3"
int rb_buf_sum_hex(rb_buf *b, uint64_t v);
int rb_sum_parse_hex(const char *s, size_t n, uint64_t *out);

/* json-c helpers. Parse a whole buffer; NULL on error. */
struct json_object *rb_json_parse(const char *buf, size_t len);
/* Integer value of a JSON number (integral double accepted) or a decimal string, like
 * Python's int(). 0 on success, -1 if not convertible. */
int rb_json_as_i64(struct json_object *o, int64_t *out);

#endif /* RB_CKPT_H */
