/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_internal.h - private structures of the scheduling core and the calls its files share.
 * Not part of the cdef. Each struct's invariants are written above it.
 *
 * The core is cut by concern, one job per file:
 *   fer_core.c     create / destroy / shutdown, configuration, calibration and policy
 *   fer_session.c  the session table, its hash index, and the request slots each session owns
 *   fer_queue.c    the bounded EDF queue (sorted array of slot ids)
 *   fer_submit.c   the docs/design.md §4 decision order on arrival, one small step per rule
 *   fer_admit.c    the §5 admission test: building its state from the core, and the predicate
 *   fer_share.c    the §7.1 fair share: the client table, weights, who is over its share
 *   fer_lane.c     the worker lanes: wait, dispatch, step, finish, disable
 *   fer_output.c   outcomes: into the deciding thread's ring, and out to the publisher
 *   fer_stats.c    counters, snapshots and the session-generation query
 *   fer_ring.c     the SPSC rings and their doorbell
 *   fer_lock.c     how mutexes and condvars are made (priority inheritance, CLOCK_MONOTONIC)
 *   fer_cost.c     the §5.2 cost estimator (fer_cost.h), which knows nothing of the core
 *   fer_rt.c       a thread's own CPU set and SCHED_FIFO priority, the memory lock (fer_rt.h)
 *   fer_rtprobe.c  test support (fer_rtprobe.h): priority inversion on one CPU, on the core's locks
 *   fer_publish.c  the publisher thread: outcomes as ActionMessage CDR through rcl (fer_publish.h)
 *   fer_take.c     a thread taking serialized messages from rcl as they arrive (fer_take.h)
 *   fer_intake.c   the request intake: validate and submit what it takes (fer_intake.h)
 *   fer_wire.c     the messages' wire format from their generated type support (fer_wire.h)
 *   fer_pool.c     a relay pool: ownership, the standby table, takeovers (fer_pool.h)
 *   (headers only: fer_rcl.h, rcl's ABI slice; fer_cdr.h, XCDR1 primitives)
 *   The benchmark drivers and the intake bench's client are the tools package's (tools/csrc),
 *   compiled into its own module; they call the core through fer.h, fer_take.h and fer_wire.h.
 *
 * Include graph: the quoted #includes of csrc/, a .c and its .h being one node (a header that
 * needs the types of a file that includes it is a cycle too: fer_cost.c once included this
 * header for struct fer_core while this one included fer_cost.h for struct fer_cost).
 * test/test_layout.py checks that these lines are the files' includes and that there is no
 * cycle. Leaves (include nothing): fer, fer_sat, fer_tensor and the other cdef headers,
 * fer_noise_zig, fer_rcl, fer_cdr.
 *   fer_internal -> fer fer_sat fer_cost
 *   fer_cost -> fer fer_sat
 *   fer_ort -> fer_internal fer_tensor
 *   fer_exec -> fer_internal fer_tensor fer_ort
 *   fer_pass -> fer_internal fer_tensor fer_ort
 *   fer_serve -> fer_internal fer_tensor fer_exec fer_pass fer_noise
 *   fer_noise -> fer_internal fer_noise_zig
 *   fer_rtprobe -> fer_internal
 *   fer_publish -> fer_internal fer_rcl fer_pool
 *   fer_take -> fer_internal fer_rcl
 *   fer_intake -> fer_internal fer_rcl fer_take fer_pool fer_wire
 *   fer_pool -> fer_internal fer_wire
 *   fer_wire -> fer_internal fer_cdr fer_rcl
 *   fer_rt -> fer_internal
 *   fer_core fer_session fer_queue fer_submit fer_admit fer_lane -> fer_internal
 *   fer_output fer_stats fer_ring fer_lock fer_share -> fer_internal
 */
#ifndef FER_INTERNAL_H
#define FER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fer.h"
#include "fer_sat.h"
#include "fer_cost.h"

#define FER_CACHELINE 64
#define FER_NONE UINT32_MAX

/* Every public entry point that returns int checks its arguments first, with this one macro:
 * FER_EINVAL (and no side effect) unless `ok` holds. `ok` may read the core only after testing it
 * against NULL (&& short-circuits), e.g. FER_CHECK_ARGS(c != NULL && lane < c->cfg.workers). */
#define FER_CHECK_ARGS(ok)                                                                       \
    do {                                                                                         \
        if (!(ok))                                                                               \
            return FER_EINVAL;                                                                   \
    } while (0)

