//! Each rank's share of a dataset, as PyTorch's `DistributedSampler` draws it.

/// Which examples of a dataset one rank visits in an epoch: with `shuffle`, a permutation of
/// the whole dataset drawn from `(seed, epoch)` — the same on every rank — of which rank `r`
/// takes positions `r, r + world, r + 2·world, ...`. Without `drop_last` the permutation is
/// padded with its own first examples to a multiple of `world`, so every rank gets the same
/// number of examples (and runs the same number of steps); with it, the tail is dropped.
///
/// Give it to [`crate::data::DataLoader::sampler`]; the loader's epoch counter reshuffles it
/// every epoch (PyTorch's `set_epoch`, which [`crate::data::DataLoader::set_epoch`] also
/// offers).
///
/// ```
/// use kiln::distributed::DistributedSampler;
/// let rank0 = DistributedSampler::new(0, 2);
/// let rank1 = DistributedSampler::new(1, 2);
/// assert_eq!(rank0.indices(5, 0), vec![0, 2, 4]);
/// assert_eq!(rank1.indices(5, 0), vec![1, 3, 0]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributedSampler {
    rank: usize,
    world: usize,
    seed: Option<u64>,
    drop_last: bool,
}

impl DistributedSampler {
    /// Rank `rank`'s share of `world` ranks, in dataset order (a `world` of 0 counts as 1;
    /// a rank outside the world takes the last rank's share).
    #[must_use]
    pub fn new(rank: usize, world: usize) -> DistributedSampler {
        let world = world.max(1);
        DistributedSampler { rank: rank.min(world - 1), world, seed: None, drop_last: false }
    }

    /// The share of `group`'s rank.
    #[must_use]
    pub fn for_group(group: &super::ProcessGroup) -> DistributedSampler {
        DistributedSampler::new(group.rank(), group.world_size())
    }

    /// Shuffles every epoch, from `seed` (the same on every rank).
    #[must_use]
    pub fn shuffle(mut self, seed: u64) -> DistributedSampler {
        self.seed = Some(seed);
        self
    }

    /// Drops the tail that does not split evenly instead of padding it.
    #[must_use]
    pub fn drop_last(mut self, drop_last: bool) -> DistributedSampler {
        self.drop_last = drop_last;
        self
    }

    /// The number of examples this rank visits per epoch of a dataset of `len`.
    pub fn len(&self, len: usize) -> usize {
        if self.drop_last { len / self.world } else { len.div_ceil(self.world) }
    }

    /// The dataset positions this rank visits in epoch `epoch`, in order.
    pub fn indices(&self, len: usize, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..len).collect();
        if let Some(seed) = self.seed {
            crate::random::shuffle(&mut order, seed, epoch);
        }
        let total = self.len(len) * self.world;
        if order.is_empty() {
            return Vec::new();
        }
        // Pad by repeating the order from its start (several times if the dataset is
        // smaller than the world), or truncate.
        let padded: Vec<usize> = order.iter().copied().cycle().take(total).collect();
        padded.into_iter().skip(self.rank).step_by(self.world).collect()
    }
}
