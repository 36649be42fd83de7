/*
 * rb_core.h - the raw-block core: LMCache's RawBlockCore in C (index, slots, pinning,
 * batched put/load/delete, checkpoint and recovery, format v1).
 *
 * Everything here is plain C data: keys are UTF-8 bytes, metadata is dtype/fmt names, a
 * shape and cached positions. Every function may block on device I/O and is meant to be
 * called without the GIL.
 *
 * Locks (lock order: ckpt_mu -> mu -> thr_mu; the device's gate_mu and fault_mu are leaves):
 *   ckpt_mu  one checkpoint writer at a time (held across the checkpoint's device writes);
 *   mu       the core mutex: index, in-flight table, slots, counters. Never held across
 *            device I/O; the checkpoint JSON is serialised under it (O(index), no I/O);
 *   thr_mu   the periodic thread's stop flag and wake-up condition;
 *   fault_mu the fault journal (taken with or without mu, nothing taken under it).
 */
#ifndef RB_CORE_H
#define RB_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "rb_err.h"
#include "rb_stats.h"

typedef struct rb_core rb_core;

typedef struct rb_core_cfg {
    /* Field names are the setting names (rb_config.c's table, RawBlockCoreConfig, the
     * rust_raw_block.* keys and _native.Core's keywords): one name from YAML to here. */
    const char *device_path;
    uint64_t capacity_bytes; /* 0 = whole device */
    uint64_t block_align, header_bytes, slot_bytes, meta_total_bytes;
    int use_odirect, enable_zero_copy;
    uint8_t meta_magic[8];
    uint32_t meta_version;
    uint32_t meta_checkpoint_interval_sec; /* >= 1 */
    uint32_t meta_idle_quiet_ms;
    int meta_enable_periodic, meta_verify_on_load, load_checkpoint_on_init;
    uint64_t max_data_transfer_size; /* 0 = derive (passthrough only) */
    int io_engine;                   /* enum rb_engine_kind */
    uint32_t iouring_queue_depth;
    int use_uring_cmd;
    uint32_t meta_checkpoint_placement_id; /* 0 = none */
    int fdp_slot_affinity_enabled;
    int verify_payload_checksum;
    int allow_foreign_device;       /* 0: refuse a device with a file system, RAID/LVM member or partition table */
    uint32_t recovery_read_threads; /* posix header readers, >= 1 */
    int key_namespace;              /* enum rb_key_namespace */
    int meta_format;                /* enum rb_meta_format: what checkpoints write */
    int deallocate_freed;           /* enum rb_dealloc_mode: give freed slots back to the device */
    int io_scheduler;               /* enum rb_sched_mode (rb_uring.h) */
    uint64_t read_max_bytes_in_flight, write_max_bytes_in_flight, write_piece_bytes; /* 0 = default */
    uint64_t extent_bytes;   /* 0 = off: slots allocated one by one (rb_slots.h); RB_EXTENT_AUTO */
    uint32_t size_classes;   /* 1 = off; else extents of that many slot sizes (rb_core_extent.c) */
    int extent_victim_order; /* enum rb_victim_order: which closed extent eviction takes */
} rb_core_cfg;

/* extent_bytes "auto": resolved at open from the drive (rb_core_autoext.c). */
#define RB_EXTENT_AUTO UINT64_MAX

/* Size classes (size_classes, rb_core_extent.c): class c's slot, header included, holds
 * (slot_bytes - header_bytes) >> c payload bytes rounded up to block_align (class 0: slot_bytes).
 * An object goes to the smallest class whose payload holds it (rb_sc_of): a function of its size
 * alone, so recovery derives an extent's class from its entries. */
#define RB_SIZE_CLASSES_MAX 8u
static inline uint64_t rb_sc_slot_bytes(uint64_t slot_bytes, uint64_t header_bytes, uint64_t block_align, uint32_t c)
{
    uint64_t pay = (slot_bytes - header_bytes) >> c, a = block_align ? block_align : 1;
    return header_bytes + (pay + a - 1) / a * a;
}
static inline uint32_t rb_sc_of(uint64_t size, uint64_t slot_bytes, uint64_t header_bytes, uint64_t block_align,
                                uint32_t n)
{
    uint32_t c = n ? n - 1 : 0;
    while (c > 0 && size > rb_sc_slot_bytes(slot_bytes, header_bytes, block_align, c) - header_bytes)
        c--;
    return c;
}

