/*
 * fer_internal.h - private structures of the scheduling core. Not part of the cdef.
 */
#ifndef FER_INTERNAL_H
#define FER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fer.h"
#include "fer_sat.h"
#include "fer_cost.h"

#define FER_CACHELINE 64
#define FER_NONE UINT32_MAX

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

/* Absolute CLOCK_MONOTONIC time timeout_ns from now, saturating (for pthread timed waits). */
struct timespec fer_deadline_after(uint64_t timeout_ns);

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
 * queue_capacity + workers slots exist. Invariants: state FREE <=> on the free stack;
 * QUEUED <=> in queue[]; RUNNING <=> lanes[lane].slot == this slot. session is the index of a
 * live session whose `outstanding` counts this slot, and snext / sprev link the session's
 * non-FREE slots (so per-session work is O(its own requests), not O(queue)). cancelled only
 * when RUNNING. */
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
    uint64_t sequence;
    uint64_t generation;
    uint64_t deadline_ns;
    uint64_t deadline_ros_ns;
    uint64_t noise_seed;
    uint64_t arrival_ns;
    uint64_t arrival_seq;
    uint64_t dispatch_ns;
    float *obs;         /* obs_dim floats inside core->obs_slab */
};

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

/* ---- lane --------------------------------------------------------------------------------------
 * slot == FER_NONE when idle. A dead lane (alive == 0) is idle and never dispatched again. */
struct fer_lane {
    uint32_t slot;
    uint8_t alive;
};

/* ---- the core ----------------------------------------------------------------------------------
 * Everything below `mu` is guarded by it except rings (SPSC, see above) and pop_cursor (consumer
 * only). queue[0..qlen) holds QUEUED slot ids in EDF order (head first); qjobs[i] mirrors the
 * deadline and remaining NFE of queue[i], so the admission simulation reads one contiguous
 * array instead of chasing slots. */
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
    float *obs_slab;

    uint32_t *queue;
    struct fer_admit_job *qjobs;
    uint32_t qlen;

    struct fer_session *sessions;
    uint32_t *session_free;     /* stack of unused session indices */
    uint32_t nsession_free;
    uint32_t *session_hash;     /* open addressing, linear probing: session index + 1, 0 = empty */
    uint64_t session_hash_mask;

    struct fer_lane *lanes;
    uint32_t lanes_alive;

    struct fer_ring **rings;    /* workers + 1: ring 0 = admission, ring i + 1 = lane i */
    uint32_t nrings;
    struct fer_doorbell bell;
    uint32_t pop_cursor;        /* consumer only: next ring to look at */

    /* admission scratch (queue_capacity + 1 jobs, workers lanes, a skip flag per slot that is
     * always all-zero between calls); used only under mu */
    struct fer_admit_job *jobs;
    uint8_t *skip;
    uint64_t *lane_start;
    uint64_t *lane_scratch;

    uint64_t arrival_seq;
    uint64_t touch_seq;
    struct fer_stats st;        /* counters; gauges are filled in by fer_core_stats */
    struct fer_cost cost;       /* DESIGN §5.2 cost model: measured NFE tail (fer_cost.c) */
};

#endif /* FER_INTERNAL_H */
