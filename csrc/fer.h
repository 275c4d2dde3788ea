/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer.h - FlowEdge Relay scheduling core: the public header, the runtime contract.
 *
 * docs/design.md §4-8 in C: sessions, a bounded EDF queue, W worker lanes, the calibrated
 * admission test, dispatch, and single-producer/single-consumer outcome rings. Everything here is
 * called by flowedge_relay/core.py (or, for fer_admit_first_miss, checked directly by the tests);
 * benchmark and stress drivers live apart, in the tools package (tools/csrc/fer_bench.h).
 *
 * This file is read verbatim by flowedge_relay/_build_core.py into ffibuilder.cdef(). Keep it
 * cdef-parsable: declarations and plain integer #defines only, no #include, no include guard,
 * no inline code, no attributes. C users include <stdint.h> first (fer_internal.h does), and
 * include this header once per translation unit.
 *
 * Arguments: every call that returns int answers FER_EINVAL, with no side effect, for a NULL
 * core / ring / output pointer, a lane >= workers x batch_slots, a worker >= workers, or an
 * out-of-range value it documents;
 * fer_core_destroy and fer_ring_destroy accept NULL.
 *
 * Lanes and batch slots (docs/design.md §5.1): the core has workers x batch_slots lanes (W x B);
 * worker w owns lanes [w*B, (w+1)*B), one per batch slot, and is the single producer of ring
 * w + 1, which carries the outcomes of all its lanes. With batch_slots = 1, lane i is worker i.
 *
 * Threads (docs/core-api.md): one request thread calls fer_core_staging_slot / fer_core_submit
 * (and writes the staging slot's payload); worker w calls fer_core_wait_for_work / dispatch /
 * prefix_done / step / output_space / finish for its own lanes and fer_core_worker_wait /
 * fer_core_dispatch_worker for itself; one publisher thread calls
 * fer_core_wait_outputs / fer_core_pop_outcomes; any thread may call the rest.
 * One pthread mutex inside the core guards sessions, queue, lanes and counters; every call holds
 * it for O(queue_capacity + workers + max_sessions) work at most. The rings are lock-free SPSC and
 * the consumer never takes that mutex. Nothing allocates after fer_core_create.
 *
 * Times are uint64 nanoseconds of CLOCK_MONOTONIC, passed in explicitly as `now` so that tests can
 * run in virtual time. A deadline of 0 means "none". Time arithmetic saturates at UINT64_MAX,
 * and a saturated result means "later than any representable time": it meets no deadline.
 */

/* ---- limits ---------------------------------------------------------------------------------- */
#define FER_SESSION_ID_MAX 64
#define FER_MAX_WORKERS 64
#define FER_MAX_BATCH 64 /* batch_slots per worker (docs/design.md §5.1) */
#define FER_CEDE_MAX_NS 1000000000ull /* cede_ns and cede_every_ns (docs/design.md §5.3) */
#define FER_RTC_MAX_ROWS 4096 /* rtc_max_delay and a request's prefix_rows (§5.4) */
#define FER_MAX_QUEUE 65536
#define FER_MAX_SESSIONS 65536
#define FER_MAX_RING 1048576
#define FER_MAX_PAYLOAD 1073741824 /* payload_bytes per slot */
#define FER_NUM_CODES 6
#define FER_RETRY_COUNT_BUCKETS 8
#define FER_RETRY_REASONS 6
#define FER_MAX_CLIENTS 4096 /* max_clients (docs/design.md §7.1) */
#define FER_WEIGHT_RULES 32  /* client_weights patterns */
#define FER_WEIGHT_MAX 1000000
#define FER_SHARE_VICTIMS 8  /* over-share queued requests one decision may displace */

/* ---- status codes: >= 0 success (some calls return a value), < 0 error ----------------------- */
#define FER_OK 0
#define FER_EINVAL -1
#define FER_ENOMEM -2
#define FER_ESTATE -3
#define FER_EFULL -4
#define FER_ESYS -5
#define FER_ENOTSUP -6 /* the middleware or library does not offer what the call needs */

/* ---- outcome codes (same values as ActionMessage) -------------------------------------------- */
#define FER_INFERENCE 0
#define FER_REJECTED_STALE 1
#define FER_REJECTED_DEADLINE 2
#define FER_REJECTED_CAPACITY 3
#define FER_EXPIRED 4
#define FER_INFERENCE_FAILED 5 /* the computation raised or its result was not finite */

/* ---- why work ended INFERENCE_FAILED (fer_core_fail's cause) ---------------------------------- */
#define FER_FAIL_NON_FINITE 0
#define FER_FAIL_RUNTIME_ERROR 1
#define FER_FAIL_CAUSES 2

/* ---- reject_reason of a REJECTED_CAPACITY outcome (ActionMessage.REJECT_*) -------------------- */
#define FER_REJECT_NONE 0
#define FER_REJECT_CAPACITY 1
#define FER_REJECT_FAIR_SHARE 2

/* ---- decisions returned by fer_core_submit: an outcome code, or one of these ---------------- */
#define FER_ACCEPTED 0
#define FER_COALESCED 6 /* after every outcome code */
#define FER_SPILLED 7   /* req.spill set: it would be REJECTED_CAPACITY; nothing emitted, the
                         * pool hands it to the session's successor (docs/design.md §13.5) */

/* ---- fer_core_step results ------------------------------------------------------------------- */
#define FER_STEP_CONTINUE 0
#define FER_STEP_DONE 1
#define FER_STEP_STOP_STALE 2
#define FER_STEP_STOP_EXPIRED 3

/* ---- age_gate (docs/design.md §6) ------------------------------------------------------------ */
#define FER_AGE_GATE_OFF 0
#define FER_AGE_GATE_RETRIES 1
#define FER_AGE_GATE_ALL 2

/* ---- cost_model (docs/design.md §5.2) -------------------------------------------------------- */
#define FER_COST_STATIC 0
#define FER_COST_ADAPTIVE 1

/*
 * Configuration, fixed at create except the fields fer_core_set_calibration / set_policy change.
 * Invariants checked by fer_core_create: 1 <= workers <= FER_MAX_WORKERS,
 * 1 <= queue_capacity <= FER_MAX_QUEUE, 1 <= max_sessions <= FER_MAX_SESSIONS, max_nfe >= 1,
 * 1 <= ring_capacity <= FER_MAX_RING (rounded up to a power of two), age_gate <= 2,
 * cost_model <= 1, cost_quantile_ppm <= 1000000 (cost_window_ns 0 = 1 s, cost_quantile_ppm 0 =
 * 900000; fer_core_get_config reports the effective values), two_phase <= 1,
 * payload_bytes <= FER_MAX_PAYLOAD, batch_slots <= FER_MAX_BATCH (0 = 1), cede_ns and
 * cede_every_ns <= FER_CEDE_MAX_NS, cede_every_ns > 0 when cede_ns > 0,
 * rtc_max_delay <= FER_RTC_MAX_ROWS.
 *
 * Batch slots (docs/design.md §5.1): with batch_slots = B each worker advances up to B requests
 * in lock step, one batched model call per step. nfe_ns is then the cost of one B-row step, and
 * admission simulates W x B lanes each advancing one NFE per nfe_ns: conservative (a step with
 * fewer rows costs no more than a full one) and exactly the plain lane simulation at B = 1.
 *
 * Two-phase models (docs/design.md §5, §10): with two_phase = 1 every request pays one prefix pass
 * before its first NFE; its cost is prefix_ns (while the prefix has not run) + remaining_nfe x
 * nfe_ns in admission, dispatch expiry and lane start times. With two_phase = 0 (or prefix_ns = 0)
 * the arithmetic is exactly the single-graph one. prefix_ns counts only while nfe_ns > 0 (admission
 * on), like everything calibrated.
 *
 * Slots: queue_capacity + workers x batch_slots + 1 request slots exist; one of them is always free and
 * reserved for the request thread (the staging slot, fer_core_staging_slot), so a request's
 * payload can be written into the slot it will occupy before submit decides on it.
 */
struct fer_config {
    uint32_t workers;                    /* W lanes */
    uint32_t queue_capacity;             /* queued (not running) requests */
    uint32_t max_sessions;               /* tracked sessions; idle ones are evicted when full */
    uint32_t max_nfe;                    /* largest remaining_nfe accepted by submit */
    uint32_t obs_dim;                    /* observation floats copied into the core at submit */
    uint32_t action_len;                 /* floats per INFERENCE outcome */
    uint32_t ring_capacity;              /* records per outcome ring */
    uint32_t reject_if_retry_count_gte;  /* retry_count >= this makes a request a retry (§6) */
    uint32_t age_gate;                   /* FER_AGE_GATE_* */
    uint32_t cost_model;                 /* FER_COST_*: admit with nfe_ns, or max(nfe_ns, tail) */
    uint64_t nfe_ns;                     /* calibrated ns per NFE; 0 = admission test off (§5) */
    uint64_t admission_reserve_ns;       /* safety reserve added to every finish time */
    uint64_t reject_if_queue_age_ns_gte; /* 0 = off */
    uint64_t queue_timeout_ns;           /* 0 = off: queued longer than this -> rejected at dispatch */
    uint64_t session_idle_ns;            /* evicting a session seen more recently is counted early */
    uint64_t cost_window_ns;             /* window of the observed NFE tail (§5.2); 0 = 1 s */
    uint32_t cost_quantile_ppm;          /* which quantile is the tail, parts per million */
    uint32_t _pad;
    uint32_t two_phase;                  /* 1: each request pays prefix_ns before its first NFE */
    uint32_t payload_bytes;              /* per-request payload bytes in each slot; 0 = none */
    uint64_t prefix_ns;                  /* calibrated ns of one prefix pass (two_phase only) */
    uint32_t batch_slots;                /* B lanes per worker (§5.1); 0 = 1 */
    uint32_t rtc_max_delay;              /* §5.4: most frozen rows the policy was trained for;
                                          * 0 = real-time chunking off (no prefix accepted) */
    uint64_t cede_ns;                    /* §5.3: a worker pauses this long after each */
    uint64_t cede_every_ns;              /* cede_every_ns of compute; 0 = never (both <= 1 s) */
    uint32_t fair_share;                 /* §7.1: 1 = weighted fair share per client (live) */
    uint32_t max_clients;                /* §7.1: tracked clients (0 = 64) */
};

/* A validated request, times already on the monotonic clock. Copied into the core by submit.
 *
 * Real-time chunking (docs/design.md §5.4): prefix_rows > 0 says the robot executes the rows of
 * its current chunk from prefix_start_ns on, one per action_period_ns, while this runs. Valid only
 * with rtc_max_delay > 0, action_period_ns > 0 and prefix_rows <= FER_RTC_MAX_ROWS. Admission and
 * expiry then use the earlier of deadline_ns and prefix_start_ns + min(prefix_rows,
 * rtc_max_delay) x action_period_ns (the chunk is useless after that), and from dispatch on the
 * earlier still prefix_start_ns + frozen_rows x action_period_ns (the robot switches at that row);
 * deadline_ros_ns is still echoed untouched. prefix_rows = 0: a plain request, the other three
 * fields ignored. */
struct fer_request {
    char session_id[FER_SESSION_ID_MAX]; /* not NUL-terminated; session_id_len bytes */
    uint32_t session_id_len;             /* 0..FER_SESSION_ID_MAX */
    uint32_t retry_count;
    uint32_t retry_reason;               /* 0..FER_RETRY_REASONS-1 */
    uint32_t remaining_nfe;              /* 1..max_nfe */
    uint64_t sequence;
    uint64_t generation;
    uint64_t origin_ns;                  /* producer's first issue of this (session, sequence) */
    uint64_t deadline_ns;                /* monotonic; 0 = none */
    uint64_t deadline_ros_ns;            /* echoed back untouched */
    uint64_t noise_seed;
    uint64_t prefix_start_ns;            /* monotonic: when prefix row 0 executes */
    uint64_t prefix_start_ros_ns;        /* echoed back untouched (chunk_start) */
    uint64_t action_period_ns;           /* time per action row */
    uint32_t prefix_rows;                /* 0 = a plain request */
    uint32_t spill;                      /* a pool owner's spill (docs/design.md §13.5): 1 makes
                                          * a REJECTED_CAPACITY (reason capacity) FER_SPILLED,
                                          * unanswered and changing nothing; 0 = today's */
    const float *observation;            /* obs_dim floats; copied, not retained */
    char client_id[FER_SESSION_ID_MAX];  /* §7.1: whose request; client_id_len 0 = session_id */
    uint32_t client_id_len;              /* 0..FER_SESSION_ID_MAX */
    uint32_t _pad2;
};

/* What a worker gets from dispatch. observation points at the caller's obs_dim-float buffer.
 * The slot's payload (fer_core_payload(core, slot)) stays valid and untouched by the core until the
 * lane's finish or STOP_* step / prefix_done. frozen_rows (§5.4): how many leading rows of the
 * chunk the worker copies from the prefix (0 for a plain request), fixed here at dispatch;
 * deadline_ns is then the earlier of the request's and the instant row frozen_rows starts. */
struct fer_work {
    char session_id[FER_SESSION_ID_MAX];
    uint32_t session_id_len;
    uint32_t lane;
    uint32_t slot;
    uint32_t remaining_nfe;
    uint64_t sequence;
    uint64_t generation;
    uint64_t noise_seed;
    uint64_t deadline_ns;
    uint32_t frozen_rows;
    uint32_t _pad;
    float *observation;                  /* caller-owned, filled by dispatch */
};

/*
 * One future ActionMessage. queue_ns = (dispatch time, or decision time if never dispatched)
 * - arrival; compute_ns = decision time - dispatch time (0 if never dispatched). lane = -1 when the
 * outcome was decided by submit (ring 0). Actions, when has_actions, travel in the ring's slab.
 */
struct fer_outcome {
    char session_id[FER_SESSION_ID_MAX];
    uint32_t session_id_len;
    uint32_t code;                       /* FER_INFERENCE .. FER_INFERENCE_FAILED */
    int32_t lane;
    uint32_t retry_count;
    uint32_t retry_reason;
    uint32_t remaining_nfe;              /* steps still outstanding when decided */
    uint32_t nfe_done;
    uint32_t has_actions;                /* 1 iff code == FER_INFERENCE */
    uint64_t sequence;
    uint64_t generation;
    uint64_t deadline_ros_ns;
    uint64_t queue_ns;
    uint64_t compute_ns;
    uint64_t arrival_ns;
    uint64_t finish_ns;                  /* when the outcome was decided */
    uint64_t chunk_start_ros_ns;         /* §5.4: the request's prefix start, echoed; 0 = none */
    uint32_t frozen_rows;                /* §5.4: fixed at dispatch; 0 unless code == INFERENCE */
    uint32_t reject_reason;              /* FER_REJECT_*: why a REJECTED_CAPACITY; else NONE */
    char client_id[FER_SESSION_ID_MAX];  /* §7.1: the client charged (session_id if none sent) */
    uint32_t client_id_len;
    uint32_t _pad;
};

/* Counters (monotonic) and gauges (marked). */
struct fer_stats {
    uint64_t submitted;
    uint64_t accepted;
    uint64_t outcomes[FER_NUM_CODES];    /* per code, counted when emitted, dropped or not */
    uint64_t coalesced;                  /* duplicate_retries_coalesced */
    uint64_t rejected_late_retries;      /* REJECTED_DEADLINE at the retry / age gate */
    uint64_t retries_by_count[FER_RETRY_COUNT_BUCKETS]; /* retry_count >= 1, capped at 7 */
    uint64_t retries_by_reason[FER_RETRY_REASONS];      /* same requests, by retry_reason */
    uint64_t calibration_misses;         /* a request that passed the admission test ended EXPIRED */
    uint64_t rejection_outputs_dropped;
    uint64_t action_outputs_dropped;
    uint64_t nfe_total;
    uint64_t nfe_wasted;                 /* NFE of work that ended EXPIRED, STALE or FAILED */
    uint64_t displaced;
    uint64_t sessions_evicted;
    uint64_t sessions_evicted_early;     /* of those, seen less than session_idle_ns before */
    uint64_t queue_depth;                /* gauge */
    uint64_t sessions;                   /* gauge */
    uint64_t lanes_busy;                 /* gauge: lanes (batch slots) holding work */
    uint64_t lanes_alive;                /* gauge: lanes (W x B while every worker lives) */
    uint64_t oldest_queued_arrival_ns;   /* gauge, 0 if empty */
    uint64_t busy_ns;                    /* sum of measured NFE and prefix time, all lanes */
    uint64_t rejected_inactive;          /* REJECTED_CAPACITY while not accepting (lifecycle) */
    uint64_t fair_share_rejected;        /* §7.1: arrivals refused as over their client's share */
    uint64_t fair_share_displaced;       /* §7.1: queued work displaced for an under-share one */
    uint64_t clients_evicted;            /* §7.1: idle clients forgotten to make room */
    uint64_t clients;                    /* gauge: tracked clients */
    uint64_t failed[FER_FAIL_CAUSES];    /* INFERENCE_FAILED outcomes per FER_FAIL_* cause */
};

/* §7.1: one tracked client, for snapshots. committed_nfe: remaining NFE of its queued and running
 * work; admitted_nfe: NFE of every request of it accepted (counter); fair_share_rejections: its
 * arrivals refused and its queued work displaced under the fair-share rule (counter). */
struct fer_client_state {
    char client_id[FER_SESSION_ID_MAX];
    uint32_t client_id_len;
    uint32_t weight;
    uint64_t committed_nfe;
    uint64_t admitted_nfe;
    uint64_t fair_share_rejections;
    uint64_t last_active_ns;
};

/* The cost model (docs/design.md §5.2) at one instant: what NFEs measured lately cost, and what
 * admission assumes. quantile_tail_ns is the cost_quantile_ppm quantile of the NFE durations
 * measured in the last cost_window_ns, window_max_ns their maximum; block_mean_ns the p99 of
 * the mean busy span per step over blocks of one worker's whole requests (16 to 128 steps) that
 * ended in the window (a step's span: the
 * wall time since its worker's previous step ended, or since the worker had work again after
 * idling, or since its last prefix pass; never less than the step's measured time), less the
 * excess of a window's single stall up to admission_reserve_ns (§5.2's stall rule); and
 * observed_tail_ns the larger of the two (all 0 when nothing was measured). in_use_ns is what
 * admission and dispatch use per NFE: nfe_ns in static mode, max(nfe_ns, observed_tail_ns) in
 * adaptive mode (the configured value is the floor); 0 while nfe_ns is 0 (admission off).
 * The prefix_* fields are the same for prefix passes (a second estimator, same window and
 * quantile, fed by fer_core_prefix_done): prefix_in_use_ns = prefix_ns in static mode,
 * max(prefix_ns, prefix tail) in adaptive mode; 0 while nfe_ns is 0 or two_phase is 0. */
struct fer_cost_stats {
    uint32_t cost_model;                 /* FER_COST_* */
    uint32_t quantile_ppm;
    uint64_t window_ns;
    uint64_t configured_ns;              /* nfe_ns */
    uint64_t observed_tail_ns;           /* max(quantile_tail_ns, block_mean_ns): what adapts */
    uint64_t quantile_tail_ns;           /* the quantile_ppm quantile of the window's NFEs */
    uint64_t block_mean_ns;              /* the p99 block's mean busy span per step (§5.2) */
    uint64_t window_max_ns;
    uint64_t window_samples;             /* NFE measured in the window */
    uint64_t in_use_ns;
    uint64_t samples_total;              /* NFE measured since create */
    uint64_t prefix_configured_ns;       /* prefix_ns */
    uint64_t prefix_observed_tail_ns;
    uint64_t prefix_in_use_ns;
    uint64_t prefix_samples_total;       /* prefix passes measured since create */
};

/* One queued request, for snapshots (EDF order). */
struct fer_queued_item {
    char session_id[FER_SESSION_ID_MAX];
    uint32_t session_id_len;
    uint32_t slot;
    uint32_t remaining_nfe;
    uint32_t tested;                     /* passed the admission test when accepted */
    uint64_t sequence;
    uint64_t generation;
    uint64_t deadline_ns;
    uint64_t arrival_ns;
    uint64_t arrival_seq;                /* EDF tie-break: submit order */
};

/* One lane, for snapshots. Fields after `busy` are meaningful only when busy. */
struct fer_lane_state {
    char session_id[FER_SESSION_ID_MAX];
    uint32_t session_id_len;
    uint32_t lane;
    uint32_t alive;
    uint32_t busy;
    uint32_t slot;
    uint32_t remaining_nfe;
    uint32_t nfe_done;
    uint32_t cancelled;                  /* a newer generation was accepted: stops at next step */
    uint32_t prefix_pending;             /* two-phase work whose prefix is not reported yet */
    uint64_t sequence;
    uint64_t generation;
    uint64_t deadline_ns;
    uint64_t dispatch_ns;
};

struct fer_core;
struct fer_ring;

/* One admission-simulation job: a queued request in EDF order. deadline_ns 0 = none.
 * prefix_pending: the job still pays one prefix pass (the predicate's prefix_ns) first. */
struct fer_admit_job {
    uint64_t deadline_ns;
    uint64_t remaining_nfe;
    uint32_t prefix_pending;
    uint32_t _pad;
};

const char *fer_strerror(int rc);

/* ---- core lifetime ----------------------------------------------------------------------------
 * create: validates cfg, allocates everything the core will ever use. FER_OK, FER_EINVAL,
 * FER_ENOMEM, FER_ESYS. destroy: frees; callers must have stopped every other thread first.
 * shutdown: wakes every wait_for_work / wait_outputs waiter; later waits return at once. FER_OK. */
int fer_core_create(const struct fer_config *cfg, struct fer_core **out);
void fer_core_destroy(struct fer_core *core);
int fer_core_shutdown(struct fer_core *core);
/* Effective configuration (ring_capacity rounded, current calibration and policy). */
int fer_core_get_config(struct fer_core *core, struct fer_config *out);

/* ---- request thread ---------------------------------------------------------------------------
 * Decides on req in docs/design.md §4 order at time now. Returns FER_ACCEPTED, FER_REJECTED_*,
 * FER_EXPIRED, FER_COALESCED, FER_SPILLED (req.spill only), or FER_EINVAL for input that validation should have discarded
 * (session id too long, remaining_nfe 0 or > max_nfe, retry_reason out of range; not counted).
 * Rejections and any displaced / pruned / drained work are pushed to ring 0. With no alive lane,
 * a request is REJECTED_CAPACITY (REJECTED_DEADLINE if the admission test would judge it). */
int fer_core_submit(struct fer_core *core, const struct fer_request *req, uint64_t now);
/* After fer_core_submit returned FER_SPILLED for req and the pool could not hand it over (no
 * target fits, or no room in its out box): the REJECTED_CAPACITY (reason capacity) that the
 * decision held back, emitted now to ring 0 and counted as the submit would have; nothing else
 * changes (FER_SPILLED changed nothing). Returns FER_REJECTED_CAPACITY, or FER_EINVAL. */
int fer_core_answer_spilled(struct fer_core *core, const struct fer_request *req, uint64_t now);

/* ---- lifecycle and model swap (docs/design.md §9), any thread ---------------------------------
 * set_accepting: 0 makes every request that reaches step 3 of §4 (valid, not a duplicate of
 *   queued or running work) REJECTED_CAPACITY at once, changing nothing (counted as
 *   rejected_inactive): an inactive relay answers without computing. 1 (a new core's state)
 *   restores §4. Work already queued or running is served either way.
 * hold_dispatch: while held (1) no worker dispatches: waits report no work and queued work
 *   waits; 0 releases it and wakes the workers. A new core does not hold.
 * reserve_lanes_until: admission (§5) counts every lane busy until at least until_ns, as if
 *   work ran on it till then (0: no reserve): a swapped-in model's core while the old one drains.
 * drain_bound: when every request the core holds (queued and running) will be done: the lane
 *   simulation started now, every remaining NFE and pending prefix counted (no deadline test), at
 *   the cost in use (§5.2) or the cost measured over the window if more; when all held work has
 *   a deadline, no later than the latest deadline plus one NFE (work stops by its deadline). now
 *   when it holds nothing. With no cost known (nfe_ns 0, nothing measured): the latest deadline,
 *   or FER_SAT (UINT64_MAX) if work without a deadline is held; FER_SAT too when the sum
 *   overflows or no lane is alive while work is held.
 * Each returns FER_OK or FER_EINVAL (NULL core); drain_bound returns 0 for a NULL core. */
int fer_core_set_accepting(struct fer_core *core, uint32_t accepting);
int fer_core_hold_dispatch(struct fer_core *core, uint32_t held);
int fer_core_reserve_lanes_until(struct fer_core *core, uint64_t until_ns);
uint64_t fer_core_drain_bound(struct fer_core *core, uint64_t now);
/* The staging slot (>= 0): the slot the next accepted submit occupies. The request thread writes
 * the request's payload into fer_core_payload(core, staging slot), then calls fer_core_submit; on
 * FER_ACCEPTED the slot is queued and a new staging slot is taken, on any other decision the same
 * slot stays staged. FER_EINVAL for a NULL core. */
int fer_core_staging_slot(struct fer_core *core);
/* payload_bytes of slot `slot` (cache-line aligned, fixed at create, any thread); NULL if
 * payload_bytes is 0, core is NULL or slot >= queue_capacity + workers + 1. The core never reads
 * or writes payload bytes. */
void *fer_core_payload(struct fer_core *core, uint32_t slot);

/* ---- worker thread w, for its lanes [w*B, (w+1)*B) (B = batch_slots) -----------------------
 * Every outcome a lane call decides goes into ring w+1, the worker's own.
 * wait_for_work: waits up to timeout_ns (CLOCK_MONOTONIC) for a non-empty queue. 1 if the queue
 *   is non-empty, 0 on timeout or after shutdown.
 * worker_wait: worker's own wait (any of its lanes, §5.1): up to timeout_ns until the queue is
 *   non-empty and the worker has a free alive lane. 1 then, 0 on timeout or after shutdown.
 * dispatch_worker: non-blocking dispatch onto the worker's lowest-numbered free alive lane, as
 *   dispatch does for that lane (out->lane names it): 1 with *out filled, 0 if the worker has no
 *   free alive lane or nothing is left to run. How a worker fills its free batch slots at a step
 *   boundary (a freed slot takes the next request in EDF order at once).
 * queued: the queue length as of some recent instant, read without the core mutex (a hint for a
 *   worker deciding whether to try dispatch_worker at a step boundary; >= 0).
 * dispatch: lane must be alive and idle. Pops the EDF head (earliest deadline, none last, ties by
 *   arrival); queued work that can no longer finish is EXPIRED and queue-timeout victims are
 *   REJECTED_DEADLINE into ring w+1, and skipped. 1 with *out filled, 0 if nothing to run.
 * prefix_done: two-phase only, after the prefix pass of the dispatched work (before any step),
 *   which took prefix_ns_measured (fed to the prefix cost estimator and busy_ns).
 *   FER_STEP_STOP_STALE if a newer generation cancelled it, FER_STEP_STOP_EXPIRED if
 *   now >= its deadline (outcome emitted, lane freed, like step), else FER_STEP_CONTINUE.
 *   FER_ESTATE if the lane has no work whose prefix is pending (two_phase = 0, idle, or already
 *   reported).
 * step: after each NFE. Returns FER_STEP_*; on STOP_* the outcome is emitted and the lane freed.
 *   FER_ESTATE while the work's prefix is pending. The rows of one batched step report the same
 *   now (the step's end): the first report of a new now is the worker's step, whose busy span
 *   feeds the cost model's block mean (struct fer_cost_stats).
 * paused: the lane's worker paused on purpose for pause_ns before its next step (§5.3's pacing,
 *   which the cost in use prices on its own): that step's busy span leaves out up to pause_ns.
 *   A pause that overran (a late wake-up) is charged its overrun. FER_OK.
 * output_space: 1 if the lane's worker ring (w + 1) has a free record, else 0.
 * finish: after STEP_DONE. Emits INFERENCE with action_len floats (EXPIRED if now > deadline,
 *   REJECTED_STALE if cancelled after its last step) into ring w+1, frees the lane, returns
 *   the code. A full ring drops the record and counts action_outputs_dropped.
 * disable_lane: the lane's worker has exited. The lane leaves admission; its work is EXPIRED into
 *   ring w+1; if it was the last alive lane, every queued request is answered into ring w+1
 *   too: EXPIRED after shutdown (the relay stops), else REJECTED_CAPACITY (its workers died);
 *   later submits are refused, see below. Call only once that worker is gone, so the ring
 *   keeps a single producer. */
int fer_core_wait_for_work(struct fer_core *core, uint32_t lane, uint64_t timeout_ns);
int fer_core_worker_wait(struct fer_core *core, uint32_t worker, uint64_t timeout_ns);
int fer_core_dispatch_worker(struct fer_core *core, uint32_t worker, uint64_t now,
                             struct fer_work *out);
int fer_core_queued(struct fer_core *core);
int fer_core_dispatch(struct fer_core *core, uint32_t lane, uint64_t now, struct fer_work *out);
int fer_core_prefix_done(struct fer_core *core, uint32_t lane, uint64_t now,
                         uint64_t prefix_ns_measured);
int fer_core_step(struct fer_core *core, uint32_t lane, uint64_t now, uint64_t nfe_ns_measured);
int fer_core_paused(struct fer_core *core, uint32_t lane, uint64_t pause_ns);
int fer_core_output_space(struct fer_core *core, uint32_t lane);
int fer_core_finish(struct fer_core *core, uint32_t lane, uint64_t now, const float *actions);
/* fail: the lane's work (prefix pending, mid-steps, or DONE before finish) ends INFERENCE_FAILED
 * with no actions, counted under cause (FER_FAIL_*): its model call raised or its actions were
 * not finite. Returns FER_INFERENCE_FAILED, or FER_ESTATE when the lane holds no work. */
int fer_core_fail(struct fer_core *core, uint32_t lane, uint64_t now, uint32_t cause);
int fer_core_disable_lane(struct fer_core *core, uint32_t lane, uint64_t now);

/* ---- publisher thread (the single consumer of every ring) ------------------------------------
 * wait_outputs: waits up to timeout_ns for any ring to hold a record; 1 if one does, else 0.
 * pop_outcomes: up to max_n records, round robin over the rings; record i's actions (when
 *   has_actions) go to actions[i * action_len]. Returns the number popped. */
int fer_core_wait_outputs(struct fer_core *core, uint64_t timeout_ns);
int fer_core_pop_outcomes(struct fer_core *core, struct fer_outcome *out, float *actions,
                          uint32_t max_n);

/* ---- any thread ------------------------------------------------------------------------------ */
int fer_core_set_calibration(struct fer_core *core, uint64_t nfe_ns, uint64_t admission_reserve_ns,
                             uint64_t prefix_ns);
int fer_core_set_policy(struct fer_core *core, uint32_t reject_if_retry_count_gte, uint32_t age_gate,
                        uint64_t reject_if_queue_age_ns_gte, uint64_t queue_timeout_ns);
int fer_core_stats(struct fer_core *core, struct fer_stats *out);
/* Cost model (docs/design.md §5.2, csrc/fer_cost.c). Every NFE passed to fer_core_step is measured
 * in both modes. set_cost_model: cost_model FER_COST_*, window_ns (0 = 1 s) and quantile_ppm
 * (1..1000000, 0 = 900000); changing the window forgets the samples. FER_OK or FER_EINVAL.
 * cost_stats: the model's state at now (samples older than the window no longer count). */
int fer_core_set_cost_model(struct fer_core *core, uint32_t cost_model, uint64_t window_ns,
                            uint32_t quantile_ppm);
int fer_core_cost_stats(struct fer_core *core, uint64_t now, struct fer_cost_stats *out);
/* Snapshots return the number of items written (at most max_n). */
int fer_core_queue_snapshot(struct fer_core *core, struct fer_queued_item *out, uint32_t max_n);
int fer_core_lanes_snapshot(struct fer_core *core, struct fer_lane_state *out, uint32_t max_n);
/* §7.1 fair share, both live (a running core applies them from its next decision on, under its
 * lock: a decision sees the old setting or the new one, whole). set_fair_share: 1 = on, 0 = off;
 * clients are tracked either way (committed work exact at every accept, step and end), so the
 * share judges work admitted before it was turned on. set_client_weights: replaces the rules
 * (rules[0..n), the first whose glob pattern, fnmatch's *, ? and [...], [!...], matches a client
 * id wins; none: weight 1) and re-weighs every tracked client. FER_EINVAL for n over
 * FER_WEIGHT_RULES, a pattern over FER_SESSION_ID_MAX bytes or a weight outside
 * 1..FER_WEIGHT_MAX, the old rules kept. clients_snapshot: the tracked clients, at most max_n,
 * in table order. */
struct fer_client_weight {
    char pattern[FER_SESSION_ID_MAX];
    uint32_t len;
    uint32_t weight;
};
int fer_core_set_fair_share(struct fer_core *core, uint32_t on);
int fer_core_set_client_weights(struct fer_core *core, const struct fer_client_weight *rules,
                                uint32_t n);
int fer_core_clients_snapshot(struct fer_core *core, struct fer_client_state *out, uint32_t max_n);
/* 1 and *generation set if the session is tracked, 0 if not. */
int fer_core_session_generation(struct fer_core *core, const char *session_id, uint32_t len,
                                uint64_t *generation);

/* ---- the admission predicate (docs/design.md §5), pure ----------------------------------------
 * Simulates non-preemptive EDF over nlanes lanes that free at lane_start[]: jobs[] (EDF order)
 * are placed one by one on the lane that frees first; finish = start + (prefix_ns if the job's
 * prefix_pending) + remaining_nfe * nfe_ns.
 * Returns the index of the first job at or after check_from with a finite deadline and
 * finish + reserve_ns later than that deadline (saturating; a saturated sum misses), or njobs if
 * every such job meets its deadline. scratch holds nlanes uint64; inputs are not modified.
 * With nlanes == 0 every finite-deadline job at or after check_from misses. */
uint32_t fer_admit_first_miss(const uint64_t *lane_start, uint32_t nlanes,
                              const struct fer_admit_job *jobs, uint32_t njobs, uint32_t check_from,
                              uint64_t nfe_ns, uint64_t prefix_ns, uint64_t reserve_ns,
                              uint64_t *scratch);

/* ---- standalone SPSC outcome ring (the core owns workers + 1 of these) -----------------------
 * create: capacity rounded up to a power of two, action_len floats of slab per record.
 * push (producer only): copies rec and, if rec->has_actions, action_len floats; FER_OK, or
 *   FER_EFULL after counting a drop. Rings the ring's doorbell.
 * pop (consumer only): 1 and copies the oldest record (and its actions if has_actions and
 *   actions != NULL), or 0 if empty.
 * capacity, action_len, free_slots (producer), count (either side; exact for the calling side's
 *   own view), dropped: plain counts, so they take a live ring (no status to return).
 * wait (consumer): up to timeout_ns for a record; 1 if non-empty. */
int fer_ring_create(uint32_t capacity, uint32_t action_len, struct fer_ring **out);
void fer_ring_destroy(struct fer_ring *ring);
int fer_ring_push(struct fer_ring *ring, const struct fer_outcome *rec, const float *actions);
int fer_ring_pop(struct fer_ring *ring, struct fer_outcome *rec, float *actions);
uint32_t fer_ring_capacity(const struct fer_ring *ring);
uint32_t fer_ring_action_len(const struct fer_ring *ring);
uint32_t fer_ring_free_slots(struct fer_ring *ring);
uint32_t fer_ring_count(struct fer_ring *ring);
uint64_t fer_ring_dropped(struct fer_ring *ring);
int fer_ring_wait(struct fer_ring *ring, uint64_t timeout_ns);
