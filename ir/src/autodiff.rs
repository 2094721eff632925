//! Vector-Jacobian products: the gradient rule of every primitive op, as more ops.
//!
//! The rules are written against [`GradBuilder`], an abstract way of recording ops, so they
//! know nothing of tensors or buffers: the tensor layer implements the builder over lazy
//! tensors, which makes every gradient itself a recorded (and differentiable) program. That
//! is what gives higher-order derivatives for free.
//!
//! Conventions follow PyTorch's `derivatives.yaml` where it makes a choice: `relu` and `abs`
//! have gradient 0 at 0; `maximum`/`minimum` split the gradient evenly on ties; `max`/`min`
//! reductions divide it evenly among the tied extremes; `pow` has no gradient through a zero
//! exponent, and none through the exponent where the base is 0 and the exponent is
//! non-negative.

use crate::{
    BinaryOp, Collective, CollectiveKind, CollectiveReduce, DType, IrError, Op, ReduceOp, Scalar,
    Shape, UnaryOp, View,
};

/// Whether a gather of `x` by `index` along `axis` picks exactly one element of each line:
/// `index` has `x`'s shape with 1 along `axis`. Its gradient is then elementwise
/// ([`Rules::picked_gradient`]) rather than a scatter.
fn picks_one_per_line(x: &Shape, index: &Shape, axis: usize) -> bool {
    x.rank() == index.rank()
        && x.dims()
            .iter()
            .zip(index.dims())
            .enumerate()
            .all(|(d, (&n, &i))| if d == axis { i == 1 } else { i == n })
}

/// Records ops for gradient rules. Implemented by the tensor layer over lazy tensors.
pub trait GradBuilder {
    /// A value: the handle the builder records ops on.
    type Node: Clone;
    /// The builder's error; shape and dtype inference errors convert into it.
    type Error: From<IrError>;

    /// The shape of a value.
    fn shape(&self, n: &Self::Node) -> Shape;
    /// The dtype of a value.
    fn dtype(&self, n: &Self::Node) -> DType;
    /// Records `op` over `inputs`.
    fn op(&mut self, op: Op, inputs: &[Self::Node]) -> Result<Self::Node, Self::Error>;
    /// Records a leaf op (`Full`) of the given shape and dtype.
    fn leaf(&mut self, op: Op, shape: Shape, dtype: DType) -> Result<Self::Node, Self::Error>;
    /// [`GradBuilder::leaf`] where `like` is computed (its device, for builders that place
    /// values): for a leaf that an op other than an elementwise one reads before it meets
    /// `like`, such as a running count. A plain leaf joins values anywhere.
    fn leaf_beside(
        &mut self,
        op: Op,
        shape: Shape,
        dtype: DType,
        like: &Self::Node,
    ) -> Result<Self::Node, Self::Error> {
        let _ = like;
        self.leaf(op, shape, dtype)
    }
}

