/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_intake.c - the request intake in C (fer_intake.h says why). Allocates only in create.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fer_internal.h"
#include "fer_rcl.h"
#include "fer_intake.h"
#include "fer_wire.h"
#include "fer_take.h"
#include "fer_pool.h"

#define NS_PER_S 1000000000ull

/*
 * Invariants: cfg is the caller's config, checked at create; obs holds cfg.observation_dim floats
 * and sid the session id of the request being decided; counters are written by the one thread
 * that decides (the loop's, or a caller of decide).
 */
struct fer_intake {
    struct fer_intake_config cfg;
    struct fer_intake_counters counters;
    struct fer_core *core;
    float *obs;
    uint32_t sid_len;                    /* the validated request's session id, as rclpy sees it */
    char sid[FER_SESSION_ID_MAX];
    uint32_t cid_len;                    /* §7.1: the validated client id, as rclpy sees it */
    char cid[FER_SESSION_ID_MAX];
    struct fer_pool *pool;               /* NULL: no pool (today's intake) */
    uint64_t digest_hash;                /* fer_pool_hash of cfg.digest */
    uint32_t digest_plain;               /* cfg.digest has no NUL: a string equal to it is it */
    uint64_t svc_mono;                   /* fer_intake_pool_service's clocks, for its takeovers */
    int64_t svc_ros;
};

static const char *const REASON_NAMES[FER_REASONS] = {
    "", "model_unavailable", "session_id_empty", "session_id_too_long", "model_digest_mismatch",
    "dims_mismatch", "observation_length", "observation_not_finite", "remaining_nfe_zero",
    "remaining_nfe_above_max", "retry_reason_unknown", "time_invalid", "core_refused",
    "input_missing", "input_unexpected", "input_duplicate", "input_dtype", "input_shape",
    "input_bytes", "input_not_finite", "input_bool_value", "request_too_large",
    "request_malformed", "prefix_unsupported", "prefix_shape", "action_period_invalid",
    "prefix_not_finite", "client_id_too_long",
};

const char *fer_intake_reason_name(uint32_t r)
{
    return r >= 1 && r < FER_REASONS ? REASON_NAMES[r] : "";
}

struct fer_intake_counters *fer_intake_counters(struct fer_intake *in)
{
    return in ? &in->counters : NULL;
}

/* relaxed: a counter has one writer; readers only report it */
static void bump(uint64_t *counter)
{
    __atomic_store_n(counter, *counter + 1, __ATOMIC_RELAXED);
}

/* ---- create / destroy -------------------------------------------------------------------------- */

static uint64_t model_itemsize(const struct fer_input_spec *s)
{
    static const uint8_t wire[] = {4, 1, 8, 4, 2, 1}; /* by FER_DTYPE_* */
    return s->scale != NULL ? sizeof(float) : wire[s->dtype];
}

static int config_valid(const struct fer_intake_config *cfg, uint32_t payload_bytes)
{
    uint32_t i, k;

    if (cfg->digest_len > FER_INTAKE_DIGEST_MAX || cfg->n_inputs > FER_INTAKE_INPUTS_MAX ||
        cfg->observation_dim > FER_INTAKE_OBSERVATION_MAX || cfg->max_nfe == 0)
        return 0;
    if (cfg->rtc && (cfg->action_dim == 0 || cfg->prefix_offset % sizeof(float) != 0 ||
                     fer_sat_add(cfg->prefix_offset,
                                 fer_sat_mul((uint64_t)cfg->action_dim * cfg->action_horizon,
                                             sizeof(float))) > payload_bytes))
        return 0;
    for (i = 0; i < cfg->n_inputs; i++) {
        const struct fer_input_spec *s = &cfg->inputs[i];
        uint64_t count = 1, end;

        if (s->name_len > FER_INTAKE_NAME_MAX || s->dtype > FER_DTYPE_BOOL ||
            s->ndim > FER_INTAKE_NDIM_MAX || (s->scale == NULL) != (s->shift == NULL))
            return 0;
        for (k = 0; k < s->ndim; k++)
            count = fer_sat_mul(count, s->shape[k]);
        end = fer_sat_add(s->offset, fer_sat_mul(count, model_itemsize(s)));
        if (count != s->count || end > payload_bytes)
            return 0;
    }
    return 1;
}

