/*
 * rb_core_ident.c - BLAKE2b-64 (RFC 7693), legacy chunk-hash parsing and the whole-key hash
 * (see rb_core_ident.h).
 */
#include "rb_core_ident.h"

#include <errno.h>
#include <string.h>
#include <xxhash.h>

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
#define G(a, b, c, d, x, y)                                                                                            \
    do {                                                                                                               \
        v[a] = v[a] + v[b] + (x);                                                                                      \
        v[d] = rotr64(v[d] ^ v[a], 32);                                                                                \
        v[c] = v[c] + v[d];                                                                                            \
        v[b] = rotr64(v[b] ^ v[c], 24);                                                                                \
        v[a] = v[a] + v[b] + (y);                                                                                      \
        v[d] = rotr64(v[d] ^ v[a], 16);                                                                                \
        v[c] = v[c] + v[d];                                                                                            \
        v[b] = rotr64(v[b] ^ v[c], 63);                                                                                \
    } while (0)
        /* Rounds written out with constant schedule indices, so the message words and v[] stay in
     * registers (the rolled loop cost ~0.4 us per key, 30% of a page-cache header check). */
#define ROUND(r)                                                                                                       \
    do {                                                                                                               \
        G(0, 4, 8, 12, m[sigma[r][0]], m[sigma[r][1]]);                                                                \
        G(1, 5, 9, 13, m[sigma[r][2]], m[sigma[r][3]]);                                                                \
        G(2, 6, 10, 14, m[sigma[r][4]], m[sigma[r][5]]);                                                               \
        G(3, 7, 11, 15, m[sigma[r][6]], m[sigma[r][7]]);                                                               \
        G(0, 5, 10, 15, m[sigma[r][8]], m[sigma[r][9]]);                                                               \
        G(1, 6, 11, 12, m[sigma[r][10]], m[sigma[r][11]]);                                                             \
        G(2, 7, 8, 13, m[sigma[r][12]], m[sigma[r][13]]);                                                              \
        G(3, 4, 9, 14, m[sigma[r][14]], m[sigma[r][15]]);                                                              \
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

/* The 8-byte digest as a little-endian u64: an object key's identity. */
static uint64_t blake2b64(const void *in, size_t len)
{
    uint8_t d[8];
    rb_blake2b(d, 8, in, len);
    return load64(d);
}

/*
 * Four one-block messages at once (AVX2): lane j of each 256-bit word is message j's word, so
 * one pass of the rounds hashes four keys for about the instructions of one scalar compress.
 * Only messages of at most one block (128 bytes) go this way: a key longer than that is hashed
 * alone. Selected at run time; without AVX2 (or another compiler than GCC/Clang on x86-64)
 * rb_blake2b64_many falls back to the scalar code, with the same results.
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define RB_X4 1

__attribute__((target("avx2"))) static void blake2b64_x4(const uint8_t *const msg[4], const size_t len[4],
                                                         uint64_t out[4])
{
    /* m[i] = word i of the four zero-padded blocks, transposed into lanes */
    uint64_t mw[16][4] __attribute__((aligned(32)));
    for (int j = 0; j < 4; j++) {
        uint8_t block[128];
        memset(block, 0, sizeof block);
        memcpy(block, msg[j], len[j]);
        for (int i = 0; i < 16; i++)
            mw[i][j] = load64(block + 8 * i);
    }
    __m256i m[16];
    for (int i = 0; i < 16; i++)
        m[i] = _mm256_load_si256((const __m256i *)mw[i]);
    const __m256i rot24 = _mm256_setr_epi8(3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10, 3, 4, 5, 6, 7, 0, 1, 2,
                                           11, 12, 13, 14, 15, 8, 9, 10);
    const __m256i rot16 = _mm256_setr_epi8(2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9, 2, 3, 4, 5, 6, 7, 0, 1,
                                           10, 11, 12, 13, 14, 15, 8, 9);
    const uint64_t h0 = blake2b_iv[0] ^ 0x01010000ULL ^ 8u; /* digest length 8, no key */
    __m256i v[16];
    v[0] = _mm256_set1_epi64x((long long)h0);
    for (int i = 1; i < 8; i++)
        v[i] = _mm256_set1_epi64x((long long)blake2b_iv[i]);
    for (int i = 8; i < 16; i++)
        v[i] = _mm256_set1_epi64x((long long)blake2b_iv[i - 8]);
    v[12] = _mm256_xor_si256(
        v[12], _mm256_setr_epi64x((long long)len[0], (long long)len[1], (long long)len[2], (long long)len[3]));
    v[14] = _mm256_xor_si256(v[14], _mm256_set1_epi64x(-1)); /* the last block */
#define ADD(x, y) _mm256_add_epi64(x, y)
#define XOR(x, y) _mm256_xor_si256(x, y)
#define G4(a, b, c, d, x, y)                                                                                           \
    do {                                                                                                               \
        v[a] = ADD(ADD(v[a], v[b]), x);                                                                                \
        v[d] = _mm256_shuffle_epi32(XOR(v[d], v[a]), _MM_SHUFFLE(2, 3, 0, 1));                                         \
        v[c] = ADD(v[c], v[d]);                                                                                        \
        v[b] = _mm256_shuffle_epi8(XOR(v[b], v[c]), rot24);                                                            \
        v[a] = ADD(ADD(v[a], v[b]), y);                                                                                \
        v[d] = _mm256_shuffle_epi8(XOR(v[d], v[a]), rot16);                                                            \
        v[c] = ADD(v[c], v[d]);                                                                                        \
        v[b] = XOR(v[b], v[c]);                                                                                        \
        v[b] = _mm256_or_si256(_mm256_srli_epi64(v[b], 63), ADD(v[b], v[b]));                                          \
    } while (0)
#define ROUND4(r)                                                                                                      \
    do {                                                                                                               \
        G4(0, 4, 8, 12, m[sigma[r][0]], m[sigma[r][1]]);                                                               \
        G4(1, 5, 9, 13, m[sigma[r][2]], m[sigma[r][3]]);                                                               \
        G4(2, 6, 10, 14, m[sigma[r][4]], m[sigma[r][5]]);                                                              \
        G4(3, 7, 11, 15, m[sigma[r][6]], m[sigma[r][7]]);                                                              \
        G4(0, 5, 10, 15, m[sigma[r][8]], m[sigma[r][9]]);                                                              \
        G4(1, 6, 11, 12, m[sigma[r][10]], m[sigma[r][11]]);                                                            \
        G4(2, 7, 8, 13, m[sigma[r][12]], m[sigma[r][13]]);                                                             \
        G4(3, 4, 9, 14, m[sigma[r][14]], m[sigma[r][15]]);                                                             \
    } while (0)
    ROUND4(0);
    ROUND4(1);
    ROUND4(2);
    ROUND4(3);
    ROUND4(4);
    ROUND4(5);
    ROUND4(6);
    ROUND4(7);
    ROUND4(8);
    ROUND4(9);
    ROUND4(10);
    ROUND4(11);
#undef ROUND4
#undef G4
#undef XOR
#undef ADD
    /* the digest is the low 8 bytes of h[0] = h0 ^ v[0] ^ v[8] */
    __m256i d = _mm256_xor_si256(_mm256_set1_epi64x((long long)h0), _mm256_xor_si256(v[0], v[8]));
    _mm256_storeu_si256((__m256i *)out, d);
}

