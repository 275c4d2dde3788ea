/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_pool.h - a relay pool's ownership in C: who decides a request, what a member keeps of the
 * requests another member owns, and the takeover of a dead member's requests
 * (docs/design.md §13).
 *
 * Why in C: every member of a pool takes every request of the pool's topic, and drops the ones it
 * does not own in the intake, right after the header fields are parsed and before any copy. That
 * drop is on the intake thread's hot path, so it costs one hash and a scan of at most
 * FER_POOL_MEMBERS_MAX members, no lock and no allocation.
 *
 * Ownership: rendezvous (highest random weight) hashing. score(m, s) = fer_pool_mix64(m.key ^
 * fer_pool_hash(session_id)); the owner of a request is the highest-scoring member of the view
 * that serves its model digest and counts for the request's origin_stamp (owning_from <=
 * origin_stamp < owning_until, 0 = unbounded; an unset origin_stamp counts every member); the
 * successor is the second highest. Keys are compared last, so two members never tie. A member's
 * key is fer_pool_mix64(fer_pool_hash(relay_id)).
 *
 * The view (fer_pool_set_view, any thread, rare) is double-buffered under a sequence counter: the
 * intake thread reads it without a lock and retries only if a set overlapped its read.
 *
 * The standby table: a request this member is the successor of is kept (its CDR bytes, the
 * owner's key, arrival, deadline) until an answer on flowedge/actions names it
 * (fer_pool_answer), its deadline + lease passed while its owner is in the view (deadline +
 * 4 x lease whatever the view says; for a copy kept before this member's own-stall watermark, or
 * a stale copy, the deadline counts from no earlier than the watermark + lease + margin, when
 * an owner's death in the stall has been judged), or it is the oldest when a new one does not
 * fit (entries and bytes bounded at create; counted standby_evicted). The bytes lie in one ring arena in
 * arrival order. An answer that comes before its request is remembered in a small direct-mapped
 * filter (2 x entries fingerprints), so the request is not kept when it arrives.
 *
 * Takeover: fer_pool_takeover (any thread) posts a dead member's key; the intake thread then
 * re-decides every standby entry of that owner as an arrival (fer_intake_pool_service in
 * fer_intake.h): admission, the age gate and expiry decide, and a request past its deadline is
 * answered EXPIRED at once. An entry kept before this member's own-stall watermark (below) is
 * held instead ("Hold, do not drop").
 *
 * Same rules as fer.h: read verbatim into the cdef (before fer_intake.h), so declarations and
 * plain integer #defines only. Threads: set_view, takeover, set_epoch, add_surrendered, alive,
 * stall_check, surrender, hold, held, counters and the hash functions are for any thread;
 * standby, answer and expiry calls belong to the one
 * thread that decides requests (the intake thread, or a test holding that role). Nothing
 * allocates after fer_pool_create.
 */

#define FER_POOL_MEMBERS_MAX 64       /* members of one view */
#define FER_POOL_DIGESTS_MAX 8        /* model digests one member serves */
#define FER_POOL_RELAY_ID_MAX 128     /* bytes of a relay_id */
#define FER_POOL_TAKEOVERS_MAX 64     /* dead keys waiting for the intake thread */
#define FER_POOL_OWNED_SLOTS 1024     /* owned_sessions estimate: direct-mapped session slots */
#define FER_POOL_STANDBY_SNAPSHOT_MAX 65536 /* entries Pool.standby() reads */
#define FER_POOL_SPILL_SLOTS 256      /* handovers waiting, each way (docs/design.md §13.5) */
/* A member silent (no announcement) for more than lease + this may have been declared dead and
 * taken over: its own stall (flowedge_relay/pool.py reads it from here; docs/design.md §13.2) */
#define FER_POOL_STALL_MARGIN_NS 100000000

/* fer_pool_role: what this member is for a request */
#define FER_POOL_OWNER 0              /* decide it (today's path) */
#define FER_POOL_SUCCESSOR 1          /* not the owner, the second in its ranking: keep it */
#define FER_POOL_OTHER 2              /* neither: drop it */
#define FER_POOL_UNOWNED 3            /* no member of the view covers it: decide it here, as a
                                       * single relay would (counted unowned) */
#define FER_POOL_HELD 4               /* after this member's own stall, a request stamped before
                                       * its exclusion that it would own: kept until another
                                       * member's answer names it or its hold is due
                                       * (docs/design.md §13.2) */
#define FER_POOL_STALE_SUCCESSOR 5    /* after this member's own stall, a request stamped before
                                       * its exclusion that it ranks second (every window
                                       * ignored): a copy for the first one's takeover, held
                                       * then, not decided at once (docs/design.md §13.2) */

/* Holding what an own stall would drop (docs/design.md §13.2): a held outcome's state */
#define FER_POOL_HOLD_MAX 256         /* outcomes one pool holds at once */
#define FER_POOL_HOLD_WAIT 0          /* held: nobody answered yet, not due */
#define FER_POOL_HOLD_ANSWERED 1      /* another member answered it: drop it (surrendered) */
#define FER_POOL_HOLD_DUE 2           /* due and unanswered: publish it (EXPIRED if late) */

/* One member of the view, as the membership layer (flowedge_relay/pool.py) knows it. Times are
 * ROS time in ns, 0 = unbounded. digests: fer_pool_hash of each served model_digest string;
 * n_digests 0 = serves every digest. */
struct fer_pool_member {
    uint64_t key;
    int64_t owning_from_ns;
    int64_t owning_until_ns;
    uint32_t n_digests;
    uint32_t _pad;
    uint64_t digests[FER_POOL_DIGESTS_MAX];
    /* Its announced bound, for spill (docs/design.md §13.5): workers 0 = not a spill target
     * (draining, or spill off here: the membership leaves these 0). relay_id names it in a
     * handover. */
    uint32_t workers;
    uint32_t queue_depth;
    uint64_t nfe_ns;
    uint64_t admission_reserve_ns;
    uint32_t relay_id_len;
    char relay_id[FER_POOL_RELAY_ID_MAX];
};

/* What a pool is made with. standby_entries >= 1, standby_bytes >= 1, lease_ns >= 1;
 * relay_id_len <= FER_POOL_RELAY_ID_MAX. */
struct fer_pool_config {
    char relay_id[FER_POOL_RELAY_ID_MAX];
    uint32_t relay_id_len;
    uint32_t standby_entries;
    uint64_t standby_bytes;
    uint64_t lease_ns;
    uint64_t spill_bytes;             /* each handover box's arena (out, in); 0 = no spill */
};

/* Counters (monotonic) and gauges (marked), read by any thread through fer_pool_counters (a
 * snapshot; each field was current, the set is not one instant). */
struct fer_pool_counters {
    uint64_t not_owner;               /* requests dropped in the intake: another member owns them */
    uint64_t unowned;                 /* no member covered them: decided here (FER_POOL_UNOWNED) */
    uint64_t standby_stored;          /* kept as successor */
    uint64_t standby_answered;        /* removed: an answer named them */
    uint64_t standby_expired;         /* removed: deadline + lease passed, owner live */
    uint64_t standby_evicted;         /* removed: oldest when a new one did not fit (or too big) */
    uint64_t answers_seen;            /* ActionMessages of other members taken */
    uint64_t answers_malformed;       /* ActionMessage bytes that did not parse */
    uint64_t answers_early;           /* answers that came before their request (filtered) */
    uint64_t takeovers;               /* dead members' keys handled */
    uint64_t taken_over_requests;     /* standby entries re-decided by a takeover */
    uint64_t surrendered;             /* held outputs and requests (from before this member's
                                       * own stall) dropped: another member answered them, no
                                       * hold slot was left, or (a takeover's copy) its owner
                                       * came back to the view */
    uint64_t standby_bytes;           /* gauge: bytes held in the arena (holes included) */
    uint64_t standby_bytes_capacity;  /* gauge */
    uint32_t standby_entries;         /* gauge: live entries */
    uint32_t standby_capacity;        /* gauge */
    uint32_t pool_members;            /* gauge: members of the view */
    uint32_t pool_epoch;              /* gauge: fer_pool_set_epoch */
    uint64_t owned_sessions;          /* gauge, an estimate: sessions this member decided as owner
                                       * within the last lease (FER_POOL_OWNED_SLOTS slots) */
    uint64_t key;                     /* this member's key */
    uint64_t stalls_detected;         /* own stalls found by fer_pool_stall_check */
    uint64_t surrender_before_ns;     /* gauge: the watermark (monotonic; 0 = none) */
    uint64_t spilled_out;             /* handed over to the successor instead of answered */
    uint64_t spilled_in;              /* handovers to this member, decided here */
    uint64_t spill_ignored;           /* handovers that named another member (not counted in) */
    uint64_t spill_dropped;           /* handovers not decided: malformed, made before this
                                       * member's own stall (its owner answers those), or of a
                                       * request answered already (a takeover here decided it) */
    uint64_t spill_back;              /* spilled requests the owner answered itself on its
                                       * target's death (also in taken_over_requests) */
    uint64_t spill_returned;          /* handovers to this member its full in box gave back to
                                       * their owner (fer_pool_spill_give_back) */
    uint64_t spill_taken_back;        /* this member's own handovers given back by their target
                                       * and decided here (not in spilled_in) */
    uint64_t held;                    /* outcomes and requests held after an own stall instead of
                                       * dropped (docs/design.md §13.2) */
    uint64_t held_released;           /* of those, due with no other member's answer: published
                                       * (outcomes) or decided here (requests) */
    uint64_t hold_full;               /* outcomes dropped (surrendered) with every hold slot used */
    uint64_t held_requests_decided;   /* of held_released, the requests decided here (re-decided:
                                       * counted not_owner when taken, like a takeover's) */
};

struct fer_pool;

/* 64-bit FNV-1a of bytes, and the splitmix64 finaliser (any thread; pure). */
uint64_t fer_pool_hash(const uint8_t *bytes, uint64_t len);
uint64_t fer_pool_mix64(uint64_t x);

/* create: checks cfg, allocates the view, the standby table and its arena. FER_OK and *out,
 *   FER_EINVAL or FER_ENOMEM (or FER_ESYS for the lock). destroy: accepts NULL; not while an
 *   intake, intake loop or publisher still uses it. */
int fer_pool_create(const struct fer_pool_config *cfg, struct fer_pool **out);
void fer_pool_destroy(struct fer_pool *pool);

/* Any thread: the new view (n <= FER_POOL_MEMBERS_MAX; FER_EINVAL beyond, or for two members with
 * one key). From the next decision on every request is decided against it. */
int fer_pool_set_view(struct fer_pool *pool, const struct fer_pool_member *members, uint32_t n);
/* Any thread: the epoch answers carry (ActionMessage.pool_epoch) and the counters report. */
int fer_pool_set_epoch(struct fer_pool *pool, uint32_t epoch);
uint32_t fer_pool_epoch(const struct fer_pool *pool); /* 0 for NULL */
/* Any thread: count n requests surrendered after this member's own stall. */
int fer_pool_add_surrendered(struct fer_pool *pool, uint64_t n);

/*
 * Own stall (docs/design.md §13.2). The others declare this member dead when its announcements
 * stop for a lease, and take over every request it kept; what it still holds from before (queued,
 * running, or decided and waiting in an outcome ring) is then theirs to answer.
 * alive: the membership announced at now_mono (each announcement is the liveliness assertion);
 *   the stall check runs first, so an announcement never hides a gap. last_alive only rises.
 * stall_check: before acting on held work, any thread (the intake, the publishers, the
 *   membership): if the last announcement is more than lease + FER_POOL_STALL_MARGIN_NS old,
 *   the stall is found (once: last_alive moves to now_mono) and fer_pool_surrender(now_mono)
 *   follows. Returns the watermark (0 = none). Nothing before the first alive is a stall.
 * surrender: raise the watermark surrender_before_ns to now_mono (it only rises): every output
 *   of a request that arrived (was submitted to a core here) before it is held by the
 *   publisher, not published (below). Also, until the member rejoins, it decides no request
 *   stamped (origin_stamp; an unset one: its arrival in ROS time) before CLOCK_REALTIME + 2 x
 *   lease at the surrender: the others may have taken those over, and the rejoin announces
 *   owning_from no earlier; it decides none of them even where its view has lost every other
 *   member since (its own stale judgement after the stall). Of those, one whose session it ranks
 *   first with every window ignored is held (FER_POOL_HELD), one it ranks second is kept as a
 *   copy for the first one's takeover (FER_POOL_STALE_SUCCESSOR), the rest dropped. With no other
 *   member in the view it does nothing: nobody could have taken its work over. FER_OK,
 *   FER_EINVAL.
 * An output of a request that arrived before the watermark (arrival_mono < mark, the mark
 *   stall_check returned for its batch) is held by the publisher (fer_pool_hold below).
 */
int fer_pool_alive(struct fer_pool *pool, uint64_t now_mono);
uint64_t fer_pool_stall_check(struct fer_pool *pool, uint64_t now_mono);
int fer_pool_surrender(struct fer_pool *pool, uint64_t now_mono);

/*
 * Hold, do not drop (docs/design.md §13.2). A member that surrenders may not have been declared
 * dead (a stall of every member at once): nobody then takes over what it held. So what the
 * watermark covers is held and the answers watch (fer_pool_answer) is consulted: held work that
 * another member answered is dropped, counted surrendered; held work nobody answered by its due
 * time is answered here, counted held_released. Due = max(mark + lease +
 * FER_POOL_STALL_MARGIN_NS, its arrival here, its deadline) + leases x lease: another member
 * has answered it by the max (a takeover starts within lease + margin of their view of the
 * death, a live owner decides a late-delivered request as it arrives, and either answers by
 * the deadline, EXPIRED at once past it; with no deadline the max is 3 leases later), and
 * its answer's trip gets a lease; the
 * owner's hold takes 1 lease, a successor's copy (a takeover's entry kept before the watermark,
 * or a stale copy) 2, so the owner's answer reaches the successor before its copy is due. A
 * held copy whose owner is back in the view is dropped (surrendered): the death its takeover
 * acted on was this member's stale view after its stall, and the live owner answers it.
 * hold: a publisher, for an outcome of a request that arrived before mark (arrival_mono < mark;
 *   deadline_ros 0 = none): FER_POOL_HOLD_WAIT with *slot (0 .. FER_POOL_HOLD_MAX - 1; the
 *   caller keeps the outcome there until held says otherwise), FER_POOL_HOLD_ANSWERED when an
 *   answer was seen already (drop it), FER_EFULL when every slot is used (drop it; counted
 *   hold_full), both counted surrendered; FER_EINVAL. Any thread (under the pool's lock).
 * held: the slot's state at now_mono: FER_POOL_HOLD_WAIT, or ANSWERED / DUE, which free it.
 */
int fer_pool_hold(struct fer_pool *pool, const uint8_t *session_id, uint32_t session_id_len,
                  uint64_t sequence, uint64_t deadline_ros, uint64_t mark, uint64_t now_mono,
                  int32_t *slot);
int fer_pool_held(struct fer_pool *pool, int32_t slot, uint64_t now_mono);
/* Any thread: the work held now, outcomes in hold slots and held standby entries (0 = none),
 *   read relaxed; 0 once a stop has ended every held item (docs/design.md §13.2, held
 *   outcomes at stop; logged then). 0 for NULL. */
uint32_t fer_pool_holding(const struct fer_pool *pool);
/* The deciding thread: keep a request this member would own but surrendered (FER_POOL_HELD;
 * arrival and deadline monotonic, 0 = none) until an answer names it or it is due (1 lease),
 * then decide it here as a takeover does. fer_intake does this itself. FER_OK, FER_EINVAL. */
int fer_pool_standby_hold(struct fer_pool *pool, const uint8_t *cdr, uint64_t len,
                          uint64_t arrival_ns, uint64_t deadline_ns, uint64_t now_ns);

/* Any thread: this member's role for a request (FER_POOL_OWNER .. FER_POOL_STALE_SUCCESSOR),
 * from its session id bytes, the fer_pool_hash of its model_digest and its origin_stamp (ROS
 * ns, 0 = unset). With owner_key / successor_key non-NULL, the two highest keys (0 = none; for
 * a STALE_SUCCESSOR, the key it keeps the copy for and 0). count != 0: count not_owner (every
 * role but OWNER and UNOWNED) or unowned, as the intake does; only from the thread that decides
 * requests (the rclpy intake's request thread). A negative code for a NULL pool. */
int fer_pool_role(struct fer_pool *pool, const uint8_t *session_id, uint32_t session_id_len,
                  uint64_t digest_hash, int64_t origin_ns, uint32_t count, uint64_t *owner_key,
                  uint64_t *successor_key);

/* Any thread: post a dead member's key for takeover (its standby entries are re-decided by the
 * intake thread's next fer_intake_pool_service; the loop is woken). Set the view without that
 * member first: a request decided after the takeover is then never kept for it. FER_EFULL when
 * FER_POOL_TAKEOVERS_MAX keys wait already. */
int fer_pool_takeover(struct fer_pool *pool, uint64_t dead_key);

/* The deciding thread: keep a request as successor of owner_key (arrival and deadline on the
 * monotonic clock; deadline 0 = none). FER_OK (kept, or filtered as already answered), FER_EINVAL.
 * fer_intake does this itself; exposed for the tests and the bench. */
int fer_pool_standby_put(struct fer_pool *pool, const uint8_t *cdr, uint64_t len,
                         uint64_t owner_key, uint64_t arrival_ns, uint64_t deadline_ns,
                         uint64_t now_ns);
/* The deciding thread: the same for a FER_POOL_STALE_SUCCESSOR copy: a takeover of owner_key
 * holds it (as an entry kept before the watermark) instead of deciding it at once. */
int fer_pool_standby_put_stale(struct fer_pool *pool, const uint8_t *cdr, uint64_t len,
                               uint64_t owner_key, uint64_t arrival_ns, uint64_t deadline_ns,
                               uint64_t now_ns);
/* The deciding thread: one flowedge/actions message's CDR bytes. Removes every standby entry of
 * its (session_id, sequence) and returns how many (an answer of this member's own relay_id is
 * ignored: 0), or FER_EINVAL for bytes that are not an ActionMessage (counted). */
int fer_pool_answer(struct fer_pool *pool, const uint8_t *cdr, uint64_t len);
/* The deciding thread: drop expired entries (see above); returns how many. */
int fer_pool_expire(struct fer_pool *pool, uint64_t now_ns);

/* The deciding thread (tests, the reference model): the live standby entries, oldest first, as
 * (fer_pool_hash(session_id), sequence, owner key) into the three arrays (max each); how many
 * were written. */
int fer_pool_standby_snapshot(struct fer_pool *pool, uint64_t *sid_hash, uint64_t *sequence,
                              uint64_t *owner_key, uint32_t max);

/*
 * Spill on capacity (docs/design.md §13.5), when fer_pool_set_spill is on. The owner of a request
 * it would answer REJECTED_CAPACITY hands it to the request's successor instead, explicitly: a
 * handover (msg/PoolSpill.msg CDR) in the out box, published by the relay on flowedge/pool/spill;
 * it keeps the request in its standby table with the target as "owner" until the target's answer
 * names it, and on the target's death (fer_pool_takeover of its key) decides it itself, with
 * no second spill. The target decides a handover's request bytes as an arrival (age gate,
 * admission, expiry) and answers whatever the outcome; its own standby copy of the request goes,
 * and a later copy is filtered, so its takeovers never decide it again; a handover of a request
 * a takeover here decided already (its owner died after handing it over) is dropped.
 * set_spill: any thread; 0 (a new pool's) = the owner answers REJECTED_CAPACITY itself.
 *   spilling: any thread, one relaxed load: whether it is on (the deciding thread marks a
 *   request it owns spillable, fer_request.spill, only then).
 * spill_fits: the deciding thread, only after fer_core_submit returned FER_SPILLED (an
 *   admitted request never pays for it): 1 when a request (remaining_nfe, deadline ROS ns, 0 = none)
 *   may be handed to target_key now: spill on, the target in the view with workers > 0 and its
 *   announced bound (admission_reserve_ns + nfe_ns x remaining_nfe x (1 + ceil(queue_depth /
 *   workers))) within the slack (deadline - now_ros), and room in the out box for len bytes.
 * spill_out: the deciding thread, after fer_core_submit returned FER_SPILLED for a request
 *   spill_fits passed: the handover goes into the out box (waking spill_next), the request into
 *   standby for target_key; counted spilled_out. FER_OK, FER_EFULL (no room: not handed over),
 *   FER_EINVAL. Either fails: fer_core_answer_spilled answers it REJECTED_CAPACITY here.
 * spill_next: the relay's sender thread: waits up to timeout_ns for the oldest handover, copies
 *   its CDR bytes into buf (cap >= spill_bytes) and returns their length; 0 on timeout.
 * spill_in: any thread (the spill topic's subscription): one handover's CDR bytes, taken at
 *   now_mono. 0 when it names another member (counted spill_ignored), 1 when queued for the
 *   deciding thread (the intake loop is woken), FER_POOL_SPILL_GIVE_BACK when it is a handover
 *   to this member and the in box is full (publish what spill_give_back writes: never waited
 *   for), FER_EFULL when it is a give-back of this member's own handover and the in box is
 *   full (call again once the intake thread has made room), FER_EINVAL for bytes that do not
 *   parse.
 * spill_give_back: any thread: the give-back of a handover spill_in could not take: the same
 *   PoolSpill with its target set to the owner that made it (relay_id = target marks a
 *   give-back), into buf[0..cap); its length (counted spill_returned), or FER_EINVAL. The owner
 *   decides it as its own arrival, once, never spilling it again (counted spill_taken_back).
 */
#define FER_POOL_SPILL_GIVE_BACK 2
int fer_pool_set_spill(struct fer_pool *pool, uint32_t on);
uint32_t fer_pool_spilling(const struct fer_pool *pool);
int fer_pool_spill_fits(struct fer_pool *pool, uint64_t target_key, uint32_t remaining_nfe,
                        int64_t deadline_ros, int64_t now_ros, uint64_t len);
int fer_pool_spill_out(struct fer_pool *pool, const uint8_t *cdr, uint64_t len,
                       uint64_t target_key, const uint8_t *session_id, uint32_t session_id_len,
                       uint64_t sequence, uint64_t generation, uint64_t arrival_ns,
                       uint64_t deadline_ns, uint64_t now_ns);
int64_t fer_pool_spill_next(struct fer_pool *pool, uint8_t *buf, uint64_t cap,
                            uint64_t timeout_ns);
int fer_pool_spill_in(struct fer_pool *pool, const uint8_t *cdr, uint64_t len, uint64_t now_mono);
int64_t fer_pool_spill_give_back(struct fer_pool *pool, const uint8_t *cdr, uint64_t len,
                                 uint8_t *buf, uint64_t cap);

/* Any thread: the counters (FER_OK, FER_EINVAL). */
int fer_pool_counters(struct fer_pool *pool, struct fer_pool_counters *out);
/* Any thread: this member's relay_id (relay_id_len bytes, not NUL-terminated) and key. */
const char *fer_pool_relay_id(const struct fer_pool *pool, uint32_t *relay_id_len);
