//! The operators beyond arithmetic, as PyTorch's: `%` is [`Tensor::remainder`] (Python's
//! `%`, the sign of the divisor), `&`, `|`, `^` the bitwise ops (logical on bools), `<<` and
//! `>>` the shifts, `!` [`Tensor::bitwise_not`] (PyTorch's `~`).
//!
//! ```
//! # use kiln::prelude::*;
//! let a = Tensor::from_vec(vec![-7i64, 12], [2]);
//! assert_eq!((&a % 3).to_vec::<i64>(), [2, 0]);
//! assert_eq!((&a & 10).to_vec::<i64>(), [8, 8]);
//! assert_eq!((&a << 1).to_vec::<i64>(), [-14, 24]);
//! assert_eq!((!&a).to_vec::<i64>(), [6, -13]);
//! ```

use std::ops;

use super::Tensor;

macro_rules! method_operator {
    ($trait:ident, $method:ident, $call:ident, $($scalar:ty),*) => {
        impl ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.$call(rhs)
            }
        }
        impl ops::$trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.$call(rhs)
            }
        }
        impl ops::$trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.$call(rhs)
            }
        }
        impl ops::$trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.$call(rhs)
            }
        }
        $(
            impl ops::$trait<$scalar> for &Tensor {
                type Output = Tensor;
                #[track_caller]
                fn $method(self, rhs: $scalar) -> Tensor {
                    self.$call(rhs)
                }
            }
            impl ops::$trait<$scalar> for Tensor {
                type Output = Tensor;
                #[track_caller]
                fn $method(self, rhs: $scalar) -> Tensor {
                    self.$call(rhs)
                }
            }
        )*
    };
}

// As the arithmetic operators, only f64 and i64 literals (a second type of each would make
// an unsuffixed literal ambiguous); the bitwise ones take integers.
method_operator!(Rem, rem, remainder, f64, i64);
method_operator!(BitAnd, bitand, bitwise_and, i64, bool);
method_operator!(BitOr, bitor, bitwise_or, i64, bool);
method_operator!(BitXor, bitxor, bitwise_xor, i64, bool);
method_operator!(Shl, shl, bitwise_left_shift, i64);
method_operator!(Shr, shr, bitwise_right_shift, i64);

impl ops::Not for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        self.bitwise_not()
    }
}

impl ops::Not for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        self.bitwise_not()
    }
}
