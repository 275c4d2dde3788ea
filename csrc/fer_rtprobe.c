/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_rtprobe.c - test support (fer_rtprobe.h): priority inversion on one CPU, by construction, on
 * the core's own locks (test/test_realtime_locks.py).
 *
 * Three SCHED_FIFO threads pinned to one CPU: L (10) holds the lock, M (20) spins, H (30) asks.
 * The probe takes core->mu (or the doorbell's mutex) itself, the way every fer_core_* call does,
 * on a core made by fer_core_create, so what it shows is the protocol of the relay's own mutexes
 * (fer_lock.c). The handoffs are semaphores: sem_post wakes a higher-priority thread on the same
 * CPU, which preempts the poster at once, so the sequence needs no sleep and no timing margin;
 * only M's spin is timed, and it only has to outlast L's few microseconds.
 *
 * A FIFO thread that spins starves everything else on its CPU: every wait here (semaphores,
 * the lock) has the watchdog as its deadline, and M's spin stops there too.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"
#include "fer_rtprobe.h"

#define WATCHDOG_NS 2000000000ull
#define PRIO_L 10
#define PRIO_M 20
#define PRIO_H 30

struct probe {
    pthread_mutex_t *mu;
    sem_t go_m;
    sem_t go_h;
    atomic_int abort;               /* set by the caller when a thread could not be made */
    uint64_t spin_ns;
    uint64_t watchdog_ns;           /* CLOCK_MONOTONIC: M's spin */
    struct timespec watchdog_rt;    /* the same instant on CLOCK_REALTIME: sem and lock waits */
    struct fer_rtprobe_result *out;
};

static uint64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void watchdog_fired(struct probe *p)
{
    __atomic_store_n(&p->out->watchdog, 1u, __ATOMIC_RELAXED);
}

/* Wait for this thread's start; 0 on the watchdog or an abort. */
static int wait_start(struct probe *p, sem_t *go)
{
    int rc;

    while ((rc = sem_timedwait(go, &p->watchdog_rt)) != 0 && errno == EINTR)
        ;
    if (rc != 0) {
        watchdog_fired(p);
        return 0;
    }
    return !atomic_load(&p->abort);
}

static int take(struct probe *p)
{
    if (pthread_mutex_timedlock(p->mu, &p->watchdog_rt) == 0)
        return 1;
    watchdog_fired(p);
    return 0;
}

static void *run_l(void *arg)
{
    struct probe *p = arg;

    if (!take(p))
        return NULL;
    p->out->l_locked_ns = mono_ns();
    sem_post(&p->go_m);             /* M preempts L here; L resumes only when boosted, or after M */
    p->out->cpu_l = sched_getcpu();
    p->out->l_unlocked_ns = mono_ns();
    pthread_mutex_unlock(p->mu);
    return NULL;
}

static void *run_m(void *arg)
{
    struct probe *p = arg;
    uint64_t now, end;

    if (!wait_start(p, &p->go_m))
        return NULL;
    now = mono_ns();
    p->out->m_start_ns = now;
    p->out->cpu_m = sched_getcpu();
    sem_post(&p->go_h);             /* H preempts M here */
    end = now + p->spin_ns < p->watchdog_ns ? now + p->spin_ns : p->watchdog_ns;
    while ((now = mono_ns()) < end)
        ;
    if (now >= p->watchdog_ns)
        watchdog_fired(p);
    p->out->m_done_ns = now;
    return NULL;
}

static void *run_h(void *arg)
{
    struct probe *p = arg;

    if (!wait_start(p, &p->go_h))
        return NULL;
    p->out->h_asked_ns = mono_ns();
    if (!take(p))
        return NULL;
    p->out->h_acquired_ns = mono_ns();
    p->out->cpu_h = sched_getcpu();
    pthread_mutex_unlock(p->mu);
    return NULL;
}

/* A SCHED_FIFO thread at prio on cpu; 0 or the errno of the refusal. */
static int start(pthread_t *t, uint32_t cpu, int prio, void *(*fn)(void *), struct probe *p)
{
    struct sched_param sp;
    pthread_attr_t a;
    cpu_set_t set;
    int rc;

    if ((rc = pthread_attr_init(&a)) != 0)
        return rc;
    memset(&sp, 0, sizeof(sp));
    sp.sched_priority = prio;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if ((rc = pthread_attr_setinheritsched(&a, PTHREAD_EXPLICIT_SCHED)) == 0 &&
        (rc = pthread_attr_setschedpolicy(&a, SCHED_FIFO)) == 0 &&
        (rc = pthread_attr_setschedparam(&a, &sp)) == 0 &&
        (rc = pthread_attr_setaffinity_np(&a, sizeof(set), &set)) == 0)
        rc = pthread_create(t, &a, fn, p);
    pthread_attr_destroy(&a);
    return rc;
}

/* H, M, L in that order (each waiter exists before what wakes it); the errno of a refusal. */
static int run(struct probe *p, uint32_t cpu)
{
    void *(*const fns[3])(void *) = {run_h, run_m, run_l};
    const int prios[3] = {PRIO_H, PRIO_M, PRIO_L};
    pthread_t t[3];
    int n, rc = 0;

    for (n = 0; n < 3; n++)
        if ((rc = start(&t[n], cpu, prios[n], fns[n], p)) != 0)
            break;
    if (rc != 0) {                  /* release the waiters that exist */
        atomic_store(&p->abort, 1);
        sem_post(&p->go_m);
        sem_post(&p->go_h);
    }
    while (n-- > 0)
        pthread_join(t[n], NULL);
    return rc;
}

int fer_rtprobe_pi(uint32_t lock, uint32_t cpu, uint64_t spin_ns, struct fer_rtprobe_result *out)
{
    struct fer_config cfg;
    struct fer_core *c;
    struct probe p;
    struct timespec rt;
    pthread_mutex_t plain;
    int rc;

    FER_CHECK_ARGS(out != NULL && lock <= FER_RTPROBE_PLAIN && spin_ns >= 1000000u &&
                   spin_ns <= 1000000000u && cpu < CPU_SETSIZE);
    memset(out, 0, sizeof(*out));
    out->cpu_l = out->cpu_m = out->cpu_h = -1;
    memset(&cfg, 0, sizeof(cfg));
    cfg.workers = 1;
    cfg.queue_capacity = 1;
    cfg.max_sessions = 1;
    cfg.max_nfe = 1;
    cfg.ring_capacity = 1;
    if ((rc = fer_core_create(&cfg, &c)) != FER_OK)
        return rc;
    if (lock == FER_RTPROBE_PLAIN && pthread_mutex_init(&plain, NULL) != 0) {
        fer_core_destroy(c);
        return FER_ESYS;
    }
    memset(&p, 0, sizeof(p));
    p.mu = lock == FER_RTPROBE_CORE ? &c->mu : lock == FER_RTPROBE_BELL ? &c->bell.mu : &plain;
    p.spin_ns = spin_ns;
    p.out = out;
    atomic_init(&p.abort, 0);
    sem_init(&p.go_m, 0, 0);
    sem_init(&p.go_h, 0, 0);
    p.watchdog_ns = mono_ns() + WATCHDOG_NS;
    clock_gettime(CLOCK_REALTIME, &rt);
    p.watchdog_rt.tv_sec = rt.tv_sec + (time_t)(WATCHDOG_NS / 1000000000u);
    p.watchdog_rt.tv_nsec = rt.tv_nsec;
    out->os_error = run(&p, cpu);
    sem_destroy(&p.go_m);
    sem_destroy(&p.go_h);
    if (lock == FER_RTPROBE_PLAIN)
        pthread_mutex_destroy(&plain);
    fer_core_destroy(c);
    return out->os_error != 0 ? FER_ESYS : FER_OK;
}
