/*
 * rb_core_class.c - metadata classes: each distinct (shape, dtype, fmt) of the entries is
 * interned once (c->cls, found through the c->classes index by its JSON fragment), and an
 * entry records the class id.
 */
#include "rb_core_int.h"

#include <stdlib.h>
#include <string.h>

char *rb_core_dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static void class_free(rb_class *k)
{
    if (!k)
        return;
    free(k->dtype);
    free(k->fmt);
    free(k->dims);
    free(k->json);
    free(k);
}

void rb_core_classes_free(rb_core *c)
{
    rb_idx_free(&c->classes);
    for (uint32_t i = 0; i < c->n_cls; i++)
        class_free(c->cls[i]);
    free(c->cls);
}

/* Does class k describe m? (NUL-terminated copies in k: a name with a NUL inside never
 * matches, and is interned the long way.) */
static int class_is(const rb_class *k, const rb_meta_in *m)
{
    if (k->ndim != m->ndim || (m->ndim > 0 && memcmp(k->dims, m->dims, (size_t)m->ndim * sizeof(int64_t)) != 0))
        return 0;
    if (!k->dtype != !m->dtype ||
        (m->dtype && (strlen(k->dtype) != m->dtype_len || memcmp(k->dtype, m->dtype, m->dtype_len) != 0)))
        return 0;
    return !k->fmt == !m->fmt && (!m->fmt || (strlen(k->fmt) == m->fmt_len && memcmp(k->fmt, m->fmt, m->fmt_len) == 0));
}

/* A JSON string value, or null when s is NULL. */
static void json_str_or_null(rb_buf *b, const char *s, size_t len)
{
    if (s)
        rb_buf_json_str(b, s, len);
    else
        rb_buf_puts(b, "null");
}

/* The class's key and checkpoint fragment, "shape":[...],"dtype":"...","fmt":"..." into b
 * (b->oom set when out of memory). */
static void class_json(const rb_meta_in *m, rb_buf *b)
{
    rb_buf_puts(b, "\"shape\":");
    if (m->ndim < 0) {
        rb_buf_puts(b, "null");
    } else {
        rb_buf_puts(b, "[");
        for (int64_t i = 0; i < m->ndim; i++) {
            if (i)
                rb_buf_puts(b, ",");
            rb_buf_i64(b, m->dims[i]);
        }
        rb_buf_puts(b, "]");
    }
    rb_buf_puts(b, ",\"dtype\":");
    json_str_or_null(b, m->dtype, m->dtype_len);
    rb_buf_puts(b, ",\"fmt\":");
    json_str_or_null(b, m->fmt, m->fmt_len);
}

/* Room in c->cls for one more class: 0 or -ENOMEM. */
static int cls_reserve_one(rb_core *c)
{
    if (c->n_cls < c->cap_cls)
        return 0;
    uint32_t nc = c->cap_cls ? c->cap_cls * 2 : 16;
    rb_class **n = realloc(c->cls, (size_t)nc * sizeof(*n));
    if (!n)
        return -ENOMEM;
    c->cls = n;
    c->cap_cls = nc;
    return 0;
}

/* A new class holding copies of m and of its JSON fragment (json, len), or NULL (ENOMEM). */
static rb_class *class_new(const rb_meta_in *m, const char *json, size_t len)
{
    rb_class *k = calloc(1, sizeof(*k));
    if (!k)
        return NULL;
    k->ndim = m->ndim;
    if (m->dtype && !(k->dtype = rb_core_dupn(m->dtype, m->dtype_len)))
        goto oom;
    if (m->fmt && !(k->fmt = rb_core_dupn(m->fmt, m->fmt_len)))
        goto oom;
    if (m->ndim > 0) {
        k->dims = malloc((size_t)m->ndim * sizeof(int64_t));
        if (!k->dims)
            goto oom;
        memcpy(k->dims, m->dims, (size_t)m->ndim * sizeof(int64_t));
    }
    k->json = rb_core_dupn(json, len);
    if (!k->json)
        goto oom;
    k->json_len = len;
    return k;
oom:
    class_free(k);
    return NULL;
}

/* The class's id by its JSON fragment, the class added when it is new: UINT32_MAX (ENOMEM). */
static uint32_t intern_class_slow(rb_core *c, const rb_meta_in *m)
{
    rb_buf b = {0};
    class_json(m, &b);
    if (b.oom) {
        rb_buf_free(&b);
        return UINT32_MAX;
    }
    uint32_t h = rb_idx_hash(b.data, b.len);
    uint32_t p = rb_idx_find(&c->classes, b.data, b.len, h);
    if (p != UINT32_MAX) {
        rb_buf_free(&b);
        return c->classes.ents[p].slot;
    }
    rb_class *k = cls_reserve_one(c) < 0 ? NULL : class_new(m, b.data, b.len);
    if (k)
        p = rb_idx_insert(&c->classes, b.data, b.len, h, NULL, -1);
    rb_buf_free(&b);
    if (!k || p == UINT32_MAX) {
        class_free(k);
        return UINT32_MAX;
    }
    c->classes.ents[p].slot = c->n_cls;
    c->cls[c->n_cls] = k;
    return c->n_cls++;
}

uint32_t rb_core_intern_class(rb_core *c, const rb_meta_in *m)
{
    /* A batch's keys nearly always share one class: check the last one before building the
     * class's JSON key and probing the table (about 2,300 instructions a key). */
    if (c->last_cls < c->n_cls && class_is(c->cls[c->last_cls], m))
        return c->last_cls;
    uint32_t id = intern_class_slow(c, m);
    if (id != UINT32_MAX)
        c->last_cls = id;
    return id;
}
