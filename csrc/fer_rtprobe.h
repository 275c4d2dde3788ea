/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_rtprobe.h - test support: the priority-inversion probe on the core's own locks
 * (test/test_realtime_locks.py). Not the runtime contract (that is fer.h) and nothing on the
 * relay's data path calls it; it stays in the core because it takes the core's private mutexes.
 *
 * Same rules as fer.h: read verbatim into the cdef, so declarations and plain integer #defines
 * only; no #include, no include guard; C users include fer.h first.
 */

/* ---- the realtime probe (csrc/fer_rtprobe.c): priority inversion on one CPU, by construction --
 * rtprobe_pi: makes a core (fer_core_create, as the relay does) and runs three SCHED_FIFO threads
 *   pinned to CPU `cpu`, made in this order: H (priority 30) and M (20) wait for their start;
 *   L (10) takes the lock and, inside its critical section (microseconds of its own), starts M,
 *   which preempts it at once, starts H and spins for spin_ns; H preempts M and asks for the
 *   lock. With priority inheritance L runs at H's priority, unlocks, and H holds the lock before
 *   M's spin ends; without it L waits behind M, and so does H. On one CPU under SCHED_FIFO that
 *   order is the scheduler's, not the host's speed. `lock` picks the mutex: FER_RTPROBE_CORE
 *   (core->mu), FER_RTPROBE_BELL (the core's doorbell mutex) or FER_RTPROBE_PLAIN (a default
 *   mutex made here, without priority inheritance: the inversion the core's locks remove).
 *   Every wait and the spin end at a watchdog 2 s after the start (then watchdog = 1).
 *   FER_OK with *out filled; FER_EINVAL (out NULL, lock unknown, spin_ns not in 1 ms..1 s);
 *   FER_ESYS with os_error = the errno of the refused thread (EPERM: SCHED_FIFO needs
 *   CAP_SYS_NICE or an rtprio limit; EINVAL: cpu not allowed). */
#define FER_RTPROBE_CORE 0
#define FER_RTPROBE_BELL 1
#define FER_RTPROBE_PLAIN 2

/* CLOCK_MONOTONIC ns of each event (0: did not happen), and where each thread ran. */
struct fer_rtprobe_result {
    uint64_t l_locked_ns;        /* L took the lock */
    uint64_t m_start_ns;         /* M began to spin (it had preempted L) */
    uint64_t h_asked_ns;         /* H asked for the lock (it had preempted M) */
    uint64_t l_unlocked_ns;      /* L's critical section ended: it unlocks */
    uint64_t h_acquired_ns;      /* H holds the lock */
    uint64_t m_done_ns;          /* M's spin ended */
    int32_t cpu_l;               /* sched_getcpu() of each thread inside its part; -1 if it did */
    int32_t cpu_m;               /*   not get there */
    int32_t cpu_h;
    int32_t os_error;
    uint32_t watchdog;
    uint32_t _pad;
};
int fer_rtprobe_pi(uint32_t lock, uint32_t cpu, uint64_t spin_ns, struct fer_rtprobe_result *out);
