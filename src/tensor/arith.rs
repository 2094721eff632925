//! Elementwise arithmetic, math functions, comparisons, casts and the operator traits.
//! The promotion rules are described in the crate documentation.

use std::borrow::Cow;
use std::ops;

use kiln_ir::{BinaryOp, DType, Op, Participant, Scalar, UnaryOp, result_type};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

/// The right-hand side of a binary op: a tensor (owned or borrowed) or a scalar literal.
///
/// Methods such as [`Tensor::add`], [`Tensor::maximum`] and [`Tensor::gt`] take
/// `impl Into<Operand>`, so each accepts `&t`, `t`, `2.0`, `3` or `true`.
#[derive(Clone, Debug)]
pub enum Operand<'a> {
    /// A tensor, broadcast against the other operand.
    Tensor(Cow<'a, Tensor>),
    /// A scalar, which takes part in type promotion only through its kind.
    Scalar(Scalar),
}

impl<'a> From<&'a Tensor> for Operand<'a> {
    fn from(t: &'a Tensor) -> Operand<'a> {
        Operand::Tensor(Cow::Borrowed(t))
    }
}

impl From<Tensor> for Operand<'_> {
    fn from(t: Tensor) -> Operand<'static> {
        Operand::Tensor(Cow::Owned(t))
    }
}

macro_rules! operand_from_scalar {
    ($($t:ty),*) => {$(
        impl From<$t> for Operand<'_> {
            fn from(v: $t) -> Operand<'static> {
                Operand::Scalar(Scalar::from(v))
            }
        }
    )*};
}
operand_from_scalar!(f64, f32, i64, i32, i8, u8, bool);

impl Operand<'_> {
    fn participant(&self) -> Participant {
        match self {
            Operand::Tensor(t) if t.ndim() == 0 => Participant::ZeroDim(t.dtype()),
            Operand::Tensor(t) => Participant::Tensor(t.dtype()),
            Operand::Scalar(s) => Participant::Scalar(s.category()),
        }
    }
}

impl Tensor {
    /// Records a binary op with broadcasting and type promotion; `reversed` puts `rhs` first.
    #[track_caller]
    pub(crate) fn binary(&self, op: BinaryOp, rhs: Operand<'_>, reversed: bool) -> Result<Tensor> {
        let common = self.common_dtype(&rhs);
        let dtype = match op {
            BinaryOp::Div | BinaryOp::Pow if !common.is_float() => DType::F32,
            BinaryOp::And | BinaryOp::Or => DType::Bool,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Rem
                if common == DType::Bool =>
            {
                return Err(Error::dtype(
                    op.name(),
                    "is not defined for two bool operands; cast one with .long() or .float() first",
                ));
            }
            b if b.is_bitwise() && (common.is_float() || common == DType::Bool) => {
                return Err(Error::dtype(
                    op.name(),
                    format!("is defined for integer tensors, not {common}"),
                ));
            }
            _ => common,
        };
        self.binary_as(op, rhs, reversed, dtype)
    }

    /// The dtype PyTorch's promotion gives `self` and `rhs` together.
    pub(crate) fn common_dtype(&self, rhs: &Operand<'_>) -> DType {
        result_type(&[Operand::from(self).participant(), rhs.participant()])
    }

    /// Records `op` of `self` and `rhs`, both broadcast and converted to `dtype`.
    #[track_caller]
    pub(crate) fn binary_as(
        &self,
        op: BinaryOp,
        rhs: Operand<'_>,
        reversed: bool,
        dtype: DType,
    ) -> Result<Tensor> {
        let rhs = match rhs {
            Operand::Tensor(t) => t.into_owned(),
            // A scalar is a fill of the result's shape: one node, no broadcast view.
            Operand::Scalar(s) => Tensor::try_full_dtype(self.shape().clone(), s, dtype)?,
        };
        let (a, b) = if reversed { (&rhs, self) } else { (self, &rhs) };
        let shape = a.shape().broadcast(b.shape(), op.name())?;
        let a = a.to_dtype(dtype).broadcast_to(&shape);
        let b = b.to_dtype(dtype).broadcast_to(&shape);
        Tensor::from_op(Op::Binary(op), &[&a, &b])
    }