/// The gradient of each input of `op`, given the op's inputs and the gradient `grad` of its
/// result (same shape and dtype as the result). `None` means the input gets no gradient
/// (indices, masks, integer inputs, ops that are piecewise constant).
///
/// # Errors
/// Whatever the builder reports while recording.
pub fn vjp<B: GradBuilder>(
    b: &mut B,
    op: &Op,
    inputs: &[B::Node],
    grad: &B::Node,
) -> Result<Vec<Option<B::Node>>, B::Error> {
    let g = grad.clone();
    let mut r = Rules { b };
    Ok(match op {
        Op::Input | Op::Full(_) | Op::Random { .. } => Vec::new(),
        // Positions are integers: no gradient (the sorted values get theirs through gather).
        Op::ArgSort { .. } => vec![None],
        // A check passes its first input through; the check itself has no gradient.
        Op::Check(_) => vec![Some(g), None],
        Op::Collective(c) => vec![Some(r.collective(c, g)?)],
        // A user's op differentiates by the user's backward, run above this crate.
        Op::Custom(c) => return Err(c.no_ir_rule().into()),
        Op::Attention { mask, scale } => r.attention(*mask, *scale, inputs, g)?,
        Op::AttentionGrad { .. } => {
            return Err(IrError::InvalidGraph(
                "the fused attention's backward has no gradient of its own: for gradients of \
                 gradients through attention, pass an attn_mask (a float mask of zeros keeps \
                 the scores) so that scaled_dot_product_attention takes its composite path"
                    .into(),
            )
            .into());
        }
        Op::Unary(u) => vec![r.unary(*u, &inputs[0], g)?],
        Op::Binary(bop) => {
            let (x, y) = (&inputs[0], &inputs[1]);
            r.binary(*bop, x, y, g)?
        }
        Op::Where => {
            let (c, a) = (&inputs[0], &inputs[1]);
            let zero = r.full_like(0.0, a)?;
            vec![None, Some(r.select(c, &g, &zero)?), Some(r.select(c, &zero, &g)?)]
        }
        Op::Cast(_) => {
            let from = r.b.dtype(&inputs[0]);
            if from.is_float() { vec![Some(r.b.op(Op::Cast(from), &[g])?)] } else { vec![None] }
        }
        Op::Reduce { op, axes } => vec![r.reduce(*op, axes, &inputs[0], g)?],
        Op::View(view) => {
            let shape = r.b.shape(&inputs[0]);
            let grad = match view_inverse(view, &shape) {
                // Permutes, expands, squeezes and reshapes of whole tensors: a sum over the
                // broadcast dimensions and a view back, both of which fuse.
                Some((axes, back)) => {
                    let summed = if axes.is_empty() {
                        g
                    } else {
                        r.b.op(Op::Reduce { op: ReduceOp::Sum, axes }, &[g])?
                    };
                    r.b.op(Op::View(back), &[summed])?
                }
                None => r.b.op(Op::Unview { view: view.clone(), shape }, &[g])?,
            };
            vec![Some(grad)]
        }
        Op::Unview { view, .. } => vec![Some(r.b.op(Op::View(view.clone()), &[g])?)],
        Op::Assign(view) => {
            let zeros =
                r.b.leaf(Op::Full(Scalar::F64(0.0)), view.shape().clone(), r.b.dtype(&g))?;
            let g_base = r.b.op(Op::Assign(view.clone()), &[g.clone(), zeros])?;
            let g_values = r.b.op(Op::View(view.clone()), &[g])?;
            vec![Some(g_base), Some(g_values)]
        }
        Op::Gather { axis } => {
            let (x, index) = (&inputs[0], &inputs[1]);
            let grad = if picks_one_per_line(&r.b.shape(x), &r.b.shape(index), *axis) {
                r.picked_gradient(*axis, x, index, g)?
            } else {
                let zeros = r.full_like(0.0, x)?;
                r.b.op(Op::Scatter { axis: *axis, accumulate: true }, &[zeros, index.clone(), g])?
            };
            vec![Some(grad), None]
        }
        Op::Scatter { axis, accumulate } => {
            let (index, src) = (&inputs[1], &inputs[2]);
            let g_base = if *accumulate {
                g.clone()
            } else {
                let zeros =
                    r.b.leaf(Op::Full(Scalar::F64(0.0)), r.b.shape(index), r.b.dtype(&g))?;
                r.b.op(
                    Op::Scatter { axis: *axis, accumulate: false },
                    &[g.clone(), index.clone(), zeros],
                )?
            };
            let picked = r.b.op(Op::Gather { axis: *axis }, &[g, index.clone()])?;
            let (src_shape, index_shape) = (r.b.shape(src), r.b.shape(index));
            let g_src = if src_shape == index_shape {
                picked
            } else {
                // Elements of src beyond the index's extent were not scattered: gradient 0.
                let mut view = View::contiguous(src_shape.clone());
                for (d, &n) in index_shape.dims().iter().enumerate() {
                    view = view.narrow(d, 0, n);
                }
                r.b.op(Op::Unview { view, shape: src_shape }, &[picked])?
            };
            vec![Some(g_base), None, Some(g_src)]
        }
        Op::CumSum { axis } => {
            // The gradient of a running sum is the running sum from the other end.
            let flip = View::contiguous(r.b.shape(&g)).flip(*axis);
            let flipped = r.b.op(Op::View(flip.clone()), &[g])?;
            let summed = r.b.op(Op::CumSum { axis: *axis }, &[flipped])?;
            vec![Some(r.b.op(Op::View(flip), &[summed])?)]
        }
        Op::MatMul => {
            let (x, y) = (&inputs[0], &inputs[1]);
            let xt = r.transpose_last(x)?;
            let yt = r.transpose_last(y)?;
            vec![Some(r.b.op(Op::MatMul, &[g.clone(), yt])?), Some(r.b.op(Op::MatMul, &[xt, g])?)]
        }
    })
}

