//! Shape and dtype inference of the product ops: matrix products and fused attention.

use crate::{DType, IrError, Op, Shape};

/// The result of [`Op::Attention`] (`[N, L, Ev]`) or [`Op::AttentionGrad`] (packed).
pub(crate) fn infer_attention_op(
    op: &Op,
    inputs: &[(&Shape, DType)],
) -> Result<(Shape, DType), IrError> {
    let name = op.name();
    let (n, l, e, s, ev) = infer_attention(name, &inputs[..3])?;
    if let Op::AttentionGrad { .. } = op {
        if inputs[3] != (&Shape::new(vec![n, l, ev]), inputs[0].1) {
            return Err(IrError::InvalidGraph(format!(
                "attention_grad's output gradient is {} {}, not [{n}, {l}, {ev}]",
                inputs[3].0, inputs[3].1
            )));
        }
        return Ok((Shape::new(vec![n, l * e + s * e + s * ev]), inputs[0].1));
    }
    Ok((Shape::new(vec![n, l, ev]), inputs[0].1))
}

/// `(N, L, E, S, Ev)` of dense attention operands `q [N, L, E]`, `k [N, S, E]`,
/// `v [N, S, Ev]` of one float dtype.
fn infer_attention(
    op: &'static str,
    inputs: &[(&Shape, DType)],
) -> Result<(usize, usize, usize, usize, usize), IrError> {
    let [(q, dq), (k, dk), (v, dv)] = inputs else {
        return Err(IrError::InvalidGraph(format!("{op} takes q, k and v")));
    };
    if !(dq.is_float() && dq == dk && dq == dv) {
        return Err(IrError::dtype(
            op,
            format!("takes q, k, v of one float dtype, got {dq}, {dk}, {dv}"),
        ));
    }
    let fits = q.rank() == 3
        && k.rank() == 3
        && v.rank() == 3
        && q.dims()[0] == k.dims()[0]
        && k.dims()[0] == v.dims()[0]
        && q.dims()[2] == k.dims()[2]
        && k.dims()[1] == v.dims()[1];
    if !fits {
        return Err(IrError::shape(
            op,
            format!("needs q [N, L, E], k [N, S, E], v [N, S, Ev], got {q}, {k}, {v}"),
        ));
    }
    Ok((q.dims()[0], q.dims()[1], q.dims()[2], k.dims()[1], v.dims()[2]))
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
