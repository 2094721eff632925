//! The generated CUDA C compiles with a real NVRTC (when the library can be loaded: `.ci/run`
//! installs it from PyPI) and, checked with `ptxas`, uses no local memory for spills.

use kiln_ir::fuse::Step;
use kiln_ir::kernel::Kernel;
use kiln_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, Shape, UnaryOp, View};

use super::{library, param_types, source, source_generic};
use crate::generic::{dynamic_marks, generic_marks, numbers};

fn kernels_of(g: &Graph) -> Vec<Kernel> {
    crate::plan_steps(g)
        .into_iter()
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(k.kernel),
            _ => None,
        })
        .collect()
}

fn scalar(g: &mut Graph, v: f64, dtype: DType, shape: &Shape) -> NodeId {
    let c = g.leaf(Op::Full(Scalar::F64(v)), Shape::from(()), dtype).unwrap();
    g.push(Op::View(View::contiguous(Shape::from(())).expand(shape)), &[c]).unwrap()
}

fn bin(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
    g.push(Op::Binary(op), &[a, b]).unwrap()
}

fn un(g: &mut Graph, op: UnaryOp, a: NodeId) -> NodeId {
    g.push(Op::Unary(op), &[a]).unwrap()
}

/// A representative set: an elementwise chain, a broadcast, a row softmax's kernels, and a
/// chain and a reduction in every dtype.
pub(crate) fn representative() -> Vec<(String, Kernel)> {
    let mut out = Vec::new();
    // W1b: ((x * 1.5 + 0.5) * x + relu(x - 0.2)) / (1 + x * x), on an odd size.
    let mut g = Graph::new();
    let s = Shape::from([1000]);
    let x = g.input(s.clone(), DType::F32);
    let (a, b, c, one) = (
        scalar(&mut g, 1.5, DType::F32, &s),
        scalar(&mut g, 0.5, DType::F32, &s),
        scalar(&mut g, 0.2, DType::F32, &s),
        scalar(&mut g, 1.0, DType::F32, &s),
    );
    let t = bin(&mut g, BinaryOp::Mul, x, a);
    let t = bin(&mut g, BinaryOp::Add, t, b);
    let t = bin(&mut g, BinaryOp::Mul, t, x);
    let r = bin(&mut g, BinaryOp::Sub, x, c);
    let r = un(&mut g, UnaryOp::Relu, r);
    let num = bin(&mut g, BinaryOp::Add, t, r);
    let sq = bin(&mut g, BinaryOp::Mul, x, x);
    let den = bin(&mut g, BinaryOp::Add, one, sq);
    let y = bin(&mut g, BinaryOp::Div, num, den);
    g.mark_output(y);
    out.extend(kernels_of(&g).into_iter().map(|k| ("elementwise_chain".to_string(), k)));

    // relu(A * col + row) - A / 2 over [8, 16], A transposed.
    let mut g = Graph::new();
    let s = Shape::from([8, 16]);
    let at = g.input(Shape::from([16, 8]), DType::F32);
    let a =
        g.push(Op::View(View::contiguous(Shape::from([16, 8])).permute(&[1, 0])), &[at]).unwrap();
    let col = g.input(Shape::from([8, 1]), DType::F32);
    let row = g.input(Shape::from([16]), DType::F32);
    let colb = g.push(Op::View(View::contiguous(Shape::from([8, 1])).expand(&s)), &[col]).unwrap();
    let rowb = g.push(Op::View(View::contiguous(Shape::from([16])).expand(&s)), &[row]).unwrap();
    let t = bin(&mut g, BinaryOp::Mul, a, colb);
    let t = bin(&mut g, BinaryOp::Add, t, rowb);
    let t = un(&mut g, UnaryOp::Relu, t);
    let two = scalar(&mut g, 2.0, DType::F32, &s);
    let h = bin(&mut g, BinaryOp::Div, a, two);
    let y = bin(&mut g, BinaryOp::Sub, t, h);
    g.mark_output(y);
    out.extend(kernels_of(&g).into_iter().map(|k| ("broadcast".to_string(), k)));

    // Row softmax of [4, 33]: the max, the sum of exp(x - max), the division.
    let mut g = Graph::new();
    let s = Shape::from([4, 33]);
    let x = g.input(s.clone(), DType::F32);
    let m = g.push(Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, &[x]).unwrap();
    let mb = g.push(Op::View(View::contiguous(Shape::from([4, 1])).expand(&s)), &[m]).unwrap();
    let d = bin(&mut g, BinaryOp::Sub, x, mb);
    let e = un(&mut g, UnaryOp::Exp, d);
    let sum = g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, &[e]).unwrap();
    let sb = g.push(Op::View(View::contiguous(Shape::from([4, 1])).expand(&s)), &[sum]).unwrap();
    let y = bin(&mut g, BinaryOp::Div, e, sb);
    g.mark_output(y);
    out.extend(kernels_of(&g).into_iter().map(|k| ("softmax".to_string(), k)));

    // Every float function of one argument, chained, in f32 and f64: NVRTC must know each
    // spelling (`tanf`, `erf`, `rint`, ...).
    for dtype in [DType::F32, DType::F64] {
        let mut g = Graph::new();
        let mut t = g.input(Shape::from([7]), dtype);
        for op in UnaryOp::ALL.into_iter().filter(|&op| op != UnaryOp::Not) {
            t = un(&mut g, op, t);
        }
        g.mark_output(t);
        out.extend(kernels_of(&g).into_iter().map(|k| (format!("every_unary_{dtype}"), k)));
    }

    // Every binary op each dtype takes (`fmod`, the integer division and shift helpers, the
    // bitwise operators), each of two inputs, kept: NVRTC must know every spelling.
    for dtype in DType::ALL {
        let mut g = Graph::new();
        let s = Shape::from([9]);
        let (a, b) = (g.input(s.clone(), dtype), g.input(s.clone(), dtype));
        for op in BinaryOp::ALL {
            if Op::Binary(op).infer(&[(&s, dtype), (&s, dtype)]).is_ok() {
                let y = bin(&mut g, op, a, b);
                g.mark_output(y);
            }
        }
        out.extend(kernels_of(&g).into_iter().map(|k| (format!("every_binary_{dtype}"), k)));
    }

    // A sum over rows with many outputs (bias gradients): one thread per output.
    let mut g = Graph::new();
    let x = g.input(Shape::from([9, 300]), DType::F32);
    let e = un(&mut g, UnaryOp::Exp, x);
    let r = g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![0] }, &[e]).unwrap();
    g.mark_output(r);
    let column = kernels_of(&g);
    assert!(column.iter().any(super::reduces_by_columns), "a column reduction");
    out.extend(column.into_iter().map(|k| ("column_sum".to_string(), k)));

    // Long columns and few outputs (a bias gradient over 2048 rows), in f32 and bf16: cut
    // into chunks, then merged.
    for dtype in [DType::F32, DType::BF16] {
        let mut g = Graph::new();
        let x = g.input(Shape::from([2048, 130]), dtype);
        let r = g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![0] }, &[x]).unwrap();
        g.mark_output(r);
        let split = kernels_of(&g);
        assert!(split.iter().any(super::splits_columns), "a split column reduction");
        out.extend(split.into_iter().map(|k| (format!("split_columns_{dtype}"), k)));
    }

    // A sum over a whole long vector (a loss): split across blocks, then merged.
    for dtype in [DType::F32, DType::F16, DType::Bool] {
        let mut g = Graph::new();
        let x = g.input(Shape::from([3, 100_000]), dtype);
        let op = if dtype == DType::Bool { ReduceOp::Max } else { ReduceOp::Sum };
        let r = g.push(Op::Reduce { op, axes: vec![0, 1] }, &[x]).unwrap();
        g.mark_output(r);
        let split = kernels_of(&g);
        assert!(split.iter().any(|k| super::split_partials(k).is_some()), "a split reduction");
        out.extend(split.into_iter().map(|k| (format!("split_{dtype}"), k)));
    }

    // Every dtype: a cast chain through f32 math and a comparison, and a reduction.
    for dtype in DType::ALL {
        let mut g = Graph::new();
        let s = Shape::from([3, 5]);
        let x = g.input(s.clone(), dtype);
        let f = g.push(Op::Cast(DType::F32), &[x]).unwrap();
        let e = un(&mut g, UnaryOp::Tanh, f);
        let back = g.push(Op::Cast(dtype), &[e]).unwrap();
        let mx = if dtype == DType::Bool {
            bin(&mut g, BinaryOp::Or, back, x)
        } else {
            bin(&mut g, BinaryOp::Maximum, back, x)
        };
        let gt = bin(&mut g, BinaryOp::Gt, mx, x);
        let y = g.push(Op::Where, &[gt, mx, x]).unwrap();
        g.mark_output(y);
        out.extend(kernels_of(&g).into_iter().map(|k| (format!("chain_{dtype}"), k)));

        let mut g = Graph::new();
        let x = g.input(Shape::from([6, 7]), dtype);
        let op = if dtype == DType::Bool { ReduceOp::Max } else { ReduceOp::Sum };
        let acc = if dtype.is_float() || dtype == DType::Bool { dtype } else { DType::I64 };
        let xi = if acc == dtype { x } else { g.push(Op::Cast(acc), &[x]).unwrap() };
        let r = g.push(Op::Reduce { op, axes: vec![0] }, &[xi]).unwrap();
        g.mark_output(r);
        out.extend(kernels_of(&g).into_iter().map(|k| (format!("reduce_{dtype}"), k)));
    }
    out
}

