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
volatile const __u64 offcpu_min_ns = 0;    /* off-CPU: 0 disables; shorter blocks are not recorded */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* resized by the agent from the CPU count */
} events SEC(".maps");

struct scratch {
	struct event_header h;
	__u64 stack[2 * MAX_STACK_DEPTH + 2 * MAX_PY_DEPTH];
};

/* Records under construction per CPU: too large for the 512-byte stack.
 * Slot 0 for CPU samples, slot 1 for tracepoint programs (off-CPU), which a
 * sample (an NMI or timer interrupt) may interrupt on the same CPU. */
#define SLOT_SAMPLE 0
#define SLOT_TRACE 1
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
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

/* Unwind tables: rows of every binary (sized by the agent from its memory
 * budget), and per process the mappings that have a table. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* resized by the agent */
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct unwind_proc);
} unwind_procs SEC(".maps");

/* CPython processes: tgid -> where their frames are. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

/* Off-CPU: tid -> ktime when it left the CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} offcpu_since SEC(".maps");

_Static_assert(sizeof(struct event_header) == 88, "event_header layout");
_Static_assert(sizeof(struct unwind_row) == 12, "unwind_row layout");
_Static_assert(sizeof(struct unwind_mapping) == 32, "unwind_mapping layout");
_Static_assert(__builtin_offsetof(struct event_header, flags) == 72, "flags");
_Static_assert(__builtin_offsetof(struct event_header, pyframes) == 76, "pyframes");
_Static_assert(__builtin_offsetof(struct event_header, value) == 80, "value");
_Static_assert(__builtin_offsetof(struct event_header, start_time) == 16, "start_time");
_Static_assert(__builtin_offsetof(struct event_header, comm) == 32, "comm");
_Static_assert(__builtin_offsetof(struct event_header, pcomm) == 48, "pcomm");
_Static_assert(__builtin_offsetof(struct event_header, kframes) == 64, "kframes");
_Static_assert(__builtin_offsetof(struct event_header, uerr) == 70, "uerr");
_Static_assert(sizeof(struct scratch) == 88 + (2 * MAX_STACK_DEPTH + 2 * MAX_PY_DEPTH) * 8, "scratch");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1; /* per-CPU value; the program does not nest on one CPU */
}

#if defined(__TARGET_ARCH_x86)
/* State of a table-driven unwind, shared with the bpf_loop callback. */
struct unwind_ctx {
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u32 tgid;
	__u32 base;  /* index in scratch.stack of the first user frame */
	__u32 depth; /* user frames written */
	__u32 done;  /* 1: reached the outermost frame */
	__u32 truncated;
	__u32 slot;  /* scratch slot */
};

/* A binary search [lo, hi) run by bpf_loop, one step per call, so that the
 * verifier checks one step instead of every path through the loop. */
struct search {
	__u32 lo;
	__u32 hi;
	__u64 key;
	struct unwind_proc *proc; /* mappings: search maps[].start */
	__u32 failed;
};

static long mapping_step(__u64 i, void *arg)
{
	struct search *c = arg;
	if (c->lo >= c->hi)
		return 1;
	__u32 mid = c->lo + (c->hi - c->lo) / 2;
	struct unwind_proc *p = c->proc;
	if (!p)
		return 1;
	if (p->maps[mid & (UNWIND_MAX_MAPPINGS - 1)].start <= c->key)
		c->lo = mid + 1;
	else
		c->hi = mid;
	return 0;
}

static long row_step(__u64 i, void *arg)
{
	struct search *c = arg;
	if (c->lo >= c->hi)
		return 1;
	__u32 mid = c->lo + (c->hi - c->lo) / 2;
	struct unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &mid);
	if (!r) {
		c->failed = 1;
		return 1;
	}
	if (r->pc <= c->key)
		c->lo = mid + 1;
	else
		c->hi = mid;
	return 0;
}

/* Index of the last entry of `maps[0..len)` with start <= addr, or -1. */
static __always_inline int find_mapping(struct unwind_proc *p, __u64 addr)
{
	__u32 hi = p->len;
	if (hi > UNWIND_MAX_MAPPINGS)
		hi = UNWIND_MAX_MAPPINGS;
	struct search c = {.lo = 0, .hi = hi, .key = addr, .proc = p};
	bpf_loop(9, mapping_step, &c, 0); /* log2(UNWIND_MAX_MAPPINGS) + 1 */
	return (int)c.lo - 1;
}

/* The row of table [start, start + len) that covers `pc`, or NULL. */
static __always_inline struct unwind_row *find_row(__u32 start, __u32 len, __u32 pc)
{
	struct search c = {.lo = start, .hi = start + len, .key = pc};
	bpf_loop(25, row_step, &c, 0); /* tables of up to 2^24 rows */
	if (c.failed || c.lo <= start)
		return NULL;
	__u32 idx = c.lo - 1;
	return bpf_map_lookup_elem(&unwind_rows, &idx);
}

