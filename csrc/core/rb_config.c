/* rb_config.c - the settings table and the checks rb_core_open runs before any I/O. */
#include "rb_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_ckpt.h"
#include "rb_device.h"

/* A row's .offset and .size: where its value lives in rb_core_cfg. */
#define CFG(member) .offset = offsetof(rb_core_cfg, member), .size = sizeof(((rb_core_cfg *)0)->member)
#define U32MAX 0xFFFFFFFFull
#define OFF_MAX 0x7FFFFFFFFFFFFFFFull /* off_t's limit: the largest byte offset a device has */

static const char *const engines[] = {"posix", "io_uring", NULL};
static const char *const namespaces[] = {"legacy", "object", NULL};
/* LMCache's MP adapter policies first, then the three strategies of lmcache_rawblock/fdp.py. */
static const char *const data_policies[] = {
    "none", "cache_salt_prefix", "cache_salt_rank", "tp_worker", "prompt", "phase", NULL};
static const char *const reuse_policies[] = {"none", "pid_affinity", NULL};
static const char *const phases[] = {"auto", "prefill", "decode", NULL};
static const char *const admissions[] = {"always", "second_hit", NULL};
static const char *const meta_formats[] = {"v1", "log", NULL};
static const char *const dealloc_modes[] = {"auto", "on", "off", NULL};
static const char *const schedulers[] = {"loads_first", "fifo", NULL}; /* enum rb_sched_mode */
static const char *const victim_orders[] = {"fill", "use", NULL};      /* enum rb_victim_order */

#define L (RB_SET_LMCACHE | RB_SET_CONFIG | RB_SET_PLUGIN)
#define LR (L | RB_SET_REQUIRED)
#define OURS (RB_SET_CONFIG | RB_SET_PLUGIN)
#define FDP_LMC (RB_SET_POLICY | RB_SET_PLUGIN | RB_SET_LMCACHE_MP)
#define FDP_OURS (RB_SET_POLICY | RB_SET_PLUGIN)
#define NO_MEMBER .offset = 0, .size = 0

