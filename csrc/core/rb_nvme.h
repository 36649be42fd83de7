/*
 * rb_nvme.h - NVMe namespace discovery and Flexible Data Placement (FDP) queries for the
 * passthrough engine (io_uring_cmd on a generic character device /dev/ngXnY).
 *
 * Everything here is a synchronous admin or I/O-management command issued with an ioctl on
 * the namespace's file descriptor (libnvme's helpers where they exist on every supported
 * libnvme, 1.3 and later). The data path lives in rb_uring.c; this file only answers "what is
 * this namespace" and "what does its FDP state look like".
 *
 * Errors follow LMCache's device: a failed syscall is OSError(errno, "<what> ioctl failed"),
 * a command the controller completed with a non-zero NVMe status is
 * RuntimeError("<what> ioctl failed: NVMe status 0x<hex>").
 */
#ifndef RB_NVME_H
#define RB_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "rb_err.h"

typedef struct rb_nvme_ns {
    uint32_t nsid;
    uint32_t lba_shift; /* log2 of the LBA data size */
    uint32_t lba_size;
    uint64_t nsze;   /* namespace size in LBAs */
    uint16_t endgid; /* endurance group of the namespace (FDP log pages are per group) */
} rb_nvme_ns;

/* Namespace id (NVME_IOCTL_ID) and Identify Namespace (CNS 0): the LBA format in use.
 * A format with metadata is refused (the data path moves data only). */
int rb_nvme_identify(int fd, rb_nvme_ns *ns, rb_err *err);

/* NVMe Flush of the namespace (the volatile write cache made durable). Retried on EINTR. */
int rb_nvme_flush(int fd, uint32_t nsid, rb_err *err);

/*
 * Dataset Management (deallocate) on a namespace: whether its controller takes the command
 * (Identify Controller ONCS bit 2), its limits (the NVM command set's Identify Controller,
 * CNS 06h: DMRL ranges per command, DMRSL logical blocks per range; 0 there means "not
 * reported", and then the command's own limits apply: 256 ranges, 2^32 - 1 blocks) and what a
 * read of a deallocated block returns (Identify Namespace DLFEAT bits 2:0: 0 not reported, 1
 * zeros, 2 all ones).
 */
typedef struct rb_nvme_dsm {
    int supported;
    uint32_t max_ranges;
    uint32_t max_range_lbas;
    uint8_t dlfeat_read;
} rb_nvme_dsm;

#define RB_NVME_DSM_MAX_RANGES 256u

int rb_nvme_dsm_caps(int fd, uint32_t nsid, rb_nvme_dsm *out, rb_err *err);

/* One Dataset Management command with the Deallocate attribute over n (1..256) ranges of
 * nlb[i] blocks from slba[i]. Retried on EINTR. Errors as the other commands here. */
int rb_nvme_deallocate(int fd, uint32_t nsid, const uint64_t *slba, const uint32_t *nlb, size_t n, rb_err *err);

/* One Reclaim Unit Handle Status descriptor (I/O Management Receive, MO 1). */
typedef struct rb_nvme_ruh {
    uint16_t pid;    /* placement identifier: the value a write carries in DSPEC */
    uint16_t ruhid;  /* reclaim unit handle it maps to */
    uint32_t earutr; /* estimated active reclaim unit time remaining, seconds */
    uint64_t ruamw;  /* reclaim unit available media writes, in logical blocks */
} rb_nvme_ruh;

/* Every RUH status descriptor of the namespace: *out is malloc'ed (free it), *n its length. */
int rb_nvme_ruh_status(int fd, uint32_t nsid, rb_nvme_ruh **out, size_t *n, rb_err *err);

/* The FDP picture of an endurance group: whether FDP is enabled, the configuration in use and
 * the FDP statistics log (byte counters, 128-bit on the wire; the low 64 bits are kept, which
 * covers 16 EiB). have_* say which parts the controller answered. */
typedef struct rb_nvme_fdp {
    int have_feature, enabled;
    uint32_t config_index;
    int have_config;
    uint8_t fdpa;
    uint32_t nrg;
    uint16_t nruh, maxpids;
    uint32_t nnss;
    uint64_t runs; /* reclaim unit nominal size, bytes */
    int have_stats;
    uint64_t hbmw, mbmw, mbe; /* host bytes with metadata written, media bytes written, erased */
} rb_nvme_fdp;

int rb_nvme_fdp_info(int fd, const rb_nvme_ns *ns, rb_nvme_fdp *out, rb_err *err);

/*
 * Wear counters of a namespace's controller and endurance group, for measuring a drive's write
 * amplification over a window (read before and after it):
 *  - SMART / Health log (0x02, controller-wide, NSID FFFFFFFFh): Data Units Read / Written in
 *    units of 1000 x 512 bytes, Host Read / Write Commands. All four are 128-bit on the wire;
 *    the low 64 bits are kept, as for the FDP statistics.
 *  - FDP statistics log (0x22) of the namespace's endurance group when FDP is enabled
 *    (hbmw, mbmw, mbe as in rb_nvme_fdp).
 *  - FDP events log (0x23), host events (LSP bit 0 set) and controller events: the number of
 *    events the drive holds (a log of the most recent events, at most 63 each, not a
 *    lifetime counter) and how many of each event type.
 * A path whose NVMe namespace-id ioctl is not supported (ENOTTY, or EINVAL from a driver that
 * answers unknown ioctls so, e.g. loop) fails with RB_ERR_VALUE and errnum ENOTTY.
 */
typedef struct rb_nvme_wear {
    uint32_t nsid;
    uint16_t endgid;
    uint64_t data_units_read, data_units_written;
    uint64_t host_read_commands, host_write_commands;
    int fdp_enabled;
    int have_fdp_stats;
    uint64_t hbmw, mbmw, mbe;
    int have_fdp_events;
    uint32_t events_host, events_controller;
    uint32_t event_types[256]; /* events of each type, both logs together (the first 63 of each) */
} rb_nvme_wear;

int rb_nvme_wear_counters(int fd, rb_nvme_wear *out, rb_err *err);

/*
 * Largest single passthrough transfer the kernel accepts for the namespace behind path
 * (ngXnY or nvmeXnY): max_hw_sectors_kb, capped by max_segments pages when that is known,
 * both from /sys/block/nvmeXnY/queue. 0 with *out set, or -ENOENT when sysfs does not say.
 */
int rb_nvme_sysfs_max_transfer(const char *path, uint64_t *out);

#endif /* RB_NVME_H */