/* One frame: record pc, then find the caller's pc, sp and bp. Returns 1 to
 * stop the loop. */
static long unwind_step(__u64 i, void *arg)
{
	struct unwind_ctx *c = arg;
	__u32 slot = c->slot;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &slot);
	if (!s)
		return 1;
	__u32 idx = c->base + c->depth;
	if (idx >= 2 * MAX_STACK_DEPTH) {
		c->truncated = 1;
		return 1;
	}
	s->stack[idx] = c->pc;
	c->depth++;

	/* Past the leaf, pc is a return address: the call is just before it
	 * (and a call to a noreturn function may be the last instruction). */
	__u64 at = c->depth > 1 ? c->pc - 1 : c->pc;
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &c->tgid);
	int m = p ? find_mapping(p, at) : -1;
	struct unwind_mapping *um = NULL;
	if (p && m >= 0 && m < UNWIND_MAX_MAPPINGS && at < p->maps[m].end)
		um = &p->maps[m];

	__u64 cfa, ra;
	if (!um) {
		/* No table: frame pointers. */
		if (c->bp == 0) {
			c->done = 1;
			return 1;
		}
		__u64 fp[2];
		if (bpf_probe_read_user(fp, sizeof(fp), (void *)c->bp)) {
			c->truncated = 1;
			return 1;
		}
		c->sp = c->bp + 16;
		c->bp = fp[0];
		ra = fp[1];
	} else {
		__u64 rel = at - um->bias;
		if (rel > 0xffffffffULL) {
			c->truncated = 1;
			return 1;
		}
		struct unwind_row *r = find_row(um->table_start, um->table_len, (__u32)rel);
		if (!r) {
			c->truncated = 1;
			return 1;
		}
		switch (r->cfa_type) {
		case CFA_RSP:
			cfa = c->sp + r->cfa_off;
			break;
		case CFA_RBP:
			if (c->bp == 0) {
				c->truncated = 1;
				return 1;
			}
			cfa = c->bp + r->cfa_off;
			break;
		case CFA_PLT:
			cfa = c->sp + 8 + ((c->pc & 15) >= (__u64)r->cfa_off ? 8 : 0);
			break;
		case CFA_END:
			c->done = 1;
			return 1;
		default:
			c->truncated = 1;
			return 1;
		}
		if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8))) {
			c->truncated = 1;
			return 1;
		}
		if (r->rbp_type == RBP_OFFSET) {
			__u64 bp;
			if (bpf_probe_read_user(&bp, sizeof(bp), (void *)(cfa + r->rbp_off))) {
				c->truncated = 1;
				return 1;
			}
			c->bp = bp;
		} else if (r->rbp_type == RBP_LOST) {
			c->bp = 0;
		}
		c->sp = cfa;
	}
	if (ra == 0) {
		c->done = 1;
		return 1;
	}
	c->pc = ra;
	return 0;
}
#endif

/* The user stack of the current task into s->stack[kframes..]: with the
 * unwind tables when the agent gave this process some, else with
 * bpf_get_stack (frame pointers). Returns the number of frames and sets
 * flags in the header. */
static __always_inline __u64 user_stack(void *ctx, struct scratch *s, __u32 tgid, __u64 kframes,
					 __u32 slot)
{
#if defined(__TARGET_ARCH_x86)
	if (bpf_map_lookup_elem(&unwind_procs, &tgid)) {
		struct task_struct *task = bpf_get_current_task_btf();
		struct pt_regs___fathom *regs = (void *)bpf_task_pt_regs(task);
		struct unwind_ctx c = {
			.pc = BPF_CORE_READ(regs, ip),
			.sp = BPF_CORE_READ(regs, sp),
			.bp = BPF_CORE_READ(regs, bp),
			.tgid = tgid,
			.base = (__u32)kframes,
			.slot = slot,
		};
		if (c.pc == 0) {
			count(COUNTER_USTACK_EMPTY);
			return 0;
		}
		bpf_loop(MAX_STACK_DEPTH, unwind_step, &c, 0);
		s->h.flags |= FLAG_USER_TABLES;
		count(COUNTER_USTACK_TABLES);
		if (!c.done) {
			s->h.flags |= FLAG_USER_TRUNCATED;
			count(COUNTER_USTACK_TRUNCATED);
		}
		__u64 n = c.depth;
		return n > MAX_STACK_DEPTH ? MAX_STACK_DEPTH : n;
	}
#endif
	long ubytes = bpf_get_stack(ctx, &s->stack[kframes], MAX_STACK_DEPTH * 8, BPF_F_USER_STACK);
	if (ubytes < 0) {
		count(COUNTER_USTACK_ERR);
		s->h.uerr = (__s16)ubytes;
		ubytes = 0;
	} else if (ubytes == 0) {
		count(COUNTER_USTACK_EMPTY);
	}
	__u64 n = (__u64)ubytes / 8;
	return n > MAX_STACK_DEPTH ? MAX_STACK_DEPTH : n;
}