/* In the order of LMCache's RawBlockCoreConfig: its required fields, its optional ones, ours. */
const rb_setting rb_core_settings[] = {
    {.name = "device_path",
     .type = RB_SET_PATH,
     CFG(device_path),
     .deflt = NULL,
     .flags = LR,
     .help = "block device, NVMe namespace or pre-sized regular file holding the cache"},
    {.name = "capacity_bytes",
     .type = RB_SET_UINT,
     CFG(capacity_bytes),
     .min = 0,
     .max = OFF_MAX,
     .deflt = "0",
     .flags = LR | RB_SET_NONPOSITIVE_IS_ZERO,
     .help = "bytes of the device to use from offset 0; 0 = all of it (a larger value is cut to the device size)"},
    {.name = "block_align",
     .type = RB_SET_UINT,
     CFG(block_align),
     .min = 1,
     .max = 1ull << 30,
     .deflt = "4096",
     .flags = LR | RB_SET_POWER_OF_TWO,
     .help = "alignment of every offset and length (O_DIRECT needs the device's logical block size or more)"},
    {.name = "header_bytes",
     .type = RB_SET_UINT,
     CFG(header_bytes),
     .min = 24,
     .max = 1ull << 30,
     .deflt = "4096",
     .flags = LR,
     .help = "bytes at the start of each slot for its header; a multiple of block_align"},
    {.name = "slot_bytes",
     .type = RB_SET_UINT,
     CFG(slot_bytes),
     .min = 25,
     .max = 1ull << 40,
     .deflt = NULL,
     .flags = LR,
     .help = "bytes per slot, header included; a multiple of block_align (the plugin derives it from the chunk size)"},
    {.name = "use_odirect",
     .type = RB_SET_BOOL,
     CFG(use_odirect),
     .min = 0,
     .max = 1,
     .deflt = "false",
     .flags = LR,
     .help = "open the device with O_DIRECT (ignored with use_uring_cmd)"},
    {.name = "enable_zero_copy",
     .type = RB_SET_BOOL,
     CFG(enable_zero_copy),
     .min = 0,
     .max = 1,
     .deflt = "true",
     .flags = LR,
     .help = "under O_DIRECT, do I/O straight from aligned caller buffers instead of a bounce buffer"},
    {.name = "meta_total_bytes",
     .type = RB_SET_UINT,
     CFG(meta_total_bytes),
     .min = 2,
     .max = OFF_MAX,
     .deflt = "134217728",
     .flags = LR,
     .help = "bytes at the start of the device for the two checkpoint copies"},
    {.name = "meta_magic",
     .type = RB_SET_MAGIC,
     CFG(meta_magic),
     .deflt = "LMCIDX01",
     .flags = LR,
     .help = "8 ASCII bytes that mark this cache's checkpoints"},
    {.name = "meta_version",
     .type = RB_SET_UINT,
     CFG(meta_version),
     .min = 1,
     .max = U32MAX,
     .deflt = "1",
     .flags = LR,
     .help = "layout version written in and required of checkpoints"},
    {.name = "meta_checkpoint_interval_sec",
     .type = RB_SET_UINT,
     CFG(meta_checkpoint_interval_sec),
     .min = 1,
     .max = U32MAX,
     .deflt = "60",
     .flags = LR | RB_SET_CLAMP_TO_MIN,
     .help = "seconds between periodic checkpoints"},
    {.name = "meta_idle_quiet_ms",
     .type = RB_SET_UINT,
     CFG(meta_idle_quiet_ms),
     .min = 0,
     .max = U32MAX,
     .deflt = "100",
     .flags = LR | RB_SET_NONPOSITIVE_IS_ZERO,
     .help =
         "a periodic checkpoint waits until no I/O has run for this long (format v1; the log format writes anyway once "
         "its oldest change is one period old or 16 MiB of changes wait)"},
    {.name = "meta_enable_periodic",
     .type = RB_SET_BOOL,
     CFG(meta_enable_periodic),
     .min = 0,
     .max = 1,
     .deflt = "true",
     .flags = LR,
     .help = "run the background checkpoint thread"},
    {.name = "meta_verify_on_load",
     .type = RB_SET_BOOL,
     CFG(meta_verify_on_load),
     .min = 0,
     .max = 1,
     .deflt = "true",
     .flags = LR,
     .help = "at start-up, read each recovered slot's header and drop entries that do not match"},
    {.name = "max_data_transfer_size",
     .type = RB_SET_UINT,
     CFG(max_data_transfer_size),
     .min = 0,
     .max = U32MAX,
     .deflt = "0",
     .flags = L | RB_SET_NONPOSITIVE_IS_ZERO,
     .help = "NVMe passthrough: largest transfer per command; 0 = from the device's sysfs queue limits"},
    {.name = "load_checkpoint_on_init",
     .type = RB_SET_BOOL,
     CFG(load_checkpoint_on_init),
     .min = 0,
     .max = 1,
     .deflt = "true",
     .flags = L,
     .help = "recover the index from the device's checkpoint at start-up (false: start empty)"},
    {.name = "io_engine",
     .type = RB_SET_CHOICE,
     CFG(io_engine),
     .min = 0,
     .max = 1,
     .deflt = "posix",
     .choices = engines,
     .flags = L,
     .help = "posix (pread/pwrite) or io_uring (one worker thread, batched)"},
    {.name = "iouring_queue_depth",
     .type = RB_SET_UINT,
     CFG(iouring_queue_depth),
     .min = 1,
     .max = 32768,
     .deflt = "256",
     .flags = L,
     .help = "io_uring submission queue entries"},
    {.name = "use_uring_cmd",
     .type = RB_SET_BOOL,
     CFG(use_uring_cmd),
     .min = 0,
     .max = 1,
     .deflt = "false",
     .flags = L,
     .help = "NVMe passthrough (io_uring_cmd) on a namespace character device /dev/ngXnY"},
    {.name = "meta_checkpoint_placement_id",
     .type = RB_SET_UINT,
     CFG(meta_checkpoint_placement_id),
     .min = 0,
     .max = 65535,
     .deflt = NULL,
     .flags = L | RB_SET_NONE_IS_ZERO,
     .help = "FDP placement identifier for checkpoint writes (1..65535); unset = none"},
    {.name = "fdp_slot_affinity_enabled",
     .type = RB_SET_BOOL,
     CFG(fdp_slot_affinity_enabled),
     .min = 0,
     .max = 1,
     .deflt = "false",
     .flags = L,
     .help = "prefer free slots last written with the same FDP placement identifier"},
    {.name = "verify_payload_checksum",
     .type = RB_SET_BOOL,
     CFG(verify_payload_checksum),
     .min = 0,
     .max = 1,
     .deflt = "false",
     .flags = OURS,
     .help = "keep an xxh3-64 of each payload in its slot header and treat a load that fails it as a miss"},
    {.name = "allow_foreign_device",
     .type = RB_SET_BOOL,
     CFG(allow_foreign_device),
     .min = 0,
     .max = 1,
     .deflt = "false",
     .flags = OURS,
     .help = "use a device that holds a file system, RAID/LVM member or partition table (it is overwritten)"},
    {.name = "recovery_read_threads",
     .type = RB_SET_UINT,
     CFG(recovery_read_threads),
     .min = 1,
     .max = 64,
     .deflt = "8",
     .flags = OURS,
     .help = "posix engine with O_DIRECT: threads reading slot headers in parallel during recovery (cached headers are "
             "read on one thread)"},
    {.name = "meta_format",
     .type = RB_SET_CHOICE,
     CFG(meta_format),
     .min = 0,
     .max = 1,
     .deflt = "log",
     .choices = meta_formats,
     .flags = OURS,
     .help = "metadata written on the device: log (a base and a log of changes; a checkpoint costs what changed, "
             "no size cap) or v1 (LMCache 0.5.6's JSON checkpoint, which LMCache's own core reads)"},
    {.name = "deallocate_freed",
     .type = RB_SET_CHOICE,
     CFG(deallocate_freed),
     .min = 0,
     .max = 2,
     .deflt = "auto",
     .choices = dealloc_modes,
     .flags = OURS,
     .help = "give freed slots back to the device once they are reusable (NVMe deallocate, discard, punched hole), "
             "batched off the put path: auto = on for block devices and NVMe namespaces, off for regular files"},
    {.name = "io_scheduler",
     .type = RB_SET_CHOICE,
     CFG(io_scheduler),
     .min = 0,
     .max = 1,
     .deflt = "loads_first",
     .choices = schedulers,
     .flags = OURS,
     .help = "io_uring engine: loads_first (loads sent before stores, writes cut into pieces, bytes in flight "
             "bounded per device: a load waits behind at most write_max_bytes_in_flight of writes; every command "
             "of a passthrough request in flight together) or fifo (one queue, one attempt per request at a time)"},
    {.name = "read_max_bytes_in_flight",
     .type = RB_SET_UINT,
     CFG(read_max_bytes_in_flight),
     .min = 0,
     .max = 1ull << 40,
     .deflt = "0",
     .flags = OURS | RB_SET_NONPOSITIVE_IS_ZERO,
     .help = "loads_first: bytes of loads in flight per device (LMCache's fs_native name); 0 = 96 MiB"},
    {.name = "write_max_bytes_in_flight",
     .type = RB_SET_UINT,
     CFG(write_max_bytes_in_flight),
     .min = 0,
     .max = 1ull << 40,
     .deflt = "0",
     .flags = OURS | RB_SET_NONPOSITIVE_IS_ZERO,
     .help = "loads_first: bytes of stores in flight per device, the most write a load waits behind; 0 = 16 MiB"},
    {.name = "write_piece_bytes",
     .type = RB_SET_UINT,
     CFG(write_piece_bytes),
     .min = 0,
     .max = 1ull << 30,
     .deflt = "0",
     .flags = OURS | RB_SET_NONPOSITIVE_IS_ZERO,
     .help = "loads_first: stores are written in pieces of this many bytes (at most write_max_bytes_in_flight, "
             "rounded down to the device alignment); 0 = 1 MiB"},
    {.name = "extent_bytes",
     .type = RB_SET_UINT,
     CFG(extent_bytes),
     .min = 0,
     .max = 1ull << 40,
     .deflt = "0",
     .flags = OURS | RB_SET_NONPOSITIVE_IS_ZERO | RB_SET_AUTO,
     .help = "slots grouped into extents of this many bytes (the drive's reclaim unit), aligned on the device, "
             "filled in order by one writer stream and given back whole; at least 2 slots, a multiple of "
             "block_align (meta_format='v1': of slot_bytes; else the tail past the last whole slot is unused); "
             "0 = off (each slot allocated on its own); auto = the FDP reclaim unit the drive reports (v1: rounded "
             "down to whole slots), 1 GiB on a drive without FDP, off on a regular file"},
    {.name = "extent_victim_order",
     .type = RB_SET_CHOICE,
     CFG(extent_victim_order),
     .min = 0,
     .max = 1,
     .deflt = "fill",
     .choices = victim_orders,
     .flags = OURS,
     .help = "with extent_bytes: which closed extent eviction takes: fill = the one filled longest ago (a load "
             "marks its key hot for reinsertion but does not keep the extent: the drive's reclaim units empty "
             "whole), use = the one whose keys were put or loaded least recently (more hits with few, coarse "
             "extents; units left partly live cost the drive copies)"},
    {.name = "size_classes",
     .type = RB_SET_UINT,
     CFG(size_classes),
     .min = 1,
     .max = RB_SIZE_CLASSES_MAX,
     .deflt = "1",
     .flags = OURS,
     .help = "with extent_bytes and meta_format='log': slot sizes for objects of different sizes; class c's "
             "slot holds (slot_bytes - header_bytes) / 2^c payload bytes (rounded up to block_align), an object "
             "goes to the smallest class it fits and each extent holds slots of one class; 1 = off (every slot "
             "slot_bytes)"},
    {.name = "key_namespace",
     .type = RB_SET_CHOICE,
     CFG(key_namespace),
     .min = 0,
     .max = 1,
     .deflt = "object",
     .choices = namespaces,
     .flags = 0,
     .help = "how keys are encoded: legacy (the plugin's CacheEngineKey strings) or object (ObjectKey)"},
    /* FDP placement policy (lmcache_rawblock/fdp.py): LMCache's MP adapter keys, then ours. */
    {.name = "fdp_enabled",
     .type = RB_SET_BOOL,
     NO_MEMBER,
     .min = 0,
     .max = 1,
     .deflt = "false",
     .flags = FDP_LMC,
     .help = "place KV writes on FDP reclaim unit handles (needs io_engine=io_uring and use_uring_cmd)"},
    {.name = "fdp_placement_ids",
     .type = RB_SET_ID_LIST,
     NO_MEMBER,
     .min = 1,
     .max = 65535,
     .deflt = NULL,
     .flags = FDP_LMC,
     .help = "FDP placement identifiers for KV data (distinct, 1..65535, each reported by the device); "
             "unset = every non-zero identifier the device reports except meta_checkpoint_placement_id"},
    {.name = "fdp_data_placement_policy",
     .type = RB_SET_CHOICE,
     NO_MEMBER,
     .min = 0,
     .max = 5,
     .deflt = NULL,
     .choices = data_policies,
     .flags = FDP_LMC,
     .help = "how a KV write picks its placement identifier: none, cache_salt_prefix, cache_salt_rank (LMCache's), "
             "tp_worker, prompt or phase; unset = cache_salt_prefix in the MP adapter, tp_worker in the plugin "
             "(none without fdp_enabled)"},
    {.name = "fdp_slot_reuse_policy",
     .type = RB_SET_CHOICE,
     NO_MEMBER,
     .min = 0,
     .max = 1,
     .deflt = NULL,
     .choices = reuse_policies,
     .flags = FDP_LMC,
     .help = "none or pid_affinity (reuse a free slot last written with the same placement identifier); "
             "unset = pid_affinity with fdp_enabled, none without"},
    {.name = "fdp_phase",
     .type = RB_SET_CHOICE,
     NO_MEMBER,
     .min = 0,
     .max = 2,
     .deflt = "auto",
     .choices = phases,
     .flags = FDP_OURS,
     .help = "phase strategy: what this instance writes; auto = LMCache's pd_role (sender: prefill, receiver: "
             "decode), else by batch (one chunk: decode, more: prefill)"},
    /* Write admission (lmcache_rawblock/admission.py): the plugin's, not LMCache's. */
    {.name = "admission",
     .type = RB_SET_CHOICE,
     NO_MEMBER,
     .min = 0,
     .max = 1,
     .deflt = "always",
     .choices = admissions,
     .flags = RB_SET_POLICY | RB_SET_PLUGIN,
     .help = "always (write every chunk) or second_hit (write a chunk only the second time it is stored; counts "
             "in a 256 KiB frequency sketch, halved as it fills)"},
};
const size_t rb_core_nsettings = sizeof(rb_core_settings) / sizeof(rb_core_settings[0]);

