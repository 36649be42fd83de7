/*
 * rb_nvme.c - NVMe namespace discovery and FDP queries (see rb_nvme.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rb_nvme.h"

#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <libnvme.h>
#include <linux/nvme_ioctl.h>

#define FDP_FEATURE_ID 0x1d
#define ADMIN_GET_FEATURES 0x0a

/* A libnvme call's outcome: -1 with errno, or the NVMe status (0 = success). */
static int nvme_outcome(int rc, const char *what, rb_err *err)
{
    if (rc < 0)
        return rb_err_set(err, RB_ERR_OS, errno ? errno : EIO, "%s ioctl failed", what);
    if (rc > 0)
        return rb_err_set(err, RB_ERR_RUNTIME, EIO, "%s ioctl failed: NVMe status 0x%x", what, (unsigned)rc);
    return 0;
}

int rb_nvme_identify(int fd, rb_nvme_ns *ns, rb_err *err)
{
    memset(ns, 0, sizeof(*ns));
    int id = ioctl(fd, NVME_IOCTL_ID);
    if (id < 0)
        return rb_err_set(err, RB_ERR_OS, errno, "Failed to get namespace ID via ioctl");
    if (id == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "the device reports namespace ID 0: it is a controller, not an NVMe namespace");
    struct nvme_id_ns *idns = NULL;
    if (posix_memalign((void **)&idns, 4096, sizeof(*idns)) != 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    memset(idns, 0, sizeof(*idns));
    errno = 0;
    int rc = nvme_outcome(nvme_identify_ns(fd, (uint32_t)id, idns), "NVMe identify namespace", err);
    if (rc < 0)
        goto out;
    /* The format index: four low bits of FLBAS, extended by bits 5-6 when more than 16
     * formats exist (NLBAF is 0-based). */
    unsigned idx = idns->flbas & 0xF;
    if (idns->nlbaf >= 16)
        idx += ((idns->flbas >> 5) & 0x3) << 4;
    if (idx >= 64) {
        rc = rb_err_set(err, RB_ERR_VALUE, EINVAL, "Invalid LBA format index");
        goto out;
    }
    unsigned ds = idns->lbaf[idx].ds;
    if (ds == 0 || ds >= 31) {
        rc = rb_err_set(err, RB_ERR_VALUE, EINVAL, "Invalid LBA data size");
        goto out;
    }
    if (le16toh(idns->lbaf[idx].ms) != 0) {
        rc = rb_err_set(err, RB_ERR_VALUE, EINVAL, "Device is formatted with metadata, can't be supported.");
        goto out;
    }
    ns->nsid = (uint32_t)id;
    ns->lba_shift = ds;
    ns->lba_size = 1u << ds;
    ns->nsze = le64toh(idns->nsze);
    ns->endgid = le16toh(idns->endgid);
    if (ns->nsze > (UINT64_MAX >> ds)) {
        rc = rb_err_set(err, RB_ERR_VALUE, EINVAL, "namespace size overflows: %llu blocks of %u bytes",
                        (unsigned long long)ns->nsze, ns->lba_size);
        goto out;
    }
out:
    free(idns);
    return rc;
}

int rb_nvme_flush(int fd, uint32_t nsid, rb_err *err)
{
    struct nvme_passthru_cmd cmd;
    int rc;
    do {
        memset(&cmd, 0, sizeof(cmd));
        cmd.opcode = 0x00; /* Flush */
        cmd.nsid = nsid;
        rc = ioctl(fd, NVME_IOCTL_IO_CMD, &cmd);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return rb_err_set(err, RB_ERR_OS, errno, "NVMe flush ioctl failed");
    if (rc > 0)
        return rb_err_set(err, RB_ERR_RUNTIME, EIO, "NVMe flush ioctl failed: NVMe status 0x%x", (unsigned)rc);
    return 0;
}

int rb_nvme_dsm_caps(int fd, uint32_t nsid, rb_nvme_dsm *out, rb_err *err)
{
    memset(out, 0, sizeof(*out));
    out->max_ranges = RB_NVME_DSM_MAX_RANGES;
    out->max_range_lbas = UINT32_MAX;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, 4096) != 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    memset(buf, 0, 4096);
    errno = 0;
    int rc = nvme_outcome(nvme_identify_ctrl(fd, (struct nvme_id_ctrl *)buf), "NVMe identify controller", err);
    if (rc < 0)
        goto out;
    out->supported = (le16toh(((struct nvme_id_ctrl *)buf)->oncs) & NVME_CTRL_ONCS_DSM) != 0;
    /* The NVM command set's limits: a controller before NVMe 2.0 may not answer CNS 06h. */
    memset(buf, 0, 4096);
    errno = 0;
    if (nvme_identify_ctrl_csi(fd, NVME_CSI_NVM, buf) == 0) {
        const struct nvme_id_ctrl_nvm *nvm = buf;
        if (nvm->dmrl && nvm->dmrl < out->max_ranges)
            out->max_ranges = nvm->dmrl;
        if (le32toh(nvm->dmrsl))
            out->max_range_lbas = le32toh(nvm->dmrsl);
    }
    memset(buf, 0, 4096);
    errno = 0;
    rc = nvme_outcome(nvme_identify_ns(fd, nsid, (struct nvme_id_ns *)buf), "NVMe identify namespace", err);
    if (rc == 0)
        out->dlfeat_read = ((struct nvme_id_ns *)buf)->dlfeat & NVME_NS_DLFEAT_RB;
out:
    free(buf);
    return rc;
}

int rb_nvme_deallocate(int fd, uint32_t nsid, const uint64_t *slba, const uint32_t *nlb, size_t n, rb_err *err)
{
    if (n == 0 || n > RB_NVME_DSM_MAX_RANGES)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL, "NVMe dataset management: %zu ranges (1 to %u)", n,
                          RB_NVME_DSM_MAX_RANGES);
    struct nvme_dsm_range r[RB_NVME_DSM_MAX_RANGES];
    for (size_t i = 0; i < n; i++) {
        r[i].cattr = 0;
        r[i].nlb = htole32(nlb[i]);
        r[i].slba = htole64(slba[i]);
    }
    struct nvme_passthru_cmd cmd;
    int rc;
    do {
        memset(&cmd, 0, sizeof(cmd));
        cmd.opcode = 0x09; /* Dataset Management */
        cmd.nsid = nsid;
        cmd.addr = (uint64_t)(uintptr_t)r;
        cmd.data_len = (uint32_t)(n * sizeof(r[0]));
        cmd.cdw10 = (uint32_t)(n - 1); /* NR: ranges, 0-based */
        cmd.cdw11 = 1u << 2;           /* AD: deallocate */
        rc = ioctl(fd, NVME_IOCTL_IO_CMD, &cmd);
    } while (rc < 0 && errno == EINTR);
    /* Invalid Command Opcode / Invalid Field in Command (generic status): the controller does
     * not take the command as sent, which the caller treats as "not supported". */
    int sc = rc > 0 ? rc & 0x7ff : -1;
    if (sc == 0x1 || sc == 0x2)
        return rb_err_set(err, RB_ERR_OS, EOPNOTSUPP,
                          "NVMe dataset management (deallocate) ioctl failed: NVMe status 0x%x", (unsigned)rc);
    return nvme_outcome(rc, "NVMe dataset management (deallocate)", err);
}

