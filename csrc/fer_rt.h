/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_rt.h - a thread's real-time settings, applied by the thread itself, and the process's
 * memory lock (docs/robot-computer.md).
 *
 * Why in C: every thread on a request's path applies its own scheduling class and CPU set the
 * same way, whether Python started it (the request thread, the workers, the publisher) or C does
 * (an intake thread in C needs no interpreter to do it). The caller owns one struct fer_rt_thread
 * per thread role (flowedge_relay/realtime.py keeps them by role and reads the outcome back,
 * with what the OS reports in /proc). The thread fills in what was asked, calls
 * fer_rt_apply_self once, and the outcome is in the same struct.
 *
 * Same rules as fer.h: read verbatim into the cdef, so declarations and plain integer #defines
 * only.
 * Threads: before fer_rt_apply_self the struct belongs to whoever prepares it; fer_rt_apply_self
 * writes the outcome fields, then stores `applied` = 1 with release order; another thread may
 * read the outcome once it has loaded `applied` == 1 (acquire; a plain load suffices on x86 and
 * arm64 for these naturally aligned fields, which is what Python does).
 */

#define FER_RT_CPU_WORDS 16     /* CPUs 0..1023 (glibc's CPU_SETSIZE) */
#define FER_RT_MAX_CPU 1023
#define FER_RT_NAME_LEN 16      /* the kernel's thread name, with its NUL (TASK_COMM_LEN) */

/*
 * Invariants: fifo_priority is 0 (keep the inherited class) or 1..99; cpu_mask bit c (word
 * c / 64, bit c % 64) asks for CPU c, all zero = keep the inherited CPU set. The outcome fields
 * are written by fer_rt_apply_self only: tid the calling thread's id (gettid), affinity_errno /
 * fifo_errno 0 where applied or not asked, else the errno the OS refused it with.
 */
struct fer_rt_thread {
    /* asked (set before the thread applies them) */
    int32_t fifo_priority;
    uint32_t _pad;
    uint64_t cpu_mask[FER_RT_CPU_WORDS];
    /* the thread's name as ps, top -H and perf show it; "" keeps the inherited one */
    char name[FER_RT_NAME_LEN];
    /* outcome (written by fer_rt_apply_self in the thread itself) */
    int32_t tid;
    int32_t affinity_errno;
    int32_t fifo_errno;
    uint32_t applied;           /* 1 once the outcome is written */
};

/* Name the calling thread t->name (prctl PR_SET_NAME, best effort), then apply t's CPU set
 * (sched_setaffinity), then its SCHED_FIFO priority (sched_setscheduler), to it, each independently: a refused CPU set still tries the priority. Returns 0
 * when everything asked was applied, FER_EINVAL for t NULL or fifo_priority outside 0..99
 * (nothing applied, applied stays 0), else 1 (refusals are in the errno fields). */
int fer_rt_apply_self(struct fer_rt_thread *t);

/* mlockall(MCL_CURRENT | MCL_FUTURE): 0, or the errno the OS refused it with (EPERM without
 * CAP_IPC_LOCK and RLIMIT_MEMLOCK 0, ENOMEM when the process is larger than RLIMIT_MEMLOCK). */
int fer_rt_lock_memory(void);
