//! The closed set of primitive ops and their shape and dtype inference.
//!
//! The IR is deliberately small: broadcasting, type promotion, squeezing after a reduction and
//! composite functions (mean, softmax, gelu, ...) are spelled out by the tensor layer with
//! explicit `View`, `Cast` and elementwise nodes, so that every op here has one simple rule.
//! Elementwise ops take inputs of one shape and one dtype.

use std::fmt;

mod indexing;

use indexing::{check_index, infer_scatter};

use crate::products::{AttentionMask, infer_attention_op, infer_matmul};
use crate::{Check, Collective, Custom, DType, IrError, Scalar, Shape, View};

/// Elementwise functions of one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x` (integers wrap).
    Neg,
    /// `|x|` (integers wrap at the minimum).
    Abs,
    /// `sqrt(x)`; NaN below 0.
    Sqrt,
    /// `e^x`.
    Exp,
    /// Natural logarithm; `-inf` at 0, NaN below 0.
    Log,
    /// `sin(x)`.
    Sin,
    /// `cos(x)`.
    Cos,
    /// `tan(x)`.
    Tan,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `max(x, 0)`; NaN stays NaN.
    Relu,
    /// The error function.
    Erf,
    /// The complementary error function `1 - erf(x)`, accurate where it is tiny.
    Erfc,
    /// `1 / x`.
    Recip,
    /// Rounds toward negative infinity.
    Floor,
    /// Rounds toward positive infinity.
    Ceil,
    /// Rounds half to even, as PyTorch's `round` does.
    Round,
    /// Logical not of a `Bool`.
    Not,
}

/// Elementwise functions of two arguments of one shape and one dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b` (integers wrap).
    Add,
    /// `a - b` (integers wrap).
    Sub,
    /// `a * b` (integers wrap).
    Mul,
    /// `a / b`; integers round toward zero, and give 0 where `b` is 0 (C and PyTorch's CPU
    /// raise or leave it undefined; a fused kernel cannot stop).
    Div,
    /// `a ^ b`, floats only.
    Pow,
    /// The larger of `a` and `b`; NaN if either is NaN.
    Maximum,
    /// The smaller of `a` and `b`; NaN if either is NaN.
    Minimum,
    /// `a == b`, giving `Bool`.
    Eq,
    /// `a != b`, giving `Bool`.
    Ne,
    /// `a < b`, giving `Bool`.
    Lt,
    /// `a <= b`, giving `Bool`.
    Le,
    /// `a > b`, giving `Bool`.
    Gt,
    /// `a >= b`, giving `Bool`.
    Ge,
    /// Logical and of two `Bool`s.
    And,
    /// Logical or of two `Bool`s.
    Or,
    /// The remainder of division rounded toward zero, with `a`'s sign: C's `fmod` (exact) for
    /// floats, `%` for integers (0 where `b` is 0).
    Rem,
    /// Bitwise and of two integers.
    BitAnd,
    /// Bitwise or of two integers.
    BitOr,
    /// Bitwise exclusive or of two integers.
    BitXor,
    /// `a << b` of integers, wrapping to the dtype; 0 where `b` is negative or at least 64.
    Shl,
    /// `a >> b` of integers (sign-filling for the signed types); a shift by a negative `b` or
    /// by at least 64 fills with the sign.
    Shr,
}

/// Reductions over a set of axes. The reduced axes keep size 1 in the result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum (0 over no elements).
    Sum,
    /// Product (1 over no elements).
    Prod,
    /// Maximum; NaN if any element is NaN.
    Max,
    /// Minimum; NaN if any element is NaN.
    Min,
    /// `log(sum(exp(x)))`, computed stably (-inf over no elements; NaN if any element is
    /// NaN, +inf if any is +inf). Float inputs only. A CPU kernel computes it in one pass
    /// (an online maximum with the sum rescaled as it grows); other targets and dtypes get
    /// it as max, exp, sum and log ([`crate::passes::ExpandLogSumExp`]).
    LogSumExp,
    /// Index of the maximum along one axis (`I64`); the first one on ties, a NaN counts as
    /// the maximum.
    ArgMax,
    /// Index of the minimum along one axis (`I64`); the first one on ties, a NaN counts as
    /// the minimum.
    ArgMin,
}

