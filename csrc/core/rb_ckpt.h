/*
 * rb_ckpt.h - the on-disk codecs of format v1: checkpoint container header (LMCIDX01-style,
 * packed little-endian <8sIQQI>, CRC-32), slot header (LMCBLK01 + identity + length, plus our
 * optional checksum record and the whole key's hash in bytes LMCache never reads) and the rule
 * by which a slot header vouches for an index record, a growable byte buffer with
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
/* Ours, at slot-header bytes 40..48: the hash of the whole encoded key (rb_key_hash, LE), never
 * 0; 0 means "not written" (LMCache writes zeros there, and so did our versions before it). It
 * tells apart keys that share the slot identity (legacy keys of one chunk hash). Written and
 * read only when the header has room for it (header_bytes >= 48). */
#define RB_KEYHASH_OFF 40
#define RB_KEYHASH_END 48

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

/* A slot header's fields: LMCache's (identity, payload_len) and ours (the checksum record when
 * has_sum, the key hash when key_hash != 0). */
typedef struct rb_slot_hdr {
    uint64_t identity, payload_len;
    uint64_t sum;
    uint64_t key_hash; /* 0: not in the header */
    int has_sum;
} rb_slot_hdr;

/* Slot header: writes all hdr_len bytes (zero beyond the fields): the checksum record when
 * h->has_sum, the key hash when it is not 0, each only where hdr_len has room for it. */
void rb_slot_header_encode(uint8_t *out, size_t hdr_len, const rb_slot_hdr *h);
/* 0 if the bytes hold a slot header (fills *h: the checksum record and the key hash when the
 * len bytes hold them, else has_sum 0 / key_hash 0), -1 otherwise ("no header"). */
int rb_slot_header_decode(const uint8_t *in, size_t len, rb_slot_hdr *h);

/* What an index record expects of its slot header: the key's identity and hash, the payload
 * length, and the checksum the record carries (has_sum) if any. */
typedef struct rb_slot_want {
    uint64_t identity, key_hash, size, sum;
    int has_sum;
} rb_slot_want;

/* The one rule (loads and start-up validation alike): 1 when a decoded header vouches for the
 * record, 0 when not. Its identity and length must be the record's; a key hash in the header
 * must be the key's (a header without one, LMCache's, is judged on the identity alone); a
 * record with a checksum needs the header's record to hold the same one (a header whose marker
 * was damaged does not turn the check off). */
static inline int rb_slot_header_vouches(const rb_slot_hdr *h, const rb_slot_want *w)
{
    if (h->identity != w->identity || h->payload_len != w->size)
        return 0;
    if (h->key_hash && h->key_hash != w->key_hash)
        return 0;
    return !w->has_sum || (h->has_sum && h->sum == w->sum);
}

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