/* Which closed extent extent eviction takes (rb_ext_use, rb_ext_victim). */
enum rb_victim_order { RB_VICTIM_FILL = 0, RB_VICTIM_USE = 1 };

/* When freed slots are deallocated (rb_core_dealloc.c). */
enum rb_dealloc_mode {
    RB_DEALLOC_AUTO = 0, /* on for block devices and NVMe namespaces, off for regular files */
    RB_DEALLOC_ON = 1,
    RB_DEALLOC_OFF = 2,
};

/* The metadata format a core writes (docs/metadata-log.md). */
enum rb_meta_format {
    RB_META_V1 = 0,  /* LMCache 0.5.6's JSON checkpoint in two mirrored containers */
    RB_META_LOG = 1, /* superblocks, a compacted base and a log of changes */
};

/* Metadata of one entry as the binding passes it in and gets it back. */
typedef struct rb_meta_in {
    const char *dtype; /* NULL = null */
    size_t dtype_len;
    const char *fmt;
    size_t fmt_len;
    int64_t ndim; /* -1 = shape null */
    const int64_t *dims;
    int64_t npos; /* -1 = cached_positions null */
    const int64_t *pos;
} rb_meta_in;

typedef struct rb_put_item {
    const char *key;
    size_t key_len;
    uint64_t identity;
    const uint8_t *buf;
    size_t len;
    uint16_t pid; /* 0 = no placement directive */
    rb_meta_in meta;
} rb_put_item;

typedef struct rb_load_item {
    const char *key;
    size_t key_len;
    uint8_t *buf;
    size_t buf_len;
    /* out */
    int ok;
    int status;   /* 0 = loaded or not indexed; <0 = -errno of this key's failure (err says why) */
    rb_err err;   /* filled when status < 0 */
    int64_t npos; /* -1 = null; else pos is malloc'd (caller frees) */
    int64_t *pos;
} rb_load_item;

typedef struct rb_meta_out {
    int found;
    uint64_t offset, size;
    const char *dtype, *fmt; /* interned: valid until rb_core_free; NULL = null */
    int64_t ndim;            /* -1 = null */
    const int64_t *dims;     /* interned */
    int64_t npos;            /* -1 = null; pos malloc'd (caller frees) */
    int64_t *pos;
} rb_meta_out;

/* What recovery at open did with the checkpoint containers. */
enum rb_recovery_outcome {
    RB_REC_BLANK = 0,  /* no checkpoint of ours on the device */
    RB_REC_SKIPPED,    /* load_on_init off */
    RB_REC_LOADED,     /* the newest checkpoint was loaded */
    RB_REC_FALLBACK,   /* the newest was unreadable; the older one was loaded */
    RB_REC_REJECTED,   /* a readable checkpoint failed the layout checks; started empty */
    RB_REC_UNREADABLE, /* the device had a checkpoint but none could be read; started empty */
    RB_REC_DAMAGED,    /* loaded, but part of the metadata was damaged: what it alone listed is lost */
};

/* One I/O fault the core met (a failed device write, read or flush), kept until it is closed. */
#define RB_FAULTS_KEPT 8
#define RB_ERRNO_SLOTS 134 /* per-errno counts for errno 1..133; slot 0 counts any other */
typedef struct rb_fault {
    uint64_t seq;    /* 1 = the first fault since open */
    int64_t time_ns; /* wall clock (CLOCK_REALTIME) */
    uint64_t offset; /* device offset of the transfer; UINT64_MAX for a flush */
    int errnum;
    char op[16];    /* "write", "read", "flush" */
    char text[320]; /* the whole story: operation, offset, path, errno name and text */
} rb_fault;