/// The distribution of a random fill. Values are a pure function of the fill's key and
/// the element's index, so a fill gives the same values however it is computed.
#[derive(Clone, Copy, Debug, PartialEq, Hash, Eq)]
pub enum RandomDist {
    /// Uniform on `[0, 1)`.
    Uniform,
    /// Standard normal.
    Normal,
    /// Uniform integers in `[low, high)`.
    Int {
        /// Smallest value.
        low: i64,
        /// One past the largest value.
        high: i64,
    },
}

/// A primitive op: one node of a graph. `Hash + Eq` compare everything that determines the
/// op's values (scalars by their bits), so an op can key a map directly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A realized buffer, bound when the graph runs. Shape and dtype are given.
    Input,
    /// Every element is this value. Shape and dtype are given.
    Full(Scalar),
    /// Random values, a pure function of `key` and the element index. Shape and dtype are given.
    Random {
        /// The distribution.
        dist: RandomDist,
        /// The stream's key (drawn from the seed when recorded).
        key: u64,
    },
    /// An elementwise function of one input.
    Unary(UnaryOp),
    /// An elementwise function of two inputs of one shape and dtype.
    Binary(BinaryOp),
    /// `where(cond, a, b)`: `cond` is `Bool`, `a` and `b` share shape and dtype.
    Where,
    /// Converts elements to another dtype (Rust `as` semantics; see [`crate::Element`]).
    Cast(DType),
    /// Reduces over `axes` (sorted, distinct), keeping them as size 1.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The reduced axes.
        axes: Vec<usize>,
    },
    /// Reads the input's dense row-major buffer through a view: permutes, broadcasts, slices
    /// and reshapes are all this one op, and become index arithmetic when fused.
    View(View),
    /// The adjoint of [`Op::View`]: a zero tensor of `shape` into which every input element
    /// is added at the position the view maps it to. Elements that a broadcast view reads
    /// several times receive the sum of their copies. This is the gradient of a view.
    Unview {
        /// The view whose adjoint this is; its shape is the input's shape.
        view: View,
        /// The result's shape (the shape the view reads from).
        shape: Shape,
    },
    /// Writes `values` (second input, of `view`'s shape) into a copy of `base` (first input)
    /// at the positions `view` selects, which must be distinct. This is how an in-place
    /// write through a view updates its storage.
    Assign(View),
    /// `out[p] = x[p with p[axis] = index[p]]`: the input's elements picked along `axis` by
    /// an `I64` index tensor of the same rank (PyTorch's `gather`). The result has the
    /// index's shape. Indices outside the axis are a run-time error.
    Gather {
        /// The axis the indices select along.
        axis: usize,
    },
    /// A copy of `base` where, for every position `p` of `index`, the element at
    /// `p with p[axis] = index[p]` is replaced by (or, with `accumulate`, increased by)
    /// `src[p]` (PyTorch's `scatter` and `scatter_add`). Where several positions replace the
    /// same element, the last in row-major order wins.
    Scatter {
        /// The axis the indices select along.
        axis: usize,
        /// Add instead of replacing.
        accumulate: bool,
    },
    /// Running sum along `axis`.
    CumSum {
        /// The axis summed along.
        axis: usize,
    },
    /// Batched matrix product `[.., m, k] x [.., k, n] -> [.., m, n]` with equal batch dims.
    MatMul,
    /// Fused attention `softmax(q·kᵀ·scale [masked])·v` over `q [.., L, E]`, `k [.., S, E]`,
    /// `v [.., S, Ev]` with the same leading (batch) dimensions, giving `[.., L, Ev]`, tile by
    /// tile with an online softmax so that no `L×S` matrix is stored. [`AttentionMask`] says
    /// which keys each query sees (a given mask is a fourth operand).
    Attention {
        /// Which keys each query sees.
        mask: AttentionMask,
        /// The score scale, as `f64` bits (so the op hashes and compares exactly).
        scale: u64,
    },
    /// The gradients of [`Op::Attention`] for `(q, k, v, dout[, mask])`, packed as
    /// `[N, L·E + S·E + S·Ev]` for `N` batch entries (`dq`, `dk`, `dv` row-major per entry).
    AttentionGrad {
        /// As the forward op's.
        mask: AttentionMask,
        /// As the forward op's.
        scale: u64,
    },
    /// The `I64` positions that sort each line along `axis` (a stable argsort: equal
    /// elements keep their order). NaN sorts above every number, as in PyTorch.
    ArgSort {
        /// The axis sorted along.
        axis: usize,
        /// Largest first.
        descending: bool,
    },
    /// A collective over the ranks of a process group ([`Collective`]): a step of its own.
    Collective(Collective),
    /// A check of data that only running the graph can make: the first input, unchanged,
    /// when every element of the second (`Bool`, one per row: the first input's elements
    /// split into as many equal runs, in row-major order) is true; otherwise running the
    /// graph fails with the [`Check`]'s message naming the first row that is not.
    Check(Check),
    /// A user-defined opaque op ([`Custom`]): a step of its own, run by the implementation
    /// registered under its id.
    Custom(Custom),
}

