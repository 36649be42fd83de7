/*
 * rb_core_ident.c - BLAKE2b-64 (RFC 7693) and legacy chunk-hash parsing (see rb_core_ident.h).
 */
#include "rb_core_ident.h"

#include <errno.h>
#include <string.h>

static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t rotr64(uint64_t x, unsigned n)
{
    return (x >> n) | (x << (64 - n));
}

static inline uint64_t load64(const uint8_t *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
#endif
}

static void compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++)
        m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= t; /* low word of the byte counter; inputs here never exceed 2^64 bytes */
    if (last)
        v[14] = ~v[14];
#define G(a, b, c, d, x, y)                                                                        \
    do {                                                                                           \
        v[a] = v[a] + v[b] + (x);                                                                  \
        v[d] = rotr64(v[d] ^ v[a], 32);                                                            \
        v[c] = v[c] + v[d];                                                                        \
        v[b] = rotr64(v[b] ^ v[c], 24);                                                            \
        v[a] = v[a] + v[b] + (y);                                                                  \
        v[d] = rotr64(v[d] ^ v[a], 16);                                                            \
        v[c] = v[c] + v[d];                                                                        \
        v[b] = rotr64(v[b] ^ v[c], 63);                                                            \
    } while (0)
    /* Rounds written out with constant schedule indices, so the message words and v[] stay in
     * registers (the rolled loop cost ~0.4 us per key, 30% of a page-cache header check). */
#define ROUND(r)                                                                                   \
    do {                                                                                           \
        G(0, 4, 8, 12, m[sigma[r][0]], m[sigma[r][1]]);                                            \
        G(1, 5, 9, 13, m[sigma[r][2]], m[sigma[r][3]]);                                            \
        G(2, 6, 10, 14, m[sigma[r][4]], m[sigma[r][5]]);                                           \
        G(3, 7, 11, 15, m[sigma[r][6]], m[sigma[r][7]]);                                           \
        G(0, 5, 10, 15, m[sigma[r][8]], m[sigma[r][9]]);                                           \
        G(1, 6, 11, 12, m[sigma[r][10]], m[sigma[r][11]]);                                         \
        G(2, 7, 8, 13, m[sigma[r][12]], m[sigma[r][13]]);                                          \
        G(3, 4, 9, 14, m[sigma[r][14]], m[sigma[r][15]]);                                          \
    } while (0)
    ROUND(0);
    ROUND(1);
    ROUND(2);
    ROUND(3);
    ROUND(4);
    ROUND(5);
    ROUND(6);
    ROUND(7);
    ROUND(8);
    ROUND(9);
    ROUND(10);
    ROUND(11);
#undef ROUND
#undef G
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

void rb_blake2b(uint8_t *out, size_t outlen, const void *in, size_t inlen)
{
    uint64_t h[8];
    memcpy(h, blake2b_iv, sizeof h);
    h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    const uint8_t *p = in;
    uint64_t t = 0;
    uint8_t block[128];
    while (inlen > 128) {
        t += 128;
        compress(h, p, t, 0);
        p += 128;
        inlen -= 128;
    }
    memset(block, 0, sizeof block);
    if (inlen)
        memcpy(block, p, inlen);
    t += inlen;
    compress(h, block, t, 1);
    for (size_t i = 0; i < outlen; i++)
        out[i] = (uint8_t)(h[i / 8] >> (8 * (i % 8)));
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int rb_key_identity(int ns, const char *key, size_t len, uint64_t *out)
{
    if (ns == RB_NS_OBJECT) {
        uint8_t d[8];
        rb_blake2b(d, 8, key, len);
        *out = load64(d);
        return 0;
    }
    /* legacy: model@world@worker@<hash hex>@dtype[...]; the model has no '@' in LMCache. */
    const char *p = key, *end = key + len;
    for (int field = 0; field < 3; field++) {
        const char *at = memchr(p, '@', (size_t)(end - p));
        if (!at)
            return -EINVAL;
        p = at + 1;
    }
    const char *at = memchr(p, '@', (size_t)(end - p));
    if (!at)
        return -EINVAL; /* a legacy key has a dtype field after the hash */
    int neg = 0;
    if (p < at && (*p == '-' || *p == '+')) {
        neg = *p == '-';
        p++;
    }
    if (at - p >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
        p += 2;
    if (p == at)
        return -EINVAL;
    uint64_t v = 0;
    for (; p < at; p++) {
        int d = hexval(*p);
        if (d < 0)
            return -EINVAL;
        v = (v << 4) | (uint64_t)d; /* keeps the low 64 bits, i.e. the value & (2**64 - 1) */
    }
    *out = neg ? (uint64_t)(0 - v) : v;
    return 0;
}