typedef struct rb_core_status {
    uint64_t capacity_bytes, data_base, container_bytes, max_slots, next_slot, free_slots;
    uint64_t indexed, inflight_keys, locked_keys, inflight_io;
    uint64_t meta_seq, dirty_total, persisted;
    uint64_t affinity_hits, affinity_fallbacks;
    uint64_t ckpt_written, ckpt_failures, ckpt_too_large, checksum_failures;
    uint64_t recovery_dropped, recovery_entries_loaded;
    uint64_t unverified, deferred_verified, deferred_dropped;
    int recovery_loaded, closed;
    int recovery_outcome; /* enum rb_recovery_outcome */
    uint64_t recovery_seq, recovery_rejected_seq;
    uint64_t recovery_ns, recovery_read_ns; /* open's recovery, and of it the log format's region read */
    int64_t recovery_lost;                  /* -1 unknown */
    uint64_t held_slots, held_total, room_ckpts, checksum_dropped, flushes, skipped;
    uint64_t write_behinds; /* write-backs of buffered puts started ahead of a flush (rb_dev_write_behind) */
    /* Trust: slot headers refused at load, write-back failures and the entries they dropped,
     * device shrink, and the fault journal (newest last in faults[0..n_faults_kept)). */
    uint64_t load_rejected, writeback_failures, writeback_dropped, shrink_dropped, retired_slots;
    uint64_t undurable_writes; /* slots written since the last flush that succeeded */
    uint64_t usable_slots, device_size;
    /* The log-structured format (meta_format log; zeros otherwise). */
    int meta_format, log_state; /* enum rb_meta_format; 0 fresh, 1 v1 to move, 2 live */
    uint64_t log_ring_bytes, log_live_bytes, log_seq, log_groups_written, log_bytes_written;
    uint64_t log_lane_groups, log_lane_records; /* the deletes' lane: groups written ahead, their FREEs */
    uint64_t log_lane_in_flush; /* of those groups, the ones written during a whole checkpoint's payload flush */
    uint64_t log_last_group_bytes, log_last_group_records, log_pending_pages;
    uint64_t log_pending_records, log_journal_bytes; /* changes no durable group has; the journal's memory */
    uint64_t bases_written, base_last_bytes, base_last_entries, base_too_large, compactions;
    uint64_t base_last_ns, log_journal_lost, log_ring_full, log_recovered_groups, log_recovered_records;
    uint64_t base_area_bytes, log_generation;
    /* damage the recovery's log walk went on past: stretches, groups lost, their records (-1:
     * not all countable) */
    uint64_t log_recovered_gaps, log_recovered_groups_lost;
    int64_t log_recovered_records_lost;
    /* Deallocation of freed slots: the state ("on", "off", "unsupported"), what it issues, why
     * it is unsupported, and its counters (rb_core_dealloc.c). */
    const char *dealloc_state, *dealloc_kind, *dealloc_discard_path;
    char dealloc_why[200];
    uint64_t dealloc_slots, dealloc_ranges, dealloc_cmds, dealloc_bytes, dealloc_failures, dealloc_skipped;
    uint64_t dealloc_pending, dealloc_ns;
    /* Extents (extent_bytes; zeros when off): slots each, how many, clean / open / waiting for
     * their deallocation, opened, opened with no clean one left, chosen as eviction victims,
     * deallocated whole, made clean without their deallocation. */
    uint64_t extent_slots, extents_total, extents_clean, extents_open, extents_pending;
    uint64_t extents_opened, extent_fallbacks, extents_evicted, extent_deallocs, extent_dealloc_skipped;
    /* The strided layout (rb_slot_offset; zeros otherwise): extent 0's offset, the stride, the
     * bytes at the tail of each extent that no slot uses. */
    uint64_t extent_base, extent_stride, extent_tail_bytes;
    /* extent_bytes in effect (auto resolved), where it came from (rb_core_autoext.c) and the
     * drive's FDP reclaim unit nominal size (0: none reported or not asked). */
    uint64_t extent_bytes, extent_reclaim_unit;
    const char *extent_source;
    /* Size classes (size_classes > 1; else 1 and zeros): how many, extents of each class now
     * (open or closed; a wholly free extent has none), each class's slot bytes. */
    uint64_t size_classes, size_class_dropped;
    uint64_t class_extents[8], class_slot_bytes[8];
    uint64_t faults_total;
    uint64_t fault_by_errno[RB_ERRNO_SLOTS];
    rb_fault faults[RB_FAULTS_KEPT];
    uint32_t n_faults_kept;
    char ckpt_error[512];
    rb_stats_snapshot io;
} rb_core_status;

typedef struct rb_close_result {
    int repeat;        /* this was not the first close */
    int final_written; /* the final checkpoint was written */
    int ckpt_failed;   /* the final checkpoint raised */
    int dev_close_failed;
    rb_err ckpt_err, dev_err;
} rb_close_result;

int rb_core_open(const rb_core_cfg *cfg, rb_core **out, rb_err *err);
void rb_core_close(rb_core *c, rb_close_result *res);
void rb_core_free(rb_core *c);

/* results[i] = 1/0; stored[] receives item indices committed by this call, in commit order;
 * *n_stored their count. *fail (may be NULL) receives why the first key that got 0 failed
 * (kind RB_ERR_NONE when none did): a device error with its operation, offset, path and
 * errno, or the reason no slot could be had. Fails (-errno) only for whole-call errors. */