/* Smallest power of two >= n (n <= 2^63; callers pass bounded sizes). */
static inline uint64_t fer_round_pow2(uint64_t n)
{
    uint64_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* ---- locks and waits: every one in csrc/ -----------------------------------------------------
 * Who runs where: on a robot computer the workers and the request thread (intake) may run
 * SCHED_FIFO, while the publisher, the timers and diagnostics run at normal priority, and both
 * kinds take the same mutexes. So every mutex below is priority-inheriting
 * (PTHREAD_PRIO_INHERIT, fer_lock_init): a normal-priority holder preempted by a CPU hog runs at
 * its real-time waiter's priority until it unlocks (test/test_realtime_locks.py).
 *   core->mu, mutex (PI): every fer_core_* call that reads or changes the core; the request
 *     thread (submit, staging_slot), the workers (wait, dispatch, prefix_done, step,
 *     output_space, finish, disable_lane, fer_exec_run's and fer_pass_run_done's step reports),
 *     the diagnostics timer (stats, cost_stats, snapshots, set_calibration / policy /
 *     cost_model) and shutdown. Held for bounded work only (fer.h).
 *   core->work_cv, condvar (CLOCK_MONOTONIC) on core->mu: idle workers wait in wait_for_work /
 *     worker_wait, timed; submit signals it on accept, shutdown broadcasts.
 *   core->bell.mu, mutex (PI), and bell.cv, condvar (CLOCK_MONOTONIC): the request thread and
 *     the workers ring it after releasing core->mu (fer_unlock_and_ring); the publisher holds it
 *     while it looks at the rings and waits on bell.cv in wait_outputs, timed; shutdown closes
 *     it. A standalone ring (fer_ring_create) has a doorbell of its own, made the same way.
 *   Order: the two mutexes never nest (the doorbell is rung after core->mu is released, and what
 *     the publisher calls, wait_outputs and pop_outcomes, never takes core->mu): no lock order.
 * Lock-free handoffs (no lock, no wait): the SPSC outcome rings (fer_ring.c: each side one
 *   acquire load of the other's index and one release store of its own; a full ring drops and
 *   counts, never blocks), qlen_hint (fer_core_queued, read without core->mu), the relaxed
 *   atomic flags and counters of the exec, serve, publisher and take loops (stop, pause, fault
 *   delay, progress), and fer_take.c's eventfd doorbell: the middleware's on-new-message callback
 *   (one of its threads) writes it, the one taking thread polls and reads it (the intake thread
 *   never waits on a lock a middleware thread holds).
 * Bounded sleeps and polls, no lock held: fer_serve.c's wait for ring space (50 us sleeps, up to
 *   output_wait_ns), fer_publish.c's pause (10 ms sleeps), fer_take.c's pause and doorbell poll
 *   (10 ms sleeps; a timed poll), fer_exec_run's fault delay (drills only). No spin lock.
 * Test and bench support only (tools/csrc/fer_bench.h, fer_rtprobe.h): fer_bench_ring_produce's
 *   sched_yield while a ring is full and fer_bench_ring_consume's ring wait (30 s); fer_rtprobe.c's
 *   two semaphores, its plain mutex and its medium thread's spin, each ended by a 2 s watchdog.
 */

/* A priority-inheriting mutex and a CLOCK_MONOTONIC condvar (FER_OK or FER_ESYS, nothing left
 * made); fini destroys both. */
int fer_lock_init(pthread_mutex_t *mu, pthread_cond_t *cv);
void fer_lock_fini(pthread_mutex_t *mu, pthread_cond_t *cv);
/* Absolute CLOCK_MONOTONIC time timeout_ns from now, saturating (for pthread timed waits). */
struct timespec fer_deadline_after(uint64_t timeout_ns);

/* ---- doorbell: wakes the publisher after ring commits ----------------------------------------
 * A mutex + condvar + counter, separate from the core mutex so the publisher never contends with
 * admission. Producers ring it after their release-store of a ring tail; the waiter re-checks the
 * rings under the doorbell mutex, so a commit between its check and its wait cannot be missed. */
struct fer_doorbell {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t rings;     /* commits signalled; guarded by mu (diagnostic only) */
    atomic_int closed;  /* set by shutdown: waits return at once */
};

int fer_doorbell_init(struct fer_doorbell *b);
void fer_doorbell_fini(struct fer_doorbell *b);
void fer_doorbell_ring(struct fer_doorbell *b);
void fer_doorbell_close(struct fer_doorbell *b);
/* Consumer: wait until ready(arg), the doorbell is closed, or timeout_ns passes; returns
 * ready(arg) as last seen. ready is evaluated under the doorbell mutex, so a commit rung after
 * the check always finds the waiter asleep (no lost wake-up). */
