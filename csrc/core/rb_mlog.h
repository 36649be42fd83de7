/*
 * rb_mlog.h - the codec of the log-structured metadata format (docs/metadata-log.md): the
 * superblock, log groups and their records, and compacted bases, from plain data to bytes
 * and back. No device I/O, no locks, no core state: callers hand in structures and buffers.
 * Every field is packed little-endian explicitly; every decoder checks each length against
 * the buffer it was given, refuses what does not hold together and says why in an rb_err.
 *
 * Return values: 0 (or a count where documented) on success, otherwise a negative errno:
 *   -EBADMSG          the bytes are not a valid structure: magic, CRC, a field out of range,
 *                     lengths that do not add up, a record that does not parse, truncation;
 *   -EPROTONOSUPPORT  our magic with a format version this codec does not read;
 *   -ESTALE           a valid log group of another generation or sequence than expected, or
 *                     a valid base chunk of another base (an older one's bytes left behind);
 *   -EINVAL           an encoder argument breaks a rule (slots not ascending, unknown class);
 *   -E2BIG            a value does not fit its field (a chunk past RB_MLOG_CHUNK_RAW_MAX);
 *   -ENOMEM           out of memory.
 * Decoder refusals set err->kind RB_ERR_VALUE with the errno above; messages name the
 * structure and the byte offset inside the buffer given (the caller adds the device offset).
 *
 * Byte layouts are in docs/metadata-log.md, "Byte layout".
 */
#ifndef RB_MLOG_H
#define RB_MLOG_H

#include <stddef.h>
#include <stdint.h>

#include "rb_ckpt.h" /* rb_buf */
#include "rb_err.h"

#define RB_MLOG_VERSION 2u

/* ---- plain data ------------------------------------------------------------------------ */

/* An index entry. key: key_len bytes (any bytes; not NUL-terminated). npos < 0: positions are
 * null (pos unused); npos >= 0: npos positions at pos (0 = an empty list). */
#define RB_MLOG_ENT_SUM 0x1u /* checksum holds the payload's checksum */
typedef struct rb_mlog_ent {
    const char *key;
    uint32_t key_len;
    uint32_t slot;
    uint64_t size;
    uint32_t cls;
    uint32_t flags; /* RB_MLOG_ENT_SUM */
    uint64_t checksum;
    const int64_t *pos;
    int64_t npos;
} rb_mlog_ent;

/* Positions: at most RB_MLOG_POS_MAX per entry, and RB_MLOG_POS_BUDGET in all per log group
 * and per base chunk (positions are run-length coded, so this bounds a decoder's work and
 * memory by what it is given). */
#define RB_MLOG_POS_MAX (1u << 20)
#define RB_MLOG_POS_BUDGET (1u << 24)

/* A metadata class: its id and the fragment text the core keeps for it
 * ("shape":[...],"dtype":...,"fmt":...), opaque bytes to the codec. */
typedef struct rb_mlog_class {
    uint32_t id;
    uint32_t frag_len;
    const char *frag;
} rb_mlog_class;

/* ---- superblock -------------------------------------------------------------------------- */

/* One superblock: RB_MLOG_SB_LEN bytes at offsets 0 and container_bytes of the device (where
 * format v1 puts its container headers), each in a span of rb_mlog_sb_span() bytes. */
#define RB_MLOG_SB_MAGIC "RBMETA02"
#define RB_MLOG_SB_LEN 256u

typedef struct rb_mlog_area {
    uint64_t off, len; /* device bytes [off, off + len) */
} rb_mlog_area;