int fer_intake_create(struct fer_core *core, const struct fer_intake_config *cfg,
                      struct fer_intake **out)
{
    struct fer_intake *in;

    if (out == NULL)
        return FER_EINVAL;
    *out = NULL;
    if (core == NULL || cfg == NULL || !config_valid(cfg, core->cfg.payload_bytes) ||
        (cfg->n_inputs == 0 && cfg->model_ok && cfg->observation_dim != core->cfg.obs_dim))
        return FER_EINVAL;
    in = calloc(1, sizeof(*in));
    if (in == NULL)
        return FER_ENOMEM;
    in->cfg = *cfg;
    in->core = core;
    in->digest_hash = fer_pool_hash((const uint8_t *)cfg->digest, cfg->digest_len);
    in->digest_plain = memchr(cfg->digest, 0, cfg->digest_len) == NULL;
    in->obs = calloc((size_t)cfg->observation_dim + 1, sizeof(float));
    if (in->obs == NULL) {
        fer_intake_destroy(in);
        return FER_ENOMEM;
    }
    *out = in;
    return FER_OK;
}

void fer_intake_destroy(struct fer_intake *in)
{
    if (in == NULL)
        return;
    free(in->obs);
    free(in);
}

/* ---- session ids as rclpy reads them ---------------------------------------------------------- */

/* The range of the k-th byte (k >= 1) after UTF-8 lead byte `lead` (Unicode, Table 3-7). */
static int continues(uint8_t lead, uint32_t k, uint8_t b)
{
    uint8_t lo = 0x80, hi = 0xbf;

    if (k == 1) {
        if (lead == 0xe0) lo = 0xa0;
        else if (lead == 0xed) hi = 0x9f;
        else if (lead == 0xf0) lo = 0x90;
        else if (lead == 0xf4) hi = 0x8f;
    }
    return b >= lo && b <= hi;
}

/*
 * src[0..n) decoded as UTF-8 with every maximal invalid subpart replaced by U+FFFD, re-encoded
 * into dst (cap bytes): exactly the bytes of rclpy's str for the field (rosidl decodes strings with
 * errors="replace") encoded back, which is what the Python intake keys a session by. Returns the
 * length, or cap + 1 if it does not fit.
 */
static uint32_t utf8_as_rclpy(const uint8_t *src, uint32_t n, char *dst, uint32_t cap)
{
    static const uint8_t fffd[3] = {0xef, 0xbf, 0xbd};
    uint32_t i = 0, out = 0;

    while (i < n) {
        uint8_t b = src[i];
        uint32_t need = b >= 0xc2 && b <= 0xdf ? 1 : b >= 0xe0 && b <= 0xef ? 2
                        : b >= 0xf0 && b <= 0xf4 ? 3 : 0;
        const uint8_t *piece = &src[i];
        uint32_t len = 1, k = 1;

        if (b >= 0x80) {
            while (need && k <= need && i + k < n && continues(b, k, src[i + k]))
                k++;
            if (need && k > need) {
                len = need + 1;            /* a whole, valid sequence */
            } else {
                piece = fffd;              /* lead byte + the continuation bytes that matched */
                len = 3;
                i += k - 1;
            }
        }
        if (out + len > cap)
            return cap + 1;
        memcpy(dst + out, piece, len);
        out += len;
        i += piece == fffd ? 1 : len;
    }
    return out;
}

/* ---- validation (validation.py's order) ------------------------------------------------------- */

static uint16_t load_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t load_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t load_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static int f32_finite(uint32_t bits) { return (bits & 0x7f800000u) != 0x7f800000u; }
static int f16_finite(uint16_t bits) { return (bits & 0x7c00u) != 0x7c00u; }

/* IEEE half -> float, exactly (every half is a float). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    float f;

    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        exp = 113;
        while (!(man & 0x400u)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/*
 * The normalized value of element i, as numpy computes `value * scale + shift` into float32
 * (policy.Normalization.apply): integer types wider than 16 bits meet float32 in float64 (numpy's
 * type promotion), the rest in float32; the product is rounded to float32, then the shift added.
 */
