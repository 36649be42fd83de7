/* rb_probe.c - libblkid signature probe (see rb_probe.h). */
#include "rb_probe.h"

#include <blkid/blkid.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

int rb_probe_foreign(const char *path, char *what, size_t what_len, rb_err *err)
{
    if (what_len)
        what[0] = '\0';
    errno = 0;
    blkid_probe pr = blkid_new_probe_from_filename(path);
    if (!pr) {
        int e = errno ? errno : EIO;
        return rb_err_set(err, RB_ERR_OS, e, "cannot probe %s for existing signatures", path);
    }
    blkid_probe_enable_superblocks(pr, 1);
    blkid_probe_set_superblocks_flags(pr, BLKID_SUBLKS_TYPE | BLKID_SUBLKS_USAGE);
    blkid_probe_enable_partitions(pr, 1);
    blkid_probe_set_partitions_flags(pr, BLKID_PARTS_MAGIC);
    int rc = blkid_do_safeprobe(pr);
    int found = 0;
    if (rc == 0) {
        const char *type = NULL, *usage = NULL, *pttype = NULL;
        blkid_probe_lookup_value(pr, "TYPE", &type, NULL);
        blkid_probe_lookup_value(pr, "USAGE", &usage, NULL);
        blkid_probe_lookup_value(pr, "PTTYPE", &pttype, NULL);
        if (pttype)
            snprintf(what, what_len, "%s partition table", pttype);
        else if (type)
            snprintf(what, what_len, "%s %s", type,
                     usage && strcmp(usage, "filesystem") != 0 ? usage : "file system");
        else
            snprintf(what, what_len, "unidentified signature");
        found = 1;
    } else if (rc == -2) {
        snprintf(what, what_len, "ambiguous signatures (several file systems or tables)");
        found = 1;
    } else if (rc < 0) {
        blkid_free_probe(pr);
        return rb_err_set(err, RB_ERR_OS, EIO, "libblkid failed to probe %s", path);
    }
    blkid_free_probe(pr);
    return found;
}
