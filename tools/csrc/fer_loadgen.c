/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_loadgen.c - the intake bench's client in C (fer_loadgen.h says why). Allocates only in
 * fer_tally_create. Compiled into the tools package's extension; the take loop (fer_take.h) and
 * the answer reader (fer_wire.h) are the runtime core's, called in the relay's own module
 * (flowedge_relay_tools/native.py), and the CDR writer is the core's header-only one (fer_cdr.h).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fer.h"
#include "fer_cdr.h"
#include "fer_rcl.h"
#include "fer_loadgen.h"
#include "fer_take.h"
#include "fer_wire.h"

#define NS_PER_S FER_CDR_NS_PER_S
#define SESSION_PREFIX "lg"

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* ---- requests ----------------------------------------------------------------------------------- */

/* flowedge_relay_msgs/InferenceRequest, field by field in msg/InferenceRequest.msg order. */
static void write_request(struct fer_cdr_writer *w, const struct fer_load *load, uint32_t i,
                          int64_t now_ros)
{
    uint32_t kind = load->pattern[i % load->n_pattern];
    char sid[24];
    int sid_len = snprintf(sid, sizeof(sid), SESSION_PREFIX "%u", i % load->sessions);
    int64_t deadline = 0;
    uint32_t nfe = 1;

    if (kind == FER_LOAD_EXPIRED) {
        deadline = now_ros - 1000000; /* passed a millisecond ago */
    } else if (kind == FER_LOAD_REJECTED) {
        deadline = now_ros + (int64_t)load->rejected_slack_ns;
        nfe = load->rejected_nfe;
    } else if (kind == FER_LOAD_DUE) {
        deadline = now_ros + (int64_t)load->due_slack_ns;
        nfe = load->due_nfe;
    }
    fer_cdr_begin(w);
    fer_cdr_string(w, sid, (uint32_t)sid_len);
    fer_cdr_u64(w, load->base_sequence + i);              /* sequence */
    fer_cdr_u64(w, 1);                                    /* generation */
    fer_cdr_u32(w, 0);                                    /* retry_count */
    fer_cdr_u8(w, 0);                                     /* retry_reason */
    fer_cdr_time(w, now_ros);                             /* origin_stamp */
    fer_cdr_time(w, deadline);                            /* deadline: 0 = none */
    fer_cdr_u32(w, nfe);                                  /* remaining_nfe */
    fer_cdr_string(w, load->digest, load->digest_len);
    fer_cdr_u32(w, load->observation_dim);
    fer_cdr_u32(w, load->action_dim);
    fer_cdr_u32(w, load->action_horizon);
    fer_cdr_u32(w, load->observation_dim);                /* float32[] observation */
    fer_cdr_put(w, load->observation, (uint64_t)load->observation_dim * sizeof(float), 4);
    fer_cdr_u64(w, load->base_sequence + i);              /* noise_seed */
    fer_cdr_u32(w, 0);                                    /* inputs: none */
    fer_cdr_u32(w, 0);                                    /* prefix_actions: none */
    fer_cdr_time(w, 0);                                   /* prefix_start */
    fer_cdr_time(w, 0);                                   /* action_period (a Duration) */
    fer_cdr_string(w, "", 0);                             /* client_id: the session's */
}

uint64_t fer_load_request_cdr(const struct fer_load *load, uint32_t i, int64_t now_ros,
                              uint8_t *buf, uint64_t cap)
{
    struct fer_cdr_writer w = {buf, 0, cap};

    if (load == NULL || buf == NULL || load->n_pattern == 0 || load->sessions == 0)
        return 0;
    write_request(&w, load, i, now_ros);
    return w.n <= cap ? w.n : 0;
}

static int load_valid(const struct fer_load *load)
{
    uint32_t k;

    if (load->n_pattern == 0 || load->n_pattern > FER_LOAD_PATTERN_MAX || load->sessions == 0 ||
        load->digest_len > sizeof(load->digest) || load->rate_per_s <= 0.0 ||
        (load->observation_dim && load->observation == NULL))
        return 0;
    for (k = 0; k < load->n_pattern; k++)
        if (load->pattern[k] > FER_LOAD_DUE)
            return 0;
    return 1;
}

