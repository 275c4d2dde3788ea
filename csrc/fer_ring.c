/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_ring.c - bounded single-producer / single-consumer outcome rings and the doorbell that
 * wakes their consumer (docs/design.md §8). Shape of concurrencykit ck_ring / DPDK rte_ring:
 * power-of-two capacity, free-running indices, one acquire and one release per operation.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"

/* ---- doorbell --------------------------------------------------------------------------------- */

int fer_doorbell_init(struct fer_doorbell *b)
{
    /* A priority-inheriting mutex, a condvar on CLOCK_MONOTONIC (fer_lock.c). */
    int rc = fer_lock_init(&b->mu, &b->cv);

    if (rc != FER_OK)
        return rc;
    b->rings = 0;
    atomic_init(&b->closed, 0);
    return FER_OK;
}

void fer_doorbell_fini(struct fer_doorbell *b)
{
    fer_lock_fini(&b->mu, &b->cv);
}

/* Called by a producer after its commit (release-store of tail). Taking the mutex orders this
 * signal after any waiter's "rings empty?" check, so the wake-up cannot be lost. */
void fer_doorbell_ring(struct fer_doorbell *b)
{
    pthread_mutex_lock(&b->mu);
    b->rings++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void fer_doorbell_close(struct fer_doorbell *b)
{
    pthread_mutex_lock(&b->mu);
    atomic_store_explicit(&b->closed, 1, memory_order_relaxed); /* read under the same mutex */
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

int fer_doorbell_wait(struct fer_doorbell *b, int (*ready)(void *), void *arg, uint64_t timeout_ns)
{
    struct timespec ts = fer_deadline_after(timeout_ns);
    int ok;

    pthread_mutex_lock(&b->mu);
    while (!(ok = ready(arg)) && !atomic_load_explicit(&b->closed, memory_order_relaxed)) {
        if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) == ETIMEDOUT) {
            ok = ready(arg);
            break;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return ok;
}

/* ---- ring ------------------------------------------------------------------------------------- */

int fer_ring_init_shared(uint32_t capacity, uint32_t action_len, struct fer_doorbell *bell,
                         struct fer_ring **out)
{
    struct fer_ring *r;
    uint64_t cap;
    size_t sz;

    *out = NULL;
    if (capacity == 0 || capacity > FER_MAX_RING)
        return FER_EINVAL;
    cap = fer_round_pow2(capacity);
    /* The struct holds _Alignas(64) members: allocate it cache-line aligned. */
    sz = (sizeof(*r) + FER_CACHELINE - 1) / FER_CACHELINE * FER_CACHELINE;
    r = aligned_alloc(FER_CACHELINE, sz);
    if (r == NULL)
        return FER_ENOMEM;
    memset(r, 0, sz);
    atomic_init(&r->head, 0);
    atomic_init(&r->tail, 0);
    atomic_init(&r->dropped, 0);
    r->mask = cap - 1;
    r->action_len = action_len;
    r->recs = calloc(cap, sizeof(*r->recs));
    r->slab = action_len ? calloc(cap * action_len, sizeof(float)) : NULL;
    if (r->recs == NULL || (action_len && r->slab == NULL)) {
        free(r->recs);
        free(r->slab);
        free(r);
        return FER_ENOMEM;
    }
    r->bell = bell;
    r->owns_bell = 0;
    *out = r;
    return FER_OK;
}

int fer_ring_create(uint32_t capacity, uint32_t action_len, struct fer_ring **out)
{
    struct fer_doorbell *bell;
    int rc;

    FER_CHECK_ARGS(out != NULL);
    *out = NULL;
    bell = malloc(sizeof(*bell));
    if (bell == NULL)
        return FER_ENOMEM;
    rc = fer_doorbell_init(bell);
    if (rc != FER_OK) {
        free(bell);
        return rc;
    }
    rc = fer_ring_init_shared(capacity, action_len, bell, out);
    if (rc != FER_OK) {
        fer_doorbell_fini(bell);
        free(bell);
        return rc;
    }
    (*out)->owns_bell = 1;
    return FER_OK;
}

void fer_ring_destroy(struct fer_ring *ring)
{
    if (ring == NULL)
        return;
    if (ring->owns_bell) {
        fer_doorbell_fini(ring->bell);
        free(ring->bell);
    }
    free(ring->recs);
    free(ring->slab);
    free(ring);
}

/* Producer. Contract: only one thread pushes into a given ring at a time. */
int fer_ring_push_quiet(struct fer_ring *ring, const struct fer_outcome *rec, const float *actions)
{
    /* relaxed: tail is ours, nobody else stores it */
    uint64_t t = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    uint64_t idx;

    if (t - ring->head_cache > ring->mask) {
        /* acquire: the consumer's reads of the record we are about to overwrite happened before
         * it released head past it. */
        ring->head_cache = atomic_load_explicit(&ring->head, memory_order_acquire);
        if (t - ring->head_cache > ring->mask) {
            /* relaxed: a statistic read by other threads, it orders nothing */
            atomic_fetch_add_explicit(&ring->dropped, 1, memory_order_relaxed);
            return FER_EFULL;
        }
    }
    idx = t & ring->mask;
    ring->recs[idx] = *rec;
    if (rec->has_actions && ring->action_len) {
        if (actions != NULL)
            memcpy(&ring->slab[idx * ring->action_len], actions, ring->action_len * sizeof(float));
        else
            memset(&ring->slab[idx * ring->action_len], 0, ring->action_len * sizeof(float));
    }
    /* release: the record and its actions are visible before the index that publishes them. */
    atomic_store_explicit(&ring->tail, t + 1, memory_order_release);
    return FER_OK;
}

int fer_ring_push(struct fer_ring *ring, const struct fer_outcome *rec, const float *actions)
{
    int rc;

    FER_CHECK_ARGS(ring != NULL && rec != NULL);
    rc = fer_ring_push_quiet(ring, rec, actions);
    if (rc == FER_OK)
        fer_doorbell_ring(ring->bell);
    return rc;
}

/* Consumer: pointer to the oldest record, valid until ring_release, or NULL if empty. */
static const struct fer_outcome *ring_peek(struct fer_ring *ring)
{
    /* relaxed: head is ours */
    uint64_t h = atomic_load_explicit(&ring->head, memory_order_relaxed);

    if (h == ring->tail_cache) {
        /* acquire: pairs with the producer's release of tail, so the record is fully written. */
        ring->tail_cache = atomic_load_explicit(&ring->tail, memory_order_acquire);
        if (h == ring->tail_cache)
            return NULL;
    }
    return &ring->recs[h & ring->mask];
}

/* Consumer: drop the record ring_peek returned. No-op if empty. */
static void ring_release(struct fer_ring *ring)
{
    uint64_t h = atomic_load_explicit(&ring->head, memory_order_relaxed); /* ours */

    if (h == ring->tail_cache &&
        h == (ring->tail_cache = atomic_load_explicit(&ring->tail, memory_order_acquire)))
        return;
    /* release: our reads of the record are done before the producer may reuse its slot. */
    atomic_store_explicit(&ring->head, h + 1, memory_order_release);
}

int fer_ring_pop(struct fer_ring *ring, struct fer_outcome *rec, float *actions)
{
    const struct fer_outcome *src;
    uint64_t h;

    FER_CHECK_ARGS(ring != NULL && rec != NULL);
    src = ring_peek(ring);
    if (src == NULL)
        return 0;
    *rec = *src;
    if (actions != NULL && src->has_actions && ring->action_len) {
        h = atomic_load_explicit(&ring->head, memory_order_relaxed); /* ours */
        memcpy(actions, &ring->slab[(h & ring->mask) * ring->action_len],
               ring->action_len * sizeof(float));
    }
    ring_release(ring);
    return 1;
}

int fer_ring_nonempty(struct fer_ring *ring)
{
    /* acquire on both: a racy but safe view; used only to decide whether to sleep. */
    uint64_t t = atomic_load_explicit(&ring->tail, memory_order_acquire);
    uint64_t h = atomic_load_explicit(&ring->head, memory_order_acquire);
    return t != h;
}

uint32_t fer_ring_capacity(const struct fer_ring *ring)
{
    return (uint32_t)(ring->mask + 1);
}

uint32_t fer_ring_action_len(const struct fer_ring *ring)
{
    return ring->action_len;
}

uint32_t fer_ring_free_slots(struct fer_ring *ring)
{
    uint64_t t = atomic_load_explicit(&ring->tail, memory_order_relaxed); /* ours (producer) */
    /* acquire: same reason as in push; a stale head only under-reports free space. */
    uint64_t h = atomic_load_explicit(&ring->head, memory_order_acquire);
    return (uint32_t)(ring->mask + 1 - (t - h));
}

uint32_t fer_ring_count(struct fer_ring *ring)
{
    /* Load head first: tail only grows, so tail - head never goes negative. */
    uint64_t h = atomic_load_explicit(&ring->head, memory_order_acquire);
    uint64_t t = atomic_load_explicit(&ring->tail, memory_order_acquire);
    return (uint32_t)(t - h);
}

uint64_t fer_ring_dropped(struct fer_ring *ring)
{
    return atomic_load_explicit(&ring->dropped, memory_order_relaxed); /* statistic */
}

static int ring_ready(void *ring)
{
    return fer_ring_nonempty(ring);
}

int fer_ring_wait(struct fer_ring *ring, uint64_t timeout_ns)
{
    FER_CHECK_ARGS(ring != NULL);
    return fer_doorbell_wait(ring->bell, ring_ready, ring, timeout_ns);
}
