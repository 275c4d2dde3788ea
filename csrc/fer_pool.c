/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_pool.c - a relay pool's ownership, standby table and takeovers (fer_pool.h says why).
 * Allocates only in create.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fer_internal.h"
#include "fer_wire.h"
#include "fer_pool.h"

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

/* The hash and the finaliser, inlined where the ranking runs: the exported names below go
 * through the PLT from inside the module (a call per scored member). */
static inline uint64_t fnv1a(const uint8_t *bytes, uint64_t len)
{
    uint64_t h = FNV_OFFSET, i;

    for (i = 0; bytes != NULL && i < len; i++) {
        h ^= bytes[i];
        h *= FNV_PRIME;
    }
    return h;
}

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t fer_pool_hash(const uint8_t *bytes, uint64_t len) { return fnv1a(bytes, len); }

uint64_t fer_pool_mix64(uint64_t x) { return mix64(x); }

/* ---- state ------------------------------------------------------------------------------------- */

/* A view as set, and what set derives from it for the ranking: open_from / open_until bound the
 * origin stamps for which no member's window excludes it (every window open). */
#define POOL_DIGESTS (FER_POOL_MEMBERS_MAX * FER_POOL_DIGESTS_MAX)
struct pool_view {
    uint32_t n;
    uint32_t n_dig;                      /* distinct digests served: dig_hash[0..n_dig) */
    int64_t open_from, open_until;
    uint64_t any_mask;                   /* members that serve every digest (n_digests 0) */
    uint64_t key[FER_POOL_MEMBERS_MAX];  /* m[i].key, contiguous for the scoring loop */
    int64_t from[FER_POOL_MEMBERS_MAX], until[FER_POOL_MEMBERS_MAX];
    uint64_t dig_hash[POOL_DIGESTS];
    uint64_t dig_mask[POOL_DIGESTS];     /* bit i: member i serves it (any_mask included) */
    struct fer_pool_member m[FER_POOL_MEMBERS_MAX];
};

/* The members of v serving digest_hash, as a bit mask. */
static uint64_t serving(const struct pool_view *v, uint64_t digest_hash)
{
    uint32_t d;

    for (d = 0; d < v->n_dig && d < POOL_DIGESTS; d++)
        if (v->dig_hash[d] == digest_hash)
            return v->dig_mask[d];
    return v->any_mask;
}

/* The deciding thread's memo of a session: its id's bytes (up to MEMO_SID) and their FNV-1a,
 * so a session seen before is not hashed again; and its ranking under one view (seq), for one
 * digest, valid for an origin stamp in the view's open range, so its next request is dropped
 * without scoring the view again. Direct-mapped by memo_slot; a collision only costs a hash and
 * a scoring. kept: sid[0..sid_len) hashes to sid_hash; plain: none of those bytes is NUL;
 * ranked: k1, k2, found are sid_hash's ranking (under seq, for digest_hash). */
#define POOL_MEMO 4096
#define POOL_MEMO_BITS 12
#define MEMO_SID 40
_Static_assert(POOL_MEMO == 1u << POOL_MEMO_BITS, "the memo's slot is the top bits of a product");
struct pool_memo {
    uint64_t sid_hash, digest_hash, k1, k2;
    uint32_t seq, found;
    uint8_t kept, plain, sid_len, ranked;
    uint8_t sid[MEMO_SID];
};

/* One kept request. Its CDR bytes are arena[off, off + len); span counts them and the arena's
 * tail skipped before them when they wrapped (so popping the oldest frees exactly span). */
struct pool_entry {
    uint64_t sid_hash, sequence, owner_key;
    uint64_t arrival_ns, deadline_ns;
    uint64_t off, len, span;
    uint32_t live;
    int32_t next;                        /* hash chain: index of the next entry, -1 = end */
    uint32_t spilled;                    /* a request this member handed to owner_key (§13.5) */
    uint32_t held;                       /* held after an own stall until answered or due_ns */
    uint64_t due_ns;
    uint32_t stale;                      /* a copy kept after an own stall (STALE_SUCCESSOR):
                                          * held, not decided, when its owner is taken over */
};

/* A held outcome's slot (fer_pool_hold): its request's fingerprint, due time and state */
#define HOLD_FREE 0
#define HOLD_WAITING 1
#define HOLD_ANSWERED 2
struct pool_hold {
    uint64_t fp, due;
    uint32_t state, _pad;
};

/* A box of handovers (docs/design.md §13.5): records in arrival order in a ring arena of cap
 * bytes (a multiple of BOX_ALIGN), each a struct box_rec then len bytes, padded to BOX_ALIGN; a
 * record that does not fit before the end wraps to 0 behind a marker (len BOX_WRAP) that spans
 * the tail. Invariant: used bytes from head on (mod cap) hold n records and their markers;
 * n <= FER_POOL_SPILL_SLOTS. Under the pool's mu. */
#define BOX_ALIGN 16u
#define BOX_WRAP UINT64_MAX
struct box_rec {
    uint64_t len, stamp;
};
struct spill_box {
    uint8_t *buf;
    uint64_t cap, head, used;
    uint32_t n;
};

/*
 * Invariants: views[seq & 1] is the view in use; a set writes views[(seq + 1) & 1] under mu and
 * then bumps seq (release), so a reader that saw seq unchanged around its read read one whole
 * view. posted[0..n_posted) are dead keys for the deciding thread (under mu; `pending` says there
 * are some without taking mu). The standby ring holds count entries from head (oldest) on, live
 * or not; every live entry is in the chain of bucket[sid_hash ^ sequence & mask]; the arena holds
 * used bytes from a_head on (mod arena_cap), the spans of the ring's entries in order. Everything
 * from `e` on belongs to the deciding thread; counters have one writer (relaxed stores), but
 * pool_epoch (under mu), surrendered and stalls_detected (atomic adds: every publisher), and
 * spill_ignored and spill_returned (atomic adds: the spill topic's subscription).
 * last_alive, surrender_before and excluded_before only rise (compare-and-swap).
 */
struct fer_pool {
    struct fer_pool_config cfg;
    uint64_t key;
    pthread_mutex_t mu;
    pthread_cond_t cv;                   /* unused: fer_lock_init makes a pair */
    uint32_t seq;
    uint32_t pending;
    int wake_fd;                         /* the intake loop's doorbell, -1 = none */
    uint32_t n_posted;
    uint64_t posted[FER_POOL_TAKEOVERS_MAX];
    struct pool_view views[2];
    struct fer_pool_counters c;
    uint64_t last_now;                   /* the deciding thread's latest `now` */
    uint64_t last_alive;                 /* monotonic ns of the latest announcement, 0 = none */
    uint64_t surrender_before;           /* the own-stall watermark (monotonic ns), 0 = none */
    int64_t excluded_before;             /* ROS ns: after a surrender, this member counts for no
                                          * request stamped earlier (0 = none) */
    uint64_t last_expire;
    uint64_t owned[FER_POOL_OWNED_SLOTS];
    struct pool_memo *memo;              /* POOL_MEMO entries, the deciding thread's */
    struct pool_entry *e;
    uint32_t head, count;
    int32_t *bucket;
    uint64_t mask;
    uint64_t *answered;                  /* early-answer filter, mask + 1 fingerprints */
    uint8_t *arena;
    uint64_t arena_cap, a_head, a_used;
    uint32_t spill_on;                   /* fer_pool_set_spill (relaxed) */
    struct pool_hold hold[FER_POOL_HOLD_MAX]; /* held outcomes, under mu */
    uint32_t n_hold;                     /* slots in use (written under mu; read relaxed) */
    uint32_t n_held_entries;             /* held standby entries (the deciding thread's;
                                          * stored relaxed: fer_pool_holding reads it) */
    struct spill_box out, in;            /* handovers to publish / to decide, under mu */
};

/* the deciding thread's clock, for the owned_sessions estimate (read by any thread) */
static void saw_now(struct fer_pool *p, uint64_t now_ns)
{
    if (now_ns > p->last_now)
        __atomic_store_n(&p->last_now, now_ns, __ATOMIC_RELAXED);
}

/* relaxed: one writer; readers only report */
static void bump(uint64_t *counter, uint64_t n)
{
    __atomic_store_n(counter, *counter + n, __ATOMIC_RELAXED);
}

static void gauge32(uint32_t *g, uint32_t v) { __atomic_store_n(g, v, __ATOMIC_RELAXED); }
static void gauge64(uint64_t *g, uint64_t v) { __atomic_store_n(g, v, __ATOMIC_RELAXED); }

