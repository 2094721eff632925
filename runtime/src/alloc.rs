//! The CPU allocator: 64-byte aligned blocks, cached by size class for reuse.
//!
//! Fresh large allocations are expensive on Linux: every page of a new 64 MiB block faults
//! in on first touch (about 18 ms on the machines kiln is measured on), which costs more than
//! an elementwise kernel over the same data. So freed blocks go back to a per-size-class
//! free list and the next allocation of that class reuses them, as PyTorch's CUDA caching
//! allocator and tinygrad's `LRUAllocator` do. When an allocation fails, the cache is
//! released and the allocation retried once before reporting out-of-memory.

use std::alloc::{Layout, alloc, dealloc};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// Alignment of every block: a cache line, and enough for any vector load.
pub const ALIGN: usize = 64;

/// Most bytes kept in free lists; frees beyond this return memory to the system.
const CACHE_LIMIT: usize = 2 << 30;

/// Counters of the CPU allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes in blocks handed out and not yet freed.
    pub allocated: usize,
    /// Bytes held in free lists for reuse.
    pub cached: usize,
    /// Allocations served from a free list.
    pub reused: u64,
    /// Allocations that went to the system.
    pub fresh: u64,
}

struct State {
    free: BTreeMap<usize, Vec<Block>>,
    stats: AllocStats,
}

/// A raw aligned block. Only the allocator creates and destroys them.
struct Block(NonNull<u8>);

// SAFETY: a block is plain memory owned by exactly one holder at a time (a free list or a
// buffer); nothing about it is tied to a thread.
unsafe impl Send for Block {}

static STATE: LazyLock<Mutex<State>> =
    LazyLock::new(|| Mutex::new(State { free: BTreeMap::new(), stats: AllocStats::default() }));

fn state() -> MutexGuard<'static, State> {
    // A panic while holding the lock cannot leave the free lists inconsistent (every update
    // is a single push or pop), so a poisoned lock is still usable.
    STATE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The size class of a request: a multiple of 64 bytes up to 4 KiB, then steps of a quarter
/// of the enclosing power of two (at most 25% waste), so similar sizes share blocks.
pub fn size_class(bytes: usize) -> usize {
    if bytes <= 4096 {
        return bytes.div_ceil(ALIGN) * ALIGN;
    }
    let step = (1usize << (usize::BITS - 1 - bytes.leading_zeros())) / 4;
    bytes.div_ceil(step) * step
}

/// Allocates a block of at least `bytes` (`bytes > 0`), returning it with its class size,
/// or `None` when the system has no memory for it even after the cache is released.
pub(crate) fn allocate(bytes: usize) -> Option<(NonNull<u8>, usize)> {
    let class = size_class(bytes);
    {
        let mut st = state();
        if let Some(block) = st.free.get_mut(&class).and_then(Vec::pop) {
            st.stats.cached -= class;
            st.stats.allocated += class;
            st.stats.reused += 1;
            return Some((block.0, class));
        }
    }
    let layout = Layout::from_size_align(class, ALIGN).ok()?;
    let ptr = system_alloc(layout).or_else(|| {
        empty_cache();
        system_alloc(layout)
    })?;
    let mut st = state();
    st.stats.allocated += class;
    st.stats.fresh += 1;
    Some((ptr, class))
}

fn system_alloc(layout: Layout) -> Option<NonNull<u8>> {
    // SAFETY: `layout` has a non-zero size (classes are at least 64 bytes).
    NonNull::new(unsafe { alloc(layout) })
}

/// Returns a block of class size `class` obtained from [`allocate`].
pub(crate) fn release(ptr: NonNull<u8>, class: usize) {
    let mut st = state();
    st.stats.allocated -= class;
    if st.stats.cached + class <= CACHE_LIMIT {
        st.stats.cached += class;
        st.free.entry(class).or_default().push(Block(ptr));
    } else {
        drop(st);
        // SAFETY: `ptr` came from `allocate` with exactly this class size and alignment.
        unsafe { dealloc(ptr.as_ptr(), Layout::from_size_align_unchecked(class, ALIGN)) };
    }
}

/// Returns every cached block to the system.
pub fn empty_cache() {
    let free = std::mem::take(&mut state().free);
    let mut released = 0;
    for (class, blocks) in free {
        for b in blocks {
            // SAFETY: every cached block came from `allocate` with this class size.
            unsafe { dealloc(b.0.as_ptr(), Layout::from_size_align_unchecked(class, ALIGN)) };
            released += class;
        }
    }
    state().stats.cached -= released;
}

/// The allocator's counters.
pub fn stats() -> AllocStats {
    state().stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_with_bounded_waste() {
        assert_eq!(size_class(1), 64);
        assert_eq!(size_class(4096), 4096);
        assert_eq!(size_class(4097), 5120);
        for bytes in [5000usize, 1 << 20, (1 << 26) + 3, 123_456_789] {
            let c = size_class(bytes);
            assert!(c >= bytes && (c - bytes) * 4 <= c, "{bytes} -> {c}");
            assert_eq!(c % ALIGN, 0);
        }
    }

    #[test]
    fn freed_blocks_are_reused() {
        let (p, class) = allocate(3 << 20).expect("3 MiB fits");
        assert_eq!(p.as_ptr() as usize % ALIGN, 0);
        release(p, class);
        let before = stats().reused;
        let (q, class2) = allocate(3 << 20).expect("3 MiB fits");
        assert_eq!(class, class2);
        assert!(stats().reused > before);
        release(q, class2);
    }
}
