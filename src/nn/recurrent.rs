//! Recurrent layers: `Rnn`, `Lstm` and `Gru`, as PyTorch's `nn.RNN`, `nn.LSTM` and `nn.GRU`:
//! the same gates in the same order, parameters under the same names
//! (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`, `…_reverse` for the
//! backward direction), layers stacked, either direction, sequence-first or batch-first.
//!
//! Each direction of each layer multiplies the whole sequence by `W_ih` at once (one
//! product for every step), then steps through time with one product by `W_hh` and the gate
//! arithmetic, which fuses into one kernel per step; under [`crate::compile()`] the unrolled
//! steps are one plan.

use super::{Module, Parameters, join};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// The cell a recurrent layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    /// `h' = tanh(W_ih x + b_ih + W_hh h + b_hh)` (PyTorch's `nonlinearity="tanh"`).
    RnnTanh,
    /// The same with `relu`.
    RnnRelu,
    /// Input, forget, cell and output gates (PyTorch's order `i, f, g, o`).
    Lstm,
    /// Reset, update and new gates (`r, z, n`; `n = tanh(W_in x + b_in + r·(W_hn h + b_hn))`).
    Gru,
}

impl Cell {
    /// Rows of `W_ih` per hidden unit.
    fn gates(self) -> usize {
        match self {
            Cell::RnnTanh | Cell::RnnRelu => 1,
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Cell::RnnTanh | Cell::RnnRelu => "RNN",
            Cell::Lstm => "LSTM",
            Cell::Gru => "GRU",
        }
    }
}

/// How a recurrent layer is built (PyTorch's constructor arguments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecurrentOptions {
    /// Stacked layers (`num_layers`), each reading the one below's output.
    pub num_layers: usize,
    /// Whether the layers have biases.
    pub bias: bool,
    /// Inputs and outputs `[batch, seq, features]` instead of `[seq, batch, features]`.
    pub batch_first: bool,
    /// A second direction reading the sequence backwards, its outputs beside the first's.
    pub bidirectional: bool,
    /// Dropout on the outputs of every layer but the last, in training mode (PyTorch's
    /// `dropout`; see [`Parameters::eval`]).
    pub dropout: f64,
}

impl Default for RecurrentOptions {
    fn default() -> RecurrentOptions {
        RecurrentOptions {
            num_layers: 1,
            bias: true,
            batch_first: false,
            bidirectional: false,
            dropout: 0.0,
        }
    }
}

/// One direction of one layer's parameters.
#[derive(Clone, Debug)]
struct Weights {
    ih: Tensor,
    hh: Tensor,
    biases: Option<(Tensor, Tensor)>,
}

/// A stack of recurrent layers of one cell kind: what [`Rnn`], [`Lstm`] and [`Gru`] hold.
#[derive(Clone, Debug)]
struct Recurrent {
    cell: Cell,
    input_size: usize,
    hidden_size: usize,
    options: RecurrentOptions,
    /// `[layer * directions + direction]`.
    weights: Vec<Weights>,
    /// Whether dropout between layers is on (training mode, the default).
    training: bool,
}