int fer_doorbell_wait(struct fer_doorbell *b, int (*ready)(void *), void *arg, uint64_t timeout_ns);

/* ---- SPSC ring (ck_ring / rte_ring shape) -----------------------------------------------------
 * Invariants:
 *   - head and tail are free-running uint64 counters (they never wrap in practice: 2^64 records);
 *     0 <= tail - head <= mask + 1; record i lives at recs[i & mask], its actions at
 *     slab[(i & mask) * action_len].
 *   - Only the consumer stores head; only the producer stores tail and dropped.
 *   - head and tail sit on separate cache lines (with each side's cached copy of the other's
 *     index) so the two threads do not false-share; the read-only fields sit on a third line.
 */
struct fer_ring {
    _Alignas(FER_CACHELINE) _Atomic uint64_t head; /* next record to read (consumer) */
    uint64_t tail_cache;                           /* consumer's last view of tail */

    _Alignas(FER_CACHELINE) _Atomic uint64_t tail; /* next record to write (producer) */
    uint64_t head_cache;                           /* producer's last view of head */
    _Atomic uint64_t dropped;                      /* pushes refused because full */

    _Alignas(FER_CACHELINE) uint64_t mask;         /* capacity - 1 */
    uint32_t action_len;
    int owns_bell;
    struct fer_outcome *recs;
    float *slab;
    struct fer_doorbell *bell;
};

/* Core-internal constructor: a ring sharing the core's doorbell. */
int fer_ring_init_shared(uint32_t capacity, uint32_t action_len, struct fer_doorbell *bell,
                         struct fer_ring **out);
/* Push without ringing the doorbell (the core rings once per call, after its mutex is released). */
int fer_ring_push_quiet(struct fer_ring *ring, const struct fer_outcome *rec, const float *actions);
/* Whether the ring holds a record (consumer side). */
int fer_ring_nonempty(struct fer_ring *ring);

/* ---- request slot ------------------------------------------------------------------------------
 * queue_capacity + workers + 1 slots exist. Invariants: state FREE <=> on the free stack or the
 * staging slot (exactly one FREE slot, core->staging, is off the stack: at most queue_capacity
 * are QUEUED and workers RUNNING, so one is always left for it); QUEUED <=> in queue[];
 * RUNNING <=> lanes[lane].slot == this slot. session is the index of a live session whose
 * `outstanding` counts this slot, and snext / sprev link the session's non-FREE slots (so
 * per-session work is O(its own requests), not O(queue)). cancelled only when RUNNING.
 * prefix_pending = two_phase while QUEUED; cleared by prefix_done while RUNNING. deadline_ns is
 * the effective one (§5.4: the window's end for a prefix), and from dispatch never later than
 * prefix_start + frozen_rows x action_period. The slot's
 * payload bytes (core->payload + id * payload_stride) are the caller's: the core never touches
 * them, it only guarantees that the slot is not reused before it is freed. */
enum fer_slot_state { FER_SLOT_FREE = 0, FER_SLOT_QUEUED = 1, FER_SLOT_RUNNING = 2 };

struct fer_slot {
    char session_id[FER_SESSION_ID_MAX];
    uint32_t session_id_len;
    uint32_t session;
    uint32_t retry_count;
    uint32_t retry_reason;
    uint32_t remaining_nfe;
    uint32_t nfe_done;
    uint32_t lane;
    uint32_t snext;     /* next / previous slot of the same session, FER_NONE at the ends */
    uint32_t sprev;
    uint8_t state;
    uint8_t tested;     /* passed the admission test: an EXPIRED end is a calibration miss */
    uint8_t cancelled;  /* a newer generation was accepted while this ran */
    uint8_t prefix_pending; /* two-phase: the prefix pass has not been reported yet */
    uint64_t sequence;
    uint64_t generation;
    uint64_t deadline_ns;
    uint64_t deadline_ros_ns;
    uint64_t noise_seed;
    uint64_t arrival_ns;
    uint64_t arrival_seq;
    uint64_t dispatch_ns;
    uint64_t prefix_start_ns;     /* §5.4 real-time chunking; prefix_rows 0 = a plain request */
    uint64_t prefix_start_ros_ns;
    uint64_t action_period_ns;
    uint32_t prefix_rows;
    uint32_t frozen_rows;         /* fixed at dispatch (fer_lane.c) */
    float *obs;         /* obs_dim floats inside core->obs_slab */
    char client_id[FER_SESSION_ID_MAX]; /* §7.1: the client charged (session_id if none sent) */
    uint32_t client_id_len;
    uint32_t client;    /* §7.1: its tracked client (fair_share on), else FER_NONE */
    uint8_t reject_reason; /* FER_REJECT_FAIR_SHARE once picked as a fair-share victim */
};