/// Whether `op` passes gradients to any input at all.
pub fn is_differentiable(op: &Op) -> bool {
    match op {
        Op::Input | Op::Full(_) | Op::Random { .. } | Op::ArgSort { .. } => false,
        Op::Attention { .. } | Op::AttentionGrad { .. } | Op::Collective(_) | Op::Check(_) => true,
        Op::Custom(c) => c.differentiable,
        Op::Unary(u) => {
            !matches!(u, UnaryOp::Not | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round)
        }
        Op::Binary(b) => {
            !b.is_comparison() && !b.is_bitwise() && !matches!(b, BinaryOp::And | BinaryOp::Or)
        }
        Op::Reduce { op, .. } => !matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin),
        Op::Cast(to) => to.is_float(),
        Op::Where
        | Op::View(_)
        | Op::Unview { .. }
        | Op::Assign(_)
        | Op::Gather { .. }
        | Op::Scatter { .. }
        | Op::CumSum { .. }
        | Op::MatMul => true,
    }
}

/// Whether the gradient rule of `op` reads the *value* of input `i` (rather than only its
/// shape). A tensor whose value a rule reads must not change before backward runs.
pub fn reads_input(op: &Op, i: usize) -> bool {
    match op {
        Op::Input | Op::Full(_) | Op::Random { .. } | Op::ArgSort { .. } => false,
        Op::Collective(_) | Op::Check(_) => false,
        // A user's backward may read any input (and the output, saved as one more).
        Op::Attention { .. } | Op::AttentionGrad { .. } | Op::Custom(_) => true,
        Op::Unary(u) => !matches!(
            u,
            UnaryOp::Neg | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Not
        ),
        Op::Binary(b) => !matches!(b, BinaryOp::Add | BinaryOp::Sub),
        Op::Where => i == 0,
        Op::Cast(_) | Op::View(_) | Op::Unview { .. } | Op::Assign(_) | Op::CumSum { .. } => false,
        Op::Reduce { op, .. } => !matches!(op, ReduceOp::Sum),
        Op::Gather { .. } | Op::Scatter { .. } => i == 1,
        Op::MatMul => true,
    }
}

/// The rules, with small helpers that keep them readable.
struct Rules<'a, B: GradBuilder> {
    b: &'a mut B,
}

impl<B: GradBuilder> Rules<'_, B> {
    /// `dq`, `dk`, `dv` of fused attention: one packed gradient op, then a view of each part
    /// (a given mask, a bool, has none).
    fn attention(
        &mut self,
        mask: crate::AttentionMask,
        scale: u64,
        inputs: &[B::Node],
        g: B::Node,
    ) -> Result<Vec<Option<B::Node>>, B::Error> {
        let (operands, given) = inputs.split_at(3);
        let mut args = operands.to_vec();
        args.push(g);
        args.extend(given.iter().cloned());
        let packed = self.b.op(Op::AttentionGrad { mask, scale }, &args)?;
        let packed_shape = self.b.shape(&packed);
        let mut start = 0;
        let mut parts = Vec::new();
        for x in operands {
            let shape = self.b.shape(x);
            let per_entry = shape.numel() / packed_shape.dims()[0].max(1);
            let view = crate::View::contiguous(packed_shape.clone())
                .narrow(1, start, per_entry)
                .reshape(&shape)
                .expect("a narrowed row splits into the operand's rows");
            start += per_entry;
            parts.push(Some(self.b.op(Op::View(view), std::slice::from_ref(&packed))?));
        }
        parts.extend(given.iter().map(|_| None));
        Ok(parts)
    }
}