int fer_pool_create(const struct fer_pool_config *cfg, struct fer_pool **out)
{
    struct fer_pool *p;
    uint64_t nb = 2, i;

    if (out == NULL)
        return FER_EINVAL;
    *out = NULL;
    if (cfg == NULL || cfg->relay_id_len > FER_POOL_RELAY_ID_MAX || cfg->standby_entries == 0 ||
        cfg->standby_entries > (1u << 24) || cfg->standby_bytes == 0 || cfg->lease_ns == 0)
        return FER_EINVAL;
    p = calloc(1, sizeof(*p));
    if (p == NULL)
        return FER_ENOMEM;
    if (fer_lock_init(&p->mu, &p->cv) != FER_OK) {
        free(p);
        return FER_ESYS;
    }
    p->cfg = *cfg;
    p->key = fer_pool_mix64(fer_pool_hash((const uint8_t *)cfg->relay_id, cfg->relay_id_len));
    p->wake_fd = -1;
    while (nb < 2ull * cfg->standby_entries)
        nb <<= 1;
    p->mask = nb - 1;
    p->e = calloc(cfg->standby_entries, sizeof(*p->e));
    p->bucket = malloc(nb * sizeof(*p->bucket));
    p->answered = calloc(nb, sizeof(*p->answered));
    p->arena = malloc(cfg->standby_bytes);
    p->memo = calloc(POOL_MEMO, sizeof(*p->memo));
    p->arena_cap = cfg->standby_bytes;
    p->out.cap = p->in.cap = cfg->spill_bytes / BOX_ALIGN * BOX_ALIGN;
    if (p->out.cap) {
        p->out.buf = malloc(p->out.cap);
        p->in.buf = malloc(p->in.cap);
    }
    if (p->e == NULL || p->bucket == NULL || p->answered == NULL || p->arena == NULL ||
        p->memo == NULL || (p->out.cap && (p->out.buf == NULL || p->in.buf == NULL))) {
        fer_pool_destroy(p);
        return FER_ENOMEM;
    }
    for (i = 0; i < nb; i++)
        p->bucket[i] = -1;
    p->c.key = p->key;
    p->c.standby_capacity = cfg->standby_entries;
    p->c.standby_bytes_capacity = cfg->standby_bytes;
    *out = p;
    return FER_OK;
}

void fer_pool_destroy(struct fer_pool *p)
{
    if (p == NULL)
        return;
    fer_lock_fini(&p->mu, &p->cv);
    free(p->e);
    free(p->bucket);
    free(p->answered);
    free(p->arena);
    free(p->memo);
    free(p->out.buf);
    free(p->in.buf);
    free(p);
}

/* ---- the view ---------------------------------------------------------------------------------- */

int fer_pool_set_view(struct fer_pool *p, const struct fer_pool_member *members, uint32_t n)
{
    struct pool_view *next;
    uint32_t i, k, seq;

    if (p == NULL || n > FER_POOL_MEMBERS_MAX || (members == NULL && n > 0))
        return FER_EINVAL;
    for (i = 0; i < n; i++) {
        if (members[i].n_digests > FER_POOL_DIGESTS_MAX)
            return FER_EINVAL;
        for (k = 0; k < i; k++)
            if (members[k].key == members[i].key)
                return FER_EINVAL;
    }
    pthread_mutex_lock(&p->mu);
    seq = __atomic_load_n(&p->seq, __ATOMIC_RELAXED);
    next = &p->views[(seq + 1) & 1];
    next->n = n;
    next->n_dig = 0;
    next->any_mask = 0;
    next->open_from = 0;
    next->open_until = INT64_MAX;
    for (i = 0; i < n; i++)
        if (members[i].n_digests == 0)
            next->any_mask |= 1ull << i;
    for (i = 0; i < n; i++) {
        for (k = 0; k < members[i].n_digests; k++) {
            uint64_t h = members[i].digests[k];
            uint32_t d = 0;

            while (d < next->n_dig && next->dig_hash[d] != h)
                d++;
            if (d == next->n_dig) {
                next->dig_hash[d] = h;
                next->dig_mask[d] = next->any_mask;
                next->n_dig++;
            }
            next->dig_mask[d] |= 1ull << i;
        }
        next->m[i] = members[i];
        next->key[i] = members[i].key;
        next->from[i] = members[i].owning_from_ns;
        next->until[i] = members[i].owning_until_ns;
        if (members[i].owning_from_ns > next->open_from)
            next->open_from = members[i].owning_from_ns;
        if (members[i].owning_until_ns != 0 && members[i].owning_until_ns < next->open_until)
            next->open_until = members[i].owning_until_ns;
    }
    /* release: a reader that sees the new seq sees the whole new view */
    __atomic_store_n(&p->seq, seq + 1, __ATOMIC_RELEASE);
    gauge32(&p->c.pool_members, n);
    pthread_mutex_unlock(&p->mu);
    return FER_OK;
}

int fer_pool_set_epoch(struct fer_pool *p, uint32_t epoch)
{
    if (p == NULL)
        return FER_EINVAL;
    gauge32(&p->c.pool_epoch, epoch);
    return FER_OK;
}

uint32_t fer_pool_epoch(const struct fer_pool *p)
{
    return p ? __atomic_load_n(&p->c.pool_epoch, __ATOMIC_RELAXED) : 0;
}

int fer_pool_add_surrendered(struct fer_pool *p, uint64_t n)
{
    if (p == NULL)
        return FER_EINVAL;
    __atomic_fetch_add(&p->c.surrendered, n, __ATOMIC_RELAXED);
    return FER_OK;
}

/* ---- own stall --------------------------------------------------------------------------------- */

static void raise_u64(uint64_t *x, uint64_t v)
{
    uint64_t cur = __atomic_load_n(x, __ATOMIC_ACQUIRE);

    while (cur < v && !__atomic_compare_exchange_n(x, &cur, v, 1, __ATOMIC_ACQ_REL,
                                                   __ATOMIC_ACQUIRE))
        ;
}

static void raise_i64(int64_t *x, int64_t v)
{
    int64_t cur = __atomic_load_n(x, __ATOMIC_ACQUIRE);

    while (cur < v && !__atomic_compare_exchange_n(x, &cur, v, 1, __ATOMIC_ACQ_REL,
                                                   __ATOMIC_ACQUIRE))
        ;
}

static int64_t ros_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + (int64_t)ts.tv_nsec;
}

/* Whether the view in use holds a member other than this one (someone who could have taken
 * this member's work over). */
static int others_in_view(struct fer_pool *p)
{
    uint32_t s1, i;
    int others;

    do {
        const struct pool_view *v;

        s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        v = &p->views[s1 & 1];
        others = 0;
        for (i = 0; i < v->n && i < FER_POOL_MEMBERS_MAX && !others; i++)
            others = v->key[i] != p->key;
        atomic_thread_fence(memory_order_acquire);
    } while (s1 != __atomic_load_n(&p->seq, __ATOMIC_RELAXED));
    return others;
}

int fer_pool_surrender(struct fer_pool *p, uint64_t now_mono)
{
    int64_t now_ros = ros_now();
    uint64_t two;

    if (p == NULL)
        return FER_EINVAL;
    if (!others_in_view(p))
        return FER_OK; /* nobody could have taken its work over: keep it, answer it */
    two = fer_sat_mul(p->cfg.lease_ns, 2);
    /* the exclusion first: a decision that sees the new watermark sees it too */
    raise_i64(&p->excluded_before, two > (uint64_t)(INT64_MAX - now_ros) ? INT64_MAX
                                                                          : now_ros + (int64_t)two);
    raise_u64(&p->surrender_before, now_mono);
    gauge64(&p->c.surrender_before_ns, __atomic_load_n(&p->surrender_before, __ATOMIC_RELAXED));
    return FER_OK;
}

