/*
 * fuzz_ckpt.c - libFuzzer target: the checkpoint container header decode and both state v1
 * readers (the one-pass plain-form reader, rb_fstate_parse, and the json-c reader behind
 * rb_core_apply_state_json_ex) applied to a real core on a scratch file.
 *
 * Input: byte 0 picks the path, the rest is the document:
 *   0: rb_fstate_parse alone         1: apply with json-c only (generic)
 *   2: apply (plain-form reader, json-c fallback)
 *   3: container: 32-byte header decode, then the payload (bounded by payload_len) applied
 * The core's geometry is the one the input corpus was written with (4 KiB blocks and
 * headers, 64 KiB slots, 1 MiB metadata region), so documents get past the geometry checks.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rb_ckpt.h"
#include "rb_config.h"
#include "rb_core.h"
#include "rb_core_ident.h"
#include "rb_core_int.h"
#include "rb_device.h"

static rb_core *core;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    static char path[] = "/tmp/rb-fuzz-ckpt-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, 16 << 20) != 0) {
        perror("scratch file");
        abort();
    }
    close(fd);
    rb_core_cfg cfg;
    rb_core_cfg_init(&cfg); /* the settings table's defaults */
    cfg.device_path = path;
    cfg.slot_bytes = 65536;
    cfg.meta_total_bytes = 1 << 20;
    cfg.meta_enable_periodic = 0;
    cfg.key_namespace = RB_NS_OBJECT;
    cfg.recovery_read_threads = 1;
    rb_err err;
    if (rb_core_open(&cfg, &core, &err) < 0) {
        fprintf(stderr, "rb_core_open: %s\n", err.msg);
        abort();
    }
    unlink(path); /* the core keeps its descriptor */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] & 3;
    const char *doc = (const char *)data + 1;
    size_t len = size - 1;
    /* The readers get an exact-size heap copy so ASan sees any read past the end. */
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return 0;
    memcpy(copy, doc, len);
    rb_err err;
    rb_err_clear(&err);
    switch (mode) {
    case 0: {
        rb_fstate st;
        memset(&st, 0, sizeof(st));
        if (rb_fstate_parse(copy, len, &st) > 0) /* 1: read; 0: not the plain form; <0: error */
            rb_fstate_free(&st);
        break;
    }
    case 1:
    case 2:
        (void)rb_core_apply_state_json_ex(core, copy, len, mode == 1, &err);
        break;
    default: {
        if (len < RB_CKPT_HEADER_LEN)
            break;
        rb_ckpt_header h;
        rb_ckpt_header_decode((const uint8_t *)copy, &h);
        size_t avail = len - RB_CKPT_HEADER_LEN;
        if (h.payload_len == 0 || h.payload_len > avail)
            break;
        const char *payload = copy + RB_CKPT_HEADER_LEN;
        /* A container whose CRC does not match is never read further; the fuzzer would rarely
         * produce a matching one, so the CRC is checked but the payload applied either way. */
        (void)rb_crc32(payload, (size_t)h.payload_len);
        (void)rb_core_apply_state_json_ex(core, payload, (size_t)h.payload_len, 0, &err);
        break;
    }
    }
    free(copy);
    return 0;
}