impl Op {
    /// The op's name, as it appears in messages and graph dumps.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Full(_) => "full",
            Op::Random { .. } => "random",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Cast(_) => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::View(_) => "view",
            Op::Unview { .. } => "unview",
            Op::Assign(_) => "assign",
            Op::Gather { .. } => "gather",
            Op::Scatter { accumulate: false, .. } => "scatter",
            Op::Scatter { accumulate: true, .. } => "scatter_add",
            Op::CumSum { .. } => "cumsum",
            Op::MatMul => "matmul",
            Op::ArgSort { .. } => "argsort",
            Op::Collective(c) => c.name(),
            Op::Attention { .. } => "attention",
            Op::AttentionGrad { .. } => "attention_grad",
            Op::Check(c) => c.op(),
            Op::Custom(c) => c.name,
        }
    }

    /// Whether the op has no inputs.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input | Op::Full(_) | Op::Random { .. })
    }

    /// Whether the op computes each element from the same element of its inputs (which share
    /// its shape): what fuses into a kernel's body.
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_))
    }

    /// Whether the op is free to recompute wherever it is used, so it is never stored on its
    /// own account: a constant becomes a kernel parameter, a view an index map.
    pub fn is_free(&self) -> bool {
        matches!(self, Op::Full(_) | Op::View(_))
    }

    /// Whether the op is a reduction that generated kernels compute, with the elementwise
    /// expression it reduces fused in (`sum`, `prod`, `max`, `min`, `logsumexp`; the
    /// arg-reductions run on their own).
    pub fn is_kernel_reduce(&self) -> bool {
        matches!(
            self,
            Op::Reduce {
                op: ReduceOp::Sum
                    | ReduceOp::Prod
                    | ReduceOp::Max
                    | ReduceOp::Min
                    | ReduceOp::LogSumExp,
                ..
            }
        )
    }

    /// Whether the op's parameters are values a plan may take anew on every run (a constant,
    /// a random key) rather than structure.
    pub fn is_rebindable(&self) -> bool {
        matches!(self, Op::Full(_) | Op::Random { .. })
    }

    /// The number of inputs the op takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input | Op::Full(_) | Op::Random { .. } => 0,
            Op::Unary(_)
            | Op::Cast(_)
            | Op::Reduce { .. }
            | Op::View(_)
            | Op::Unview { .. }
            | Op::CumSum { .. }
            | Op::ArgSort { .. }
            | Op::Collective(_) => 1,
            Op::Binary(_) | Op::MatMul | Op::Assign(_) | Op::Gather { .. } | Op::Check(_) => 2,
            Op::Where | Op::Scatter { .. } => 3,
            Op::Attention { mask, .. } => 3 + mask.operands(),
            Op::AttentionGrad { mask, .. } => 4 + mask.operands(),
            Op::Custom(c) => c.inputs,
        }
    }

    /// Checks a leaf's given shape and dtype.
    pub fn check_leaf(&self, dtype: DType) -> Result<(), IrError> {
        match self {
            Op::Random { dist: RandomDist::Int { low, high }, .. } => {
                if low >= high {
                    return Err(IrError::shape(
                        "randint",
                        format!("low ({low}) must be less than high ({high})"),
                    ));
                }
                expect_dtype("randint", dtype, |d| d == DType::I64, "i64")
            }
            Op::Random { .. } => expect_dtype("random", dtype, DType::is_float, "a float dtype"),
            Op::Input | Op::Full(_) => Ok(()),
            _ => Err(IrError::InvalidGraph(format!("{} is not a leaf op", self.name()))),
        }
    }

    /// The shape and dtype of the op's result, or an error naming the op, the shapes and the
    /// dtypes that do not fit. Leaves have no inputs and their shape is given: use
    /// [`Op::check_leaf`] for them.
    pub fn infer(&self, inputs: &[(&Shape, DType)]) -> Result<(Shape, DType), IrError> {
        if inputs.len() != self.arity() || self.is_leaf() {
            return Err(IrError::InvalidGraph(format!(
                "{} takes {} inputs, got {}",
                self.name(),
                self.arity(),
                inputs.len()
            )));
        }
        match self {
            Op::Input | Op::Full(_) | Op::Random { .. } => unreachable!("leaves return above"),
            Op::Unary(u) => {
                let (shape, dtype) = inputs[0];
                let ok = match u {
                    UnaryOp::Not => dtype == DType::Bool,
                    UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => dtype != DType::Bool,
                    _ => dtype.is_float(),
                };
                if !ok {
                    return Err(IrError::dtype(
                        u.name(),
                        format!("is not defined for {dtype} inputs"),
                    ));
                }
                Ok((shape.clone(), dtype))
            }
            Op::Binary(b) => infer_binary(*b, inputs),
            Op::Where => {
                let (sc, dc) = inputs[0];
                let (sa, da) = inputs[1];
                let (sb, db) = inputs[2];
                same_shape("where", sc, sa)?;
                same_shape("where", sa, sb)?;
                expect_dtype("where", dc, |d| d == DType::Bool, "a bool condition")?;
                if da != db {
                    return Err(IrError::dtype(
                        "where",
                        format!("branches have dtypes {da} and {db}"),
                    ));
                }
                Ok((sa.clone(), da))
            }
            Op::Cast(to) => Ok((inputs[0].0.clone(), *to)),
            Op::Reduce { op, axes } => infer_reduce(*op, axes, inputs),
            Op::View(view) => {
                let (shape, dtype) = inputs[0];
                if view.span() > shape.numel() {
                    return Err(IrError::InvalidGraph(format!(
                        "view {view} reaches element {} of an input with {} elements",
                        view.span(),
                        shape.numel()
                    )));
                }
                Ok((view.shape().clone(), dtype))
            }
            Op::Unview { view, shape } => {
                let (input, dtype) = inputs[0];
                if input != view.shape() || view.span() > shape.numel() {
                    return Err(IrError::InvalidGraph(format!(
                        "unview of {view} takes {} into {shape}, got an input of shape {input}",
                        view.shape()
                    )));
                }
                Ok((shape.clone(), dtype))
            }
            Op::Assign(view) => {
                let (base, dtype) = inputs[0];
                let (values, vdtype) = inputs[1];
                if values != view.shape() || vdtype != dtype || view.span() > base.numel() {
                    return Err(IrError::InvalidGraph(format!(
                        "assign through {view} into {base} {dtype} got values {values} {vdtype}"
                    )));
                }
                Ok((base.clone(), dtype))
            }
            Op::Gather { axis } => {
                let (x, dtype) = inputs[0];
                let (index, idtype) = inputs[1];
                check_index("gather", *axis, x, index, idtype)?;
                Ok((index.clone(), dtype))
            }
            Op::Scatter { axis, accumulate } => infer_scatter(*axis, *accumulate, inputs),
            Op::CumSum { axis } => {
                let (shape, dtype) = inputs[0];
                check_axis("cumsum", *axis, shape)?;
                let bool_error = IrError::dtype("cumsum", "is not defined for bool inputs");
                if dtype == DType::Bool { Err(bool_error) } else { Ok((shape.clone(), dtype)) }
            }
            Op::MatMul => infer_matmul(inputs),
            Op::Attention { .. } | Op::AttentionGrad { .. } => infer_attention_op(self, inputs),
            Op::ArgSort { axis, .. } => check_axis("argsort", *axis, inputs[0].0)
                .map(|()| (inputs[0].0.clone(), DType::I64)),
            Op::Collective(c) => c.infer(inputs[0].0, inputs[0].1),
            Op::Check(c) => c.infer(inputs),
            Op::Custom(c) => c.infer(),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Full(v) => write!(f, "full({v})"),
            Op::Random { dist, key } => write!(f, "random({dist:?}, key={key:#x})"),
            Op::Cast(d) => write!(f, "cast({d})"),
            Op::Collective(c) => write!(f, "{c}"),
            Op::Custom(c) => write!(f, "{c}"),
            Op::Reduce { op, axes } => write!(f, "{}{axes:?}", op.name()),
            Op::View(v) => write!(f, "view(strides {:?}, offset {})", v.strides(), v.offset()),
            Op::Unview { view, .. } => {
                write!(f, "unview(strides {:?}, offset {})", view.strides(), view.offset())
            }
            Op::Assign(v) => write!(f, "assign(strides {:?}, offset {})", v.strides(), v.offset()),
            Op::Gather { axis } | Op::Scatter { axis, .. } | Op::CumSum { axis } => {
                write!(f, "{}[{axis}]", self.name())
            }
            other => f.write_str(other.name()),
        }
    }
}