typedef struct rb_mlog_sb {
    uint64_t sb_seq;     /* >= 1; recovery takes the valid superblock with the higher one */
    uint64_t generation; /* != 0; every log group and base carries it */
    /* Geometry, as the core derives it (the rules of format v1). */
    uint64_t block_align, header_bytes, slot_bytes, data_base, capacity, meta_total_bytes, container_bytes;
    uint32_t max_slots;
    rb_mlog_area areas[2]; /* the two base areas */
    struct {
        uint32_t area; /* 0 or 1: the area holding the current base */
        uint32_t n_chunks;
        uint64_t len; /* bytes of the base in its area (a multiple of block_align) */
        uint64_t n_entries;
        uint64_t log_seq;   /* the base holds the index after log group log_seq (0: none) */
        uint32_t next_slot; /* slot high-water mark at log_seq */
    } base;
    struct {
        uint64_t off, len;  /* the log ring, device bytes [off, off + len) */
        uint64_t start;     /* offset in the ring of the first live group (block-aligned) */
        uint64_t start_seq; /* its sequence: base.log_seq + 1 */
    } ring;
    /* The writer epoch claimed by the process that wrote this superblock (see
     * RB_MLOG_GROUP_EPOCH_SHIFT): a writer claims its epoch here before its first group, so
     * the next one picks a higher epoch even when none of its groups survived. */
    uint32_t epoch;
    /* The strided layout's extent_bytes (0: the identity layout, slot i at data_base + i *
     * slot_bytes): extent k at the first multiple of it at or past data_base plus k times it,
     * holding extent_stride / slot_bytes slots. Written only when not a multiple of slot_bytes,
     * at offset 224, reserved (zero) before: an older reader refuses such a superblock. */
    uint64_t extent_stride;
    /* Size classes (size_classes > 1, at offset 232, reserved before; 0 = off): extent_stride is
     * then written even when a multiple of slot_bytes, each extent holds the slot ids of its
     * smallest class (extent_stride / that class's slot bytes), and an entry's slot lies in its
     * extent at the offsets of the class its size names (rb_sc_of). */
    uint32_t size_classes;
} rb_mlog_sb;

/* The device offset of slot under sb's geometry (rb_slot_offset's for a superblock), for an
 * entry of size bytes (its size class when sb has them). */
uint64_t rb_mlog_sb_slot_offset(const rb_mlog_sb *sb, uint32_t slot, uint64_t size);

/* Bytes each superblock occupies: RB_MLOG_SB_LEN rounded up to block_align. */
static inline uint64_t rb_mlog_sb_span(uint64_t block_align)
{
    return (RB_MLOG_SB_LEN + block_align - 1) / block_align * block_align;
}

/* Device offset of the current base: it starts its area. */
static inline uint64_t rb_mlog_sb_base_off(const rb_mlog_sb *sb)
{
    return sb->areas[sb->base.area & 1].off;
}

/*
 * Encode sb into out[0, out_len) (out_len >= RB_MLOG_SB_LEN; bytes past the superblock are
 * zeroed, so a whole block can be passed). The superblock is checked first with the
 * decoder's rules: what would not decode is not written (-EINVAL, err says which rule).
 */
int rb_mlog_sb_encode(const rb_mlog_sb *sb, uint8_t *out, size_t out_len, rb_err *err);

/*
 * Decode and validate a superblock from in[0, len): magic, version, CRC, reserved bytes
 * zero, and consistency (geometry derived as v1 derives it; the base areas and the ring
 * block-aligned, inside the metadata region and overlapping neither each other nor either
 * superblock's span; the base inside its area; counts plausible; the ring's start inside
 * it, its sequence base.log_seq + 1). Fills *sb only on success.
 */
int rb_mlog_sb_decode(const uint8_t *in, size_t len, rb_mlog_sb *sb, rb_err *err);

/* ---- log groups -------------------------------------------------------------------------- */

#define RB_MLOG_GROUP_MAGIC "RBMLOG02"
#define RB_MLOG_GROUP_HDR_LEN 48u

enum rb_mlog_rec_type { RB_MLOG_PUT = 1, RB_MLOG_FREE = 2, RB_MLOG_CLASS = 3 };

/* A decoded record. Pointers refer to the group's buffer or the decoder's scratch and are
 * valid only during the callback. */