const rb_setting *rb_setting_find(const char *name)
{
    for (size_t i = 0; i < rb_core_nsettings; i++)
        if (strcmp(rb_core_settings[i].name, name) == 0)
            return &rb_core_settings[i];
    return NULL;
}

const rb_setting *rb_core_setting_find(const char *name)
{
    const rb_setting *s = rb_setting_find(name);
    return s && !(s->flags & RB_SET_POLICY) ? s : NULL;
}

static void *member(rb_core_cfg *cfg, const rb_setting *s)
{
    return (char *)cfg + s->offset;
}

uint64_t rb_setting_get_uint(const rb_core_cfg *cfg, const rb_setting *s)
{
    const char *p = (const char *)cfg + s->offset;
    if (s->size == sizeof(uint64_t)) {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    if (s->type == RB_SET_UINT) {
        uint32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int v;
    memcpy(&v, p, sizeof v);
    return (uint64_t)v;
}

static size_t nchoices(const rb_setting *s)
{
    size_t n = 0;
    while (s->choices[n])
        n++;
    return n;
}

int rb_setting_set_uint(rb_core_cfg *cfg, const rb_setting *s, uint64_t v, rb_err *err)
{
    if (s->flags & RB_SET_POLICY)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s is a placement-policy setting, not the core's", s->name);
    switch (s->type) {
    case RB_SET_BOOL:
        if (v > 1)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s must be true or false, got %llu", s->name,
                              (unsigned long long)v);
        *(int *)member(cfg, s) = (int)v;
        return 0;
    case RB_SET_CHOICE:
        if (v >= nchoices(s))
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: no choice number %llu", s->name, (unsigned long long)v);
        *(int *)member(cfg, s) = (int)v;
        return 0;
    case RB_SET_UINT:
        if ((v < s->min || v > s->max) && !((s->flags & RB_SET_AUTO) && v == UINT64_MAX))
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s must be in %llu..%llu, got %llu", s->name,
                              (unsigned long long)s->min, (unsigned long long)s->max, (unsigned long long)v);
        if (s->size == sizeof(uint64_t))
            *(uint64_t *)member(cfg, s) = v;
        else
            *(uint32_t *)member(cfg, s) = (uint32_t)v;
        return 0;
    default:
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s is not a number setting", s->name);
    }
}

