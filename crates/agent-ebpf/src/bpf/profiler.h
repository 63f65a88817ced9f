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
/* Deepest Python stack recorded (interpreter frames). */
#define MAX_PY_DEPTH 64

enum event_kind {
	/* A CPU-clock sample: the header plus kernel then user frames. */
	EVENT_SAMPLE = 1,
	/* A process called execve: its address space is new. Header only. */
	EVENT_EXEC = 2,
	/* A task came back on a CPU after being off it for at least the
	 * off-CPU threshold: `value` holds the time off CPU in ns, the stacks are
	 * where it blocked. */
	EVENT_OFFCPU = 3,
};

/* event_header.flags */
enum event_flags {
	/* The user stack was walked with unwind tables (.eh_frame). */
	FLAG_USER_TABLES = 1,
	/* The user stack could not be walked to its end: what is recorded is
	 * correct but the outermost frames are missing. */
	FLAG_USER_TRUNCATED = 2,
	/* The Python stack was cut at MAX_PY_DEPTH or by an unreadable frame. */
	FLAG_PY_TRUNCATED = 4,
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
	__u32 flags;      /* enum event_flags */
	__u32 pyframes;   /* Python frames after the user frames: two words each,
			   * the code object and the last instruction (bit 0: the
			   * frame is an entry frame of _PyEval_EvalFrameDefault) */
	__u64 value;      /* EVENT_OFFCPU: ns off CPU; otherwise 0 */
};

/*
 * Unwind tables (x86_64). The agent turns each binary's CFI (.eh_frame,
 * .debug_frame) into rows sorted by address, one row per address range with
 * the same rule, and writes them into the `unwind_rows` array; every binary
 * owns a contiguous slice of it. `unwind_procs` gives, per process, the
 * executable mappings that have a table.
 */
enum cfa_type {
	CFA_NONE = 0,        /* no CFI covers this address: the stack ends here, truncated */
	CFA_RSP = 1,         /* CFA = rsp + cfa_off */
	CFA_RBP = 2,         /* CFA = rbp + cfa_off */
	CFA_PLT = 3,         /* PLT entry: CFA = rsp + 8, + 8 more when (rip & 15) >= cfa_off */
	CFA_END = 4,         /* return address undefined: the outermost frame */
	CFA_UNSUPPORTED = 5, /* a rule the unwinder cannot follow */
};

enum rbp_type {
	RBP_SAME = 0,   /* rbp keeps its value in the caller */
	RBP_OFFSET = 1, /* the caller's rbp is saved at CFA + rbp_off */
	RBP_LOST = 2,   /* the caller's rbp cannot be recovered */
};

struct unwind_row {
	__u32 pc;       /* first address (ELF virtual address) the row covers */
	__s16 cfa_off;
	__s16 rbp_off;
	__u8 cfa_type;  /* enum cfa_type */
	__u8 rbp_type;  /* enum rbp_type */
	__u16 reserved;
};

/*
 * CPython: for a process running an interpreter the agent knows, where the
 * thread state holding the GIL is and the offsets of the fields walked
 * (they differ between versions; the agent fills them in).
 */
struct py_proc {
	__u64 tstate_addr;      /* &_PyRuntime.gilstate.tstate_current */
	__u32 tstate_tid;       /* PyThreadState.native_thread_id */
	__u32 tstate_cframe;    /* PyThreadState.cframe */
	__u32 cframe_current;   /* _PyCFrame.current_frame */
	__u32 frame_code;       /* _PyInterpreterFrame.f_code */
	__u32 frame_previous;   /* _PyInterpreterFrame.previous */
	__u32 frame_prev_instr; /* _PyInterpreterFrame.prev_instr */
	__u32 frame_is_entry;   /* _PyInterpreterFrame.is_entry (a byte) */
	__u32 reserved;
};

#define UNWIND_MAX_MAPPINGS 256

struct unwind_mapping {
	__u64 start;       /* mapped address range [start, end) */
	__u64 end;
	__u64 bias;        /* address - bias = the ELF virtual address of the table */
	__u32 table_start; /* first row in `unwind_rows` */
	__u32 table_len;   /* rows */
};

struct unwind_proc {
	__u32 len; /* mappings used, sorted by start */
	__u32 reserved;
	struct unwind_mapping maps[UNWIND_MAX_MAPPINGS];
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
	/* user stacks walked with unwind tables */
	COUNTER_USTACK_TABLES = 8,
	/* user stacks (either method) that could not be walked to their end */
	COUNTER_USTACK_TRUNCATED = 9,
	/* off-CPU events recorded */
	COUNTER_OFFCPU = 10,
	/* off-CPU events lost because the ring buffer was full */
	COUNTER_OFFCPU_LOST = 11,
	COUNTER_MAX = 12,
};

#endif