static int have_avx2(void)
{
    static int known = -1; /* a benign race: every thread computes the same value */
    if (known < 0)
        known = __builtin_cpu_supports("avx2") ? 1 : 0;
    return known;
}
#endif

void rb_blake2b64_many(const uint8_t *const *msg, const size_t *len, size_t n, uint64_t *out)
{
#ifdef RB_X4
    if (have_avx2()) {
        /* gather the one-block messages four at a time; longer ones are hashed alone */
        const uint8_t *lane_msg[4];
        size_t lane_len[4], lane_at[4], k = 0;
        uint64_t d[4];
        for (size_t i = 0; i < n; i++) {
            if (len[i] > 128) {
                out[i] = blake2b64(msg[i], len[i]);
                continue;
            }
            lane_msg[k] = msg[i];
            lane_len[k] = len[i];
            lane_at[k++] = i;
            if (k == 4) {
                blake2b64_x4(lane_msg, lane_len, d);
                for (size_t j = 0; j < 4; j++)
                    out[lane_at[j]] = d[j];
                k = 0;
            }
        }
        if (k) { /* the last one to three: the free lanes repeat the first */
            for (size_t j = k; j < 4; j++) {
                lane_msg[j] = lane_msg[0];
                lane_len[j] = lane_len[0];
            }
            blake2b64_x4(lane_msg, lane_len, d);
            for (size_t j = 0; j < k; j++)
                out[lane_at[j]] = d[j];
        }
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        out[i] = blake2b64(msg[i], len[i]);
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

/* The hash field [p, at) of a legacy key (an optional sign and 0x, then hex digits) into *out
 * modulo 2**64: 0, or -EINVAL when it is not one. */
static int parse_hash_field(const char *p, const char *at, uint64_t *out)
{
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

int rb_key_identity(int ns, const char *key, size_t len, uint64_t *out)
{
    if (ns == RB_NS_OBJECT) {
        *out = blake2b64(key, len);
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
    return parse_hash_field(p, at, out);
}

uint64_t rb_key_hash(const char *key, size_t len)
{
    uint64_t h = XXH3_64bits(key, len);
    return h ? h : 1;
}