static float normalized(const struct fer_input_spec *s, const uint8_t *data, uint64_t i)
{
    float scale = s->scale[i], v;

    switch (s->dtype) {
    case FER_DTYPE_FLOAT32: memcpy(&v, data + 4 * i, 4); v = v * scale; break;
    case FER_DTYPE_FLOAT16: v = f16_to_f32(load_u16(data + 2 * i)) * scale; break;
    case FER_DTYPE_INT32: v = (float)((double)(int32_t)load_u32(data + 4 * i) * (double)scale); break;
    case FER_DTYPE_INT64: v = (float)((double)(int64_t)load_u64(data + 8 * i) * (double)scale); break;
    default: v = (float)data[i] * scale; break; /* UINT8, BOOL */
    }
    return v + s->shift[i];
}

/* One tensor against its spec, then copied (normalized) into the payload: policy intake's
 * per-tensor checks, in its order. */
static uint32_t take_tensor(const struct fer_input_spec *s, const struct fer_tensor_view *t,
                            uint8_t *payload)
{
    static const uint8_t wire[] = {4, 1, 8, 4, 2, 1};
    uint64_t i, n = s->count;
    uint32_t k;

    if (t->dtype != s->dtype)
        return FER_REASON_INPUT_DTYPE;
    if (t->shape_len != s->ndim)
        return FER_REASON_INPUT_SHAPE;
    for (k = 0; k < s->ndim; k++)
        if (load_u32(t->shape + 4 * k) != s->shape[k])
            return FER_REASON_INPUT_SHAPE;
    if (t->data_len != n * wire[s->dtype])
        return FER_REASON_INPUT_BYTES;
    if (s->dtype == FER_DTYPE_FLOAT32) {
        for (i = 0; i < n; i++)
            if (!f32_finite(load_u32(t->data + 4 * i)))
                return FER_REASON_INPUT_NOT_FINITE;
    } else if (s->dtype == FER_DTYPE_FLOAT16) {
        for (i = 0; i < n; i++)
            if (!f16_finite(load_u16(t->data + 2 * i)))
                return FER_REASON_INPUT_NOT_FINITE;
    } else if (s->dtype == FER_DTYPE_BOOL) {
        for (i = 0; i < n; i++)
            if (t->data[i] > 1)
                return FER_REASON_INPUT_BOOL_VALUE;
    }
    if (s->scale == NULL) {
        memcpy(payload + s->offset, t->data, t->data_len);
    } else {
        float *dst = (float *)(void *)(payload + s->offset);

        for (i = 0; i < n; i++)
            dst[i] = normalized(s, t->data, i);
    }
    return FER_REASON_NONE;
}

/* A package request's tensors (policy intake): every declared input exactly once. */
static uint32_t take_tensors(struct fer_intake *in, const struct fer_request_view *v)
{
    const struct fer_intake_config *cfg = &in->cfg;
    uint32_t seen = 0; /* bit per declared input */
    uint8_t *payload;
    uint64_t i;
    int slot;

    if (v->inputs_len > 2ull * cfg->n_inputs + 1)
        return FER_REASON_INPUT_UNEXPECTED;
    if (v->tensor_bytes > cfg->max_request_bytes)
        return FER_REASON_REQUEST_TOO_LARGE;
    slot = fer_core_staging_slot(in->core);
    payload = slot < 0 ? NULL : fer_core_payload(in->core, (uint32_t)slot);
    if (payload == NULL)
        return FER_REASON_CORE_REFUSED;
    for (i = 0; i < v->inputs_len; i++) {
        const struct fer_tensor_view *t = &v->inputs[i];
        uint32_t k, rc;

        for (k = 0; k < cfg->n_inputs; k++)
            if (cfg->inputs[k].name_len == t->name_len &&
                memcmp(cfg->inputs[k].name, t->name, t->name_len) == 0)
                break;
        if (k == cfg->n_inputs)
            return FER_REASON_INPUT_UNEXPECTED;
        if (seen & (1u << k))
            return FER_REASON_INPUT_DUPLICATE;
        seen |= 1u << k;
        rc = take_tensor(&cfg->inputs[k], t, payload);
        if (rc != FER_REASON_NONE)
            return rc;
    }
    return seen == (1u << cfg->n_inputs) - 1u ? FER_REASON_NONE : FER_REASON_INPUT_MISSING;
}