impl<B: GradBuilder> Rules<'_, B> {
    /// The gradient of a collective's input, taking the loss to be the sum of every rank's
    /// loss (as `torch.distributed.nn` does): the adjoint collective of `g`.
    fn collective(&mut self, c: &Collective, g: B::Node) -> Result<B::Node, B::Error> {
        let adjoint = |kind| Op::Collective(Collective { kind, ..*c });
        match c.kind {
            CollectiveKind::AllReduce(CollectiveReduce::Sum | CollectiveReduce::Mean) => {
                self.b.op(Op::Collective(*c), &[g])
            }
            CollectiveKind::AllGather => {
                self.b.op(adjoint(CollectiveKind::ReduceScatter(CollectiveReduce::Sum)), &[g])
            }
            CollectiveKind::ReduceScatter(r @ (CollectiveReduce::Sum | CollectiveReduce::Mean)) => {
                let gathered = self.b.op(adjoint(CollectiveKind::AllGather), &[g])?;
                if r == CollectiveReduce::Sum {
                    return Ok(gathered);
                }
                self.scale(&gathered, 1.0 / f64::from(c.world))
            }
            CollectiveKind::AllReduce(r) | CollectiveKind::ReduceScatter(r) => {
                Err(IrError::InvalidGraph(format!(
                    "{} with {} has no gradient; only sum and mean reductions are differentiable",
                    c.name(),
                    r.name()
                ))
                .into())
            }
            CollectiveKind::Broadcast { .. } => Err(IrError::InvalidGraph(
                "broadcast has no gradient (its input's gradient would live on the root rank \
                 only); broadcast detached values, as parameters are at start-up"
                    .into(),
            )
            .into()),
        }
    }

    fn un(&mut self, op: UnaryOp, x: &B::Node) -> Result<B::Node, B::Error> {
        self.b.op(Op::Unary(op), std::slice::from_ref(x))
    }

    fn bin(&mut self, op: BinaryOp, x: &B::Node, y: &B::Node) -> Result<B::Node, B::Error> {
        self.b.op(Op::Binary(op), &[x.clone(), y.clone()])
    }

    fn mul(&mut self, x: &B::Node, y: &B::Node) -> Result<B::Node, B::Error> {
        self.bin(BinaryOp::Mul, x, y)
    }

    fn full_like(&mut self, v: f64, like: &B::Node) -> Result<B::Node, B::Error> {
        let (shape, dtype) = (self.b.shape(like), self.b.dtype(like));
        self.b.leaf(Op::Full(Scalar::F64(v)), shape, dtype)
    }

    /// `x * v` for a constant `v`.
    fn scale(&mut self, x: &B::Node, v: f64) -> Result<B::Node, B::Error> {
        let c = self.full_like(v, x)?;
        self.mul(x, &c)
    }

    fn select(&mut self, c: &B::Node, a: &B::Node, b: &B::Node) -> Result<B::Node, B::Error> {
        self.b.op(Op::Where, &[c.clone(), a.clone(), b.clone()])
    }

    /// `g` where `mask`, 0 elsewhere.
    fn masked(&mut self, mask: &B::Node, g: &B::Node) -> Result<B::Node, B::Error> {
        let zero = self.full_like(0.0, g)?;
        self.select(mask, g, &zero)
    }

    fn cmp_const(&mut self, op: BinaryOp, x: &B::Node, v: f64) -> Result<B::Node, B::Error> {
        let c = self.full_like(v, x)?;
        self.bin(op, x, &c)
    }

    fn transpose_last(&mut self, x: &B::Node) -> Result<B::Node, B::Error> {
        let shape = self.b.shape(x);
        let r = shape.rank();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.b.op(Op::View(View::contiguous(shape).permute(&perm)), std::slice::from_ref(x))
    }

    /// The gradient of a gather that picks one element per line along `axis` (cross-entropy's
    /// pattern, [`picks_one_per_line`]): `g` where the position along `axis` is the line's
    /// index, 0 elsewhere. Elementwise over `x`'s shape, reading the positions (a running
    /// count of ones along the axis, one line long), the index and `g` through broadcasts, so
    /// it fuses into whatever reads it: a softmax gradient's row kernels compute it as they
    /// go, where a scatter into a zero tensor wrote the whole tensor twice first.
    fn picked_gradient(
        &mut self,
        axis: usize,
        x: &B::Node,
        index: &B::Node,
        g: B::Node,
    ) -> Result<B::Node, B::Error> {
        let shape = self.b.shape(x);
        let mut line = vec![1; shape.rank()];
        line[axis] = shape.dims()[axis];
        // Positions counted from 1 and compared with the index plus one, both in a float
        // type that holds every position exactly: the CPU's vector loops take a kernel whose
        // values are all floats, where 64-bit integer lanes beside them ran it scalar (3x
        // slower than the scatter). The index is converted once per line, not per element.
        let exact = if line[axis] <= 1 << f32::MANTISSA_DIGITS { DType::F32 } else { DType::F64 };
        let ones = self.b.leaf_beside(Op::Full(Scalar::F64(1.0)), Shape::new(line), exact, x)?;
        let counted = self.b.op(Op::CumSum { axis }, &[ones])?;
        let counted = self.expand_to(&counted, &shape)?;
        let index = self.b.op(Op::Cast(exact), std::slice::from_ref(index))?;
        let one = self.full_like(1.0, &index)?;
        let index = self.bin(BinaryOp::Add, &index, &one)?;
        let index = self.expand_to(&index, &shape)?;
        let hit = self.bin(BinaryOp::Eq, &counted, &index)?;
        let g = self.expand_to(&g, &shape)?;
        self.masked(&hit, &g)
    }

    /// Broadcasts a reduced value (reduced axes kept as 1) back to `shape`.
    fn expand_to(&mut self, x: &B::Node, shape: &Shape) -> Result<B::Node, B::Error> {
        let view = View::contiguous(self.b.shape(x)).expand(shape);
        self.b.op(Op::View(view), std::slice::from_ref(x))
    }

    fn unary(&mut self, op: UnaryOp, x: &B::Node, g: B::Node) -> Result<Option<B::Node>, B::Error> {
        if !self.b.dtype(x).is_float() && !matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu)
        {
            return Ok(None);
        }
        Ok(Some(match op {
            UnaryOp::Neg => self.un(UnaryOp::Neg, &g)?,
            UnaryOp::Abs => {
                // sign(x) * g, with sign(0) = 0.
                let pos = self.cmp_const(BinaryOp::Gt, x, 0.0)?;
                let neg = self.cmp_const(BinaryOp::Lt, x, 0.0)?;
                let ng = self.un(UnaryOp::Neg, &g)?;
                let zero = self.full_like(0.0, &g)?;
                let low = self.select(&neg, &ng, &zero)?;
                self.select(&pos, &g, &low)?
            }
            UnaryOp::Sqrt => {
                let s = self.un(UnaryOp::Sqrt, x)?;
                let two_s = self.scale(&s, 2.0)?;
                self.bin(BinaryOp::Div, &g, &two_s)?
            }
            UnaryOp::Exp => {
                let e = self.un(UnaryOp::Exp, x)?;
                self.mul(&g, &e)?
            }
            UnaryOp::Log => self.bin(BinaryOp::Div, &g, x)?,
            UnaryOp::Sin => {
                let c = self.un(UnaryOp::Cos, x)?;
                self.mul(&g, &c)?
            }
            UnaryOp::Cos => {
                let s = self.un(UnaryOp::Sin, x)?;
                let ns = self.un(UnaryOp::Neg, &s)?;
                self.mul(&g, &ns)?
            }
            UnaryOp::Tan => {
                // 1 + tan(x)^2
                let t = self.un(UnaryOp::Tan, x)?;
                let t2 = self.mul(&t, &t)?;
                let one = self.full_like(1.0, x)?;
                let d = self.bin(BinaryOp::Add, &one, &t2)?;
                self.mul(&g, &d)?
            }
            UnaryOp::Tanh => {
                // 1 - tanh(x)^2
                let t = self.un(UnaryOp::Tanh, x)?;
                let t2 = self.mul(&t, &t)?;
                let one = self.full_like(1.0, x)?;
                let d = self.bin(BinaryOp::Sub, &one, &t2)?;
                self.mul(&g, &d)?
            }
            UnaryOp::Sigmoid => {
                // s * (1 - s)
                let s = self.un(UnaryOp::Sigmoid, x)?;
                let one = self.full_like(1.0, x)?;
                let c = self.bin(BinaryOp::Sub, &one, &s)?;
                let d = self.mul(&s, &c)?;
                self.mul(&g, &d)?
            }
            UnaryOp::Relu => {
                let pos = self.cmp_const(BinaryOp::Gt, x, 0.0)?;
                self.masked(&pos, &g)?
            }
            UnaryOp::Erf => {
                // 2/sqrt(pi) * exp(-x^2)
                let x2 = self.mul(x, x)?;
                let nx2 = self.un(UnaryOp::Neg, &x2)?;
                let e = self.un(UnaryOp::Exp, &nx2)?;
                let d = self.scale(&e, std::f64::consts::FRAC_2_SQRT_PI)?;
                self.mul(&g, &d)?
            }
            UnaryOp::Erfc => {
                // -2/sqrt(pi) * exp(-x^2)
                let x2 = self.mul(x, x)?;
                let nx2 = self.un(UnaryOp::Neg, &x2)?;
                let e = self.un(UnaryOp::Exp, &nx2)?;
                let d = self.scale(&e, -std::f64::consts::FRAC_2_SQRT_PI)?;
                self.mul(&g, &d)?
            }
            UnaryOp::Recip => {
                // -g / x^2
                let x2 = self.mul(x, x)?;
                let q = self.bin(BinaryOp::Div, &g, &x2)?;
                self.un(UnaryOp::Neg, &q)?
            }
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => self.full_like(0.0, x)?,
            UnaryOp::Not => return Ok(None),
        }))
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        x: &B::Node,
        y: &B::Node,
        g: B::Node,
    ) -> Result<Vec<Option<B::Node>>, B::Error> {
        if !self.b.dtype(x).is_float() {
            return Ok(vec![None, None]);
        }
        Ok(match op {
            BinaryOp::Add => vec![Some(g.clone()), Some(g)],
            BinaryOp::Sub => vec![Some(g.clone()), Some(self.un(UnaryOp::Neg, &g)?)],
            BinaryOp::Mul => vec![Some(self.mul(&g, y)?), Some(self.mul(&g, x)?)],
            BinaryOp::Div => {
                // d/dx = g / y; d/dy = -g * x / y^2 = -(g / y) * (x / y)
                let gx = self.bin(BinaryOp::Div, &g, y)?;
                let q = self.bin(BinaryOp::Div, x, y)?;
                let t = self.mul(&gx, &q)?;
                vec![Some(gx), Some(self.un(UnaryOp::Neg, &t)?)]
            }
            BinaryOp::Pow => {
                // d/dx = g * y * x^(y-1), 0 where y == 0
                let one = self.full_like(1.0, y)?;
                let ym1 = self.bin(BinaryOp::Sub, y, &one)?;
                let p = self.bin(BinaryOp::Pow, x, &ym1)?;
                let d = self.mul(y, &p)?;
                let gd = self.mul(&g, &d)?;
                let y_zero = self.cmp_const(BinaryOp::Eq, y, 0.0)?;
                let zero = self.full_like(0.0, &g)?;
                let gx = self.select(&y_zero, &zero, &gd)?;
                // d/dy = g * x^y * ln(x), 0 where x == 0 and y >= 0
                let r = self.bin(BinaryOp::Pow, x, y)?;
                let l = self.un(UnaryOp::Log, x)?;
                let rl = self.mul(&r, &l)?;
                let gr = self.mul(&g, &rl)?;
                let x_zero = self.cmp_const(BinaryOp::Eq, x, 0.0)?;
                let y_nonneg = self.cmp_const(BinaryOp::Ge, y, 0.0)?;
                let both = self.bin(BinaryOp::And, &x_zero, &y_nonneg)?;
                let gy = self.select(&both, &zero, &gr)?;
                vec![Some(gx), Some(gy)]
            }
            BinaryOp::Maximum | BinaryOp::Minimum => {
                // The winner takes g; on a tie each side takes g / 2.
                let wins = if op == BinaryOp::Maximum { BinaryOp::Gt } else { BinaryOp::Lt };
                let x_wins = self.bin(wins, x, y)?;
                let y_wins = self.bin(wins, y, x)?;
                let tie = self.bin(BinaryOp::Eq, x, y)?;
                let half = self.scale(&g, 0.5)?;
                let zero = self.full_like(0.0, &g)?;
                let tie_part = self.select(&tie, &half, &zero)?;
                let gx = self.select(&x_wins, &g, &tie_part)?;
                let gy = self.select(&y_wins, &g, &tie_part)?;
                vec![Some(gx), Some(gy)]
            }
            BinaryOp::Rem => {
                // a - trunc(a / b) * b: d/da = g, d/db = -g * trunc(a / b), as PyTorch's fmod.
                let q = self.bin(BinaryOp::Div, x, y)?;
                let below = self.cmp_const(BinaryOp::Lt, &q, 0.0)?;
                let (up, down) = (self.un(UnaryOp::Ceil, &q)?, self.un(UnaryOp::Floor, &q)?);
                let t = self.select(&below, &up, &down)?;
                let gt = self.mul(&g, &t)?;
                vec![Some(g), Some(self.un(UnaryOp::Neg, &gt)?)]
            }
            BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::Shl
            | BinaryOp::Shr => vec![None, None],
        })
    }

    fn reduce(
        &mut self,
        op: ReduceOp,
        axes: &[usize],
        x: &B::Node,
        g: B::Node,
    ) -> Result<Option<B::Node>, B::Error> {
        let shape = self.b.shape(x);
        if !self.b.dtype(x).is_float() {
            return Ok(None);
        }
        Ok(match op {
            ReduceOp::Sum => Some(self.expand_to(&g, &shape)?),
            ReduceOp::Max | ReduceOp::Min => {
                // Evenly among the elements equal to the extreme.
                let m =
                    self.b.op(Op::Reduce { op, axes: axes.to_vec() }, std::slice::from_ref(x))?;
                let me = self.expand_to(&m, &shape)?;
                let hit = self.bin(BinaryOp::Eq, x, &me)?;
                let dtype = self.b.dtype(x);
                let hits = self.b.op(Op::Cast(dtype), &[hit])?;
                let count = self.b.op(
                    Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec() },
                    std::slice::from_ref(&hits),
                )?;
                let share = self.bin(BinaryOp::Div, &g, &count)?;
                let se = self.expand_to(&share, &shape)?;
                Some(self.mul(&se, &hits)?)
            }
            ReduceOp::LogSumExp => {
                // d lse / dx = exp(x - lse): the softmax of x along the axes.
                let y =
                    self.b.op(Op::Reduce { op, axes: axes.to_vec() }, std::slice::from_ref(x))?;
                let ye = self.expand_to(&y, &shape)?;
                let shifted = self.bin(BinaryOp::Sub, x, &ye)?;
                let softmax = self.un(UnaryOp::Exp, &shifted)?;
                let ge = self.expand_to(&g, &shape)?;
                Some(self.mul(&ge, &softmax)?)
            }
            ReduceOp::Prod => {
                // The product of the other elements. With no zero along the axes that is
                // prod / x; with exactly one zero, only the zero gets a gradient (the product
                // of the others); with two or more, every gradient is 0.
                let one = self.full_like(1.0, x)?;
                let is_zero = self.cmp_const(BinaryOp::Eq, x, 0.0)?;
                let nz = self.select(&is_zero, &one, x)?;
                let prod_nz = self.b.op(
                    Op::Reduce { op: ReduceOp::Prod, axes: axes.to_vec() },
                    std::slice::from_ref(&nz),
                )?;
                let dtype = self.b.dtype(x);
                let zeros_f = self.b.op(Op::Cast(dtype), std::slice::from_ref(&is_zero))?;
                let zero_count =
                    self.b.op(Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec() }, &[zeros_f])?;
                let pe = self.expand_to(&prod_nz, &shape)?;
                let ze = self.expand_to(&zero_count, &shape)?;
                // No zeros: prod / x. One zero: the zero's gradient is prod of the others.
                let plain = self.bin(BinaryOp::Div, &pe, &nz)?;
                let none = self.cmp_const(BinaryOp::Eq, &ze, 0.0)?;
                let one_zero = self.cmp_const(BinaryOp::Eq, &ze, 1.0)?;
                let zero = self.full_like(0.0, x)?;
                let at_zero = self.select(&one_zero, &pe, &zero)?;
                let at_zero = self.select(&is_zero, &at_zero, &zero)?;
                let d = self.select(&none, &plain, &at_zero)?;
                let ge = self.expand_to(&g, &shape)?;
                Some(self.mul(&ge, &d)?)
            }
            ReduceOp::ArgMax | ReduceOp::ArgMin => None,
        })
    }
}

