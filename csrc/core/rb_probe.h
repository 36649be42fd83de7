/*
 * rb_probe.h - is this device someone else's? A libblkid probe for file system, RAID/LVM
 * and partition-table signatures, run before a device is opened for writing, so that a
 * mistyped device path never overwrites a file system silently.
 */
#ifndef RB_PROBE_H
#define RB_PROBE_H

#include <stddef.h>

#include "rb_err.h"

/* Partition starts probed for file systems (besides offset 0): the first RB_PROBE_SPAN bytes,
 * where the metadata region and the first slots live; windows smaller than RB_PROBE_MIN_FS
 * are too small to hold a file system and are skipped. */
#define RB_PROBE_SPAN (256ull << 20)
#define RB_PROBE_MIN_FS (64u << 10)
#define RB_PROBE_WINDOW (16ull << 20) /* bytes probed at each start */

/*
 * Probe path. Only a regular file or a block/character device is probed (anything else is
 * a RB_ERR_VALUE, as in rb_dev_open; a FIFO would block). First the whole device (file
 * systems, RAID/LVM members, partition tables), then, unless offset 0 holds a valid
 * checkpoint container, every partition start in the first RB_PROBE_SPAN bytes for a file
 * system signature (a partition whose table was wiped), except where a slot header starts.
 * Returns 1 and writes a description such as "ext4 file system" or "gpt partition table" to what (NUL-terminated, truncated to what_len) when a signature is
 * found (a signature found away from offset 0 says "at byte offset N"); 0 when none is; a
 * negative errno with err set when the probe itself failed (the path cannot be opened, or
 * libblkid reports an error).
 */
int rb_probe_foreign(const char *path, char *what, size_t what_len, rb_err *err);

#endif /* RB_PROBE_H */