uint64_t fer_pool_stall_check(struct fer_pool *p, uint64_t now_mono)
{
    uint64_t last;

    if (p == NULL)
        return 0;
    last = __atomic_load_n(&p->last_alive, __ATOMIC_ACQUIRE);
    /* the gap is found once: the thread that moves last_alive past it surrenders */
    if (last != 0 && now_mono > last &&
        now_mono - last > fer_sat_add(p->cfg.lease_ns, FER_POOL_STALL_MARGIN_NS) &&
        __atomic_compare_exchange_n(&p->last_alive, &last, now_mono, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        __atomic_fetch_add(&p->c.stalls_detected, 1, __ATOMIC_RELAXED);
        fer_pool_surrender(p, now_mono);
    }
    return __atomic_load_n(&p->surrender_before, __ATOMIC_ACQUIRE);
}

int fer_pool_alive(struct fer_pool *p, uint64_t now_mono)
{
    if (p == NULL)
        return FER_EINVAL;
    fer_pool_stall_check(p, now_mono);
    raise_u64(&p->last_alive, now_mono);
    return FER_OK;
}

const char *fer_pool_relay_id(const struct fer_pool *p, uint32_t *relay_id_len)
{
    if (relay_id_len)
        *relay_id_len = p ? p->cfg.relay_id_len : 0;
    return p ? p->cfg.relay_id : "";
}

/* (score, key) of a beats b's: scores first, keys last, so distinct keys never tie */
static int beats(uint64_t sa, uint64_t ka, uint64_t sb, uint64_t kb)
{
    return sa > sb || (sa == sb && ka > kb);
}

/* The two highest-ranked covering members of v: how many there are (0..2). Only the members
 * serving the digest are scored; their windows are looked at only for an origin stamp outside
 * the range where every window is open. */
static uint32_t rank_view(const struct pool_view *v, uint64_t sid_hash, uint64_t digest_hash,
                          int64_t origin, uint64_t *k1, uint64_t *k2)
{
    uint64_t best = 0, second = 0, bits = serving(v, digest_hash);
    uint32_t found = 0;
    int open = origin == 0 || (origin >= v->open_from && origin < v->open_until);

    if (v->n < 64)
        bits &= (1ull << v->n) - 1;
    *k1 = *k2 = 0;
    for (; bits; bits &= bits - 1) {
        uint32_t i = (uint32_t)__builtin_ctzll(bits);
        uint64_t key = v->key[i], s;

        if (!open && ((v->from[i] != 0 && origin < v->from[i]) ||
                      (v->until[i] != 0 && origin >= v->until[i])))
            continue;
        s = mix64(key ^ sid_hash);
        if (found == 0 || beats(s, key, best, *k1)) {
            second = best;
            *k2 = *k1;
            best = s;
            *k1 = key;
        } else if (found == 1 || beats(s, key, second, *k2)) {
            second = s;
            *k2 = key;
        }
        found++;
    }
    return found > 2 ? 2 : found;
}

static inline uint64_t rd64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t rd32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, 4);
    return v;
}

/* The memo slot of n session id bytes for a digest: the first, last (and, past 16, middle)
 * words multiplied, not the placement hash (no loop over the bytes). */
static inline struct pool_memo *memo_slot(struct fer_pool *p, const uint8_t *s, uint32_t n,
                                          uint64_t digest_hash)
{
    uint64_t a = 0, b = 0, c = 0, x;

    if (n >= 8) {
        a = rd64(s);
        b = rd64(s + n - 8);
        if (n > 16)
            c = rd64(s + n / 2 - 4);
    } else if (n >= 4) {
        a = rd32(s);
        b = rd32(s + n - 4);
    } else if (n > 0) {
        a = s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16;
    }
    x = (a ^ digest_hash) * 0x9e3779b97f4a7c15ull ^ (b ^ n) * 0xc2b2ae3d27d4eb4full ^
        c * 0x165667b19e3779f9ull;
    x ^= x >> 29;
    return &p->memo[(x * 0xff51afd7ed558ccdull) >> (64 - POOL_MEMO_BITS)];
}

/* Whether the memo holds these n bytes: compared a word at a time (overlapping at the end) */
static inline int memo_holds(const struct pool_memo *m, const uint8_t *s, uint32_t n)
{
    uint32_t i;

    if (!m->kept || m->sid_len != n)
        return 0;
    if (n >= 8) {
        for (i = 0; i + 8 < n; i += 8)
            if (rd64(m->sid + i) != rd64(s + i))
                return 0;
        return rd64(m->sid + n - 8) == rd64(s + n - 8);
    }
    if (n >= 4)
        return rd32(m->sid) == rd32(s) && rd32(m->sid + n - 4) == rd32(s + n - 4);
    for (i = 0; i < n; i++)
        if (m->sid[i] != s[i])
            return 0;
    return 1;
}

/* The FNV-1a of n session id bytes, remembered in m (when they fit) for the next request */
static uint64_t memo_hash(struct pool_memo *m, const uint8_t *s, uint32_t n, int plain)
{
    uint64_t h = fnv1a(s, n);

    m->sid_hash = h;
    m->ranked = 0; /* the ranking there was another session's */
    m->kept = n <= MEMO_SID;
    if (m->kept) {
        m->sid_len = (uint8_t)n;
        m->plain = (uint8_t)plain;
        if (n)
            memcpy(m->sid, s, n);
    }
    return h;
}

/* The two highest-ranked covering members of the view in use (rank_view, read under the
 * sequence counter). memo: the deciding thread's, NULL for any other. */
static uint32_t rank(struct fer_pool *p, uint64_t sid_hash, uint64_t digest_hash, int64_t origin,
                     uint64_t *k1, uint64_t *k2, struct pool_memo *memo)
{
    uint32_t s1, found;
    int open;

    for (;;) {
        const struct pool_view *v;

        /* acquire: the view that seq names is whole once seen */
        s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        v = &p->views[s1 & 1];
        open = origin == 0 || (origin >= v->open_from && origin < v->open_until);
        if (memo != NULL && open && memo->ranked && memo->seq == s1 &&
            memo->sid_hash == sid_hash && memo->digest_hash == digest_hash) {
            *k1 = memo->k1;
            *k2 = memo->k2;
            found = memo->found;
        } else {
            found = rank_view(v, sid_hash, digest_hash, origin, k1, k2);
        }
        atomic_thread_fence(memory_order_acquire);
        if (s1 == __atomic_load_n(&p->seq, __ATOMIC_RELAXED))
            break; /* else a set overlapped the read: read the new view */
    }
    if (memo != NULL && open) {
        memo->sid_hash = sid_hash;
        memo->digest_hash = digest_hash;
        memo->k1 = *k1;
        memo->k2 = *k2;
        memo->seq = s1;
        memo->found = found;
        memo->ranked = 1;
    }
    return found;
}

/* A session's role by its id's hash h; memo: the deciding thread's slot of the session (its
 * calls count), NULL for any other thread (not counted). */
static int route(struct fer_pool *p, uint64_t h, uint64_t digest_hash, int64_t origin_ns,
                 uint64_t now_ns, struct pool_memo *memo, uint64_t *owner_key,
                 uint64_t *successor_key)
{
    uint64_t k1, k2;
    uint32_t found, count = memo != NULL;
    int64_t excluded;
    uint64_t a1 = 0, a2 = 0;
    int role, alone = 0, held = 0, copy = 0, stale;

    if (count) /* the deciding thread acts on what it takes: its own stall first */
        fer_pool_stall_check(p, now_ns);
    found = rank(p, h, digest_hash, origin_ns, &k1, &k2, memo);
    excluded = __atomic_load_n(&p->excluded_before, __ATOMIC_ACQUIRE);
    stale = excluded != 0 && (origin_ns != 0 ? origin_ns : ros_now()) < excluded;
    if (stale) {
        /* surrendered: the others may have taken this member's requests over until its
         * rejoin's owning_from, so it decides none of them (neither owner nor successor). But
         * they may have stalled and surrendered too: the member that the view ranks first
         * with every window ignored (the same at every member whose view has the same
         * members, whichever rejoins have been heard, its own included) holds it, until an
         * answer names it or it is due (fer_pool.h, "Hold, do not drop"); and the one it
         * ranks second keeps a copy for that first one's takeover: it may have died in the
         * stall of every member, and nobody else kept one */
        uint32_t n = rank(p, h, digest_hash, 0, &a1, &a2, NULL);

        held = n > 0 && a1 == p->key;
        copy = n == 2 && a2 == p->key;
    }
    if (stale && (held || found == 0 || k1 == p->key || (found == 2 && k2 == p->key))) {
        if (k1 == p->key) {
            k1 = k2;
            found--;
        }
        k2 = 0;
        if (found == 2)
            found = 1;
        /* the surrender saw others in the view: a view of itself alone now is its own stale
         * judgement of them (they outlived its stall), so it still decides nothing */
        alone = found == 0;
    }
    if (held)
        role = FER_POOL_HELD;
    else if (copy)
        role = FER_POOL_STALE_SUCCESSOR;
    else if (alone)
        role = FER_POOL_OTHER;
    else if (found == 0)
        role = FER_POOL_UNOWNED;
    else if (k1 == p->key)
        role = FER_POOL_OWNER;
    else if (found == 2 && k2 == p->key)
        role = FER_POOL_SUCCESSOR;
    else
        role = FER_POOL_OTHER;
    if (owner_key)
        *owner_key = copy ? a1 : k1;
    if (successor_key)
        *successor_key = found == 2 && !copy ? k2 : 0;
    if (count) {
        saw_now(p, now_ns);
        if (role == FER_POOL_UNOWNED)
            bump(&p->c.unowned, 1);
        else if (role != FER_POOL_OWNER)
            bump(&p->c.not_owner, 1);
        else
            __atomic_store_n(&p->owned[h % FER_POOL_OWNED_SLOTS], now_ns ? now_ns : 1,
                             __ATOMIC_RELAXED);
    }
    return role;
}

