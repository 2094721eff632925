//! Ranks that are threads of one process.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kiln_ir::{CollectiveKind, CollectiveReduce, DType, Element};

use super::{Communicator, as_bytes, from_bytes};

/// Ranks that are threads of this process: every collective meets at a barrier, where each
/// rank reads the others' contributions from shared memory. For tests, and for trying a
/// distributed program on one machine without an MPI installation. A rank that waits
/// longer than [`LocalGroup::TIMEOUT`] for the others fails its collective (a rank whose
/// thread panicked never arrives), and the group is unusable afterwards.
pub struct LocalGroup {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    world: usize,
    barrier: Meeting,
    slots: Mutex<Vec<Vec<u8>>>,
}

/// A reusable barrier whose wait gives up after a while.
struct Meeting {
    state: Mutex<(usize, u64)>,
    all_here: Condvar,
    world: usize,
}

impl Meeting {
    fn wait(&self) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let generation = state.1;
        state.0 += 1;
        if state.0 == self.world {
            *state = (0, generation + 1);
            self.all_here.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + LocalGroup::TIMEOUT;
        while state.1 == generation {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "waited {} s for the other ranks of the group; a rank stopped or is running \
                     different collectives",
                    LocalGroup::TIMEOUT.as_secs()
                ));
            }
            state =
                self.all_here.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        Ok(())
    }
}

impl LocalGroup {
    /// How long a rank waits for the others at a collective.
    pub const TIMEOUT: Duration = Duration::from_secs(120);

    /// The `world` ranks of a new group, rank `r` at index `r`: hand each to its own thread.
    pub fn new(world: usize) -> Vec<LocalGroup> {
        let world = world.max(1);
        let shared = Arc::new(Shared {
            world,
            barrier: Meeting { state: Mutex::new((0, 0)), all_here: Condvar::new(), world },
            slots: Mutex::new(vec![Vec::new(); world]),
        });
        (0..world).map(|rank| LocalGroup { rank, shared: shared.clone() }).collect()
    }

    /// Every rank's contribution, once all have arrived.
    fn exchange(&self, input: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        self.shared.slots.lock().unwrap_or_else(PoisonError::into_inner)[self.rank] =
            input.to_vec();
        self.shared.barrier.wait()?;
        let all = self.shared.slots.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // No rank may write the next collective's slot before every rank has read this one.
        self.shared.barrier.wait()?;
        Ok(all)
    }
}

impl Communicator for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn engine(&self) -> &'static str {
        "local"
    }

    fn run(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(), String> {
        let all = self.exchange(input)?;
        let bytes: Vec<u8> = match kind {
            CollectiveKind::Broadcast { root } => all[root as usize].clone(),
            CollectiveKind::AllGather => all.concat(),
            CollectiveKind::AllReduce(r) => reduce_bytes(dtype, r, &all)?,
            CollectiveKind::ReduceScatter(r) => {
                // Rank r's part of the reduction: the r-th run of `output.len()` bytes.
                let start = output.len() * self.rank;
                reduce_bytes(dtype, r, &all)?[start..start + output.len()].to_vec()
            }
        };
        if bytes.len() != output.len() {
            return Err(format!(
                "ranks sent different sizes: expected {} bytes, got {}",
                output.len(),
                bytes.len()
            ));
        }
        output.copy_from_slice(&bytes);
        Ok(())
    }

    fn barrier(&self) -> Result<(), String> {
        self.shared.barrier.wait()
    }
}

/// The elementwise reduction of the ranks' byte arrays of `dtype`, rank order.
fn reduce_bytes(dtype: DType, r: CollectiveReduce, all: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    if all.iter().any(|a| a.len() != all[0].len()) {
        return Err("ranks sent tensors of different sizes".into());
    }
    fn fold<T: Wire>(r: CollectiveReduce, all: &[Vec<u8>]) -> Vec<u8> {
        let mut acc = from_bytes::<T>(&all[0]);
        for other in &all[1..] {
            for (a, b) in acc.iter_mut().zip(from_bytes::<T>(other)) {
                *a = match r {
                    CollectiveReduce::Sum | CollectiveReduce::Mean => a.plus(b),
                    CollectiveReduce::Product => a.times(b),
                    CollectiveReduce::Max => {
                        if b > *a || b.is_nan() {
                            b
                        } else {
                            *a
                        }
                    }
                    CollectiveReduce::Min => {
                        if b < *a || b.is_nan() {
                            b
                        } else {
                            *a
                        }
                    }
                };
            }
        }
        as_bytes(&acc).to_vec()
    }
    Ok(match dtype {
        DType::F32 => fold::<f32>(r, all),
        DType::F64 => fold::<f64>(r, all),
        DType::I32 => fold::<i32>(r, all),
        DType::I64 => fold::<i64>(r, all),
        DType::I8 => fold::<i8>(r, all),
        DType::U8 => fold::<u8>(r, all),
        other => return Err(format!("no engine type for {other}")),
    })
}

/// The arithmetic of the engines' element types: integers wrap, as everywhere in kiln.
trait Wire: Element + PartialOrd {
    fn plus(self, other: Self) -> Self;
    fn times(self, other: Self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! wire_float {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn plus(self, other: $t) -> $t { self + other }
            fn times(self, other: $t) -> $t { self * other }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
    )*};
}
macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn plus(self, other: $t) -> $t { self.wrapping_add(other) }
            fn times(self, other: $t) -> $t { self.wrapping_mul(other) }
            fn is_nan(self) -> bool { false }
        }
    )*};
}
wire_float!(f32, f64);
wire_int!(i32, i64, i8, u8);