/* State of a Python frame walk, shared with the bpf_loop callback. */
struct py_ctx {
	struct py_proc *py;
	__u64 frame;
	__u32 base; /* index in scratch.stack of the first Python word */
	__u32 n;    /* frames written */
	__u32 truncated;
	__u32 slot;
};

static long py_step(__u64 i, void *arg)
{
	struct py_ctx *c = arg;
	if (c->frame == 0)
		return 1;
	__u32 slot = c->slot;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &slot);
	if (!s)
		return 1;
	struct py_proc *py = c->py;
	__u64 code = 0, instr = 0, prev = 0;
	__u8 entry = 0;
	if (bpf_probe_read_user(&code, 8, (void *)(c->frame + py->frame_code)) ||
	    bpf_probe_read_user(&instr, 8, (void *)(c->frame + py->frame_prev_instr)) ||
	    bpf_probe_read_user(&entry, 1, (void *)(c->frame + py->frame_is_entry)) ||
	    bpf_probe_read_user(&prev, 8, (void *)(c->frame + py->frame_previous))) {
		c->truncated = 1;
		return 1;
	}
	__u64 idx = (__u64)c->base + 2 * (__u64)c->n;
	if (idx >= 2 * MAX_STACK_DEPTH + 2 * MAX_PY_DEPTH - 1) {
		c->truncated = 1;
		return 1;
	}
	s->stack[idx] = code;
	idx++;
	if (idx >= 2 * MAX_STACK_DEPTH + 2 * MAX_PY_DEPTH)
		return 1;
	s->stack[idx] = (instr & ~1ULL) | (entry ? 1 : 0);
	c->n++;
	c->frame = prev;
	return 0;
}

/* The Python frames of the current thread, if it runs a CPython the agent
 * registered and holds the GIL. Returns the number of frames. */
static __always_inline __u32 python_stack(struct scratch *s, __u32 tgid, __u32 tid, __u32 base,
					  __u32 slot)
{
	struct py_proc *py = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!py)
		return 0;
	__u64 tstate = 0, cframe = 0, frame = 0;
	__u32 native = 0;
	if (bpf_probe_read_user(&tstate, 8, (void *)py->tstate_addr) || tstate == 0)
		return 0;
	if (bpf_probe_read_user(&native, 4, (void *)(tstate + py->tstate_tid)) || native != tid)
		return 0;
	if (bpf_probe_read_user(&cframe, 8, (void *)(tstate + py->tstate_cframe)) || cframe == 0)
		return 0;
	if (bpf_probe_read_user(&frame, 8, (void *)(cframe + py->cframe_current)))
		return 0;
	struct py_ctx c = {.py = py, .frame = frame, .base = base, .slot = slot};
	bpf_loop(MAX_PY_DEPTH, py_step, &c, 0);
	if (c.truncated || c.frame != 0)
		s->h.flags |= FLAG_PY_TRUNCATED;
	return c.n > MAX_PY_DEPTH ? MAX_PY_DEPTH : c.n;
}

/* Fills the scratch record for the current task (header, kernel and user
 * stacks) and sends it. Returns 0 when sent. */