static int stamp_ok(int32_t sec, uint32_t nanosec)
{
    return sec >= 0 && nanosec < NS_PER_S;
}

/* Real-time chunking's prefix (docs/design.md §5.4), after everything else passed: refused unless
 * the model takes one, whole rows of action_dim up to the horizon, a valid start, a positive
 * period, finite values; then copied into the staging slot's payload (validation.py's order). */
static uint32_t take_prefix(struct fer_intake *in, const struct fer_request_view *v)
{
    const struct fer_intake_config *cfg = &in->cfg;
    uint8_t *payload;
    uint64_t i;
    int slot;

    if (!cfg->rtc)
        return FER_REASON_PREFIX_UNSUPPORTED;
    if (v->prefix_actions_len % cfg->action_dim != 0 ||
        v->prefix_actions_len / cfg->action_dim > cfg->action_horizon)
        return FER_REASON_PREFIX_SHAPE;
    if (!stamp_ok(v->prefix_start_sec, v->prefix_start_nanosec))
        return FER_REASON_TIME_INVALID;
    if (!stamp_ok(v->action_period_sec, v->action_period_nanosec) ||
        (v->action_period_sec == 0 && v->action_period_nanosec == 0))
        return FER_REASON_ACTION_PERIOD;
    for (i = 0; i < v->prefix_actions_len; i++)
        if (!f32_finite(load_u32(v->prefix_actions + 4 * i)))
            return FER_REASON_PREFIX_NOT_FINITE;
    slot = fer_core_staging_slot(in->core);
    payload = slot < 0 ? NULL : fer_core_payload(in->core, (uint32_t)slot);
    if (payload == NULL)
        return FER_REASON_CORE_REFUSED;
    memcpy(payload + cfg->prefix_offset, v->prefix_actions, v->prefix_actions_len * sizeof(float));
    return FER_REASON_NONE;
}

/* validation.Validator._check over a parsed request; fills in->obs for a single-vector model. */
static uint32_t validate(struct fer_intake *in, const struct fer_request_view *v)
{
    const struct fer_intake_config *cfg = &in->cfg;
    uint32_t reason;
    uint64_t i;

    if (!cfg->model_ok)
        return FER_REASON_MODEL_UNAVAILABLE;
    if (v->session_id_len == 0)
        return FER_REASON_SESSION_ID_EMPTY;
    in->sid_len = utf8_as_rclpy(v->session_id, v->session_id_len, in->sid, FER_SESSION_ID_MAX);
    if (in->sid_len > FER_SESSION_ID_MAX)
        return FER_REASON_SESSION_ID_TOO_LONG;
    in->cid_len = v->client_id_len == 0 ? 0
                  : utf8_as_rclpy(v->client_id, v->client_id_len, in->cid, FER_SESSION_ID_MAX);
    if (in->cid_len > FER_SESSION_ID_MAX)
        return FER_REASON_CLIENT_ID_TOO_LONG;
    if (v->model_digest_len != cfg->digest_len ||
        memcmp(v->model_digest, cfg->digest, cfg->digest_len) != 0)
        return FER_REASON_DIGEST_MISMATCH;
    if (v->observation_dim != cfg->observation_dim || v->action_dim != cfg->action_dim ||
        v->action_horizon != cfg->action_horizon)
        return FER_REASON_DIMS_MISMATCH;
    if (v->remaining_nfe == 0)
        return FER_REASON_NFE_ZERO;
    if (v->remaining_nfe > cfg->max_nfe)
        return FER_REASON_NFE_ABOVE_MAX;
    if (v->retry_reason >= FER_RETRY_REASONS)
        return FER_REASON_RETRY_REASON_UNKNOWN;
    if (!stamp_ok(v->deadline_sec, v->deadline_nanosec) ||
        !stamp_ok(v->origin_stamp_sec, v->origin_stamp_nanosec))
        return FER_REASON_TIME_INVALID;
    if (v->observation_len != cfg->observation_dim ||
        v->observation_len > FER_INTAKE_OBSERVATION_MAX)
        return FER_REASON_OBSERVATION_LENGTH;
    if (cfg->n_inputs) {
        reason = take_tensors(in, v);
    } else if (v->inputs_len) {
        reason = FER_REASON_INPUT_UNEXPECTED; /* the single-vector model declares no tensors */
    } else {
        reason = FER_REASON_NONE;
        for (i = 0; i < v->observation_len; i++) {
            uint32_t bits = load_u32(v->observation + 4 * i);

            if (!f32_finite(bits))
                return FER_REASON_OBSERVATION_NOT_FINITE;
            memcpy(&in->obs[i], &bits, 4);
        }
    }
    if (reason != FER_REASON_NONE || v->prefix_actions_len == 0)
        return reason;
    return take_prefix(in, v);
}