    #[track_caller]
    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        Tensor::from_op(Op::Unary(op), &[self])
    }

    /// A float-only function: integers and bools are computed as `f32`, as in PyTorch.
    #[track_caller]
    fn float_unary(&self, op: UnaryOp) -> Tensor {
        let x = if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::F32) };
        ok(x.unary(op))
    }

    /// Converts the elements to `dtype` (a no-op returning a view of the same storage when
    /// the dtype already matches). Float to integer truncates toward zero and saturates
    /// (NaN gives 0); narrowing integers wrap; non-zero is `true`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-1.7f32, 0.0, 2.5], [3]);
    /// assert_eq!(x.to_dtype(DType::I64).to_vec::<i64>(), vec![-1, 0, 2]);
    /// assert_eq!(x.to_dtype(DType::Bool).to_vec::<bool>(), vec![true, false, true]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        ok(Tensor::from_op(Op::Cast(dtype), &[self]))
    }

    /// Converts to `f32`.
    #[must_use]
    #[track_caller]
    pub fn float(&self) -> Tensor {
        self.to_dtype(DType::F32)
    }

    /// Converts to `f64`.
    #[must_use]
    #[track_caller]
    pub fn double(&self) -> Tensor {
        self.to_dtype(DType::F64)
    }

    /// Converts to `f16`.
    #[must_use]
    #[track_caller]
    pub fn half(&self) -> Tensor {
        self.to_dtype(DType::F16)
    }

    /// Converts to `bf16`.
    #[must_use]
    #[track_caller]
    pub fn bfloat16(&self) -> Tensor {
        self.to_dtype(DType::BF16)
    }

    /// Converts to `i64`.
    #[must_use]
    #[track_caller]
    pub fn long(&self) -> Tensor {
        self.to_dtype(DType::I64)
    }

    /// Converts to `i32`.
    #[must_use]
    #[track_caller]
    pub fn int(&self) -> Tensor {
        self.to_dtype(DType::I32)
    }

    /// Converts to `i8` (PyTorch's `char()`): floats truncate toward zero and saturate to
    /// an `i64` first, integers wrap to 8 bits.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-1.7f32, 127.0, 200.0], [3]);
    /// assert_eq!(x.char().to_vec::<i8>(), vec![-1, 127, -56]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn char(&self) -> Tensor {
        self.to_dtype(DType::I8)
    }

    /// Converts to `u8` (PyTorch's `byte()`), as [`Tensor::char`] does to `i8`.
    #[must_use]
    #[track_caller]
    pub fn byte(&self) -> Tensor {
        self.to_dtype(DType::U8)
    }

    /// Converts to `bool` (non-zero is `true`).
    #[must_use]
    #[track_caller]
    pub fn bool(&self) -> Tensor {
        self.to_dtype(DType::Bool)
    }

    /// `self ^ exponent`, elementwise; integer tensors are raised as `f32`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![4.0f32, 9.0], [2]);
    /// assert_eq!(x.pow(0.5).to_vec::<f32>(), vec![2.0, 3.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn pow(&self, exponent: f64) -> Tensor {
        ok(self.binary(BinaryOp::Pow, Operand::Scalar(Scalar::F64(exponent)), false))
    }

    /// `self * self`.
    ///
    /// # Panics
    /// On a bool tensor.
    #[must_use]
    #[track_caller]
    pub fn square(&self) -> Tensor {
        ok(self.binary(BinaryOp::Mul, Operand::from(self), false))
    }

    /// The Gaussian error linear unit, `x * Φ(x) = x/2 * (1 + erf(x/√2))` (PyTorch's default,
    /// exact form).
    #[must_use]
    #[track_caller]
    pub fn gelu(&self) -> Tensor {
        let x = if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::F32) };
        let phi = (&x * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0;
        &x * 0.5 * phi
    }

    /// Limits every element to `[min, max]` (NaN stays NaN; if `min > max` every element
    /// becomes `max`, as in PyTorch).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-2.0f32, 0.5, 3.0], [3]);
    /// assert_eq!(x.clamp(-1.0, 1.0).to_vec::<f32>(), vec![-1.0, 0.5, 1.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn clamp(&self, min: f64, max: f64) -> Tensor {
        self.clamp_min(min).clamp_max(max)
    }

    /// [`Tensor::clamp`] under PyTorch's other name.
    #[must_use]
    #[track_caller]
    pub fn clip(&self, min: f64, max: f64) -> Tensor {
        self.clamp(min, max)
    }

    /// Raises every element below `min` to `min`.
    #[must_use]
    #[track_caller]
    pub fn clamp_min(&self, min: f64) -> Tensor {
        ok(self.binary(BinaryOp::Maximum, Operand::Scalar(clamp_scalar(self.dtype(), min)), false))
    }

    /// Lowers every element above `max` to `max`.
    #[must_use]
    #[track_caller]
    pub fn clamp_max(&self, max: f64) -> Tensor {
        ok(self.binary(BinaryOp::Minimum, Operand::Scalar(clamp_scalar(self.dtype(), max)), false))
    }

    /// `-self`.
    ///
    /// # Panics
    /// On a bool tensor (use [`Tensor::logical_not`]); [`Tensor::try_neg`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn neg(&self) -> Tensor {
        ok(self.try_neg())
    }

    /// `-self`, or an error for a bool tensor.
    ///
    /// # Errors
    /// [`Error::DType`] on a bool tensor.
    #[track_caller]
    pub fn try_neg(&self) -> Result<Tensor> {
        if self.dtype() == DType::Bool {
            return Err(Error::dtype(
                "neg",
                "is not defined for bool tensors; to invert a mask use .logical_not()",
            ));
        }
        self.unary(UnaryOp::Neg)
    }

    /// `|self|`.
    ///
    /// # Panics
    /// On a bool tensor; [`Tensor::try_abs`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn abs(&self) -> Tensor {
        ok(self.try_abs())
    }

    /// `|self|`, or an error for a bool tensor.
    ///
    /// # Errors
    /// [`Error::DType`] on a bool tensor.
    #[track_caller]
    pub fn try_abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }

    /// `max(self, 0)`, keeping the dtype (NaN stays NaN).
    ///
    /// # Panics
    /// On a bool tensor; [`Tensor::try_relu`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        ok(self.try_relu())
    }

    /// `max(self, 0)`, or an error for a bool tensor.
    ///
    /// # Errors
    /// [`Error::DType`] on a bool tensor.
    #[track_caller]
    pub fn try_relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// Logical not of a bool tensor (other dtypes: `self == 0`).
    #[must_use]
    #[track_caller]
    pub fn logical_not(&self) -> Tensor {
        ok(self.bool().unary(UnaryOp::Not))
    }
}