/// A row softmax of [`rows`, `cols`] in `dtype` as one row group's source (for up to 512
/// threads, with a register cache of 64), with its buffers numbered as the runtime numbers
/// them (each node once, in the order first seen).
pub(crate) fn softmax_row_group(dtype: DType, rows: usize, cols: usize) -> String {
    row_group(dtype, rows, cols, false)
}

/// [`softmax_row_group`], or its log-softmax: `x - max - ln(sum)`, whose last member reads
/// the input a third time (where softmax reads the exponentials the sum stored).
fn row_group(dtype: DType, rows: usize, cols: usize, log: bool) -> String {
    let mut g = Graph::new();
    let s = Shape::from([rows, cols]);
    let x = g.input(s.clone(), dtype);
    let m = g.push(Op::Reduce { op: ReduceOp::Max, axes: vec![1] }, &[x]).unwrap();
    let mb = g.push(Op::View(View::contiguous(Shape::from([rows, 1])).expand(&s)), &[m]).unwrap();
    let d = bin(&mut g, BinaryOp::Sub, x, mb);
    let e = un(&mut g, UnaryOp::Exp, d);
    let sum = g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, &[e]).unwrap();
    let y = if log {
        let ls = un(&mut g, UnaryOp::Log, sum);
        let lb =
            g.push(Op::View(View::contiguous(Shape::from([rows, 1])).expand(&s)), &[ls]).unwrap();
        bin(&mut g, BinaryOp::Sub, d, lb)
    } else {
        let sb =
            g.push(Op::View(View::contiguous(Shape::from([rows, 1])).expand(&s)), &[sum]).unwrap();
        bin(&mut g, BinaryOp::Div, e, sb)
    };
    g.mark_output(y);
    let steps: Vec<_> = crate::plan_steps(&g)
        .into_iter()
        .filter_map(|s| match s {
            Step::Kernel(k) => Some(k),
            _ => None,
        })
        .collect();
    let mut nodes: Vec<NodeId> = Vec::new();
    let mut buffers = Vec::new();
    let mut index = |n: NodeId, written: bool, buffers: &mut Vec<super::rows::GroupBuffer>| {
        nodes.iter().position(|&m| m == n).unwrap_or_else(|| {
            nodes.push(n);
            buffers.push(super::rows::GroupBuffer { dtype: g.node(n).dtype, written });
            nodes.len() - 1
        })
    };
    let mut members = Vec::new();
    for k in &steps {
        let inputs = k.inputs.iter().map(|&n| index(n, false, &mut buffers)).collect();
        let outputs = k.outputs.iter().map(|&n| index(n, true, &mut buffers)).collect();
        members.push(super::rows::RowMember { kernel: &k.kernel, inputs, outputs });
    }
    let program = super::rows::RowProgram { members, buffers, rows };
    super::rows::source(&program, super::rows::threads(&program, 512), 64)
}