typedef struct rb_mlog_rec {
    int type;          /* enum rb_mlog_rec_type */
    rb_mlog_ent ent;   /* RB_MLOG_PUT */
    uint32_t slot;     /* RB_MLOG_FREE */
    rb_mlog_class cls; /* RB_MLOG_CLASS */
} rb_mlog_rec;

/* The group encoder: records are appended to a growable buffer, finish writes the header and
 * the padding. A group may hold no records. */
typedef struct rb_mlog_genc {
    rb_buf body;
    uint32_t n_records;
    uint64_t n_pos; /* positions in all (RB_MLOG_POS_BUDGET) */
    uint16_t epoch; /* the writer's epoch, sealed into the group's flags (0 after init) */
} rb_mlog_genc;

void rb_mlog_genc_init(rb_mlog_genc *g);
void rb_mlog_genc_free(rb_mlog_genc *g);
/* Forget the records (keeps the buffer for the next group). */
void rb_mlog_genc_reset(rb_mlog_genc *g);
/* Append one record. 0, -ENOMEM, -E2BIG (more than UINT32_MAX records, more than
 * RB_MLOG_POS_MAX positions, or the group's positions would pass RB_MLOG_POS_BUDGET: finish
 * this group and put the record in the next). */
int rb_mlog_genc_put(rb_mlog_genc *g, const rb_mlog_ent *e, rb_err *err);
int rb_mlog_genc_free_slot(rb_mlog_genc *g, uint32_t slot, rb_err *err);
int rb_mlog_genc_class(rb_mlog_genc *g, const rb_mlog_class *c, rb_err *err);
/* Bytes the finished group takes on the device: header + records, padded to block_align. */
uint64_t rb_mlog_genc_len(const rb_mlog_genc *g, uint64_t block_align);
/*
 * Write the group (generation != 0, seq != 0) into out[0, out_len), out_len >=
 * rb_mlog_genc_len(g, block_align); the padding and any bytes past it are zeroed. The
 * encoder keeps its records (call reset for the next group).
 */
int rb_mlog_genc_finish(const rb_mlog_genc *g, uint64_t generation, uint64_t seq, uint64_t block_align, uint8_t *out,
                        size_t out_len, rb_err *err);

/*
 * Seal the group: append it whole to out (header, body, zeros up to a multiple of block_align
 * counted from the group's first byte). level 0: the body as the records are (what
 * rb_mlog_genc_finish writes); level 1..9: deflate the body (raw deflate, window 15, as base
 * chunks) and keep that only when the group then takes fewer bytes on the device, else the
 * raw body. -EINVAL for a bad argument, -ENOMEM (out is left as it was). The encoder keeps its
 * records.
 */
int rb_mlog_genc_seal(const rb_mlog_genc *g, uint64_t generation, uint64_t seq, uint64_t block_align, int level,
                      rb_buf *out, rb_err *err);

/* Header flags (bytes 36..40). DEFLATE: the stored body is a 4-byte little-endian raw length,
 * then a raw deflate stream that inflates to exactly that many bytes of records. */
#define RB_MLOG_GROUP_DEFLATE 0x1u
/* Flags bits 16..31: the epoch of the process that wrote the group. Each process that opens a
 * device to write picks an epoch above every one its log holds, so groups a crashed process
 * left past the end of the replayed log (a torn group, then one that landed) are told apart
 * from the new writer's at the same ring offset and sequence: along the log, epochs never
 * decrease, and the reader takes a group with a lower epoch than the one before as absent. */
#define RB_MLOG_GROUP_EPOCH_SHIFT 16
#define RB_MLOG_EPOCH_MAX 0xFFFFu

typedef struct rb_mlog_group_info {
    uint64_t generation, seq;
    uint64_t body_len; /* the header's body length: bytes stored after the header */
    uint32_t n_records;
    uint64_t total_len; /* header + body padded to block_align: the step to the next group */
    uint32_t flags;     /* RB_MLOG_GROUP_DEFLATE */
    uint32_t epoch;     /* the writer's epoch (flags bits 16..31) */
    uint64_t raw_len;   /* bytes of records: body_len for a raw body; for a deflated one, set by the
                           decoders once the body is checked (rb_mlog_group_head leaves 0) */
} rb_mlog_group_info;