impl Tensor {
    /// Elementwise `if cond { a } else { b }`, broadcasting all three; `a` and `b` (tensors or
    /// scalars) are promoted to a common dtype.
    ///
    /// # Panics
    /// If `cond` is not `Bool` or the shapes do not broadcast; [`Tensor::try_where_`] returns
    /// the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-1.0f32, 2.0, -3.0], [3]);
    /// assert_eq!(Tensor::where_(&x.gt(0.0), &x, 0.0).to_vec::<f32>(), vec![0.0, 2.0, 0.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn where_<'a, 'b>(
        cond: &Tensor,
        a: impl Into<Operand<'a>>,
        b: impl Into<Operand<'b>>,
    ) -> Tensor {
        ok(Tensor::try_where_(cond, a, b))
    }

    /// [`Tensor::where_`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] when `cond` is not `Bool`; [`Error::Shape`] when the shapes do not
    /// broadcast; [`Error::Device`] for tensors on two devices.
    #[track_caller]
    pub fn try_where_<'a, 'b>(
        cond: &Tensor,
        a: impl Into<Operand<'a>>,
        b: impl Into<Operand<'b>>,
    ) -> Result<Tensor> {
        if cond.dtype() != DType::Bool {
            return Err(Error::dtype(
                "where",
                format!(
                    "the condition must be a bool tensor, got {}; compare first (e.g. x.gt(0.0))",
                    cond.dtype()
                ),
            ));
        }
        let (a, b) = (a.into(), b.into());
        let dtype = result_type(&[a.participant(), b.participant()]);
        let tensor = |o: Operand<'_>| match o {
            Operand::Tensor(t) => t.into_owned(),
            Operand::Scalar(s) => Tensor::full_dtype((), s, dtype),
        };
        let (a, b) = (tensor(a), tensor(b));
        let shape = cond.shape().broadcast(a.shape(), "where")?.broadcast(b.shape(), "where")?;
        let c = cond.broadcast_to(&shape);
        let a = a.to_dtype(dtype).broadcast_to(&shape);
        let b = b.to_dtype(dtype).broadcast_to(&shape);
        Tensor::from_op(Op::Where, &[&c, &a, &b])
    }
}

fn clamp_scalar(dtype: DType, v: f64) -> Scalar {
    // An integral bound keeps an integer tensor integral, as PyTorch's clamp(int) does.
    if !dtype.is_float() && v.fract() == 0.0 && v.abs() < 9.0e15 {
        Scalar::I64(v as i64)
    } else {
        Scalar::F64(v)
    }
}

macro_rules! float_unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            #[must_use]
            #[track_caller]
            pub fn $name(&self) -> Tensor {
                self.float_unary(UnaryOp::$op)
            }
        )*}
    };
}