/* What every public view of a slot carries (struct fer_work, fer_queued_item, fer_lane_state all
 * have these fields): copy them from slot id of core c into *dst. */
#define FER_SLOT_VIEW(dst, c, id)                                                                \
    do {                                                                                         \
        const struct fer_slot *v_ = &(c)->slots[(id)];                                           \
        memcpy((dst)->session_id, v_->session_id, v_->session_id_len);                           \
        (dst)->session_id_len = v_->session_id_len;                                              \
        (dst)->slot = (id);                                                                      \
        (dst)->remaining_nfe = v_->remaining_nfe;                                                \
        (dst)->sequence = v_->sequence;                                                          \
        (dst)->generation = v_->generation;                                                      \
        (dst)->deadline_ns = v_->deadline_ns;                                                    \
    } while (0)

/* ---- session -----------------------------------------------------------------------------------
 * Invariants: in_use <=> reachable from the hash table; generation = highest accepted generation
 * (the freshness watermark; eviction forgets it); outstanding = number of QUEUED or RUNNING slots
 * of this session, and head the first of them (FER_NONE if none); touch = value of
 * core->touch_seq at the last acceptance (LRU order, unique). */
struct fer_session {
    char id[FER_SESSION_ID_MAX];
    uint32_t len;
    uint32_t outstanding;
    uint32_t head;
    uint64_t hash;
    uint64_t generation;
    uint64_t touch;
    uint64_t last_seen_ns;
    uint8_t in_use;
};

/* ---- client (docs/design.md §7.1, fer_share.c) -----------------------------------------------
 * Kept whether fair_share is on or off (it is live). Invariants: in_use <=> counted in
 * core->nclients; committed = the sum of remaining_nfe over the QUEUED and RUNNING slots whose
 * client is this one, outstanding their number (committed > 0 implies outstanding > 0); weight =
 * the first client_weights rule matching id, else 1 (set at creation and re-set for every client
 * by fer_core_set_client_weights); core->share_total = the sum of committed over all
 * clients and core->share_weight = the sum of weight over clients with committed > 0; touch =
 * core->client_touch at its last acceptance (LRU order, unique). */
struct fer_client {
    char id[FER_SESSION_ID_MAX];
    uint32_t len;
    uint32_t weight;
    uint32_t outstanding;
    uint8_t in_use;
    uint64_t hash;
    uint64_t committed;
    uint64_t touch;
    uint64_t last_active_ns;
    uint64_t admitted_nfe;
    uint64_t fair_rejections;
};


/* ---- lane --------------------------------------------------------------------------------------
 * nlanes = workers x batch_slots lanes; lane l belongs to worker l / batch_slots (docs/design.md
 * §5.1) and its outcomes go to ring l / batch_slots + 1. slot == FER_NONE when idle. A dead lane
 * (alive == 0) is idle and never dispatched again. */
struct fer_lane {
    uint32_t slot;
    uint8_t alive;
};

/* ---- the core ----------------------------------------------------------------------------------
 * Everything below `mu` is guarded by it except rings (SPSC, see above) and pop_cursor (consumer
 * only). queue[0..qlen) holds QUEUED slot ids in EDF order (head first); qjobs[i] mirrors the
 * deadline, remaining NFE and pending prefix of queue[i], so the admission simulation reads one
 * contiguous array instead of chasing slots. */
struct fer_core {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;     /* signalled on enqueue and on shutdown */
    atomic_int shutdown;
    int sync_ready;             /* mu, work_cv and bell initialised (for destroy) */

    struct fer_config cfg;

    struct fer_slot *slots;
    uint32_t nslots;
    uint32_t *free_slots;       /* stack */
    uint32_t nfree;
    uint32_t staging;           /* free slot the next accepted request takes (not on the stack) */
    float *obs_slab;
    uint8_t *payload;           /* nslots x payload_stride bytes, cache-line aligned, or NULL */
    size_t payload_stride;      /* payload_bytes rounded up to FER_CACHELINE */

    uint32_t *queue;
    struct fer_admit_job *qjobs;
    uint32_t qlen;
    atomic_uint qlen_hint;      /* qlen, stored after every change, read without mu (queued) */

    struct fer_session *sessions;
    uint32_t *session_free;     /* stack of unused session indices */
    uint32_t nsession_free;
    uint32_t *session_hash;     /* open addressing, linear probing: session index + 1, 0 = empty */
    uint64_t session_hash_mask;

