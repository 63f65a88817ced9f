//! Process-wide allocator settings for the agent's memory budget (glibc).
//!
//! glibc's malloc gives each thread that contends for the heap an arena of
//! its own (up to 8 per core), and a freed chunk is reused only by its own
//! arena, so the runtime's worker threads, the sampler thread and the
//! blocking pool each keep their high-water marks. The agent's threads
//! allocate little, so two arenas are plenty; and after each push interval
//! the free pages go back to the kernel.
#![allow(unsafe_code)] // mallopt and malloc_trim: no pointers, no memory handed over.

/// Caps glibc's malloc arenas. Call early, before threads allocate.
pub(crate) fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns free heap pages to the kernel.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory malloc holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}
