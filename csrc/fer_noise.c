/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_noise.c - numpy's np.random.default_rng(seed).standard_normal(n, dtype=np.float32) in C, bit
 * for bit (fer_noise.h says why). Three stages, each a port of the numpy/numpy sources named here,
 * checked against the numpy 2.4.6 wheel (the version the venv pins):
 *
 *   1. SeedSequence(seed).generate_state(4, np.uint64): numpy/random/bit_generator.pyx
 *      (_int_to_uint32_array, hashmix, mix, SeedSequence.mix_entropy with the default pool of 4
 *      words, generate_state). SeedSequence is Melissa E. O'Neill's seed_seq alternative, MIT
 *      License, Copyright (c) 2015 Melissa E. O'Neill, (c) 2019 NumPy Developers.
 *   2. PCG64, the XSL-RR 128/64 generator: numpy/random/_pcg64.pyx (PCG64.__init__: the state from
 *      words 0-1, the increment from words 2-3, high word first) and numpy/random/src/pcg64/pcg64.h
 *      and pcg64.c (pcg_setseq_128_srandom_r, the LCG step and the XSL-RR output in their
 *      __uint128_t form, pcg64_next32's buffer of the other half of a 64-bit draw). PCG: Copyright
 *      2014 Melissa O'Neill, 2015 Robert Kern, Apache License 2.0, relicensed MIT in May 2019.
 *   3. The float32 ziggurat: numpy/random/src/distributions/distributions.c (next_float,
 *      random_standard_normal_f, random_standard_normal_fill_f), tables from ziggurat_constants.h
 *      (fer_noise_zig.h). numpy.random: Copyright (c) 2019 Kevin Sheppard and (c) 2005-2025 NumPy
 *      Developers, BSD-3-Clause (numpy/random/LICENSE.md).
 *
 * What bit identity rests on, besides the integer code being the same:
 *   - the float arithmetic in numpy's order and precision: float products and sums, the wedge
 *     test's left side widened to double and compared with exp() of a double, and no contraction
 *     into FMAs (-ffp-contract=off in flowedge_relay/_build_core.py);
 *   - the same libm functions: log1pf (numpy's npy_log1pf) in the tail, exp in the wedge; numpy's
 *     own copy calls the same shared libm, so both agree on any one host;
 *   - the numpy version. The sources differ across numpy releases: older copies of distributions.c
 *     have next_float = (u >> 9) * 2^-23 and logf(1.0f - u) in the tail, while the numpy 2.4.6
 *     wheel's compiled code (numpy/random/lib/libnpyrandom.a, disassembled) has (u >> 8) * 2^-24
 *     and log1pf(-u); this file follows the wheel. test/test_noise.py compares with the installed
 *     numpy, so an upgrade that changes the stream fails there.
 *
 * Nothing is allocated; the generator state lives on the caller's stack for one call.
 */
#include <math.h>

#include "fer_internal.h"
#include "fer_noise.h"
#include "fer_noise_zig.h"

/* ---- 1. SeedSequence --------------------------------------------------------------------------- */
#define SS_POOL_SIZE 4u             /* DEFAULT_POOL_SIZE */
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_MULT_L 0xca01f9ddu
#define SS_MIX_MULT_R 0x4973f715u
#define SS_XSHIFT 16u               /* 32 bits // 2 */

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const)
{
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    return value ^ (value >> SS_XSHIFT);
}

static uint32_t ss_mix(uint32_t x, uint32_t y)
{
    uint32_t r = SS_MIX_MULT_L * x - SS_MIX_MULT_R * y;
    return r ^ (r >> SS_XSHIFT);
}

/* SeedSequence(seed).generate_state(4, np.uint64) into words[0..4). */
static void ss_generate_state(uint64_t seed, uint64_t words[4])
{
    /* _int_to_uint32_array(seed) is [lo] below 2^32 and [lo, hi] from 2^32 on. mix_entropy hashes
     * 0 into the pool words past the entropy, so [lo] mixes exactly as [lo, 0]: two words always. */
    const uint32_t entropy[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t pool[SS_POOL_SIZE];
    uint32_t state[2 * 4];
    uint32_t hash_const = SS_INIT_A;
    uint32_t i, src, dst;

    for (i = 0; i < SS_POOL_SIZE; i++)
        pool[i] = ss_hashmix(i < 2 ? entropy[i] : 0u, &hash_const);
    /* Mix all bits together so late bits can affect earlier bits (in place, in this order). */
    for (src = 0; src < SS_POOL_SIZE; src++)
        for (dst = 0; dst < SS_POOL_SIZE; dst++)
            if (src != dst)
                pool[dst] = ss_mix(pool[dst], ss_hashmix(pool[src], &hash_const));

    /* generate_state: 8 uint32 words cycling over the pool, then viewed as little-endian uint64. */
    hash_const = SS_INIT_B;
    for (i = 0; i < 2 * 4; i++) {
        uint32_t v = pool[i % SS_POOL_SIZE];
        v ^= hash_const;
        hash_const *= SS_MULT_B;
        v *= hash_const;
        state[i] = v ^ (v >> SS_XSHIFT);
    }
    for (i = 0; i < 4; i++)
        words[i] = (uint64_t)state[2 * i] | ((uint64_t)state[2 * i + 1] << 32);
}

/* ---- 2. PCG64 (XSL-RR 128/64) ------------------------------------------------------------------- */
typedef unsigned __int128 fer_u128;

/* PCG_DEFAULT_MULTIPLIER_128 */
#define PCG_MULT (((fer_u128)2549297995355413924ull << 64) | (fer_u128)4865540595714422341ull)

struct fer_pcg64 {
    fer_u128 state;
    fer_u128 inc;         /* odd */
    int has_uint32;       /* pcg64_next32: the upper half of the last 64-bit draw is pending */
    uint32_t uinteger;    /* that upper half */
};

static void pcg_step(struct fer_pcg64 *g)
{
    g->state = g->state * PCG_MULT + g->inc;
}

/* pcg64_set_seed(seed = words[0..2), inc = words[2..4)), then pcg_setseq_128_srandom_r. */
static void pcg_seed(struct fer_pcg64 *g, const uint64_t words[4])
{
    fer_u128 initstate = ((fer_u128)words[0] << 64) | words[1];
    fer_u128 initseq = ((fer_u128)words[2] << 64) | words[3];

    g->state = 0;
    g->inc = (initseq << 1) | 1u;
    pcg_step(g);
    g->state += initstate;
    pcg_step(g);
    g->has_uint32 = 0;
    g->uinteger = 0;
}

static uint64_t pcg_next64(struct fer_pcg64 *g)
{
    uint64_t hi, lo;
    unsigned rot;

    pcg_step(g);
    hi = (uint64_t)(g->state >> 64);
    lo = (uint64_t)g->state;
    rot = (unsigned)(g->state >> 122);
    return ((hi ^ lo) >> rot) | ((hi ^ lo) << ((-rot) & 63u));
}

/* pcg64_next32: the lower half of a fresh 64-bit draw, then its upper half on the next call. */
static uint32_t pcg_next32(struct fer_pcg64 *g)
{
    uint64_t next;

    if (g->has_uint32) {
        g->has_uint32 = 0;
        return g->uinteger;
    }
    next = pcg_next64(g);
    g->has_uint32 = 1;
    g->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

/* ---- 3. the float32 ziggurat ------------------------------------------------------------------ */
/* ziggurat_nor_r_f and ziggurat_nor_inv_r_f, numpy's literals */
#define ZIG_R_F 3.6541528853610087963519472518f
#define ZIG_INV_R_F 0.27366123732975827203338247596f

/* next_float: the top 24 bits of a 32-bit draw, in [0, 1). */
static float next_float(struct fer_pcg64 *g)
{
    return (float)(pcg_next32(g) >> 8) * (1.0f / 16777216.0f);
}

/* random_standard_normal_f: r = n23sb8 (23-bit magnitude, sign bit, 8-bit layer index). */
static float standard_normal_f(struct fer_pcg64 *g)
{
    for (;;) {
        uint32_t r = pcg_next32(g);
        uint32_t idx = r & 0xffu;
        uint32_t rabs = (r >> 9) & 0x007fffffu;
        float x = (float)rabs * fer_zig_wi[idx];

        if ((r >> 8) & 1u)
            x = -x;
        if (rabs < fer_zig_ki[idx])
            return x; /* 99.3% of the time */
        if (idx == 0) {
            /* the tail beyond ZIG_R_F; its sign is bit 8 of rabs */
            for (;;) {
                float xx = -ZIG_INV_R_F * log1pf(-next_float(g));
                float yy = -log1pf(-next_float(g));
                if (yy + yy > xx * xx)
                    return ((rabs >> 8) & 1u) ? -(ZIG_R_F + xx) : ZIG_R_F + xx;
            }
        }
        /* the wedge: a float left side against exp() of a double, as numpy's C compares them */
        if ((double)((fer_zig_fi[idx - 1] - fer_zig_fi[idx]) * next_float(g) + fer_zig_fi[idx]) <
            exp(-0.5 * (double)x * (double)x))
            return x;
    }
}

int fer_noise_fill(uint64_t seed, float *out, uint64_t n)
{
    struct fer_pcg64 g;
    uint64_t words[4];
    uint64_t i;

    FER_CHECK_ARGS(out != NULL || n == 0);
    if (n == 0)
        return FER_OK;
    ss_generate_state(seed, words);
    pcg_seed(&g, words);
    /* random_standard_normal_fill_f: one generator, so the pending half-draw carries over */
    for (i = 0; i < n; i++)
        out[i] = standard_normal_f(&g);
    return FER_OK;
}
