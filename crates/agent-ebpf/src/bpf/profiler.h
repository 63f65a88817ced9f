/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layout shared between the BPF program and the agent. The Rust mirror is
 * in crates/agent-ebpf/src/lib.rs; both sides assert the same offsets, so a
 * change here that is not made there fails the build.
 */
#ifndef FATHOM_PROFILER_H
#define FATHOM_PROFILER_H

/* Deepest stack captured per half (kernel, user). 127 is the kernel's default
 * kernel.perf_event_max_stack. */
#define MAX_STACK_DEPTH 127
#define TASK_COMM_LEN 16

enum event_kind {
	/* A CPU-clock sample: the header plus kernel then user frames. */
	EVENT_SAMPLE = 1,
	/* A process called execve: its address space is new. Header only. */
	EVENT_EXEC = 2,
};

/* Header of every ring buffer record. */
struct event_header {
	__u32 kind;       /* enum event_kind */
	__u32 pid;        /* thread group id, as the host sees it */
	__u32 tid;        /* thread id, as the host sees it */
	__u32 cpu;
	__u64 start_time; /* the thread group leader's start time, ns since boot */
	__u64 ktime;      /* bpf_ktime_get_ns() when the event was taken */
	char comm[TASK_COMM_LEN];  /* thread name */
	char pcomm[TASK_COMM_LEN]; /* process (thread group leader) name */
	__u16 kframes;    /* kernel frames that follow, leaf first */
	__u16 uframes;    /* user frames that follow the kernel ones, leaf first */
	__s16 kerr;       /* 0, or the negative errno bpf_get_stack gave for the kernel stack */
	__s16 uerr;       /* same for the user stack */
};

/* Indices into the per-CPU `counters` array. */
enum counter {
	/* perf events that fired and were considered */
	COUNTER_SAMPLES = 0,
	/* samples of the idle task (pid 0), not recorded */
	COUNTER_IDLE = 1,
	/* samples of excluded processes (the agent itself, dropped by relabeling) */
	COUNTER_EXCLUDED = 2,
	/* samples lost because the ring buffer was full */
	COUNTER_RINGBUF_FULL = 3,
	/* kernel stack captures that failed */
	COUNTER_KSTACK_ERR = 4,
	/* user stack captures that failed */
	COUNTER_USTACK_ERR = 5,
	/* user-space tasks whose user stack came back empty */
	COUNTER_USTACK_EMPTY = 6,
	/* exec notifications lost because the ring buffer was full */
	COUNTER_EXEC_LOST = 7,
	COUNTER_MAX = 8,
};

#endif