#[test]
fn a_row_group_over_other_row_counts_is_the_same_source() {
    // Rows are an argument: 37 rows or 48 of 300 are one compile; rows of 301 are not.
    let (a, b, c) = (
        softmax_row_group(DType::F32, 37, 300),
        softmax_row_group(DType::F32, 48, 300),
        softmax_row_group(DType::F32, 37, 301),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    let name = super::rows::entry_name(&a).expect("an entry point");
    assert!(name.starts_with("rows_") && a.contains(&format!(") {name}(")), "{a}");
}

#[test]
fn a_row_group_is_one_entry_point_with_a_barrier_per_member_read_later() {
    let src = softmax_row_group(DType::F32, 37, 300);
    assert_eq!(src.matches("__global__").count(), 1, "{src}");
    assert!(src.contains("for (long long row = blockIdx.x; row < n; row += gridDim.x)"), "{src}");
    // Two reductions (each combining across the block) and the division: the maximum and
    // the sum end at barriers, the last member needs none.
    assert_eq!(src.matches("__shfl_down_sync").count(), 4, "{src}");
    assert_eq!(src.matches("__syncthreads()").count(), 4, "two per reduction: {src}");
    // The input is read-only; what the group writes is never `const`.
    assert!(src.contains("const float* __restrict__ g0"), "{src}");
    assert!(!src.contains("const float* __restrict__ g1"), "{src}");
    // Rows of 300: four positions per thread where aligned, one otherwise; too short for
    // the register cache (a use after the next finds the row in the multiprocessor's cache).
    assert_eq!(src.matches("*(const float4*)(g").count(), 3, "{src}");
    assert!(!src.contains("c0[") && src.contains("__launch_bounds__(96)"), "{src}");
    assert_eq!(
        src.matches("for (long long j = threadIdx.x; j < 300LL; j += blockDim.x)").count(),
        3
    );
}

#[test]
fn a_long_row_read_three_times_is_kept_in_registers() {
    // Log-softmax of 16384 f32 per row reads the input in all three members: 4096 pieces
    // over 512 threads, eight per thread (32 registers), loaded by the first member.
    let log = row_group(DType::F32, 4096, 16384, true);
    assert!(log.contains("float4 c0[8];"), "{log}");
    assert_eq!(log.matches("for (int k = 0; k < 8; ++k)").count(), 3, "{log}");
    assert_eq!(log.matches("*(const float4*)(g0").count(), 1, "{log}");
    assert_eq!(log.matches("const float4 v0 = c0[k] = *(const float4*)(g0").count(), 1, "{log}");
    assert_eq!(log.matches("= c0[k];").count(), 2, "{log}");
    assert!(log.contains("__launch_bounds__(512, 2)"), "64 registers at most: {log}");
    // Softmax reads it twice (the division reads the exponentials the sum stored): the
    // second read finds it in the multiprocessor's cache.
    let soft = softmax_row_group(DType::F32, 4096, 16384);
    assert!(!soft.contains("c0[") && soft.contains("__launch_bounds__(512)"), "{soft}");
    // bf16 rows of 16384 (32 KiB) are short enough to be found there by a third use;
    // 65536 f32 (32 pieces per thread, 128 registers) is beyond the registers.
    let bf16 = row_group(DType::BF16, 4096, 16384, true);
    assert!(!bf16.contains("c0["), "{bf16}");
    let long = row_group(DType::F32, 4096, 65536, true);
    assert!(!long.contains("c0["), "{long}");
    assert_eq!(long.matches("*(const float4*)(g0").count(), 3, "{long}");
}

#[test]
fn sources_have_one_entry_point_and_typed_arguments() {
    for (name, k) in representative() {
        let src = source(&k);
        let entry = format!("extern \"C\" __global__ void {}(", k.name());
        assert_eq!(src.matches(&entry).count(), 1, "{name}:\n{src}");
        assert_eq!(param_types(&k).len(), k.params, "{name}");
        for i in 0..k.inputs.len() {
            assert!(src.contains(&format!("in{i}")), "{name}: input {i}");
        }
        let merge = format!("extern \"C\" __global__ void {}(", super::merge_name(&k));
        let split = super::split_partials(&k).is_some();
        assert_eq!(src.contains(&merge), split, "{name}: a merge entry point iff split");
        if super::reduces_by_columns(&k) {
            assert!(!src.contains("__shfl_down_sync"), "{name}: one thread per output");
        } else if k.reduce.is_some() {
            assert!(src.contains("__shfl_down_sync"), "{name}: a warp reduction");
        } else {
            assert!(src.contains("i += (long long)gridDim.x * blockDim.x"), "{name}: grid-stride");
        }
        // Braces balance.
        assert_eq!(src.matches('{').count(), src.matches('}').count(), "{name}:\n{src}");
    }
}

/// Every library kernel in every dtype, on odd shapes.
fn library_kernels() -> Vec<(String, super::library::LibraryKernel)> {
    use super::library;
    let mut out = Vec::new();
    let x = Shape::from([5, 7, 3]);
    let index = Shape::from([4, 2, 3]);
    let view = View::contiguous(Shape::from([5, 9])).narrow(1, 2, 4).permute(&[1, 0]);
    for dtype in DType::ALL {
        out.push((format!("gather_{dtype}"), library::gather(dtype, &x, &index, 1)));
        for accumulate in [false, true] {
            let k = library::scatter(dtype, &x, &index, &index, 1, accumulate);
            out.push((format!("scatter_{accumulate}_{dtype}"), k));
        }
        // One index per line: added in place, no scratch.
        let one = Shape::from([4, 1, 3]);
        let k = library::scatter(dtype, &x, &one, &one, 1, true);
        out.push((format!("scatter_add_one_per_line_{dtype}"), k));
        out.push((format!("assign_{dtype}"), library::assign(dtype, &view)));
        // Lines of a block each, a thread each (many strided lines), chunks of few long lines.
        let lines = [
            (x.clone(), 2),
            (Shape::from([3, 20, 70]), 1),
            (Shape::from([200, 2000]), 1),
            (Shape::from([2, 50_000]), 1),
        ];
        for (shape, axis) in &lines {
            let scan = format!("{:?}", library::cumsum_lines(shape, *axis));
            out.push((format!("cumsum_{scan}_{dtype}"), library::cumsum(dtype, shape, *axis)));
            let how = format!("{:?}", library::lines_of(shape, *axis));
            for op in [ReduceOp::ArgMax, ReduceOp::ArgMin] {
                let k = library::arg_extreme(op, dtype, shape, *axis);
                out.push((format!("{op:?}_{how}_{dtype}"), k));
            }
        }
        let dists: &[kiln_ir::RandomDist] = match dtype {
            DType::I64 => &[kiln_ir::RandomDist::Int { low: -3, high: 9 }],
            d if d.is_float() => &[kiln_ir::RandomDist::Uniform, kiln_ir::RandomDist::Normal],
            _ => &[],
        };
        for &dist in dists {
            out.push((format!("random_{dist:?}_{dtype}"), library::random(dist, dtype)));
        }
    }
    // A CUDA graph's copies in and out, and the index kernels' error reading.
    out.push(("copies".to_string(), library::copies()));
    out.push(("bad_index".to_string(), library::bad_index()));
    // Attention: odd sizes, W7's heads (32 features), rows longer than a warp, every
    // masking (more keys than queries for the lower-right triangle), both entry sets, every
    // float dtype.
    use kiln_ir::AttentionMask;
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (e, ev) in [(5, 7), (32, 32), (40, 72)] {
            for mask in [
                AttentionMask::None,
                AttentionMask::Causal,
                AttentionMask::CausalLowerRight,
                AttentionMask::Given,
            ] {
                let d = super::attention::AttentionShape {
                    n: 3,
                    l: 9,
                    e,
                    s: 11,
                    ev,
                    mask,
                    scale: 0.125,
                };
                for grad in [false, true] {
                    let name = format!("attention_{e}x{ev}_{mask:?}_{grad}_{dtype}");
                    out.push((name, super::attention::attention(dtype, &d, grad)));
                }
            }
        }
    }
    out
}

