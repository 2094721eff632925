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
    let (Op::Attention { mask, .. } | Op::AttentionGrad { mask, .. }) = op else {
        unreachable!("infer_attention_op infers the attention ops")
    };
    if *mask == AttentionMask::Given {
        let mut want = out.dims().to_vec();
        *want.last_mut().expect("the output has rank 3 or more") = s;
        let (shape, dtype) = inputs[inputs.len() - 1];
        if (shape.dims(), dtype) != (&want[..], DType::Bool) {
            return Err(IrError::shape(
                name,
                format!(
                    "takes a bool mask {} after q, k, v (and dout), got {shape} {dtype}",
                    Shape::new(want)
                ),
            ));
        }
    }
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

/// Which keys each query of fused attention sees ([`Op::Attention`]), for `L` queries and
/// `S` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionMask {
    /// Every key.
    None,
    /// Query `i` sees keys `0..=i`: the causal triangle from the upper-left corner
    /// (PyTorch's `is_causal`).
    Causal,
    /// Query `i` sees keys `0..=i + S - L`: the triangle from the lower-right corner, for
    /// queries that are the last `L` of `S` positions (a chunk after cached keys). A query
    /// with `i + S - L < 0` sees none.
    CausalLowerRight,
    /// A bool operand after `v` (and the output gradient), `[.., L, S]` with the batch
    /// dimensions of `q`: `true` where the query sees the key, within every key.
    Given,
}

impl AttentionMask {
    /// How many operands the mask adds to the op's: 1 for a [`AttentionMask::Given`] mask.
    pub fn operands(self) -> usize {
        usize::from(self == AttentionMask::Given)
    }

    /// The keys query `i` may see, `0..end`, of `s` keys for `l` queries (a given mask
    /// may hide some of them).
    pub fn keys_of(self, i: usize, l: usize, s: usize) -> usize {
        match self {
            AttentionMask::None | AttentionMask::Given => s,
            AttentionMask::Causal => (i + 1).min(s),
            AttentionMask::CausalLowerRight => (i + 1 + s).saturating_sub(l).min(s),
        }
    }

    /// The first query that may see key `j` (of `s` keys, for `l` queries): the queries
    /// before it see no key at or after `j`.
    pub fn first_query(self, j: usize, l: usize, s: usize) -> usize {
        match self {
            AttentionMask::None | AttentionMask::Given => 0,
            AttentionMask::Causal => j.min(l),
            AttentionMask::CausalLowerRight => (j + l).saturating_sub(s).min(l),
        }
    }
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