/* A path setting: non-empty, no NUL bytes; cfg keeps the pointer to text. */
static int set_path(rb_core_cfg *cfg, const rb_setting *s, const char *text, size_t len, rb_err *err)
{
    if (len == 0 || memchr(text, 0, len))
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s must be a non-empty path without NUL bytes", s->name);
    *(const char **)member(cfg, s) = text;
    return 0;
}

/* meta_magic: exactly 8 ASCII bytes. */
static int set_magic(rb_core_cfg *cfg, const rb_setting *s, const char *text, size_t len, rb_err *err)
{
    if (len != 8)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "meta_magic must be exactly 8 bytes, got %zu", len);
    for (size_t i = 0; i < 8; i++)
        if ((unsigned char)text[i] > 0x7f)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "meta_magic must be ASCII bytes");
    memcpy(member(cfg, s), text, 8);
    return 0;
}

/* A choice setting set by name; an unknown name's error lists the choices. */
static int set_choice(rb_core_cfg *cfg, const rb_setting *s, const char *text, size_t len, rb_err *err)
{
    for (size_t i = 0; s->choices[i]; i++)
        if (strlen(s->choices[i]) == len && memcmp(s->choices[i], text, len) == 0)
            return rb_setting_set_uint(cfg, s, i, err);
    if (s->choices == engines)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "io_engine must be one of: io_uring, posix; got '%.*s'",
                          (int)(len > 64 ? 64 : len), text);
    if (s->choices == namespaces)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "key_namespace must be one of: legacy, object; got '%.*s'",
                          (int)(len > 64 ? 64 : len), text);
    char names[128] = "";
    size_t at = 0;
    for (size_t i = 0; s->choices[i] && at < sizeof names; i++)
        at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", s->choices[i]);
    return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s must be one of: %s; got '%.*s'", s->name, names,
                      (int)(len > 64 ? 64 : len), text);
}