impl Recurrent {
    /// A stack of `cell` layers, initialized as PyTorch does (`U(-1/√hidden, 1/√hidden)`).
    fn try_new(
        cell: Cell,
        input_size: usize,
        hidden_size: usize,
        options: RecurrentOptions,
    ) -> Result<Recurrent> {
        if !(0.0..=1.0).contains(&options.dropout) {
            return Err(Error::value(
                cell.name(),
                format!("dropout must be in [0, 1], got {}", options.dropout),
            ));
        }
        if options.num_layers == 0 || hidden_size == 0 {
            return Err(Error::value(
                cell.name(),
                format!(
                    "needs at least one layer and hidden units, got num_layers {} and hidden_size {hidden_size}",
                    options.num_layers
                ),
            ));
        }
        let bound = 1.0 / (hidden_size as f64).sqrt();
        let uniform = |shape: &[usize]| -> Result<Tensor> {
            let t = Tensor::try_rand(shape)? * (2.0 * bound) - bound;
            t.try_realize()?;
            Ok(t.requires_grad_(true))
        };
        let (g, dirs) = (cell.gates() * hidden_size, if options.bidirectional { 2 } else { 1 });
        let mut weights = Vec::new();
        for layer in 0..options.num_layers {
            let inputs = if layer == 0 { input_size } else { hidden_size * dirs };
            for _ in 0..dirs {
                weights.push(Weights {
                    ih: uniform(&[g, inputs])?,
                    hh: uniform(&[g, hidden_size])?,
                    biases: match options.bias {
                        true => Some((uniform(&[g])?, uniform(&[g])?)),
                        false => None,
                    },
                });
            }
        }
        Ok(Recurrent { cell, input_size, hidden_size, options, weights, training: true })
    }

    fn directions(&self) -> usize {
        if self.options.bidirectional { 2 } else { 1 }
    }

    /// The outputs, the final hidden states and (an LSTM's) final cell states, from the
    /// initial hidden state and cell state given (zeros for those not given).
    #[track_caller]
    fn try_forward_with(
        &self,
        input: &Tensor,
        state: Option<(&Tensor, Option<&Tensor>)>,
        lengths: Option<&[usize]>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let _at = crate::engine::origin::enter();
        let op = self.cell.name();
        let unbatched = input.ndim() == 2;
        let x = if unbatched { input.try_unsqueeze(1)? } else { input.clone() };
        let x = if self.options.batch_first && !unbatched { x.try_transpose(0, 1)? } else { x };
        if x.ndim() != 3 || x.dims()[2] != self.input_size {
            return Err(Error::shape(
                op,
                format!(
                    "takes input [seq, batch, {0}] ([batch, seq, {0}] batch-first, or [seq, {0}]), got {1}",
                    self.input_size,
                    input.shape()
                ),
            ));
        }
        let (steps, batch, hidden) = (x.dims()[0], x.dims()[1], self.hidden_size);
        let slots = self.options.num_layers * self.directions();
        let initial = |t: Option<&Tensor>, what: &str| -> Result<Vec<Tensor>> {
            let t = match t {
                Some(t) if unbatched => t.try_unsqueeze(1)?,
                Some(t) => t.clone(),
                None => Tensor::zeros([slots, batch, hidden]).to_dtype(x.dtype()).to(x.device()),
            };
            if t.dims() != [slots, batch, hidden] {
                return Err(Error::shape(
                    op,
                    format!("{what} should be [{slots}, {batch}, {hidden}], got {}", t.shape()),
                ));
            }
            (0..slots).map(|i| t.try_select(0, i as i64)).collect()
        };
        let h0 = initial(state.map(|s| s.0), "h0")?;
        let mask = lengths.map(|l| step_mask(op, l, steps, batch, &x)).transpose()?;
        let c0 = match self.cell {
            Cell::Lstm => Some(initial(state.and_then(|s| s.1), "c0")?),
            _ => None,
        };
        let (mut layer_input, mut h_n, mut c_n) = (x, Vec::new(), Vec::new());
        for layer in 0..self.options.num_layers {
            let mut outputs = Vec::new();
            for dir in 0..self.directions() {
                let slot = layer * self.directions() + dir;
                let c = c0.as_ref().map(|c| c[slot].clone());
                let weights = &self.weights[slot];
                let (seq, h, c) = self.run(
                    weights,
                    &layer_input,
                    (h0[slot].clone(), c),
                    mask.as_ref(),
                    dir == 1,
                )?;
                outputs.push(seq);
                h_n.push(h);
                c_n.extend(c);
            }
            layer_input = Tensor::try_cat(&outputs.iter().collect::<Vec<_>>(), 2)?;
            if layer + 1 < self.options.num_layers && self.options.dropout > 0.0 {
                layer_input = super::functional::try_dropout(
                    &layer_input,
                    self.options.dropout,
                    self.training,
                )?;
            }
            debug_assert_eq!(layer_input.dims()[0], steps);
        }
        let mut out = layer_input;
        if unbatched {
            out = out.try_squeeze(1)?;
        } else if self.options.batch_first {
            out = out.try_transpose(0, 1)?;
        }
        let stack = |v: Vec<Tensor>| -> Result<Tensor> {
            let t = Tensor::try_stack(&v.iter().collect::<Vec<_>>(), 0)?;
            if unbatched { t.try_squeeze(1) } else { Ok(t) }
        };
        let c = if c_n.is_empty() { None } else { Some(stack(c_n)?) };
        Ok((out, stack(h_n)?, c))
    }

