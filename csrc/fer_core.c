/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_core.c - the core's lifetime and settings: create (validates the configuration and
 * allocates everything the core will ever use), destroy, shutdown, and the calls that read or
 * change the configuration (calibration, policy, cost model).
 *
 * Nothing allocates after fer_core_create: every later call works in the arrays sized here.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>

#include "fer_internal.h"

const char *fer_strerror(int rc)
{
    switch (rc) {
    case FER_OK: return "ok";
    case FER_EINVAL: return "invalid argument";
    case FER_ENOMEM: return "out of memory";
    case FER_ESTATE: return "call not valid in the current lane state";
    case FER_EFULL: return "ring full";
    case FER_ESYS: return "pthread initialisation failed";
    case FER_ENOTSUP: return "not supported by the middleware or library";
    default: return "unknown error";
    }
}

/* ---- lifetime ------------------------------------------------------------------------------------ */

static int config_valid(const struct fer_config *cfg)
{
    return cfg->workers >= 1 && cfg->workers <= FER_MAX_WORKERS && cfg->queue_capacity >= 1 &&
           cfg->queue_capacity <= FER_MAX_QUEUE && cfg->max_sessions >= 1 &&
           cfg->max_sessions <= FER_MAX_SESSIONS && cfg->max_nfe >= 1 && cfg->ring_capacity >= 1 &&
           cfg->ring_capacity <= FER_MAX_RING && cfg->age_gate <= FER_AGE_GATE_ALL &&
           cfg->two_phase <= 1 && cfg->payload_bytes <= FER_MAX_PAYLOAD &&
           cfg->batch_slots <= FER_MAX_BATCH && cfg->cede_ns <= FER_CEDE_MAX_NS &&
           cfg->cede_every_ns <= FER_CEDE_MAX_NS && (cfg->cede_ns == 0 || cfg->cede_every_ns > 0) &&
           cfg->rtc_max_delay <= FER_RTC_MAX_ROWS && cfg->fair_share <= 1 &&
           cfg->max_clients <= FER_MAX_CLIENTS &&
           fer_cost_config_valid(cfg); /* cost-model hook (fer_cost.c) */
}