int rb_core_put_many(rb_core *c, const rb_put_item *items, size_t n, uint8_t *results, uint32_t *stored,
                     size_t *n_stored, rb_err *fail, rb_err *err);
/* Per key: ok = 1 when loaded; a miss is ok = 0, status = 0; a failed read, a short
 * destination or a checksum mismatch is ok = 0, status < 0 with err filled (the exception the
 * device would raise). Every load reads the key's slot header with its payload (in the same
 * system call or io_uring batch) and serves the payload only when the header vouches for it
 * (magic, the key's identity, the length, and the checksum record when there is one): any
 * other header is a miss, the destination is zeroed and the record dropped (load_rejected;
 * for a record recovered without header validation also recovery_dropped and
 * deferred_dropped). A read past the end of a device that shrank is a miss too (the record is
 * dropped, shrink_dropped). Returns the number of keys whose header was refused (>= 0); every
 * read of the call has ended and the in-flight I/O count is back when this returns.
 * -ESHUTDOWN with RuntimeError text after close. */
int rb_core_load_many(rb_core *c, rb_load_item *items, size_t n, rb_err *err);
void rb_core_exists_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int lock, uint8_t *results);
int rb_core_exists_inflight(rb_core *c, const char *key, size_t len);
void rb_core_get_metadata_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, rb_meta_out *out);
/* Returns the length of the prefix of hits (out[0..ret) filled). skip may be NULL. */
size_t rb_core_get_metadata_prefix(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int lock,
                                   const uint8_t *skip, rb_meta_out *out);
void rb_core_unlock_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n);
/* The one delete: results[i] 1 when keys[i] was indexed or being stored and is gone (an
 * entry a load pins stays unless force). Then, when the delete made slots reusable at once
 * (format v1: slots no container lists), it deallocates them (rb_core_dealloc_run), which
 * blocks on the device. */
void rb_core_delete_many(rb_core *c, const char *const *keys, const size_t *lens, size_t n, int force,
                         uint8_t *results);
/* Freed slots waiting for their deallocation (rb_core_dealloc.c): pending says whether any
 * do; run deallocates them, up to 4,096 ranges a call, and returns them to use (blocking: no
 * GIL; 0, or <0 when the device call failed, which is counted and journaled: the slots are back
 * in use either way).
 * Checkpoints, compactions, close and delete_many run it themselves. */
int rb_core_dealloc_pending(rb_core *c);
/*
 * Extent eviction (extent_bytes on): the keys of the victim extent, the closed extent filled
 * longest ago (its last put; loads do not keep it), without those a load or a pin holds; the
 * extent then counts as just filled, so a victim whose keys cannot all go is not chosen again
 * at once. *keys / *lens / *hot malloc'd (the caller frees each key and the three arrays);
 * (*hot)[i] is 1 when key i was loaded since it was put; *ext the extent (UINT32_MAX: none
 * has live keys). Returns the number of keys, -ENOMEM, or -EINVAL
 * when extents are off. O(extents + slots per extent), or O(entries) after the index was
 * compacted or replaced.
 */
int64_t rb_core_extent_victim(rb_core *c, char ***keys, size_t **lens, uint8_t **hot, uint32_t *ext);
/* For a choice made by the caller: peek hands the keys of up to want closed extents holding a
 * key, in victim order (the first is the one extent_victim would take), without counting them
 * as used, from one pass over the extents under the core's mutex: exts[i] and counts[i] (caller's
 * arrays of want) the i-th extent and its number of keys, whose keys follow those of the
 * extents before it in *keys / *lens / *hot (malloc'd as for extent_victim; NULL when none).
 * Returns the number of extents (fewer than want when there are fewer), -ENOMEM, or -EINVAL
 * when extents are off. O(extents + want x slots per extent). take hands the keys of extent e
 * and counts it as used and as a victim, as extent_victim does (0 keys and *ext UINT32_MAX when
 * e is not a closed extent holding a key). */
int64_t rb_core_extent_peek(rb_core *c, uint32_t want, uint32_t *exts, uint32_t *counts, char ***keys, size_t **lens,
                            uint8_t **hot);