#[test]
fn library_kernels_name_their_entry_points() {
    for (name, k) in library_kernels() {
        assert!(!k.entries.is_empty(), "{name}");
        for e in &k.entries {
            let entry = format!("extern \"C\" __global__ void {e}(");
            assert_eq!(k.source.matches(&entry).count(), 1, "{name}:\n{}", k.source);
        }
        assert!(!k.source.contains("ENTRY"), "{name}: a placeholder is left");
        assert_eq!(k.source.matches('{').count(), k.source.matches('}').count(), "{name}");
    }
    // Float sums take three passes through an f64 scratch copy; the others one.
    let f32_add = library::scatter(
        DType::F32,
        &Shape::from([3]),
        &Shape::from([2]),
        &Shape::from([2]),
        0,
        true,
    );
    assert_eq!(f32_add.entries.len(), 3);
    let i64_add = library::scatter(
        DType::I64,
        &Shape::from([3]),
        &Shape::from([2]),
        &Shape::from([2]),
        0,
        true,
    );
    assert_eq!(i64_add.entries.len(), 1);
    // One index per line (a label per row): each position is added to once, in place.
    let one_per_row = library::scatter(
        DType::F32,
        &Shape::from([4, 9]),
        &Shape::from([4, 1]),
        &Shape::from([4, 1]),
        1,
        true,
    );
    assert_eq!(one_per_row.entries.len(), 1);
    assert!(!one_per_row.source.contains("scratch["), "{}", one_per_row.source);
    // The three ways per-line kernels spread their lines.
    use library::Lines;
    assert_eq!(library::lines_of(&Shape::from([5, 7, 3]), 2), Lines::Blocks);
    assert_eq!(library::lines_of(&Shape::from([3, 20, 70]), 1), Lines::Threads);
    assert_eq!(library::lines_of(&Shape::from([2, 50_000]), 1), Lines::Chunks);
    // Short lines are summed in order, a thread each.
    assert_eq!(library::cumsum_lines(&Shape::from([5, 7, 3]), 2), Lines::Threads);
    assert_eq!(library::cumsum_lines(&Shape::from([200, 2000]), 1), Lines::Blocks);
    let chunked = library::cumsum(DType::F32, &Shape::from([2, 50_000]), 1);
    assert_eq!(chunked.entries.len(), 3);
    let chunked = library::arg_extreme(ReduceOp::ArgMax, DType::F32, &Shape::from([50_000]), 0);
    assert_eq!(chunked.entries.len(), 2);
}