    struct fer_lane *lanes;     /* nlanes = workers x batch_slots */
    /* per worker: the instant up to which its busy time has been charged to a step (§5.2 block
     * mean): its last step's end, moved on to its last prefix pass's end and, when it takes work
     * with every lane idle, to that work's arrival if later; 0 before its first */
    uint64_t *charged_ns;
    /* per worker: the turnover its next steps still pay (§5.2, struct fer_turnover) */
    struct fer_turnover *turnover;
    uint32_t nlanes;
    uint32_t lanes_alive;

    /* lifecycle and model swap (fer.h): under mu */
    uint32_t refusing;          /* set_accepting(0): valid arrivals are REJECTED_CAPACITY */
    uint32_t dispatch_held;     /* hold_dispatch(1): no worker dispatches */
    uint64_t reserved_until;    /* admission counts every lane busy until then (0: none) */

    struct fer_ring **rings;    /* workers + 1: ring 0 = admission, ring w + 1 = worker w's lanes */
    uint32_t nrings;
    struct fer_doorbell bell;
    uint32_t pop_cursor;        /* consumer only: next ring to look at */

    /* admission scratch (queue_capacity + 1 jobs, nlanes lanes, a skip flag per slot that is
     * always all-zero between calls); used only under mu */
    struct fer_admit_job *jobs;
    uint8_t *skip;
    uint64_t *lane_start;
    uint64_t *lane_scratch;

    uint64_t arrival_seq;
    uint64_t touch_seq;
    struct fer_stats st;        /* counters; gauges are filled in by fer_core_stats */
    struct fer_cost cost;       /* docs/design.md §5.2 cost model: measured NFE tail (fer_cost.c) */
    struct fer_cost prefix_cost; /* the same for prefix passes (two_phase) */

    /* §7.1 fair share (fer_share.c): max_clients entries, allocated at create */
    struct fer_client *clients;
    uint32_t *client_hash;      /* index of clients, as session_hash (fer_index_insert) */
    uint64_t client_hash_mask;
    uint32_t nclients;
    uint32_t nrules;
    uint64_t client_touch;
    uint64_t share_total;       /* sum of committed over clients */
    uint64_t share_weight;      /* sum of weight over clients with committed > 0 */
    struct fer_client_weight rules[FER_WEIGHT_RULES];
};

/* The ring (worker w + 1) that lane's outcomes go to; lane -1 (decided by submit) is ring 0. */
static inline uint32_t fer_lane_ring(const struct fer_core *c, int32_t lane)
{
    return lane < 0 ? 0 : (uint32_t)lane / c->cfg.batch_slots + 1;
}

/* ---- what work costs (docs/design.md §5, §5.2), core->mu held ---------------------------- */

/* Wall time of ns of compute on a worker that cedes its CPU (docs/design.md §5.3): ns plus
 * ceil(ns x cede_ns / cede_every_ns), saturating; ns itself when it never cedes. Summed over a
 * lane's work this is within one cede_ns of the truth, which the admission reserve adds. */
static inline uint64_t fer_with_cede(const struct fer_core *c, uint64_t ns)
{
    uint64_t cede = c->cfg.cede_ns, every = c->cfg.cede_every_ns;

    if (cede == 0 || ns == 0) /* config_valid: cede_ns > 0 implies every in 1 .. 1 s */
        return ns;
    return fer_sat_add(ns, fer_sat_add(fer_sat_mul(ns / every, cede),
                                       (ns % every * cede + every - 1) / every));
}

/* The reserve added to every finish time admission simulates: admission_reserve_ns, plus one
 * pause of a pacing worker (§5.3). */
static inline uint64_t fer_finish_reserve(const struct fer_core *c)
{
    return fer_sat_add(c->cfg.admission_reserve_ns, c->cfg.cede_ns);
}

/* §5.4: how many prefix rows a chunk can freeze at most, min(prefix_rows, rtc_max_delay); the
 * window closes when the robot has executed that many. */
static inline uint32_t fer_rtc_window_rows(const struct fer_core *c, uint32_t prefix_rows)
{
    return prefix_rows < c->cfg.rtc_max_delay ? prefix_rows : c->cfg.rtc_max_delay;
}

/* §5.4: when the robot starts prefix row `row` (start + row x period, saturating), as a deadline:
 * never 0, which means none; a row at the clock's origin has started. */
static inline uint64_t fer_rtc_row_start(uint64_t start_ns, uint32_t row, uint64_t period_ns)
{
    uint64_t at = fer_sat_finish(start_ns, row, period_ns);

    return at != 0 ? at : 1;
}

