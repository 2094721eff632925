//! Every variant of the elementwise and reduction op enums, as tables (`UnaryOp::ALL`, ...),
//! each checked against an exhaustive match: a new variant does not compile until it has a
//! position, and the test then finds it missing from its table.

use crate::{BinaryOp, ReduceOp, UnaryOp};

impl UnaryOp {
    /// Every unary op, in declaration order.
    pub const ALL: [UnaryOp; 18] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tan,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
        UnaryOp::Recip,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Not,
        UnaryOp::Erfc,
    ];
}

impl BinaryOp {
    /// Every binary op, in declaration order.
    pub const ALL: [BinaryOp; 21] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Rem,
        BinaryOp::BitAnd,
        BinaryOp::BitOr,
        BinaryOp::BitXor,
        BinaryOp::Shl,
        BinaryOp::Shr,
    ];
}

impl ReduceOp {
    /// Every reduction, in declaration order.
    pub const ALL: [ReduceOp; 7] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::LogSumExp,
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
    ];
}

/// Each op's place in its table: exhaustive, so a new op must be given one.
#[cfg(test)]
fn unary_position(op: UnaryOp) -> usize {
    match op {
        UnaryOp::Neg => 0,
        UnaryOp::Abs => 1,
        UnaryOp::Sqrt => 2,
        UnaryOp::Exp => 3,
        UnaryOp::Log => 4,
        UnaryOp::Sin => 5,
        UnaryOp::Cos => 6,
        UnaryOp::Tan => 7,
        UnaryOp::Tanh => 8,
        UnaryOp::Sigmoid => 9,
        UnaryOp::Relu => 10,
        UnaryOp::Erf => 11,
        UnaryOp::Recip => 12,
        UnaryOp::Floor => 13,
        UnaryOp::Ceil => 14,
        UnaryOp::Round => 15,
        UnaryOp::Not => 16,
        UnaryOp::Erfc => 17,
    }
}

/// Each op's place in its table: exhaustive, so a new op must be given one.
#[cfg(test)]
fn binary_position(op: BinaryOp) -> usize {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Pow => 4,
        BinaryOp::Maximum => 5,
        BinaryOp::Minimum => 6,
        BinaryOp::Eq => 7,
        BinaryOp::Ne => 8,
        BinaryOp::Lt => 9,
        BinaryOp::Le => 10,
        BinaryOp::Gt => 11,
        BinaryOp::Ge => 12,
        BinaryOp::And => 13,
        BinaryOp::Or => 14,
        BinaryOp::Rem => 15,
        BinaryOp::BitAnd => 16,
        BinaryOp::BitOr => 17,
        BinaryOp::BitXor => 18,
        BinaryOp::Shl => 19,
        BinaryOp::Shr => 20,
    }
}

/// Each op's place in its table: exhaustive, so a new op must be given one.
#[cfg(test)]
fn reduce_position(op: ReduceOp) -> usize {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::LogSumExp => 4,
        ReduceOp::ArgMax => 5,
        ReduceOp::ArgMin => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_op_tables_hold_every_op_in_its_place() {
        for (i, &op) in UnaryOp::ALL.iter().enumerate() {
            assert_eq!(unary_position(op), i, "{op:?}");
        }
        for (i, &op) in BinaryOp::ALL.iter().enumerate() {
            assert_eq!(binary_position(op), i, "{op:?}");
        }
        for (i, &op) in ReduceOp::ALL.iter().enumerate() {
            assert_eq!(reduce_position(op), i, "{op:?}");
        }
    }
}