/*
 * Decode the header of the group at in[0, len) (len >= RB_MLOG_GROUP_HDR_LEN; the body need
 * not be there): magic, flags (only known bits), header CRC, plausible counts. expect_gen /
 * expect_seq: 0 accepts any, otherwise a valid header of another generation or sequence
 * returns -ESTALE (with *gi filled). So a reader can fetch the first block, learn
 * total_len, then fetch the rest.
 */
int rb_mlog_group_head(const uint8_t *in, size_t len, uint64_t block_align, uint64_t expect_gen, uint64_t expect_seq,
                       rb_mlog_group_info *gi, rb_err *err);

/* Callback for each record; a nonzero return stops decoding and is returned. */
typedef int (*rb_mlog_rec_fn)(void *ctx, const rb_mlog_rec *r);

/*
 * Decode the whole group at in[0, len): the header as rb_mlog_group_head, the body inside the
 * buffer, the group CRC, a deflated body inflated (its raw length at most RB_MLOG_CHUNK_RAW_MAX
 * and 1032 times the stream, produced exactly), then every record parsed and checked before
 * the first is handed to fn (fn may be NULL to validate only): a group either delivers all
 * its records or none.
 * Record rules: known type, lengths inside the body, varints canonical and in range (slots
 * and class ids 32-bit), only known flag bits, the body ends with the last record.
 */
int rb_mlog_group_decode(const uint8_t *in, size_t len, uint64_t block_align, uint64_t expect_gen, uint64_t expect_seq,
                         rb_mlog_group_info *gi, rb_mlog_rec_fn fn, void *ctx, rb_err *err);

/* Group decoder state: the inflate stream and scratch buffers, kept from one group to the
 * next (a reader walking a log decodes many). */
typedef struct rb_mlog_gdec {
    void *z;
    uint8_t *raw;
    size_t raw_cap;
    int64_t *pos;
    size_t pos_cap;
    int cb_rc; /* what fn returned to stop the last call, 0 if it did not */
} rb_mlog_gdec;

void rb_mlog_gdec_init(rb_mlog_gdec *d);
void rb_mlog_gdec_free(rb_mlog_gdec *d);
/* rb_mlog_group_decode with d's scratch. */
int rb_mlog_gdec_group(rb_mlog_gdec *d, const uint8_t *in, size_t len, uint64_t block_align, uint64_t expect_gen,
                       uint64_t expect_seq, rb_mlog_group_info *gi, rb_mlog_rec_fn fn, void *ctx, rb_err *err);

/* ---- bases ------------------------------------------------------------------------------- */

#define RB_MLOG_BASE_MAGIC "RBMBASE2"
#define RB_MLOG_CHUNK_MAGIC "RBCHNK02"
#define RB_MLOG_END_MAGIC "RBBEND02"
#define RB_MLOG_BASE_HDR_LEN 56u
#define RB_MLOG_CHUNK_HDR_LEN 60u
#define RB_MLOG_END_LEN 48u
/* A chunk is cut once its raw (uncompressed) entry stream reaches chunk_raw bytes. */
#define RB_MLOG_CHUNK_RAW_DEFAULT (1u << 20)
/* No chunk's raw stream may exceed this (an entry larger than it cannot be encoded). */
#define RB_MLOG_CHUNK_RAW_MAX (256u << 20)
/* zlib level chosen by measurement (docs/metadata-log.md, "Measured"). */
#define RB_MLOG_LEVEL_DEFAULT 1

typedef struct rb_mlog_benc_opts {
    uint32_t chunk_raw; /* 0 = RB_MLOG_CHUNK_RAW_DEFAULT */
    int level;          /* zlib level 1..9; 0 = RB_MLOG_LEVEL_DEFAULT */
} rb_mlog_benc_opts;

