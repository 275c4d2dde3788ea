/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_sat.h - saturating uint64 arithmetic for nanosecond times (in the style of Linux
 * include/linux/overflow.h size_add / size_mul).
 *
 * The saturated value is UINT64_MAX (FER_SAT). It means "overflowed: later than any representable
 * time", never a real instant, so fer_meets() treats it as missing every deadline. An admission
 * sum that overflows therefore rejects instead of wrapping to a small time and admitting.
 */
#ifndef FER_SAT_H
#define FER_SAT_H

#include <stdint.h>

#define FER_SAT UINT64_MAX

/* a + b, or FER_SAT if the true sum does not fit. */
static inline uint64_t fer_sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? FER_SAT : r;
}

/* a * b, or FER_SAT if the true product does not fit (remaining_nfe x nfe_ns can). */
static inline uint64_t fer_sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? FER_SAT : r;
}

/* a - b, or 0 if b > a (an age or slack never goes negative). */
static inline uint64_t fer_sat_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

/* start + n * per, saturating: when n steps of `per` ns each, begun at start, are over. */
static inline uint64_t fer_sat_finish(uint64_t start, uint64_t n, uint64_t per)
{
    return fer_sat_add(start, fer_sat_mul(n, per));
}

/* Whether work ending at `end` meets `deadline` (finite). A saturated end meets nothing. */
static inline int fer_meets(uint64_t end, uint64_t deadline)
{
    return end != FER_SAT && end <= deadline;
}

#endif /* FER_SAT_H */
