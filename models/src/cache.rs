//! A static key/value cache: each layer's keys and values preallocated to a maximum length
//! and written in place at the positions of the tokens being decoded.
//!
//! Positions are tensor *data*, never shapes: a decode step writes its keys with a scatter at
//! `positions` and attends over the whole cache with a mask that hides the keys after each
//! query's position. So every decode step records the same program, and a compiled decode
//! step is planned once and replayed for every later token (as transformers' static cache
//! under `torch.compile`).

use kiln::{DType, Device, Result, Tensor};

/// Every layer's keys and values, `[batch, kv_heads, max_len, head_dim]` each.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    max_len: usize,
    /// A rotary model's `cos` and `sin` for every position of the cache, `[max_len,
    /// head_dim]`: a step gathers its positions' rows.
    rope: Option<(Tensor, Tensor)>,
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
        Ok(KvCache { layers, max_len, rope: None })
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

    /// The rotary tables' rows at `positions`: `cos` and `sin`, `[len, head_dim]`.
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
        Ok((
            kiln::nn::functional::try_embedding(positions, cos)?,
            kiln::nn::functional::try_embedding(positions, sin)?,
        ))
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

    /// Which cached keys each query at `positions` (`[len]`) may attend to: `[len, max_len]`,
    /// `true` for the keys at or before its position (causal, aligned to the absolute
    /// positions, so a query of a decode step sees the whole prefix).
    ///
    /// # Errors
    /// When `positions` is not a 1-D integer tensor.
    pub fn mask(&self, positions: &Tensor) -> Result<Tensor> {
        let keys = Tensor::arange(0i64, self.max_len as i64, 1).to(positions.device());
        Ok(keys.try_unsqueeze(0)?.le(&positions.try_unsqueeze(1)?))
    }
}