int rb_nvme_ruh_status(int fd, uint32_t nsid, rb_nvme_ruh **out, size_t *n, rb_err *err)
{
    static const char what[] = "NVMe FDP reclaim unit handle status";
    *out = NULL;
    *n = 0;
    /* First the 16-byte header for the descriptor count, then header + descriptors. */
    struct nvme_fdp_ruh_status head;
    memset(&head, 0, sizeof(head));
    errno = 0;
    int rc = nvme_outcome(nvme_fdp_reclaim_unit_handle_status(fd, nsid, sizeof(head), &head), what, err);
    if (rc < 0)
        return rc;
    size_t nd = le16toh(head.nruhsd);
    size_t len = sizeof(head) + nd * sizeof(struct nvme_fdp_ruh_status_desc);
    if (len > UINT32_MAX)
        return rb_err_set(err, RB_ERR_RUNTIME, EOVERFLOW, "%s: %zu descriptors overflow the transfer size", what, nd);
    struct nvme_fdp_ruh_status *st = calloc(1, len);
    rb_nvme_ruh *v = calloc(nd ? nd : 1, sizeof(*v));
    if (!st || !v) {
        free(st);
        free(v);
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    }
    errno = 0;
    rc = nvme_outcome(nvme_fdp_reclaim_unit_handle_status(fd, nsid, (uint32_t)len, st), what, err);
    if (rc < 0) {
        free(st);
        free(v);
        return rc;
    }
    /* The count may have changed between the calls; trust the smaller. */
    size_t got = le16toh(st->nruhsd);
    if (got < nd)
        nd = got;
    for (size_t i = 0; i < nd; i++) {
        const struct nvme_fdp_ruh_status_desc *d = &st->ruhss[i];
        v[i].pid = le16toh(d->pid);
        v[i].ruhid = le16toh(d->ruhid);
        v[i].earutr = le32toh(d->earutr);
        v[i].ruamw = le64toh(d->ruamw);
    }
    free(st);
    *out = v;
    *n = nd;
    return 0;
}