    /// One direction of one layer over `x` (`[seq, batch, features]`): the outputs `[seq,
    /// batch, hidden]` in sequence order and the final states.
    fn run(
        &self,
        w: &Weights,
        x: &Tensor,
        (mut h, mut c): (Tensor, Option<Tensor>),
        mask: Option<&Tensor>,
        reverse: bool,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let (steps, batch, hid) = (x.dims()[0], x.dims()[1], self.hidden_size);
        // Every step's input product at once: [seq, batch, gates·hidden].
        let mut xi = x.try_matmul(&w.ih.t())?;
        if let Some((b_ih, _)) = &w.biases {
            xi = xi + b_ih;
        }
        let gate = |t: &Tensor, k: usize| t.try_narrow(-1, k * hid, hid);
        let mut outs = vec![None; steps];
        for s in 0..steps {
            let t = if reverse { steps - 1 - s } else { s };
            let xt = xi.try_select(0, t as i64)?;
            let (h_prev, c_prev) = (h.clone(), c.clone());
            let mut hh = h.try_matmul(&w.hh.t())?;
            if let Some((_, b_hh)) = &w.biases {
                hh = hh + b_hh;
            }
            h = match self.cell {
                Cell::RnnTanh => (xt + hh).tanh(),
                Cell::RnnRelu => (xt + hh).relu(),
                Cell::Lstm => {
                    let z = xt + hh;
                    let (i, f) = (gate(&z, 0)?.sigmoid(), gate(&z, 1)?.sigmoid());
                    let (g, o) = (gate(&z, 2)?.tanh(), gate(&z, 3)?.sigmoid());
                    let prev = c.take().expect("an LSTM carries a cell state");
                    let next = f * prev + i * g;
                    let h = o * next.tanh();
                    c = Some(next);
                    h
                }
                Cell::Gru => {
                    let r = (gate(&xt, 0)? + gate(&hh, 0)?).sigmoid();
                    let z = (gate(&xt, 1)? + gate(&hh, 1)?).sigmoid();
                    let n = (gate(&xt, 2)? + r * gate(&hh, 2)?).tanh();
                    (1.0 - &z) * n + z * &h
                }
            };
            let out = match mask {
                // Past its length a sequence keeps its state and outputs zeros.
                Some(mask) => {
                    let m = mask.try_select(0, t as i64)?;
                    let out = Tensor::try_where_(&m, &h, 0.0)?;
                    h = Tensor::try_where_(&m, &h, &h_prev)?;
                    if let (Some(next), Some(prev)) = (&c, &c_prev) {
                        c = Some(Tensor::try_where_(&m, next, prev)?);
                    }
                    out
                }
                None => h.clone(),
            };
            outs[t] = Some(out);
        }
        let outs: Vec<Tensor> = outs.into_iter().flatten().collect();
        let seq = if outs.is_empty() {
            Tensor::zeros([0, batch, hid]).to_dtype(x.dtype()).to(x.device())
        } else {
            Tensor::try_stack(&outs.iter().collect::<Vec<_>>(), 0)?
        };
        Ok((seq, h, c))
    }
}

