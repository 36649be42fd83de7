/*
 * rb_core_ident.h - the u64 slot identity of an encoded key (LMCache's key codec, in C).
 *
 * Owns: BLAKE2b (RFC 7693, unkeyed, 8-byte digest; no library among the project's
 * dependencies offers a BLAKE2b with a digest length parameter) and the legacy-key parse
 * (4th '@' field = chunk hash in hex, possibly negative, masked to 64 bits); and the hash of the
 * whole key our slot headers carry beside the identity.
 */
#ifndef RB_CORE_IDENT_H
#define RB_CORE_IDENT_H

#include <stddef.h>
#include <stdint.h>

enum rb_key_namespace { RB_NS_LEGACY = 0, RB_NS_OBJECT = 1 };

/* BLAKE2b with digest_size = outlen (1..64), no key. */
void rb_blake2b(uint8_t *out, size_t outlen, const void *in, size_t inlen);

/* out[i] = the 8-byte BLAKE2b digest of msg[i] (len[i] bytes) as a little-endian u64, for n
 * messages: the object namespace's identity, four keys of up to 128 bytes per pass where the
 * CPU has AVX2. */
void rb_blake2b64_many(const uint8_t *const *msg, const size_t *len, size_t n, uint64_t *out);

/* Identity of key in namespace ns. 0 on success, -EINVAL if a legacy key does not parse. */
int rb_key_identity(int ns, const char *key, size_t len, uint64_t *out);

/* The hash of the whole encoded key that our slot headers carry beside the identity
 * (RB_KEYHASH_OFF in rb_ckpt.h): xxh3-64 (seed 0) of its bytes, 1 where that is 0 (0 marks a
 * header without the field). Keys that share an identity (legacy keys of one chunk hash under
 * two tenants, dtypes or layers) differ here. */
uint64_t rb_key_hash(const char *key, size_t len);

#endif /* RB_CORE_IDENT_H */