/* ns per NFE admission and dispatch assume at now: static nfe_ns, adaptive max(nfe_ns, tail),
 * with the worker's ceded share. */
static inline uint64_t fer_nfe_in_use(const struct fer_core *c, uint64_t now)
{
    return fer_with_cede(c, fer_cost_in_use(&c->cost, c->cfg.nfe_ns, now));
}

/* ns per NFE the expiry check at dispatch assumes at now: static nfe_ns, adaptive
 * max(nfe_ns, quantile tail) (fer_cost_at_dispatch says why not the block mean), ceded share
 * included. */
static inline uint64_t fer_nfe_at_dispatch(const struct fer_core *c, uint64_t now)
{
    return fer_with_cede(c, fer_cost_at_dispatch(&c->cost, c->cfg.nfe_ns, now));
}

/* ns per prefix pass admission and dispatch assume at now: 0 for single-graph models. */
static inline uint64_t fer_prefix_in_use(const struct fer_core *c, uint64_t now)
{
    return c->cfg.two_phase
               ? fer_with_cede(c, fer_cost_in_use(&c->prefix_cost, c->cfg.prefix_ns, now))
               : 0;
}

/* When work begun at start ends: its pending prefix (if any) then n NFEs, saturating. With no
 * prefix pending this is exactly fer_sat_finish(start, n, nfe). */
static inline uint64_t fer_work_finish(uint64_t start, uint32_t prefix_pending, uint64_t prefix,
                                       uint64_t n, uint64_t nfe)
{
    return fer_sat_finish(prefix_pending ? fer_sat_add(start, prefix) : start, n, nfe);
}

/* Whether worker w holds work on any of its lanes (it is then inside a step, or about to be);
 * asked about one of w's idle lanes, so with B = 1 the answer is no (mu held). */
static inline int fer_worker_stepping(const struct fer_core *c, uint32_t w)
{
    uint32_t b = c->cfg.batch_slots, l;

    if (b == 1)
        return 0; /* its only lane is the idle one being asked about */
    for (l = w * b; l < (w + 1) * b; l++)
        if (c->lanes[l].slot != FER_NONE)
            return 1;
    return 0;
}

/* ---- calls shared between the core's files (all with core->mu held unless noted) ---------- */

/* fer_session.c */
uint64_t fer_session_hash(const char *id, uint32_t len);
/* An open-addressing index (linear probing) of entries 0..n-1 stored as e + 1 (0 = empty), at
 * least twice as many buckets as entries: insert entry e of hash h; remove it (backward shift,
 * hash_of(c, e) giving each entry's hash). Sessions and clients (§7.1) are indexed so. */
void fer_index_insert(uint32_t *tab, uint64_t mask, uint64_t h, uint32_t e);
void fer_index_remove(uint32_t *tab, uint64_t mask, uint64_t h, uint32_t e,
                      uint64_t (*hash_of)(const struct fer_core *, uint32_t),
                      const struct fer_core *c);
/* Index of the tracked session (id, len) with hash h, or FER_NONE. */
uint32_t fer_session_find(struct fer_core *c, const char *id, uint32_t len, uint64_t h);
/* Least recently accepted session with no queued or running work, or FER_NONE. */
uint32_t fer_session_evictable(struct fer_core *c);
void fer_session_evict(struct fer_core *c, uint32_t si, uint64_t now);
/* A new session for r's id (a free index must exist), generation r->generation. */
uint32_t fer_session_create(struct fer_core *c, const struct fer_request *r, uint64_t h);
/* Take the staging slot, fill it from r, link it into session si, and stage a new free slot (one
 * must exist: the caller has freed any victim first). Not yet queued. */
uint32_t fer_slot_take(struct fer_core *c, const struct fer_request *r, uint32_t si, uint64_t now,
                       int tested);
/* Unlink slot id from its session and push it on the free stack. */
void fer_slot_free(struct fer_core *c, uint32_t id);

/* Whether accepting a request of session si (FER_NONE: untracked) with generation gen cancels
 * slot s: the freshness rule of docs/design.md §4 step 8. */
static inline int fer_cancels(const struct fer_slot *s, uint32_t si, uint64_t gen)
{
    return si != FER_NONE && s->session == si && s->generation < gen;
}

/* fer_queue.c */
/* Position a request with this deadline and arrival_seq would take (after every entry it does
 * not precede). */