impl Parameters for Recurrent {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        for (slot, w) in self.weights.iter().enumerate() {
            let suffix = self.suffix(slot);
            f(&join(prefix, &format!("weight_ih_{suffix}")), &w.ih);
            f(&join(prefix, &format!("weight_hh_{suffix}")), &w.hh);
            if let Some((bi, bh)) = &w.biases {
                f(&join(prefix, &format!("bias_ih_{suffix}")), bi);
                f(&join(prefix, &format!("bias_hh_{suffix}")), bh);
            }
        }
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        let suffixes: Vec<String> = (0..self.weights.len()).map(|s| self.suffix(s)).collect();
        for (w, suffix) in self.weights.iter_mut().zip(suffixes) {
            f(&join(prefix, &format!("weight_ih_{suffix}")), &mut w.ih);
            f(&join(prefix, &format!("weight_hh_{suffix}")), &mut w.hh);
            if let Some((bi, bh)) = &mut w.biases {
                f(&join(prefix, &format!("bias_ih_{suffix}")), bi);
                f(&join(prefix, &format!("bias_hh_{suffix}")), bh);
            }
        }
    }
}

impl Recurrent {
    /// `l{layer}` or `l{layer}_reverse`: PyTorch's name suffix of a slot's parameters.
    fn suffix(&self, slot: usize) -> String {
        let (layer, dir) = (slot / self.directions(), slot % self.directions());
        if dir == 1 { format!("l{layer}_reverse") } else { format!("l{layer}") }
    }
}

macro_rules! recurrent_layer {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name(Recurrent);

        impl Module for $name {
            /// Every step's last-layer output, from zero initial states.
            fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
                Ok(self.0.try_forward_with(input, None, None)?.0)
            }
        }

        impl Parameters for $name {
            fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
                self.0.visit(prefix, f);
            }

            fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
                self.0.visit_mut(prefix, f);
            }

            fn set_training(&mut self, training: bool) {
                self.0.training = training;
            }
        }

        impl $name {
            /// The options it was built with.
            pub fn options(&self) -> RecurrentOptions {
                self.0.options
            }
        }
    };
}

recurrent_layer! {
    /// PyTorch's `nn.LSTM`: input, forget, cell and output gates; `c' = f·c + i·g`,
    /// `h' = o·tanh(c')`.
    ///
    /// ```
    /// use kiln::nn::{Lstm, RecurrentOptions};
    /// use kiln::prelude::*;
    /// let options = RecurrentOptions { num_layers: 2, bidirectional: true, ..Default::default() };
    /// let lstm = Lstm::with_options(8, 16, options);
    /// let x = Tensor::randn([5, 3, 8]); // [seq, batch, features]
    /// let (out, (h, c)) = lstm.forward_with(&x, None);
    /// assert_eq!(out.dims(), &[5, 3, 32]); // both directions' outputs
    /// assert_eq!((h.dims(), c.dims()), (&[4, 3, 16][..], &[4, 3, 16][..]));
    /// ```
    Lstm
}

recurrent_layer! {
    /// PyTorch's `nn.GRU`: reset, update and new gates; `h' = (1 - z)·n + z·h`.
    ///
    /// ```
    /// use kiln::nn::Gru;
    /// use kiln::prelude::*;
    /// let gru = Gru::new(4, 6);
    /// let (out, h) = gru.forward_with(&Tensor::randn([7, 2, 4]), None);
    /// assert_eq!((out.dims(), h.dims()), (&[7, 2, 6][..], &[1, 2, 6][..]));
    /// ```
    Gru
}

recurrent_layer! {
    /// PyTorch's `nn.RNN`: `h' = tanh(W_ih x + b_ih + W_hh h + b_hh)`, or `relu`.
    ///
    /// ```
    /// use kiln::nn::Rnn;
    /// use kiln::prelude::*;
    /// let rnn = Rnn::new(4, 6);
    /// let (out, h) = rnn.forward_with(&Tensor::randn([7, 4]), None); // one unbatched sequence
    /// assert_eq!((out.dims(), h.dims()), (&[7, 6][..], &[1, 6][..]));
    /// ```
    Rnn
}

