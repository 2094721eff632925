//! Loop-strategy choice: which loop a kernel gets (vectorized rows, strips over a
//! transposed read, a reduction across outputs, or scalar) and the lane types they use.

use cranelift_codegen::ir::{Type, types};
use kiln_ir::kernel::{ExprKind, Kernel};
use kiln_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::walk::Walk;
/// How a kernel's values are held in registers.
pub(super) fn scalar_type(dtype: DType) -> Type {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => types::F32,
        DType::F64 => types::F64,
        DType::I64 | DType::I32 | DType::I8 | DType::U8 => types::I64,
        DType::Bool => types::I8,
    }
}

/// The lane type when the whole kernel can run on vectors of one float type along its row
/// (every input contiguous or broadcast along the walk's innermost dimension).
pub(super) fn vector_type(kernel: &Kernel, walk: &Walk) -> Option<(DType, Type)> {
    let inner_ok = walk.strides.iter().all(|s| matches!(s.last(), Some(0 | 1)));
    lane_type(kernel).filter(|_| inner_ok)
}

/// The lane type of a kernel's loop along its rows: [`vector_type`]'s, or for an
/// elementwise kernel whose rows read an input with a stride (a transposed read, the
/// columns of a strided convolution window) vectors whose strided lanes are gathered one
/// by one and stored together, several times faster than a scalar loop.
pub(super) fn loop_lanes(kernel: &Kernel, walk: &Walk) -> Option<(DType, Type)> {
    vector_type(kernel, walk).or_else(|| {
        let gathers = kernel.reduce.is_none() && walk.dims.last().is_some_and(|&d| d >= 4);
        gathers.then(|| lane_type(kernel)).flatten()
    })
}

/// The lanes of a reduction that vectorizes across its outputs instead: its reduced walk
/// is strided (a sum over rows, `x.sum_dim(0)`), but neighbouring outputs read neighbouring
/// elements of every input.
pub(super) fn column_type(kernel: &Kernel, walk: &Walk, outer: &Walk) -> Option<(DType, Type)> {
    let red = kernel.reduce?;
    // `logsumexp` folds whole rows into one running state (`logsumexp.rs`).
    if red.op == ReduceOp::LogSumExp
        || kernel.outputs.len() != 1
        || vector_type(kernel, walk).is_some()
    {
        return None;
    }
    let (float, lanes) = lane_type(kernel)?;
    let across_ok = outer.strides.iter().all(|s| matches!(s.last(), Some(0 | 1)));
    let wide = *outer.dims.last().expect("a dimension") >= lanes.lane_count() as usize;
    (across_ok && wide).then_some((float, lanes))
}

/// Outputs per block of a reduction vectorized across its outputs (a sum over rows, whose
/// neighbouring outputs read neighbouring elements): the block's f64 accumulators live in an
/// 8 KiB stack slot, in L1, while the kernel streams the input one row segment of the block
/// (4 KiB of f32, a page) at a time.
pub const COLUMN_BLOCK: usize = 1024;

/// Rows a task of a strip-walking kernel should cover: a cache line of an input read across
/// rows serves this many of them.
pub const STRIP_ROWS: usize = 16;

/// The strip width for an elementwise kernel that reads an input across its rows (a
/// transposed view: innermost stride neither 0 nor 1, but 1 along another dimension) over
/// rows long enough to strip; `None` for kernels that walk rows in order.
pub(super) fn strip_width(kernel: &Kernel, walk: &Walk) -> Option<usize> {
    const STRIP: usize = 64;
    let inner = *walk.dims.last()?;
    let crosses = walk.strides.iter().any(|s| {
        let last = *s.last().expect("a dimension");
        last != 0 && last != 1 && s[..s.len() - 1].contains(&1)
    });
    (walk.dims.len() >= 2 && inner > STRIP && crosses && kernel.reduce.is_none()).then_some(STRIP)
}

/// The lane type when every value of the kernel is of one float type that vectorizes:
/// f64 in f64x2, or f32 in f32x4 with bf16 and f16 values alongside (held in f32 lanes, as
/// the scalar path holds them, and rounded after every op: a mixed-precision step's casts
/// and 16-bit copies then run on vectors too).
pub(super) fn lane_type(kernel: &Kernel) -> Option<(DType, Type)> {
    let first =
        kernel.inputs.first().map(|i| i.dtype).or_else(|| kernel.exprs.first().map(|e| e.dtype))?;
    let (float, lanes) = match first {
        DType::F32 | DType::BF16 | DType::F16 => (DType::F32, types::F32X4),
        DType::F64 => (DType::F64, types::F64X2),
        _ => return None,
    };
    let fits =
        |d: DType| d == float || (float == DType::F32 && matches!(d, DType::BF16 | DType::F16));
    let inputs_ok = kernel.inputs.iter().all(|i| fits(i.dtype));
    let exprs_ok = kernel.exprs.iter().all(|e| match e.kind {
        ExprKind::Load(_) | ExprKind::Param(_) => fits(e.dtype),
        ExprKind::Unary(op, _) => match op {
            UnaryOp::Not => e.dtype == DType::Bool,
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Relu
            | UnaryOp::Recip
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round => fits(e.dtype),
            // f32 polynomials; a 16-bit result is the f32 one rounded.
            UnaryOp::Exp
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Erf
            | UnaryOp::Log
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tan => fits(e.dtype) && float == DType::F32,
            // No vector polynomial: the f64 helper, one lane at a time.
            UnaryOp::Erfc => false,
        },
        ExprKind::Binary(op, a, _) => {
            let arg = kernel.exprs[a].dtype;
            match op {
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Maximum
                | BinaryOp::Minimum => fits(e.dtype),
                BinaryOp::Div => fits(e.dtype) && e.dtype.is_float(),
                BinaryOp::And | BinaryOp::Or => arg == DType::Bool,
                BinaryOp::Pow => e.dtype == DType::F32,
                // Scalar code: no vector division of integers, no vector `fmod`, and shifts
                // by a per-lane amount.
                BinaryOp::Rem
                | BinaryOp::BitAnd
                | BinaryOp::BitOr
                | BinaryOp::BitXor
                | BinaryOp::Shl
                | BinaryOp::Shr => false,
                BinaryOp::Eq
                | BinaryOp::Ne
                | BinaryOp::Lt
                | BinaryOp::Le
                | BinaryOp::Gt
                | BinaryOp::Ge => fits(arg),
            }
        }
        ExprKind::Where(_, a, _) => fits(kernel.exprs[a].dtype),
        // Between f32 and the 16-bit floats only: a widening is exact, a narrowing rounds.
        ExprKind::Cast(a) => float == DType::F32 && fits(kernel.exprs[a].dtype) && fits(e.dtype),
    });
    let outputs_ok = kernel.outputs.iter().all(|&o| fits(kernel.exprs[o].dtype));
    (inputs_ok && exprs_ok && outputs_ok).then_some((float, lanes))
}
