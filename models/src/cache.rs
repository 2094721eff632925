//! A static key/value cache: each layer's keys and values preallocated to a maximum length
//! and written in place at the positions of the tokens being decoded (the scatter that
//! writes them runs in the cache's own buffer: its old value is dead once written back).
//!
//! Positions are tensor *data*, never shapes: a decode step writes its keys with a scatter at
//! `positions` and attends over the whole cache with a mask that hides the keys after each
//! query's position. So every decode step records the same program, and a compiled decode
//! step is planned once and replayed for every later token (as transformers' static cache
//! under `torch.compile`). A left-padded batch marks each sequence's padding
//! ([`KvCache::set_padding`]): its positions count from its first real token and no query
//! reads a padding slot.

use kiln::{DType, Device, Result, Tensor};

/// `0..n` (i64, `[n]`) on `device`, computed now: moving data to a device inside a compiled
/// step would split its plan, so what a step indexes by position is made beforehand.
pub(crate) fn positions_on(n: usize, device: Device) -> Result<Tensor> {
    let t = Tensor::from_vec((0..n as i64).collect::<Vec<_>>(), [n]).to(device);
    t.try_realize()?;
    Ok(t)
}

/// Every layer's keys and values, `[batch, kv_heads, max_len, head_dim]` each.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    max_len: usize,
    /// A rotary model's `cos` and `sin` for every position of the cache, `[max_len,
    /// head_dim]`: a step gathers its positions' rows.
    rope: Option<(Tensor, Tensor)>,
    /// `0..max_len` on the cache's device (`[1, max_len]`, i64): made with the cache, since
    /// moving data to a device inside a compiled step would split its plan.
    slots: Tensor,
    /// Left padding: how many slots each sequence's prompt starts after (`[batch]`, i64), so
    /// that its tokens' positions count from its first real token and no query reads its
    /// padding.
    padding: Option<Tensor>,
}

impl KvCache {
    /// A cache of zeros for `layers` layers, computed now (so that a compiled step reads
    /// it as stored data from its first call on).
    ///
    /// # Errors
    /// When the memory cannot be had.
    pub fn new(
        layers: usize,
        [batch, kv_heads, max_len, head_dim]: [usize; 4],
        dtype: DType,
        device: Device,
    ) -> Result<KvCache> {
        let zeros =
            || Tensor::zeros([batch, kv_heads, max_len, head_dim]).to_dtype(dtype).to(device);
        let layers: Vec<(Tensor, Tensor)> = (0..layers).map(|_| (zeros(), zeros())).collect();
        let all: Vec<&Tensor> = layers.iter().flat_map(|(k, v)| [k, v]).collect();
        Tensor::try_realize_all(&all)?;
        let slots = positions_on(max_len, device)?.try_unsqueeze(0)?;
        Ok(KvCache { layers, max_len, rope: None, slots, padding: None })
    }

    /// The cache with a rotary model's tables for its positions (`[max_len, head_dim]`),
    /// computed now.
    ///
    /// # Errors
    /// When computing them fails.
    pub fn with_rope(mut self, cos: Tensor, sin: Tensor) -> Result<KvCache> {
        Tensor::try_realize_all(&[&cos, &sin])?;
        self.rope = Some((cos, sin));
        Ok(self)
    }

    /// Marks sequence `b`'s first `pads[b]` slots as padding (a left-padded batch of prompts):
    /// its tokens' positions count from slot `pads[b]`, and no query reads a padding slot.
    ///
    /// # Errors
    /// When the batch does not match the cache's, or a padding is not shorter than the cache.
    pub fn set_padding(&mut self, pads: &[usize]) -> Result<()> {
        let (batch, device) = match self.layers.first() {
            Some((k, _)) => (k.dims()[0], k.device()),
            None => (pads.len(), Device::Cpu),
        };
        if pads.len() != batch || pads.iter().any(|&p| p >= self.max_len) {
            return Err(kiln::Error::Value {
                op: "KvCache::set_padding",
                detail: format!(
                    "{} paddings {pads:?} for a cache of {batch} sequences of {} slots",
                    pads.len(),
                    self.max_len
                ),
            });
        }
        let pads = Tensor::from_vec(pads.iter().map(|&p| p as i64).collect::<Vec<_>>(), [batch])
            .to(device);
        pads.try_realize()?;
        self.padding = Some(pads);
        Ok(())
    }

