/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_rt.c - a thread applies its own CPU set and SCHED_FIFO priority; the process locks its
 * memory (fer_rt.h says why). On Linux, pid 0 in sched_setaffinity / sched_setscheduler is the
 * calling thread, not the whole process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fer_internal.h"
#include "fer_rt.h"

static int mask_empty(const struct fer_rt_thread *t)
{
    for (int w = 0; w < FER_RT_CPU_WORDS; w++)
        if (t->cpu_mask[w] != 0)
            return 0;
    return 1;
}

static int apply_cpus(const struct fer_rt_thread *t)
{
    cpu_set_t set;

    CPU_ZERO(&set);
    for (size_t c = 0; c <= FER_RT_MAX_CPU; c++)
        if (t->cpu_mask[c / 64] & (UINT64_C(1) << (c % 64)))
            CPU_SET(c, &set);
    return sched_setaffinity(0, sizeof(set), &set) == 0 ? 0 : errno;
}

static int apply_fifo(int priority)
{
    struct sched_param param = {.sched_priority = priority};

    return sched_setscheduler(0, SCHED_FIFO, &param) == 0 ? 0 : errno;
}

int fer_rt_apply_self(struct fer_rt_thread *t)
{
    FER_CHECK_ARGS(t != NULL && t->fifo_priority >= 0 && t->fifo_priority <= 99);
    t->tid = (int32_t)syscall(SYS_gettid);
    t->name[FER_RT_NAME_LEN - 1] = '\0';
    if (t->name[0] != '\0')
        (void)prctl(PR_SET_NAME, t->name, 0, 0, 0); /* a name is for people: no outcome field */
    t->affinity_errno = mask_empty(t) ? 0 : apply_cpus(t);
    t->fifo_errno = t->fifo_priority > 0 ? apply_fifo(t->fifo_priority) : 0;
    __atomic_store_n(&t->applied, 1u, __ATOMIC_RELEASE);
    return t->affinity_errno == 0 && t->fifo_errno == 0 ? FER_OK : 1;
}

int fer_rt_lock_memory(void)
{
    return mlockall(MCL_CURRENT | MCL_FUTURE) == 0 ? 0 : errno;
}
