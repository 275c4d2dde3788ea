/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_wire.h - the wire format of flowedge_relay_msgs, from the .msg files through their generated
 * C type support (docs/design.md, "The wire format").
 *
 * Reading (the intake's InferenceRequest, a pool's answers watch): fer_wire_load hands over the
 * messages' rosidl_typesupport_introspection_c handles (flowedge_relay/rcl_abi.py resolves them in
 * the colcon-built libflowedge_relay_msgs__rosidl_typesupport_introspection_c.so). Each is
 * compiled once into a plan: the members in .msg order with their CDR size and alignment, each
 * leaf bound by name to the view field that holds it (fer_request_view, fer_answer_view: a
 * nested field's name joined by "_", e.g. origin_stamp.sec is origin_stamp_sec; a string or
 * sequence is a pointer into the bytes and <name>_len). A parse walks the plan over the bytes in
 * place: no copy, no allocation, every length checked against what is left. A member the view
 * does not bind is walked over; a view field the message lacks makes the load fail.
 *
 * Writing a pool's handover (PoolSpill, docs/design.md §13.5): fer_spill_write walks the same
 * plan the other way, each member from the view field its name binds, so the bytes follow the
 * .msg as the reading does (test/test_wire.py checks both against rclpy, field by field).
 *
 * Writing (the publisher's ActionMessage): the generated struct, filled in place and handed to
 * rcl_publish; the middleware serializes it with its own type support (fer_publish.c).
 * fer_wire_set_serializer gives fer_action_cdr rmw_serialize and the ActionMessage's
 * rosidl_typesupport_c handle, for tests and tools that want the bytes.
 *
 * Same rules as fer.h: read verbatim into the cdef, so declarations and plain integer #defines
 * only. Load before any thread parses (the relay loads at its first intake or publisher).
 */

#define FER_WIRE_REQUEST 0           /* flowedge_relay_msgs/InferenceRequest */
#define FER_WIRE_ANSWER 1            /* flowedge_relay_msgs/ActionMessage */
#define FER_WIRE_SPILL 2             /* flowedge_relay_msgs/PoolSpill (written and read) */

/* Compile message `which`'s plan from its introspection handle (a const
 * rosidl_message_type_support_t * of "rosidl_typesupport_introspection_c"). FER_OK (also when
 * already loaded), FER_EINVAL (NULL, another type support, a different message), FER_ENOTSUP (a
 * member kind the wire reader does not walk, a view field the message does not have). */
int fer_wire_load(uint32_t which, const void *introspection_ts);
/* Whether `which` is loaded (1) or not (0). */
int fer_wire_loaded(uint32_t which);

/* rmw_serialize(const void *ros_message, const rosidl_message_type_support_t *,
 * rmw_serialized_message_t *) */
typedef int32_t (*fer_rmw_serialize_fn)(const void *ros_message, const void *type_support,
                                        void *serialized);
/* fer_action_cdr's serializer: rmw_serialize of the rmw that rclpy loaded and ActionMessage's
 * rosidl_typesupport_c handle; reset_error clears rcl's error state after a refusal (may be
 * NULL). FER_OK, FER_EINVAL. */
int fer_wire_set_serializer(fer_rmw_serialize_fn serialize, const void *action_ts,
                            void (*reset_error)(void));

#define FER_INTAKE_TENSORS_MAX 64     /* tensors of a request kept for checking (>= 2 x inputs + 1) */

/* ---- flowedge_relay_msgs/InferenceRequest read in place (fer_wire.c, fer_wire.h) --------------
 * A parsed request: pointers into the caller's buffer (valid while it is), nothing copied. Every
 * field of the message, named by fer_wire.h's rule (origin_stamp.sec is origin_stamp_sec; a string
 * or sequence is a pointer and <name>_len); tensor_bytes is the intake's own sum. Strings end at
 * their first NUL (as rosidl's C strings do) and exclude it. */
struct fer_tensor_view {
    const uint8_t *name;
    uint32_t name_len;
    uint32_t dtype;
    uint32_t shape_len;
    const uint8_t *shape;                /* shape_len little-endian uint32 */
    const uint8_t *data;
    uint64_t data_len;
};

struct fer_request_view {
    const uint8_t *session_id;
    uint32_t session_id_len;
    uint32_t retry_count;
    uint32_t retry_reason;
    uint32_t remaining_nfe;
    uint64_t sequence;
    uint64_t generation;
    int32_t origin_stamp_sec;
    uint32_t origin_stamp_nanosec;
    int32_t deadline_sec;
    uint32_t deadline_nanosec;
    const uint8_t *model_digest;
    uint32_t model_digest_len;
    uint32_t observation_dim;
    uint32_t action_dim;
    uint32_t action_horizon;
    const uint8_t *observation;          /* observation_len little-endian float32 */
    uint64_t observation_len;
    uint64_t noise_seed;
    uint64_t inputs_len;                 /* in the message; the first FER_INTAKE_TENSORS_MAX kept */
    uint64_t tensor_bytes;               /* sum of every tensor's data length */
    struct fer_tensor_view inputs[FER_INTAKE_TENSORS_MAX];
    const uint8_t *prefix_actions;       /* prefix_actions_len little-endian float32 (§5.4) */
    uint64_t prefix_actions_len;
    int32_t prefix_start_sec;
    uint32_t prefix_start_nanosec;
    int32_t action_period_sec;           /* builtin_interfaces/Duration */
    uint32_t action_period_nanosec;
    const uint8_t *client_id;            /* §7.1: whose request; empty = the session's */
    uint32_t client_id_len;
};

/* Parse len bytes (with the 4-byte encapsulation header, CDR little endian) into *v. 0 when the
 * bytes are a whole InferenceRequest (trailing padding allowed), -1 when not (truncated, a length
 * past the end, big endian or another encapsulation, or FER_WIRE_REQUEST not loaded). Reads
 * nothing past len. */
int fer_request_parse(const uint8_t *buf, uint64_t len, struct fer_request_view *v);
/* Only the members up to the last one a pool member needs to know who owns the request
 * (session_id, sequence, origin_stamp, deadline, model_digest; the others left as they were),
 * before anything else is read. 0 or -1 as above, for those members. */
int fer_request_parse_head(const uint8_t *buf, uint64_t len, struct fer_request_view *v);

/* An ActionMessage read in place: every field (fer_wire.h's naming rule). */
struct fer_answer_view {
    int32_t header_stamp_sec;
    uint32_t header_stamp_nanosec;
    const uint8_t *header_frame_id;
    uint32_t header_frame_id_len;
    uint32_t code;
    const uint8_t *session_id;
    uint32_t session_id_len;
    uint64_t sequence;
    uint64_t generation;
    uint32_t retry_count;
    const uint8_t *model_digest;
    uint32_t model_digest_len;
    uint32_t observation_dim;
    uint32_t action_dim;
    uint32_t action_horizon;
    int32_t deadline_sec;
    uint32_t deadline_nanosec;
    uint32_t remaining_nfe;
    const uint8_t *actions;              /* actions_len little-endian float32 */
    uint64_t actions_len;
    uint32_t nfe_done;
    uint64_t queue_ns;
    uint64_t compute_ns;
    uint32_t retry_reason;
    uint32_t frozen_rows;
    int32_t chunk_start_sec;
    uint32_t chunk_start_nanosec;
    const uint8_t *client_id;
    uint32_t client_id_len;
    uint32_t reject_reason;
    const uint8_t *relay_id;
    uint32_t relay_id_len;
    uint32_t pool_epoch;
};

/* Parse len bytes (the 4-byte encapsulation header, CDR little endian) into *v. 0 when the bytes
 * are a whole ActionMessage, or one that ends before relay_id (an answer of a relay that predates
 * pools: relay_id "" and pool_epoch 0); -1 when not, or when FER_WIRE_ANSWER is not loaded. */
int fer_answer_parse(const uint8_t *buf, uint64_t len, struct fer_answer_view *v);

/* ---- flowedge_relay_msgs/PoolSpill, written and read through its plan (docs/design.md §13.5) --
 * Every field by fer_wire.h's rule (stamp.sec is stamp_sec); request is the InferenceRequest's
 * CDR bytes as the owner took them. Parsed: pointers into the caller's buffer. */
struct fer_spill_view {
    const uint8_t *relay_id;             /* the owner handing it over */
    uint32_t relay_id_len;
    uint32_t pool_epoch;
    const uint8_t *target;               /* relay_id of the member that answers it */
    uint32_t target_len;
    const uint8_t *session_id;
    uint32_t session_id_len;
    uint64_t sequence;
    uint64_t generation;
    int32_t stamp_sec;                   /* builtin_interfaces/Time: when it was handed over */
    uint32_t stamp_nanosec;
    const uint8_t *request;
    uint64_t request_len;
};

/* Parse len bytes (the encapsulation header, CDR little endian) into *v: 0 when they are a whole
 * PoolSpill, -1 when not or when FER_WIRE_SPILL is not loaded. */
int fer_spill_parse(const uint8_t *buf, uint64_t len, struct fer_spill_view *v);
/* Write *v as a PoolSpill (with the header) into buf[0..cap): the bytes it takes, whole in buf
 * when that is <= cap (nothing is written past cap; buf NULL or cap 0 only sizes it); 0 when
 * FER_WIRE_SPILL is not loaded or a length does not fit its uint32 count. */
uint64_t fer_spill_write(const struct fer_spill_view *v, uint8_t *buf, uint64_t cap);