/*
 * The base encoder, streaming: init writes the base header and class table to out, each
 * chunk is appended to out when its raw stream is full, finish appends the last chunk, the
 * end record and zero padding to block_align. The bytes in out are final as soon as they are
 * there: a caller writing a large base to the device may take a prefix and drop it with
 * rb_mlog_benc_consume. The caller reads out, produced, n_entries and n_chunks (what the
 * superblock records); the rest is private.
 */
typedef struct rb_mlog_benc {
    rb_buf out;
    uint64_t produced;  /* bytes ever appended to out (consumed ones included) */
    uint64_t n_entries; /* entries added */
    uint32_t n_chunks;  /* chunks written to out */
    /* private */
    rb_buf raw, key;
    void *z;
    uint32_t *cls_ids;
    uint32_t n_cls;
    uint64_t generation, log_seq, prev_size, chunk_pos;
    uint32_t next_slot, prev_slot, first_slot, chunk_n, chunk_raw;
    int any, finished;
} rb_mlog_benc;

/*
 * Start a base of the index after log group log_seq, with slot high-water mark next_slot and
 * the classes the entries use (ids strictly ascending). generation != 0. opts may be NULL.
 */
int rb_mlog_benc_init(rb_mlog_benc *e, uint64_t generation, uint64_t log_seq, uint32_t next_slot,
                      const rb_mlog_class *cls, uint32_t n_cls, const rb_mlog_benc_opts *opts, rb_err *err);
/* Add an entry: slots strictly ascending, below next_slot; class in the table. -EINVAL
 * otherwise (the encoder stays usable; the entry is not added). */
int rb_mlog_benc_add(rb_mlog_benc *e, const rb_mlog_ent *ent, rb_err *err);
/* Finish the base: the last chunk, the end record, zeros up to a multiple of block_align
 * counted from the base's first byte. */
int rb_mlog_benc_finish(rb_mlog_benc *e, uint64_t block_align, rb_err *err);
/* Drop the first n bytes of out (the caller has written them). */
void rb_mlog_benc_consume(rb_mlog_benc *e, size_t n);
void rb_mlog_benc_free(rb_mlog_benc *e);

typedef struct rb_mlog_base_info {
    uint64_t generation, log_seq;
    uint32_t next_slot, n_classes;
    uint64_t chunks_off; /* offset of the first chunk (after the class table) */
} rb_mlog_base_info;

/* A chunk header as decoded (header CRC checked). off: offset of the header in the base. */
typedef struct rb_mlog_chunk {
    uint64_t off;
    uint32_t index, n_entries, raw_len, comp_len, first_slot, last_slot, crc;
} rb_mlog_chunk;

/* A damaged stretch of a base: chunks [index, index + n_chunks) of the writer's numbering
 * (n_chunks 0: the count is unknown), n_entries entries lost (-1: unknown), first_slot and
 * last_slot as far as known (UINT32_MAX: unknown), base bytes [off, off + len), and why. */
typedef struct rb_mlog_damage {
    uint32_t index, n_chunks;
    int64_t n_entries;
    uint32_t first_slot, last_slot;
    uint64_t off, len;
    rb_err why;
} rb_mlog_damage;

typedef struct rb_mlog_base_cb {
    int (*cls)(void *ctx, const rb_mlog_class *c); /* each class of the table, in order */
    int (*ent)(void *ctx, const rb_mlog_ent *e);   /* each entry, in slot order */
    int (*damage)(void *ctx, const rb_mlog_damage *d);
    void *ctx; /* a nonzero return of any callback stops decoding and is returned */
} rb_mlog_base_cb;

/* Chunk decoder state: scratch buffers and the inflate stream (one per thread when chunks are
 * decoded in parallel; the class table copy is read-only after open). */