int fer_core_create(const struct fer_config *cfg, struct fer_core **out)
{
    struct fer_core *c;
    uint32_t i;
    int rc;

    FER_CHECK_ARGS(out != NULL);
    *out = NULL;
    FER_CHECK_ARGS(cfg != NULL && config_valid(cfg));
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        return FER_ENOMEM;
    c->cfg = *cfg;
    c->cfg.ring_capacity = (uint32_t)fer_round_pow2(cfg->ring_capacity);
    c->cfg.batch_slots = cfg->batch_slots ? cfg->batch_slots : 1;
    c->nlanes = cfg->workers * c->cfg.batch_slots; /* W x B (docs/design.md §5.1) */
    /* Every queued and running request holds a slot, and one more is always staged. */
    c->nslots = cfg->queue_capacity + c->nlanes + 1;
    c->payload_stride = ((size_t)cfg->payload_bytes + FER_CACHELINE - 1) &
                        ~(size_t)(FER_CACHELINE - 1);
    c->nrings = cfg->workers + 1;
    c->session_hash_mask = fer_round_pow2(2ull * cfg->max_sessions) - 1;

    c->slots = calloc(c->nslots, sizeof(*c->slots));
    c->free_slots = calloc(c->nslots, sizeof(*c->free_slots));
    c->obs_slab = calloc((size_t)c->nslots * (cfg->obs_dim ? cfg->obs_dim : 1), sizeof(float));
    c->queue = calloc(cfg->queue_capacity, sizeof(*c->queue));
    c->qjobs = calloc(cfg->queue_capacity, sizeof(*c->qjobs));
    c->skip = calloc(c->nslots, sizeof(*c->skip));
    c->sessions = calloc(cfg->max_sessions, sizeof(*c->sessions));
    c->session_free = calloc(cfg->max_sessions, sizeof(*c->session_free));
    c->session_hash = calloc(c->session_hash_mask + 1, sizeof(*c->session_hash));
    c->lanes = calloc(c->nlanes, sizeof(*c->lanes));
    c->charged_ns = calloc(cfg->workers, sizeof(*c->charged_ns));
    c->turnover = calloc(cfg->workers, sizeof(*c->turnover));
    c->rings = calloc(c->nrings, sizeof(*c->rings));
    c->jobs = calloc((size_t)cfg->queue_capacity + 1, sizeof(*c->jobs));
    c->lane_start = calloc(c->nlanes, sizeof(*c->lane_start));
    c->lane_scratch = calloc(c->nlanes, sizeof(*c->lane_scratch));
    c->cfg.max_clients = cfg->max_clients ? cfg->max_clients : 64;
    /* §7.1: the client table exists whether fair_share is on or not: the flag is live, and the
     * share must judge work admitted before it was turned on. */
    c->client_hash_mask = fer_round_pow2(2ull * c->cfg.max_clients) - 1;
    c->clients = calloc(c->cfg.max_clients, sizeof(*c->clients));
    c->client_hash = calloc(c->client_hash_mask + 1, sizeof(*c->client_hash));
    if (c->clients == NULL || c->client_hash == NULL) {
        fer_core_destroy(c);
        return FER_ENOMEM;
    }
    if (cfg->payload_bytes != 0) {
        /* Payloads are written by the request thread and read by a worker: a cache line of
         * their own per slot, so neighbours never false-share. Zeroed once, here. */
        void *p = NULL;
        if (posix_memalign(&p, FER_CACHELINE, c->nslots * c->payload_stride) != 0) {
            fer_core_destroy(c);
            return FER_ENOMEM;
        }
        c->payload = p;
        memset(c->payload, 0, c->nslots * c->payload_stride);
    }
    if (!c->slots || !c->free_slots || !c->obs_slab || !c->queue || !c->qjobs || !c->skip ||
        !c->sessions ||
        !c->session_free || !c->session_hash || !c->lanes || !c->charged_ns || !c->turnover || !c->rings ||
        !c->jobs || !c->lane_start || !c->lane_scratch) {
        fer_core_destroy(c);
        return FER_ENOMEM;
    }
    /* Free stacks are popped from the end: fill them so slot / session 0 is used first. */
    for (i = 0; i < c->nslots; i++) {
        c->slots[i].obs = &c->obs_slab[(size_t)i * cfg->obs_dim];
        c->free_slots[i] = c->nslots - 1 - i;
    }
    c->nfree = c->nslots - 1;
    c->staging = c->free_slots[c->nfree]; /* slot 0: the first request takes it */
    for (i = 0; i < cfg->max_sessions; i++)
        c->session_free[i] = cfg->max_sessions - 1 - i;
    c->nsession_free = cfg->max_sessions;
    for (i = 0; i < c->nlanes; i++) {
        c->lanes[i].slot = FER_NONE;
        c->lanes[i].alive = 1;
    }
    c->lanes_alive = c->nlanes;
    atomic_init(&c->qlen_hint, 0);
    fer_cost_configure(&c->cost, &c->cfg); /* cost-model hook: effective window / quantile */
    fer_cost_configure(&c->prefix_cost, &c->cfg);

    rc = fer_doorbell_init(&c->bell);
    if (rc != FER_OK) {
        fer_core_destroy(c);
        return rc;
    }
    /* A priority-inheriting mutex (real-time workers and normal-priority timers share it) and
     * wait_for_work's condvar on CLOCK_MONOTONIC, like every other time in the core
     * (fer_lock.c). */
    rc = fer_lock_init(&c->mu, &c->work_cv);
    if (rc != FER_OK) {
        fer_doorbell_fini(&c->bell);
        fer_core_destroy(c);
        return rc;
    }
    c->sync_ready = 1;
    atomic_init(&c->shutdown, 0);
    for (i = 0; i < c->nrings; i++) {
        /* Ring 0 carries only rejections: it needs no action slab. */
        rc = fer_ring_init_shared(c->cfg.ring_capacity, i == 0 ? 0 : cfg->action_len, &c->bell,
                                  &c->rings[i]);
        if (rc != FER_OK) {
            fer_core_destroy(c);
            return rc;
        }
    }
    *out = c;
    return FER_OK;
}