/* text as "true" (1) or "false" (0) in *v: 0, or -1 when it is neither. */
static int parse_bool(const char *text, size_t len, uint64_t *v)
{
    if (len == 4 && memcmp(text, "true", 4) == 0)
        *v = 1;
    else if (len == 5 && memcmp(text, "false", 5) == 0)
        *v = 0;
    else
        return -1;
    return 0;
}

/* text as a decimal number that fits 64 bits (1 to 20 digits, nothing else) in *v: 0, or -1. */
static int parse_uint(const char *text, size_t len, uint64_t *v)
{
    uint64_t n = 0;
    if (len == 0 || len > 20)
        return -1;
    size_t i = 0;
    for (; i < len && text[i] >= '0' && text[i] <= '9'; i++) {
        uint64_t d = (uint64_t)(text[i] - '0');
        if (n > (UINT64_MAX - d) / 10)
            break;
        n = n * 10 + d;
    }
    if (i != len)
        return -1;
    *v = n;
    return 0;
}

int rb_setting_set_text(rb_core_cfg *cfg, const rb_setting *s, const char *text, size_t len, rb_err *err)
{
    if (s->flags & RB_SET_POLICY)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s is a placement-policy setting, not the core's", s->name);
    uint64_t v = 0;
    switch (s->type) {
    case RB_SET_PATH:
        return set_path(cfg, s, text, len, err);
    case RB_SET_MAGIC:
        return set_magic(cfg, s, text, len, err);
    case RB_SET_CHOICE:
        return set_choice(cfg, s, text, len, err);
    case RB_SET_BOOL:
        if (parse_bool(text, len, &v) == 0)
            return rb_setting_set_uint(cfg, s, v, err);
        break;
    case RB_SET_UINT:
        if ((s->flags & RB_SET_AUTO) && len == 4 && memcmp(text, "auto", 4) == 0)
            return rb_setting_set_uint(cfg, s, UINT64_MAX, err);
        if (parse_uint(text, len, &v) == 0)
            return rb_setting_set_uint(cfg, s, v, err);
        break;
    default:
        break;
    }
    return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s: cannot read %.*s", s->name, (int)(len > 64 ? 64 : len), text);
}