/* ---- clocks (timebase.py) ---------------------------------------------------------------------- */

static uint64_t stamp_ns(int32_t sec, uint32_t nanosec)
{
    return (uint64_t)(uint32_t)sec * NS_PER_S + nanosec; /* sec >= 0 and < 2^31: fits */
}

/* timebase.deadline_to_monotonic: 0 stays 0 (none); passed maps to 1 */
static uint64_t deadline_mono(uint64_t deadline_ros, int64_t now_ros, uint64_t now_mono)
{
    if (deadline_ros == 0)
        return 0;
    if (now_ros >= 0 && deadline_ros <= (uint64_t)now_ros)
        return 1;
    return fer_sat_add(now_mono, deadline_ros - (uint64_t)(now_ros > 0 ? now_ros : 0));
}

/* timebase.instant_to_monotonic: any instant, past or future, at least 1 */
static uint64_t instant_mono(uint64_t t_ros, int64_t now_ros, uint64_t now_mono)
{
    uint64_t now = now_ros > 0 ? (uint64_t)now_ros : 0, mono;

    mono = t_ros >= now ? fer_sat_add(now_mono, t_ros - now) : fer_sat_sub(now_mono, now - t_ros);
    return mono ? mono : 1;
}

/* timebase.origin_to_monotonic: unset or in the future means now (age 0) */
static uint64_t origin_mono(uint64_t origin_ros, int64_t now_ros, uint64_t now_mono)
{
    if (origin_ros == 0 || now_ros < 0 || origin_ros >= (uint64_t)now_ros)
        return now_mono;
    return fer_sat_sub(now_mono, (uint64_t)now_ros - origin_ros);
}

/* ---- one message ------------------------------------------------------------------------------- */

static int discard(struct fer_intake *in, uint32_t reason)
{
    bump(&in->counters.discarded[reason]);
    return (int)reason;
}

/* A pool member's check, right after the header fields are parsed and before any copy: 1 with
 * *decision set when another member owns the request (kept in standby when this one is its
 * successor), 0 when this member decides it (*successor: the request's successor, 0 = none). */
/* The fer_pool_hash of a request's model_digest (its CDR string's bytes): the served digest's is
 * known, its bytes then the string's NUL (or none) with no NUL among them; another's is
 * computed. */
static uint64_t digest_hash_of(const struct fer_intake *in, const uint8_t *d, uint32_t bytes)
{
    uint32_t n = in->cfg.digest_len;

    if ((bytes == n || (bytes == n + 1 && d[n] == 0)) && in->digest_plain &&
        memcmp(d, in->cfg.digest, n) == 0)
        return in->digest_hash;
    return fer_pool_hash(d, strnlen((const char *)d, bytes));
}

