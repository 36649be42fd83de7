/*
 * rb_core_int.h - the rb_core structure and the internal functions its files share. Each of
 * the core's files owns one concern:
 *   rb_core.c          lifecycle (open, layout, close, free), status, test hooks
 *   rb_core_xfer.c     synchronous device transfers, the fault hooks
 *   rb_core_uring.c    io_uring batches of transfers (rb_core_uring_ops), fixed buffers
 *   rb_core_put.c      the put path: slot reservation, writes, commit, make_room
 *   rb_core_load.c     the load path: snapshot, reads, slot-header verdicts, settling
 *   rb_core_keys.c     lookups, pins, deletes, the key snapshot
 *   rb_core_class.c    metadata classes (interning)
 *   rb_core_hold.c     slot reuse: readers' quarantine, held slots, container references
 *   rb_core_meta.c     both formats: recovery entry, checkpoint entry, periodic thread
 *   rb_core_v1.c       format v1: checkpoint containers written and read back at open
 *   rb_core_apply.c    a state v1 document applied to the index (one applier, both readers)
 *   rb_core_validate.c slot-header validation of the indexed entries
 *   rb_core_mlog.c     the log-structured metadata format, core side: journal, groups, bases
 *   rb_core_mlog_rec.c its recovery from base and log
 *   rb_core_dealloc.c  freed slots given back to the device
 *   rb_core_extent.c   extents (extent_bytes): geometry, the victim extent's keys, counters
 *   rb_core_trust.c    faults, write durability, device shrink
 *   rb_core_fastjson.c the plain v1 state reader
 * Lock order: see struct rb_core below and rb_core.h.
 */
#ifndef RB_CORE_INT_H
#define RB_CORE_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "rb_ckpt.h"
#include "rb_core.h"
#include "rb_debug.h"      /* debug builds: lock order and slot states checked */
#include "rb_device_int.h" /* the core reads the device's fields directly */
#include "rb_hist.h"
#include "rb_idx.h"
#include "rb_mlog.h"
#include "rb_mlog_read.h"
#include "rb_slots.h"

/* Interned (shape, dtype, fmt) of entries; "json" is the entry fragment
 * "shape":...,"dtype":...,"fmt":... written verbatim into checkpoints. */
typedef struct rb_class {
    char *dtype, *fmt;
    int64_t ndim;
    int64_t *dims;
    char *json;
    size_t json_len;
} rb_class;

/*
 * The log-structured metadata writer (rb_core_mlog.c). Changes are journaled as they are made,
 * under mu, into pages: the open page takes new records; a closed page has its log sequence
 * and is immutable, so a group whose write failed is written again byte for byte at the same
 * ring offset. A page also lists the slots its FREE records free: they return to use once the
 * page's group is durable.
 */
typedef struct rb_mlpage {
    rb_mlog_genc g;
    uint32_t *frees;
    size_t n_frees, cap_frees;
    size_t n_puts;       /* its PUT records: with none its group names no payload */
    uint32_t *put_slots; /* the slots its PUT records name (their put_pend bits) */
    size_t n_put_slots, cap_put_slots;
    uint64_t seq;   /* 0 while open; the group's sequence once closed */
    uint64_t t0_ns; /* when it took its first record (rb_now_ns): the age of its changes */
    uint8_t *img;   /* the sealed group (block-aligned), once sealed */
    size_t img_len;
    int placed; /* pos and lpos hold where its group goes (the first write attempt) */
    int taken;  /* a checkpoint is writing it (take_closed_pages): its FREEs come back as it ends */
    uint64_t pos, lpos;
} rb_mlpage;

enum { RB_ML_FRESH = 0, RB_ML_MIGRATE, RB_ML_LIVE };

typedef struct rb_mlw {
    int on;    /* cfg.meta_format == RB_META_LOG */
    int state; /* RB_ML_FRESH: no generation of ours on the device yet; MIGRATE: the device holds
                * format v1 (recovered); LIVE: a superblock of ours is current */
    rb_mlog_layout lay;
    rb_mlog_sb sb;        /* the current superblock (LIVE) */
    int sb_which;         /* where it is: 0 or 1 */
    uint64_t sb_seq_seen; /* the highest sb_seq of ours seen on the device (a new one goes above) */
    uint64_t generation;
    uint32_t epoch;         /* this process's writer epoch (RB_MLOG_GROUP_EPOCH_SHIFT) */
    int epoch_claimed;      /* a durable superblock names it (before the first group) */
    int newgen;             /* the epochs are used up: the next base starts a new generation */
    int bg_validate;        /* recovered entries' headers are validated by the periodic thread */
    int wipe_sbs;           /* format v1 over a log device: clear both superblocks first */
    uint64_t last_seq;      /* the sequence the last closed page got */
    uint64_t head;          /* ring offset of the next group */
    uint64_t lhead, lstart; /* logical ring positions (wrap waste counted) of the head and of the
                               * superblock's ring.start: lhead - lstart bytes are live */
    int end_marked;         /* the live log ends with an end mark or holds no group: close writes
                             * none (rb_core_ml_end_mark) */
    rb_mlpage **pg;         /* closed pages in sequence order, then the open page (seq 0) */
    size_t n_pg, cap_pg;
    uint32_t *cls_disk; /* per core class id: its id in this generation, UINT32_MAX none */
    uint32_t cap_cls_disk, next_disk_cls;
    uint64_t n_held; /* slots waiting in pages for their FREE to be durable */
    /* The deletes' lane: FREE records of deleted keys whose slots no waiting page names in a
     * PUT record, in a page of their own outside pg. A checkpoint writes it first, alone and
     * synced by itself, so the slots come back without the flush of the payloads the waiting
     * pages name (docs/metadata-log.md, "The deletes' lane"). */
    rb_mlpage *lane;
    int lane_want;      /* rb_core_delete_many is dropping entries (mu held): their FREEs may go there */
    int lane_off;       /* put_pend could not grow (or rb_core_free_lane_off): every FREE goes in line */
    uint64_t *put_pend; /* a bit per slot: a page not yet durable holds a PUT record of it */
    size_t put_pend_words;
    uint64_t lane_groups, lane_records, gap_lanes; /* gap_lanes: lane groups written in a flush gap */
    /* The payload flush of a whole checkpoint (write_groups: ckpt_mu held, its pages taken but
     * none sealed or placed) is a gap in which another thread may write the lane without
     * ckpt_mu (rb_core_ml_release_lane), so freed slots do not wait for that flush. Under mu:
     * flush_gap while the writer flushes, gap_lane while a lane writer works in the gap (one
     * at a time; the writer waits for it before it goes on); gap_cv is signalled when either
     * clears or when a group writer lets ckpt_mu go. */
    int flush_gap, gap_lane;
    pthread_cond_t gap_cv;
    uint32_t *held_base; /* slots freed while the journal was incomplete: back at the next base */
    size_t n_held_base, cap_held_base;
    uint64_t need_base; /* nonzero: the journal lost a change (out of memory), a failed flush
                               * dropped entries, or the index was replaced; the next checkpoint
                               * writes a whole base, and no group is written before it */
    /* compaction in progress (under mu): the log sequence it covers, and where group Q + 1 went */
    int cmp_active, cmp_placed;
    uint64_t cmp_q, cmp_pos, cmp_lpos;
    int cmp_urgent;         /* the ring is full: compact before the next group */
    pthread_mutex_t cmp_mu; /* one base being built at a time */
    /* statistics */
    uint64_t groups_written, group_bytes, last_group_bytes, last_group_records;
    uint64_t bases_written, last_base_bytes, last_base_entries, base_too_large, compactions;
    uint64_t journal_lost, ring_full;
    uint64_t last_base_ns, last_switch_ns;
    /* recovery */
    uint64_t rec_groups, rec_records, rec_chunks_bad, rec_entries_lost;
    uint64_t rec_read_ns; /* the region read (base and log into the index) */
    int rec_log_end;
    uint64_t rec_gaps, rec_groups_lost; /* damage the log walk went on past */
    int64_t rec_records_lost;           /* -1: not all countable */
} rb_mlw;