uint32_t fer_queue_position(const struct fer_core *c, uint64_t deadline, uint64_t seq);
/* Index of queued slot id. O(log queue). */
uint32_t fer_queue_find(const struct fer_core *c, uint32_t id);
void fer_queue_insert(struct fer_core *c, uint32_t id);
/* Remove n entries from position pos on. */
void fer_queue_remove(struct fer_core *c, uint32_t pos, uint32_t n);
/* Remove queued slot id (found by binary search). */
void fer_queue_unlink(struct fer_core *c, uint32_t id);

/* fer_admit.c */
/* §5: whether x (request r of session si, displacing the nvictims queued slots victims[]) is
 * admissible now. *miss (when not NULL) gets the index of the first simulated job that misses,
 * and *xq x's position in the queue (the jobs are the retained queue with x before entry *xq). */
int fer_admission_test(struct fer_core *c, const struct fer_request *r, uint32_t si,
                       const uint32_t *victims, uint32_t nvictims, uint64_t now, uint32_t *miss,
                       uint32_t *xq);

/* fer_share.c (§7.1): the fair share per client; clients are tracked with fair_share off too. */
/* Whether the glob pattern p matches s (fnmatch's *, ?, [...] and [!...], case-sensitive). */
int fer_glob_match(const char *p, uint32_t plen, const char *s, uint32_t slen);
/* The id a request is charged to: client_id, or session_id when it sent none. */
static inline void fer_client_key(const struct fer_request *r, const char **id, uint32_t *len)
{
    *id = r->client_id_len ? r->client_id : r->session_id;
    *len = r->client_id_len ? r->client_id_len : r->session_id_len;
}
/* The tracked client of r, or FER_NONE. */
uint32_t fer_client_find(const struct fer_core *c, const struct fer_request *r);
/* Room for r's new client: FER_OK (*evict = an idle client to forget first, or FER_NONE), or
 * FER_EFULL when every tracked client has work (fair_share on: REJECTED_CAPACITY; off: accepted
 * untracked). */
int fer_client_room(const struct fer_core *c, uint32_t *evict);
/* Accepting r: forget evict (if not FER_NONE), create r's client if ki is FER_NONE, charge slot
 * id to it. Returns the client. Not called for a request accepted untracked (slot client
 * FER_NONE). */
uint32_t fer_client_accept(struct fer_core *c, const struct fer_request *r, uint32_t ki,
                           uint32_t evict, uint32_t id, uint64_t now);
/* n NFE of slot s are no longer owed (a step ran, or the slot is freed with n left). */
void fer_client_uncommit(struct fer_core *c, const struct fer_slot *s, uint64_t n);
/* Slot s leaves its client (its remaining NFE uncommitted). */
void fer_client_detach(struct fer_core *c, const struct fer_slot *s);
/* The state a share is judged on: the core's, with x (the request being decided: client xk, or
 * FER_NONE for a client not tracked yet, of weight xweight, xnfe NFE) added and the queued slots
 * planned to go (up to FER_SHARE_VICTIMS + 1: cut[0..n)) removed. */
struct fer_share_cut {
    uint32_t n;
    uint32_t slots[FER_SHARE_VICTIMS + 1];
    uint32_t xk;
    uint32_t xweight;
    uint64_t xnfe;
};
/* The weight r's client has, or gets when it is created: the first client_weights rule matching
 * its id, else 1. */
uint32_t fer_client_weight(const struct fer_core *c, const struct fer_request *r, uint32_t ki);
/* Whether client ki (FER_NONE: x's untracked client) is over its weighted share in the state
 * cut describes: committed x (sum of the active clients' weights) > weight x (all committed),
 * exactly (128-bit); a client with nothing committed is not. */
int fer_client_over(const struct fer_core *c, uint32_t ki, const struct fer_share_cut *cut);
/* A queued slot at index < limit, retained (not cancelled by r of session si, not in cut), whose
 * client is over its share in the state cut describes; FER_NONE if there is none. One of the
 * client using the most of its weight (committed / weight) first. Then, xq FER_NONE: the latest
 * in EDF order. Else (x sits before queue entry xq): one ahead of x first (removing it moves x
 * and everything after it forward), then the one with the most remaining NFE (the fewest
 * victims), then the latest. */
uint32_t fer_share_victim(const struct fer_core *c, const struct fer_request *r, uint32_t si,
                          const struct fer_share_cut *cut, uint32_t limit, uint32_t xq);
/* The queue index of simulated job m (>= x's index), given x before queue entry xq: limit for
 * fer_share_victim (x itself: xq; a queued job: its index + 1). */
uint32_t fer_share_job_limit(const struct fer_core *c, const struct fer_request *r, uint32_t si,
                             const struct fer_share_cut *cut, uint32_t xq, uint32_t m);

