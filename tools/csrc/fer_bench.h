/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_bench.h - benchmark and stress drivers of the scheduling core: tooling, not the runtime
 * contract (that is fer.h). Nothing on the relay's data path calls these.
 *
 * Read by tools/flowedge_relay_tools/_build_bench.py into the tools' own cdef, which includes the
 * core's (the types are shared), so the drivers are flowedge_relay_tools.native's lib.fer_bench_*
 * (bench/admission.py, test/test_ring.py). Same rules as fer.h: cdef-parsable, no #include, no
 * include guard; C users include fer.h and fer_intake.h first.
 */

/* ---- benchmark and stress drivers (tools/csrc/fer_bench.c) -----------------------------------
 * bench_admission: builds its own core (queue of `depth` feasible requests, `workers` busy lanes,
 *   admission on) and times `samples` admissible submits with CLOCK_MONOTONIC into lat_ns[];
 *   fair_share 1 runs the same with the fair share on (every session its own client, all
 *   tracked: the client table's worst case). Returns FER_OK or an error code.
 * bench_ring_produce: pushes n records (sequence first..first+n-1, actions[k] = sequence + k),
 *   spinning while full; returns the number of times it found the ring full.
 * bench_ring_consume: pops n records, checks order and payload; returns the number of errors.
 * bench_intake_decide (flowedge_relay_bench pool-sim): decides n messages through the intake's
 *   fer_intake_decide, message i being buf[offsets[i % n_msgs], offsets[i % n_msgs + 1]), each
 *   timed with CLOCK_MONOTONIC into ns_out[i], all at the clocks (now_mono, now_ros); in NULL: the
 *   timer's own cost, n times. From the deciding thread. FER_OK, FER_EINVAL. */
int fer_bench_admission(uint32_t depth, uint32_t workers, uint32_t samples, uint64_t seed,
                        uint32_t fair_share,
                        uint64_t *lat_ns);
uint64_t fer_bench_ring_produce(struct fer_ring *ring, uint64_t first, uint64_t n);
uint64_t fer_bench_ring_consume(struct fer_ring *ring, uint64_t first, uint64_t n);
int fer_bench_intake_decide(struct fer_intake *in, const uint8_t *buf, const uint64_t *offsets,
                            uint32_t n_msgs, uint32_t n, uint64_t now_mono, int64_t now_ros,
                            uint64_t *ns_out);