static __always_inline int record(void *ctx, __u32 kind, __u64 value, struct task_struct *task,
				  struct task_struct *leader, __u64 start_time, __u32 lost_counter,
				  int kernel_stack)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 slot = kind == EVENT_SAMPLE ? SLOT_SAMPLE : SLOT_TRACE;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &slot);
	if (!s)
		return -1;

	s->h.kind = kind;
	s->h.pid = tgid;
	s->h.tid = (__u32)id;
	s->h.cpu = bpf_get_smp_processor_id();
	s->h.start_time = start_time;
	s->h.ktime = bpf_ktime_get_ns();
	bpf_get_current_comm(s->h.comm, sizeof(s->h.comm));
	bpf_core_read_str(s->h.pcomm, sizeof(s->h.pcomm), &leader->comm);
	s->h.kerr = 0;
	s->h.uerr = 0;
	s->h.flags = 0;
	s->h.pyframes = 0;
	s->h.value = value;

	long kbytes = kernel_stack ? bpf_get_stack(ctx, s->stack, MAX_STACK_DEPTH * 8, 0) : 0;
	if (kbytes < 0) {
		count(COUNTER_KSTACK_ERR);
		s->h.kerr = (__s16)kbytes;
		kbytes = 0;
	}
	__u64 kframes = (__u64)kbytes / 8;
	if (kframes > MAX_STACK_DEPTH)
		kframes = MAX_STACK_DEPTH;

	__u64 uframes = 0;
	if (!(BPF_CORE_READ(task, flags) & PF_KTHREAD))
		uframes = user_stack(ctx, s, tgid, kframes, slot);
	s->h.kframes = kframes;
	s->h.uframes = uframes;
	__u64 pyframes = 0;
	if (uframes > 0) {
		__u64 base = kframes + uframes;
		if (base > 2 * MAX_STACK_DEPTH)
			base = 2 * MAX_STACK_DEPTH;
		pyframes = python_stack(s, tgid, (__u32)id, (__u32)base, slot);
	}
	s->h.pyframes = pyframes;

	__u64 wake = BPF_RB_NO_WAKEUP;
	__u64 *seen = bpf_map_lookup_elem(&known, &tgid);
	if (!seen || *seen != start_time) {
		bpf_map_update_elem(&known, &tgid, &start_time, BPF_ANY);
		wake = BPF_RB_FORCE_WAKEUP;
	} else if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes) {
		wake = BPF_RB_FORCE_WAKEUP;
	}

	__u64 size = sizeof(struct event_header) + (kframes + uframes + 2 * pyframes) * 8;
	if (size > sizeof(*s))
		return -1; /* cannot happen; bounds the size for the verifier */
	if (bpf_ringbuf_output(&events, s, size, wake)) {
		count(lost_counter);
		return -1;
	}
	return 0;
}

SEC("perf_event")
int on_cpu_sample(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

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
	record(ctx, EVENT_SAMPLE, 0, task, leader, start_time, COUNTER_RINGBUF_FULL, 1);
	return 0;
}

/*
 * Off-CPU time of blocking system calls. `sched_switch` (in the task that
 * leaves the CPU) remembers when a user task blocks inside a system call (not
 * when it is preempted, nor when it waits for a page); when that system call
 * returns (`sys_exit`, in the task again, its user stack where it made the
 * call), if it was away for at least `offcpu_min_ns` it is recorded with its
 * time away as the value. Shorter absences cost a map update, a lookup and a
 * delete; other system calls a lookup.
 */
SEC("tp_btf/sched_switch")
int on_switch_out(__u64 *ctx)
{
	if (offcpu_min_ns == 0)
		return 0;
	/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...) */
	if (ctx[0])
		return 0; /* preempted: still runnable, not blocked */
	struct task_struct *prev = (struct task_struct *)ctx[1];
	int prev_tgid = BPF_CORE_READ(prev, tgid);
	if (prev_tgid == 0 || (__u32)prev_tgid == exclude_tgid ||
	    (BPF_CORE_READ(prev, flags) & PF_KTHREAD))
		return 0;
	struct pt_regs___fathom *regs = (void *)bpf_task_pt_regs(prev);
	long nr = BPF_CORE_READ(regs, orig_ax);
	if (nr < 0)
		return 0; /* not in a system call (a page fault) */
	__u32 prev_tid = BPF_CORE_READ(prev, pid);
	__u64 now = bpf_ktime_get_ns();
	bpf_map_update_elem(&offcpu_since, &prev_tid, &now, BPF_ANY);
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int on_switch_in(void *ctx)
{
	if (offcpu_min_ns == 0)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	__u32 tgid = id >> 32;
	if (tgid == 0)
		return 0;
	__u64 *since = bpf_map_lookup_elem(&offcpu_since, &tid);
	if (!since)
		return 0;
	__u64 away = bpf_ktime_get_ns() - *since;
	bpf_map_delete_elem(&offcpu_since, &tid);
	if (away < offcpu_min_ns)
		return 0;

	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	__u64 start_time = BPF_CORE_READ(leader, start_time);
	__u64 *skipped = bpf_map_lookup_elem(&skip, &tgid);
	if (skipped && *skipped == start_time)
		return 0;
	if (record(ctx, EVENT_OFFCPU, away, task, leader, start_time, COUNTER_OFFCPU_LOST, 0) == 0)
		count(COUNTER_OFFCPU);
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
	/* The old address space's unwind tables no longer apply. */
	bpf_map_delete_elem(&unwind_procs, &tgid);
	bpf_map_delete_elem(&py_procs, &tgid);

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
	h->flags = 0;
	h->pyframes = 0;
	h->value = 0;
	bpf_ringbuf_submit(h, BPF_RB_NO_WAKEUP);
	return 0;
}