/* fer_output.c: outcomes are pushed under mu into the calling thread's own ring, quietly; each
 * returns 1 if it committed a record (the doorbell must be rung once the call is done). */
/* why: FER_REJECT_* of a REJECTED_CAPACITY (ignored for other codes). */
int fer_emit_request(struct fer_core *c, const struct fer_request *r, uint32_t code, uint32_t why,
                     uint64_t now);
/* For work holding slot id, decided by lane (-1: by submit); frees the slot (and its lane, if it
 * ran). act: action_len floats when code is FER_INFERENCE, else NULL. */
int fer_emit_slot(struct fer_core *c, uint32_t id, uint32_t code, uint64_t now, int32_t lane,
                  const float *act);
/* Release mu, then ring the doorbell if the call committed anything (rang != 0): the publisher
 * is woken after the mutex is free, so it never waits on admission. */
void fer_unlock_and_ring(struct fer_core *c, int rang);

/* ---- relay pool (fer_pool.c), for the intake (fer_intake.c) and the publisher (fer_publish.c) ---
 * route: fer_pool_role with the deciding thread's now (count: not_owner / unowned, and the
 *   owned_sessions estimate). run_takeovers: the deciding thread; fn re-decides each standby
 *   entry of a posted dead key (oldest first), which is out of the table before fn sees it; how
 *   many. tick: the deciding thread, each pass: expiry, at most every lease / 4. set_wake: the
 *   eventfd fer_pool_takeover rings (-1 none). */
struct fer_pool;
typedef void (*fer_pool_redecide_fn)(void *ctx, const uint8_t *cdr, uint64_t len,
                                     uint64_t arrival_ns);
int fer_pool_route(struct fer_pool *p, const uint8_t *sid, uint32_t sid_len, uint64_t digest_hash,
                   int64_t origin_ns, uint64_t now_ns, uint32_t count, uint64_t *owner_key,
                   uint64_t *successor_key);
/* route_wire: route for the deciding thread (counted), the session id as the CDR string's bytes
 * (fer_request_route: it ends at its first NUL), hashed only when the memo does not hold it. */
int fer_pool_route_wire(struct fer_pool *p, const uint8_t *sid, uint32_t sid_bytes,
                        uint64_t digest_hash, int64_t origin_ns, uint64_t now_ns,
                        uint64_t *owner_key, uint64_t *successor_key);
uint64_t fer_pool_run_takeovers(struct fer_pool *p, fer_pool_redecide_fn fn, void *ctx);
/* the deciding thread: decide every held standby entry that is due at now_ns and unanswered
 * (fer_pool.h, "Hold, do not drop"); how many */
uint64_t fer_pool_run_held(struct fer_pool *p, uint64_t now_ns, fer_pool_redecide_fn fn,
                           void *ctx);
/* the deciding thread: decide every queued handover to this member (fer_pool_spill_in) */
uint64_t fer_pool_run_spills(struct fer_pool *p, fer_pool_redecide_fn fn, void *ctx);
void fer_pool_tick(struct fer_pool *p, uint64_t now_ns);
void fer_pool_set_wake(struct fer_pool *p, int fd);

/* fer_wire.c, for fer_pool.c and fer_publish.c: an InferenceRequest's session_id and sequence
 * read in place (0, or -1 as fer_request_parse_head); and an ActionMessage (the generated struct,
 * filled) as rmw_serialize writes it into buf[0..cap) (the byte count, or 0: no serializer set,
 * or cap too small). */
int fer_wire_request_key(const uint8_t *buf, uint64_t len, const uint8_t **sid, uint32_t *sid_len,
                         uint64_t *sequence);
uint64_t fer_wire_serialize_action(const void *msg, uint8_t *buf, uint64_t cap);

/* fer_wire.c, for fer_intake.c: what a pool member's ownership check reads of an
 * InferenceRequest, in place and with no scan. A string is its bytes as the CDR length counts
 * them (its terminating NUL included when the writer put one); the string itself ends at its
 * first NUL, which is not looked for here. 0, or -1 as fer_request_parse_head. */
struct fer_request_route {
    const uint8_t *session_id;
    uint32_t session_id_bytes;
    const uint8_t *model_digest;
    uint32_t model_digest_bytes;
    int32_t origin_stamp_sec;
    uint32_t origin_stamp_nanosec;
    int32_t deadline_sec;
    uint32_t deadline_nanosec;
};
int fer_request_parse_route(const uint8_t *buf, uint64_t len, struct fer_request_route *r);

#endif /* FER_INTERNAL_H */
