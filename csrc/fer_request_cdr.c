/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_request_cdr.c - flowedge_relay_msgs/InferenceRequest from its CDR bytes (fer_intake.h).
 *
 * The fields in msg/InferenceRequest.msg order, read with fer_cdr.h's bounded reader: every
 * length is checked against what is left before it is used, so hostile bytes can only make the
 * parse fail. Nothing is copied.
 */
#include <string.h>

#include "fer_internal.h"
#include "fer_cdr.h"
#include "fer_rcl.h"
#include "fer_intake.h"

static void get_tensor(struct fer_cdr_reader *r, struct fer_tensor_view *t)
{
    uint64_t ndim, len;

    t->name = fer_cdr_get_string(r, &t->name_len);
    t->dtype = fer_cdr_get_u8(r);
    t->shape = fer_cdr_get_seq(r, 4, 4, &ndim);
    t->ndim = ndim > UINT32_MAX ? UINT32_MAX : (uint32_t)ndim;
    t->data = fer_cdr_get_seq(r, 1, 1, &len);
    t->data_len = len;
}

/* The fields up to model_digest: all a pool member needs to know who owns the request. */
static void get_head(struct fer_cdr_reader *r, struct fer_request_view *v)
{
    v->session_id = fer_cdr_get_string(r, &v->session_id_len);
    v->sequence = fer_cdr_get_u64(r);
    v->generation = fer_cdr_get_u64(r);
    v->retry_count = fer_cdr_get_u32(r);
    v->retry_reason = fer_cdr_get_u8(r);
    v->origin_sec = (int32_t)fer_cdr_get_u32(r);
    v->origin_nanosec = fer_cdr_get_u32(r);
    v->deadline_sec = (int32_t)fer_cdr_get_u32(r);
    v->deadline_nanosec = fer_cdr_get_u32(r);
    v->remaining_nfe = fer_cdr_get_u32(r);
    v->model_digest = fer_cdr_get_string(r, &v->model_digest_len);
}

int fer_request_parse_head(const uint8_t *buf, uint64_t len, struct fer_request_view *v)
{
    struct fer_cdr_reader r = fer_cdr_open(buf, len);

    if (v == NULL || !r.ok)
        return -1;
    get_head(&r, v);
    return r.ok ? 0 : -1;
}

int fer_request_parse(const uint8_t *buf, uint64_t len, struct fer_request_view *v)
{
    struct fer_cdr_reader r = fer_cdr_open(buf, len);
    struct fer_tensor_view scratch;
    uint64_t i;

    if (v == NULL || !r.ok)
        return -1;
    memset(v, 0, sizeof(*v));
    get_head(&r, v);
    v->observation_dim = fer_cdr_get_u32(&r);
    v->action_dim = fer_cdr_get_u32(&r);
    v->action_horizon = fer_cdr_get_u32(&r);
    v->observation = fer_cdr_get_seq(&r, 4, 4, &v->observation_len);
    v->noise_seed = fer_cdr_get_u64(&r);
    v->n_tensors = fer_cdr_get_u32(&r);
    /* every tensor is walked (the message must parse whole, and their bytes are counted); the
     * first FER_INTAKE_TENSORS_MAX are kept for validation */
    for (i = 0; r.ok && i < v->n_tensors; i++) {
        struct fer_tensor_view *t = i < FER_INTAKE_TENSORS_MAX ? &v->tensors[i] : &scratch;

        get_tensor(&r, t);
        v->tensor_bytes = fer_sat_add(v->tensor_bytes, t->data_len);
    }
    v->prefix_actions = fer_cdr_get_seq(&r, 4, 4, &v->prefix_len);
    v->prefix_start_sec = (int32_t)fer_cdr_get_u32(&r);
    v->prefix_start_nanosec = fer_cdr_get_u32(&r);
    v->action_period_sec = (int32_t)fer_cdr_get_u32(&r);
    v->action_period_nanosec = fer_cdr_get_u32(&r);
    v->client_id = fer_cdr_get_string(&r, &v->client_id_len);
    return r.ok ? 0 : -1;
}
