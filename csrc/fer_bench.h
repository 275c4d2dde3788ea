/*
 * fer_bench.h - benchmark and stress drivers of the scheduling core: tooling, not the runtime
 * contract (that is fer.h). Nothing on the relay's data path calls these.
 *
 * Read by flowedge_relay/_build_core.py into the same cdef, right after fer.h, so the drivers are
 * lib.fer_bench_* next to the core calls (flowedge_relay/tooling/bench/admission.py, test/test_ring.py).
 * Same rules as fer.h: cdef-parsable, no #include, no include guard; C users include fer.h first.
 */

/* ---- benchmark and stress drivers (csrc/fer_bench.c) -----------------------------------------
 * bench_admission: builds its own core (queue of `depth` feasible requests, `workers` busy lanes,
 *   admission on) and times `samples` admissible submits with CLOCK_MONOTONIC into lat_ns[].
 *   Returns FER_OK or an error code.
 * bench_ring_produce: pushes n records (sequence first..first+n-1, actions[k] = sequence + k),
 *   spinning while full; returns the number of times it found the ring full.
 * bench_ring_consume: pops n records, checks order and payload; returns the number of errors. */
int fer_bench_admission(uint32_t depth, uint32_t workers, uint32_t samples, uint64_t seed,
                        uint64_t *lat_ns);
uint64_t fer_bench_ring_produce(struct fer_ring *ring, uint64_t first, uint64_t n);
uint64_t fer_bench_ring_consume(struct fer_ring *ring, uint64_t first, uint64_t n);
