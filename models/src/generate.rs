//! Text generation: a prompt's prefill, then one decode step per new token over a static
//! [`KvCache`], greedy or sampled.
//!
//! Both steps run through [`kiln::compile()`]: the prefill is one plan, the decode step
//! another, and since a decode step's positions are tensor data (see [`crate::cache`]),
//! every token after the first reuses the decode plan, with no planning and no compiling
//! per token ([`Generation::stats`] shows it). Choosing the next token (temperature,
//! top-k, top-p, repetition penalty) happens on the host over the last position's logits.

use std::time::{Duration, Instant};

use kiln::compile::CompileStats;
use kiln::{Device, Error, Result, Tensor};

use crate::cache::KvCache;

/// A causal language model that can generate: [`crate::gpt2::Gpt2`],
/// [`crate::llama::Llama`].
pub trait CausalLm {
    /// Logits `[batch, len, vocab]` for token ids `[batch, len]`, without a cache.
    ///
    /// # Errors
    /// As the model's `forward`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor>;
    /// A cache for `batch` sequences of up to `max_len` tokens.
    ///
    /// # Errors
    /// When the memory cannot be had.
    fn new_cache(&self, batch: usize, max_len: usize) -> Result<KvCache>;
    /// Logits for `ids` at `positions`, through `cache`.
    ///
    /// # Errors
    /// As the model's `forward_cached`.
    fn forward_cached(&self, ids: &Tensor, positions: &Tensor, cache: &KvCache) -> Result<Tensor>;
    /// Logits of the last `logits_to_keep` positions (0: all), with or without a cache.
    ///
    /// # Errors
    /// As the model's `forward_with`.
    fn forward_with(
        &self,
        ids: &Tensor,
        cached: Option<(&KvCache, &Tensor)>,
        logits_to_keep: usize,
    ) -> Result<Tensor>;
    /// The device the parameters live on.
    fn device(&self) -> Device;
    /// Tokens in the vocabulary.
    fn vocab_size(&self) -> usize;
}

/// `CausalLm` for a model whose inherent methods of the same names do the work.
macro_rules! causal_lm {
    ($($model:ty),*) => {$(
        impl CausalLm for $model {
            fn forward(&self, ids: &Tensor) -> Result<Tensor> {
                <$model>::forward(self, ids)
            }
            fn new_cache(&self, batch: usize, max_len: usize) -> Result<KvCache> {
                <$model>::new_cache(self, batch, max_len)
            }
            fn forward_cached(&self, ids: &Tensor, positions: &Tensor, cache: &KvCache) -> Result<Tensor> {
                <$model>::forward_cached(self, ids, positions, cache)
            }
            fn forward_with(
                &self,
                ids: &Tensor,
                cached: Option<(&KvCache, &Tensor)>,
                logits_to_keep: usize,
            ) -> Result<Tensor> {
                <$model>::forward_with(self, ids, cached, logits_to_keep)
            }
            fn device(&self) -> Device {
                <$model>::device(self)
            }
            fn vocab_size(&self) -> usize {
                self.config().vocab_size
            }
        }
    )*};
}

causal_lm!(crate::gpt2::Gpt2, crate::llama::Llama);

/// How [`generate`] chooses tokens, as transformers' `generate` arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to generate after the prompt (fewer when every sequence stops).
    pub max_new_tokens: usize,
    /// Greedy decoding when 0 (the default, transformers' `do_sample=False`); otherwise
    /// sampling from `softmax(logits / temperature)`.
    pub temperature: f64,
    /// Sample among the `k` likeliest tokens only.
    pub top_k: Option<usize>,
    /// Sample among the likeliest tokens whose probabilities sum to at least `p`.
    pub top_p: Option<f64>,
    /// Above 1, makes tokens already in the sequence less likely (a positive logit divided
    /// by it, a negative one multiplied), as transformers does.
    pub repetition_penalty: f64,
    /// A sequence ends after generating one of these.
    pub stop_tokens: Vec<i64>,
    /// The seed of the sampler.
    pub seed: u64,
    /// Decode through a key/value cache (the default); without one, every step runs the
    /// whole sequence again.
    pub use_cache: bool,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: 32,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            repetition_penalty: 1.0,
            stop_tokens: Vec::new(),
            seed: 0,
            use_cache: true,
        }
    }
}