static int not_owned(struct fer_intake *in, const uint8_t *cdr, uint64_t len,
                     const struct fer_request_route *v, uint64_t now_mono, int64_t now_ros,
                     int32_t *decision, uint64_t *successor)
{
    int64_t origin = stamp_ok(v->origin_stamp_sec, v->origin_stamp_nanosec)
                     ? (int64_t)stamp_ns(v->origin_stamp_sec, v->origin_stamp_nanosec) : 0;
    uint64_t owner, deadline = 0;
    int role = fer_pool_route_wire(in->pool, v->session_id, v->session_id_bytes,
                                   digest_hash_of(in, v->model_digest, v->model_digest_bytes),
                                   origin, now_mono, &owner, successor);

    if (role == FER_POOL_OWNER || role == FER_POOL_UNOWNED)
        return 0;
    if (role != FER_POOL_OTHER) { /* SUCCESSOR, HELD, STALE_SUCCESSOR: kept */
        if (stamp_ok(v->deadline_sec, v->deadline_nanosec))
            deadline = deadline_mono(stamp_ns(v->deadline_sec, v->deadline_nanosec), now_ros,
                                     now_mono);
        if (role == FER_POOL_HELD) /* its own, surrendered: held, decided here when due */
            fer_pool_standby_hold(in->pool, cdr, len, now_mono, deadline, now_mono);
        else if (role == FER_POOL_STALE_SUCCESSOR) /* held if its owner is taken over */
            fer_pool_standby_put_stale(in->pool, cdr, len, owner, now_mono, deadline, now_mono);
        else
            fer_pool_standby_put(in->pool, cdr, len, owner, now_mono, deadline, now_mono);
        *decision = FER_INTAKE_STANDBY;
    } else {
        *decision = FER_INTAKE_NOT_OWNER;
    }
    return 1;
}

/* One message; arrival_mono: when it was first taken (now_mono, but for a takeover); pooled: 0
 * for a takeover's re-decision (decided here whatever the view says, not counted received
 * again). */
static int decide(struct fer_intake *in, const uint8_t *cdr, uint64_t len, uint64_t now_mono,
                  int64_t now_ros, uint64_t arrival_mono, int pooled, int32_t *decision)
{
    struct fer_request_view v;
    struct fer_request_route head;
    struct fer_request r;
    uint64_t deadline_ros, origin_ros, successor = 0;
    uint32_t reason;
    int rc;

    *decision = -1;
    if (pooled)
        bump(&in->counters.received);
    if (pooled && in->pool != NULL && fer_request_parse_route(cdr, len, &head) == 0 &&
        not_owned(in, cdr, len, &head, now_mono, now_ros, decision, &successor))
        return FER_REASON_NONE;
    if (fer_request_parse(cdr, len, &v) != 0)
        return discard(in, FER_REASON_REQUEST_MALFORMED);
    reason = validate(in, &v);
    if (reason != FER_REASON_NONE)
        return discard(in, reason);
    deadline_ros = stamp_ns(v.deadline_sec, v.deadline_nanosec);
    if (deadline_ros)
        bump(&in->counters.deadlines_seen);
    memset(&r, 0, sizeof(r));
    memcpy(r.session_id, in->sid, in->sid_len);
    r.session_id_len = in->sid_len;
    memcpy(r.client_id, in->cid, in->cid_len);
    r.client_id_len = in->cid_len;
    r.retry_count = v.retry_count;
    r.retry_reason = v.retry_reason;
    r.remaining_nfe = v.remaining_nfe;
    r.sequence = v.sequence;
    r.generation = v.generation;
    origin_ros = stamp_ns(v.origin_stamp_sec, v.origin_stamp_nanosec);
    /* an unset origin ages from the arrival (a takeover keeps the first one) */
    r.origin_ns = origin_ros == 0 ? arrival_mono : origin_mono(origin_ros, now_ros, now_mono);
    r.deadline_ns = deadline_mono(deadline_ros, now_ros, now_mono);
    r.deadline_ros_ns = deadline_ros;
    r.noise_seed = v.noise_seed;
    r.observation = in->obs;
    if (v.prefix_actions_len) {
        r.prefix_rows = (uint32_t)(v.prefix_actions_len / in->cfg.action_dim);
        r.prefix_start_ros_ns = stamp_ns(v.prefix_start_sec, v.prefix_start_nanosec);
        r.prefix_start_ns = instant_mono(r.prefix_start_ros_ns, now_ros, now_mono);
        r.action_period_ns = stamp_ns(v.action_period_sec, v.action_period_nanosec);
    }
    /* a pool owner's spill (docs/design.md §13.5): the core decides first and holds back a
     * would-be REJECTED_CAPACITY (FER_SPILLED); only then is the successor's bound and the out
     * box looked at, and the request handed over or answered here, once. A re-decision (pooled
     * 0) never spills. */
    r.spill = successor != 0 && fer_pool_spilling(in->pool);
    rc = fer_core_submit(in->core, &r, now_mono);
    if (rc == FER_SPILLED &&
        (!fer_pool_spill_fits(in->pool, successor, v.remaining_nfe, (int64_t)deadline_ros,
                              now_ros, len) ||
         fer_pool_spill_out(in->pool, cdr, len, successor, (const uint8_t *)v.session_id,
                            v.session_id_len, v.sequence, v.generation, arrival_mono,
                            r.deadline_ns, now_mono) != FER_OK))
        rc = fer_core_answer_spilled(in->core, &r, now_mono); /* no handover: answered here */
    if (rc < 0)
        return discard(in, FER_REASON_CORE_REFUSED);
    if (rc < 8)
        bump(&in->counters.decided[rc]);
    *decision = rc;
    return FER_REASON_NONE;
}

