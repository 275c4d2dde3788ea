/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_rcl.h - the slice of rcl's C ABI that the publisher and the request intake call, in one
 * place.
 *
 * Neither links against rcl: flowedge_relay/rcl_abi.py resolves these functions in the librcl and
 * librcutils that rclpy itself loaded (/proc/self/maps) and hands them over as pointers, so the
 * handles rclpy created (rcl_publisher_t, rcl_subscription_t) are used with their own library.
 * The signatures and rcutils_uint8_array_t (rcl_serialized_message_t) below are identical in
 * rcl 9.2 (Jazzy) and rcl 10.1 (Kilted): test/test_publish.py and test/test_intake.py send and
 * receive through them on both.
 *
 * Same rules as fer.h: read verbatim into the cdef, so declarations and plain integer #defines
 * only.
 */

#define FER_RCL_OK 0
#define FER_RCL_TAKE_FAILED 401 /* RCL_RET_SUBSCRIPTION_TAKE_FAILED: nothing to take */

/* rcutils_allocator_t: what rmw calls to grow a serialized message that is too small. */
struct fer_rcl_allocator {
    void *(*allocate)(size_t size, void *state);
    void (*deallocate)(void *pointer, void *state);
    void *(*reallocate)(void *pointer, size_t size, void *state);
    void *(*zero_allocate)(size_t number_of_elements, size_t size_of_element, void *state);
    void *state;
};

/* rcutils_uint8_array_t, which rcl_serialized_message_t is. */
struct fer_rcl_serialized {
    uint8_t *buffer;
    size_t buffer_length;
    size_t buffer_capacity;
    struct fer_rcl_allocator allocator;
};

/* rcl_publish_serialized_message(const rcl_publisher_t *, const rcl_serialized_message_t *,
 * rmw_publisher_allocation_t *) */
typedef int32_t (*fer_rcl_publish_fn)(const void *publisher, const void *serialized,
                                      void *allocation);
/* rcl_take_serialized_message(const rcl_subscription_t *, rcl_serialized_message_t *,
 * rmw_message_info_t *, rmw_subscription_allocation_t *) */
typedef int32_t (*fer_rcl_take_fn)(const void *subscription, void *serialized,
                                   void *message_info, void *allocation);
/* rcl_event_callback_t / rmw_event_callback_t: called by the middleware with the number of new
 * messages, from one of its own threads. */
typedef void (*fer_rcl_event_callback_fn)(const void *user_data, size_t number_of_events);
/* rcl_subscription_set_on_new_message_callback(const rcl_subscription_t *, rcl_event_callback_t,
 * const void *user_data); a NULL callback unsets it. */
typedef int32_t (*fer_rcl_set_callback_fn)(const void *subscription,
                                           fer_rcl_event_callback_fn callback,
                                           const void *user_data);
/* rcutils_reset_error(void): clears rcl's thread-local error state after a failed call. */
typedef void (*fer_rcl_reset_error_fn)(void);

/* The three functions a take loop calls (csrc/fer_take.c): resolved by flowedge_relay/rcl_abi.py. */
struct fer_rcl_take {
    fer_rcl_take_fn take;
    fer_rcl_set_callback_fn set_callback;
    fer_rcl_reset_error_fn reset_error;
};

/* What a take loop counts (its one thread writes; any thread may read, relaxed). */
struct fer_take_counters {
    uint64_t announced;                  /* messages the middleware announced (callback counts) */
    uint64_t wakeups;                    /* doorbell waits that ended with a ring */
    uint64_t take_errors;                /* rcl refused a take for another reason than "none" */
    int32_t last_take_error;
};
