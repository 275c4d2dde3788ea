/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_wire.c - flowedge_relay_msgs' wire format from their generated introspection type support
 * (fer_wire.h says what and why): plans compiled once at load, parses that walk them in place.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <rosidl_typesupport_introspection_c/field_types.h>
#include <rosidl_typesupport_introspection_c/message_introspection.h>

#include "fer_internal.h"
#include "fer_cdr.h"
#include "fer_rcl.h"
#include "fer_wire.h"

#define NONE UINT32_MAX
#define PLAN_OPS 64
#define PATH_MAX_LEN 96
/* rosidl_typesupport_introspection_c__identifier's text: the variable is in a library the core
 * does not link against */
#define INTROSPECTION_C "rosidl_typesupport_introspection_c"

/* ---- what the views bind ------------------------------------------------------------------------
 * One row per view field that a message leaf fills: its name is the leaf's path (nested names
 * joined by "_"), so a row cannot name a field of another message without the load failing. */
enum { D_SCALAR, D_BYTES, D_MESSAGES };
struct dest {
    const char *name;
    uint8_t kind;                        /* D_SCALAR: a number; D_BYTES: string or sequence */
    uint8_t head;                        /* a pool member's ownership check reads it */
    uint8_t width, len_width;            /* bytes of the field, and of its _len */
    uint32_t off, len_off;
    uint32_t sub;                        /* D_MESSAGES: the elements' plan */
    uint32_t stride, cap;                /* D_MESSAGES: element size, elements kept */
    uint32_t sum_off, sum_src;           /* D_MESSAGES: parent u64 += each element's u64 */
};

#define SIZE(T, f) ((uint8_t)sizeof(((T *)0)->f))
#define SCALAR(T, f, h) {#f, D_SCALAR, h, SIZE(T, f), 0, (uint32_t)offsetof(T, f), NONE, 0, 0, 0, \
                         NONE, NONE}