float_unary_methods! {
    /// Square root (NaN below 0).
    sqrt => Sqrt;
    /// `e^x`.
    exp => Exp;
    /// Natural logarithm (`-inf` at 0, NaN below 0).
    log => Log;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Tangent.
    tan => Tan;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// The logistic function `1 / (1 + e^-x)`.
    sigmoid => Sigmoid;
    /// The error function.
    erf => Erf;
    /// The complementary error function `1 - erf(x)`, accurate where it is tiny (it reaches
    /// `1e-300` near `x = 26`, where `1 - erf(x)` is 0).
    erfc => Erfc;
    /// `1 / x`.
    reciprocal => Recip;
    /// Rounds down.
    floor => Floor;
    /// Rounds up.
    ceil => Ceil;
    /// Rounds to the nearest integer, half to even.
    round => Round;
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $try_name:ident => $op:ident;)*) => {
        impl Tensor {$(
            $(#[$doc])*
            ///
            /// # Panics
            #[doc = concat!("If the shapes do not broadcast or the dtypes do not fit; [`Tensor::", stringify!($try_name), "`] returns the error.")]
            #[must_use]
            #[track_caller]
            pub fn $name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Tensor {
                ok(self.binary(BinaryOp::$op, rhs.into(), false))
            }

            #[doc = concat!("[`Tensor::", stringify!($name), "`], returning an error instead of panicking.")]
            ///
            /// # Errors
            /// [`Error::Shape`] when the shapes do not broadcast, [`Error::DType`] when the
            /// op does not take the dtypes, [`Error::Device`] for tensors on two devices.
            #[track_caller]
            pub fn $try_name<'a>(&self, rhs: impl Into<Operand<'a>>) -> Result<Tensor> {
                self.binary(BinaryOp::$op, rhs.into(), false)
            }
        )*}
    };
}

binary_methods! {
    /// `self + rhs`, broadcasting.
    add, try_add => Add;
    /// `self - rhs`, broadcasting.
    sub, try_sub => Sub;
    /// `self * rhs`, broadcasting.
    mul, try_mul => Mul;
    /// `self / rhs`, broadcasting; true division (integers give `f32`).
    div, try_div => Div;
    /// The larger of each pair of elements, broadcasting (NaN if either is NaN).
    maximum, try_maximum => Maximum;
    /// The smaller of each pair of elements, broadcasting (NaN if either is NaN).
    minimum, try_minimum => Minimum;
    /// `self == rhs` elementwise, as `Bool`.
    eq, try_eq => Eq;
    /// `self != rhs` elementwise, as `Bool`.
    ne, try_ne => Ne;
    /// `self < rhs` elementwise, as `Bool`.
    lt, try_lt => Lt;
    /// `self <= rhs` elementwise, as `Bool`.
    le, try_le => Le;
    /// `self > rhs` elementwise, as `Bool`.
    gt, try_gt => Gt;
    /// `self >= rhs` elementwise, as `Bool`.
    ge, try_ge => Ge;
    /// Logical and (operands are converted to `Bool`).
    logical_and, try_logical_and => And;
    /// Logical or (operands are converted to `Bool`).
    logical_or, try_logical_or => Or;
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                ok(self.binary(BinaryOp::$op, Operand::from(rhs), false))
            }
        }
        impl ops::$trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                ok(self.binary(BinaryOp::$op, Operand::from(rhs), false))
            }
        }
        impl ops::$trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                ok(self.binary(BinaryOp::$op, Operand::from(rhs), false))
            }
        }
        impl ops::$trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                ok(self.binary(BinaryOp::$op, Operand::from(rhs), false))
            }
        }
        // Only f64 and i64: a second float or integer type would make `&x * 2.0` ambiguous to type
        // inference (the literal could be either), so chained calls would need annotations.
        operator!(@scalar $trait, $method, $op, f64, i64);
    };
    (@scalar $trait:ident, $method:ident, $op:ident, $($s:ty),*) => {$(
        impl ops::$trait<$s> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: $s) -> Tensor {
                ok(self.binary(BinaryOp::$op, Operand::from(rhs), false))
            }
        }
        impl ops::$trait<$s> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: $s) -> Tensor {
                ok(self.binary(BinaryOp::$op, Operand::from(rhs), false))
            }
        }
        impl ops::$trait<&Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                ok(rhs.binary(BinaryOp::$op, Operand::from(self), true))
            }
        }
        impl ops::$trait<Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                ok(rhs.binary(BinaryOp::$op, Operand::from(self), true))
            }
        }
    )*};
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl ops::Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        ok(self.try_neg())
    }
}

impl ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        ok(self.try_neg())
    }
}
