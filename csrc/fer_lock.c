/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_lock.c - how the core makes its locks (the list of every lock and wait, and who takes it,
 * is in fer_internal.h): each mutex priority-inheriting, each condition variable timed on
 * CLOCK_MONOTONIC, and the absolute deadline a timed wait takes.
 *
 * Why priority inheritance: on a robot computer the workers and the request intake run
 * SCHED_FIFO while normal-priority threads (timers, diagnostics, the publisher) take the same
 * mutexes. A normal-priority holder preempted by a CPU hog would otherwise keep a real-time
 * waiter blocked for as long as the hog runs (priority inversion); with PTHREAD_PRIO_INHERIT the
 * holder runs at its highest waiter's priority until it unlocks, so the wait is the critical
 * section (bounded work, fer.h) and nothing else. test/test_realtime_locks.py shows both.
 * glibc's condition variables work with PI mutexes (the wait re-takes the mutex through the PI
 * path); their own wake-up order is not priority-aware, which the core does not rely on.
 */
#define _POSIX_C_SOURCE 200809L

#include <time.h>

#include "fer_internal.h"

int fer_lock_init(pthread_mutex_t *mu, pthread_cond_t *cv)
{
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    int ok;

    if (pthread_mutexattr_init(&ma) != 0)
        return FER_ESYS;
    ok = pthread_mutexattr_setprotocol(&ma, PTHREAD_PRIO_INHERIT) == 0 &&
         pthread_mutex_init(mu, &ma) == 0;
    pthread_mutexattr_destroy(&ma);
    if (!ok)
        return FER_ESYS;
    if (pthread_condattr_init(&ca) != 0) {
        pthread_mutex_destroy(mu);
        return FER_ESYS;
    }
    ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) {
        pthread_mutex_destroy(mu);
        return FER_ESYS;
    }
    return FER_OK;
}

void fer_lock_fini(pthread_mutex_t *mu, pthread_cond_t *cv)
{
    pthread_cond_destroy(cv);
    pthread_mutex_destroy(mu);
}

struct timespec fer_deadline_after(uint64_t timeout_ns)
{
    struct timespec now, ts;
    uint64_t abs_ns;

    clock_gettime(CLOCK_MONOTONIC, &now);
    abs_ns = fer_sat_add(fer_sat_add(fer_sat_mul((uint64_t)now.tv_sec, 1000000000u),
                                     (uint64_t)now.tv_nsec),
                         timeout_ns);
    /* A saturated deadline (hundreds of years) still has to fit time_t: clamp it. */
    if (abs_ns / 1000000000u > (uint64_t)INT32_MAX * 2u)
        abs_ns = (uint64_t)INT32_MAX * 2u * 1000000000u;
    ts.tv_sec = (time_t)(abs_ns / 1000000000u);
    ts.tv_nsec = (long)(abs_ns % 1000000000u);
    return ts;
}