#define BYTES(T, f, h) {#f, D_BYTES, h, SIZE(T, f), SIZE(T, f##_len), (uint32_t)offsetof(T, f), \
                        (uint32_t)offsetof(T, f##_len), 0, 0, 0, NONE, NONE}

#define RV struct fer_request_view
#define TV struct fer_tensor_view
#define AV struct fer_answer_view
#define SV struct fer_spill_view

enum { PLAN_REQUEST, PLAN_ANSWER, PLAN_SPILL, PLAN_TENSOR, PLANS };
_Static_assert(PLAN_REQUEST == FER_WIRE_REQUEST && PLAN_ANSWER == FER_WIRE_ANSWER &&
               PLAN_SPILL == FER_WIRE_SPILL, "a public message's plan is its FER_WIRE_ number");

static const struct dest TENSOR_DESTS[] = {
    BYTES(TV, name, 0), SCALAR(TV, dtype, 0), BYTES(TV, shape, 0), BYTES(TV, data, 0),
};

static const struct dest REQUEST_DESTS[] = {
    BYTES(RV, session_id, 1), SCALAR(RV, sequence, 1), SCALAR(RV, generation, 0),
    SCALAR(RV, retry_count, 0), SCALAR(RV, retry_reason, 0), SCALAR(RV, origin_stamp_sec, 1),
    SCALAR(RV, origin_stamp_nanosec, 1), SCALAR(RV, deadline_sec, 1),
    SCALAR(RV, deadline_nanosec, 1), SCALAR(RV, remaining_nfe, 0), BYTES(RV, model_digest, 1),
    SCALAR(RV, observation_dim, 0), SCALAR(RV, action_dim, 0), SCALAR(RV, action_horizon, 0),
    BYTES(RV, observation, 0), SCALAR(RV, noise_seed, 0),
    {"inputs", D_MESSAGES, 0, 0, SIZE(RV, inputs_len), (uint32_t)offsetof(RV, inputs),
     (uint32_t)offsetof(RV, inputs_len), PLAN_TENSOR, (uint32_t)sizeof(TV),
     FER_INTAKE_TENSORS_MAX, (uint32_t)offsetof(RV, tensor_bytes),
     (uint32_t)offsetof(TV, data_len)},
    BYTES(RV, prefix_actions, 0), SCALAR(RV, prefix_start_sec, 0),
    SCALAR(RV, prefix_start_nanosec, 0), SCALAR(RV, action_period_sec, 0),
    SCALAR(RV, action_period_nanosec, 0), BYTES(RV, client_id, 0),
};

static const struct dest ANSWER_DESTS[] = {
    SCALAR(AV, header_stamp_sec, 0), SCALAR(AV, header_stamp_nanosec, 0),
    BYTES(AV, header_frame_id, 0), SCALAR(AV, code, 0), BYTES(AV, session_id, 0),
    SCALAR(AV, sequence, 0), SCALAR(AV, generation, 0), SCALAR(AV, retry_count, 0),
    BYTES(AV, model_digest, 0), SCALAR(AV, observation_dim, 0), SCALAR(AV, action_dim, 0),
    SCALAR(AV, action_horizon, 0), SCALAR(AV, deadline_sec, 0), SCALAR(AV, deadline_nanosec, 0),
    SCALAR(AV, remaining_nfe, 0), BYTES(AV, actions, 0), SCALAR(AV, nfe_done, 0),
    SCALAR(AV, queue_ns, 0), SCALAR(AV, compute_ns, 0), SCALAR(AV, retry_reason, 0),
    SCALAR(AV, frozen_rows, 0), SCALAR(AV, chunk_start_sec, 0),
    SCALAR(AV, chunk_start_nanosec, 0), BYTES(AV, client_id, 0), SCALAR(AV, reject_reason, 0),
    BYTES(AV, relay_id, 0), SCALAR(AV, pool_epoch, 0),
};

static const struct dest SPILL_DESTS[] = {
    BYTES(SV, relay_id, 0), SCALAR(SV, pool_epoch, 0), BYTES(SV, target, 0),
    BYTES(SV, session_id, 0), SCALAR(SV, sequence, 0), SCALAR(SV, generation, 0),
    SCALAR(SV, stamp_sec, 0), SCALAR(SV, stamp_nanosec, 0), BYTES(SV, request, 0),
};

static const struct {
    const char *message;                 /* MessageMembers' message_name_ */
    const struct dest *dests;
    uint32_t n;
} VIEWS[PLANS] = {
    {"InferenceRequest", REQUEST_DESTS, sizeof(REQUEST_DESTS) / sizeof(REQUEST_DESTS[0])},
    {"ActionMessage", ANSWER_DESTS, sizeof(ANSWER_DESTS) / sizeof(ANSWER_DESTS[0])},
    {"PoolSpill", SPILL_DESTS, sizeof(SPILL_DESTS) / sizeof(SPILL_DESTS[0])},
    {"Tensor", TENSOR_DESTS, sizeof(TENSOR_DESTS) / sizeof(TENSOR_DESTS[0])},
};

/* ---- plans -------------------------------------------------------------------------------------- */

enum { OP_SCALAR, OP_STRING, OP_SEQ, OP_ARRAY, OP_MESSAGES, OP_BLOCK };
struct op {
    uint8_t kind;
    uint8_t size;                        /* a scalar's or an element's CDR size (= alignment) */
    uint8_t width, len_width;            /* d's, copied: the walk reads one record per member */
    uint8_t head;                        /* d's: the ownership check reads it */
    uint32_t off, len_off;               /* d's; off NONE: walked over */
    uint32_t count;                      /* OP_ARRAY: elements of a fixed array */
    const struct dest *d;                /* the view field it fills; NULL: none */
};

/* A run of consecutive scalars, read as one: between two variable-length members the padding
 * inside the run depends only on where it starts modulo 8, so each scalar's offset and the run's
 * span are tabled per start residue ((position - encapsulation) mod 8) at load. One bounds check,
 * no dispatch per member. */
#define BLOCK_MAX 16
#define BLOCKS 8
struct block {
    uint32_t n;
    uint16_t at[8][BLOCK_MAX];           /* by start residue: each scalar's offset from the start */
    uint16_t span[8];                    /* by start residue: the bytes the run covers */
    struct op f[BLOCK_MAX];              /* the scalars (OP_SCALAR ops) */
};

/* Invariants: ops[0..n) in .msg order, nested messages flattened, runs of scalars fused into
 * OP_BLOCK ops (count: the block); head: the ops a pool member's ownership check needs (a
 * prefix); relay_op: ActionMessage's relay_id op. Written once by fer_wire_load before `ready` is
 * released. */
struct plan {
    uint32_t n, head, relay_op;
    uint32_t peek;                       /* the head is string, block, string: head_peek reads it */
    uint32_t n_peek;                     /* the block's fields the ownership check reads */
    uint8_t peek_k[BLOCK_MAX];
    uint32_t route;                      /* peek, and the stamps are 4-byte block fields */
    uint16_t route_at[8][4];             /* by start residue: origin sec, nanosec, deadline's */
    struct op ops[PLAN_OPS];
    uint32_t n_blocks;
    struct block blocks[BLOCKS];
    uint32_t ready;
};

static struct plan plans[PLANS];
static fer_rmw_serialize_fn serializer;
static const void *action_ts;
static void (*serializer_reset)(void);

static uint8_t scalar_size(uint8_t type_id)
{
    switch (type_id) {
    case rosidl_typesupport_introspection_c__ROS_TYPE_BOOLEAN:
    case rosidl_typesupport_introspection_c__ROS_TYPE_OCTET:
    case rosidl_typesupport_introspection_c__ROS_TYPE_UINT8:
    case rosidl_typesupport_introspection_c__ROS_TYPE_INT8:
    case rosidl_typesupport_introspection_c__ROS_TYPE_CHAR:
        return 1;
    case rosidl_typesupport_introspection_c__ROS_TYPE_UINT16:
    case rosidl_typesupport_introspection_c__ROS_TYPE_INT16:
        return 2;
    case rosidl_typesupport_introspection_c__ROS_TYPE_FLOAT:
    case rosidl_typesupport_introspection_c__ROS_TYPE_UINT32:
    case rosidl_typesupport_introspection_c__ROS_TYPE_INT32:
        return 4;
    case rosidl_typesupport_introspection_c__ROS_TYPE_DOUBLE:
    case rosidl_typesupport_introspection_c__ROS_TYPE_UINT64:
    case rosidl_typesupport_introspection_c__ROS_TYPE_INT64:
        return 8;
    default:
        return 0; /* long double, wchar, wstring: none in these messages */
    }
}

static const rosidl_typesupport_introspection_c__MessageMembers *members_of(const void *ts)
{
    const rosidl_message_type_support_t *h = ts;

    if (h == NULL || h->typesupport_identifier == NULL || h->data == NULL ||
        strcmp(h->typesupport_identifier, INTROSPECTION_C) != 0)
        return NULL;
    return h->data;
}

static const struct dest *find(uint32_t view, const char *path)
{
    uint32_t i;

    for (i = 0; i < VIEWS[view].n; i++)
        if (strcmp(VIEWS[view].dests[i].name, path) == 0)
            return &VIEWS[view].dests[i];
    return NULL;
}

static int fuse(struct plan *pl);

/* Append mm's members to plan `view` (prefix: the enclosing path); FER_OK or an error. */
static int compile(uint32_t view, const rosidl_typesupport_introspection_c__MessageMembers *mm,
                   const char *prefix, uint32_t *bound)
{
    struct plan *pl = &plans[view];
    uint32_t i;
    int rc;

    for (i = 0; i < mm->member_count_; i++) {
        const rosidl_typesupport_introspection_c__MessageMember *m = &mm->members_[i];
        int sequence = m->is_array_ && (m->array_size_ == 0 || m->is_upper_bound_);
        char path[PATH_MAX_LEN];
        struct op o = {0, 0, 0, 0, 0, NONE, NONE, 0, NULL};

        if ((size_t)snprintf(path, sizeof(path), "%s%s", prefix, m->name_) >= sizeof(path))
            return FER_ENOTSUP;
        if (m->type_id_ == rosidl_typesupport_introspection_c__ROS_TYPE_MESSAGE) {
            const rosidl_typesupport_introspection_c__MessageMembers *sub = members_of(m->members_);
            char nested[PATH_MAX_LEN];

            if (sub == NULL)
                return FER_EINVAL;
            if (!m->is_array_) { /* flattened: Time, Duration, Header */
                if ((size_t)snprintf(nested, sizeof(nested), "%s_", path) >= sizeof(nested))
                    return FER_ENOTSUP;
                if ((rc = compile(view, sub, nested, bound)) != FER_OK)
                    return rc;
                continue;
            }
            o.d = find(view, path);
            if (!sequence || o.d == NULL || o.d->kind != D_MESSAGES)
                return FER_ENOTSUP; /* a sequence of messages is read only into a view */
            if (!plans[o.d->sub].ready) {
                uint32_t sub_bound = 0;

                memset(&plans[o.d->sub], 0, sizeof(plans[o.d->sub]));
                if ((rc = compile(o.d->sub, sub, "", &sub_bound)) != FER_OK)
                    return rc;
                if (sub_bound != VIEWS[o.d->sub].n)
                    return FER_ENOTSUP;
                plans[o.d->sub].head = plans[o.d->sub].n;
                plans[o.d->sub].relay_op = NONE;
                if ((rc = fuse(&plans[o.d->sub])) != FER_OK)
                    return rc;
                __atomic_store_n(&plans[o.d->sub].ready, 1, __ATOMIC_RELEASE);
            }
            o.kind = OP_MESSAGES;
        } else if (m->type_id_ == rosidl_typesupport_introspection_c__ROS_TYPE_STRING) {
            if (m->is_array_)
                return FER_ENOTSUP;
            o.kind = OP_STRING;
            o.size = 1;
            o.d = find(view, path);
        } else {
            o.size = scalar_size(m->type_id_);
            if (o.size == 0)
                return FER_ENOTSUP;
            o.kind = !m->is_array_ ? OP_SCALAR : sequence ? OP_SEQ : OP_ARRAY;
            o.count = o.kind == OP_ARRAY ? (uint32_t)m->array_size_ : 0;
            o.d = o.kind == OP_ARRAY ? NULL : find(view, path);
        }
        if (o.d != NULL) {
            o.off = o.d->off;
            o.len_off = o.d->len_off;
            o.width = o.d->width;
            o.len_width = o.d->len_width;
            o.head = o.d->head;
            /* a string or sequence binds pointer and _len, a number a field wide enough */
            if ((o.kind == OP_SCALAR) != (o.d->kind == D_SCALAR) ||
                (o.kind == OP_SCALAR && o.d->width < o.size))
                return FER_ENOTSUP;
            if (o.d->head)
                pl->head = pl->n + 1;
            if (strcmp(o.d->name, "relay_id") == 0)
                pl->relay_op = pl->n;
            (*bound)++;
        }
        if (pl->n == PLAN_OPS)
            return FER_ENOTSUP;
        pl->ops[pl->n++] = o;
    }
    return FER_OK;
}

/* Fuse every run of two or more consecutive scalars of pl into one OP_BLOCK op; head and
 * relay_op follow (a head ending inside a run takes the whole run). FER_OK, FER_ENOTSUP. */
static int fuse(struct plan *pl)
{
    struct op out[PLAN_OPS];
    uint32_t i = 0, n = 0, head = 0, relay = NONE;

    while (i < pl->n) {
        uint32_t j = i, s, k;

        while (j < pl->n && pl->ops[j].kind == OP_SCALAR && j - i < BLOCK_MAX)
            j++;
        if (j - i >= 2) {
            struct block *bl = &pl->blocks[pl->n_blocks];

            if (pl->n_blocks == BLOCKS)
                return FER_ENOTSUP;
            memset(bl, 0, sizeof(*bl));
            bl->n = j - i;
            for (k = 0; k < bl->n; k++)
                bl->f[k] = pl->ops[i + k];
            for (s = 0; s < 8; s++) {
                uint32_t pos = s;

                for (k = 0; k < bl->n; k++) {
                    uint32_t size = bl->f[k].size;

                    pos += (0u - pos) & (size - 1);
                    bl->at[s][k] = (uint16_t)(pos - s);
                    pos += size;
                }
                bl->span[s] = (uint16_t)(pos - s);
            }
            out[n] = (struct op){OP_BLOCK, 0, 0, 0, 0, NONE, NONE, pl->n_blocks++, NULL};
        } else {
            j = i + 1;
            out[n] = pl->ops[i];
            if (i == pl->relay_op)
                relay = n;
        }
        n++;
        if (i < pl->head)
            head = n;
        i = j;
    }
    memcpy(pl->ops, out, n * sizeof(out[0]));
    pl->n = n;
    pl->head = head;
    pl->relay_op = relay;
    return FER_OK;
}

/* Whether the request's peeked head is session_id, a block holding both stamps as 4-byte
 * fields, model_digest: then fer_request_parse_route reads them at offsets tabled here. */
static void shape_route(struct plan *pl, const struct block *bl)
{
    static const uint32_t stamps[4] = {
        (uint32_t)offsetof(RV, origin_stamp_sec), (uint32_t)offsetof(RV, origin_stamp_nanosec),
        (uint32_t)offsetof(RV, deadline_sec), (uint32_t)offsetof(RV, deadline_nanosec),
    };
    uint32_t j, k, s, found = 0;

    pl->route = 0;
    if (pl != &plans[PLAN_REQUEST] || pl->ops[0].off != offsetof(RV, session_id) ||
        pl->ops[2].off != offsetof(RV, model_digest))
        return;
    for (j = 0; j < 4; j++)
        for (k = 0; k < bl->n; k++)
            if (bl->f[k].off == stamps[j] && bl->f[k].size == 4 && bl->f[k].width == 4) {
                for (s = 0; s < 8; s++)
                    pl->route_at[s][j] = bl->at[s][k];
                found++;
                break;
            }
    pl->route = found == 4;
}

/* Whether pl's head is a string, a run of scalars and a string (InferenceRequest's session_id,
 * sequence .. remaining_nfe, model_digest): then head_peek reads it without the walk. */
static void shape_peek(struct plan *pl)
{
    const struct block *bl;
    uint32_t k;

    pl->peek = pl->head == 3 && pl->ops[0].kind == OP_STRING && pl->ops[0].off != NONE &&
               pl->ops[1].kind == OP_BLOCK && pl->ops[2].kind == OP_STRING &&
               pl->ops[2].off != NONE;
    if (!pl->peek)
        return;
    bl = &pl->blocks[pl->ops[1].count];
    pl->n_peek = 0;
    for (k = 0; k < bl->n; k++)
        if (bl->f[k].off != NONE && bl->f[k].head)
            pl->peek_k[pl->n_peek++] = (uint8_t)k;
    shape_route(pl, bl);
}

int fer_wire_load(uint32_t which, const void *introspection_ts)
{
    const rosidl_typesupport_introspection_c__MessageMembers *mm = members_of(introspection_ts);
    uint32_t bound = 0;
    int rc;

    if (which != FER_WIRE_REQUEST && which != FER_WIRE_ANSWER && which != FER_WIRE_SPILL)
        return FER_EINVAL;
    if (__atomic_load_n(&plans[which].ready, __ATOMIC_ACQUIRE))
        return FER_OK;
    if (mm == NULL || mm->message_name_ == NULL ||
        strcmp(mm->message_name_, VIEWS[which].message) != 0)
        return FER_EINVAL;
    memset(&plans[which], 0, sizeof(plans[which]));
    plans[which].relay_op = NONE;
    rc = compile(which, mm, "", &bound);
    if (rc == FER_OK && bound != VIEWS[which].n)
        rc = FER_ENOTSUP; /* a view field the message does not have */
    if (rc == FER_OK)
        rc = fuse(&plans[which]);
    if (rc == FER_OK)
        shape_peek(&plans[which]);
    if (rc != FER_OK) {
        memset(&plans[which], 0, sizeof(plans[which]));
        return rc;
    }
    __atomic_store_n(&plans[which].ready, 1, __ATOMIC_RELEASE);
    return FER_OK;
}

int fer_wire_loaded(uint32_t which)
{
    return which < PLANS && __atomic_load_n(&plans[which].ready, __ATOMIC_ACQUIRE) ? 1 : 0;
}

/* ---- parsing ------------------------------------------------------------------------------------
 * The hot path of every request: sizes and widths are 1, 2, 4 or 8, so each load and store is a
 * switch over fixed-size copies (plain moves, no call), and alignment a mask, not a division. */

/* fer_cdr_take for a power-of-two alignment, on the walk's own copy of the reader's position
 * (kept in registers: the view's stores could alias a struct in memory) */
static inline const uint8_t *take(const uint8_t *b, uint64_t len, uint64_t *at, int *ok,
                                  uint64_t size, uint64_t align)
{
    uint64_t n = *at, pad = (0 - (n - FER_CDR_ENCAPSULATION)) & (align - 1);

    if (!*ok || pad > len - n || size > len - n - pad) {
        *ok = 0;
        return NULL;
    }
    *at = n + pad + size;
    return b + n + pad;
}

static inline uint64_t load(const uint8_t *p, uint8_t size)
{
    uint64_t v8;
    uint32_t v4;
    uint16_t v2;

    switch (size) {
    case 8:
        memcpy(&v8, p, 8);
        return v8;
    case 4:
        memcpy(&v4, p, 4);
        return v4;
    case 2:
        memcpy(&v2, p, 2);
        return v2;
    default:
        return *p;
    }
}

static inline void put(uint8_t *base, uint32_t off, uint8_t width, uint64_t v)
{
    uint8_t *f = base + off;
    uint32_t v4 = (uint32_t)v;
    uint16_t v2 = (uint16_t)v;

    switch (width) {
    case 8:
        memcpy(f, &v, 8);
        break;
    case 4:
        memcpy(f, &v4, 4);
        break;
    case 2:
        memcpy(f, &v2, 2);
        break;
    default:
        *f = (uint8_t)v;
    }
}

static inline void put_bytes(uint8_t *base, const struct op *o, const uint8_t *p, uint64_t len)
{
    memcpy(base + o->off, &p, sizeof(p));
    put(base, o->len_off, o->len_width, len);
}

static void run_messages(const struct op *o, struct fer_cdr_reader *r, uint8_t *base,
                         uint64_t count);

/* Walk ops[0..n) of plan pl over r into view `base` (NULL: only walked; head_only: only the
 * fields the ownership check reads); how many ops were read whole (n when all). */
static uint32_t run(const struct plan *pl, uint32_t n, struct fer_cdr_reader *r, uint8_t *base,
                    int head_only)
{
    const uint8_t *b = r->b;
    uint64_t len = r->len, at = r->n;
    int ok = r->ok;
    uint32_t i;

    for (i = 0; i < n && ok; i++) {
        const struct op *o = &pl->ops[i];
        int bind = base != NULL && o->off != NONE && (!head_only || o->head);
        const uint8_t *p, *q;
        uint64_t count;

        switch (o->kind) {
        case OP_SCALAR:
            p = take(b, len, &at, &ok, o->size, o->size);
            if (p && bind)
                put(base, o->off, o->width, load(p, o->size)); /* little endian: zero-extended */
            break;
        case OP_STRING: /* its bytes up to the first NUL (rosidl's C strings end there too) */
            q = take(b, len, &at, &ok, 4, 4);
            count = q ? load(q, 4) : 0;
            p = take(b, len, &at, &ok, count, 1);
            if (bind)
                put_bytes(base, o, p, p == NULL || count == 0 ? 0
                                      : strnlen((const char *)p, count));
            break;
        case OP_SEQ:
            q = take(b, len, &at, &ok, 4, 4);
            count = q ? load(q, 4) : 0;
            /* count < 2^32, size <= 8: no overflow */
            p = take(b, len, &at, &ok, count * o->size, o->size);
            if (bind)
                put_bytes(base, o, p, count);
            break;
        case OP_ARRAY:
            take(b, len, &at, &ok, (uint64_t)o->count * o->size, o->size);
            break;
        case OP_BLOCK: {
            const struct block *bl = &pl->blocks[o->count];
            uint32_t s = (uint32_t)((at - FER_CDR_ENCAPSULATION) & 7), k;

            if (bl->span[s] > len - at) {
                ok = 0;
                break;
            }
            p = b + at;
            at += bl->span[s];
            for (k = 0; base != NULL && k < bl->n; k++)
                if (bl->f[k].off != NONE && (!head_only || bl->f[k].head))
                    put(base, bl->f[k].off, bl->f[k].width, load(p + bl->at[s][k], bl->f[k].size));
            break;
        }
        case OP_MESSAGES:
            q = take(b, len, &at, &ok, 4, 4);
            count = q ? load(q, 4) : 0;
            if (bind)
                put(base, o->len_off, o->len_width, count);
            r->n = at;
            r->ok = ok;
            run_messages(o, r, bind ? base : NULL, count);
            at = r->n;
            ok = r->ok;
            break;
        default:
            ok = 0;
        }
    }
    r->n = at;
    r->ok = ok;
    return ok ? i : (i ? i - 1 : 0);
}

/* count elements of a sequence of messages: the first d->cap into the view's array, the rest
 * walked through a scratch element (their sum still counted) */
static void run_messages(const struct op *o, struct fer_cdr_reader *r, uint8_t *base,
                         uint64_t count)
{
    const struct dest *d = o->d;
    const struct plan *sub = &plans[d->sub];
    uint8_t scratch[sizeof(struct fer_tensor_view) > 64 ? sizeof(struct fer_tensor_view) : 64];
    uint64_t k, v, bytes;

    for (k = 0; k < count && r->ok; k++) {
        uint8_t *elem = base == NULL ? NULL
                        : k < d->cap ? base + d->off + k * d->stride
                        : d->stride <= sizeof(scratch) ? scratch : NULL;

        run(sub, sub->n, r, elem, 0); /* binds every field of the element */
        if (elem && d->sum_off != NONE && r->ok) {
            memcpy(&bytes, elem + d->sum_src, 8);
            memcpy(&v, base + d->sum_off, 8);
            v = fer_sat_add(v, bytes);
            memcpy(base + d->sum_off, &v, 8);
        }
    }
}

int fer_request_parse(const uint8_t *buf, uint64_t len, struct fer_request_view *v)
{
    const struct plan *pl = &plans[PLAN_REQUEST];
    struct fer_cdr_reader r = fer_cdr_open(buf, len);

    if (v == NULL || !r.ok || !__atomic_load_n(&pl->ready, __ATOMIC_ACQUIRE))
        return -1;
    /* every field is bound (fer_wire_load checks it), so a whole parse writes each one: no
     * memset of the view (a rep stos of its ~600 bytes was a tenth of a decision) */
    v->tensor_bytes = 0;
    run(pl, pl->n, &r, (uint8_t *)v, 0);
    return r.ok ? 0 : -1;
}

/* A CDR string at *at (aligned to 4): its bytes as the length gives them, no scan. */
static inline int route_string(const uint8_t *b, uint64_t len, uint64_t *at, const uint8_t **p,
                               uint32_t *bytes)
{
    uint64_t n = *at + ((0 - (*at - FER_CDR_ENCAPSULATION)) & 3), count;

    if (n > len || 4 > len - n)
        return -1;
    count = load(b + n, 4);
    n += 4;
    if (count > len - n)
        return -1;
    *p = b + n;
    *bytes = (uint32_t)count;
    *at = n + count;
    return 0;
}

/* A CDR string at *at (aligned to 4) into op o's field, up to its first NUL; 0, or -1 past the
 * end. */
static inline int peek_string(const uint8_t *b, uint64_t len, uint64_t *at, const struct op *o,
                              uint8_t *base)
{
    const uint8_t *p;
    uint32_t count;

    if (route_string(b, len, at, &p, &count) != 0)
        return -1;
    put_bytes(base, o, p, count ? strnlen((const char *)p, count) : 0);
    return 0;
}

/* The head of a plan shaped string, block, string (shape_peek), read straight: what run does
 * for those three ops, without the walk's dispatch (a pool's standby and answers watch read
 * keys through it; the drop reads fer_request_parse_route, which does not scan the strings). */
static int head_peek(const struct plan *pl, const uint8_t *b, uint64_t len, uint8_t *base)
{
    const struct block *bl = &pl->blocks[pl->ops[1].count];
    uint64_t at = FER_CDR_ENCAPSULATION, s;
    const uint8_t *p;
    uint32_t i;

    if (peek_string(b, len, &at, &pl->ops[0], base) != 0)
        return -1;
    s = (at - FER_CDR_ENCAPSULATION) & 7;
    if (bl->span[s] > len - at)
        return -1;
    p = b + at;
    at += bl->span[s];
    for (i = 0; i < pl->n_peek; i++) {
        const struct op *f = &bl->f[pl->peek_k[i]];

        put(base, f->off, f->width, load(p + bl->at[s][pl->peek_k[i]], f->size));
    }
    return peek_string(b, len, &at, &pl->ops[2], base);
}

int fer_request_parse_head(const uint8_t *buf, uint64_t len, struct fer_request_view *v)
{
    const struct plan *pl = &plans[PLAN_REQUEST];
    struct fer_cdr_reader r = fer_cdr_open(buf, len);

    if (v == NULL || !r.ok || !__atomic_load_n(&pl->ready, __ATOMIC_ACQUIRE))
        return -1;
    if (pl->peek)
        return head_peek(pl, buf, len, (uint8_t *)v);
    run(pl, pl->head, &r, (uint8_t *)v, 1);
    return r.ok ? 0 : -1;
}

/* Another shape of the head: the walk, its strings already scanned (their bytes end before
 * their first NUL, which a route reader takes alike). */
static __attribute__((noinline)) int route_walked(const uint8_t *buf, uint64_t len,
                                                  struct fer_request_route *r)
{
    struct fer_request_view v;

    if (fer_request_parse_head(buf, len, &v) != 0)
        return -1;
    *r = (struct fer_request_route){v.session_id, v.session_id_len, v.model_digest,
                                    v.model_digest_len, v.origin_stamp_sec,
                                    v.origin_stamp_nanosec, v.deadline_sec, v.deadline_nanosec};
    return 0;
}

int fer_request_parse_route(const uint8_t *buf, uint64_t len, struct fer_request_route *r)
{
    const struct plan *pl = &plans[PLAN_REQUEST];
    const struct block *bl;
    uint64_t at = FER_CDR_ENCAPSULATION, s;
    const uint8_t *p;

    if (r == NULL || buf == NULL || len < FER_CDR_ENCAPSULATION || buf[0] != 0 || buf[1] != 1 ||
        !__atomic_load_n(&pl->ready, __ATOMIC_ACQUIRE))
        return -1;
    if (!pl->route)
        return route_walked(buf, len, r);
    if (route_string(buf, len, &at, &r->session_id, &r->session_id_bytes) != 0)
        return -1;
    bl = &pl->blocks[pl->ops[1].count];
    s = (at - FER_CDR_ENCAPSULATION) & 7;
    if (bl->span[s] > len - at)
        return -1;
    p = buf + at;
    at += bl->span[s];
    memcpy(&r->origin_stamp_sec, p + pl->route_at[s][0], 4);
    memcpy(&r->origin_stamp_nanosec, p + pl->route_at[s][1], 4);
    memcpy(&r->deadline_sec, p + pl->route_at[s][2], 4);
    memcpy(&r->deadline_nanosec, p + pl->route_at[s][3], 4);
    return route_string(buf, len, &at, &r->model_digest, &r->model_digest_bytes);
}

int fer_answer_parse(const uint8_t *buf, uint64_t len, struct fer_answer_view *v)
{
    const struct plan *pl = &plans[PLAN_ANSWER];
    struct fer_cdr_reader r = fer_cdr_open(buf, len);
    uint32_t done;

    if (v == NULL || !r.ok || !__atomic_load_n(&pl->ready, __ATOMIC_ACQUIRE))
        return -1;
    done = run(pl, pl->n, &r, (uint8_t *)v, 0); /* every field bound: no memset */
    if (r.ok)
        return 0;
    if (pl->relay_op == NONE || done < pl->relay_op)
        return -1;
    /* ended before relay_id: a relay outside any pool, from before pools */
    v->relay_id = NULL;
    v->relay_id_len = 0;
    v->pool_epoch = 0;
    return 0;
}

int fer_spill_parse(const uint8_t *buf, uint64_t len, struct fer_spill_view *v)
{
    const struct plan *pl = &plans[PLAN_SPILL];
    struct fer_cdr_reader r = fer_cdr_open(buf, len);

    if (v == NULL || !r.ok || !__atomic_load_n(&pl->ready, __ATOMIC_ACQUIRE))
        return -1;
    run(pl, pl->n, &r, (uint8_t *)v, 0); /* every field bound: no memset */
    return r.ok ? 0 : -1;
}

/* ---- writing through a plan ---------------------------------------------------------------------
 * The walk of run the other way: each member from the view field it binds (a member the view
 * does not bind goes out as zero or empty), aligned as the reader expects it. */

/* A scalar member from its view field (width >= size; little endian: the value is its low size
 * bytes) */
static void emit_scalar(struct fer_cdr_writer *w, const struct op *o, const uint8_t *base)
{
    uint64_t v = o->off == NONE ? 0 : load(base + o->off, o->width);

    fer_cdr_put(w, &v, o->size, o->size);
}

/* A string's or sequence's pointer and count from the view (NULL, 0 when unbound) */
static uint64_t view_bytes(const struct op *o, const uint8_t *base, const uint8_t **p)
{
    *p = NULL;
    if (o->off == NONE)
        return 0;
    memcpy(p, base + o->off, sizeof(*p));
    return load(base + o->len_off, o->len_width);
}

/* FER_OK, FER_EINVAL (a length past its uint32 count), FER_ENOTSUP (a sequence of messages) */
static int emit(const struct plan *pl, const uint8_t *base, struct fer_cdr_writer *w)
{
    uint32_t i, k;

    for (i = 0; i < pl->n; i++) {
        const struct op *o = &pl->ops[i];
        const uint8_t *p;
        uint64_t count, zero = 0;

        switch (o->kind) {
        case OP_SCALAR:
            emit_scalar(w, o, base);
            break;
        case OP_BLOCK:
            for (k = 0; k < pl->blocks[o->count].n; k++)
                emit_scalar(w, &pl->blocks[o->count].f[k], base);
            break;
        case OP_STRING:
            count = view_bytes(o, base, &p);
            if (count >= UINT32_MAX || (p == NULL && count > 0))
                return FER_EINVAL;
            fer_cdr_string(w, (const char *)p, (uint32_t)count);
            break;
        case OP_SEQ:
            count = view_bytes(o, base, &p);
            if (count > UINT32_MAX || (p == NULL && count > 0))
                return FER_EINVAL;
            fer_cdr_u32(w, (uint32_t)count);
            if (count > 0) /* an empty sequence is not aligned (Fast CDR's rule) */
                fer_cdr_put(w, p, count * o->size, o->size);
            break;
        case OP_ARRAY:
            for (k = 0; k < o->count; k++)
                fer_cdr_put(w, &zero, o->size, o->size);
            break;
        default:
            return FER_ENOTSUP;
        }
    }
    return FER_OK;
}

uint64_t fer_spill_write(const struct fer_spill_view *v, uint8_t *buf, uint64_t cap)
{
    const struct plan *pl = &plans[PLAN_SPILL];
    struct fer_cdr_writer w = {buf, 0, buf == NULL ? 0 : cap};

    if (v == NULL || !__atomic_load_n(&pl->ready, __ATOMIC_ACQUIRE))
        return 0;
    fer_cdr_begin(&w);
    return emit(pl, (const uint8_t *)v, &w) == FER_OK ? w.n : 0;
}

/* ---- the serializer for fer_action_cdr ---------------------------------------------------------- */

int fer_wire_set_serializer(fer_rmw_serialize_fn serialize, const void *ts,
                            void (*reset_error)(void))
{
    if (serialize == NULL || ts == NULL)
        return FER_EINVAL;
    serializer_reset = reset_error;
    action_ts = ts;
    __atomic_store_n(&serializer, serialize, __ATOMIC_RELEASE);
    return FER_OK;
}

/* rmw_serialize of an ActionMessage into buf[0..cap): the byte count, or 0 (no serializer, cap
 * too small: the buffer is never grown). */
static void *no_alloc(size_t size, void *state) { (void)size; (void)state; return NULL; }
static void no_free(void *p, void *state) { (void)p; (void)state; }
static void *no_realloc(void *p, size_t size, void *state)
{
    (void)p; (void)size; (void)state;
    return NULL;
}
static void *no_zalloc(size_t n, size_t size, void *state)
{
    (void)n; (void)size; (void)state;
    return NULL;
}

uint64_t fer_wire_serialize_action(const void *msg, uint8_t *buf, uint64_t cap)
{
    fer_rmw_serialize_fn fn = __atomic_load_n(&serializer, __ATOMIC_ACQUIRE);
    struct fer_rcl_serialized s = {buf, 0, cap, {no_alloc, no_free, no_realloc, no_zalloc, NULL}};

    if (fn == NULL || msg == NULL || buf == NULL)
        return 0;
    if (fn(msg, action_ts, &s) != FER_RCL_OK || s.buffer != buf) {
        if (serializer_reset)
            serializer_reset();
        return 0;
    }
    return s.buffer_length;
}

int fer_wire_request_key(const uint8_t *buf, uint64_t len, const uint8_t **sid, uint32_t *sid_len,
                         uint64_t *sequence)
{
    struct fer_request_view v;

    v.session_id = NULL;
    v.session_id_len = 0;
    v.sequence = 0;
    if (fer_request_parse_head(buf, len, &v) != 0)
        return -1;
    *sid = v.session_id;
    *sid_len = v.session_id_len;
    *sequence = v.sequence;
    return 0;
}