impl Lstm {
    /// One layer, one direction, sequence-first, with biases.
    #[must_use]
    #[track_caller]
    pub fn new(input_size: usize, hidden_size: usize) -> Lstm {
        Lstm::with_options(input_size, hidden_size, RecurrentOptions::default())
    }

    /// With `options`.
    ///
    /// # Panics
    /// For zero layers or a zero hidden size.
    #[must_use]
    #[track_caller]
    pub fn with_options(input_size: usize, hidden_size: usize, options: RecurrentOptions) -> Lstm {
        Lstm(ok(Recurrent::try_new(Cell::Lstm, input_size, hidden_size, options)))
    }

    /// Every step's last-layer output (`[seq, batch, directions·hidden]`, batch-first
    /// `[batch, seq, ..]`, or `[seq, ..]` for a 2-D input, one unbatched sequence) and the
    /// final `(h, c)` of every layer and direction (`[layers·directions, batch, hidden]`),
    /// from `state` (`(h0, c0)`, zeros when `None`).
    ///
    /// # Panics
    /// As [`Lstm::try_forward_with`] fails.
    #[must_use]
    #[track_caller]
    pub fn forward_with(
        &self,
        input: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> (Tensor, (Tensor, Tensor)) {
        ok(self.try_forward_with(input, state))
    }

    /// [`Lstm::forward_with`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the input is not `[seq, batch, input_size]` (or batch-first,
    /// or 2-D) or a state not `[layers·directions, batch, hidden]`.
    #[track_caller]
    pub fn try_forward_with(
        &self,
        input: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        self.try_forward_padded(input, state, None)
    }

    /// [`Lstm::forward_with`] over a batch of sequences padded to one length: sequence `b`
    /// has `lengths[b]` steps (PyTorch's `pack_padded_sequence`, without packing). Past its
    /// length a sequence's state stays as it was and its outputs are zeros, so the final
    /// states are each sequence's own, the backward direction starts at each one's last
    /// step, and the padding gets no gradient.
    ///
    /// ```
    /// use kiln::nn::Lstm;
    /// use kiln::prelude::*;
    /// let lstm = Lstm::new(3, 4);
    /// let x = Tensor::randn([5, 2, 3]); // two sequences, of 5 and 2 steps
    /// let (out, (h, _)) = lstm.forward_padded(&x, None, &[5, 2]);
    /// assert_eq!(out.i((2.., 1)).abs().sum().item::<f32>(), 0.0);
    /// let (_, (alone, _)) = lstm.forward_with(&x.narrow(0, 0, 2).narrow(1, 1, 1), None);
    /// let same = (h.i((.., 1)) - alone.i((.., 0))).abs().max().item::<f32>();
    /// assert!(same < 1e-6);
    /// ```
    ///
    /// # Panics
    /// As [`Lstm::try_forward_padded`] fails.
    #[must_use]
    #[track_caller]
    pub fn forward_padded(
        &self,
        input: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
        lengths: &[usize],
    ) -> (Tensor, (Tensor, Tensor)) {
        ok(self.try_forward_padded(input, state, Some(lengths)))
    }

    /// [`Lstm::forward_padded`] (all steps when `lengths` is `None`), returning an error
    /// instead of panicking.
    ///
    /// # Errors
    /// As [`Lstm::try_forward_with`]; [`Error::Shape`] for lengths that are not one per
    /// sequence, each at most the padded length.
    #[track_caller]
    pub fn try_forward_padded(
        &self,
        input: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
        lengths: Option<&[usize]>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (out, h, c) =
            self.0.try_forward_with(input, state.map(|(h, c)| (h, Some(c))), lengths)?;
        Ok((out, (h, c.expect("an LSTM returns its cell states"))))
    }
}

macro_rules! hidden_only {
    ($name:ident, $cell:expr, $what:literal) => {
        impl $name {
            #[doc = concat!("One ", $what, " layer, one direction, sequence-first, with biases.")]
            #[must_use]
            #[track_caller]
            pub fn new(input_size: usize, hidden_size: usize) -> $name {
                $name::with_options(input_size, hidden_size, RecurrentOptions::default())
            }

            /// With `options`.
            ///
            /// # Panics
            /// For zero layers or a zero hidden size.
            #[must_use]
            #[track_caller]
            pub fn with_options(
                input_size: usize,
                hidden_size: usize,
                options: RecurrentOptions,
            ) -> $name {
                $name(ok(Recurrent::try_new($cell, input_size, hidden_size, options)))
            }

            /// Every step's last-layer output and the final hidden state of every layer
            /// and direction, from `h0` (zeros when `None`); shapes as
            /// [`Lstm::forward_with`]'s.
            ///
            /// # Panics
            #[doc = concat!("As [`", stringify!($name), "::try_forward_with`] fails.")]
            #[must_use]
            #[track_caller]
            pub fn forward_with(&self, input: &Tensor, h0: Option<&Tensor>) -> (Tensor, Tensor) {
                ok(self.try_forward_with(input, h0))
            }

            #[doc = concat!("[`", stringify!($name), "::forward_with`], returning an error instead of panicking.")]
            ///
            /// # Errors
            /// As [`Lstm::try_forward_with`].
            #[track_caller]
            pub fn try_forward_with(
                &self,
                input: &Tensor,
                h0: Option<&Tensor>,
            ) -> Result<(Tensor, Tensor)> {
                self.try_forward_padded(input, h0, None)
            }

            /// Over sequences padded to one length, as [`Lstm::forward_padded`].
            ///
            /// # Panics
            #[doc = concat!("As [`", stringify!($name), "::try_forward_padded`] fails.")]
            #[must_use]
            #[track_caller]
            pub fn forward_padded(
                &self,
                input: &Tensor,
                h0: Option<&Tensor>,
                lengths: &[usize],
            ) -> (Tensor, Tensor) {
                ok(self.try_forward_padded(input, h0, Some(lengths)))
            }

            #[doc = concat!("[`", stringify!($name), "::forward_padded`] (all steps when `lengths` is `None`), returning an error instead of panicking.")]
            ///
            /// # Errors
            /// As [`Lstm::try_forward_padded`].
            #[track_caller]
            pub fn try_forward_padded(
                &self,
                input: &Tensor,
                h0: Option<&Tensor>,
                lengths: Option<&[usize]>,
            ) -> Result<(Tensor, Tensor)> {
                let (out, h, _) = self.0.try_forward_with(input, h0.map(|h| (h, None)), lengths)?;
                Ok((out, h))
            }
        }
    };
}

hidden_only!(Gru, Cell::Gru, "GRU");
hidden_only!(Rnn, Cell::RnnTanh, "tanh RNN");

impl Rnn {
    /// An RNN of `relu` units (PyTorch's `nonlinearity="relu"`) with `options`.
    ///
    /// # Panics
    /// For zero layers or a zero hidden size.
    #[must_use]
    #[track_caller]
    pub fn relu(input_size: usize, hidden_size: usize, options: RecurrentOptions) -> Rnn {
        Rnn(ok(Recurrent::try_new(Cell::RnnRelu, input_size, hidden_size, options)))
    }
}

/// `[steps, batch, 1]` bools: step `t` of sequence `b` is inside its length.
fn step_mask(
    op: &'static str,
    lengths: &[usize],
    steps: usize,
    batch: usize,
    like: &Tensor,
) -> Result<Tensor> {
    if lengths.len() != batch || lengths.iter().any(|&l| l > steps) {
        return Err(Error::shape(
            op,
            format!(
                "takes one length of at most {steps} steps per sequence ({batch}), got {lengths:?}"
            ),
        ));
    }
    let inside: Vec<bool> = (0..steps).flat_map(|t| lengths.iter().map(move |&l| t < l)).collect();
    Tensor::try_from_vec(inside, [steps, batch, 1])?.try_to(like.device())
}