/*
 * The core, its fields grouped by concern. Locks, in lock order: reclaim_mu (one
 * rb_core_reclaim, held across its checkpoints) -> ml.cmp_mu (the log format's
 * compaction) -> ckpt_mu (one checkpoint writer, held across its device writes) -> dl_mu (a
 * deallocation run) -> mu (the core mutex) -> thr_mu (the periodic thread); fault_mu, the
 * device's gate_mu and rb_dev_lock.c's reg_mu (its list of lock descriptors, also taken by
 * fork(2) through pthread_atfork) are leaves (rb_core.h). mu guards what the operations share: the index,
 * in-flight table, classes, slots, reuse lists and counters; it is never held across device
 * I/O. Configuration and layout are set at open and read without a lock; the atomics are read
 * and written without one. Debug builds check the lock order on every acquire (rb_debug.h).
 */
struct rb_core {
    /* ---- configuration, device and layout (rb_core.c: set at open) ---------------------- */
    rb_core_cfg cfg;
    char *path;
    rb_dev *dev;
    uint64_t capacity, data_base, container_bytes, payload_cap, slot_cap;
    uint32_t max_slots;
    /* The strided layout (log format, extent_bytes not a multiple of slot_bytes; 0 otherwise):
     * extent k at ext_base + k * ext_stride holds ext_per slots; rb_slot_offset. */
    uint64_t ext_base, ext_stride;
    uint32_t ext_per;
    /* extent_bytes: where the value in cfg came from (rb_core_autoext.c) and the drive's FDP
     * reclaim unit when auto read it. */
    const char *ext_source;
    uint64_t ext_ru;
    /* Size classes (size_classes > 1, always strided; n_sc 1 otherwise): each class's slot bytes
     * (rb_sc_slot_bytes); extent k's class is slots.ext.cls[k], ext_per the smallest class's
     * slot count, so a class of larger slots uses the first of the extent's ids. */
    uint32_t n_sc;
    uint64_t sc_bytes[RB_SIZE_CLASSES_MAX];
    uint64_t sc_dropped; /* recovered entries whose size contradicted their extent's class */

    /* ---- locks and the periodic thread (rb_core_meta.c) --------------------------------- */
    pthread_mutex_t reclaim_mu; /* one rb_core_reclaim at a time */
    pthread_mutex_t ckpt_mu;
    pthread_mutex_t mu;
    pthread_mutex_t thr_mu; /* with thr_cv: the thread's stop flag and wake-up */
    pthread_cond_t thr_cv;
    pthread_t thr;
    int thr_started, thr_stop;
    int thr_kick; /* log format: RB_KICK_* bits, why the periodic thread is to write now */

    /* ---- index, metadata classes and slots (under mu) ----------------------------------- */
    rb_idx index, inflight, classes;
    rb_class **cls; /* rb_core_class.c */
    uint32_t n_cls, cap_cls;
    uint32_t last_cls; /* the class rb_core_intern_class last returned (a hint, compared in full) */
    rb_slots slots;
    uint64_t locked_keys; /* index records pinned (refcnt > 0) */

    /* ---- calls in flight (under mu): close waits for them ------------------------------- */
    pthread_cond_t idle_cv; /* with mu: inflight_io or in-flight keys dropped */
    uint64_t inflight_io;
    uint64_t last_io_ns;
    int closed;

