/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_cdr.h - XCDR1 little endian, as rmw_fastrtps writes ROS 2 messages: a bounded reader and a
 * bounded writer of primitives (internal: not read into the cdef). No field list lives here: the
 * order and types of a message's fields come from its generated type support (fer_wire.h).
 *
 * The bytes start with a 4-byte encapsulation header (00 01 00 00, CDR_LE); every field is aligned
 * to its own size counted from after it. A string is a uint32 length that counts a terminating
 * NUL, then the bytes and the NUL; a sequence is a uint32 count, then the elements. The reader
 * serves fer_wire.c's walk; the writer fer_wire.c's PoolSpill writer (which walks the plan) and
 * the intake bench's client (tools/csrc/fer_loadgen.c, header-only use), whose requests
 * test/test_bench_intake.py reads back through rclpy, field by field.
 */
#ifndef FER_CDR_H
#define FER_CDR_H

#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fer_cdr.h reads and writes little-endian CDR with memcpy: a big-endian host needs swaps"
#endif

#define FER_CDR_ENCAPSULATION 4
#define FER_CDR_NS_PER_S 1000000000ull
/* timebase.ROS_TIME_MAX_NS: the latest stamp a builtin_interfaces/Time (int32 sec) can hold */
#define FER_ROS_TIME_MAX_NS ((uint64_t)INT32_MAX * FER_CDR_NS_PER_S + FER_CDR_NS_PER_S - 1)

/* ---- writer ------------------------------------------------------------------------------------
 * n may run past cap (the write is then skipped), so one pass both sizes and fills. */
struct fer_cdr_writer {
    uint8_t *b;
    uint64_t n, cap;
};

static inline void fer_cdr_begin(struct fer_cdr_writer *w)
{
    static const uint8_t encapsulation[FER_CDR_ENCAPSULATION] = {0, 1, 0, 0};

    if (w->cap >= FER_CDR_ENCAPSULATION)
        memcpy(w->b, encapsulation, FER_CDR_ENCAPSULATION);
    w->n = FER_CDR_ENCAPSULATION;
}

static inline void fer_cdr_put(struct fer_cdr_writer *w, const void *p, uint64_t len,
                               uint64_t align)
{
    while ((w->n - FER_CDR_ENCAPSULATION) % align) {
        if (w->n < w->cap)
            w->b[w->n] = 0;
        w->n++;
    }
    if (w->n + len <= w->cap && len)
        memcpy(w->b + w->n, p, len);
    w->n += len;
}

static inline void fer_cdr_u8(struct fer_cdr_writer *w, uint8_t v) { fer_cdr_put(w, &v, 1, 1); }
static inline void fer_cdr_u32(struct fer_cdr_writer *w, uint32_t v) { fer_cdr_put(w, &v, 4, 4); }
static inline void fer_cdr_u64(struct fer_cdr_writer *w, uint64_t v) { fer_cdr_put(w, &v, 8, 8); }

static inline void fer_cdr_string(struct fer_cdr_writer *w, const char *s, uint32_t len)
{
    fer_cdr_u32(w, len + 1);
    fer_cdr_put(w, s, len, 1);
    fer_cdr_u8(w, 0);
}

/* builtin_interfaces/Time from ns, saturated as timebase.ros_time. */
static inline void fer_cdr_time(struct fer_cdr_writer *w, int64_t ns)
{
    uint64_t t = ns <= 0 ? 0 : (uint64_t)ns;

    if (t > FER_ROS_TIME_MAX_NS)
        t = FER_ROS_TIME_MAX_NS;
    fer_cdr_u32(w, (uint32_t)(t / FER_CDR_NS_PER_S)); /* int32 sec: t / 1e9 <= INT32_MAX */
    fer_cdr_u32(w, (uint32_t)(t % FER_CDR_NS_PER_S));
}

/* ---- reader ------------------------------------------------------------------------------------
 * ok drops to 0 at the first read past the end and stays there; every length is checked against
 * what is left before it is used, so hostile bytes can only make a parse fail. */
struct fer_cdr_reader {
    const uint8_t *b;
    uint64_t n, len;
    int ok;
};

/* A reader over len bytes, past the header; ok is 0 unless the header says CDR little endian. */
static inline struct fer_cdr_reader fer_cdr_open(const uint8_t *buf, uint64_t len)
{
    struct fer_cdr_reader r = {buf, FER_CDR_ENCAPSULATION, len, 0};

    r.ok = buf != NULL && len >= FER_CDR_ENCAPSULATION && buf[0] == 0 && buf[1] == 1;
    return r;
}

static inline const uint8_t *fer_cdr_take(struct fer_cdr_reader *r, uint64_t size, uint64_t align)
{
    const uint8_t *p;
    uint64_t pad = align > 1 ? (align - (r->n - FER_CDR_ENCAPSULATION) % align) % align : 0;

    if (!r->ok || pad > r->len - r->n || size > r->len - r->n - pad) {
        r->ok = 0;
        return NULL;
    }
    p = r->b + r->n + pad;
    r->n += pad + size;
    return p;
}

static inline uint8_t fer_cdr_get_u8(struct fer_cdr_reader *r)
{
    const uint8_t *p = fer_cdr_take(r, 1, 1);
    return p ? *p : 0;
}

static inline uint32_t fer_cdr_get_u32(struct fer_cdr_reader *r)
{
    const uint8_t *p = fer_cdr_take(r, 4, 4);
    uint32_t v = 0;

    if (p)
        memcpy(&v, p, 4);
    return v;
}

static inline uint64_t fer_cdr_get_u64(struct fer_cdr_reader *r)
{
    const uint8_t *p = fer_cdr_take(r, 8, 8);
    uint64_t v = 0;

    if (p)
        memcpy(&v, p, 8);
    return v;
}

/* A string: its bytes up to the first NUL (rosidl's C strings end there too). */
static inline const uint8_t *fer_cdr_get_string(struct fer_cdr_reader *r, uint32_t *len)
{
    uint32_t n = fer_cdr_get_u32(r);
    const uint8_t *p = fer_cdr_take(r, n, 1);

    *len = 0;
    if (p == NULL || n == 0)
        return p;
    *len = (uint32_t)strnlen((const char *)p, n);
    return p;
}

/* A sequence of `count` elements of `size` bytes (aligned to `align`): a pointer to the first. */
static inline const uint8_t *fer_cdr_get_seq(struct fer_cdr_reader *r, uint64_t size,
                                             uint64_t align, uint64_t *count)
{
    uint32_t n = fer_cdr_get_u32(r);

    *count = n;
    if (n == 0)
        return r->ok ? r->b + r->n : NULL;
    return fer_cdr_take(r, (uint64_t)n * size, align);
}

#endif /* FER_CDR_H */
