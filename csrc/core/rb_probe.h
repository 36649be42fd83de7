/*
 * rb_probe.h - is this device someone else's? A libblkid probe for file system, RAID/LVM
 * and partition-table signatures, run before a device is opened for writing, so that a
 * mistyped device path never overwrites a file system silently.
 */
#ifndef RB_PROBE_H
#define RB_PROBE_H

#include <stddef.h>

#include "rb_err.h"

/*
 * Probe path. Returns 1 and writes a description such as "ext4 file system" or "gpt
 * partition table" to what (NUL-terminated, truncated to what_len) when a signature is
 * found; 0 when none is; a negative errno with err set when the probe itself failed (the
 * path cannot be opened, or libblkid reports an error or ambiguous signatures).
 */
int rb_probe_foreign(const char *path, char *what, size_t what_len, rb_err *err);

#endif /* RB_PROBE_H */
