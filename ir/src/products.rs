//! Shape and dtype inference of the product ops: matrix products and fused attention.

use crate::{DType, IrError, Op, Shape};

/// The result of [`Op::Attention`] (`[.., L, Ev]`) or [`Op::AttentionGrad`] (packed).
pub(crate) fn infer_attention_op(
    op: &Op,
    inputs: &[(&Shape, DType)],
) -> Result<(Shape, DType), IrError> {
    let name = op.name();
    let AttentionDims { n, l, e, s, ev } = infer_attention(name, &inputs[..3])?;
    let q = inputs[0].0.dims();
    let mut out = q[..q.len() - 2].to_vec();
    out.extend([l, ev]);
    let out = Shape::new(out);
    if let Op::AttentionGrad { .. } = op {
        if inputs[3] != (&out, inputs[0].1) {
            return Err(IrError::InvalidGraph(format!(
                "attention_grad's output gradient is {} {}, not {out}",
                inputs[3].0, inputs[3].1
            )));
        }
        return Ok((Shape::new(vec![n, l * e + s * e + s * ev]), inputs[0].1));
    }
    Ok((out, inputs[0].1))
}

/// The sizes of an attention problem: `q [.., L, E]`, `k [.., S, E]`, `v [.., S, Ev]` with
/// `N` batch entries (the product of the leading dimensions, which the three share).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Batch entries.
    pub n: usize,
    /// Queries per entry.
    pub l: usize,
    /// Query and key features.
    pub e: usize,
    /// Keys per entry.
    pub s: usize,
    /// Value features.
    pub ev: usize,
}

impl AttentionDims {
    /// The sizes of attention over operands of shapes `q`, `k` and `v`, which the op's
    /// inference has accepted.
    pub fn of(q: &Shape, k: &Shape, v: &Shape) -> AttentionDims {
        let (q, k, v) = (q.dims(), k.dims(), v.dims());
        let r = q.len();
        AttentionDims {
            n: q[..r - 2].iter().product(),
            l: q[r - 2],
            e: q[r - 1],
            s: k[r - 2],
            ev: v[r - 1],
        }
    }
}

/// The sizes of attention operands `q [.., L, E]`, `k [.., S, E]`, `v [.., S, Ev]` of one
/// float dtype, with the same leading (batch) dimensions.
fn infer_attention(op: &'static str, inputs: &[(&Shape, DType)]) -> Result<AttentionDims, IrError> {
    let [(q, dq), (k, dk), (v, dv)] = inputs else {
        return Err(IrError::InvalidGraph(format!("{op} takes q, k and v")));
    };
    if !(dq.is_float() && dq == dk && dq == dv) {
        return Err(IrError::dtype(
            op,
            format!("takes q, k, v of one float dtype, got {dq}, {dk}, {dv}"),
        ));
    }
    let r = q.rank();
    let fits = r >= 3
        && k.rank() == r
        && v.rank() == r
        && q.dims()[..r - 2] == k.dims()[..r - 2]
        && k.dims()[..r - 2] == v.dims()[..r - 2]
        && q.dims()[r - 1] == k.dims()[r - 1]
        && k.dims()[r - 2] == v.dims()[r - 2];
    if !fits {
        return Err(IrError::shape(
            op,
            format!(
                "needs q [.., L, E], k [.., S, E], v [.., S, Ev] with the same batch \
                 dimensions, got {q}, {k}, {v}"
            ),
        ));
    }
    Ok(AttentionDims::of(q, k, v))
}

pub(crate) fn infer_matmul(inputs: &[(&Shape, DType)]) -> Result<(Shape, DType), IrError> {
    let (sa, da) = inputs[0];
    let (sb, db) = inputs[1];
    if da != db {
        return Err(IrError::dtype(
            "matmul",
            format!("operands have dtypes {da} and {db}; cast one of them so they agree"),
        ));
    }
    if da == DType::Bool {
        return Err(IrError::dtype("matmul", "is not defined for bool operands"));
    }
    let (ra, rb) = (sa.rank(), sb.rank());
    if ra < 2 || ra != rb || sa.dims()[..ra - 2] != sb.dims()[..rb - 2] {
        return Err(IrError::shape(
            "matmul",
            format!("batched operands {sa} and {sb} need equal batch dimensions"),
        ));
    }
    let (m, k) = (sa.dims()[ra - 2], sa.dims()[ra - 1]);
    let (k2, n) = (sb.dims()[rb - 2], sb.dims()[rb - 1]);
    if k != k2 {
        return Err(IrError::shape(
            "matmul",
            format!("shapes {sa} and {sb} are not compatible: {k} != {k2}"),
        ));
    }
    let mut dims = sa.dims()[..ra - 2].to_vec();
    dims.extend([m, n]);
    Ok((Shape::new(dims), da))
}