    /* ---- slot reuse (rb_core_hold.c, under mu) ------------------------------------------ */
    /* Slot quarantine (rb_core_reader_begin/end): readers in flight per generation, and the
     * slots freed meanwhile, per generation, that nobody may reuse yet. */
    uint64_t rd_gen;
    uint32_t rd_active[2];
    uint32_t *rd_pend[2];
    size_t rd_npend[2], rd_cap[2];
    uint64_t rd_quarantined; /* slots that ever waited (a statistic for tests) */
    /* Slots the checkpoint containers on the device may list (crash safety, see
     * rb_core_free_slot_locked): per slot, RB_REF_C0 / RB_REF_C1 when container 0 / 1 lists it
     * as far as we know, RB_REF_PEND when the checkpoint being written lists it. ref covers
     * slots [0, ref_cap); slots beyond carry no bits. ref_unknown has bit k set while container
     * k holds a checkpoint of ours whose entries we did not read (it may list any slot). held:
     * freed slots that a container still lists, returned to use once checkpoints that exclude
     * them are durable. */
    uint8_t *ref;
    uint32_t ref_cap;
    uint8_t ref_unknown;
    uint32_t *held;
    size_t n_held, cap_held;
    uint64_t held_total; /* slots that ever waited for a checkpoint (a statistic) */
    uint64_t room_ckpts; /* checkpoints written because only a checkpoint could free slots */

    /* ---- checkpoints (rb_core_meta.c, rb_core_v1.c) ------------------------------------- */
    uint64_t dirty_total, persisted, meta_seq;
    int good_container;  /* container holding the newest checkpoint we trust, or -1 */
    int apply_container; /* recovery: the container whose state is being applied, else -1 */
    uint64_t ckpt_written, ckpt_failures, ckpt_too_large;
    char ckpt_error[512];
    _Atomic uint64_t flushes;       /* device flushes the checkpoint writer issued */
    _Atomic uint64_t wb_acc;        /* payload bytes put through the page cache since the last write-behind */
    _Atomic uint64_t write_behinds; /* write-backs the periodic thread started (rb_dev_write_behind) */

    /* ---- recovery: what it found at open (report_status, logs) -------------------------- */
    uint64_t recovery_dropped, recovery_entries_loaded;
    int recovery_loaded;
    int rec_outcome; /* enum rb_recovery_outcome */
    uint64_t rec_ns; /* time recovery took at open */
    uint64_t rec_seq, rec_rejected_seq;
    int64_t rec_lost;       /* entries of a rejected newer checkpoint not recovered; -1 unknown */
    uint64_t apply_skipped; /* entries of the last applied state that its checks refused */

    /* ---- verification of what loads read (rb_core_load.c, under mu) --------------------- */
    uint64_t checksum_failures;
    uint64_t n_unverified;      /* live index records carrying RB_ENT_UNVERIFIED */
    uint64_t deferred_verified; /* unverified records whose header a load accepted */
    uint64_t deferred_dropped;  /* ... and rejected (also counted in recovery_dropped) */
    uint64_t sum_dropped;       /* entries dropped because their payload failed its checksum */

    /* ---- the log-structured metadata writer (cfg.meta_format == RB_META_LOG) ------------ */
    rb_mlw ml;

    /* ---- trust (rb_core_trust.c) -------------------------------------------------------- */
    /* Under mu: per slot, the first flush generation that proves the key last committed on it
     * durable (slot_gen[s], 0 for slots never written by this process: covers [0,
     * slot_gen_cap)); flushes begun and the newest generation proven; the write-back failure
     * epoch (an in-flight record carries the epoch it began in; a failure in between rolls it
     * back); the device size last seen and the slots wholly inside it. The counters
     * trust_counts reads are atomics (read without locks). Under fault_mu: the fault journal. */
    uint64_t *slot_gen;
    uint32_t slot_gen_cap;
    uint64_t flush_begun, durable_gen;
    uint64_t commits, commits_at_begin, commits_proven; /* for undurable_writes */
    uint32_t wb_epoch;                                  /* flushes that failed */
    _Atomic uint64_t wb_dropped; /* entries dropped because a flush failed before they were durable */
    uint64_t dev_size_seen;
    uint32_t usable_slots; /* slots below this lie wholly inside the device (<= max_slots) */
    uint64_t retired_slots;
    _Atomic uint64_t shrink_dropped, load_rejected;
    pthread_mutex_t fault_mu;
    rb_fault faults[RB_FAULTS_KEPT]; /* a ring: fault seq s sits at (s - 1) % RB_FAULTS_KEPT */
    _Atomic uint64_t n_faults;
    uint64_t fault_by_errno[RB_ERRNO_SLOTS];

    /* ---- deallocation of freed slots (rb_core_dealloc.c) -------------------------------- */
    /* Under mu: whether it is on (the setting resolved against the device), reusable slots
     * waiting for their deallocation (dl_pend) or in one (dl_inflight: out of every list
     * meanwhile), statistics, and the optional journal of deallocated ranges. */
    int dl_on;
    uint32_t *dl_pend;
    size_t dl_npend, dl_cap;
    uint64_t dl_inflight;
    pthread_mutex_t dl_mu; /* held by a run from start to end; lock order ckpt_mu -> dl_mu -> mu */
    pthread_cond_t dl_cv;  /* with mu: a batch's slots are back (dl_inflight 0); a put out of
                            * slots waits for it rather than fail */
    uint64_t dl_slots, dl_ranges, dl_cmds, dl_bytes, dl_failures, dl_skipped, dl_ns;
    int dl_log_on;
    rb_dev_range *dl_log;
    size_t dl_nlog, dl_caplog;

    /* ---- observability (rb_hist.h: atomics, no lock) ----------------------------------- */
    rb_obs obs;

    /* ---- test and benchmark hooks (atomics) --------------------------------------------- */
    _Atomic int no_flush;      /* benchmark hook: checkpoints skip their flushes */
    _Atomic int no_dsync;      /* the kernel or the file refused RWF_DSYNC: groups are written, then flushed */
    _Atomic int no_load_check; /* benchmark hook: loads of verified records skip the header check */
    _Atomic int64_t fault_write, fault_read, fault_submit, fault_prep, fault_flush;
    _Atomic uint32_t ckpt_delay_ms;
    _Atomic uint32_t load_delay_ms; /* test hook: pause loads between snapshot and reads */
};

uint64_t rb_now_ns(void);
/* *ts set to ns from now on CLOCK_MONOTONIC: a deadline for a timed wait on a condition
 * variable made with that clock. */
void rb_deadline_in(struct timespec *ts, uint64_t ns);

/* ---- shared helpers of the core's files ------------------------------------------------- */

