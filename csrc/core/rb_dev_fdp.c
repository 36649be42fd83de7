/*
 * rb_dev_fdp.c - the FDP configuration of the device's NVMe namespace, read at open through the
 * device's own descriptor (see rb_device.h): the passthrough character device, or an NVMe block
 * device, whose driver takes the same admin ioctls.
 */
#include "rb_device_int.h"

#include <errno.h>
#include <string.h>

int rb_dev_fdp_info(rb_dev *dev, rb_nvme_fdp *out, rb_err *err)
{
    memset(out, 0, sizeof(*out));
    rb_nvme_ns ns;
    if (dev->uring_cmd) {
        ns = dev->ns;
    } else {
        if (!dev->is_blk)
            return 0; /* a regular file */
        rb_err e;
        rb_err_clear(&e);
        if (rb_nvme_identify(dev->fd, &ns, &e) < 0) {
            /* another kind of block device answers the NVMe ioctls with ENOTTY (EINVAL: loop) */
            if (e.kind == RB_ERR_OS && (e.errnum == ENOTTY || e.errnum == EINVAL))
                return 0;
            if (err)
                *err = e;
            return -(e.errnum ? e.errnum : EIO);
        }
    }
    int rc = rb_nvme_fdp_info(dev->fd, &ns, out, err);
    return rc < 0 ? rc : 1;
}

int rb_dev_is_file(const rb_dev *dev)
{
    return !dev->uring_cmd && !dev->is_blk;
}
