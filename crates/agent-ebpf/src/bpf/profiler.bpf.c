// SPDX-License-Identifier: GPL-2.0-only
/*
 * Fathom's CPU profiler.
 *
 * `on_cpu_sample` runs on a CPU-clock perf event on every online CPU. For the
 * task it interrupted it records the pid, tid, names, the kernel and the user
 * stack (frame pointers, via bpf_get_stack: no stack-trace map to fill up or
 * clean), and streams one record per sample through the `events` ring buffer.
 * User space aggregates, symbolizes and ships.
 *
 * Wakeups are rare on purpose: records are written without waking the agent,
 * which drains on a timer, except for the first sample of a process it has
 * not seen (so it reads /proc/<pid>/maps while the process is still alive)
 * and when the buffer fills past `wakeup_bytes`.
 *
 * Nothing is dropped silently: every sample that is not recorded, and every
 * failed stack capture, increments a per-CPU counter that the agent exports.
 *
 * `on_exec` tells the agent that a process replaced its address space, so its
 * cached memory map is thrown away.
 *
 * The license string must be GPL-compatible: bpf_get_stack and
 * bpf_probe_read_kernel are GPL-only helpers.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "profiler.h"
#include "vmlinux_min.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the agent at load time. */
volatile const __u32 exclude_tgid = 0;     /* 0: exclude nothing */
volatile const __u64 wakeup_bytes = 65536; /* wake the agent when this much waits */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized by the agent from the CPU count */
} events SEC(".maps");

struct scratch {
	struct event_header h;
	__u64 stack[2 * MAX_STACK_DEPTH];
};

/* One record under construction per CPU: too large for the 512-byte stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Processes seen recently: tgid -> leader start time. A miss (or a reused
 * pid) wakes the agent up. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} known SEC(".maps");

/* Processes the agent decided not to profile: tgid -> leader start time
 * (so that a reused pid is profiled again). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} skip SEC(".maps");

_Static_assert(sizeof(struct event_header) == 72, "event_header layout");
_Static_assert(__builtin_offsetof(struct event_header, start_time) == 16, "start_time");
_Static_assert(__builtin_offsetof(struct event_header, comm) == 32, "comm");
_Static_assert(__builtin_offsetof(struct event_header, pcomm) == 48, "pcomm");
_Static_assert(__builtin_offsetof(struct event_header, kframes) == 64, "kframes");
_Static_assert(__builtin_offsetof(struct event_header, uerr) == 70, "uerr");
_Static_assert(sizeof(struct scratch) == 72 + 2 * MAX_STACK_DEPTH * 8, "scratch");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1; /* per-CPU value; the program does not nest on one CPU */
}

SEC("perf_event")
int on_cpu_sample(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 zero = 0;

	count(COUNTER_SAMPLES);
	if (tgid == 0) {
		count(COUNTER_IDLE);
		return 0;
	}
	if (tgid == exclude_tgid) {
		count(COUNTER_EXCLUDED);
		return 0;
	}

	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	__u64 start_time = BPF_CORE_READ(leader, start_time);

	__u64 *skipped = bpf_map_lookup_elem(&skip, &tgid);
	if (skipped && *skipped == start_time) {
		count(COUNTER_EXCLUDED);
		return 0;
	}

	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;

	s->h.kind = EVENT_SAMPLE;
	s->h.pid = tgid;
	s->h.tid = (__u32)id;
	s->h.cpu = bpf_get_smp_processor_id();
	s->h.start_time = start_time;
	s->h.ktime = bpf_ktime_get_ns();
	bpf_get_current_comm(s->h.comm, sizeof(s->h.comm));
	bpf_core_read_str(s->h.pcomm, sizeof(s->h.pcomm), &leader->comm);
	s->h.kerr = 0;
	s->h.uerr = 0;

	long kbytes = bpf_get_stack(ctx, s->stack, MAX_STACK_DEPTH * 8, 0);
	if (kbytes < 0) {
		count(COUNTER_KSTACK_ERR);
		s->h.kerr = (__s16)kbytes;
		kbytes = 0;
	}
	__u64 kframes = (__u64)kbytes / 8;
	if (kframes > MAX_STACK_DEPTH)
		kframes = MAX_STACK_DEPTH;

	__u64 uframes = 0;
	if (!(BPF_CORE_READ(task, flags) & PF_KTHREAD)) {
		long ubytes = bpf_get_stack(ctx, &s->stack[kframes], MAX_STACK_DEPTH * 8,
					    BPF_F_USER_STACK);
		if (ubytes < 0) {
			count(COUNTER_USTACK_ERR);
			s->h.uerr = (__s16)ubytes;
			ubytes = 0;
		} else if (ubytes == 0) {
			count(COUNTER_USTACK_EMPTY);
		}
		uframes = (__u64)ubytes / 8;
		if (uframes > MAX_STACK_DEPTH)
			uframes = MAX_STACK_DEPTH;
	}
	s->h.kframes = kframes;
	s->h.uframes = uframes;

	__u64 wake = BPF_RB_NO_WAKEUP;
	__u64 *seen = bpf_map_lookup_elem(&known, &tgid);
	if (!seen || *seen != start_time) {
		bpf_map_update_elem(&known, &tgid, &start_time, BPF_ANY);
		wake = BPF_RB_FORCE_WAKEUP;
	} else if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes) {
		wake = BPF_RB_FORCE_WAKEUP;
	}

	__u64 size = sizeof(struct event_header) + (kframes + uframes) * 8;
	if (size > sizeof(*s))
		return 0; /* cannot happen; bounds the size for the verifier */
	if (bpf_ringbuf_output(&events, s, size, wake))
		count(COUNTER_RINGBUF_FULL);
	return 0;
}

SEC("raw_tracepoint/sched_process_exec")
int on_exec(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

	/* The next sample of this process is a new process to the agent. */
	bpf_map_delete_elem(&known, &tgid);
	bpf_map_delete_elem(&skip, &tgid);

	struct event_header *h = bpf_ringbuf_reserve(&events, sizeof(*h), 0);
	if (!h) {
		count(COUNTER_EXEC_LOST);
		return 0;
	}
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	h->kind = EVENT_EXEC;
	h->pid = tgid;
	h->tid = (__u32)id;
	h->cpu = bpf_get_smp_processor_id();
	h->start_time = BPF_CORE_READ(leader, start_time);
	h->ktime = bpf_ktime_get_ns();
	bpf_get_current_comm(h->comm, sizeof(h->comm));
	bpf_core_read_str(h->pcomm, sizeof(h->pcomm), &leader->comm);
	h->kframes = 0;
	h->uframes = 0;
	h->kerr = 0;
	h->uerr = 0;
	bpf_ringbuf_submit(h, BPF_RB_NO_WAKEUP);
	return 0;
}