/* A test fault hook's countdown (fault_write and friends): 1 when this call is the one to
 * fail (the countdown reaches zero), 0 otherwise or when it is off (<= 0). */
static inline int rb_core_take_fault(_Atomic int64_t *ctr)
{
    int64_t v = atomic_load(ctr);
    while (v > 0) {
        if (atomic_compare_exchange_weak(ctr, &v, v - 1))
            return v == 1;
    }
    return 0;
}
/* A call enters (n transfers) / leaves the I/O accounting close waits on. mu held. */
static inline void rb_core_io_begin_locked(rb_core *c, uint64_t n)
{
    c->inflight_io += n;
}
static inline void rb_core_io_end_locked(rb_core *c, uint64_t n)
{
    c->inflight_io -= n;
    c->last_io_ns = rb_now_ns();
    if (c->inflight_io == 0)
        pthread_cond_broadcast(&c->idle_cv);
}
/* rb_core_class.c: a NUL-terminated copy of s[0..n), or NULL (ENOMEM). */
char *rb_core_dupn(const char *s, size_t n);
/* rb_core_class.c: free the interned classes and their index (rb_core_free). */
void rb_core_classes_free(rb_core *c);
/* rb_core_hold.c: free the quarantine, held and reference lists (rb_core_free). */
void rb_core_hold_free(rb_core *c);
/* rb_core_hold.c: account for the index record at p leaving the index (lock refcount,
 * unverified count) and free its slot; the caller removes the record. mu held. */
void rb_core_drop_accounting_locked(rb_core *c, uint32_t p);
/* rb_core_keys.c: rb_core_delete_many in two halves. delete_locked drops keys[0..n) (hashes hs,
 * or NULL: hashed here) from the index and cancels them in flight, those a load or a pin holds
 * kept unless force; results[i] 1 when key i was indexed or in flight. Returns how many indexed
 * keys it dropped. mu held. delete_after, mu released: wakes the periodic thread for the freed
 * slots when kick, deallocates what format v1 made reusable, counts deleted and the delete's
 * time from t0 (rb_obs_t0; 0: not timed). */
uint64_t rb_core_delete_locked(rb_core *c, const char *const *keys, const size_t *lens, const uint32_t *hs, size_t n,
                               int force, uint8_t *results);
void rb_core_delete_after(rb_core *c, int kick, uint64_t deleted, uint64_t t0);

static inline uint64_t rb_round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}
/*
 * Slot <-> device offset: everything that maps one to the other goes through these. The
 * identity layout (format v1's, LMCache's): slot i at data_base + i * slot_bytes. The strided
 * layout (ext_stride != 0: the log format with extent_bytes not a multiple of slot_bytes):
 * slot i is slot i % ext_per of extent i / ext_per, extent k starting at ext_base + k *
 * ext_stride (ext_base the first extent_bytes boundary at or past data_base); the tail of each
 * extent past its ext_per slots is never used.
 */
/* The slot bytes of extent k's class (size classes; a wholly free extent, with none, counts in
 * the smallest class's slots: its ids then tile it). */
static inline uint64_t rb_ext_slot_bytes(const rb_core *c, uint32_t k)
{
    if (c->n_sc < 2)
        return c->cfg.slot_bytes;
    uint8_t cl = c->slots.ext.cls[k];
    return c->sc_bytes[cl < c->n_sc ? cl : c->n_sc - 1];
}
/* The device offset of slot. With size classes it reads the slot's extent's class, which is
 * safe without mu only while something keeps the extent from changing class (it changes only
 * when every id of the extent is free, under mu), and every caller off mu has such a pin: a put
 * its reserved slot; a load or a header validation its reader generation (a slot freed while it
 * runs waits in quarantine, rb_core_quarantine_slot_locked); a deallocation run its batch's
 * extents (RB_EXT_DEALLOC: off every list, opened by no put). Recovery runs alone. */
static inline uint64_t rb_slot_offset(const rb_core *c, uint32_t slot)
{
    if (!c->ext_stride)
        return c->data_base + (uint64_t)slot * c->cfg.slot_bytes;
    return c->ext_base + (uint64_t)(slot / c->ext_per) * c->ext_stride +
           (uint64_t)(slot % c->ext_per) * rb_ext_slot_bytes(c, slot / c->ext_per);
}
/* The slot starting at device offset off into *slot: 0, or -1 when no slot starts there (not
 * checked against max_slots). */
static inline int rb_offset_slot(const rb_core *c, uint64_t off, uint64_t *slot)
{
    const uint64_t sb = c->cfg.slot_bytes;
    if (!c->ext_stride) {
        if (off < c->data_base || (off - c->data_base) % sb)
            return -1;
        *slot = (off - c->data_base) / sb;
        return 0;
    }
    if (off < c->ext_base)
        return -1;
    uint64_t k = (off - c->ext_base) / c->ext_stride, in = (off - c->ext_base) % c->ext_stride;
    uint64_t one = sb, n = c->ext_per;
    if (c->n_sc > 1) { /* an extent with a class: its slots; without one, no slot starts there */
        if (k >= c->slots.ext.n || c->slots.ext.cls[k] >= c->n_sc)
            return -1;
        one = c->sc_bytes[c->slots.ext.cls[k]];
        n = c->slots.ext.cnt[c->slots.ext.cls[k]];
    }
    if (in % one || in / one >= n)
        return -1;
    *slot = k * c->ext_per + in / one;
    return 0;
}
/* How many slots lie wholly below device offset end (the first slots: a shrunk device's fit). */
static inline uint64_t rb_slots_below(const rb_core *c, uint64_t end)
{
    const uint64_t sb = c->cfg.slot_bytes;
    if (!c->ext_stride)
        return end > c->data_base ? (end - c->data_base) / sb : 0;
    if (end <= c->ext_base)
        return 0;
    uint64_t k = (end - c->ext_base) / c->ext_stride, in = (end - c->ext_base) % c->ext_stride;
    uint64_t tail = in / sb < c->ext_per ? in / sb : c->ext_per;
    return k * c->ext_per + tail;
}
/* Whole blocks on the wire: O_DIRECT, and NVMe passthrough (commands move whole LBAs). */
static inline int rb_block_transfers(const rb_core *c)
{
    return c->dev->odirect || c->dev->uring_cmd;
}
/* Transfer length on the device for a payload (padded to block_align when whole blocks). */
static inline uint64_t rb_xfer_len(const rb_core *c, uint64_t len)
{
    return rb_block_transfers(c) ? rb_round_up(len, c->cfg.block_align) : len;
}
/* Synchronous device transfers (EINTR retried), honouring the test fault hooks. A failed data
 * transfer or metadata write is entered in the fault journal (err is left as it was). */
