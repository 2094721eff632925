//! What the planner needs to know about a machine, as plain data.
//!
//! `ir` knows no machine: the facts that price a plan (how costly an op is to recompute, which
//! dtypes the matrix library multiplies, whether a reduction should also store the values it
//! reduces) are fields of a [`Target`], and each code generator publishes the target it
//! compiles for (`kiln_codegen::cpu::TARGET`, `kiln_codegen::cuda::TARGET`).

use crate::{BinaryOp, DType, Op, UnaryOp};

/// A machine as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// A short name for plans and debug output (`cpu`, `cuda`).
    pub name: &'static str,
    /// What computing an op once per element costs, for the recompute rule.
    pub costs: OpCosts,
    /// The dtypes the target multiplies natively (a matrix library or a loop of its own,
    /// reading strided operands); products of other dtypes run as ops of their own.
    pub gemm_dtypes: &'static [DType],
    /// Whether fused attention, a slice's gradient (`Unview`) and an `Assign` read their
    /// operands through views (strided batch entries and rows), so the heads of a projection
    /// (`narrow`, `reshape`, `transpose`) are not copied before attention, nor its gradients
    /// before they are written back into the projection's gradient.
    pub library_reads_views: bool,
    /// Whether a stored value that a reduction over trailing dimensions sums is written by
    /// that reduction's kernel (one pass computes, reduces and stores it). Worth it where
    /// recomputing is dear (a CPU); a GPU recomputes instead.
    pub reductions_store_inputs: bool,
    /// Whether the target's kernels compute an f32 `logsumexp` reduction in one pass; where
    /// not, the planner writes it as max, exp, sum and log
    /// ([`crate::passes::ExpandLogSumExp`]).
    pub fused_logsumexp: bool,
    /// Whether the executor may overwrite a stored buffer that no later step reads: an
    /// `Assign` then writes into its base's buffer, and a scatter onto a constant fills its
    /// own output instead of reading a filled one ([`crate::fuse::Step::AssignInPlace`],
    /// [`crate::fuse::Step::ScatterOntoFill`]). A GPU plan's buffers may belong to a CUDA
    /// graph's captured launches, so there it is off.
    pub writes_in_place: bool,
    /// Whether user-defined opaque ops read their operands through views of stored
    /// buffers (the CPU, whose user functions take strides); elsewhere they read dense
    /// buffers, as a GPU's user kernels do.
    pub custom_ops_read_views: bool,
}

/// Relative per-element costs of elementwise ops. The fuser recomputes a shared value in
/// each consumer when its ops cost at most [`crate::fuse::MAX_RECOMPUTE_COST`], and stores it
/// otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpCosts {
    /// `exp`, `log`, `tanh`, `sigmoid`, `sin`, `cos`, `erf`, `pow`.
    pub transcendental: usize,
    /// `sqrt`, `recip`, division.
    pub division: usize,
    /// Every other elementwise op (add, compare, cast, select, ...).
    pub arithmetic: usize,
}

impl Target {
    /// The relative cost of computing `op` once per element on this target (0 for ops that
    /// are not elementwise: they are never recomputed).
    pub fn op_cost(&self, op: &Op) -> usize {
        if !op.is_elementwise() {
            return 0;
        }
        match op {
            Op::Unary(u) if u.is_transcendental() => self.costs.transcendental,
            Op::Binary(b) if b.is_approximated() => self.costs.transcendental,
            Op::Unary(UnaryOp::Sqrt | UnaryOp::Recip) | Op::Binary(BinaryOp::Div) => {
                self.costs.division
            }
            _ => self.costs.arithmetic,
        }
    }

    /// Whether the target's matrix library multiplies `dtype`.
    pub fn has_gemm(&self, dtype: DType) -> bool {
        self.gemm_dtypes.contains(&dtype)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::{OpCosts, Target};
    use crate::DType;

    /// A CPU-like target for `ir`'s own tests (the real ones live in the code generators).
    pub(crate) const CPU: Target = Target {
        name: "test-cpu",
        costs: OpCosts { transcendental: 32, division: 4, arithmetic: 1 },
        gemm_dtypes: &[DType::F32, DType::F64, DType::F16],
        library_reads_views: true,
        reductions_store_inputs: true,
        fused_logsumexp: true,
        writes_in_place: true,
        custom_ops_read_views: true,
    };
}