impl UnaryOp {
    /// Whether the op is a transcendental function (`exp`, `log`, `sin`, `cos`, `tan`, `tanh`,
    /// `sigmoid`, `erf`): generated code approximates it with a polynomial, a few ULP from the
    /// correctly rounded value, and it costs tens of instructions.
    pub fn is_transcendental(self) -> bool {
        // Exhaustive, so that a new op must be placed: the cost model, the oracle and the
        // code generators read this.
        match self {
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tan
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Erf
            | UnaryOp::Erfc => true,
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Relu
            | UnaryOp::Recip
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Not => false,
        }
    }

    /// Whether the op rounds to an integer value (`floor`, `ceil`, `round`): piecewise
    /// constant, so it has no gradient, and a one-ULP difference in its input can move its
    /// result by one (the oracle leaves such jumps of approximated values out).
    pub fn is_rounding(self) -> bool {
        match self {
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => true,
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tan
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Relu
            | UnaryOp::Erf
            | UnaryOp::Erfc
            | UnaryOp::Recip
            | UnaryOp::Not => false,
        }
    }

    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tan => "tan",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Erf => "erf",
            UnaryOp::Erfc => "erfc",
            UnaryOp::Recip => "reciprocal",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Not => "logical_not",
        }
    }
}

impl BinaryOp {
    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "logical_and",
            BinaryOp::Or => "logical_or",
            BinaryOp::Rem => "fmod",
            BinaryOp::BitAnd => "bitwise_and",
            BinaryOp::BitOr => "bitwise_or",
            BinaryOp::BitXor => "bitwise_xor",
            BinaryOp::Shl => "bitwise_left_shift",
            BinaryOp::Shr => "bitwise_right_shift",
        }
    }

    /// Whether generated code approximates the op (`pow`, through `exp` and `log`), a few
    /// ULP from the correctly rounded value, as it does the transcendental unary ops.
    pub fn is_approximated(self) -> bool {
        match self {
            BinaryOp::Pow => true,
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Rem
            | BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::Shl
            | BinaryOp::Shr => false,
        }
    }

    /// Whether the op takes integers only (the bitwise ops and shifts).
    pub fn is_bitwise(self) -> bool {
        matches!(
            self,
            BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor | BinaryOp::Shl | BinaryOp::Shr
        )
    }

    /// Whether the op compares and gives `Bool`.
    pub fn is_comparison(self) -> bool {
        match self {
            BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge => true,
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Pow
            | BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Rem
            | BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::Shl
            | BinaryOp::Shr => false,
        }
    }
}