/// What [`generate`] made, and how long it took.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens of each prompt (ending with its stop token, when one came).
    pub tokens: Vec<Vec<i64>>,
    /// Tokens in the longest prompt (the others are padded to it).
    pub prompt_len: usize,
    /// The prompt's forward pass, including the choice of the first token.
    pub prefill: Duration,
    /// Every later step.
    pub decode: Duration,
    /// Decode steps run (tokens per sequence after the first).
    pub decode_steps: usize,
    /// The compiled decode step's statistics (plans built, replays); `None` without a
    /// cache.
    pub stats: Option<CompileStats>,
}

impl Generation {
    /// Prompt tokens (over the batch) per second of prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        (self.prompt_len * self.tokens.len()) as f64 / self.prefill.as_secs_f64().max(1e-12)
    }

    /// Generated tokens (over the batch) per second of decoding.
    pub fn decode_tokens_per_second(&self) -> f64 {
        (self.decode_steps * self.tokens.len()) as f64 / self.decode.as_secs_f64().max(1e-12)
    }
}

/// Continues each of `prompts` (token ids) with up to `options.max_new_tokens` tokens;
/// `on_token(sequence, token)` is called with each new token as soon as it is chosen (for
/// streaming). Prompts of different lengths are padded on the left, and each sequence's
/// positions count from its own first token, as transformers does with an attention mask.
///
/// It records no gradients (as transformers' `generate` runs under `torch.no_grad`), so a
/// model whose parameters require them (one being trained) decodes as fast as a loaded one.
///
/// # Errors
/// [`Error::Value`] for no prompts, an empty one, prompts of different lengths without the
/// cache, a token outside the vocabulary, or invalid options; the model's errors.
pub fn generate(
    model: &impl CausalLm,
    prompts: &[Vec<i64>],
    options: &GenerateOptions,
    on_token: impl FnMut(usize, i64),
) -> Result<Generation> {
    kiln::no_grad(|| generate_with_grad_off(model, prompts, options, on_token))
}

fn generate_with_grad_off(
    model: &impl CausalLm,
    prompts: &[Vec<i64>],
    options: &GenerateOptions,
    mut on_token: impl FnMut(usize, i64),
) -> Result<Generation> {
    let len = check(prompts, options, model.vocab_size())?;
    let batch = prompts.len();
    let device = model.device();
    let mut sampler = Sampler::new(options);
    // Shorter prompts are padded on the left (with their own first token; the cache's
    // padding keeps every query off those slots), so that all end at the last position.
    let pads: Vec<usize> = prompts.iter().map(|p| len - p.len()).collect();
    let mut seqs: Vec<Vec<i64>> = prompts
        .iter()
        .zip(&pads)
        .map(|(p, &pad)| std::iter::repeat_n(p[0], pad).chain(p.iter().copied()).collect())
        .collect();
    let mut done = vec![false; batch];
    let mut new: Vec<Vec<i64>> = vec![Vec::new(); batch];
    let ids_of = |tokens: Vec<i64>, t: usize| Tensor::from_vec(tokens, [batch, t]).to(device);
    let positions_of = |start: usize, t: usize| {
        Tensor::from_vec((start..start + t).map(|p| p as i64).collect::<Vec<_>>(), [t]).to(device)
    };
    let cache = if options.use_cache {
        let mut cache = model.new_cache(batch, len + options.max_new_tokens)?;
        if pads.iter().any(|&p| p > 0) {
            cache.set_padding(&pads)?;
        }
        Some(cache)
    } else {
        None
    };
    // The last position's logits, [batch, vocab].
    let last = |logits: Result<Tensor>| -> Result<Tensor> {
        let logits = logits?;
        let t = logits.dims()[1];
        logits.try_narrow(1, t - 1, 1)?.try_squeeze(1)
    };
    // Only the last position's logits are computed (the head on one row per sequence).
    let step = |(ids, positions): (&Tensor, &Tensor)| {
        last(model.forward_with(ids, cache.as_ref().map(|c| (c, positions)), 1))
    };
    let (mut prefill_step, mut decode_step) = (kiln::compile(step), kiln::compile(step));
    let started = Instant::now();
    let mut prefill = Duration::ZERO;
    let mut decode_steps = 0;
    for step in 0..options.max_new_tokens {
        let logits = if step == 0 {
            let ids = ids_of(seqs.concat(), len);
            prefill_step.try_call((&ids, &positions_of(0, len)))??
        } else if cache.is_some() {
            decode_steps += 1;
            let ids = ids_of(seqs.iter().map(|s| s[s.len() - 1]).collect(), 1);
            decode_step.try_call((&ids, &positions_of(len + step - 1, 1)))??
        } else {
            decode_steps += 1;
            let t = len + step;
            // Without a cache every length is another program: eager, not compiled.
            last(model.forward_with(&ids_of(seqs.concat(), t), None, 1))?
        };
        // f32 logits are read as they are (a cast would be one more realization per token).
        let rows: Vec<f64> = match logits.dtype() {
            kiln::DType::F32 => logits.try_to_vec::<f32>()?.into_iter().map(f64::from).collect(),
            _ => logits.to_dtype(kiln::DType::F64).try_to_vec::<f64>()?,
        };
        let vocab = rows.len() / batch;
        for (i, row) in rows.chunks(vocab).enumerate() {
            let token =
                if done[i] { seqs[i][seqs[i].len() - 1] } else { sampler.next(row, &seqs[i]) };
            seqs[i].push(token);
            if !done[i] {
                new[i].push(token);
                on_token(i, token);
                done[i] = options.stop_tokens.contains(&token);
            }
        }
        if step == 0 {
            prefill = started.elapsed();
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    Ok(Generation {
        tokens: new,
        prompt_len: len,
        prefill,
        decode: started.elapsed().saturating_sub(prefill),
        decode_steps,
        stats: cache.is_some().then(|| decode_step.stats().clone()),
    })
}

/// The prompts' common length, after checking them and the options.
fn check(prompts: &[Vec<i64>], options: &GenerateOptions, vocab: usize) -> Result<usize> {
    let value = |detail: String| Error::Value { op: "generate", detail };
    let Some(len) = prompts.iter().map(Vec::len).max() else {
        return Err(value("no prompts: pass at least one sequence of token ids".into()));
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(value(
            "an empty prompt: start it with at least one token (a BOS token)".into(),
        ));
    }
    if !options.use_cache
        && let Some(other) = prompts.iter().find(|p| p.len() != len)
    {
        return Err(value(format!(
            "prompts of {len} and {} tokens without the cache: a left-padded batch needs it (use_cache: true)",
            other.len()
        )));
    }
    for (i, prompt) in prompts.iter().enumerate() {
        if let Some(t) = prompt.iter().find(|&&t| usize::try_from(t).map_or(true, |t| t >= vocab)) {
            return Err(value(format!(
                "prompt {i} holds token {t}, outside the vocabulary of {vocab}"
            )));
        }
    }
    if !(options.temperature >= 0.0 && options.temperature.is_finite()) {
        return Err(value(format!(
            "temperature {} must be 0 (greedy) or positive",
            options.temperature
        )));
    }
    if options.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) || options.top_k == Some(0) {
        return Err(value(format!(
            "top_p must lie in (0, 1] and top_k be at least 1, got {:?} and {:?}",
            options.top_p, options.top_k
        )));
    }
    if options.repetition_penalty.is_nan() || options.repetition_penalty <= 0.0 {
        return Err(value(format!(
            "repetition_penalty {} must be positive",
            options.repetition_penalty
        )));
    }
    Ok(len)
}

/// Picks each next token from a row of logits.
struct Sampler<'a> {
    options: &'a GenerateOptions,
    state: u64,
}

