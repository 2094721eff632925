//! Element types, scalar values and PyTorch's type-promotion rules.

use std::fmt;

use half::{bf16, f16};

/// The element type of a tensor.
///
/// The 16-bit floats are stored as such and computed in a wider type (f32 in generated code,
/// f64 in the reference executor), as PyTorch does on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float, the default floating-point type.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// 16-bit IEEE half float.
    F16,
    /// 16-bit brain float (8 exponent bits, 7 mantissa bits).
    BF16,
    /// 64-bit signed integer, the default integer type (indices, `randint`, `arange` of `i64`).
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit signed integer (also the storage of per-channel quantized weights).
    I8,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean (one byte per element, 0 or 1): the result of comparisons.
    Bool,
}

/// The three categories that type promotion orders: `Bool < Int < Float`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    /// `Bool`.
    Bool,
    /// `U8`, `I8`, `I32`, `I64`.
    Int,
    /// `F16`, `BF16`, `F32`, `F64`.
    Float,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I8,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    /// Whether this is an integer type (`Bool` is not).
    pub fn is_int(self) -> bool {
        self.category() == Category::Int
    }

    /// Bits of significand precision of a float type (including the implicit bit); `None`
    /// for integers and `Bool`.
    pub fn mantissa_bits(self) -> Option<u32> {
        match self {
            DType::F64 => Some(53),
            DType::F32 => Some(24),
            DType::F16 => Some(11),
            DType::BF16 => Some(8),
            DType::I64 | DType::I32 | DType::I8 | DType::U8 | DType::Bool => None,
        }
    }

    /// The promotion category of this dtype.
    pub fn category(self) -> Category {
        match self {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Category::Float,
            DType::I64 | DType::I32 | DType::I8 | DType::U8 => Category::Int,
            DType::Bool => Category::Bool,
        }
    }

    /// The short name used in messages and `Display`: `f32`, `bf16`, `i64`, `bool`, ...
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// The default dtype of a category: `f32` for floats, `i64` for integers.
    pub fn default_for(category: Category) -> DType {
        match category {
            Category::Float => DType::F32,
            Category::Int => DType::I64,
            Category::Bool => DType::Bool,
        }
    }

    /// The smallest dtype that holds both `a` and `b` exactly where possible, as
    /// `torch.promote_types` does: within a category the wider type wins (`f16` and `bf16`
    /// meet at `f32`, `u8` and `i32` at `i32`); across categories the higher category wins
    /// (`i64` with `f16` gives `f16`). `u8` and `i8` meet at `i32` (PyTorch's `i16`, a type
    /// kiln does not have: the narrowest that holds both).
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a.category(), b.category()) {
            (ca, cb) if ca > cb => a,
            (ca, cb) if ca < cb => b,
            (Category::Int, _) if matches!((a, b), (U8, I8) | (I8, U8)) => I32,
            (Category::Float, _) => match (a, b) {
                (F16, BF16) | (BF16, F16) => F32,
                _ => {
                    if a.size_in_bytes() >= b.size_in_bytes() {
                        a
                    } else {
                        b
                    }
                }
            },
            _ => {
                if a.size_in_bytes() >= b.size_in_bytes() {
                    a
                } else {
                    b
                }
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One operand's part in [`result_type`]: PyTorch ranks dimensioned tensors above zero-dim
/// tensors, and both above Rust scalar literals (which play the part of Python numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Participant {
    /// A tensor with at least one dimension.
    Tensor(DType),
    /// A tensor with zero dimensions.
    ZeroDim(DType),
    /// A scalar literal of this category.
    Scalar(Category),
}

/// The dtype an operation over these operands computes in, following PyTorch's rules:
/// the highest category among all operands wins; within it, dimensioned tensors decide,
/// then zero-dim tensors, and a category reached only through scalar literals uses its
/// default dtype (`f32` or `i64`).
///
/// ```
/// use kiln_ir::{result_type, Category, DType, Participant::*};
/// assert_eq!(result_type(&[Tensor(DType::I32), Scalar(Category::Int)]), DType::I32);
/// assert_eq!(result_type(&[Tensor(DType::I64), Scalar(Category::Float)]), DType::F32);
/// assert_eq!(result_type(&[Tensor(DType::F16), ZeroDim(DType::F64)]), DType::F16);
/// assert_eq!(result_type(&[Tensor(DType::F16), Tensor(DType::BF16)]), DType::F32);
/// ```
pub fn result_type(operands: &[Participant]) -> DType {
    let category_of = |p: &Participant| match *p {
        Participant::Tensor(d) | Participant::ZeroDim(d) => d.category(),
        Participant::Scalar(c) => c,
    };
    let top = operands.iter().map(category_of).max().unwrap_or(Category::Float);
    let fold = |pick: fn(&Participant) -> Option<DType>| {
        operands.iter().filter(|p| category_of(p) == top).filter_map(pick).reduce(DType::promote)
    };
    fold(|p| if let Participant::Tensor(d) = *p { Some(d) } else { None })
        .or_else(|| fold(|p| if let Participant::ZeroDim(d) = *p { Some(d) } else { None }))
        .unwrap_or(DType::default_for(top))
}

/// A scalar value: a constant in a graph, a fill value, or an element read back.
///
/// Equality and hashing are by bits (`0.0 != -0.0`, a NaN equals itself), so that ops that
/// hold scalars can key caches and merge common subexpressions: two fills are the same op
/// exactly when they store the same bits.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// A floating-point value.
    F64(f64),
    /// An integer value.
    I64(i64),
    /// A boolean value.
    Bool(bool),
}