#[test]
fn generic_kernels_read_their_sizes_from_arguments() {
    for (name, k) in representative() {
        let marks = generic_marks(&k);
        let src = source_generic(&k, &marks);
        let sizes = super::size_args(&k, &marks);
        let declared = (0..).take_while(|i| src.contains(&format!("long long z{i}"))).count();
        assert_eq!(declared, sizes.len(), "{name}: one argument per size slot:\n{src}");
        // Every dimension of more than one element is an argument: none is in the code.
        let dims: Vec<usize> = k.shape.dims().iter().copied().filter(|&d| d > 1).collect();
        for d in dims {
            assert!(!src.contains(&format!(" {d}LL")), "{name}: {d} is in the code:\n{src}");
        }
        // Specialised and generic kernels differ only in their numbers.
        let forms = |src: &str| src.matches("for (").count();
        assert_eq!(forms(&src), forms(&source(&k)), "{name}: the same loops");
        assert!(super::size_args(&k, &[]).is_empty(), "{name}: a specialised kernel has none");
    }
}

#[test]
fn kernels_of_one_form_at_other_sizes_share_it() {
    let at = |n: usize| {
        let mut g = Graph::new();
        let x = g.input(Shape::from([n, 37]), DType::F32);
        let b = g.input(Shape::from([37]), DType::F32);
        let e = un(&mut g, UnaryOp::Exp, x);
        let s = Shape::from([n, 37]);
        let bb = g.push(Op::View(View::contiguous(Shape::from([37])).expand(&s)), &[b]).unwrap();
        let y = bin(&mut g, BinaryOp::Mul, e, bb);
        let r = g.push(Op::Reduce { op: ReduceOp::Sum, axes: vec![1] }, &[y]).unwrap();
        let z = bin(&mut g, BinaryOp::Add, x, bb);
        g.mark_output(r);
        g.mark_output(z);
        kernels_of(&g)
    };
    let (a, b, one) = (at(48), at(17), at(1));
    assert_eq!(a.len(), b.len());
    for (ka, kb) in a.iter().zip(&b) {
        assert_eq!(super::form(ka), super::form(kb), "{ka:?}");
        let marks = dynamic_marks(&numbers(ka), &numbers(kb), &[]);
        assert!(marks.contains(&true), "48 and 17 differ");
        // The generic kernel compiled for one is the same source for the other.
        assert_eq!(source_generic(ka, &marks), source_generic(kb, &marks));
        assert_ne!(super::size_args(ka, &marks), super::size_args(kb, &marks));
    }
    // A dimension of 1 drops out of the walk: another form.
    assert_ne!(super::form(&a[0]), super::form(&one[0]));
}

