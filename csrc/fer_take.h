/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_take.h - a thread that takes serialized messages from rcl subscriptions as they arrive and
 * hands each to a handler, without the Python interpreter (internal: not read into the cdef).
 *
 * The wait: rcl_subscription_set_on_new_message_callback makes the middleware call
 * on_new_message from one of its own threads; it only counts and writes an eventfd (the
 * doorbell), which the loop polls. No lock is shared with the middleware's threads, so a real-time
 * taker never waits for a normal-priority one. The take: each message's CDR bytes into one buffer
 * allocated at init (rmw grows a message that does not fit into a buffer of its own, which the
 * loop frees at once and reports to the handler as too large). Used by the request intake
 * (fer_intake.c) and by the intake bench's answer tally (tools/csrc/fer_loadgen.c).
 */
#ifndef FER_TAKE_H
#define FER_TAKE_H

#include <stdint.h>

/* users include fer_rcl.h first (it has no include guard: the cdef reads it verbatim) */

#define FER_TAKE_BURST 64       /* messages taken from one subscription per pass (fairness) */
#define FER_TAKE_SUBS_MAX 16

/* The handler: one message's bytes (cdr, len), or cdr NULL for a message over the buffer's size
 * (taken into its own buffer and already freed). */
typedef void (*fer_take_handler_fn)(void *ctx, const uint8_t *cdr, uint64_t len);

/*
 * Invariants: buf holds cap bytes and msg points at it between takes; efd is the doorbell,
 * written by on_new_message (middleware threads) and by fer_take_stop, read only by the loop's
 * thread; counters are written by the loop's thread only.
 */
struct fer_take {
    struct fer_take_counters counters;
    uint32_t stop;                       /* any thread: return from fer_take_run */
    uint32_t pause;                      /* drills and tests: take nothing while set */
    int efd;
    uint8_t *buf;
    uint64_t cap;
    fer_take_handler_fn handle;
    void *ctx;
    fer_take_handler_fn watch;           /* subscriptions at index >= watch_from go here */
    uint32_t watch_from;                 /* UINT32_MAX (init): none */
    void (*tick)(void *ctx);             /* NULL, or called once per pass (a pool's upkeep) */
    struct fer_rcl_serialized msg;
    _Alignas(16) uint8_t message_info[256]; /* rmw_message_info_t is ~64 bytes in rmw 7.3, 7.8 */
};

/* init: allocates the buffer (cap bytes) and the doorbell. FER_OK, FER_ENOMEM or FER_ESYS.
 * fini: frees them; a zeroed or failed-init struct is fine. Not while fer_take_run runs. */
int fer_take_init(struct fer_take *t, uint64_t cap, fer_take_handler_fn handle, void *ctx);
void fer_take_fini(struct fer_take *t);

/* The loop over n subscriptions until fer_take_stop: set the callbacks, take and hand over every
 * waiting message (round robin, FER_TAKE_BURST per pass), else wait up to wait_ns on the
 * doorbell; unset the callbacks before returning. FER_OK, FER_EINVAL, or FER_ENOTSUP when the
 * middleware refuses the callback (then nothing was taken). Allocates nothing (but rmw, for a
 * message over cap). */
int fer_take_run(struct fer_take *t, const struct fer_rcl_take *rcl, void *const *subscriptions,
                 uint32_t n, uint64_t wait_ns);
void fer_take_stop(struct fer_take *t);
void fer_take_rearm(struct fer_take *t);
void fer_take_pause(struct fer_take *t, uint32_t paused);

#endif /* FER_TAKE_H */
