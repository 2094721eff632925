//! The kernel cache: compiled code keyed by what generated it, bounded, with counters.
//!
//! Every target keeps its compiled kernels in one [`KernelCache`]: the CPU's Cranelift
//! kernels (keyed by the kernel itself: its structural hash picks the bucket and full
//! equality confirms, so two kernels share code exactly when they would generate the same
//! code) and each GPU's NVRTC modules. A cache holds at most [`CacheLimits::kernels`]
//! entries and [`CacheLimits::code_bytes`] bytes of code; past either, the least recently
//! used entries are evicted. An evicted CPU kernel frees its JIT module once the last plan
//! that holds it is dropped: values are `Arc`s, and a kernel's entry point is only reached
//! through its `Arc`, never copied out.
//!
//! The bounds come from `KILN_KERNEL_CACHE` (`N` kernels, or `N,BYTES` with an optional
//! `K`/`M`/`G` suffix; default 4096 kernels and 256 MiB) or [`set_limits`].

use std::hash::Hash;
use std::sync::{LazyLock, Mutex, PoisonError};

use rustc_hash::FxHashMap as HashMap;

/// The bounds of every kernel cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// The most entries a cache holds.
    pub kernels: usize,
    /// The most bytes of code a cache holds: machine code on the CPU, CUDA C source on a GPU.
    pub code_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> CacheLimits {
        CacheLimits { kernels: 4096, code_bytes: 256 << 20 }
    }
}

impl CacheLimits {
    /// The limits `KILN_KERNEL_CACHE` gives (`4096`, or `4096,64M`), or `None` when it does
    /// not parse.
    pub fn parse(text: &str) -> Option<CacheLimits> {
        let mut parts = text.split(',').map(str::trim);
        let kernels = parts.next()?.parse().ok()?;
        let code_bytes = match parts.next() {
            None => CacheLimits::default().code_bytes,
            Some(b) => {
                let (digits, scale) = match b.chars().last()? {
                    'k' | 'K' => (&b[..b.len() - 1], 1 << 10),
                    'm' | 'M' => (&b[..b.len() - 1], 1 << 20),
                    'g' | 'G' => (&b[..b.len() - 1], 1 << 30),
                    _ => (b, 1),
                };
                digits.parse::<usize>().ok()?.checked_mul(scale)?
            }
        };
        parts.next().is_none().then_some(CacheLimits { kernels, code_bytes })
    }
}

static LIMITS: LazyLock<Mutex<CacheLimits>> = LazyLock::new(|| {
    let env = kiln_ir::settings::Setting::KernelCache.text();
    let limits = env.as_deref().map_or(Some(CacheLimits::default()), CacheLimits::parse);
    Mutex::new(limits.unwrap_or_else(|| {
        eprintln!(
            "kiln: KILN_KERNEL_CACHE={:?} is not `N` or `N,BYTES` (e.g. 4096,256M); using the defaults",
            env.unwrap_or_default()
        );
        CacheLimits::default()
    }))
});

/// The bounds in force.
pub fn limits() -> CacheLimits {
    *LIMITS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the bounds of every kernel cache; caches over them evict on their next insert.
pub fn set_limits(limits: CacheLimits) {
    *LIMITS.lock().unwrap_or_else(PoisonError::into_inner) = limits;
}

/// A cache's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found compiled code.
    pub hits: u64,
    /// Lookups that did not (each is followed by a compile).
    pub misses: u64,
    /// Kernels compiled and stored.
    pub compiled: u64,
    /// Entries evicted to stay within the bounds.
    pub evictions: u64,
    /// Kernels that failed to compile (they run on the reference executor).
    pub failures: u64,
    /// Size-generic kernels compiled (counted in `compiled` too): kernels that came back
    /// with other sizes, compiled once more to serve every size.
    pub generic: u64,
    /// Kernels of new sizes that a size-generic kernel served, with no compile.
    pub served: u64,
    /// Entries held now.
    pub kernels: usize,
    /// Bytes of code held now.
    pub code_bytes: usize,
}

/// A cached value with its size and when it was last used.
struct Cached<V> {
    value: V,
    bytes: usize,
    last_used: u64,
}

/// Compiled code by key, least recently used evicted first.
pub struct KernelCache<K, V> {
    entries: HashMap<K, Cached<V>>,
    clock: u64,
    stats: CacheStats,
}

