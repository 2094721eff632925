//! Elementwise loops: rows (vectorized with a scalar tail) or strips of rows, and the
//! addressing of inputs along them.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{Block, BlockArg, InstBuilder, Type, Value, types};
use kiln_ir::DType;

use super::staging::At;
use super::translate::{Prologue, Translator, VecSrc};
use crate::walk::Sz;
impl<'b> Translator<'_, 'b> {
    pub(super) fn body(&mut self) {
        let pro = self.prologue();
        let (start, end) = (pro.start, pro.end);
        let inner = self.walk.inner();
        let exit = self.b.create_block();
        match self.strip {
            None => {
                // Positions in order: each row's piece of the range, one after another.
                let head = self.b.create_block();
                let i_var = self.b.append_block_param(head, types::I64);
                let row = self.b.create_block();
                self.b.ins().jump(head, &[BlockArg::Value(start)]);
                self.b.switch_to_block(head);
                let more = self.b.ins().icmp(IntCC::UnsignedLessThan, i_var, end);
                self.b.ins().brif(more, row, &[], exit, &[]);
                self.b.switch_to_block(row);
                let inner_v = self.size(inner);
                let (_, j0) = self.divrem(i_var, inner);
                let left = self.b.ins().isub(end, i_var);
                let reach = self.b.ins().iadd(j0, left);
                let jend = self.b.ins().umin(reach, inner_v);
                self.piece(&pro, i_var, j0, jend);
                let done = self.b.ins().isub(jend, j0);
                let i_next = self.b.ins().iadd(i_var, done);
                self.b.ins().jump(head, &[BlockArg::Value(i_next)]);
            }
            Some(strip) => {
                // Strips of columns, each over all the range's rows: an input read across
                // the rows (a transpose) then reuses each cache line for the next rows
                // instead of fetching a line per element.
                let outer_head = self.b.create_block();
                let s = self.b.append_block_param(outer_head, types::I64);
                let strip_body = self.b.create_block();
                let empty = self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, start, end);
                let zero = self.iconst(0);
                let first = self.b.create_block();
                self.b.ins().brif(empty, exit, &[], first, &[]);
                self.b.switch_to_block(first);
                let inner_v = self.size(inner);
                let r_first = self.b.ins().udiv(start, inner_v);
                let last = self.b.ins().iadd_imm_s(end, -1);
                let r_last = self.b.ins().udiv(last, inner_v);
                self.b.ins().jump(outer_head, &[BlockArg::Value(zero)]);
                self.b.switch_to_block(outer_head);
                let more = self.b.ins().icmp(IntCC::SignedLessThan, s, inner_v);
                self.b.ins().brif(more, strip_body, &[], exit, &[]);
                self.b.switch_to_block(strip_body);
                let s_end = self.b.ins().iadd_imm_s(s, strip as i64);
                let s_end = self.b.ins().umin(s_end, inner_v);
                let row_head = self.b.create_block();
                let r = self.b.append_block_param(row_head, types::I64);
                let row_body = self.b.create_block();
                let strip_done = self.b.create_block();
                self.b.ins().jump(row_head, &[BlockArg::Value(r_first)]);
                self.b.switch_to_block(row_head);
                let more = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, r, r_last);
                self.b.ins().brif(more, row_body, &[], strip_done, &[]);
                self.b.switch_to_block(row_body);
                // This row's part of the strip, clipped to the range.
                let row_start = self.b.ins().imul(r, inner_v);
                let lo = self.b.ins().iadd(row_start, s);
                let lo = self.b.ins().umax(lo, start);
                let hi = self.b.ins().iadd(row_start, s_end);
                let hi = self.b.ins().umin(hi, end);
                let nonempty = self.b.ins().icmp(IntCC::UnsignedLessThan, lo, hi);
                let work = self.b.create_block();
                let next_row = self.b.create_block();
                self.b.ins().brif(nonempty, work, &[], next_row, &[]);
                self.b.switch_to_block(work);
                let j0 = self.b.ins().isub(lo, row_start);
                let jend = self.b.ins().isub(hi, row_start);
                self.piece(&pro, lo, j0, jend);
                self.b.ins().jump(next_row, &[]);
                self.b.switch_to_block(next_row);
                let r_next = self.b.ins().iadd_imm_s(r, 1);
                self.b.ins().jump(row_head, &[BlockArg::Value(r_next)]);
                self.b.switch_to_block(strip_done);
                self.b.ins().jump(outer_head, &[BlockArg::Value(s_end)]);
            }
        }
        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    /// Computes positions `i_var..` of one row, from column `j0` to `jend`: locates the row
    /// and every input's base, runs the vector loop and the scalar tail, and leaves the
    /// builder in a block after them.
    pub(super) fn piece(&mut self, pro: &Prologue, i_var: Value, j0: Value, jend: Value) {
        let k = self.kernel;
        let (ins, outs) = (&pro.ins, &pro.outs);
        let (param_scalar, param_vector) = (&pro.param_scalar, &pro.param_vector);
        let n_in = ins.len();
        let dims = self.walk.dims.clone();
        let inner = *dims.last().expect("at least one dimension");
        let (row_index, _) = self.divrem(i_var, inner);
        // Coordinates of the row in the outer dimensions, innermost first.
        let mut coords = Vec::new();
        let mut rest = row_index;
        for &d in dims[..dims.len() - 1].iter().rev() {
            let (q, r) = self.divrem(rest, d);
            coords.push(r);
            rest = q;
        }
        coords.reverse();
        let mut bases = Vec::with_capacity(n_in);
        for (idx, input) in k.inputs.iter().enumerate() {
            let mut off = self.size(self.walk.offsets[idx]);
            for (c, &s) in coords.iter().zip(&self.walk.strides[idx].clone()) {
                let scaled = self.mul_size(*c, s, 1);
                off = self.b.ins().iadd(off, scaled);
            }
            let bytes = self.b.ins().imul_imm_s(off, input.dtype.size_in_bytes() as i64);
            bases.push(self.b.ins().iadd(ins[idx], bytes));
        }
        let row_start = self.b.ins().isub(i_var, j0);
        let out_bases: Vec<Value> = k
            .outputs
            .iter()
            .zip(outs)
            .map(|(&o, &p)| {
                let bytes =
                    self.b.ins().imul_imm_s(row_start, k.exprs[o].dtype.size_in_bytes() as i64);
                self.b.ins().iadd(p, bytes)
            })
            .collect();

        let scalar_head = self.b.create_block();
        let j_scalar = self.b.append_block_param(scalar_head, types::I64);
        let row_done = self.b.create_block();

        if let Some((_, lanes)) = self.vector.filter(|_| self.staging.is_some()) {
            self.staged_vectors(&bases, &out_bases, j0, jend, scalar_head, param_vector, lanes);
        } else if let Some((_, lanes)) = self.vector {
            let width = i64::from(lanes.lane_count());
            let (splats, starts, steps) = self.row_pointers(&bases, &out_bases, j0, lanes);
            let n_in_ptrs = starts.len() - k.outputs.len();
            let vec_head = self.b.create_block();
            let jv = self.b.append_block_param(vec_head, types::I64);
            let ptrs = self.carried(vec_head, starts.len());
            let vec_body = self.b.create_block();
            let mut args = vec![BlockArg::Value(j0)];
            args.extend(starts.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vec_head, &args);
            self.b.switch_to_block(vec_head);
            let next = self.b.ins().iadd_imm_s(jv, width);
            let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, jend);
            self.b.ins().brif(fits, vec_body, &[], scalar_head, &[BlockArg::Value(jv)]);
            self.b.switch_to_block(vec_body);
            let at = At { j: jv, first: j0, end: jend, splats: &splats, ptrs: &ptrs[..n_in_ptrs] };
            let values = self.vector_at(&at, param_vector, lanes);
            for (o, &e) in k.outputs.iter().enumerate() {
                self.store_vector(values[e], k.exprs[e].dtype, ptrs[n_in_ptrs + o]);
            }
            let mut loop_args = vec![BlockArg::Value(next)];
            let advanced = self.advance_ptrs(&ptrs, &steps);
            loop_args.extend(advanced.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vec_head, &loop_args);
        } else {
            self.b.ins().jump(scalar_head, &[BlockArg::Value(j0)]);
        }

        // scalar_head(j): while j < jend
        self.b.switch_to_block(scalar_head);
        let scalar_body = self.b.create_block();
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, j_scalar, jend);
        self.b.ins().brif(go, scalar_body, &[], row_done, &[]);
        self.b.switch_to_block(scalar_body);
        let values = self.compute_scalar(j_scalar, &bases, param_scalar);
        for (o, &e) in k.outputs.iter().enumerate() {
            let dtype = k.exprs[e].dtype;
            let off = self.b.ins().imul_imm_s(j_scalar, dtype.size_in_bytes() as i64);
            let addr = self.b.ins().iadd(out_bases[o], off);
            self.store(values[e], dtype, addr);
        }
        let j_next = self.b.ins().iadd_imm_s(j_scalar, 1);
        self.b.ins().jump(scalar_head, &[BlockArg::Value(j_next)]);

        self.b.switch_to_block(row_done);
    }

    /// A row's vector loop state from column `j0`: the splats of inputs constant along the
    /// row, the first addresses of the moving inputs and then of the outputs, and how far
    /// each address moves per vector.
    fn row_pointers(
        &mut self,
        bases: &[Value],
        out_bases: &[Value],
        j0: Value,
        lanes: Type,
    ) -> (Vec<Option<Value>>, Vec<Value>, Vec<i64>) {
        let k = self.kernel;
        let width = i64::from(lanes.lane_count());
        let (splats, mut starts) = self.vector_row(bases, j0, lanes);
        for (&o, &base) in k.outputs.iter().zip(out_bases) {
            let off = self.b.ins().imul_imm_s(j0, k.exprs[o].dtype.size_in_bytes() as i64);
            starts.push(self.b.ins().iadd(base, off));
        }
        let mut steps = self.input_steps(&splats, lanes);
        steps.extend(k.outputs.iter().map(|&e| width * k.exprs[e].dtype.size_in_bytes() as i64));
        (splats, starts, steps)
    }

    /// The vector part of a row whose kernel has staged ops ([`Self::piece`]'s `j0..jend`,
    /// jumping to `tail` with the first element left): a block at a time, the staged ops
    /// over the block and then a loop over its vectors that reads their results, so the
    /// inner loop checks no block boundary.
    #[allow(clippy::too_many_arguments, reason = "the row's addresses and bounds")]
    fn staged_vectors(
        &mut self,
        bases: &[Value],
        out_bases: &[Value],
        j0: Value,
        jend: Value,
        tail: Block,
        param_vector: &std::collections::HashMap<usize, Value>,
        lanes: Type,
    ) {
        let k = self.kernel;
        let width = i64::from(lanes.lane_count());
        let (splats, starts, steps) = self.row_pointers(bases, out_bases, j0, lanes);
        let n_in_ptrs = starts.len() - k.outputs.len();

        // block_head(jb, pointers): a block of whole vectors from jb, or the tail.
        let block_head = self.b.create_block();
        let jb = self.b.append_block_param(block_head, types::I64);
        let ptrs = self.carried(block_head, starts.len());
        let block_body = self.b.create_block();
        let mut args = vec![BlockArg::Value(j0)];
        args.extend(starts.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(block_head, &args);
        self.b.switch_to_block(block_head);
        let next = self.b.ins().iadd_imm_s(jb, width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, jend);
        self.b.ins().brif(fits, block_body, &[], tail, &[BlockArg::Value(jb)]);
        self.b.switch_to_block(block_body);
        let left = self.b.ins().isub(jend, jb);
        let most = self.iconst(super::staging::BLOCK);
        let n = self.b.ins().umin(left, most);
        let n = self.b.ins().band_imm_s(n, !(width - 1));
        self.stage_block(&splats, &ptrs[..n_in_ptrs], n, param_vector, lanes);

        // vec_head(t, pointers): the block's vectors.
        let vec_head = self.b.create_block();
        let t = self.b.append_block_param(vec_head, types::I64);
        let vptrs = self.carried(vec_head, starts.len());
        let vec_body = self.b.create_block();
        let block_done = self.b.create_block();
        let zero = self.iconst(0);
        let mut args = vec![BlockArg::Value(zero)];
        args.extend(ptrs.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(vec_head, &args);
        self.b.switch_to_block(vec_head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, t, n);
        self.b.ins().brif(more, vec_body, &[], block_done, &[]);
        self.b.switch_to_block(vec_body);
        self.read_staged(t);
        let srcs = self.vector_srcs(&splats, &vptrs[..n_in_ptrs]);
        let values = self.compute_vector(&srcs, param_vector, lanes);
        self.stage_mode = super::staging::Mode::Inline;
        for (o, &e) in k.outputs.iter().enumerate() {
            self.store_vector(values[e], k.exprs[e].dtype, vptrs[n_in_ptrs + o]);
        }
        let advanced = self.advance_ptrs(&vptrs, &steps);
        let t_next = self.b.ins().iadd_imm_s(t, width);
        let mut args = vec![BlockArg::Value(t_next)];
        args.extend(advanced.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(vec_head, &args);

        self.b.switch_to_block(block_done);
        let jb_next = self.b.ins().iadd(jb, n);
        let mut args = vec![BlockArg::Value(jb_next)];
        args.extend(vptrs.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(block_head, &args);
    }

    /// Byte addresses of each input at coordinates `coords` of `dims` (flat index `index`)
    /// added to `starts`.
    pub(super) fn advance(
        &mut self,
        starts: &[Value],
        index: Value,
        dims: &[Sz],
        strides: &[Vec<Sz>],
    ) -> Vec<Value> {
        let mut coords = Vec::new();
        let mut rest = index;
        for &d in dims.iter().rev() {
            let (q, r) = self.divrem(rest, d);
            coords.push(r);
            rest = q;
        }
        coords.reverse();
        starts
            .iter()
            .enumerate()
            .map(|(idx, &start)| {
                let size = self.kernel.inputs[idx].dtype.size_in_bytes() as i64;
                let mut addr = start;
                for (c, &s) in coords.iter().zip(&strides[idx]) {
                    let off = self.mul_size(*c, s, size);
                    addr = self.b.ins().iadd(addr, off);
                }
                addr
            })
            .collect()
    }

    /// Stores the vector values of a reduction's unreduced outputs at column `j` of the row
    /// whose start each `side` entry holds (their dtype is the lanes' own, as `lane_type`
    /// requires of every output).
    pub(super) fn store_side_vectors(
        &mut self,
        side: &[(usize, DType, Value)],
        values: &[Value],
        j: Value,
    ) {
        for &(e, dtype, base) in side {
            let off = self.b.ins().imul_imm_s(j, dtype.size_in_bytes() as i64);
            let addr = self.b.ins().iadd(base, off);
            self.store_vector(values[e], dtype, addr);
        }
    }

    /// How the vector loop of a row reads each input: inputs constant along the row are
    /// loaded and splatted once, here (in the row's block); the others are read through
    /// pointers that the loop carries and advances, starting at element `j0`. Returns the
    /// splats (`None` for a moving input) and the moving inputs' first addresses.
    ///
    /// Carrying pointers matters: addresses recomputed from the loop index would be
    /// rematerialized by Cranelift (adds and masks of constants) inside every iteration.
    pub(super) fn vector_row(
        &mut self,
        bases: &[Value],
        j0: Value,
        lanes: Type,
    ) -> (Vec<Option<Value>>, Vec<Value>) {
        let mut splats = Vec::with_capacity(bases.len());
        let mut starts = Vec::new();
        for idx in 0..bases.len() {
            if *self.walk.strides[idx].last().expect("a row") == Sz::Known(0) {
                let s = self.load(self.kernel.inputs[idx].dtype, bases[idx]);
                splats.push(Some(self.b.ins().splat(lanes, s)));
            } else {
                splats.push(None);
                starts.push(self.element_addr(idx, j0, bases));
            }
        }
        (splats, starts)
    }

    /// The sources of one vector iteration, from [`Self::vector_row`]'s splats and the
    /// loop's current pointers: contiguous inputs load a vector, inputs strided along the
    /// row (a transposed read in a strip-walking kernel) gather their lanes.
    pub(super) fn vector_srcs(&self, splats: &[Option<Value>], ptrs: &[Value]) -> Vec<VecSrc> {
        let mut moving = ptrs.iter();
        splats
            .iter()
            .enumerate()
            .map(|(idx, s)| match s {
                Some(v) => VecSrc::Splat(*v),
                None => {
                    let ptr = *moving.next().expect("a pointer per moving input");
                    match self.inner_stride_bytes(idx) {
                        bytes if bytes == self.kernel.inputs[idx].dtype.size_in_bytes() as i64 => {
                            VecSrc::At(ptr)
                        }
                        bytes => VecSrc::Gather(ptr, bytes),
                    }
                }
            })
            .collect()
    }

    /// Bytes between neighbouring elements of input `idx` along the row (known: a vector
    /// loop over a row whose stride is read at run time is not generated, see
    /// [`super::strategy::loop_lanes`]).
    pub(super) fn inner_stride_bytes(&self, idx: usize) -> i64 {
        let stride = self.walk.strides[idx].last().and_then(|s| s.known());
        stride.expect("a vector loop's strides are known")
            * self.kernel.inputs[idx].dtype.size_in_bytes() as i64
    }

    /// How far each moving input's pointer advances per vector of `lanes`, in order.
    pub(super) fn input_steps(&self, splats: &[Option<Value>], lanes: Type) -> Vec<i64> {
        let width = i64::from(lanes.lane_count());
        (0..splats.len())
            .filter(|&idx| splats[idx].is_none())
            .map(|idx| width * self.inner_stride_bytes(idx))
            .collect()
    }

    /// Pointers advanced by `steps` bytes each.
    pub(super) fn advance_ptrs(&mut self, ptrs: &[Value], steps: &[i64]) -> Vec<Value> {
        ptrs.iter().zip(steps).map(|(&p, &s)| self.b.ins().iadd_imm_s(p, s)).collect()
    }

    /// The address of element `j` of the row for input `idx`.
    pub(super) fn element_addr(&mut self, idx: usize, j: Value, bases: &[Value]) -> Value {
        let stride = *self.walk.strides[idx].last().expect("at least one dimension");
        let size = self.kernel.inputs[idx].dtype.size_in_bytes() as i64;
        if stride == Sz::Known(0) {
            return bases[idx];
        }
        let off = self.mul_size(j, stride, size);
        self.b.ins().iadd(bases[idx], off)
    }
}