    /// The positions of the tokens in the slots `slots` (`[len]`): the slots themselves,
    /// or, with padding, each sequence's slots less its padding (`[batch, len]`, padding
    /// slots at 0).
    ///
    /// # Errors
    /// When `slots` is not a 1-D integer tensor.
    pub fn position_ids(&self, slots: &Tensor) -> Result<Tensor> {
        match &self.padding {
            None => Ok(slots.clone()),
            Some(pads) => Ok((slots.try_unsqueeze(0)? - pads.try_unsqueeze(1)?).clamp_min(0.0)),
        }
    }

    /// The rotary tables' rows at `positions` (from [`KvCache::position_ids`]): `cos` and
    /// `sin`, `[len, head_dim]`, or `[batch, 1, len, head_dim]` with padding.
    ///
    /// # Errors
    /// When the cache has no tables (a model without rotary embeddings made it).
    pub fn rope_at(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let Some((cos, sin)) = &self.rope else {
            return Err(kiln::Error::Value {
                op: "KvCache::rope_at",
                detail: "this cache has no rotary tables; make it with the model's new_cache"
                    .into(),
            });
        };
        let rows = |table: &Tensor| -> Result<Tensor> {
            let rows = kiln::nn::functional::try_embedding(positions, table)?;
            if positions.ndim() == 2 { rows.try_unsqueeze(1) } else { Ok(rows) }
        };
        Ok((rows(cos)?, rows(sin)?))
    }

    /// Layer `layer`'s keys and values, `[batch, kv_heads, max_len, head_dim]` each (what
    /// transformers' `StaticCache` keeps per layer).
    pub fn layer(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        self.layers.get(layer).map(|(k, v)| (k, v))
    }

    /// The longest sequence (prompt and generated tokens) it holds.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Writes `k` and `v` (`[batch, kv_heads, len, head_dim]`, the tokens at `positions`,
    /// an i64 tensor `[len]`) into layer `layer`'s cache; returns the whole cache of the
    /// layer, keys and values, as they are after the write.
    ///
    /// # Errors
    /// As the scatter: a shape that does not fit the cache, a position past `max_len` (an
    /// index error when the values are computed).
    pub fn write(
        &self,
        layer: usize,
        positions: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (keys, values) = &self.layers[layer];
        let dims: Vec<i64> = k.dims().iter().map(|&d| d as i64).collect();
        let index = positions.try_reshape(&[1, 1, dims[2], 1])?.try_expand(&dims)?;
        keys.try_copy_(&keys.try_scatter(2, &index, k)?)?;
        values.try_copy_(&values.try_scatter(2, &index, v)?)?;
        Ok((keys.clone(), values.clone()))
    }

    /// Which cached keys each query in the slots `slots` (`[len]`) may attend to:
    /// `[len, max_len]`, `true` for the keys at or before its slot (causal, aligned to the
    /// absolute slots, so a query of a decode step sees the whole prefix). With padding,
    /// `[batch, 1, len, max_len]`, without each sequence's padding slots; a padding query
    /// reads only itself, so that no row is empty.
    ///
    /// # Errors
    /// When `slots` is not a 1-D integer tensor.
    pub fn mask(&self, slots: &Tensor) -> Result<Tensor> {
        let keys = &self.slots;
        let queries = slots.try_unsqueeze(1)?;
        let causal = keys.le(&queries);
        let Some(pads) = &self.padding else { return Ok(causal) };
        let started = keys.try_unsqueeze(0)?.ge(&pads.try_reshape(&[-1, 1, 1])?);
        let own = keys.eq(&queries);
        causal.try_unsqueeze(0)?.logical_and(&started).logical_or(&own).try_unsqueeze(1)
    }
}