impl Scalar {
    /// The value's bits with its kind: what equality and hashing compare.
    fn key(self) -> (u8, u64) {
        match self {
            Scalar::F64(v) => (0, v.to_bits()),
            Scalar::I64(v) => (1, v as u64),
            Scalar::Bool(v) => (2, u64::from(v)),
        }
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Scalar) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Scalar {}

impl std::hash::Hash for Scalar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Scalar {
    /// The promotion category of this value.
    pub fn category(self) -> Category {
        match self {
            Scalar::F64(_) => Category::Float,
            Scalar::I64(_) => Category::Int,
            Scalar::Bool(_) => Category::Bool,
        }
    }

    /// The value as an f64 (`true` is 1).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::F64(v) => v,
            Scalar::I64(v) => v as f64,
            Scalar::Bool(v) => f64::from(u8::from(v)),
        }
    }

    /// The value as an i64: floats truncate toward zero and saturate; NaN gives 0.
    pub fn to_i64(self) -> i64 {
        match self {
            Scalar::F64(v) => v as i64,
            Scalar::I64(v) => v,
            Scalar::Bool(v) => i64::from(v),
        }
    }

    /// The value as a bool: non-zero is `true`.
    pub fn to_bool(self) -> bool {
        match self {
            Scalar::F64(v) => v != 0.0,
            Scalar::I64(v) => v != 0,
            Scalar::Bool(v) => v,
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::F64(v) => write!(f, "{v:?}"),
            Scalar::I64(v) => write!(f, "{v}"),
            Scalar::Bool(v) => write!(f, "{v}"),
        }
    }
}

macro_rules! scalar_from {
    ($variant:ident, $conv:ty: $($t:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(v: $t) -> Scalar {
                Scalar::$variant(<$conv>::from(v))
            }
        }
    )*};
}
scalar_from!(F64, f64: f64, f32, f16, bf16);
scalar_from!(I64, i64: i64, i32, i8, u8);
scalar_from!(Bool, bool: bool);

/// A Rust type that is the element type of a [`DType`]: `f32`, `f64`, `half::f16`,
/// `half::bf16`, `i64`, `i32`, `i8`, `u8` and `bool`.
///
/// Conversions follow Rust's `as` casts: float to integer truncates toward zero and saturates
/// (NaN gives 0), integer to narrower integer wraps, and anything non-zero is `true`.
pub trait Element: Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The dtype whose elements are this type.
    const DTYPE: DType;
    /// Converts a scalar value to this type.
    fn from_scalar(v: Scalar) -> Self;
    /// Converts this value to a scalar of its own category.
    fn to_scalar(self) -> Scalar;
}

use crate::semantics::{bf16_from_f64, f16_from_f64};

macro_rules! element {
    ($t:ty, $dtype:ident, |$v:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn from_scalar($v: Scalar) -> Self {
                $from
            }
            fn to_scalar(self) -> Scalar {
                Scalar::from(self)
            }
        }
    };
}
element!(f32, F32, |v| v.to_f64() as f32);
element!(f64, F64, |v| v.to_f64());
element!(f16, F16, |v| f16_from_f64(v.to_f64()));
element!(bf16, BF16, |v| bf16_from_f64(v.to_f64()));
element!(i64, I64, |v| v.to_i64());
element!(i32, I32, |v| v.to_i64() as i32);
element!(i8, I8, |v| v.to_i64() as i8);
element!(u8, U8, |v| v.to_i64() as u8);
element!(bool, Bool, |v| v.to_bool());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_matches_pytorch_table() {
        use DType::*;
        let cases = [
            (F32, F64, F64),
            (F16, F32, F32),
            (F16, BF16, F32),
            (BF16, F64, F64),
            (I32, I64, I64),
            (U8, I32, I32),
            (U8, Bool, U8),
            (I8, U8, I32),
            (I8, I32, I32),
            (I8, I64, I64),
            (I8, Bool, I8),
            (I8, F16, F16),
            (I64, F16, F16),
            (Bool, F32, F32),
            (Bool, Bool, Bool),
        ];
        for (a, b, want) in cases {
            assert_eq!(DType::promote(a, b), want, "{a} with {b}");
            assert_eq!(DType::promote(b, a), want, "{b} with {a}");
        }
    }

    #[test]
    fn result_type_ranks_participants() {
        use Participant::*;
        assert_eq!(result_type(&[Tensor(DType::I32), ZeroDim(DType::I64)]), DType::I32);
        assert_eq!(result_type(&[Tensor(DType::I64), ZeroDim(DType::F64)]), DType::F64);
        assert_eq!(result_type(&[Tensor(DType::Bool), Scalar(Category::Int)]), DType::I64);
        assert_eq!(result_type(&[Tensor(DType::Bool), Scalar(Category::Float)]), DType::F32);
        assert_eq!(result_type(&[Tensor(DType::U8), Scalar(Category::Bool)]), DType::U8);
        assert_eq!(result_type(&[Scalar(Category::Int), Scalar(Category::Int)]), DType::I64);
    }

    #[test]
    fn element_conversions_cast_like_as() {
        assert_eq!(i32::from_scalar(Scalar::F64(-2.7)), -2);
        assert_eq!(u8::from_scalar(Scalar::I64(300)), 44);
        assert_eq!(i8::from_scalar(Scalar::I64(200)), -56);
        assert_eq!(i8::from_scalar(Scalar::F64(-300.5)), 0i64.wrapping_sub(300) as i8);
        assert_eq!(i64::from_scalar(Scalar::F64(f64::NAN)), 0);
        assert!(bool::from_scalar(Scalar::F64(0.5)));
        assert_eq!(
            f16::from_scalar(Scalar::F64(1.0 / 3.0)).to_f64(),
            f16::from_f64(1.0 / 3.0).to_f64()
        );
    }
}
