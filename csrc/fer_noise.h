/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_noise.h - a request's initial noise drawn in C: numpy's
 * np.random.default_rng(seed).standard_normal(n, dtype=np.float32), bit for bit.
 *
 * Why: the relay's contract (docs/policy-packages.md, flowedge_relay/model.py) is that a request's
 * initial noise is exactly that numpy draw for its noise_seed. Drawing it through numpy costs a
 * worker thread about 8.5 us and the GIL per request; this draws the same floats without the
 * interpreter, so a native worker can set a row up without Python.
 *
 * What it reproduces (csrc/fer_noise.c says how, and which numpy sources it follows): SeedSequence
 * of the integer seed (pool of 4 words), PCG64 seeded from generate_state(4, uint64), and
 * Generator.standard_normal's float32 ziggurat, as the numpy 2.4.6 wheel computes them (its
 * next_float takes the top 24 bits of a 32-bit draw; older numpy sources took 23: see the .c).
 *
 * Same rules as fer.h: read verbatim into the cdef by flowedge_relay/_build_core.py (after fer.h,
 * whose status codes it uses), so cdef-parsable: declarations and plain integer #defines only.
 * Threads: no shared state; any thread may call it at any time.
 */

/*
 * Writes out[0..n) = numpy's default_rng(seed).standard_normal(n, dtype=np.float32) for any seed
 * in [0, 2^64 - 1] and any n. The first k values of a draw of n >= k are the draw of k.
 * Allocates nothing and writes nothing but out. Returns FER_OK, or FER_EINVAL (nothing written)
 * if out is NULL and n > 0. Expected O(n): the ziggurat redraws for under 1% of the values.
 */
int fer_noise_fill(uint64_t seed, float *out, uint64_t n);