int rb_core_dev_write(rb_core *c, uint64_t off, const void *buf, size_t buf_len, size_t payload_len, size_t total_len,
                      int data, rb_err *err);
int rb_core_dev_read(rb_core *c, uint64_t off, void *buf, size_t buf_len, size_t payload_len, size_t total_len,
                     int data, rb_err *err);
/* A data read of a slot's payload at off with the head_len bytes before it (the slot header)
 * read into head by the same system call (rb_xfer_set_head). Not for passthrough devices. */
int rb_core_dev_read_headed(rb_core *c, uint64_t off, void *head, size_t head_len, void *buf, size_t buf_len,
                            size_t payload_len, size_t total_len, rb_err *err);
/* One transfer of an io_uring batch run by rb_core_uring_ops. */
typedef struct rb_uop {
    uint64_t off;
    void *buf;
    size_t buf_len, payload_len, total_len;
    size_t copy_len; /* reads: bytes copied back after a bounced read */
    int write;
    uint16_t pid; /* writes: FDP placement id (a directive on a passthrough device), 0 = none */
    int rc;       /* out: 0 done, <0 failed (err) */
    rb_err err;   /* out */
} rb_uop;

/* Run ops through the device's io_uring engine: batches of at most per_batch requests (0 = one
 * batch), all submitted before the first wait, every submitted batch waited for. Honours the
 * data fault hooks when data is set. Returns 0, or <0 (err) when a submission failed; each
 * op's rc says how it ended either way. No core lock may be held. */
int rb_core_uring_ops(rb_core *c, rb_uop *ops, size_t n, size_t per_batch, int data, rb_err *err);
/* The same in two halves, so a caller can keep several runs in flight (pipelining): begin
 * submits (its return value and the ops' rc as in rb_core_uring_ops so far), finish waits and
 * fills in the results. Every begin must be followed by exactly one finish. */
typedef struct rb_uops_run {
    rb_core *c;
    rb_uop *ops;
    size_t n;
    struct rb_batch **bs;
    uint32_t *map;
    size_t per, submitted;
    int entered, data;
    size_t unsent_from; /* ops from here on that a failed submission left unsent (n: none) */
    int unsent_rc;
} rb_uops_run;
int rb_core_uring_ops_begin(rb_core *c, rb_uops_run *r, rb_uop *ops, size_t n, size_t per_batch, int data, rb_err *err);
void rb_core_uring_ops_finish(rb_uops_run *r);
static inline int rb_core_uses_uring(const rb_core *c)
{
    return c->cfg.io_engine == RB_ENGINE_IOURING && c->dev && c->dev->uring;
}
/*
 * Bytes of a slot header read to judge it. Validation needs the first RB_KEYHASH_END (48)
 * bytes (magic, identity, length, checksum record, key hash); the rest of header_bytes is
 * padding. Buffered
 * devices read one 64-byte line (a buffered 4 KiB read is a 4 KiB copy: ~1.7 us of the ~2 us
 * per header on the page cache). O_DIRECT devices keep the whole header: our O_DIRECT rule is
 * block_align-sized transfers (and passthrough's whole LBAs), and on this path the request
 * latency, not its size, dominates.
 * Same verdicts: every indexed slot lies wholly inside the device size checked at open
 * (slot < max_slots), so a prefix read succeeds exactly when the whole-header read does, and
 * the decoder looks at nothing past RB_KEYHASH_END. (Only an I/O error confined to the unread
 * padding would now keep an entry the full read dropped; its payload is elsewhere.)
 */
#define RB_HDR_PROBE 64u
_Static_assert(RB_HDR_PROBE >= RB_KEYHASH_END, "a header probe reads every field the decoder judges");
static inline size_t rb_header_read_len(const rb_core *c)
{
    size_t hb = c->cfg.header_bytes;
    return rb_block_transfers(c) || hb < RB_HDR_PROBE ? hb : RB_HDR_PROBE;
}
/* Drop the live index record at p as recovery does (lock refcount, unverified count, slot
 * released). mu held; the caller accounts dirty_total / counters and compacts. */
void rb_core_drop_locked(rb_core *c, uint32_t p);
/* Intern a metadata class under mu. Returns the id or UINT32_MAX (ENOMEM). */
uint32_t rb_core_intern_class(rb_core *c, const rb_meta_in *m);
/*
 * Release a slot under mu. A reader (a load, a header validation) snapshots an entry's slot
 * under mu and reads it after dropping mu; if the entry is deleted meanwhile and a put takes
 * the slot, the reader would get another key's bytes as its own. So while readers are in
 * flight a freed slot waits in quarantine, by generation: slots freed during generation G
 * return to the free list once every reader that began in G or earlier has ended. With no
 * reader in flight a slot is released at once. If the quarantine cannot grow (out of memory)
 * the slot is kept out of use until the next recovery rather than risk the race.
 */
void rb_core_quarantine_slot_locked(rb_core *c, uint32_t slot);
/*
 * Crash safety of slot reuse: a slot that a checkpoint container on the device lists is never
 * handed to another key. Otherwise a crash (or power loss) after the new key's payload landed
 * but before its header did leaves the old key's header over the new key's bytes, and
 * recovery, which trusts that container, would serve them as the old key's. So a freed slot
 * waits on the held list until checkpoints that exclude it are durable in both containers (the
 * older one is what recovery falls back to when the newer is damaged); see rb_core_v1.c.
 */