void rb_core_cfg_init(rb_core_cfg *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < rb_core_nsettings; i++) {
        const rb_setting *s = &rb_core_settings[i];
        if (s->deflt && !(s->flags & RB_SET_POLICY)) {
            rb_err err;
            (void)rb_setting_set_text(cfg, s, s->deflt, strlen(s->deflt), &err);
        }
    }
}

static int is_pow2(uint64_t x)
{
    return x && !(x & (x - 1));
}

/* Each value within its setting's range (rb_setting_set_uint checked it when it was set,
 * but a caller may fill rb_core_cfg by hand). */
static int check_ranges(const rb_core_cfg *cfg, rb_err *err)
{
    for (size_t i = 0; i < rb_core_nsettings; i++) {
        const rb_setting *s = &rb_core_settings[i];
        if (s->flags & RB_SET_POLICY)
            continue;
        if (s->type == RB_SET_PATH) {
            const char *p = *(const char *const *)((const char *)cfg + s->offset);
            if (!p || !*p)
                return rb_err_set(err, RB_ERR_VALUE, EINVAL, "device_path must be non-empty");
            continue;
        }
        if (s->type == RB_SET_MAGIC)
            continue;
        uint64_t v = rb_setting_get_uint(cfg, s);
        rb_core_cfg tmp;
        int rc = rb_setting_set_uint(&tmp, s, v, err);
        if (rc < 0)
            return rc;
        if ((s->flags & RB_SET_POWER_OF_TWO) && !is_pow2(v))
            return rb_err_set(err, RB_ERR_VALUE, EINVAL, "%s must be a power of two > 0, got %llu", s->name,
                              (unsigned long long)v);
    }
    return 0;
}

