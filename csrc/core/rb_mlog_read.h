/*
 * rb_mlog_read.h - the metadata region of the log-structured format as a whole: where its
 * parts lie (the layout), how large a blank device's region is (auto sizing), and reading
 * it back from a device (superblocks, the current base, the log after it). Built on the codec
 * (rb_mlog.h); no core state: the device is reached through a read callback, so recovery, the
 * command-line tools and the tests share one reader.
 *
 * The log walk (what the core's writer relies on): groups start at block-aligned offsets of
 * the ring, the first at the superblock's ring.start with sequence ring.start_seq. From a
 * group at ring offset p the next is at p + total_len; a group never spans the ring's end,
 * the writer puts one that does not fit in [p, ring.len) at ring offset 0 instead. So a
 * reader that finds no group of the expected (generation, sequence) at p, p != 0, tries
 * offset 0 once; finding none there either (or a group there that fails), it scans the ring for
 * a later group of the same writer: one that follows makes the stretch damage, skipped and
 * reported (rb_mlog_gap); with none, the log ends. The walk also ends after it has covered
 * ring.len bytes (wrap waste included; after a gap the sequences bound it). Where it ends is
 * where the next group goes.
 * (docs/metadata-log.md, "Reading a region", has the whole walk and the writer's rules.)
 */
#ifndef RB_MLOG_READ_H
#define RB_MLOG_READ_H

#include <stddef.h>
#include <stdint.h>

#include "rb_err.h"
#include "rb_mlog.h"

/* ---- layout ----------------------------------------------------------------------------- */

/*
 * The parts of a metadata region [0, meta_total_bytes), C = container_bytes (v1's rule:
 * meta_total_bytes / 2 rounded down to block_align), S = rb_mlog_sb_span(block_align),
 * R = the ring, C / 4 rounded down to block_align:
 *   superblock 0  [0, S)
 *   base area 0   [S, C - R)
 *   log ring      [C - R, C)
 *   superblock 1  [C, C + S)
 *   base area 1   [C + S, 2C - R)       (the same length as area 0)
 * -EINVAL (err says which) when the region is too small for that (fewer than 4 blocks per
 * part) or block_align is not a power of two.
 */
typedef struct rb_mlog_layout {
    uint64_t meta_total_bytes, container_bytes, block_align, sb_span;
    rb_mlog_area areas[2];
    rb_mlog_area ring;
} rb_mlog_layout;

int rb_mlog_layout_of(uint64_t meta_total_bytes, uint64_t block_align, rb_mlog_layout *out, rb_err *err);

/* The smallest metadata region the sizing rule allows, and the bytes per slot a base area is
 * sized for (a full base of LMCache object keys with checksums takes about 53). */
#define RB_MLOG_AUTO_MIN (128ull << 20)
#define RB_MLOG_AREA_PER_SLOT 64u

/*
 * meta_total_bytes for a blank device of capacity bytes with slots of slot_bytes: the
 * smallest multiple of 1 MiB (and of block_align), at least RB_MLOG_AUTO_MIN, whose layout's
 * base areas hold RB_MLOG_AREA_PER_SLOT bytes for every slot the rest of the device holds.
 * Deterministic (recovery recomputes it to find superblock 1 when superblock 0 is damaged).
 * 0 when the device is too small for any region.
 */
uint64_t rb_mlog_auto_meta_total(uint64_t capacity, uint64_t slot_bytes, uint64_t block_align);

/* ---- reading a region --------------------------------------------------------------------- */

/* Read len bytes at device offset off into buf. off and len are multiples of block_align and
 * buf is aligned to it. 0, or <0 with err filled (a short read is an error). */
typedef int (*rb_mlog_pread_fn)(void *ctx, uint64_t off, void *buf, size_t len, rb_err *err);

typedef struct rb_mlog_read_opts {
    uint64_t block_align;
    uint64_t meta_total_bytes; /* the region to look at: superblocks at 0 and its container_bytes */
    uint32_t threads;          /* base chunk decoders; 0 or 1: the calling thread only */
    int sb_only;               /* choose a superblock, read nothing else */
    /* bytes the log walk reads at a time (rounded down to block_align, at least a block);
     * 0 = RB_MLOG_READ_WINDOW. A group longer than that is read whole. */
    uint64_t log_window;
} rb_mlog_read_opts;

#define RB_MLOG_READ_WINDOW (8ull << 20)

/* Groups the log walk skipped: group seq (expected at ring offset at) failed its checks, could
 * not be read or was not there, and group next_seq of the same generation, with an epoch not
 * below the last one replayed (nor the failed group's, when its header reads), follows at
 * next_at. Groups seq .. next_seq - 1 are lost; records is how many records they held when
 * that is known (a single group whose header reads), else -1. */
typedef struct rb_mlog_gap {
    uint64_t seq, next_seq;
    uint64_t at, next_at;
    int64_t records;
    rb_err why; /* why group seq was not replayed */
} rb_mlog_gap;

/* Callbacks, all on the calling thread; a nonzero return stops reading and is returned. Any
 * may be NULL. Pointers are valid only during the call. */