static uint64_t le_u128_low(const uint8_t b[16])
{
    uint64_t lo;
    memcpy(&lo, b, sizeof(lo));
    return le64toh(lo);
}

/* Find the configuration in use (out->config_index) in the FDP Configurations log of size
 * bytes at log, and fill out's have_config and its fields from it. */
static void fdp_pick_config(const uint8_t *log, uint32_t size, rb_nvme_fdp *out)
{
    uint32_t nconf = (uint32_t)le16toh(((const struct nvme_fdp_config_log *)log)->n) + 1; /* 0-based */
    size_t pos = sizeof(struct nvme_fdp_config_log);
    for (uint32_t i = 0; i < nconf && pos + sizeof(struct nvme_fdp_config_desc) <= size; i++) {
        const struct nvme_fdp_config_desc *d = (const void *)(log + pos);
        uint16_t dsz = le16toh(d->size);
        if (i == out->config_index) {
            out->have_config = 1;
            out->fdpa = d->fdpa;
            out->nrg = le32toh(d->nrg);
            out->nruh = le16toh(d->nruh);
            out->maxpids = le16toh(d->maxpids);
            out->nnss = le32toh(d->nnss);
            out->runs = le64toh(d->runs);
            break;
        }
        if (dsz < sizeof(*d))
            break;
        pos += dsz;
    }
}

/* FDP Configurations log (0x20): the header says the total size; read it whole, then take
 * the descriptor in use. 0 (have_config says whether it was found), or <0 with err set. */
static int fdp_read_config(int fd, const rb_nvme_ns *ns, rb_nvme_fdp *out, rb_err *err)
{
    struct nvme_fdp_config_log hdr;
    memset(&hdr, 0, sizeof(hdr));
    errno = 0;
    int rc = nvme_get_log_fdp_configurations(fd, ns->endgid, 0, sizeof(hdr), &hdr);
    if (rc < 0)
        return rb_err_set(err, RB_ERR_OS, errno ? errno : EIO, "NVMe FDP configurations log ioctl failed");
    uint32_t size = le32toh(hdr.size);
    if (rc != 0 || size < sizeof(hdr) || size > (1u << 20))
        return 0;
    uint8_t *log = calloc(1, size);
    if (!log)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    errno = 0;
    if (nvme_get_log_fdp_configurations(fd, ns->endgid, 0, size, log) == 0)
        fdp_pick_config(log, size, out);
    free(log);
    return 0;
}

/* FDP Statistics log (0x22): have_stats and the byte counts when it reads. */
static void fdp_read_stats(int fd, const rb_nvme_ns *ns, rb_nvme_fdp *out)
{
    struct nvme_fdp_stats_log stats;
    memset(&stats, 0, sizeof(stats));
    errno = 0;
    if (nvme_get_log_fdp_stats(fd, ns->endgid, 0, sizeof(stats), &stats) == 0) {
        out->have_stats = 1;
        out->hbmw = le_u128_low(stats.hbmw);
        out->mbmw = le_u128_low(stats.mbmw);
        out->mbe = le_u128_low(stats.mbe);
    }
}