int fer_pool_route(struct fer_pool *p, const uint8_t *sid, uint32_t sid_len, uint64_t digest_hash,
                   int64_t origin_ns, uint64_t now_ns, uint32_t count, uint64_t *owner_key,
                   uint64_t *successor_key)
{
    struct pool_memo *m;
    uint64_t h;

    /* the memo is the deciding thread's: only a counting call (that thread's) uses it */
    if (!count)
        return route(p, fer_pool_hash(sid, sid_len), digest_hash, origin_ns, now_ns, NULL,
                     owner_key, successor_key);
    m = memo_slot(p, sid, sid_len, digest_hash);
    h = memo_holds(m, sid, sid_len) ? m->sid_hash
        : memo_hash(m, sid, sid_len, sid_len == 0 || memchr(sid, 0, sid_len) == NULL);
    return route(p, h, digest_hash, origin_ns, now_ns, m, owner_key, successor_key);
}

int fer_pool_route_wire(struct fer_pool *p, const uint8_t *sid, uint32_t sid_bytes,
                        uint64_t digest_hash, int64_t origin_ns, uint64_t now_ns,
                        uint64_t *owner_key, uint64_t *successor_key)
{
    /* the id if its only NUL ends it: held by the memo with no NUL in it, it is that string */
    uint32_t n = sid_bytes > 0 && sid[sid_bytes - 1] == 0 ? sid_bytes - 1 : sid_bytes;
    struct pool_memo *m = memo_slot(p, sid, n, digest_hash);
    uint64_t h;

    if (memo_holds(m, sid, n) && m->plain) {
        h = m->sid_hash;
    } else { /* the string ends at its first NUL (as rosidl's C strings do) */
        uint32_t len = (uint32_t)strnlen((const char *)sid, sid_bytes);

        if (len != n)
            m = memo_slot(p, sid, len, digest_hash);
        h = memo_hash(m, sid, len, 1);
    }
    return route(p, h, digest_hash, origin_ns, now_ns, m, owner_key, successor_key);
}

static uint64_t mono_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int fer_pool_role(struct fer_pool *p, const uint8_t *session_id, uint32_t session_id_len,
                  uint64_t digest_hash, int64_t origin_ns, uint32_t count, uint64_t *owner_key,
                  uint64_t *successor_key)
{
    if (p == NULL || (session_id == NULL && session_id_len > 0))
        return FER_EINVAL;
    return fer_pool_route(p, session_id, session_id_len, digest_hash, origin_ns,
                          count ? mono_now() : 0, count, owner_key, successor_key);
}

/* ---- takeovers --------------------------------------------------------------------------------- */

void fer_pool_set_wake(struct fer_pool *p, int fd)
{
    if (p != NULL)
        __atomic_store_n(&p->wake_fd, fd, __ATOMIC_RELEASE);
}

/* Ring the intake loop's doorbell (after a takeover or a handover was posted). */
static void ring(struct fer_pool *p)
{
    int fd = __atomic_load_n(&p->wake_fd, __ATOMIC_ACQUIRE);

    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t rc = write(fd, &one, sizeof(one));

        (void)rc;
    }
}

int fer_pool_takeover(struct fer_pool *p, uint64_t dead_key)
{
    if (p == NULL)
        return FER_EINVAL;
    pthread_mutex_lock(&p->mu);
    if (p->n_posted == FER_POOL_TAKEOVERS_MAX) {
        pthread_mutex_unlock(&p->mu);
        return FER_EFULL;
    }
    p->posted[p->n_posted++] = dead_key;
    __atomic_store_n(&p->pending, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&p->mu);
    ring(p);
    return FER_OK;
}

/* ---- the standby table (the deciding thread) --------------------------------------------------- */

/* ---- holding what an own stall would drop (fer_pool.h: "Hold, do not drop") ------------------- */

static uint64_t fingerprint(uint64_t sid_hash, uint64_t sequence);

/* The deciding thread: fp's answer was seen (or its request decided here) in the early-answer
 * filter; relaxed, as a publisher's fer_pool_hold reads it too. */
static void note_answered(struct fer_pool *p, uint64_t fp)
{
    __atomic_store_n(&p->answered[fp & p->mask], fp, __ATOMIC_RELAXED);
}

/* When held work is due: max(mark + lease + margin, arrival, deadline) + leases x lease; no
 * deadline counts as HOLD_NO_DEADLINE_LEASES leases after the rest of the max (an owner's
 * queue bounds its answer only through a deadline) */
#define HOLD_NO_DEADLINE_LEASES 3
static uint64_t hold_due(const struct fer_pool *p, uint64_t mark, uint64_t arrival_mono,
                         uint64_t deadline_mono, uint64_t leases)
{
    uint64_t t = fer_sat_add(mark, fer_sat_add(p->cfg.lease_ns, FER_POOL_STALL_MARGIN_NS));

    if (arrival_mono > t)
        t = arrival_mono;
    if (deadline_mono == 0)
        t = fer_sat_add(t, fer_sat_mul(p->cfg.lease_ns, HOLD_NO_DEADLINE_LEASES));
    else if (deadline_mono > t)
        t = deadline_mono;
    return fer_sat_add(t, fer_sat_mul(p->cfg.lease_ns, leases));
}

/* The deciding thread: an answer named fp; a held outcome of it is answered (under mu). */
static void hold_answered(struct fer_pool *p, uint64_t fp)
{
    uint32_t i;

    pthread_mutex_lock(&p->mu);
    for (i = 0; i < FER_POOL_HOLD_MAX; i++)
        if (p->hold[i].state == HOLD_WAITING && p->hold[i].fp == fp)
            p->hold[i].state = HOLD_ANSWERED;
    pthread_mutex_unlock(&p->mu);
}

int fer_pool_hold(struct fer_pool *p, const uint8_t *sid, uint32_t sid_len, uint64_t sequence,
                  uint64_t deadline_ros, uint64_t mark, uint64_t now_mono, int32_t *slot)
{
    uint64_t fp, deadline = 0;
    int64_t now_ros = ros_now();
    uint32_t i;

    if (p == NULL || slot == NULL || (sid == NULL && sid_len > 0))
        return FER_EINVAL;
    *slot = -1;
    fp = fingerprint(fnv1a(sid, sid_len), sequence);
    if (deadline_ros != 0) /* its deadline on the monotonic clock */
        deadline = deadline_ros > (uint64_t)now_ros
                       ? fer_sat_add(now_mono, deadline_ros - (uint64_t)now_ros)
                       : fer_sat_sub(now_mono, (uint64_t)now_ros - deadline_ros);
    if (__atomic_load_n(&p->answered[fp & p->mask], __ATOMIC_RELAXED) == fp) {
        __atomic_fetch_add(&p->c.surrendered, 1, __ATOMIC_RELAXED); /* answered already */
        return FER_POOL_HOLD_ANSWERED;
    }
    pthread_mutex_lock(&p->mu);
    for (i = 0; i < FER_POOL_HOLD_MAX && p->hold[i].state != HOLD_FREE; i++)
        ;
    if (i == FER_POOL_HOLD_MAX) {
        pthread_mutex_unlock(&p->mu);
        __atomic_fetch_add(&p->c.hold_full, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&p->c.surrendered, 1, __ATOMIC_RELAXED);
        return FER_EFULL;
    }
    p->hold[i] = (struct pool_hold){fp, hold_due(p, mark, 0, deadline, 1), HOLD_WAITING, 0};
    __atomic_store_n(&p->n_hold, p->n_hold + 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&p->c.held, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->mu);
    *slot = (int32_t)i;
    return FER_POOL_HOLD_WAIT;
}