int fer_load_publish(const struct fer_load *load, fer_rcl_publish_fn publish,
                     const void *rcl_publisher, fer_rcl_reset_error_fn reset_error, uint8_t *buf,
                     uint64_t cap, struct fer_load_result *out)
{
    double period_ns;
    uint64_t start;
    uint32_t i;

    if (load == NULL || publish == NULL || rcl_publisher == NULL || buf == NULL || out == NULL ||
        !load_valid(load))
        return FER_EINVAL;
    memset(out, 0, sizeof(*out));
    period_ns = 1e9 / load->rate_per_s;
    start = clock_ns(CLOCK_MONOTONIC);
    for (i = 0; i < load->count; i++) {
        uint64_t due = start + (uint64_t)(period_ns * i), now = clock_ns(CLOCK_MONOTONIC);
        struct fer_rcl_serialized msg;
        int32_t rc;

        if (now < due) {
            struct timespec ts = {(time_t)(due / NS_PER_S), (long)(due % NS_PER_S)};

            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            now = clock_ns(CLOCK_MONOTONIC);
        } else if (now - due > out->behind_max_ns) {
            out->behind_max_ns = now - due;
        }
        memset(&msg, 0, sizeof(msg));
        msg.buffer = buf;
        msg.buffer_length = fer_load_request_cdr(load, i, (int64_t)clock_ns(CLOCK_REALTIME), buf,
                                                 cap);
        msg.buffer_capacity = cap;
        if (msg.buffer_length == 0)
            return FER_EINVAL;
        rc = publish(rcl_publisher, &msg, NULL);
        if (rc != FER_RCL_OK) {
            out->publish_failed++;
            out->last_error = rc;
            if (reset_error)
                reset_error();
        } else {
            out->sent++;
        }
        if (i == 0)
            out->first_ns = now;
        out->last_ns = now;
    }
    return FER_OK;
}

/* ---- the answers ---------------------------------------------------------------------------------
 *
 * Invariants: answers, codes and first_ns hold count entries, for sequences
 * base_sequence..base_sequence + count - 1; only the tally's take thread writes them (and taken,
 * stray); readers read them after fer_tally_run returned, or racily for progress only.
 */
struct fer_tally {
    struct fer_take take;
    uint64_t base_sequence;
    uint32_t count;
    uint8_t *answers;
    uint8_t *codes;
    uint64_t *first_ns;
    uint64_t taken;
    uint64_t stray;
};

/* One ActionMessage, read by the plan of ActionMessage.msg (fer_wire.h): code, session_id and
 * sequence are all the tally keeps. */
static void tally_one(void *ctx, const uint8_t *cdr, uint64_t len)
{
    struct fer_tally *t = ctx;
    struct fer_answer_view a;
    uint64_t k;

    t->taken++;
    if (fer_answer_parse(cdr, len, &a) != 0 || a.session_id_len < 2 ||
        memcmp(a.session_id, SESSION_PREFIX, 2) != 0 || a.sequence < t->base_sequence ||
        a.sequence - t->base_sequence >= t->count) {
        t->stray++;
        return;
    }
    k = a.sequence - t->base_sequence;
    if (t->answers[k] == 0)
        t->first_ns[k] = clock_ns(CLOCK_MONOTONIC);
    if (t->answers[k] < UINT8_MAX)
        t->answers[k]++;
    t->codes[k] = (uint8_t)a.code;
}

int fer_tally_create(uint64_t base_sequence, uint32_t count, struct fer_tally **out)
{
    struct fer_tally *t;
    int rc;

    if (out == NULL || count == 0)
        return FER_EINVAL;
    *out = NULL;
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return FER_ENOMEM;
    t->base_sequence = base_sequence;
    t->count = count;
    t->answers = calloc(count, 1);
    t->codes = calloc(count, 1);
    t->first_ns = calloc(count, sizeof(uint64_t));
    rc = fer_take_init(&t->take, 65536, tally_one, t);
    if (t->answers == NULL || t->codes == NULL || t->first_ns == NULL || rc != FER_OK) {
        fer_tally_destroy(t);
        return rc != FER_OK ? rc : FER_ENOMEM;
    }
    *out = t;
    return FER_OK;
}

void fer_tally_destroy(struct fer_tally *t)
{
    if (t == NULL)
        return;
    fer_take_fini(&t->take);
    free(t->answers);
    free(t->codes);
    free(t->first_ns);
    free(t);
}

int fer_tally_run(struct fer_tally *t, const struct fer_rcl_take *rcl, void *subscription,
                  uint64_t wait_ns)
{
    if (t == NULL)
        return FER_EINVAL;
    return fer_take_run(&t->take, rcl, &subscription, 1, wait_ns);
}

void fer_tally_stop(struct fer_tally *t)
{
    if (t != NULL)
        fer_take_stop(&t->take);
}

const uint8_t *fer_tally_answers(const struct fer_tally *t) { return t ? t->answers : NULL; }
const uint8_t *fer_tally_codes(const struct fer_tally *t) { return t ? t->codes : NULL; }
const uint64_t *fer_tally_first_ns(const struct fer_tally *t) { return t ? t->first_ns : NULL; }
uint64_t fer_tally_taken(const struct fer_tally *t) { return t ? t->taken : 0; }
uint64_t fer_tally_stray(const struct fer_tally *t) { return t ? t->stray : 0; }