int rb_nvme_fdp_info(int fd, const rb_nvme_ns *ns, rb_nvme_fdp *out, rb_err *err)
{
    memset(out, 0, sizeof(*out));
    /* Get Features, FDP (0x1d) for the endurance group: dw0 bit 0 = enabled, bits 15:8 = the
     * configuration index in use. A controller without FDP answers with Invalid Field. */
    struct nvme_passthru_cmd cmd;
    memset(&cmd, 0, sizeof(cmd));
    cmd.opcode = ADMIN_GET_FEATURES;
    cmd.cdw10 = FDP_FEATURE_ID;
    cmd.cdw11 = ns->endgid;
    int rc = ioctl(fd, NVME_IOCTL_ADMIN_CMD, &cmd);
    if (rc < 0)
        return rb_err_set(err, RB_ERR_OS, errno, "NVMe get features (FDP) ioctl failed");
    if (rc > 0)
        return 0; /* no FDP on this controller: nothing more to ask */
    out->have_feature = 1;
    out->enabled = cmd.result & 1;
    out->config_index = (cmd.result >> 8) & 0xff;
    if (!out->enabled)
        return 0;

    rc = fdp_read_config(fd, ns, out, err);
    if (rc < 0)
        return rc;
    fdp_read_stats(fd, ns, out);
    return 0;
}

#define ADMIN_GET_LOG_PAGE 0x02
#define LOG_SMART 0x02
#define LOG_FDP_EVENTS 0x23
#define FDP_EVENTS_LOG_BYTES 4096 /* 64-byte header + 63 descriptors of 64 bytes */

/* Get Log Page through the raw admin passthrough (the same on every libnvme): lsp in CDW10
 * bits 11:8, the log-specific identifier (an endurance group for the FDP logs) in CDW11
 * bits 31:16. len must be a multiple of 4. The ioctl's return: -1 with errno or the status. */
static int get_log_raw(int fd, uint8_t lid, uint8_t lsp, uint16_t lsi, uint32_t nsid, void *buf, uint32_t len)
{
    struct nvme_passthru_cmd cmd;
    uint32_t numd = len / 4 - 1; /* 0-based dword count */
    memset(&cmd, 0, sizeof(cmd));
    cmd.opcode = ADMIN_GET_LOG_PAGE;
    cmd.nsid = nsid;
    cmd.addr = (uint64_t)(uintptr_t)buf;
    cmd.data_len = len;
    cmd.cdw10 = (uint32_t)lid | ((uint32_t)(lsp & 0xf) << 8) | ((numd & 0xffffu) << 16);
    cmd.cdw11 = (numd >> 16) | ((uint32_t)lsi << 16);
    int rc;
    do {
        rc = ioctl(fd, NVME_IOCTL_ADMIN_CMD, &cmd);
    } while (rc < 0 && errno == EINTR);
    return rc;
}

static uint64_t le_u64_at(const uint8_t *b)
{
    uint64_t v;
    memcpy(&v, b, sizeof(v));
    return le64toh(v);
}

/* One FDP events log (host or controller): the number of events, each one tallied by type. */
static int fdp_events(int fd, uint16_t endgid, int host, uint8_t *buf, uint32_t *n, uint32_t types[256])
{
    memset(buf, 0, FDP_EVENTS_LOG_BYTES);
    if (get_log_raw(fd, LOG_FDP_EVENTS, host ? 1 : 0, endgid, 0, buf, FDP_EVENTS_LOG_BYTES) != 0)
        return -1;
    uint32_t noe;
    memcpy(&noe, buf, sizeof(noe));
    noe = le32toh(noe);
    *n = noe;
    uint32_t held = noe < 63 ? noe : 63;
    for (uint32_t i = 0; i < held; i++)
        types[buf[64 + 64 * i]]++; /* byte 0 of a descriptor: the event type */
    return 0;
}