/* extent_bytes: 0, or at least two slots. Format v1 keeps LMCache's layout (slot i at
 * data_base + i * slot_bytes), so there an extent is whole slots; the log format records the
 * extent stride in its superblock, so there any multiple of block_align will do (the tail of
 * each extent past its last whole slot is never used). */
static int check_extent(const rb_core_cfg *cfg, rb_err *err)
{
    unsigned long long eb = cfg->extent_bytes, sb = cfg->slot_bytes, ba = cfg->block_align;
    if (eb == 0 || cfg->extent_bytes == RB_EXTENT_AUTO)
        return 0; /* auto: resolved and fitted at open (rb_core_autoext.c) */
    if (cfg->meta_format == RB_META_V1 && eb % sb)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes must be a multiple of slot_bytes with meta_format='v1', whose layout is "
                          "LMCache's (extent_bytes=%llu, slot_bytes=%llu); meta_format='log' takes any multiple "
                          "of block_align",
                          eb, sb);
    if (ba && eb % ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes must be a multiple of block_align (extent_bytes=%llu, block_align=%llu)", eb,
                          ba);
    if (eb / sb < 2)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes must hold at least 2 slots (extent_bytes=%llu, slot_bytes=%llu)", eb, sb);
    if (eb / sb > 0xFFFFFFull)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes must hold at most 16777215 slots (extent_bytes=%llu, slot_bytes=%llu)", eb, sb);
    return 0;
}

/* size_classes: 1, or with extents in the log format (format v1 keeps LMCache's fixed slots)
 * classes whose slots shrink one after the other, the smallest still holding a payload. */