/// For a view that reads every element of its input (of shape `input`) through a
/// permutation of its dimensions, possibly broadcasting some and adding or dropping size-1
/// dimensions: the view's dimensions to sum (the broadcast ones) and the view that reads the
/// summed gradient back in the input's layout. `None` for other views (slices, flips,
/// overlapping or offset views), whose gradient needs a scatter.
fn view_inverse(view: &View, input: &Shape) -> Option<(Vec<usize>, View)> {
    if view.offset() != 0 || input.numel() == 0 || view.shape().numel() == 0 {
        return None;
    }
    let in_strides = View::contiguous(input.clone()).strides().to_vec();
    let mut source: Vec<Option<usize>> = vec![None; input.rank()];
    let mut axes = Vec::new();
    for (i, (&size, &stride)) in view.shape().dims().iter().zip(view.strides()).enumerate() {
        if size == 1 {
            continue;
        }
        if stride == 0 {
            axes.push(i);
            continue;
        }
        let j = (0..input.rank())
            .find(|&j| source[j].is_none() && input.dims()[j] == size && in_strides[j] == stride)?;
        source[j] = Some(i);
    }
    if (0..input.rank()).any(|j| input.dims()[j] > 1 && source[j].is_none()) {
        return None;
    }
    let mut summed: Vec<usize> = view.shape().dims().to_vec();
    for &a in &axes {
        summed[a] = 1;
    }
    let g_strides = View::contiguous(Shape::new(summed)).strides().to_vec();
    let strides = source.iter().map(|s| s.map_or(0, |i| g_strides[i])).collect();
    Some((axes, View::from_parts(input.clone(), strides, 0)))
}