impl ReduceOp {
    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::LogSumExp => "logsumexp",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }
}

/// [`Op::infer`] of a binary op: one shape, one dtype, and a dtype the op takes.
fn infer_binary(b: BinaryOp, inputs: &[(&Shape, DType)]) -> Result<(Shape, DType), IrError> {
    let (sa, da) = inputs[0];
    let (sb, db) = inputs[1];
    same_shape(b.name(), sa, sb)?;
    if da != db {
        return Err(IrError::dtype(b.name(), format!("inputs have dtypes {da} and {db}")));
    }
    let ok = match b {
        BinaryOp::Pow => da.is_float(),
        BinaryOp::And | BinaryOp::Or => da == DType::Bool,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Rem => {
            da != DType::Bool
        }
        BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor | BinaryOp::Shl | BinaryOp::Shr => {
            !da.is_float() && da != DType::Bool
        }
        BinaryOp::Maximum
        | BinaryOp::Minimum
        | BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Gt
        | BinaryOp::Ge => true,
    };
    if !ok {
        return Err(IrError::dtype(b.name(), format!("is not defined for {da} inputs")));
    }
    Ok((sa.clone(), if b.is_comparison() { DType::Bool } else { da }))
}

/// [`Op::infer`] of `reduce`.
fn infer_reduce(
    op: ReduceOp,
    axes: &[usize],
    inputs: &[(&Shape, DType)],
) -> Result<(Shape, DType), IrError> {
    let (shape, dtype) = inputs[0];
    if axes.windows(2).any(|w| w[0] >= w[1]) || axes.iter().any(|&a| a >= shape.rank()) {
        return Err(IrError::InvalidGraph(format!(
            "{}: axes {axes:?} must be sorted, distinct and below rank {}",
            op.name(),
            shape.rank()
        )));
    }
    let mut dims = shape.dims().to_vec();
    for &a in axes {
        dims[a] = 1;
    }
    match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => {
            if axes.len() != 1 {
                return Err(IrError::InvalidGraph(format!(
                    "{} reduces exactly one axis",
                    op.name()
                )));
            }
            if shape.dims()[axes[0]] == 0 {
                return Err(IrError::shape(
                    op.name(),
                    format!("cannot reduce dimension {} of size 0 in {shape}", axes[0]),
                ));
            }
            Ok((Shape::new(dims), DType::I64))
        }
        ReduceOp::Max | ReduceOp::Min => {
            // Bools have identities (false for max, true for min): any/all of nothing.
            if dtype != DType::Bool
                && let Some(&a) = axes.iter().find(|&&a| shape.dims()[a] == 0)
            {
                return Err(IrError::shape(
                    op.name(),
                    format!(
                        "cannot reduce dimension {a} of size 0 in {shape}: the result has no identity"
                    ),
                ));
            }
            Ok((Shape::new(dims), dtype))
        }
        ReduceOp::LogSumExp => {
            if !dtype.is_float() {
                return Err(IrError::dtype(op.name(), "is defined for float inputs only"));
            }
            Ok((Shape::new(dims), dtype))
        }
        ReduceOp::Sum | ReduceOp::Prod => {
            if dtype == DType::Bool {
                return Err(IrError::dtype(op.name(), "is not defined for bool inputs"));
            }
            Ok((Shape::new(dims), dtype))
        }
    }
}

/// An axis of `shape`, or an invalid graph.
fn check_axis(op: &'static str, axis: usize, shape: &Shape) -> Result<(), IrError> {
    if axis >= shape.rank() {
        return Err(IrError::InvalidGraph(format!("{op} over axis {axis} of {shape}")));
    }
    Ok(())
}

fn same_shape(op: &'static str, a: &Shape, b: &Shape) -> Result<(), IrError> {
    if a == b {
        Ok(())
    } else {
        Err(IrError::shape(op, format!("inputs have shapes {a} and {b}; broadcast them first")))
    }
}

pub(crate) fn expect_dtype(
    op: &'static str,
    got: DType,
    ok: impl Fn(DType) -> bool,
    want: &str,
) -> Result<(), IrError> {
    if ok(got) { Ok(()) } else { Err(IrError::dtype(op, format!("expected {want}, got {got}"))) }
}

#[cfg(test)]
mod tests;
