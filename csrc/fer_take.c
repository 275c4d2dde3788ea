/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_take.c - a thread that takes serialized messages from rcl subscriptions as they arrive
 * (fer_take.h says why and how).
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "fer_internal.h"
#include "fer_rcl.h"
#include "fer_take.h"

/* relaxed: a counter has one writer; readers only report it */
static void bump(uint64_t *counter)
{
    __atomic_store_n(counter, *counter + 1, __ATOMIC_RELAXED);
}

static void ring(int efd)
{
    uint64_t one = 1;
    ssize_t rc = write(efd, &one, sizeof(one)); /* EAGAIN only at 2^64 - 2 unread rings */

    (void)rc;
}

/* ---- the buffer's allocator --------------------------------------------------------------------
 * rmw grows a serialized message that is too small through these. The loop's own buffer is never
 * moved or freed: a larger message gets a buffer of its own, which the loop frees right after. */

static void *grow_aside(size_t size, void *state)
{
    (void)state;
    return malloc(size ? size : 1);
}

static void *grow_reallocate(void *pointer, size_t size, void *state)
{
    struct fer_take *t = state;

    if (pointer == t->buf)
        return grow_aside(size, state); /* its contents are not needed: nothing was taken yet */
    return realloc(pointer, size ? size : 1);
}

static void *grow_zero_allocate(size_t n, size_t size, void *state)
{
    (void)state;
    return calloc(n ? n : 1, size ? size : 1);
}

static void free_aside(void *pointer, void *state)
{
    struct fer_take *t = state;

    if (pointer != t->buf)
        free(pointer);
}

/* ---- init / fini -------------------------------------------------------------------------------- */

int fer_take_init(struct fer_take *t, uint64_t cap, fer_take_handler_fn handle, void *ctx)
{
    memset(t, 0, sizeof(*t));
    t->efd = -1;
    if (handle == NULL || cap == 0)
        return FER_EINVAL;
    t->buf = malloc(cap);
    if (t->buf == NULL)
        return FER_ENOMEM;
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0)
        return FER_ESYS;
    t->cap = cap;
    t->handle = handle;
    t->ctx = ctx;
    t->watch_from = UINT32_MAX;
    t->msg.buffer = t->buf;
    t->msg.buffer_capacity = cap;
    t->msg.allocator = (struct fer_rcl_allocator){grow_aside, free_aside, grow_reallocate,
                                                  grow_zero_allocate, t};
    return FER_OK;
}

void fer_take_fini(struct fer_take *t)
{
    if (t->efd >= 0)
        close(t->efd);
    t->efd = -1;
    free(t->buf);
    t->buf = NULL;
}

/* ---- the loop ----------------------------------------------------------------------------------- */

/* The middleware's on-new-message callback (one of its threads): count and ring, nothing else. */
static void on_new_message(const void *user_data, size_t n)
{
    struct fer_take *t = (struct fer_take *)(uintptr_t)user_data;

    __atomic_fetch_add(&t->counters.announced, (uint64_t)n, __ATOMIC_RELAXED);
    ring(t->efd);
}

/* Take and hand over up to FER_TAKE_BURST messages of one subscription; how many were taken. */
static uint32_t drain(struct fer_take *t, const struct fer_rcl_take *rcl, void *sub,
                      fer_take_handler_fn handle)
{
    uint32_t n;

    for (n = 0; n < FER_TAKE_BURST; n++) {
        int32_t rc;

        t->msg.buffer_length = 0;
        rc = rcl->take(sub, &t->msg, t->message_info, NULL);
        if (t->msg.buffer != t->buf) {
            /* rmw grew the buffer: a message over cap, taken and given back at once */
            free(t->msg.buffer);
            t->msg.buffer = t->buf;
            t->msg.buffer_capacity = t->cap;
            t->msg.buffer_length = 0;
            handle(t->ctx, NULL, 0);
            continue;
        }
        if (rc == FER_RCL_TAKE_FAILED)
            break;
        if (rc != FER_RCL_OK) {
            __atomic_store_n(&t->counters.last_take_error, rc, __ATOMIC_RELAXED);
            bump(&t->counters.take_errors);
            if (rcl->reset_error)
                rcl->reset_error();
            break;
        }
        handle(t->ctx, t->buf, t->msg.buffer_length);
    }
    return n;
}

/* Wait up to wait_ns for the doorbell (or a stop); consume its count. */
static void wait_doorbell(struct fer_take *t, uint64_t wait_ns)
{
    struct pollfd p = {t->efd, POLLIN, 0};
    uint64_t count;
    int ms = (int)((wait_ns + 999999) / 1000000);

    if (poll(&p, 1, ms) > 0 && read(t->efd, &count, sizeof(count)) == (ssize_t)sizeof(count))
        bump(&t->counters.wakeups);
}

int fer_take_run(struct fer_take *t, const struct fer_rcl_take *rcl, void *const *subscriptions,
                 uint32_t n, uint64_t wait_ns)
{
    uint32_t i, set = 0;
    int rc = FER_OK;

    if (t == NULL || t->buf == NULL || rcl == NULL || rcl->take == NULL ||
        rcl->set_callback == NULL || subscriptions == NULL || n == 0 || n > FER_TAKE_SUBS_MAX)
        return FER_EINVAL;
    for (i = 0; i < n; i++) {
        if (subscriptions[i] == NULL) {
            rc = FER_EINVAL;
            break;
        }
        if (rcl->set_callback(subscriptions[i], on_new_message, t) != FER_RCL_OK) {
            if (rcl->reset_error)
                rcl->reset_error();
            rc = FER_ENOTSUP;
            break;
        }
        set++;
    }
    while (rc == FER_OK && !__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
        uint32_t taken = 0;

        if (__atomic_load_n(&t->pause, __ATOMIC_RELAXED)) {
            struct timespec ms10 = {0, 10000000};

            nanosleep(&ms10, NULL);
            continue;
        }
        if (t->tick)
            t->tick(t->ctx);
        for (i = 0; i < n; i++)
            taken += drain(t, rcl, subscriptions[i],
                           i >= t->watch_from && t->watch ? t->watch : t->handle);
        if (taken == 0)
            wait_doorbell(t, wait_ns);
    }
    /* after this returns no callback is running or will run (rmw takes its listener lock) */
    for (i = 0; i < set; i++)
        if (rcl->set_callback(subscriptions[i], NULL, NULL) != FER_RCL_OK && rcl->reset_error)
            rcl->reset_error();
    return rc;
}

void fer_take_stop(struct fer_take *t)
{
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    if (t->efd >= 0)
        ring(t->efd);
}

void fer_take_rearm(struct fer_take *t)
{
    __atomic_store_n(&t->stop, 0, __ATOMIC_RELEASE);
}

void fer_take_pause(struct fer_take *t, uint32_t paused)
{
    __atomic_store_n(&t->pause, paused, __ATOMIC_RELAXED);
}
