//! Kernel IR: one fused elementwise kernel, described without reference to any machine.
//!
//! A kernel iterates over a domain (a shape). Each input is a buffer read through a strided
//! index map ([`View`]) over that domain, so broadcasts, permutes and slices cost index
//! arithmetic, not copies. The body is a list of scalar expressions in SSA form; each output
//! is one expression stored densely in row-major order. Scalar constants are kernel
//! *parameters*, passed when the kernel runs, so a value that changes every step (a learning
//! rate) does not change the code or its cache key. The kernel itself (`Hash + Eq`) is the
//! compile-cache key.

use std::fmt;

use crate::semantics::{binary_any, cast, round, unary_any};
use crate::{BinaryOp, DType, ReduceOp, Scalar, Shape, UnaryOp, View};

/// A buffer a kernel reads.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelInput {
    /// The element type.
    pub dtype: DType,
    /// Where each element of the domain is read (shape = the kernel's domain).
    pub view: View,
}

/// One scalar operation of a kernel's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExprKind {
    /// The element of input `i` at the current position.
    Load(usize),
    /// Parameter `i`, converted to the expression's dtype.
    Param(usize),
    /// A function of one value.
    Unary(UnaryOp, usize),
    /// A function of two values of one dtype.
    Binary(BinaryOp, usize, usize),
    /// `if c { a } else { b }`.
    Where(usize, usize, usize),
    /// A conversion to the expression's dtype.
    Cast(usize),
}

/// An expression and the dtype of its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Expr {
    /// What is computed.
    pub kind: ExprKind,
    /// The value's dtype.
    pub dtype: DType,
}

/// A fused elementwise kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// The iteration domain: every output's shape.
    pub shape: Shape,
    /// The buffers read.
    pub inputs: Vec<KernelInput>,
    /// The body, in dependency order: an expression refers only to earlier ones.
    pub exprs: Vec<Expr>,
    /// The expressions stored, each densely in row-major order.
    pub outputs: Vec<usize>,
    /// How many parameters the body reads.
    pub params: usize,
    /// For a reduction kernel: what reduces the first output expression over the domain's
    /// trailing dimensions. Further outputs of a reduction kernel are stored unreduced, one
    /// element per domain position (the value being summed, kept for a later kernel).
    pub reduce: Option<KernelReduce>,
}

/// The reduction of a reduction kernel. The domain is `[kept.., reduced..]`: the body is
/// evaluated at every position, and its values are combined over the trailing dimensions
/// into one output element per position of the leading `kept` dimensions (row-major).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelReduce {
    /// `Sum`, `Prod`, `Max`, `Min` or `LogSumExp`.
    pub op: ReduceOp,
    /// How many leading dimensions of the domain index the output.
    pub kept: usize,
}

impl Kernel {
    /// The number of output elements: the domain's size, or for a reduction the size of its
    /// kept dimensions.
    pub fn output_len(&self) -> usize {
        match self.reduce {
            Some(r) => self.shape.dims()[..r.kept].iter().product(),
            None => self.shape.numel(),
        }
    }

    /// The number of elements of each output: [`Kernel::output_len`] for the first, and for
    /// the others the domain's size.
    pub fn output_lens(&self) -> Vec<usize> {
        (0..self.outputs.len())
            .map(|i| if i == 0 { self.output_len() } else { self.shape.numel() })
            .collect()
    }

    /// A short stable name for logs and generated symbols: `k_` and 16 hex digits of a
    /// hash of the kernel's text (which holds everything that changes the code).
    pub fn name(&self) -> String {
        format!("k_{:016x}", fnv1a(self.to_string().as_bytes()))
    }

    /// The number of scalar ops in the body (loads and parameters excluded).
    pub fn op_count(&self) -> usize {
        self.exprs
            .iter()
            .filter(|e| !matches!(e.kind, ExprKind::Load(_) | ExprKind::Param(_)))
            .count()
    }
}

/// 64-bit FNV-1a: stable across runs and platforms (unlike `std`'s hasher).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernel over {} ({} params)", self.shape, self.params)?;
        if let Some(r) = self.reduce {
            writeln!(f, "  {} over dims {}..", r.op.name(), r.kept)?;
        }
        for (i, input) in self.inputs.iter().enumerate() {
            writeln!(
                f,
                "  in{i}: {} strides {:?} offset {}",
                input.dtype,
                input.view.strides(),
                input.view.offset()
            )?;
        }
        for (i, e) in self.exprs.iter().enumerate() {
            let body = match e.kind {
                ExprKind::Load(k) => format!("load in{k}"),
                ExprKind::Param(k) => format!("param{k}"),
                ExprKind::Unary(op, a) => format!("{} %{a}", op.name()),
                ExprKind::Binary(op, a, b) => format!("{} %{a}, %{b}", op.name()),
                ExprKind::Where(c, a, b) => format!("where %{c}, %{a}, %{b}"),
                ExprKind::Cast(a) => format!("cast %{a}"),
            };
            writeln!(f, "  %{i}: {} = {body}", e.dtype)?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| format!("%{o}")).collect();
        write!(f, "  out: {}", outs.join(", "))
    }
}

