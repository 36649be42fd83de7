/*
 * rb_core_autoext.c - extent_bytes=auto: the extent size resolved at open from the drive.
 *
 * - An NVMe namespace with FDP enabled (passthrough, or an NVMe block device: the same admin
 *   ioctls): the reclaim unit nominal size of the FDP configuration in use (the FDP
 *   Configurations log page), so one extent's writes fill one reclaim unit of its handle. The
 *   log format takes it as it is (rounded down to block_align, which a reclaim unit always is a
 *   multiple of in practice); format v1, whose slots lie back to back as LMCache's do, rounds it
 *   down to whole slots (docs/compatibility.md, "extent_bytes: auto").
 * - A block device or NVMe namespace without FDP: RB_AUTO_CONVENTIONAL (1 GiB), the reclaim
 *   unit size the wear study assumes; a conventional drive's erase unit is not reported, and an
 *   extent at least as large as it is what lets whole-extent deallocation free flash blocks
 *   whole. Format v1: rounded down to whole slots as above.
 * - A regular file: off. A file system places the file's blocks where it likes, so an extent
 *   maps to no unit of the drive; a slot's punched hole already gives its blocks back.
 * Either size is turned off where it leaves fewer than RB_AUTO_MIN_EXTENTS whole extents in the
 * data area, or holds fewer than 2 slots: eviction a quarter of the cache at a time, or an
 * extent of one slot, is not what auto should choose. The value in effect, where it came from and
 * the reclaim unit read are in the status (extent_bytes, extent_bytes_source,
 * extent_reclaim_unit_bytes).
 */
#include "rb_core_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define RB_AUTO_CONVENTIONAL (1ull << 30)
#define RB_AUTO_MIN_EXTENTS 4u

/* size cut to what the format's layout takes: whole slots in format v1, block_align else. */
static uint64_t fit_layout(const rb_core *c, uint64_t size)
{
    uint64_t unit = c->cfg.meta_format == RB_META_V1 ? c->cfg.slot_bytes : c->cfg.block_align;
    return unit ? size / unit * unit : size;
}

/* Whole extents of eb bytes in the data area (the first on an eb boundary past data_base). */
static uint64_t whole_extents(const rb_core *c, uint64_t eb)
{
    uint64_t first = rb_round_up(c->data_base, eb);
    return first < c->capacity ? (c->capacity - first) / eb : 0;
}

/* eb for auto from the drive's answer fi (have: an NVMe namespace answered). Sets the source. */
static uint64_t pick(rb_core *c, int have, const rb_nvme_fdp *fi)
{
    if (have && fi->enabled && fi->have_config && fi->runs) {
        c->ext_ru = fi->runs;
        c->ext_source = "fdp_reclaim_unit";
        return fit_layout(c, fi->runs);
    }
    if (rb_dev_is_file(c->dev)) {
        c->ext_source = "off_regular_file";
        return 0;
    }
    c->ext_source = "conventional_default";
    return fit_layout(c, RB_AUTO_CONVENTIONAL);
}

/* size_classes with extent_bytes=auto, once resolved: extents must be on, and the smallest
 * class's slots per extent within the allocator's limit (rb_config.c checks a set value). */
static int check_classes(const rb_core *c, rb_err *err)
{
    const rb_core_cfg *f = &c->cfg;
    if (f->size_classes <= 1)
        return 0;
    if (f->extent_bytes == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "size_classes=%u needs extents, but extent_bytes=auto turned them off on %s (%s): set "
                          "extent_bytes to a size, or size_classes=1",
                          f->size_classes, c->path, c->ext_source ? c->ext_source : "auto");
    uint64_t small = rb_sc_slot_bytes(f->slot_bytes, f->header_bytes, f->block_align, f->size_classes - 1);
    if (f->extent_bytes / small > 0xFFFFFFull)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "extent_bytes=auto resolved to %llu on %s, which holds more than 16777215 slots of the "
                          "smallest class (size_classes=%u: %llu-byte slots)",
                          (unsigned long long)f->extent_bytes, c->path, f->size_classes, (unsigned long long)small);
    return 0;
}

int rb_core_extent_resolve(rb_core *c, rb_err *err)
{
    if (c->cfg.extent_bytes != RB_EXTENT_AUTO) {
        c->ext_source = "setting";
        return 0;
    }
    rb_nvme_fdp fi;
    rb_err e;
    rb_err_clear(&e);
    int have = rb_dev_fdp_info(c->dev, &fi, &e);
    if (have < 0)
        return rb_err_set(err, e.kind == RB_ERR_OS ? RB_ERR_OS : RB_ERR_RUNTIME, e.errnum ? e.errnum : EIO,
                          "extent_bytes=auto: reading the FDP configuration of %s failed (errno %d): %.150s", c->path,
                          e.errnum ? e.errnum : EIO, e.msg);
    uint64_t eb = pick(c, have, &fi);
    if (eb && eb / c->cfg.slot_bytes < 2) {
        c->ext_source = "off_unit_below_2_slots";
        eb = 0;
    } else if (eb && whole_extents(c, eb) < RB_AUTO_MIN_EXTENTS) {
        c->ext_source = "off_device_below_4_extents";
        eb = 0;
    }
    c->cfg.extent_bytes = eb;
    return check_classes(c, err);
}