static int check_size_classes(const rb_core_cfg *cfg, rb_err *err)
{
    unsigned n = cfg->size_classes ? cfg->size_classes : 1;
    unsigned long long eb = cfg->extent_bytes, sb = cfg->slot_bytes, hb = cfg->header_bytes, ba = cfg->block_align;
    if (n == 1)
        return 0;
    if (cfg->meta_format != RB_META_LOG)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "size_classes=%u needs meta_format='log': format v1 keeps LMCache's layout, one slot of "
                          "slot_bytes each (size_classes=1 there)",
                          n);
    if (eb == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "size_classes=%u needs extents (extent_bytes > 0): each extent holds slots of one class", n);
    if (sb <= hb)
        return 0; /* slot_bytes' own check names it */
    for (unsigned k = 1; k < n; k++) {
        unsigned long long a = rb_sc_slot_bytes(sb, hb, ba, k - 1), b = rb_sc_slot_bytes(sb, hb, ba, k);
        if (b >= a || b <= hb)
            return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                              "size_classes=%u is too many: class %u's slot (%llu bytes) is no smaller than class "
                              "%u's (%llu) with slot_bytes=%llu, header_bytes=%llu, block_align=%llu",
                              n, k, b, k - 1, a, sb, hb, ba);
    }
    unsigned long long small = rb_sc_slot_bytes(sb, hb, ba, n - 1);
    if (cfg->extent_bytes != RB_EXTENT_AUTO && eb / small > 0xFFFFFFull) /* auto: checked once resolved */
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes must hold at most 16777215 slots of the smallest class (extent_bytes=%llu, "
                          "size_classes=%u: %llu-byte slots)",
                          eb, n, small);
    return 0;
}

/* The data area's layout: extents, then size classes. */
static int check_layout(const rb_core_cfg *cfg, rb_err *err)
{
    int rc = check_extent(cfg, err);
    return rc < 0 ? rc : check_size_classes(cfg, err);
}

int rb_core_cfg_check(const rb_core_cfg *cfg, rb_err *err)
{
    int rc = check_ranges(cfg, err);
    if (rc == 0)
        rc = check_layout(cfg, err);
    if (rc < 0)
        return rc;
    unsigned long long ba = cfg->block_align, hb = cfg->header_bytes, sb = cfg->slot_bytes, mt = cfg->meta_total_bytes;
    if (hb % ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "header_bytes must be a multiple of block_align (header_bytes=%llu, block_align=%llu)", hb,
                          ba);
    if (sb < hb + 1)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "slot_bytes must be >= header_bytes + 1 (slot_bytes=%llu, header_bytes=%llu)", sb, hb);
    if (sb % ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "slot_bytes must be a multiple of block_align (slot_bytes=%llu, block_align=%llu)", sb, ba);
    if (mt <= ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "meta_total_bytes must be > block_align (meta_total_bytes=%llu, block_align=%llu)", mt, ba);
    if (mt % ba)
        return rb_err_set(
            err, RB_ERR_VALUE, EINVAL,
            "meta_total_bytes must be a multiple of block_align (meta_total_bytes=%llu, block_align=%llu)", mt, ba);
    if (rb_container_bytes(mt, ba) <= ba)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "meta_total_bytes must provide room for at least two metadata copies "
                          "(meta_total_bytes=%llu gives %llu bytes per copy; each needs more than "
                          "block_align=%llu)",
                          mt, (unsigned long long)rb_container_bytes(mt, ba), ba);
    if (cfg->use_uring_cmd && cfg->io_engine != RB_ENGINE_IOURING)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "use_uring_cmd requires io_engine='io_uring'");
    if (cfg->meta_checkpoint_placement_id && !cfg->use_uring_cmd)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "meta_checkpoint_placement_id requires io_engine='io_uring' and use_uring_cmd=true");
    if (cfg->verify_payload_checksum && hb < RB_SUM_END)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "verify_payload_checksum requires header_bytes >= %d (header_bytes=%llu)", RB_SUM_END, hb);
    return 0;
}