#[test]
fn dense_chains_move_four_elements_per_thread() {
    let kernels = representative();
    let find = |name: &str| kernels.iter().find(|(n, _)| n == name).map(|(_, k)| source(k));
    // W1b over one dense dimension: vector loads and stores, then the scalar tail.
    let chain = find("elementwise_chain").expect("the chain");
    assert!(chain.contains("const float4 v0 = *(const float4*)(in0 + 0LL + 4 * q);"), "{chain}");
    assert!(chain.contains("*(float4*)(out0 + 4 * q) = r0;"), "{chain}");
    assert!(chain.contains("% 16ULL == 0"), "alignment is checked at run time:\n{chain}");
    assert!(chain.contains("start = n4 * 4;"), "{chain}");
    // Every lane computes the body.
    for lane in ["x", "y", "z", "w"] {
        assert!(chain.contains(&format!("r0.{lane} = ")), "{chain}");
    }
    // A transposed input is not dense: scalar loads only.
    let broadcast = find("broadcast").expect("the broadcast");
    assert!(!broadcast.contains("float4"), "{broadcast}");
    // 8-byte elements stay scalar.
    let f64_chain = find("chain_f64").expect("the f64 chain");
    assert!(!f64_chain.contains("n4"), "{f64_chain}");
    // 16-bit floats move as four halves.
    let f16_chain = find("chain_f16").expect("the f16 chain");
    assert!(f16_chain.contains("ushort4"), "{f16_chain}");
}