/// Evaluates a kernel in f64 (integers in i64 through f64, which is exact for the values
/// kernels see in tests): the oracle for generated code. `inputs[i]` is input `i`'s buffer
/// as f64; `params` are the parameter values. Returns each output's values.
pub fn interpret(kernel: &Kernel, inputs: &[Vec<f64>], params: &[Scalar]) -> Vec<Vec<f64>> {
    let n = kernel.shape.numel();
    let mut outs = vec![Vec::with_capacity(n); kernel.outputs.len()];
    let per_output = match kernel.reduce {
        Some(r) => kernel.shape.dims()[r.kept..].iter().product::<usize>(),
        None => 1,
    };
    let offsets: Vec<Vec<usize>> =
        kernel.inputs.iter().map(|i| i.view.offsets().collect()).collect();
    let mut vals = vec![0.0f64; kernel.exprs.len()];
    for pos in 0..n {
        for (i, e) in kernel.exprs.iter().enumerate() {
            let v = match e.kind {
                ExprKind::Load(k) => inputs[k][offsets[k][pos]],
                ExprKind::Param(k) => round(e.dtype, params[k].to_f64()),
                ExprKind::Unary(op, a) => unary_any(op, vals[a], e.dtype),
                ExprKind::Binary(op, a, b) => {
                    binary_any(op, vals[a], vals[b], kernel.exprs[a].dtype)
                }
                ExprKind::Where(c, a, b) => {
                    if vals[c] != 0.0 {
                        vals[a]
                    } else {
                        vals[b]
                    }
                }
                ExprKind::Cast(a) => cast(vals[a], kernel.exprs[a].dtype, e.dtype),
            };
            vals[i] = round(e.dtype, v);
        }
        for (o, &e) in outs.iter_mut().zip(&kernel.outputs) {
            o.push(vals[e]);
        }
    }
    match kernel.reduce {
        None => outs,
        Some(r) => {
            let dtype = kernel.exprs[kernel.outputs[0]].dtype;
            let count = kernel.output_len();
            let values = std::mem::take(&mut outs[0]);
            let reduced = (0..count)
                .map(|o| {
                    let items = &values[o * per_output..(o + 1) * per_output];
                    let v = match r.op {
                        ReduceOp::Sum => items.iter().sum(),
                        ReduceOp::Prod => items.iter().product(),
                        ReduceOp::Max if items.iter().any(|v| v.is_nan()) => f64::NAN,
                        ReduceOp::Min if items.iter().any(|v| v.is_nan()) => f64::NAN,
                        ReduceOp::Max => items.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                        ReduceOp::Min => items.iter().copied().fold(f64::INFINITY, f64::min),
                        ReduceOp::LogSumExp => crate::semantics::logsumexp(items.iter().copied()),
                        ReduceOp::ArgMax | ReduceOp::ArgMin => {
                            unreachable!("arg reductions are not kernels")
                        }
                    };
                    round(dtype, v)
                })
                .collect();
            vec![reduced]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_names_are_stable() {
        let k = Kernel {
            shape: Shape::from([2, 3]),
            inputs: vec![KernelInput {
                dtype: DType::F32,
                view: View::contiguous(Shape::from([3])).expand(&Shape::from([2, 3])),
            }],
            exprs: vec![
                Expr { kind: ExprKind::Load(0), dtype: DType::F32 },
                Expr { kind: ExprKind::Param(0), dtype: DType::F32 },
                Expr { kind: ExprKind::Binary(BinaryOp::Mul, 0, 1), dtype: DType::F32 },
            ],
            outputs: vec![2],
            params: 1,
            reduce: None,
        };
        assert_eq!(
            k.to_string(),
            "kernel over [2, 3] (1 params)\n  in0: f32 strides [0, 1] offset 0\n  %0: f32 = load in0\n  %1: f32 = param0\n  %2: f32 = mul %0, %1\n  out: %2"
        );
        assert_eq!(k.name(), k.clone().name());
        let out = interpret(&k, &[vec![1.0, 2.0, 3.0]], &[Scalar::F64(2.0)]);
        assert_eq!(out, vec![vec![2.0, 4.0, 6.0, 2.0, 4.0, 6.0]]);
    }
}
