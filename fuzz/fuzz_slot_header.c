/*
 * fuzz_slot_header.c - libFuzzer target: slot-header decode (magic, identity, payload length,
 * our optional checksum record and key hash) on inputs of every length, the encode/decode round
 * trip of whatever was decoded, and the vouching rule against the header's own fields.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rb_ckpt.h"

static void round_trip(const rb_slot_hdr *h, size_t size)
{
    size_t hl = size < RB_KEYHASH_END ? RB_KEYHASH_END : size;
    uint8_t *enc = calloc(1, hl);
    if (!enc)
        return;
    rb_slot_header_encode(enc, hl, h);
    rb_slot_hdr h2;
    memset(&h2, 0, sizeof h2);
    if (rb_slot_header_decode(enc, hl, &h2) != 0 || h2.identity != h->identity || h2.payload_len != h->payload_len ||
        h2.has_sum != h->has_sum || (h->has_sum && h2.sum != h->sum) || h2.key_hash != h->key_hash)
        abort(); /* encode and decode disagree */
    free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1); /* exact size: ASan sees reads past the end */
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    rb_slot_hdr h;
    memset(&h, 0, sizeof h);
    if (rb_slot_header_decode(copy, size, &h) == 0) {
        if (size < RB_SLOT_HEADER_LEN || memcmp(copy, RB_SLOT_MAGIC, 8) != 0)
            abort(); /* accepted something that is not a slot header */
        if (h.has_sum && size < RB_SUM_END)
            abort(); /* a checksum record read from beyond the header */
        if (h.key_hash && size < RB_KEYHASH_END)
            abort(); /* a key hash read from beyond the header */
        round_trip(&h, size);
        /* the header vouches for the record it describes, and not for another key's */
        rb_slot_want w = {
            .identity = h.identity, .key_hash = h.key_hash, .size = h.payload_len, .sum = h.sum, .has_sum = h.has_sum};
        if (!rb_slot_header_vouches(&h, &w))
            abort();
        w.key_hash = h.key_hash + 1;
        if (h.key_hash && rb_slot_header_vouches(&h, &w))
            abort();
    }
    free(copy);
    return 0;
}