/// Whether NVRTC can be loaded; skips `test` (or fails it under `KILN_REQUIRE_NVRTC=1`)
/// otherwise.
fn nvrtc(test: &str) -> bool {
    // SAFETY: this only looks the library up with `dlopen`; nothing in it is called.
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if !present {
        let why = "libnvrtc.so was not found. `.ci/run` installs NVRTC 13.0 from PyPI into \
                   .venv-cuda and puts its lib directory on LD_LIBRARY_PATH; do the same to run \
                   this test";
        kiln_ir::testing::skip(test, why, &["KILN_REQUIRE_NVRTC"]);
    }
    present
}

/// Each function of a `ptxas -v` report, with whether its code neither stores nor loads
/// spilled registers (a module can hold several entry points: attention's gradients, the
/// scatters).
fn entry_spills(report: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut entry = None;
    for line in report.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            entry = Some(rest.trim().to_string());
        } else if line.contains("spill stores") {
            let clean =
                line.contains(" 0 bytes spill stores") && line.contains(" 0 bytes spill loads");
            out.push((entry.take().unwrap_or_default(), clean));
        }
    }
    out
}

#[test]
fn a_spill_in_any_entry_point_is_found() {
    let report = "ptxas info    : Compiling entry function 'a' for 'sm_90'\n\
        ptxas info    : Function properties for a\n\
        \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
        ptxas info    : Compiling entry function 'b' for 'sm_90'\n\
        ptxas info    : Function properties for b\n\
        \x20   8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n";
    assert_eq!(entry_spills(report), [("a".to_string(), true), ("b".to_string(), false)]);
}

