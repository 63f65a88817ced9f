/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The few kernel-internal fields the profiler reads, declared for CO-RE.
 *
 * `preserve_access_index` makes clang emit BTF relocations for every access,
 * and the loader (aya) rewrites the offsets against the running kernel's BTF
 * (/sys/kernel/btf/vmlinux). Only the fields used are declared: CO-RE matches
 * by type and field name, so this subset works on any kernel that has them,
 * without a full vmlinux.h generated for one kernel.
 */
#ifndef FATHOM_VMLINUX_MIN_H
#define FATHOM_VMLINUX_MIN_H

struct task_struct {
	unsigned int flags;
	int pid;
	int tgid;
	struct task_struct *group_leader;
	__u64 start_time;
	char comm[16];
} __attribute__((preserve_access_index));

/* The registers a task saved on kernel entry (arch/x86/include/asm/ptrace.h);
 * the `___fathom` suffix keeps it apart from the UAPI struct pt_regs, CO-RE
 * ignores it when matching. */
struct pt_regs___fathom {
	unsigned long bp;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

/* include/linux/sched.h */
#define PF_KTHREAD 0x00200000

#endif