typedef struct rb_mlog_bdec {
    void *z;
    uint8_t *raw;
    size_t raw_cap;
    rb_buf key;
    int64_t *pos;
    size_t pos_cap;
    uint32_t *cls_ids;
    uint32_t n_cls;
    uint32_t next_slot;
    int cb_rc; /* what a callback returned to stop the last call, 0 if none did */
} rb_mlog_bdec;

void rb_mlog_bdec_init(rb_mlog_bdec *d);
void rb_mlog_bdec_free(rb_mlog_bdec *d);

/*
 * Open the base at in[0, len): base header (magic, version, CRC), class table (CRC, ids
 * strictly ascending, each fragment inside it), each class handed to cb->cls (cb and its
 * callbacks may be NULL). Keeps the class ids and next_slot in d for chunk decoding.
 */
int rb_mlog_base_open(const uint8_t *in, size_t len, rb_mlog_bdec *d, rb_mlog_base_info *bi, const rb_mlog_base_cb *cb,
                      rb_err *err);

/* End record of a base. */
typedef struct rb_mlog_base_end {
    uint64_t off; /* offset of the end record in the base */
    uint32_t n_chunks;
    uint64_t n_entries;
} rb_mlog_base_end;

/*
 * The structure at in[off, len) when a chunk or the end record of the base bi starts there:
 * 1 = a chunk (*ch filled: header CRC and plausibility checked, the payload not looked at,
 * not even whether it lies inside len), 0 = the end record (*end filled; its CRC and its
 * offset field checked). -ESTALE: a valid header of another base (generation or log_seq:
 * an older base's bytes left in the area); -EBADMSG: anything else.
 */
int rb_mlog_base_at(const uint8_t *in, size_t len, uint64_t off, const rb_mlog_base_info *bi, rb_mlog_chunk *ch,
                    rb_mlog_base_end *end, rb_err *err);
/* The first offset in (off, len) where rb_mlog_base_at finds a chunk or the end record of bi,
 * or len when there is none: how a reader gets past a damaged chunk header. */
uint64_t rb_mlog_base_resync(const uint8_t *in, size_t len, uint64_t off, const rb_mlog_base_info *bi);

/*
 * Decode one chunk whose header rb_mlog_base_at returned: payload CRC, inflate to exactly
 * raw_len bytes, then every entry parsed and checked (front coding from the chunk's first
 * key, slots strictly ascending from first_slot to last_slot and below next_slot, classes in
 * the table, canonical varints, the stream ending with entry n_entries) before the first is
 * handed to cb->ent: a chunk delivers all its entries or none. Independent of other chunks.
 */
int rb_mlog_bdec_chunk(rb_mlog_bdec *d, const uint8_t *in, size_t len, const rb_mlog_chunk *ch,
                       const rb_mlog_base_cb *cb, rb_err *err);

typedef struct rb_mlog_base_result {
    rb_mlog_base_info info;         /* the base header, once it opened */
    uint64_t entries;               /* entries delivered */
    uint32_t chunks_ok, chunks_bad; /* chunks delivered / damage reports (one may cover chunks) */
    int64_t entries_lost;           /* the end record's count minus entries; -1 without it */
    int complete;                   /* no damage, and the end record agrees with what was seen */
    int have_end;
    rb_mlog_base_end end; /* when have_end */
    uint64_t len;         /* bytes up to the end of the end record, 0 if none */
} rb_mlog_base_result;

/*
 * Decode a whole base: open, then chunk after chunk. A damaged chunk (payload CRC, inflate,
 * entries, or slots not above the previous good chunk's) is reported to cb->damage with its
 * index and entry count, and decoding goes on with the next chunk; a damaged chunk header
 * is skipped by rb_mlog_base_resync and reported with what is known (chunks lost, counted
 * from the next chunk's index or the end record); a missing end record is reported too.
 * Returns 0 when the base opened (res says what was delivered, lost, and whether the base
 * was complete), <0 when its header or class table did not decode or memory ran out (never
 * reported as damage), or the nonzero value a callback returned to stop.
 */
