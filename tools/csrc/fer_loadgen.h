/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_loadgen.h - the intake bench's client in C: InferenceRequests written and published at a
 * set rate, and their answers taken and tallied, without the Python interpreter, so that the
 * client is not what limits the decisions per second the bench measures (bench intake). Tooling,
 * not the runtime contract: nothing on the relay's data path calls these.
 *
 * Same rules as fer.h: read verbatim into the tools' cdef (flowedge_relay_tools/_build_bench.py,
 * which includes the core's, so fer_rcl.h's types are shared), so declarations and plain integer
 * #defines only.
 */

/* What each request of a load is, by the relay's decision it is built to get. */
#define FER_LOAD_EXPIRED 0   /* deadline already passed when sent: EXPIRED on arrival */
#define FER_LOAD_REJECTED 1  /* more NFE than fit before its deadline: REJECTED_DEADLINE */
#define FER_LOAD_ADMITTED 2  /* no deadline, 1 NFE: accepted and computed (or queue full) */
/* due_nfe NFE due due_slack_ns after the send: computed while it fits, else rejected (admission,
 * queue full), or EXPIRED where it ran past its deadline once admitted */
#define FER_LOAD_DUE 3
#define FER_LOAD_PATTERN_MAX 16

/* A load: count requests of sequences base_sequence.., sessions "lg<k>" (k = i % sessions),
 * kinds cycling through pattern[0..n_pattern), sent at rate_per_s from the first send (late sends
 * go out at once: the schedule does not slip). observation: observation_dim floats. */
struct fer_load {
    char digest[80];
    uint32_t digest_len;
    uint32_t observation_dim;
    uint32_t action_dim;
    uint32_t action_horizon;
    const float *observation;
    uint64_t base_sequence;
    uint32_t count;
    uint32_t sessions;
    double rate_per_s;
    uint32_t pattern[FER_LOAD_PATTERN_MAX];
    uint32_t n_pattern;
    uint32_t rejected_nfe;               /* FER_LOAD_REJECTED: this many NFE ... */
    uint64_t rejected_slack_ns;          /* ... due this long after the send */
    uint32_t due_nfe;                    /* FER_LOAD_DUE: this many NFE ... */
    uint64_t due_slack_ns;               /* ... due this long after the send */
};

struct fer_load_result {
    uint64_t sent;
    uint64_t publish_failed;
    int32_t last_error;
    uint64_t first_ns;                   /* CLOCK_MONOTONIC of the first and last send */
    uint64_t last_ns;
    uint64_t behind_max_ns;              /* the most a send fell behind its schedule */
};

/* Publish the load through rcl (buf: cap bytes, scratch for one message). FER_OK, or FER_EINVAL
 * (NULL argument, n_pattern 0 or > FER_LOAD_PATTERN_MAX, a kind out of range, cap too small). */
int fer_load_publish(const struct fer_load *load, fer_rcl_publish_fn publish,
                     const void *rcl_publisher, fer_rcl_reset_error_fn reset_error, uint8_t *buf,
                     uint64_t cap, struct fer_load_result *out);

/* One request of a load as CDR bytes into buf (the i-th: its sequence, session and kind),
 * stamped now_ros. Returns the byte count, or 0 if cap is too small. Tests read it back with
 * rclpy. */
uint64_t fer_load_request_cdr(const struct fer_load *load, uint32_t i, int64_t now_ros,
                              uint8_t *buf, uint64_t cap);

/* The tally of a load's answers: per request, how many answers came (saturating at 255), the
 * last code, and when the first came (CLOCK_MONOTONIC). Answers with another session prefix or a
 * sequence outside the load are `stray`. */
struct fer_tally;
int fer_tally_create(uint64_t base_sequence, uint32_t count, struct fer_tally **out);
void fer_tally_destroy(struct fer_tally *t);
/* The answer-taking thread (a fer_take loop on the actions subscription) until fer_tally_stop. */
int fer_tally_run(struct fer_tally *t, const struct fer_rcl_take *rcl, void *subscription,
                  uint64_t wait_ns);
void fer_tally_stop(struct fer_tally *t);
/* Views of the tally's arrays (count entries each) and counters, for the bench to read. */
const uint8_t *fer_tally_answers(const struct fer_tally *t);
const uint8_t *fer_tally_codes(const struct fer_tally *t);
const uint64_t *fer_tally_first_ns(const struct fer_tally *t);
uint64_t fer_tally_taken(const struct fer_tally *t);
uint64_t fer_tally_stray(const struct fer_tally *t);
