/*
 * rb_config.h - the core's settings, declared once.
 *
 * rb_core_settings[] lists every field of rb_core_cfg with its type, range, default and help,
 * in the order of LMCache's RawBlockCoreConfig. Everything that takes a setting reads this
 * table: the binding parses _native.Core's keywords with it, the Python package builds
 * RawBlockCoreConfig and parses the plugin's rust_raw_block.* keys from the copy that
 * _native.settings() returns, and rb_core_open checks the values with rb_core_cfg_check
 * before it touches the device. A setting has one name everywhere: YAML key suffix,
 * dataclass field, keyword argument and rb_core_cfg member.
 */
#ifndef RB_CONFIG_H
#define RB_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "rb_core.h"
#include "rb_err.h"

enum rb_setting_type {
    RB_SET_PATH,    /* const char *, non-empty */
    RB_SET_UINT,    /* uint64_t or uint32_t member (size says which), min..max */
    RB_SET_BOOL,    /* int member, 0 or 1 */
    RB_SET_CHOICE,  /* int member: index into choices */
    RB_SET_MAGIC,   /* uint8_t[8] member: exactly 8 ASCII bytes */
    RB_SET_ID_LIST, /* RB_SET_POLICY only: a list of distinct integers in min..max */
};

/* What a setting is to the layers above the core. */
#define RB_SET_LMCACHE 0x01u  /* a field of LMCache's RawBlockCoreConfig */
#define RB_SET_REQUIRED 0x02u /* RawBlockCoreConfig has no default for it (LMCache's order) */
#define RB_SET_CONFIG 0x04u   /* a RawBlockCoreConfig field (LMCache's or ours) */
#define RB_SET_PLUGIN 0x08u   /* read from extra_config as rust_raw_block.<name> */
/* LMCache's RawBlockCoreConfig accepts values <= 0 and treats them as 0 ("whole device",
 * "derive it", "no quiet time"); the core itself takes 0 only. */
#define RB_SET_NONPOSITIVE_IS_ZERO 0x10u
/* LMCache's RawBlockCoreConfig raises values below min to min (the facade warns). */
#define RB_SET_CLAMP_TO_MIN 0x20u
#define RB_SET_POWER_OF_TWO 0x40u
/* Python None is "unset" and reaches the core as 0 (meta_checkpoint_placement_id). */
#define RB_SET_NONE_IS_ZERO 0x80u
/* A policy setting of the plugin and the MP adapter (FDP routing; write admission, which only
 * the plugin has): declared here so it has one name, type and default everywhere, but not a
 * member of rb_core_cfg (offset and size are 0) and not a keyword of _native.Core; the core
 * only sees its effect, the per-key placement identifiers and fdp_slot_affinity_enabled. */
#define RB_SET_POLICY 0x100u
/* A key of LMCache's MP adapter JSON (LMCache's own adapter config parses it). */
#define RB_SET_LMCACHE_MP 0x200u
/* An RB_SET_UINT setting that also takes the word "auto" (stored as UINT64_MAX, resolved by the
 * core at open: extent_bytes, RB_EXTENT_AUTO). */
#define RB_SET_AUTO 0x400u

typedef struct rb_setting {
    const char *name;
    int type;                   /* enum rb_setting_type */
    size_t offset;              /* of the member in rb_core_cfg */
    size_t size;                /* of the member, bytes */
    uint64_t min, max;          /* RB_SET_UINT: the range the core accepts, inclusive */
    const char *deflt;          /* default as text (what rust_raw_block.<name> defaults to); NULL: none
                         * (RB_SET_POLICY: unset, the entry point decides) */
    const char *const *choices; /* RB_SET_CHOICE: NULL-terminated */
    unsigned flags;             /* RB_SET_LMCACHE, ... */
    const char *help;
} rb_setting;

extern const rb_setting rb_core_settings[];
extern const size_t rb_core_nsettings;

/* The entry called name, or NULL. */
const rb_setting *rb_setting_find(const char *name);
/* The core-configuration entry called name (a member of rb_core_cfg), or NULL: placement-policy
 * settings (RB_SET_POLICY) are not the core's. */
const rb_setting *rb_core_setting_find(const char *name);

/* Store v in s's member of cfg after checking s's range; a value error names the setting,
 * the value and the limit. RB_SET_BOOL takes 0/1, RB_SET_CHOICE an index. An RB_SET_POLICY
 * setting has no member: a value error. */
int rb_setting_set_uint(rb_core_cfg *cfg, const rb_setting *s, uint64_t v, rb_err *err);
/* Store a text value: a choice name for RB_SET_CHOICE, the 8 bytes for RB_SET_MAGIC, the path
 * (not copied: it must outlive cfg's use) for RB_SET_PATH, a decimal number or true/false
 * otherwise. */
int rb_setting_set_text(rb_core_cfg *cfg, const rb_setting *s, const char *text, size_t len, rb_err *err);
/* The member's current value (RB_SET_UINT, RB_SET_BOOL, RB_SET_CHOICE). */
uint64_t rb_setting_get_uint(const rb_core_cfg *cfg, const rb_setting *s);

/* Bytes of one checkpoint copy: half the metadata region, rounded down to block_align. */
static inline uint64_t rb_container_bytes(uint64_t meta_total_bytes, uint64_t block_align)
{
    return (meta_total_bytes / 2) / block_align * block_align;
}

/* cfg with every setting at its default (device_path NULL). */
void rb_core_cfg_init(rb_core_cfg *cfg);

/* Every range, then the geometry across settings (LMCache's rules: block_align a power of
 * two, header_bytes >= 24 and aligned, slot_bytes > header_bytes and aligned, two metadata
 * copies each larger than one block, a checksum that fits the header). A value error names
 * the setting, its value and the limit. */
int rb_core_cfg_check(const rb_core_cfg *cfg, rb_err *err);

#endif /* RB_CONFIG_H */
