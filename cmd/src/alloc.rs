//! The process allocator, chosen per role.
//!
//! The server roles use mimalloc: ingest allocates and frees many small
//! and medium objects per request, and glibc's malloc spent about a third
//! of the ingest benchmark's CPU in `malloc`, `free` and consolidation
//! (docs/benchmarks.md). The agent keeps glibc's malloc: with mimalloc its
//! peak RSS in the overhead benchmark doubled (107 MB against 58 MB), and
//! its memory budget is tuned for glibc (`crates/agent/src/mem.rs`).
//!
//! mimalloc keeps the memory it frees: purging it (returning it to the
//! OS a second after it falls free, mimalloc v3's default) made requests
//! fault in, and the kernel zero, pages that decode buffers and symbol
//! tables had given back; without purging, single-process ingest ran
//! 15-25 % faster with no higher head RSS (docs/benchmarks.md). Memory
//! freed by a head cut is then reused by the next head instead of being
//! returned. `MIMALLOC_PURGE_DELAY` in the environment still wins.
//!
//! The server roles also run without transparent huge pages
//! (`PR_SET_THP_DISABLE`, what mimalloc's `allow_thp=0` does at its
//! start): with them, a growing head (and the decode buffers around it)
//! faulted its memory in 2 MiB at a time, each zeroed whole by the
//! kernel, and the kernel's page zeroing was 31 % of a cluster
//! ingester's CPU. Without them a three-ingester cluster ingested 22 %
//! more and one process's head held 14 % less RSS per ingested byte
//! (docs/benchmarks.md, "Issue 13, tenth session"). `MIMALLOC_ALLOW_THP`
//! in the environment (any value) leaves the process as it is.
//!
//! Everything starts on glibc; [`use_mimalloc`] switches new allocations
//! to mimalloc. A block is always freed or grown by the allocator that
//! made it: mimalloc answers whether a pointer lies in its heap
//! (`mi_is_in_heap_region`, a page-map lookup), so blocks allocated
//! before the switch go back to glibc.

#![allow(unsafe_code)] // a GlobalAlloc implementation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

use mimalloc::MiMalloc;

static MIMALLOC: AtomicBool = AtomicBool::new(false);

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (v2 and v3 alike;
/// `libmimalloc-sys` names only some options).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sends every later allocation to mimalloc, which then keeps the memory
/// it frees (see the module docs) unless the environment sets
/// `MIMALLOC_PURGE_DELAY`.
pub(crate) fn use_mimalloc() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one option of a running allocator, which mimalloc
        // allows at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: a prctl that sets one flag of this process; no memory
        // is passed. A kernel without it answers EINVAL, and the process
        // keeps transparent huge pages: nothing else depends on it.
        let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if r != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "could not turn transparent huge pages off"
            );
        }
    }
    MIMALLOC.store(true, Ordering::Relaxed);
}

/// Whether transparent huge pages are off for this process.
#[cfg(test)]
fn thp_disabled() -> bool {
    // SAFETY: reads one flag of this process.
    unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1 }
}

/// mimalloc's purge delay (milliseconds; -1: never).
#[cfg(test)]
fn purge_delay() -> std::os::raw::c_long {
    // SAFETY: reads one option.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
}

/// glibc's malloc until [`use_mimalloc`], mimalloc after.
pub(crate) struct RoleAllocator;

fn is_mimalloc(p: *mut u8) -> bool {
    // SAFETY: a read-only lookup in mimalloc's page map, valid for any
    // address (NULL or foreign pointers answer false), also before
    // mimalloc has allocated anything.
    unsafe { libmimalloc_sys::mi_is_in_heap_region(p.cast()) }
}

/// Whether `p` must go back to mimalloc. Until the switch nothing came
/// from it, so the agent (which never switches) skips the lookup.
fn owned_by_mimalloc(p: *mut u8) -> bool {
    MIMALLOC.load(Ordering::Relaxed) && is_mimalloc(p)
}

// SAFETY: each method forwards to an allocator that upholds the
// GlobalAlloc contract, and a block is only ever freed or reallocated by
// the allocator that returned it (decided by `is_mimalloc`).
unsafe impl GlobalAlloc for RoleAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if MIMALLOC.load(Ordering::Relaxed) {
            // SAFETY: the caller's layout contract, passed on.
            unsafe { MiMalloc.alloc(layout) }
        } else {
            // SAFETY: as above.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if MIMALLOC.load(Ordering::Relaxed) {
            // SAFETY: the caller's layout contract, passed on.
            unsafe { MiMalloc.alloc_zeroed(layout) }
        } else {
            // SAFETY: as above.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if owned_by_mimalloc(ptr) {
            // SAFETY: `ptr` came from mimalloc with this layout.
            unsafe { MiMalloc.dealloc(ptr, layout) }
        } else {
            // SAFETY: `ptr` came from glibc's malloc with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if owned_by_mimalloc(ptr) {
            // SAFETY: `ptr` came from mimalloc with this layout.
            unsafe { MiMalloc.realloc(ptr, layout, new_size) }
        } else {
            // SAFETY: `ptr` came from glibc's malloc with this layout.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_go_back_to_the_allocator_that_made_them() {
        // The only test in this binary that switches, as `main` does.
        let layout = Layout::from_size_align(100, 8).unwrap();
        let big = Layout::from_size_align(10_000, 8).unwrap();
        // SAFETY: non-zero layouts; each block is freed once, with the
        // layout it has.
        unsafe {
            let before = RoleAllocator.alloc(layout);
            assert!(!is_mimalloc(before), "glibc until the switch");
            assert!(!is_mimalloc(std::ptr::null_mut()));
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                // The option's default in mimalloc v3 (src/options.c): the
                // index names it.
                assert_eq!(purge_delay(), 1000, "mimalloc's default purge delay");
            }
            use_mimalloc();
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(purge_delay(), -1, "no purging after the switch");
            }
            if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
                assert!(thp_disabled(), "no transparent huge pages after the switch");
            }
            let after = RoleAllocator.alloc(layout);
            assert!(is_mimalloc(after), "mimalloc after the switch");
            // Grown and freed, each by the allocator that made it.
            let before = RoleAllocator.realloc(before, layout, big.size());
            let after = RoleAllocator.realloc(after, layout, big.size());
            assert!(!is_mimalloc(before));
            assert!(is_mimalloc(after));
            RoleAllocator.dealloc(before, big);
            RoleAllocator.dealloc(after, big);
        }
    }
}