int fer_intake_decide(struct fer_intake *in, const uint8_t *cdr, uint64_t len,
                      uint64_t now_mono, int64_t now_ros, int32_t *decision)
{
    if (in == NULL || cdr == NULL || decision == NULL)
        return FER_EINVAL;
    return decide(in, cdr, len, now_mono, now_ros, now_mono, 1, decision);
}

/* ---- a relay pool ------------------------------------------------------------------------------ */

int fer_intake_set_pool(struct fer_intake *in, struct fer_pool *pool)
{
    if (in == NULL)
        return FER_EINVAL;
    in->pool = pool;
    return FER_OK;
}

/* fer_pool_run_takeovers' callback: one standby entry of a dead owner, as an arrival now */
static void redecide(void *ctx, const uint8_t *cdr, uint64_t len, uint64_t arrival_ns)
{
    struct fer_intake *in = ctx;
    int32_t decision;

    decide(in, cdr, len, in->svc_mono, in->svc_ros, arrival_ns, 0, &decision);
}

int fer_intake_pool_service(struct fer_intake *in, uint64_t now_mono, int64_t now_ros)
{
    uint64_t n;

    if (in == NULL)
        return FER_EINVAL;
    if (in->pool == NULL)
        return 0;
    in->svc_mono = now_mono;
    in->svc_ros = now_ros;
    n = fer_pool_run_takeovers(in->pool, redecide, in);
    n += fer_pool_run_held(in->pool, now_mono, redecide, in);
    n += fer_pool_run_spills(in->pool, redecide, in);
    fer_pool_tick(in->pool, now_mono);
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* ---- the intake thread ------------------------------------------------------------------------- */

/*
 * Invariants: take owns the serialized buffer (max_request_bytes + FER_INTAKE_SLACK_BYTES) and
 * the doorbell; route is the intake that decides what the loop takes (any thread stores it,
 * release; the loop loads it once per message, acquire) and outlives its use: the caller routes
 * elsewhere, and so waits at most one message, before destroying an intake; unrouted counts the
 * messages taken while route was NULL (dropped, no model to decide them).
 */
struct fer_intake_loop {
    struct fer_take take;
    struct fer_intake *route;
    uint64_t unrouted;
    struct fer_pool *pool;               /* set before run; NULL: no pool */
};

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* fer_take's handler: one message stamped with the clocks at take (the ROS clock is
 * CLOCK_REALTIME with use_sim_time off), or one over the size limit, for the routed intake. */