#define RB_REF_C0 0x1u
#define RB_REF_C1 0x2u
#define RB_REF_PEND 0x4u
void rb_core_hold_slot_locked(rb_core *c, uint32_t slot);
/* The held list once per slot: a held slot routed again (a FREE record of it released while
 * it is held) is listed twice, and a loop that frees the held slots must free each once. mu
 * held. */
void rb_core_held_dedupe_locked(rb_core *c);
/* Append slot to a growable list of slots (*v, *n of *cap): 0, or -ENOMEM with the list as it
 * was. The quarantine, the held lists and the deallocation list all grow this way. */
static inline int rb_slot_list_push(uint32_t **v, size_t *n, size_t *cap, uint32_t slot)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        uint32_t *np = realloc(*v, nc * sizeof(*np));
        if (!np)
            return -ENOMEM;
        *v = np;
        *cap = nc;
    }
    (*v)[(*n)++] = slot;
    return 0;
}
/* A slot goes back to the allocator, or, past the end of a device that shrank meanwhile, out of
 * use (retired_slots). mu held. */
static inline void rb_core_slot_back_locked(rb_core *c, uint32_t slot)
{
    if (slot >= c->usable_slots)
        c->retired_slots++;
    else
        rb_slots_release(&c->slots, slot);
}

/* ---- rb_core_extent.c: extents (rb_slots.h) --------------------------------------------- */

/* extent_bytes=auto resolved into c->cfg.extent_bytes (rb_core_autoext.c), once the device is
 * open and the data area known (layout). 0, or <0 with err naming the setting and the path. */
int rb_core_extent_resolve(rb_core *c, rb_err *err);

/* Set up extents when extent_bytes is on (after rb_slots_init at open): 0 or <0 with err. */
int rb_core_extent_init(rb_core *c, rb_err *err);
void rb_core_extent_status_locked(const rb_core *c, rb_core_status *st);
/* Recovery with size classes (after rb_slots_reset, before the unlisted slots are released):
 * each extent holding entries takes the class of its first entry's size; an entry whose size
 * names another class, or whose slot is past its class's count, is dropped (counted in
 * sc_dropped and recovery_dropped) and its slot_pos cleared. mu held. A dropped entry's slot
 * is released at once and no FREE is journaled: only damage read past makes an entry contradict
 * its extent's class, and then (ml_adopt_log_locked: need_base) the next checkpoint writes a
 * whole base, without it, before any log group; until then a crash recovers the same state and
 * drops the same entries again. */
void rb_core_sc_recover_locked(rb_core *c, uint32_t *slot_pos, uint32_t cap);

/* ---- rb_core_dealloc.c: freed slots given back to the device ---------------------------- */

/* Resolve the deallocate_freed setting against the opened device (c->dev). */
void rb_core_dealloc_init(rb_core *c);
void rb_core_dealloc_free(rb_core *c);
/* A slot is reusable (no durable metadata lists its old key, no reader holds it): back to the
 * allocator, or, with deallocation on, onto the pending list first. mu held. */
void rb_core_release_slot_locked(rb_core *c, uint32_t slot);
/* The put path found no free slot: pending slots go to the allocator undeallocated (counted
 * as skipped). Returns how many. mu held. */
size_t rb_core_dealloc_take_locked(rb_core *c);
void rb_core_dealloc_status_locked(const rb_core *c, rb_core_status *st);
/* A new state replaces the allocator's contents (apply_begin, with dl_mu and mu held, so no
 * run is deallocating): the pending slots are forgotten; the state claims them or frees them
 * again. */
void rb_core_dealloc_reset_locked(rb_core *c);

static inline void rb_core_free_slot_locked(rb_core *c, uint32_t slot)
{
    /* FREEING already: a held slot routed again (rb_core_mlog.c) */
    rb_slots_move(&c->slots, slot, RB_SLOT_IN(RB_SLOT_LIVE) | RB_SLOT_IN(RB_SLOT_FREEING), RB_SLOT_FREEING, __func__);
    if (slot < c->ref_cap && c->ref[slot]) {
        rb_core_hold_slot_locked(c, slot);
        return;
    }
    if (c->rd_active[0] + c->rd_active[1] == 0)
        rb_core_release_slot_locked(c, slot); /* no reader in flight: reusable at once */
    else
        rb_core_quarantine_slot_locked(c, slot);
}
/* A reader begins (under mu, with its snapshot): returns its generation for reader_end. */
uint64_t rb_core_reader_begin_locked(rb_core *c);
void rb_core_reader_end_locked(rb_core *c, uint64_t gen);
/* Forget the quarantined and held slots (a new state replaces the allocator's contents). */
void rb_core_quarantine_reset_locked(rb_core *c);
/* Make ref cover slots [0, n). 0 or -ENOMEM. mu held. */
int rb_core_ref_reserve_locked(rb_core *c, uint32_t n);
/* 1 when a put of n keys can only get slots after a checkpoint (a container's entries are
 * unknown, or too few slots are free while some wait for a checkpoint). mu held. */