int fer_pool_held(struct fer_pool *p, int32_t slot, uint64_t now_mono)
{
    struct pool_hold *h;
    int rc = FER_POOL_HOLD_WAIT;

    if (p == NULL || slot < 0 || slot >= FER_POOL_HOLD_MAX)
        return FER_EINVAL;
    pthread_mutex_lock(&p->mu);
    h = &p->hold[slot];
    if (h->state == HOLD_ANSWERED)
        rc = FER_POOL_HOLD_ANSWERED;
    else if (h->state == HOLD_WAITING && now_mono >= h->due)
        rc = FER_POOL_HOLD_DUE;
    else if (h->state == HOLD_FREE)
        rc = FER_EINVAL;
    if (rc == FER_POOL_HOLD_ANSWERED || rc == FER_POOL_HOLD_DUE) {
        h->state = HOLD_FREE;
        __atomic_store_n(&p->n_hold, p->n_hold - 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(rc == FER_POOL_HOLD_DUE ? &p->c.held_released : &p->c.surrendered, 1,
                           __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

uint32_t fer_pool_holding(const struct fer_pool *p)
{
    if (p == NULL)
        return 0;
    return __atomic_load_n(&p->n_hold, __ATOMIC_RELAXED) +
           __atomic_load_n(&p->n_held_entries, __ATOMIC_RELAXED);
}

struct pool_entry;
static void hold_entry(struct fer_pool *p, struct pool_entry *x, uint64_t mark, uint64_t leases);


static uint64_t fingerprint(uint64_t sid_hash, uint64_t sequence)
{
    return fer_pool_mix64(sid_hash ^ fer_pool_mix64(sequence)) | 1u;
}

static struct pool_entry *at(struct fer_pool *p, uint32_t i) /* i-th from the oldest */
{
    return &p->e[(p->head + i) % p->cfg.standby_entries];
}

static void gauges(struct fer_pool *p)
{
    gauge64(&p->c.standby_bytes, p->a_used);
}

static void unlink_entry(struct fer_pool *p, struct pool_entry *x)
{
    int32_t idx = (int32_t)(x - p->e);
    int32_t *link = &p->bucket[(x->sid_hash ^ x->sequence) & p->mask];

    while (*link >= 0 && *link != idx)
        link = &p->e[*link].next;
    if (*link == idx)
        *link = x->next;
    x->live = 0;
    if (x->held)
        __atomic_store_n(&p->n_held_entries, p->n_held_entries - 1, __ATOMIC_RELAXED);
    gauge32(&p->c.standby_entries, p->c.standby_entries - 1);
}

/* Pop the oldest entry (it frees its span); a live one is counted evicted. */
static void pop_oldest(struct fer_pool *p)
{
    struct pool_entry *x = at(p, 0);

    if (x->live) {
        unlink_entry(p, x);
        bump(&p->c.standby_evicted, 1);
    }
    p->a_head = (p->a_head + x->span) % p->arena_cap;
    p->a_used -= x->span;
    if (p->a_used == 0)
        p->a_head = 0;
    p->head = (p->head + 1) % p->cfg.standby_entries;
    p->count--;
}

/* Free dead entries at the head: their bytes come back. */
static void pop_dead(struct fer_pool *p)
{
    while (p->count && !at(p, 0)->live)
        pop_oldest(p);
}

/* Where len contiguous bytes go in the arena now (skip = the tail bytes left unused before
 * wrapping to 0), or 0 if they do not fit. */
static int arena_fit(const struct fer_pool *p, uint64_t len, uint64_t *off, uint64_t *skip)
{
    uint64_t tail = (p->a_head + p->a_used) % p->arena_cap;

    *skip = 0;
    if (p->a_used == 0) {
        *off = 0;
        return len <= p->arena_cap;
    }
    if (tail > p->a_head) {
        if (len <= p->arena_cap - tail) {
            *off = tail;
            return 1;
        }
        *skip = p->arena_cap - tail; /* wrap: the bytes go at 0, before the oldest */
        *off = 0;
        return len <= p->a_head;
    }
    *off = tail;
    return len <= p->a_head - tail;
}

/* Keep a request (session hash h, sequence) for owner_key; spilled: handed to it (§13.5). The
 * entry, or NULL when it was not kept (answered already, or too big). */
static struct pool_entry *keep(struct fer_pool *p, const uint8_t *cdr, uint64_t len, uint64_t h,
                 uint64_t sequence, uint64_t owner_key, uint64_t arrival_ns,
                 uint64_t deadline_ns, uint64_t now_ns, uint32_t spilled);

/* standby_put and standby_put_stale: keep a request's CDR bytes for owner_key, marked stale */
static int put(struct fer_pool *p, const uint8_t *cdr, uint64_t len, uint64_t owner_key,
               uint64_t arrival_ns, uint64_t deadline_ns, uint64_t now_ns, uint32_t stale)
{
    const uint8_t *sid;
    uint32_t sid_len;
    uint64_t sequence;
    struct pool_entry *x;

    if (p == NULL || cdr == NULL || fer_wire_request_key(cdr, len, &sid, &sid_len, &sequence) != 0)
        return FER_EINVAL;
    x = keep(p, cdr, len, fer_pool_hash(sid, sid_len), sequence, owner_key, arrival_ns,
             deadline_ns, now_ns, 0);
    if (x != NULL)
        x->stale = stale;
    return FER_OK;
}

int fer_pool_standby_put(struct fer_pool *p, const uint8_t *cdr, uint64_t len,
                         uint64_t owner_key, uint64_t arrival_ns, uint64_t deadline_ns,
                         uint64_t now_ns)
{
    return put(p, cdr, len, owner_key, arrival_ns, deadline_ns, now_ns, 0);
}

int fer_pool_standby_put_stale(struct fer_pool *p, const uint8_t *cdr, uint64_t len,
                               uint64_t owner_key, uint64_t arrival_ns, uint64_t deadline_ns,
                               uint64_t now_ns)
{
    return put(p, cdr, len, owner_key, arrival_ns, deadline_ns, now_ns, 1);
}

/* A copy this member's own stall covers (watermark mark): kept before the stall, or a stale
 * copy kept after it. Its owner may have died in the stall: expiry waits for that death to be
 * judged, and a takeover holds it rather than deciding it at once. */
static int stall_covers(const struct pool_entry *x, uint64_t mark)
{
    return x->arrival_ns < mark || x->stale;
}

/* Hold a kept entry until an answer names it or due (the deciding thread) */
static void hold_entry(struct fer_pool *p, struct pool_entry *x, uint64_t mark, uint64_t leases)
{
    x->held = 1;
    x->due_ns = hold_due(p, mark, x->arrival_ns, x->deadline_ns, leases);
    __atomic_store_n(&p->n_held_entries, p->n_held_entries + 1, __ATOMIC_RELAXED);
    bump(&p->c.held, 1);
}

int fer_pool_standby_hold(struct fer_pool *p, const uint8_t *cdr, uint64_t len,
                          uint64_t arrival_ns, uint64_t deadline_ns, uint64_t now_ns)
{
    const uint8_t *sid;
    uint32_t sid_len;
    uint64_t sequence;
    struct pool_entry *x;

    if (p == NULL || cdr == NULL || fer_wire_request_key(cdr, len, &sid, &sid_len, &sequence) != 0)
        return FER_EINVAL;
    x = keep(p, cdr, len, fer_pool_hash(sid, sid_len), sequence, p->key, arrival_ns, deadline_ns,
             now_ns, 0);
    if (x != NULL)
        hold_entry(p, x, __atomic_load_n(&p->surrender_before, __ATOMIC_ACQUIRE), 1);
    return FER_OK;
}

static int key_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

/* The keys of the view in force, sorted; how many (the deciding thread, without the lock) */
static uint32_t view_keys(struct fer_pool *p, uint64_t keys[FER_POOL_MEMBERS_MAX])
{
    uint32_t nk, i, s1;

    do {
        const struct pool_view *v;

        s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        v = &p->views[s1 & 1];
        nk = v->n < FER_POOL_MEMBERS_MAX ? v->n : FER_POOL_MEMBERS_MAX;
        for (i = 0; i < nk; i++)
            keys[i] = v->m[i].key;
        atomic_thread_fence(memory_order_acquire);
    } while (s1 != __atomic_load_n(&p->seq, __ATOMIC_RELAXED));
    qsort(keys, nk, sizeof(keys[0]), key_cmp);
    return nk;
}

static int in_keys(uint64_t key, const uint64_t *keys, uint32_t nk)
{
    return bsearch(&key, keys, nk, sizeof(keys[0]), key_cmp) != NULL;
}

uint64_t fer_pool_run_held(struct fer_pool *p, uint64_t now_ns, fer_pool_redecide_fn fn,
                           void *ctx)
{
    uint64_t keys[FER_POOL_MEMBERS_MAX], done = 0;
    uint32_t i, nk;

    if (p->n_held_entries == 0)
        return 0;
    nk = view_keys(p, keys);
    for (i = 0; i < p->count; i++) {
        struct pool_entry *x = at(p, i);

        if (!x->live || !x->held)
            continue;
        if (x->owner_key != p->key && in_keys(x->owner_key, keys, nk)) {
            /* a copy whose owner is back in the view: the death its takeover acted on was this
             * member's stale view after its stall, and the live owner answers it (this member
             * may have missed that answer in the stall). A dead one never comes back: a
             * restart has another relay_id, so another key. */
            unlink_entry(p, x);
            bump(&p->c.surrendered, 1);
            continue;
        }
        if (now_ns < x->due_ns)
            continue;
        unlink_entry(p, x); /* due and nobody answered it: decided here, once */
        bump(&p->c.held_released, 1);
        bump(&p->c.held_requests_decided, 1);
        note_answered(p, fingerprint(x->sid_hash, x->sequence));
        fn(ctx, p->arena + x->off, x->len, x->arrival_ns);
        done++;
    }
    pop_dead(p);
    gauges(p);
    return done;
}

static struct pool_entry *keep(struct fer_pool *p, const uint8_t *cdr, uint64_t len, uint64_t h,
                               uint64_t sequence, uint64_t owner_key, uint64_t arrival_ns,
                               uint64_t deadline_ns, uint64_t now_ns, uint32_t spilled)
{
    uint64_t fp, off, skip;
    struct pool_entry *x;
    int32_t idx, *chain;

    fp = fingerprint(h, sequence);
    saw_now(p, now_ns);
    if (__atomic_load_n(&p->answered[fp & p->mask], __ATOMIC_RELAXED) == fp) {
        bump(&p->c.answers_early, 1); /* its answer came first */
        return NULL;
    }
    if (len > p->arena_cap) {
        bump(&p->c.standby_evicted, 1);
        return NULL;
    }
    pop_dead(p);
    while (p->count == p->cfg.standby_entries || !arena_fit(p, len, &off, &skip))
        pop_oldest(p);
    idx = (int32_t)((p->head + p->count) % p->cfg.standby_entries);
    x = &p->e[idx];
    p->count++;
    memcpy(p->arena + off, cdr, len);
    p->a_used += skip + len;
    *x = (struct pool_entry){h, sequence, owner_key, arrival_ns, deadline_ns, off, len,
                             skip + len, 1, -1, spilled, 0, 0, 0};
    chain = &p->bucket[(h ^ sequence) & p->mask];
    x->next = *chain;
    *chain = idx;
    bump(&p->c.standby_stored, 1);
    gauge32(&p->c.standby_entries, p->c.standby_entries + 1);
    gauges(p);
    return x;
}

/* Remove every live entry of (sid_hash, sequence); how many. */
static int remove_answered(struct fer_pool *p, uint64_t h, uint64_t sequence)
{
    int32_t idx = p->bucket[(h ^ sequence) & p->mask];
    int n = 0;

    while (idx >= 0) {
        struct pool_entry *x = &p->e[idx];

        idx = x->next;
        if (x->live && x->sid_hash == h && x->sequence == sequence) {
            if (x->held) /* held after an own stall: another member answered it */
                __atomic_fetch_add(&p->c.surrendered, 1, __ATOMIC_RELAXED);
            unlink_entry(p, x);
            n++;
        }
    }
    return n;
}

int fer_pool_answer(struct fer_pool *p, const uint8_t *cdr, uint64_t len)
{
    struct fer_answer_view a;
    uint64_t sequence, h, fp;
    int n;

    if (p == NULL || cdr == NULL)
        return FER_EINVAL;
    /* session_id, sequence and relay_id, read in place by the plan of ActionMessage.msg */
    if (fer_answer_parse(cdr, len, &a) != 0) {
        bump(&p->c.answers_malformed, 1);
        return FER_EINVAL;
    }
    if (a.relay_id_len == p->cfg.relay_id_len && a.relay_id_len > 0 &&
        memcmp(a.relay_id, p->cfg.relay_id, a.relay_id_len) == 0)
        return 0; /* its own answer: for a request it decided, never kept */
    bump(&p->c.answers_seen, 1);
    h = fer_pool_hash(a.session_id, a.session_id_len);
    sequence = a.sequence;
    n = remove_answered(p, h, sequence);
    fp = fingerprint(h, sequence);
    if (__atomic_load_n(&p->n_hold, __ATOMIC_RELAXED))
        hold_answered(p, fp);
    if (n == 0) {
        note_answered(p, fp);
    } else {
        bump(&p->c.standby_answered, (uint64_t)n);
    }
    pop_dead(p);
    gauges(p);
    return n;
}

int fer_pool_expire(struct fer_pool *p, uint64_t now_ns)
{
    uint64_t keys[FER_POOL_MEMBERS_MAX], lease, mark, floor;
    uint32_t nk, i;
    int n = 0;

    if (p == NULL)
        return FER_EINVAL;
    lease = p->cfg.lease_ns;
    /* a copy the stall covers: a death in the stall is judged here by lease + margin after the
     * stall was found; until then its deadline counts from there */
    mark = __atomic_load_n(&p->surrender_before, __ATOMIC_ACQUIRE);
    floor = mark ? fer_sat_add(mark, fer_sat_add(lease, FER_POOL_STALL_MARGIN_NS)) : 0;
    saw_now(p, now_ns);
    nk = view_keys(p, keys);
    for (i = 0; i < p->count; i++) {
        struct pool_entry *x = at(p, i);
        uint64_t due, from;
        int live;

        if (!x->live || x->deadline_ns == 0 || x->held)
            continue; /* no deadline: kept until answered or evicted; held: until due */
        live = in_keys(x->owner_key, keys, nk);
        from = x->deadline_ns;
        if (stall_covers(x, mark) && from < floor)
            from = floor;
        due = fer_sat_add(from, fer_sat_mul(lease, live ? 1 : 4));
        if (now_ns >= due) {
            unlink_entry(p, x);
            bump(&p->c.standby_expired, 1);
            n++;
        }
    }
    pop_dead(p);
    gauges(p);
    p->last_expire = now_ns;
    return n;
}

/* The deciding thread, each pass of its loop: expiry at most every lease / 4, its own stall
 * found first (the first pass after a stall must not expire what the stall covers). */
void fer_pool_tick(struct fer_pool *p, uint64_t now_ns)
{
    if (now_ns >= fer_sat_add(p->last_expire, p->cfg.lease_ns / 4)) {
        fer_pool_stall_check(p, now_ns);
        fer_pool_expire(p, now_ns);
    }
}

uint64_t fer_pool_run_takeovers(struct fer_pool *p, fer_pool_redecide_fn fn, void *ctx)
{
    uint64_t keys[FER_POOL_TAKEOVERS_MAX], done = 0, mark;
    uint32_t nk, k, i;

    if (!__atomic_load_n(&p->pending, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&p->mu);
    nk = p->n_posted;
    memcpy(keys, p->posted, nk * sizeof(keys[0]));
    p->n_posted = 0;
    __atomic_store_n(&p->pending, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->mu);
    mark = __atomic_load_n(&p->surrender_before, __ATOMIC_ACQUIRE);
    for (k = 0; k < nk; k++) {
        bump(&p->c.takeovers, 1);
        /* oldest first; fn decides through the intake, which never adds to the table here */
        for (i = 0; i < p->count; i++) {
            struct pool_entry *x = at(p, i);

            if (!x->live || x->owner_key != keys[k] || x->held)
                continue;
            if (stall_covers(x, mark)) {
                /* kept before this member's own stall, or after it but stamped before its
                 * exclusion (a stale copy): while it was dead to the others, its owner may
                 * have answered it, and a death this member judges just after resuming may be
                 * its own stale view; but the owner may have stalled too and surrendered it,
                 * or died in the stall. Held: dropped on the owner's (or anyone's) answer,
                 * decided here when due, a lease after the owner's own hold (fer_pool.h). */
                hold_entry(p, x, mark, 2);
                continue;
            }
            unlink_entry(p, x);
            bump(&p->c.taken_over_requests, 1);
            /* decided here now: a handover of it that comes later is not decided again */
            note_answered(p, fingerprint(x->sid_hash, x->sequence));
            if (x->spilled) /* handed to the dead member: answered here, never spilled again */
                bump(&p->c.spill_back, 1);
            fn(ctx, p->arena + x->off, x->len, x->arrival_ns);
            done++;
        }
    }
    pop_dead(p);
    gauges(p);
    return done;
}

int fer_pool_standby_snapshot(struct fer_pool *p, uint64_t *sid_hash, uint64_t *sequence,
                              uint64_t *owner_key, uint32_t max)
{
    uint32_t i, n = 0;

    if (p == NULL || ((sid_hash == NULL || sequence == NULL || owner_key == NULL) && max > 0))
        return FER_EINVAL;
    for (i = 0; i < p->count && n < max; i++) {
        const struct pool_entry *x = at(p, i);

        if (!x->live)
            continue;
        sid_hash[n] = x->sid_hash;
        sequence[n] = x->sequence;
        owner_key[n] = x->owner_key;
        n++;
    }
    return (int)n;
}

int fer_pool_counters(struct fer_pool *p, struct fer_pool_counters *out)
{
    uint64_t now, owned = 0;
    uint32_t i;

    if (p == NULL || out == NULL)
        return FER_EINVAL;
    now = __atomic_load_n(&p->last_now, __ATOMIC_RELAXED);
    for (i = 0; i < FER_POOL_OWNED_SLOTS; i++) {
        uint64_t t = __atomic_load_n(&p->owned[i], __ATOMIC_RELAXED);

        owned += t != 0 && fer_sat_add(t, p->cfg.lease_ns) >= now;
    }
    pthread_mutex_lock(&p->mu); /* surrendered's writers */
#define RD(f) out->f = __atomic_load_n(&p->c.f, __ATOMIC_RELAXED)
    RD(not_owner); RD(unowned); RD(standby_stored); RD(standby_answered); RD(standby_expired);
    RD(standby_evicted); RD(answers_seen); RD(answers_malformed); RD(answers_early);
    RD(takeovers); RD(taken_over_requests); RD(surrendered); RD(standby_bytes);
    RD(standby_bytes_capacity); RD(standby_entries); RD(standby_capacity); RD(pool_members);
    RD(pool_epoch); RD(key); RD(stalls_detected); RD(surrender_before_ns); RD(spilled_out);
    RD(spilled_in); RD(spill_ignored); RD(spill_dropped); RD(spill_back); RD(spill_returned);
    RD(spill_taken_back); RD(held); RD(held_released); RD(hold_full);
    RD(held_requests_decided);
#undef RD
    pthread_mutex_unlock(&p->mu);
    out->owned_sessions = owned;
    return FER_OK;
}

/* ---- spill on capacity (docs/design.md §13.5) -------------------------------------------------- */

static uint64_t box_size(uint64_t len)
{
    return sizeof(struct box_rec) + (len + BOX_ALIGN - 1) / BOX_ALIGN * BOX_ALIGN;
}

/* Where a record of len payload bytes goes in b now (*wrap: the tail bytes a marker spans
 * first), or 0 when it does not fit. */
static int box_fit(const struct spill_box *b, uint64_t len, uint64_t *off, uint64_t *wrap)
{
    uint64_t need = box_size(len), tail;

    *wrap = 0;
    if (b->buf == NULL || b->n >= FER_POOL_SPILL_SLOTS || b->used == b->cap)
        return 0;
    if (b->used == 0) {
        *off = 0;
        return need <= b->cap;
    }
    tail = (b->head + b->used) % b->cap;
    if (tail > b->head) {
        if (need <= b->cap - tail) {
            *off = tail;
            return 1;
        }
        *wrap = b->cap - tail; /* a multiple of BOX_ALIGN: room for the marker */
        *off = 0;
        return need <= b->head;
    }
    *off = tail;
    return need <= b->head - tail;
}

/* Append a record (payload written by the caller at the returned pointer), under mu. */
static uint8_t *box_push(struct spill_box *b, uint64_t len, uint64_t stamp)
{
    uint64_t off, wrap;
    struct box_rec rec = {len, stamp};

    if (!box_fit(b, len, &off, &wrap))
        return NULL;
    if (wrap) {
        struct box_rec marker = {BOX_WRAP, 0};

        memcpy(b->buf + (b->head + b->used) % b->cap, &marker, sizeof(marker));
        b->used += wrap;
    }
    memcpy(b->buf + off, &rec, sizeof(rec));
    b->used += box_size(len);
    b->n++;
    return b->buf + off + sizeof(rec);
}

/* The oldest record (its payload, *len, *stamp), or NULL; under mu. */
static const uint8_t *box_peek(struct spill_box *b, uint64_t *len, uint64_t *stamp)
{
    struct box_rec rec;

    if (b->n == 0)
        return NULL;
    memcpy(&rec, b->buf + b->head, sizeof(rec));
    if (rec.len == BOX_WRAP) { /* skip the tail the marker spans */
        b->used -= b->cap - b->head;
        b->head = 0;
        memcpy(&rec, b->buf, sizeof(rec));
    }
    *len = rec.len;
    *stamp = rec.stamp;
    return b->buf + b->head + sizeof(rec);
}

/* Drop the oldest record (box_peek found it); under mu. */
static void box_pop(struct spill_box *b, uint64_t len)
{
    b->head = (b->head + box_size(len)) % b->cap;
    b->used -= box_size(len);
    b->n--;
    if (b->used == 0)
        b->head = 0;
}

int fer_pool_set_spill(struct fer_pool *p, uint32_t on)
{
    if (p == NULL)
        return FER_EINVAL;
    __atomic_store_n(&p->spill_on, on ? 1u : 0u, __ATOMIC_RELAXED);
    return FER_OK;
}

uint32_t fer_pool_spilling(const struct fer_pool *p)
{
    return p != NULL && __atomic_load_n(&p->spill_on, __ATOMIC_RELAXED);
}

/* A handover (msg/PoolSpill.msg, written through its plan: fer_wire.h) into buf[0..cap): the
 * bytes it takes, whole in buf when they fit (buf NULL: sized only). */
static uint64_t write_handover(uint8_t *buf, uint64_t cap, const struct fer_pool *p,
                               const struct fer_pool_member *target, const uint8_t *sid,
                               uint32_t sid_len, uint64_t sequence, uint64_t generation,
                               int64_t stamp, const uint8_t *cdr, uint64_t len)
{
    /* builtin_interfaces/Time, saturated as timebase.ros_time */
    uint64_t t = stamp <= 0 ? 0 : (uint64_t)stamp;
    uint64_t sec = t / 1000000000ull;
    struct fer_spill_view v = {(const uint8_t *)p->cfg.relay_id, p->cfg.relay_id_len,
                               fer_pool_epoch(p), (const uint8_t *)target->relay_id,
                               target->relay_id_len, sid, sid_len, sequence, generation,
                               sec > INT32_MAX ? INT32_MAX : (int32_t)sec,
                               sec > INT32_MAX ? 999999999u : (uint32_t)(t % 1000000000ull),
                               cdr, len};

    return fer_spill_write(&v, buf, cap);
}

/* The view's member of key (a copy, read under the sequence counter); 0 when absent. */
static int view_member(struct fer_pool *p, uint64_t key, struct fer_pool_member *out)
{
    uint32_t s1, i;
    int found;

    do {
        const struct pool_view *v;

        s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE);
        v = &p->views[s1 & 1];
        found = 0;
        for (i = 0; i < v->n && i < FER_POOL_MEMBERS_MAX && !found; i++)
            if (v->key[i] == key) {
                *out = v->m[i];
                found = 1;
            }
        atomic_thread_fence(memory_order_acquire);
    } while (s1 != __atomic_load_n(&p->seq, __ATOMIC_RELAXED));
    return found;
}

/* A handover's bytes at most, for a request of len bytes (the ids at their longest). */
static uint64_t handover_max(uint64_t len)
{
    return len + 2 * (FER_POOL_RELAY_ID_MAX + 8) + FER_SESSION_ID_MAX + 64;
}

int fer_pool_spill_fits(struct fer_pool *p, uint64_t target_key, uint32_t remaining_nfe,
                        int64_t deadline_ros, int64_t now_ros, uint64_t len)
{
    struct fer_pool_member m;
    uint64_t off, wrap, rounds, bound;
    int room;

    if (p == NULL || !__atomic_load_n(&p->spill_on, __ATOMIC_RELAXED) || target_key == 0 ||
        target_key == p->key || !view_member(p, target_key, &m) || m.workers == 0 ||
        m.relay_id_len == 0 || m.relay_id_len > FER_POOL_RELAY_ID_MAX)
        return 0;
    if (deadline_ros > 0) {
        /* its queue ahead of it in rounds of its workers, then this request's own NFEs */
        rounds = 1 + (m.queue_depth + m.workers - 1) / m.workers;
        bound = fer_sat_add(m.admission_reserve_ns,
                            fer_sat_mul(fer_sat_mul(m.nfe_ns, remaining_nfe), rounds));
        if (deadline_ros <= now_ros || bound >= (uint64_t)(deadline_ros - now_ros))
            return 0;
    }
    pthread_mutex_lock(&p->mu);
    room = box_fit(&p->out, handover_max(len), &off, &wrap);
    pthread_mutex_unlock(&p->mu);
    return room;
}

int fer_pool_spill_out(struct fer_pool *p, const uint8_t *cdr, uint64_t len,
                       uint64_t target_key, const uint8_t *session_id, uint32_t session_id_len,
                       uint64_t sequence, uint64_t generation, uint64_t arrival_ns,
                       uint64_t deadline_ns, uint64_t now_ns)
{
    struct fer_pool_member m;
    int64_t stamp = ros_now();
    uint64_t n;
    uint8_t *at;

    if (p == NULL || cdr == NULL || len > UINT32_MAX || session_id_len > FER_SESSION_ID_MAX ||
        (session_id == NULL && session_id_len > 0) || !view_member(p, target_key, &m) ||
        m.relay_id_len > FER_POOL_RELAY_ID_MAX)
        return FER_EINVAL;
    n = write_handover(NULL, 0, p, &m, session_id, session_id_len, sequence, generation, stamp,
                       cdr, len);
    if (n == 0)
        return FER_EINVAL; /* PoolSpill's plan not loaded (rcl_abi.load_wire) */
    pthread_mutex_lock(&p->mu);
    at = box_push(&p->out, n, 0);
    if (at != NULL) {
        write_handover(at, n, p, &m, session_id, session_id_len, sequence, generation, stamp, cdr,
                       len);
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (at == NULL)
        return FER_EFULL;
    /* kept until the target's answer names it, or decided here on the target's death */
    keep(p, cdr, len, fer_pool_hash(session_id, session_id_len), sequence, target_key,
         arrival_ns, deadline_ns, now_ns, 1);
    bump(&p->c.spilled_out, 1);
    return FER_OK;
}

int64_t fer_pool_spill_next(struct fer_pool *p, uint8_t *buf, uint64_t cap, uint64_t timeout_ns)
{
    struct timespec until = fer_deadline_after(timeout_ns);
    const uint8_t *rec = NULL;
    uint64_t len = 0, stamp;
    int64_t got = 0;

    if (p == NULL || (buf == NULL && cap > 0))
        return FER_EINVAL;
    pthread_mutex_lock(&p->mu);
    while ((rec = box_peek(&p->out, &len, &stamp)) == NULL &&
           pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0)
        ;
    if (rec != NULL && len <= cap) {
        memcpy(buf, rec, len);
        box_pop(&p->out, len);
        got = (int64_t)len;
    } else if (rec != NULL) {
        got = FER_EINVAL; /* a buffer smaller than spill_bytes: the record stays */
    }
    pthread_mutex_unlock(&p->mu);
    return got;
}

/* A handover's fields (msg/PoolSpill.msg, read through its plan); 0 when they parse. */
static int parse_handover(const uint8_t *cdr, uint64_t len, struct fer_spill_view *h,
                          int64_t *stamp)
{
    if (fer_spill_parse(cdr, len, h) != 0)
        return -1;
    *stamp = (int64_t)h->stamp_sec * 1000000000ll + h->stamp_nanosec;
    return 0;
}

/* Whether id (len bytes) is this member's relay_id */
static int is_me(const struct fer_pool *p, const uint8_t *id, uint32_t len)
{
    return len == p->cfg.relay_id_len && memcmp(id, p->cfg.relay_id, len) == 0;
}

int fer_pool_spill_in(struct fer_pool *p, const uint8_t *cdr, uint64_t len, uint64_t now_mono)
{
    struct fer_spill_view h;
    int64_t stamp;
    uint8_t *at;

    if (p == NULL || cdr == NULL || parse_handover(cdr, len, &h, &stamp) != 0)
        return FER_EINVAL;
    if (!is_me(p, h.target, h.target_len)) {
        __atomic_fetch_add(&p->c.spill_ignored, 1, __ATOMIC_RELAXED);
        return 0;
    }
    pthread_mutex_lock(&p->mu);
    at = box_push(&p->in, len, now_mono);
    if (at != NULL)
        memcpy(at, cdr, len);
    pthread_mutex_unlock(&p->mu);
    if (at == NULL) /* a handover goes back to its owner at once; a give-back waits for room */
        return is_me(p, h.relay_id, h.relay_id_len) ? FER_EFULL : FER_POOL_SPILL_GIVE_BACK;
    ring(p);
    return 1;
}

int64_t fer_pool_spill_give_back(struct fer_pool *p, const uint8_t *cdr, uint64_t len,
                                 uint8_t *buf, uint64_t cap)
{
    struct fer_spill_view h;
    int64_t stamp;
    uint64_t n;

    if (p == NULL || cdr == NULL || parse_handover(cdr, len, &h, &stamp) != 0 ||
        is_me(p, h.relay_id, h.relay_id_len))
        return FER_EINVAL;
    /* everything as the owner wrote it (its stamp: its own stall still drops it), but the
     * target: the owner itself */
    h.target = h.relay_id;
    h.target_len = h.relay_id_len;
    n = fer_spill_write(&h, buf, cap);
    if (n == 0 || n > cap || n > INT64_MAX)
        return FER_EINVAL;
    __atomic_fetch_add(&p->c.spill_returned, 1, __ATOMIC_RELAXED);
    return (int64_t)n;
}

/* Whether an answer to (session id, sequence) was seen or given here (the early-answer filter) */
static int answered_already(const struct fer_pool *p, const uint8_t *sid, uint32_t sid_len,
                            uint64_t sequence)
{
    uint64_t fp = fingerprint(fer_pool_hash(sid, sid_len), sequence);

    return p->answered[fp & p->mask] == fp;
}

uint64_t fer_pool_run_spills(struct fer_pool *p, fer_pool_redecide_fn fn, void *ctx)
{
    uint64_t done = 0, len, stamp;
    const uint8_t *rec;

    for (;;) {
        struct fer_spill_view h;
        int64_t hstamp;
        uint64_t arrival, sh;
        int32_t idx;

        pthread_mutex_lock(&p->mu);
        rec = box_peek(&p->in, &len, &stamp);
        pthread_mutex_unlock(&p->mu);
        if (rec == NULL)
            break;
        /* rec stays put until popped: writers only fill free space */
        if (parse_handover(rec, len, &h, &hstamp) != 0 ||
            hstamp < __atomic_load_n(&p->excluded_before, __ATOMIC_ACQUIRE) ||
            answered_already(p, h.session_id, h.session_id_len, h.sequence)) {
            /* made before this member's own stall (its owner took it back on the death it
             * saw), or answered already: by this member's takeover of the owner, which died
             * after handing it over, or by another member */
            bump(&p->c.spill_dropped, 1);
        } else {
            /* this member's own copy goes (a takeover must not decide it again), a later copy
             * is filtered; its age is the earlier of the two arrivals */
            sh = fer_pool_hash(h.session_id, h.session_id_len);
            arrival = stamp;
            for (idx = p->bucket[(sh ^ h.sequence) & p->mask]; idx >= 0; idx = p->e[idx].next)
                if (p->e[idx].live && p->e[idx].sid_hash == sh &&
                    p->e[idx].sequence == h.sequence && p->e[idx].arrival_ns < arrival)
                    arrival = p->e[idx].arrival_ns;
            remove_answered(p, sh, h.sequence);
            note_answered(p, fingerprint(sh, h.sequence));
            if (is_me(p, h.relay_id, h.relay_id_len)) /* its own, given back: its target's
                                                       * in box was full */
                bump(&p->c.spill_taken_back, 1);
            else
                bump(&p->c.spilled_in, 1);
            fn(ctx, h.request, h.request_len, arrival);
            done++;
        }
        pthread_mutex_lock(&p->mu);
        box_pop(&p->in, len);
        pthread_mutex_unlock(&p->mu);
    }
    pop_dead(p);
    gauges(p);
    return done;
}
