/*
 * fuzz_slot_header.c - libFuzzer target: slot-header decode (magic, identity, payload length,
 * our optional checksum record) on inputs of every length, and the encode/decode round trip
 * of whatever was decoded.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rb_ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1); /* exact size: ASan sees reads past the end */
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    uint64_t ident = 0, plen = 0, sum = 0;
    int has_sum = 0;
    if (rb_slot_header_decode(copy, size, &ident, &plen, &has_sum, &sum) == 0) {
        if (size < RB_SLOT_HEADER_LEN || memcmp(copy, RB_SLOT_MAGIC, 8) != 0)
            abort(); /* accepted something that is not a slot header */
        if (has_sum && size < RB_SUM_END)
            abort(); /* a checksum record read from beyond the header */
        size_t hl = size < RB_SUM_END ? RB_SUM_END : size;
        uint8_t *enc = calloc(1, hl);
        if (enc) {
            rb_slot_header_encode(enc, hl, ident, plen, has_sum, sum);
            uint64_t i2 = 0, p2 = 0, s2 = 0;
            int h2 = 0;
            if (rb_slot_header_decode(enc, hl, &i2, &p2, &h2, &s2) != 0 || i2 != ident || p2 != plen ||
                h2 != has_sum || (has_sum && s2 != sum))
                abort(); /* encode and decode disagree */
            free(enc);
        }
    }
    free(copy);
    return 0;
}