void fer_core_destroy(struct fer_core *c)
{
    uint32_t i;

    if (c == NULL)
        return;
    if (c->sync_ready) {
        fer_lock_fini(&c->mu, &c->work_cv);
        fer_doorbell_fini(&c->bell);
    }
    if (c->rings != NULL)
        for (i = 0; i < c->nrings; i++)
            fer_ring_destroy(c->rings[i]);
    free(c->rings);
    free(c->slots);
    free(c->free_slots);
    free(c->obs_slab);
    free(c->payload);
    free(c->queue);
    free(c->qjobs);
    free(c->skip);
    free(c->sessions);
    free(c->session_free);
    free(c->session_hash);
    free(c->lanes);
    free(c->charged_ns);
    free(c->turnover);
    free(c->jobs);
    free(c->lane_start);
    free(c->lane_scratch);
    free(c->clients);
    free(c->client_hash);
    free(c);
}

int fer_core_shutdown(struct fer_core *c)
{
    FER_CHECK_ARGS(c != NULL);
    pthread_mutex_lock(&c->mu);
    atomic_store_explicit(&c->shutdown, 1, memory_order_relaxed); /* read under mu */
    pthread_cond_broadcast(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    fer_doorbell_close(&c->bell);
    return FER_OK;
}

int fer_core_get_config(struct fer_core *c, struct fer_config *out)
{
    FER_CHECK_ARGS(c != NULL && out != NULL);
    pthread_mutex_lock(&c->mu);
    *out = c->cfg;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

/* ---- settings (any thread) ----------------------------------------------------------------------- */

int fer_core_set_calibration(struct fer_core *c, uint64_t nfe_ns, uint64_t admission_reserve_ns,
                             uint64_t prefix_ns)
{
    FER_CHECK_ARGS(c != NULL);
    pthread_mutex_lock(&c->mu);
    c->cfg.nfe_ns = nfe_ns;
    c->cfg.admission_reserve_ns = admission_reserve_ns;
    c->cfg.prefix_ns = prefix_ns;
    fer_cost_configure(&c->cost, &c->cfg); /* cost-model hook: the reserve the stall rule spends */
    fer_cost_configure(&c->prefix_cost, &c->cfg);
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_set_policy(struct fer_core *c, uint32_t reject_if_retry_count_gte, uint32_t age_gate,
                        uint64_t reject_if_queue_age_ns_gte, uint64_t queue_timeout_ns)
{
    FER_CHECK_ARGS(c != NULL && age_gate <= FER_AGE_GATE_ALL);
    pthread_mutex_lock(&c->mu);
    c->cfg.reject_if_retry_count_gte = reject_if_retry_count_gte;
    c->cfg.age_gate = age_gate;
    c->cfg.reject_if_queue_age_ns_gte = reject_if_queue_age_ns_gte;
    c->cfg.queue_timeout_ns = queue_timeout_ns;
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

int fer_core_set_cost_model(struct fer_core *c, uint32_t cost_model, uint64_t window_ns,
                            uint32_t quantile_ppm)
{
    FER_CHECK_ARGS(c != NULL && cost_model <= FER_COST_ADAPTIVE && quantile_ppm <= FER_COST_PPM);
    pthread_mutex_lock(&c->mu);
    c->cfg.cost_model = cost_model;
    c->cfg.cost_window_ns = window_ns;
    c->cfg.cost_quantile_ppm = quantile_ppm;
    fer_cost_configure(&c->cost, &c->cfg);
    fer_cost_configure(&c->prefix_cost, &c->cfg);
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}