typedef struct rb_mlog_read_cb {
    void *ctx;
    /* the chosen superblock, before anything else */
    int (*sb)(void *ctx, const rb_mlog_sb *sb);
    /* the base's class table, then each CLASS record of the log as the walk meets it */
    int (*cls)(void *ctx, const rb_mlog_class *c);
    /* the base's entries, chunk after chunk in the base's order, slot order inside a chunk */
    int (*ent)(void *ctx, const rb_mlog_ent *e);
    /* the same, a decoded chunk's entries at a time (used instead of ent when set and chunks are
     * decoded by threads; a bulk loader can then prefetch) */
    int (*ents)(void *ctx, const rb_mlog_ent *e, size_t n);
    /* the log's records in log order (after every base entry); a CLASS record goes to cls
     * first, then here */
    int (*rec)(void *ctx, uint64_t seq, const rb_mlog_rec *r);
    /* a damaged stretch of the base (rb_mlog_base_decode's reports) */
    int (*damage)(void *ctx, const rb_mlog_damage *d);
    /* damage in the middle of the log: groups skipped because later ones follow (before the
     * records of the group the walk goes on with) */
    int (*gap)(void *ctx, const rb_mlog_gap *g);
} rb_mlog_read_cb;

/* Superblock states in rb_mlog_read_result.sb_state. */
enum {
    RB_MLOG_SB_ABSENT = 0,   /* not our magic (blank, or another format) */
    RB_MLOG_SB_VALID = 1,    /* decoded */
    RB_MLOG_SB_DAMAGED = -1, /* our magic (or one byte off it), refused by the decoder */
    RB_MLOG_SB_NOBASE = -2,  /* decoded, but its base did not open or does not match it */
    RB_MLOG_SB_IOERR = -3,   /* the read failed */
};

/* Why the log walk ended. */
enum {
    RB_MLOG_END_NONE = 0, /* the next position holds no group of ours of this generation */
    RB_MLOG_END_TORN,     /* a group of the expected generation and sequence failed its checks */
    RB_MLOG_END_FULL,     /* the walk covered the whole ring */
    RB_MLOG_END_IOERR,    /* a read failed (log_why) */
};

typedef struct rb_mlog_read_result {
    int found; /* 1: a superblock was chosen (sb); 0: no usable superblock of ours */
    int which; /* the superblock used, 0 or 1 */
    /* 1 when the superblock used is not the newest one of ours: the other one was damaged, had
     * an I/O error, or had the higher sequence but its base was unusable */
    int fallback;
    int sb_state[2];
    uint64_t sb_seq_seen[2]; /* sb_seq of each valid superblock, 0 otherwise */
    rb_err sb_why[2];        /* why a superblock was refused */
    /* meta_total_bytes a superblock names when it decodes: one that names another region (or
     * another block_align) than opts is refused as DAMAGED, and this says which it named */
    uint64_t sb_meta_total[2];
    rb_mlog_sb sb;
    rb_mlog_base_result base; /* what the base delivered (see rb_mlog.h) */
    /* the log */
    uint64_t groups, records;
    uint64_t last_seq;     /* the last group replayed; sb.base.log_seq when none */
    uint32_t last_epoch;   /* the writer epoch of the last group replayed; 0 when none */
    uint32_t last_records; /* its records: 0 when none, or an end mark (a clean close's) */
    uint64_t head;         /* ring offset where the next group goes */
    uint64_t used;         /* ring bytes from sb.ring.start to head, wrap waste included */
    int log_end;           /* RB_MLOG_END_* */
    rb_err log_why;
    uint64_t torn_at; /* ring offset of the torn group (RB_MLOG_END_TORN) */
    /* damage in the middle of the log (see rb_mlog_gap): stretches skipped, groups lost in
     * them, their records (-1 when some count is unknown), the first one's ring offset,
     * sequence and reason */
    uint64_t gaps, groups_lost;
    int64_t records_lost;
    uint64_t gap_at, gap_seq;
    rb_err gap_why;
    uint64_t bytes_read;
} rb_mlog_read_result;

/*
 * Read the region: both superblocks; the valid one with the higher sb_seq whose base opens
 * and matches it (rb_mlog_base_matches), else the other (fallback); its base, chunks decoded
 * by opts->threads threads and delivered in order; then the log walk from ring.start. A
 * damaged chunk is reported and skipped. Where the walk finds no good group of the expected
 * sequence, the ring is scanned for later groups of the same writer (rb_mlog_gap): when one
 * follows, the stretch before it is damage, reported and skipped, and the walk goes on from
 * there; when none does, the log ends there (a torn tail; the result says how).
 * Returns 0 (res->found says whether a superblock was used), a negative errno for an out of
 * memory or a base read that failed (err), or what a callback returned to stop.
 */
int rb_mlog_read(const rb_mlog_read_opts *o, rb_mlog_pread_fn rd, void *rctx, const rb_mlog_read_cb *cb,
                 rb_mlog_read_result *res, rb_err *err);

/*
 * 1 when a read (rb_mlog_read's result) lost part of the metadata to damage: log groups
 * skipped, base chunks dropped, or the log cut short by a read error (the unreadable group
 * and any after it are lost to this open, and a writer going on from there would write over
 * it). The recovery then counts as damaged: entries checked against their slot headers, the
 * next checkpoint a whole base in a new generation. A torn tail is not damage (the last
 * group of a crash).
 */
int rb_mlog_read_lost(const rb_mlog_read_result *res);

#endif /* RB_MLOG_READ_H */