int rb_core_room_needed_locked(const rb_core *c, size_t n);
/* rb_core_fastjson.c: the plain form of a state v1 document, read without json-c. */
enum {
    RB_FTOP_VERSION,
    RB_FTOP_DEVICE_PATH,
    RB_FTOP_CAPACITY,
    RB_FTOP_BLOCK_ALIGN,
    RB_FTOP_HEADER_BYTES,
    RB_FTOP_SLOT_BYTES,
    RB_FTOP_META_TOTAL,
    RB_FTOP_META_MAGIC,
    RB_FTOP_META_VERSION,
    RB_FTOP_DATA_BASE,
    RB_FTOP_NEXT_SLOT,
    RB_FTOP_ENTRIES,
    RB_FTOP_N
};
extern const char *const rb_ftop_names[RB_FTOP_N];
typedef struct rb_fent {
    const char *key;         /* into the document, not NUL-terminated */
    const char *dtype, *fmt; /* NULL = null or absent */
    int64_t off, size;
    uint64_t sum;       /* "xxh3" (ours): the payload checksum, when has_sum */
    int64_t ndim, npos; /* -1 = null or absent */
    uint32_t klen, hash, dims_at, pos_at, dtype_len, fmt_len;
    uint8_t has_off, has_size, has_sum;
} rb_fent;
typedef struct rb_fstate {
    uint8_t has[RB_FTOP_N];
    int64_t num[RB_FTOP_N];
    const char *str[RB_FTOP_N];
    size_t str_len[RB_FTOP_N];
    rb_fent *ents;
    size_t n, cap;
    int64_t *pool; /* shapes and positions */
    size_t npool, cap_pool;
} rb_fstate;
/* 1 parsed (every entry key distinct), 0 outside the plain form (use json-c), -ENOMEM. */
int rb_fstate_parse(const char *buf, size_t len, rb_fstate *st);
void rb_fstate_free(rb_fstate *st);
/* The flush fault hook (RB_FAULT_FLUSH): 1 when this flush is to fail. */
int rb_core_take_flush_fault(rb_core *c);

/* ---- rb_core_trust.c: faults, write durability, device shrink ------------------------- */

/* Set up / tear down the trust state (fault_mu). */
void rb_core_trust_init(rb_core *c);
void rb_core_trust_free(rb_core *c);
/* Enter a failed transfer or flush in the fault journal: op ("write", "read", "flush"), the
 * device offset (UINT64_MAX for none) and err as the device layer filled it. Any lock. */
void rb_core_note_fault(rb_core *c, const char *op, uint64_t off, const rb_err *err);
/* The whole story of a failed transfer as one line: what failed, at which offset, the errno's
 * text and name, then the path ("write failed at offset 8192: pwrite failed: No space left on
 * device (ENOSPC); device_path='/dev/loop3'"). off UINT64_MAX: no offset. */
void rb_core_fault_text(const rb_core *c, const char *op, uint64_t off, const rb_err *err, char *buf, size_t n);
/* A key was committed on slot: its bytes are not proven durable until a flush that begins
 * after this returns succeeds. mu held. 0 or -ENOMEM (the commit must then fail). */
int rb_core_write_committed_locked(rb_core *c, uint32_t slot);
/* Flush accounting, mu held: begin returns the flush's generation; done(gen, ok) settles it.
 * A success proves every key committed before the flush began; a failure drops every entry
 * not yet proven (and rolls back puts in flight, through wb_epoch), since Linux reports a
 * write-back error once and a later flush would succeed without the lost bytes. */
uint64_t rb_core_flush_begin_locked(rb_core *c);
/* Bytes the durability state holds (8 per slot written so far). mu held. */
size_t rb_core_trust_mem_bytes(const rb_core *c);
void rb_core_flush_done_locked(rb_core *c, uint64_t gen, int ok);
/* Read the device size again (no lock; a system call) and, when the device shrank, drop the
 * entries whose slot no longer lies wholly inside it and keep those slots out of use (mu
 * taken inside). Returns the number of slots wholly inside the device. */
uint32_t rb_core_check_size(rb_core *c);

/* rb_core_meta.c: recovery at open, either format. */
int rb_core_recover(rb_core *c, rb_err *err);
/* Shared by both formats' writers (rb_core_meta.c). */
int rb_core_meta_write(rb_core *c, uint64_t off, void *buf, size_t len, rb_err *err);
int rb_core_flush(rb_core *c, rb_err *err);
/* Whether rb_core_meta_write_synced can sync a write's own range (not through NVMe
 * passthrough, nor where the benchmark hook skips flushes, nor for metadata written with an
 * FDP placement through io_uring). */
int rb_core_meta_can_sync_range(rb_core *c);
int rb_core_meta_write_synced(rb_core *c, uint64_t off, void *buf, size_t len, rb_err *err);
void rb_core_explain_device_error(const rb_core *c, const char *op, uint64_t off, rb_err *err);
void rb_core_set_ckpt_error(rb_core *c, const rb_err *err);
/* A checkpoint decision under mu: 1 when one is to be written (force as rb_core_checkpoint,
 * room_n as rb_core_checkpoint_room). */
int rb_core_ckpt_due_locked(rb_core *c, int force, size_t room_n);
/* rb_core_v1.c: the v1 writer, ckpt_mu held: target -1 chooses the container, 0 or 1 forces
 * it. */
int rb_core_ckpt_v1_locked(rb_core *c, int force, size_t room_n, int target, rb_err *err);
/* Format v1's recovery from the newest readable container (rb_core_recover, when the device
 * holds no log-format superblock). */
int rb_core_v1_recover(rb_core *c, rb_err *err);
/* rb_core_validate.c: validate the live entries' slot headers (meta_verify_on_load). 0 or
 * -ENOMEM. */
int rb_core_validate_entries(rb_core *c, int sequential);
/* The same, 65,536 index positions at a time, returning early once *stop is set. */
int rb_core_validate_sliced(rb_core *c, const int *stop);

/* rb_core_mlog.c: the log-structured format. Lock order: ml.cmp_mu -> ckpt_mu -> mu. */
#define RB_META_TOTAL_LMCACHE (128ull << 20) /* LMCache's default meta_total_bytes */
/* The metadata region of a log-format device opened with meta_total_bytes at LMCache's
 * default: what its superblock records (either copy), 128 MiB on a format v1 device, else
 * sized from the slot count (rb_mlog_auto_meta_total). Reads the device (c->dev open,
 * c->capacity set). */
uint64_t rb_core_ml_region_bytes(rb_core *c);
int rb_core_ml_init(rb_core *c, rb_err *err);
void rb_core_ml_free(rb_core *c);
/* Journal a committed entry / a slot leaving the index (the slot is held until the FREE is
 * durable). mu held. */
void rb_core_ml_put_locked(rb_core *c, const rb_ent *e);
void rb_core_ml_free_locked(rb_core *c, uint32_t slot);
/* Recovery from the log format: 1 read (the index holds it), 0 no superblock of ours (blank
 * or format v1), <0 error. */