impl<K, V> Default for KernelCache<K, V> {
    fn default() -> Self {
        KernelCache { entries: HashMap::default(), clock: 0, stats: CacheStats::default() }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> KernelCache<K, V> {
    /// The value for `key`, counted as a hit or a miss.
    pub fn get(&mut self, key: &K) -> Option<V> {
        self.clock += 1;
        match self.entries.get_mut(key) {
            Some(e) => {
                e.last_used = self.clock;
                self.stats.hits += 1;
                Some(e.value.clone())
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Whether `key` is cached (not counted).
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// The value for `key`, if cached (not counted).
    pub fn peek(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|e| &e.value)
    }

    /// [`KernelCache::get`] of a value the caller `takes`: one it does not take counts as a
    /// miss and is dropped, so that the next [`KernelCache::insert`] stores its replacement.
    pub fn get_if(&mut self, key: &K, takes: impl FnOnce(&V) -> bool) -> Option<V> {
        if self.entries.get(key).is_some_and(|e| !takes(&e.value)) {
            self.entries.remove(key);
        }
        self.get(key)
    }

    /// Stores `value` (of `bytes` bytes of code) under `key` and returns what the cache
    /// holds for it: the value already there when another thread compiled it first.
    /// Evicts the least recently used entries beyond the bounds.
    pub fn insert(&mut self, key: K, value: V, bytes: usize) -> V {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            e.last_used = self.clock;
            return e.value.clone();
        }
        self.stats.compiled += 1;
        self.stats.code_bytes += bytes;
        self.entries.insert(key, Cached { value: value.clone(), bytes, last_used: self.clock });
        self.evict(limits());
        value
    }

    /// Stores `value`, compiled for other sizes, under `key` as well (no code of its own;
    /// counted in `served`) and returns what the cache holds for `key`.
    pub fn link(&mut self, key: K, value: V) -> V {
        if let Some(e) = self.entries.get(&key) {
            return e.value.clone();
        }
        self.clock += 1;
        self.stats.served += 1;
        self.entries.insert(key, Cached { value: value.clone(), bytes: 0, last_used: self.clock });
        self.evict(limits());
        value
    }

    /// Counts a size-generic compile.
    pub fn note_generic(&mut self) {
        self.stats.generic += 1;
    }

    /// Counts a kernel that failed to compile.
    pub fn note_failure(&mut self) {
        self.stats.failures += 1;
    }

    fn evict(&mut self, limits: CacheLimits) {
        while self.entries.len() > limits.kernels.max(1)
            || (self.stats.code_bytes > limits.code_bytes && self.entries.len() > 1)
        {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
                .expect("the cache is not empty");
            if let Some(e) = self.entries.remove(&oldest) {
                self.stats.code_bytes -= e.bytes;
                self.stats.evictions += 1;
            }
        }
    }

    /// The counters, with the current size.
    pub fn stats(&self) -> CacheStats {
        CacheStats { kernels: self.entries.len(), ..self.stats }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used_by_count_and_bytes() {
        let _guard = LIMIT_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        let before = limits();
        set_limits(CacheLimits { kernels: 2, code_bytes: 100 });
        let mut c: KernelCache<u32, std::sync::Arc<u32>> = KernelCache::default();
        c.insert(1, std::sync::Arc::new(1), 10);
        c.insert(2, std::sync::Arc::new(2), 10);
        assert!(c.get(&1).is_some()); // 2 is now the oldest
        let held = c.get(&2).expect("cached");
        c.get(&1);
        c.insert(3, std::sync::Arc::new(3), 10);
        assert!(!c.contains(&2) && c.contains(&1) && c.contains(&3));
        assert_eq!(*held, 2, "an evicted value lives on while someone holds it");
        c.insert(4, std::sync::Arc::new(4), 95);
        assert_eq!(c.stats().kernels, 1, "over the byte bound only the newest stays");
        let s = c.stats();
        assert_eq!((s.compiled, s.evictions, s.code_bytes), (4, 3, 95));
        assert_eq!((s.hits, s.misses), (3, 0));
        set_limits(before);
    }

    #[test]
    fn limits_parse() {
        assert_eq!(
            CacheLimits::parse("12"),
            Some(CacheLimits { kernels: 12, ..Default::default() })
        );
        assert_eq!(
            CacheLimits::parse("12, 64M"),
            Some(CacheLimits { kernels: 12, code_bytes: 64 << 20 })
        );
        assert_eq!(CacheLimits::parse("x"), None);
        assert_eq!(CacheLimits::parse("1,2,3"), None);
    }

    static LIMIT_LOCK: Mutex<()> = Mutex::new(());
}