impl<'a> Sampler<'a> {
    fn new(options: &'a GenerateOptions) -> Sampler<'a> {
        Sampler { options, state: options.seed ^ 0x9e37_79b9_7f4a_7c15 }
    }

    /// A uniform draw in `[0, 1)` (splitmix64).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn next(&mut self, row: &[f64], seen: &[i64]) -> i64 {
        let mut logits = row.to_vec();
        let penalty = self.options.repetition_penalty;
        if penalty != 1.0 {
            for &t in seen {
                if let Some(l) = usize::try_from(t).ok().and_then(|t| logits.get_mut(t)) {
                    *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
                }
            }
        }
        if self.options.temperature == 0.0 {
            // The first of the largest, as torch.argmax.
            let best =
                logits.iter().enumerate().fold(0, |b, (i, &l)| if l > logits[b] { i } else { b });
            return best as i64;
        }
        // Candidates, likeliest first; probabilities of logits / temperature.
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        order.truncate(self.options.top_k.unwrap_or(order.len()));
        let top = logits[order[0]];
        let mut probs: Vec<f64> =
            order.iter().map(|&i| ((logits[i] - top) / self.options.temperature).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if let Some(p) = self.options.top_p {
            let (mut sum, mut keep) = (0.0, 0);
            while keep < probs.len() && (keep == 0 || sum < p) {
                sum += probs[keep];
                keep += 1;
            }
            order.truncate(keep);
            probs.truncate(keep);
        }
        let mut u = self.uniform() * probs.iter().sum::<f64>();
        for (&i, &p) in order.iter().zip(&probs) {
            if u < p {
                return i as i64;
            }
            u -= p;
        }
        order[order.len() - 1] as i64
    }
}