int rb_core_ml_recover(rb_core *c, rb_err *err);
/* A checkpoint in the log format: 1 written, 0 nothing to write, <0 failed. */
int rb_core_ml_checkpoint(rb_core *c, int force, size_t room_n, rb_err *err);
/* At a clean close, after the final checkpoint: a group of no records after the log's last
 * one, flushed, so damage to that last group is reported as damage, not taken for a torn tail.
 * None when the log already ends with one or holds no group, or changes are left unwritten.
 * 1 written, 0 none, <0 failed (recorded). No lock held. */
int rb_core_ml_end_mark(rb_core *c, rb_err *err);
/* Format v1 taking over a log-format device: zero both superblocks and flush. mu not held. */
int rb_core_ml_wipe_superblocks(rb_core *c, rb_err *err);
/* 1 when the ring is past half full (the periodic thread then compacts). */
int rb_core_ml_compact_due(rb_core *c);
/* Compact: a new base beside the current one, then the superblock switch. 1 done, 0 not
 * needed (force 0) or not possible yet, <0 failed. */
int rb_core_ml_compact(rb_core *c, int force, rb_err *err);
/* The periodic thread's compaction (force 0): the same, but it stops between two slices of
 * its base once the core is closing (0: close's final checkpoint compacts if it must). */
int rb_core_ml_compact_periodic(rb_core *c, rb_err *err);
/* Ask the periodic thread to write now: RB_KICK_WRITE (the journal passed
 * RB_ML_PENDING_MAX: a whole checkpoint), RB_KICK_FREES (deletes freed slots: the deletes'
 * lane, then a checkpoint only while freed slots still wait; rb_core_release_held), so a put
 * finds them reusable without writing one itself; RB_KICK_COMPACT (a group took the log past
 * half full, or found it full: the compaction, without waiting for the period, which groups
 * written by other threads would otherwise fill the log within); RB_KICK_WRITE_BEHIND (buffered
 * puts wrote RB_WRITE_BEHIND_BYTES: their write-back started, no checkpoint). Either format.
 * Any lock but thr_mu. */
enum { RB_KICK_WRITE = 1, RB_KICK_FREES = 2, RB_KICK_COMPACT = 4, RB_KICK_WRITE_BEHIND = 8 };
void rb_core_ml_kick(rb_core *c, int why);
/* Bytes of buffered puts (through the page cache: not O_DIRECT, not passthrough) after which
 * the periodic thread starts their write-back (rb_dev_write_behind), so that a checkpoint's
 * flush finds little left to write instead of everything put since the last one, and the
 * kernel's dirty limit does not stall the puts. */
#define RB_WRITE_BEHIND_BYTES (8u << 20)
/* A put call stored keys of bytes payload bytes (RB_KICK_WRITE_BEHIND at each
 * RB_WRITE_BEHIND_BYTES; nothing without the periodic thread). Any lock. */
void rb_core_note_buffered(rb_core *c, uint64_t bytes);
/* Write the deletes' lane alone (ckpt_mu taken here, or without it in another writer's flush
 * gap): 1 written, 0 nothing to write or not possible now, the metadata log full included
 * (rb_core_checkpoint then makes the slots reusable, compacting first), <0 failed (recorded as
 * a checkpoint's failure). */
int rb_core_ml_release_lane(rb_core *c, rb_err *err);
/* The index was replaced and the allocator rebuilt from the new state (rb_core_apply.c): the
 * slots the journal holds for FREE records are the new state's to give, so no page's drop
 * releases them again (the records stay, for the base to cover). mu held. */
void rb_core_ml_forget_frees_locked(rb_core *c);
/*
 * Checkpoints under sustained load. The periodic checkpoint waits for an idle moment
 * (meta_idle_quiet_ms), which a cache filling at full speed never has; in the log format a
 * checkpoint costs what changed, so it is also due, whatever the I/O, once the oldest change
 * the journal holds is meta_checkpoint_interval_sec old, or once the journal holds
 * RB_ML_PENDING_MAX bytes of records (the periodic thread is woken then). mu held.
 */
#define RB_ML_PENDING_MAX (16u << 20)
int rb_core_ml_overdue_locked(const rb_core *c, uint64_t now_ns);
/* How long the periodic thread may sleep, at most period_ns: until the oldest journaled change
 * is one period old (log format), else the period. Takes and drops mu. */
uint64_t rb_core_ml_wait_ns(rb_core *c, uint64_t period_ns);
/* The journal's memory (pages, their sealed groups, freed-slot lists) and the changes it holds
 * that no durable group has yet. mu held. */
size_t rb_core_ml_journal_bytes_locked(const rb_core *c);
uint64_t rb_core_ml_pending_records_locked(const rb_core *c);
/* Slots held for a durable FREE (room accounting). mu held. */
static inline uint64_t rb_core_ml_held_locked(const rb_core *c)
{
    return c->ml.n_held + c->ml.n_held_base;
}
/* Log format: the slots held for FREEs in pages a checkpoint under way has taken (its end
 * releases them). mu held. */
uint64_t rb_core_ml_held_taken_locked(const rb_core *c);
/* Log format: wait for the checkpoint writer under way, if any (ckpt_mu taken and let go, as a
 * group writer lets it go: a lane writer waiting for it looks again at once). */
void rb_core_ml_wait_writer(rb_core *c);
/* Freed slots waiting for a checkpoint, in either format (status' checkpoint_held_slots). mu
 * held. */
static inline uint64_t rb_core_held_locked(const rb_core *c)
{
    return c->n_held + rb_core_ml_held_locked(c);
}
/* A checkpoint written because a put of n keys needs slots only a checkpoint can release;
 * nothing is written when, under the checkpoint lock, that is no longer so. As
 * rb_core_checkpoint otherwise. */
int rb_core_checkpoint_room(rb_core *c, size_t n, rb_err *err);
int rb_core_start_thread(rb_core *c, rb_err *err);
void rb_core_stop_thread(rb_core *c);

#endif /* RB_CORE_INT_H */