static void take_one(void *ctx, const uint8_t *cdr, uint64_t len)
{
    struct fer_intake_loop *loop = ctx;
    struct fer_intake *in = __atomic_load_n(&loop->route, __ATOMIC_ACQUIRE);
    int32_t decision;

    if (in == NULL) {
        bump(&loop->unrouted);
        return;
    }
    if (cdr == NULL) {
        bump(&in->counters.received);
        discard(in, FER_REASON_REQUEST_TOO_LARGE);
        return;
    }
    fer_intake_decide(in, cdr, len, clock_ns(CLOCK_MONOTONIC), (int64_t)clock_ns(CLOCK_REALTIME),
                      &decision);
}

/* fer_take's handler for flowedge/actions (a pool's answers watch) */
static void take_answer(void *ctx, const uint8_t *cdr, uint64_t len)
{
    struct fer_intake_loop *loop = ctx;

    if (cdr != NULL && loop->pool != NULL)
        fer_pool_answer(loop->pool, cdr, len);
}

/* fer_take's tick, each pass with a pool: takeovers and expiry through the routed intake */
static void pool_tick(void *ctx)
{
    struct fer_intake_loop *loop = ctx;
    struct fer_intake *in = __atomic_load_n(&loop->route, __ATOMIC_ACQUIRE);

    if (in != NULL)
        fer_intake_pool_service(in, clock_ns(CLOCK_MONOTONIC), (int64_t)clock_ns(CLOCK_REALTIME));
}

int fer_intake_loop_set_pool(struct fer_intake_loop *loop, struct fer_pool *pool,
                             uint32_t answers_from)
{
    if (loop == NULL)
        return FER_EINVAL;
    loop->pool = pool;
    loop->take.watch = pool ? take_answer : NULL;
    loop->take.watch_from = pool ? answers_from : UINT32_MAX;
    loop->take.tick = pool ? pool_tick : NULL;
    if (pool)
        fer_pool_set_wake(pool, loop->take.efd);
    return FER_OK;
}

int fer_intake_loop_create(uint64_t max_request_bytes, struct fer_intake_loop **out)
{
    struct fer_intake_loop *loop;
    int rc;

    if (out == NULL)
        return FER_EINVAL;
    *out = NULL;
    loop = calloc(1, sizeof(*loop));
    if (loop == NULL)
        return FER_ENOMEM;
    rc = fer_take_init(&loop->take, fer_sat_add(max_request_bytes, FER_INTAKE_SLACK_BYTES),
                       take_one, loop);
    if (rc != FER_OK) {
        fer_intake_loop_destroy(loop);
        return rc;
    }
    *out = loop;
    return FER_OK;
}

void fer_intake_loop_destroy(struct fer_intake_loop *loop)
{
    if (loop == NULL)
        return;
    if (loop->pool)
        fer_pool_set_wake(loop->pool, -1);
    fer_take_fini(&loop->take);
    free(loop);
}

int fer_intake_loop_route(struct fer_intake_loop *loop, struct fer_intake *in)
{
    if (loop == NULL)
        return FER_EINVAL;
    __atomic_store_n(&loop->route, in, __ATOMIC_RELEASE);
    return FER_OK;
}

int fer_intake_loop_run(struct fer_intake_loop *loop, const struct fer_rcl_take *rcl,
                        void *const *subscriptions, uint32_t n_subscriptions, uint64_t wait_ns)
{
    if (loop == NULL)
        return FER_EINVAL;
    return fer_take_run(&loop->take, rcl, subscriptions, n_subscriptions, wait_ns);
}

void fer_intake_loop_stop(struct fer_intake_loop *loop)
{
    if (loop != NULL)
        fer_take_stop(&loop->take);
}

void fer_intake_loop_pause(struct fer_intake_loop *loop, uint32_t paused)
{
    if (loop != NULL)
        fer_take_pause(&loop->take, paused);
}

void fer_intake_loop_rearm(struct fer_intake_loop *loop)
{
    if (loop != NULL)
        fer_take_rearm(&loop->take);
}

const struct fer_take_counters *fer_intake_loop_counters(const struct fer_intake_loop *loop)
{
    return loop ? &loop->take.counters : NULL;
}

uint64_t fer_intake_loop_unrouted(const struct fer_intake_loop *loop)
{
    return loop ? __atomic_load_n(&loop->unrouted, __ATOMIC_RELAXED) : 0;
}