/// `ptxas` from `KILN_PTXAS` or the `PATH`, if there is one.
fn ptxas() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("KILN_PTXAS") {
        return Some(p.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|d| d.join("ptxas")).find(|p| p.is_file())
    })
}

#[test]
fn generated_cuda_compiles_with_nvrtc_and_does_not_spill() {
    const TEST: &str = "generated_cuda_compiles_with_nvrtc_and_does_not_spill";
    if !nvrtc(TEST) {
        return;
    }
    let ptxas = ptxas();
    if ptxas.is_none() {
        let why = "ptxas was not found (set KILN_PTXAS): the register and spill checks do not run";
        kiln_ir::testing::skip(TEST, why, &["KILN_REQUIRE_PTXAS"]);
    }
    let dir = std::env::temp_dir().join(format!("kiln-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut sources: Vec<(String, String)> = Vec::new();
    for (name, k) in representative() {
        // Each kernel specialised to its sizes, and size-generic (every number read at run time).
        sources.push((format!("{name} (generic)"), source_generic(&k, &generic_marks(&k))));
        sources.push((name, source(&k)));
    }
    sources.extend(library_kernels().into_iter().map(|(name, k)| (name, k.source)));
    for dtype in [DType::F32, DType::BF16] {
        for (rows, cols, log) in [(37, 300, false), (4096, 16384, true)] {
            let name = format!("row_group_{dtype}_{cols}_log_{log}");
            sources.push((name, row_group(dtype, rows, cols, log)));
        }
    }
    // NVRTC and ptxas take most of a second per source, and this test ran alone for over a
    // minute after the others ended: the sources are shared out over the machine's cores
    // (NVRTC programs are independent; each ptxas is a process).
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(sources.len());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, src)) = sources.get(i) else { break };
                    check_nvrtc_and_ptxas(i, name, src, ptxas.as_deref(), &dir);
                }
            });
        }
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Compiles source `i` with NVRTC as the runtime does for an sm_90 device and, when there
/// is a `ptxas`, checks that every entry point compiles without spilling.
fn check_nvrtc_and_ptxas(
    i: usize,
    name: &str,
    src: &str,
    ptxas: Option<&std::path::Path>,
    dir: &std::path::Path,
) {
    // Exactly the options the runtime compiles with for an sm_90 device (NVRTC 13 takes
    // `-minimal`).
    let opts = cudarc::nvrtc::CompileOptions {
        options: super::nvrtc_options("sm_90", true),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
        .unwrap_or_else(|e| panic!("{name}: NVRTC rejected the source: {e:?}\n{src}"));
    let Some(ptxas) = ptxas else { return };
    let file = dir.join(format!("k{i}.ptx"));
    std::fs::write(&file, ptx.to_src()).unwrap();
    let out = std::process::Command::new(ptxas)
        .args(["-arch=sm_90", "-v", "-o", "/dev/null"])
        .arg(&file)
        .output()
        .expect("ptxas runs");
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{name}: ptxas failed:\n{report}");
    let entries = ptx.to_src().matches(".entry ").count();
    let compiled = report.matches("Compiling entry function").count();
    assert!(entries > 0 && compiled == entries, "{name}: every entry point:\n{report}");
    let spills = entry_spills(&report);
    assert!(spills.len() >= entries, "{name}: a report per entry point:\n{report}");
    let spilling: Vec<_> = spills.iter().filter(|(_, clean)| !clean).collect();
    assert!(spilling.is_empty(), "{name}: {spilling:?} spill:\n{report}");
}