int rb_nvme_wear_counters(int fd, rb_nvme_wear *out, rb_err *err)
{
    memset(out, 0, sizeof(*out));
    int id = ioctl(fd, NVME_IOCTL_ID);
    if (id < 0) {
        if (errno == ENOTTY || errno == EINVAL)
            return rb_err_set(err, RB_ERR_VALUE, ENOTTY, "not an NVMe namespace (the NVMe ioctls are not supported)");
        return rb_err_set(err, RB_ERR_OS, errno, "Failed to get namespace ID via ioctl");
    }
    if (id == 0)
        return rb_err_set(err, RB_ERR_VALUE, EINVAL,
                          "the device reports namespace ID 0: it is a controller, not an NVMe namespace");
    out->nsid = (uint32_t)id;

    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, FDP_EVENTS_LOG_BYTES) != 0)
        return rb_err_set(err, RB_ERR_NOMEM, ENOMEM, "out of memory");
    /* Identify Namespace for the endurance group (any LBA format is fine here). */
    memset(buf, 0, FDP_EVENTS_LOG_BYTES);
    errno = 0;
    int rc = nvme_outcome(nvme_identify_ns(fd, out->nsid, (struct nvme_id_ns *)buf), "NVMe identify namespace", err);
    if (rc < 0)
        goto out;
    out->endgid = le16toh(((const struct nvme_id_ns *)buf)->endgid);

    /* SMART / Health log, 512 bytes: DUR at 32, DUW at 48, HRC at 64, HWC at 80 (16 bytes each). */
    memset(buf, 0, 512);
    errno = 0;
    rc = nvme_outcome(get_log_raw(fd, LOG_SMART, 0, 0, 0xffffffffu, buf, 512), "NVMe SMART log", err);
    if (rc < 0)
        goto out;
    out->data_units_read = le_u64_at(buf + 32);
    out->data_units_written = le_u64_at(buf + 48);
    out->host_read_commands = le_u64_at(buf + 64);
    out->host_write_commands = le_u64_at(buf + 80);

    /* FDP: statistics (via rb_nvme_fdp_info, which needs only the endurance group) and events. */
    rb_nvme_ns ns;
    memset(&ns, 0, sizeof(ns));
    ns.nsid = out->nsid;
    ns.endgid = out->endgid;
    rb_nvme_fdp fi;
    rc = rb_nvme_fdp_info(fd, &ns, &fi, err);
    if (rc < 0)
        goto out;
    out->fdp_enabled = fi.enabled;
    if (fi.enabled && fi.have_stats) {
        out->have_fdp_stats = 1;
        out->hbmw = fi.hbmw;
        out->mbmw = fi.mbmw;
        out->mbe = fi.mbe;
    }
    if (fi.enabled && fdp_events(fd, out->endgid, 1, buf, &out->events_host, out->event_types) == 0 &&
        fdp_events(fd, out->endgid, 0, buf, &out->events_controller, out->event_types) == 0)
        out->have_fdp_events = 1;
    if (!out->have_fdp_events) {
        out->events_host = out->events_controller = 0;
        memset(out->event_types, 0, sizeof(out->event_types));
    }
out:
    free(buf);
    return rc;
}

static int read_sysfs_u64(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -ENOENT;
    unsigned long long v = 0;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (!ok)
        return -EINVAL;
    *out = v;
    return 0;
}

int rb_nvme_sysfs_max_transfer(const char *path, uint64_t *out)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    unsigned ctrl, nsn;
    char tail;
    if (sscanf(base, "ng%un%u%c", &ctrl, &nsn, &tail) != 2 && sscanf(base, "nvme%un%u%c", &ctrl, &nsn, &tail) != 2)
        return -ENOENT;
    char p[128];
    uint64_t kb = 0, segs = 0;
    snprintf(p, sizeof(p), "/sys/block/nvme%un%u/queue/max_hw_sectors_kb", ctrl, nsn);
    if (read_sysfs_u64(p, &kb) < 0 || kb == 0)
        return -ENOENT;
    uint64_t bytes = kb * 1024;
    snprintf(p, sizeof(p), "/sys/block/nvme%un%u/queue/max_segments", ctrl, nsn);
    long page = sysconf(_SC_PAGESIZE);
    /* One segment per page of the (page-aligned) buffer bounds a transfer too. */
    if (read_sysfs_u64(p, &segs) == 0 && segs > 0 && page > 0 && segs * (uint64_t)page < bytes)
        bytes = segs * (uint64_t)page;
    *out = bytes;
    return 0;
}