int rb_mlog_base_decode(const uint8_t *in, size_t len, const rb_mlog_base_cb *cb, rb_mlog_base_result *res,
                        rb_err *err);

/*
 * The walk rb_mlog_base_decode makes, in two parts a parallel reader can use apart. The
 * header walk (rb_mlog_bwalk) looks at chunk headers and the end record only: it gives, in
 * order, each chunk (CHUNK), each damaged stretch between them (GAP: a report as
 * rb_mlog_base_decode makes it) and the end record (END), or a last GAP when the bytes end
 * without one. Which steps come out does not depend on the chunks' payloads. The judge
 * (rb_mlog_bjudge) takes the steps in order with the outcome of each admitted chunk's decode
 * and keeps the result: so a reader that decodes the chunks elsewhere (other threads) and
 * judges in walk order delivers and reports exactly what rb_mlog_base_decode does.
 */
enum { RB_MLOG_STEP_CHUNK = 1, RB_MLOG_STEP_GAP = 2, RB_MLOG_STEP_END = 3 };

typedef struct rb_mlog_bstep {
    int kind;             /* RB_MLOG_STEP_* */
    int out_of_order;     /* CHUNK: its index is below the next expected one */
    uint32_t expect;      /* CHUNK: the next expected index; END: chunks the walk accounted for */
    rb_mlog_chunk ch;     /* CHUNK */
    rb_mlog_base_end end; /* END */
    rb_mlog_damage dm;    /* GAP */
} rb_mlog_bstep;

typedef struct rb_mlog_bwalk { /* private */
    const uint8_t *in;
    size_t len;
    rb_mlog_base_info bi;
    uint64_t off, gap_off;
    uint32_t expect;
    int gap, pending, over;
    rb_mlog_damage dm;
    rb_mlog_bstep pend;
} rb_mlog_bwalk;

/* Walk the base at in[0, len) that rb_mlog_base_open opened as bi. */
void rb_mlog_bwalk_init(rb_mlog_bwalk *w, const uint8_t *in, size_t len, const rb_mlog_base_info *bi);
/* The next step: 1 (*st filled), 0 when the walk is over (after END or the last GAP). */
int rb_mlog_bwalk_next(rb_mlog_bwalk *w, rb_mlog_bstep *st);

typedef struct rb_mlog_bjudge {
    rb_mlog_base_result *res;
    uint32_t prev_last;
    int have_prev;
} rb_mlog_bjudge;

/* Start res (cleared, its info bi). */
void rb_mlog_bjudge_init(rb_mlog_bjudge *j, rb_mlog_base_result *res, const rb_mlog_base_info *bi);
/* A CHUNK step: *dm gets the chunk's identity (index, entries, slots, bytes). 1: decode its
 * payload (a failure goes into dm->why and is reported); 0: the chunk is skipped unread
 * (out of order, or slots not above the last good chunk's) and *dm is its report. */
int rb_mlog_bjudge_admit(rb_mlog_bjudge *j, const rb_mlog_bstep *st, rb_mlog_damage *dm);
/* An admitted chunk's payload decoded and its entries were delivered. */
void rb_mlog_bjudge_ok(rb_mlog_bjudge *j, const rb_mlog_chunk *ch);
/* A report is made (a GAP step or a damaged chunk): counted in res->chunks_bad. */
void rb_mlog_bjudge_bad(rb_mlog_bjudge *j);
/* The END step. */
void rb_mlog_bjudge_end(rb_mlog_bjudge *j, const rb_mlog_bstep *st);

/* 0 when a decoded base is the one the superblock describes (generation, log_seq,
 * next_slot, entries and chunks as the end record has them, length inside base.len),
 * -EBADMSG saying which differs. */
int rb_mlog_base_matches(const rb_mlog_sb *sb, const rb_mlog_base_result *res, rb_err *err);

#endif /* RB_MLOG_H */