int64_t rb_core_extent_take(rb_core *c, uint32_t e, char ***keys, size_t **lens, uint8_t **hot, uint32_t *ext);
/* Keys handed to a caller: keys[i], lens[i] bytes (NUL-terminated, malloc'd), for i < n. */
typedef struct {
    char **keys;
    size_t *lens;
    size_t n, cap;
} rb_keys;
void rb_keys_free(rb_keys *k);
/* What rb_core_extent_evict did. */
typedef struct {
    uint32_t extents; /* victims it took keys from (deleted or kept) */
    uint64_t deleted; /* keys deleted */
    rb_keys gone;     /* with RB_EVICT_KEYS: the keys deleted */
    rb_keys hot;      /* with RB_EVICT_KEEP_HOT: the hot keys kept, still indexed */
    uint64_t opened;  /* extents the puts opened from the call's start to its end */
    int reclaimed;    /* checkpoints the reclaim wrote; -1 when it did not run */
} rb_evict_pass;
enum { RB_EVICT_KEEP_HOT = 1, RB_EVICT_KEYS = 2, RB_EVICT_RECLAIM = 4 };
/*
 * The extent evictor's pass in one call (extent_bytes on): when fewer than reserve extents are
 * clean or waiting for their deallocation (and the core is open), as many victims as are
 * missing, at least batch (each pass's FREE records then fill a group worth its sync), each (as
 * rb_core_extent_victim, each extent taken once a call) has its keys deleted (as
 * rb_core_delete_many, force 0: what a load or a pin holds stays), under one hold of the core
 * mutex per victim. With RB_EVICT_KEEP_HOT its hot keys (loaded since their put; the first in
 * slot order, at most half the keys it looked at) are kept and handed to the caller to read,
 * delete and put again; with RB_EVICT_KEYS the deleted keys are handed over too. With
 * RB_EVICT_RECLAIM, when no hot key was kept, rb_core_reclaim follows. out is filled (free its
 * keys with rb_keys_free) whatever the result: 0, -ENOMEM, -EINVAL when extents are off, or the
 * reclaim's failure (<0, err filled).
 */
int rb_core_extent_evict(rb_core *c, uint32_t reserve, uint32_t batch, int flags, rb_evict_pass *out, rb_err *err);
int rb_core_dealloc_run(rb_core *c);
/* The journal of deallocated ranges (for tests and `waf replay`): set clears it and turns it on
 * or off; take hands over what it holds as (offset, length) pairs, out[2i] and out[2i + 1]
 * (malloc'ed, the caller frees; NULL when empty) and empties it. Returns the number of pairs. */
void rb_core_dealloc_log_set(rb_core *c, int on);
/* For tests: the device's discards take BLKDISCARD from now on (rb_dev_discard_force_ioctl). */
void rb_core_discard_force_ioctl(rb_core *c);
/* For tests and benchmarks: every FREE record goes in line behind the pending puts' records
 * from now on (no deletes' lane). */
void rb_core_free_lane_off(rb_core *c);
size_t rb_core_dealloc_log_take(rb_core *c, uint64_t **out);
/* -1 when absent. */
int64_t rb_core_entry_offset(rb_core *c, const char *key, size_t len);
uint32_t rb_core_lock_refcount(rb_core *c, const char *key, size_t len);
/* Copies of the indexed keys in insertion order (malloc'd array of malloc'd NUL-terminated
 * strings). Returns the count, or -ENOMEM. max = 1 gives the first key. */
int64_t rb_core_snapshot_keys(rb_core *c, size_t max, char ***keys, size_t **lens);

/* 1 = written, 0 = nothing to do (not dirty / not idle), <0 = error (err filled).
 * force: 0 only when dirty and idle (periodic), 1 when dirty. The device is flushed before the
 * container is written (every payload it lists is durable), between its payload and its
 * header, and after the header. */
int rb_core_checkpoint(rb_core *c, int force, rb_err *err);
/* Make the slots deletes freed reusable: in the log format, the deletes' lane first (a group
 * of FREE records synced by itself, no flush of pending payloads), then a checkpoint
 * (force 1) only while freed slots still wait (log format: none for slots in pages another
 * checkpoint is writing; that one is waited for); format v1: a checkpoint. The slots it
 * released are then deallocated. 1 written, 0 nothing to write, <0 error (err filled). */
int rb_core_release_held(rb_core *c, rb_err *err);
/* rb_core_release_held again while slots wait for a checkpoint and the last call wrote, at
 * most RB_RECLAIM_MAX times (a checkpoint writes only when the index changed, so slots still held
 * after it wait for a change); one reclaim at a time, a caller that waited for another sees what
 * it left. Returns the checkpoints written, or <0 (err filled). */
#define RB_RECLAIM_MAX 3
int rb_core_reclaim(rb_core *c, rb_err *err);
/* Log format: compact now (a new base beside the current one, then the superblock switch),
 * whether or not the log is past half full. 1 done, 0 nothing to compact (format v1, or no
 * base of ours on the device yet), <0 failed (err). */
int rb_core_compact(rb_core *c, rb_err *err);
/* Apply a state v1 JSON document: 1 applied, 0 rejected (reason in err->msg), <0 error. */
int rb_core_apply_state_json(rb_core *c, const char *json, size_t len, rb_err *err);
/* Same; generic = 1 skips the plain-form reader (rb_core_fastjson.c) and always uses json-c
 * (test hook: both readers must apply a document identically). */
int rb_core_apply_state_json_ex(rb_core *c, const char *json, size_t len, int generic, rb_err *err);
void rb_core_status_get(rb_core *c, rb_core_status *st);
/* Of the status, only the slot counters (usable_slots, next_slot, free_slots, indexed,
 * inflight_keys, locked_keys, held_slots, room_ckpts, closed) and the extent ones
 * (rb_core_extent_status_locked's); the rest zero. One hold of the core mutex, no fault journal, no
 * device statistics: what an evictor reads between puts. */
void rb_core_counts_get(rb_core *c, rb_core_status *st);
/* The counters a caller watches for trust events, without the whole status and without a lock
 * (it never waits for the core mutex): out[0] faults
 * entered in the journal, [1] slot headers refused at load, [2] entries dropped by failed
 * flushes, [3] entries dropped because the device shrank. */
void rb_core_trust_counts(rb_core *c, uint64_t out[4]);
/* Bytes the index, the in-flight table, the slot allocator, the durability state and (log
 * format) the change journal hold. */
size_t rb_core_mem_bytes(rb_core *c);

/* Register fixed buffers with the io_uring engine (IORING_REGISTER_BUFFERS); later transfers
 * whose memory lies inside one use the fixed-buffer opcodes. RuntimeError unless the core runs
 * on io_uring; the engine's validation errors otherwise (nothing registered on failure). */
int rb_core_register_buffers(rb_core *c, const uint64_t *ptrs, const uint64_t *sizes, size_t n, rb_err *err);

/* Benchmark/test hook: validate every indexed entry's slot header now, as recovery does
 * (sequential = one pread per header on this thread, else the configured reader: io_uring
 * batches or the parallel posix readers). *dropped = entries dropped. 0 or -ENOMEM. */
int rb_core_revalidate(rb_core *c, int sequential, uint64_t *dropped);

/* Test hooks: fail the countdown-th next data write/read (1 = the next one) with EIO (on
 * io_uring: that request reports a completion failure and is never queued); SUBMIT fails the
 * countdown-th io_uring batch submission of put/load; PREP fails the preparation of the
 * countdown-th key of an io_uring put; FLUSH fails the countdown-th device flush with EIO, as a
 * write-back error reported by fdatasync would. Delay each checkpoint writer between choosing its
 * sequence number and writing. */
enum { RB_FAULT_WRITE = 0, RB_FAULT_READ = 1, RB_FAULT_SUBMIT = 2, RB_FAULT_PREP = 3, RB_FAULT_FLUSH = 4 };
void rb_core_inject_fault(rb_core *c, int kind, int64_t countdown);
void rb_core_set_ckpt_delay_ms(rb_core *c, uint32_t ms);
/* Benchmark hook: nonzero makes checkpoints skip their device flushes (to measure their cost);
 * never for use on a cache that must survive power loss. */
void rb_core_set_ckpt_no_flush(rb_core *c, int on);
/* Benchmark hook: nonzero makes loads of verified records skip the slot-header check (to
 * measure its cost); never for use on a cache in service. */
void rb_core_set_load_check_off(rb_core *c, int off);
/* Test hook: loads pause ms milliseconds between their index snapshot and their reads. */
void rb_core_set_load_delay_ms(rb_core *c, uint32_t ms);

/* ---- Accessors for callers outside the core (the binding) --------------------------------
 * What a caller may read of a core without the core's internal header (rb_core_access.c). */
struct rb_dev;
/* The core's device, opened by rb_core_open and freed by rb_core_free (NULL for c NULL). Close
 * does not clear it: the device refuses new users (rb_dev_enter) once the core has closed it. */
struct rb_dev *rb_core_device(rb_core *c);
struct rb_obs;
/* The core's histograms and miss counters (rb_hist.h): live until rb_core_free. */
struct rb_obs *rb_core_obs(rb_core *c);

#endif /* RB_CORE_H */
