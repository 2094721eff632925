//! The steps that are not generated CPU kernels, on the plan's device: library kernels and
//! cuBLAS on a GPU, native loops and `gemm` on the CPU, and host copies where a device has
//! no kernel of its own (reported as such in profiles).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use kiln_ir::fuse::KernelStep;
use kiln_ir::{Graph, NodeId};

use super::execute::Bufs;
use super::on_device;
use crate::trace::StepKind;
use crate::{Buffer, Device, RunError, RuntimeError, cuda, reference};

/// Runs a node that is not a kernel: natively or on the reference executor on the host; on
/// a GPU with a library kernel, or else on host copies of its inputs with the result copied
/// back.
pub(super) fn eval_node_on(
    gpu: Option<&'static cuda::Gpu>,
    graph: &Graph,
    n: NodeId,
    args: &[&Buffer],
) -> Result<(Buffer, StepKind), RunError> {
    if let Some(g) = gpu
        && let Some(out) = cuda::eval_node(g, graph, n, args)
    {
        return Ok((out?, StepKind::Library));
    }
    let device = gpu.map_or(Device::Cpu, |g| g.device());
    let host;
    let args = if device == Device::Cpu {
        args
    } else {
        host = on_device(&args.iter().map(|&b| b.clone()).collect::<Vec<_>>(), Device::Cpu)?;
        &host.iter().collect::<Vec<_>>()[..]
    };
    let (out, kind) = match crate::native::eval(graph, n, args) {
        Some(out) => (out?, StepKind::Library),
        None => (reference::eval_node(graph, n, args)?, StepKind::Reference),
    };
    // On a GPU this was host work, whichever loop did it.
    let kind = if device == Device::Cpu { kind } else { StepKind::Host };
    let node = graph.node(n);
    let out = out.to_device(device).map_err(|error| RunError {
        error,
        op: Some(node.op.name()),
        origin: node.origin,
    })?;
    Ok((out, kind))
}

/// Under `KILN_CHECK`, a user-defined op's GPU result against its CPU implementation's on
/// host copies of the same inputs (which must write every element).
pub(super) fn check_custom(
    graph: &Graph,
    n: NodeId,
    args: &[&Buffer],
    got: &Buffer,
    scale: f64,
) -> Result<(), RunError> {
    let node = graph.node(n);
    let kiln_ir::Op::Custom(c) = &node.op else { return Ok(()) };
    let at = |error| RunError { error, op: Some(node.op.name()), origin: node.origin };
    let host = on_device(&args.iter().map(|&b| b.clone()).collect::<Vec<_>>(), Device::Cpu)?;
    let views: Vec<kiln_ir::View> = graph
        .arg_slice(n)
        .iter()
        .map(|&a| kiln_ir::View::contiguous(graph.node(a).shape.clone()))
        .collect();
    let inputs: Vec<_> = host.iter().zip(&views).collect();
    let want = crate::custom::run_cpu(c, &inputs, true).map_err(at)?;
    let got = got.to_device(Device::Cpu).map_err(at)?;
    crate::custom::compare(c, &got, &want, scale).map_err(at)
}

/// A matrix product: `gemm` on the CPU, cuBLAS on a GPU, or the host's `gemm` over copies
/// for what cuBLAS cannot take (a batch layout with no single stride, `k == 0`, sizes past
/// 2³¹, integer dtypes): that is [`StepKind::Host`] in profiles, counted by
/// [`host_products`] and warned once per call site (`origin`).
pub(super) fn matmul_on(
    gpu: Option<&'static cuda::Gpu>,
    a: &Buffer,
    va: &kiln_ir::View,
    b: &Buffer,
    vb: &kiln_ir::View,
    origin: Option<&'static std::panic::Location<'static>>,
) -> Result<(Buffer, StepKind), RuntimeError> {
    let Some(gpu) = gpu else {
        return Ok((crate::matmul::matmul(a, va, b, vb)?, StepKind::Library));
    };
    if let Some(out) = cuda::matmul(gpu, a, va, b, vb)? {
        return Ok((out, StepKind::Library));
    }
    note_host_product(a.dtype(), va, vb, origin);
    let (ha, hb) = (a.to_device(Device::Cpu)?, b.to_device(Device::Cpu)?);
    if a.dtype() != kiln_ir::DType::BF16 {
        let out = crate::matmul::matmul(&ha, va, &hb, vb)?.to_device(gpu.device())?;
        return Ok((out, StepKind::Host));
    }
    // `gemm` has no bf16: multiply in f32 and round once.
    let dense = |b: &Buffer, v: &kiln_ir::View| -> Result<(Buffer, kiln_ir::View), RuntimeError> {
        Ok((Buffer::from_slice(&b.gather::<f32>(v))?, kiln_ir::View::contiguous(v.shape().clone())))
    };
    let ((fa, fva), (fb, fvb)) = (dense(&ha, va)?, dense(&hb, vb)?);
    let product = crate::matmul::matmul(&fa, &fva, &fb, &fvb)?;
    let all = kiln_ir::View::contiguous(kiln_ir::Shape::from([product.len()]));
    let out = Buffer::from_slice(&product.gather::<half::bf16>(&all))?.to_device(gpu.device())?;
    Ok((out, StepKind::Host))
}

/// GPU matrix products computed on the host so far.
static HOST_PRODUCTS: AtomicU64 = AtomicU64::new(0);

/// How many matrix products of GPU tensors ran on the host's `gemm` over device↔host copies
/// because cuBLAS could not take them (a batch layout with no single stride, `k == 0`, sizes
/// past 2³¹). 0 is the normal case.
pub fn host_products() -> u64 {
    HOST_PRODUCTS.load(Ordering::Relaxed)
}

/// Counts a product that runs on the host, and warns once per call site.
fn note_host_product(
    dtype: kiln_ir::DType,
    va: &kiln_ir::View,
    vb: &kiln_ir::View,
    origin: Option<&'static std::panic::Location<'static>>,
) {
    static WARNED: Mutex<Vec<Option<&'static std::panic::Location<'static>>>> =
        Mutex::new(Vec::new());
    HOST_PRODUCTS.fetch_add(1, Ordering::Relaxed);
    let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
    if !warned.contains(&origin) {
        warned.push(origin);
        let at = origin.map_or_else(String::new, |l| format!(" at {l}"));
        eprintln!(
            "kiln: warning: a {dtype} matmul{at} ({} @ {}, strides {:?} and {:?}) runs on the \
             host over device copies: cuBLAS takes one stride per batch dimension group, a \
             unit row or column stride, k > 0 and sizes below 2^31 (make the operands \
             contiguous to keep it on the GPU)",
            va.shape(),
            vb.shape(),
            va.strides(),
            vb.strides()
        );
    }
}

/// Launches a kernel step on a GPU.
pub(super) fn run_gpu_kernel(
    gpu: &'static cuda::Gpu,
    graph: &Graph,
    step: &KernelStep,
    bufs: &Bufs,
) -> Result<cuda::KernelLaunch, RunError> {
    let root = graph.node(step.outputs[0]);
    let inputs: Vec<&Buffer> = step.inputs.iter().map(|i| &bufs[i]).collect();
    let dtypes: Vec<_> = step.outputs.iter().map(|&o| graph.node(o).dtype).collect();
    cuda::run_kernel(gpu, step, &dtypes, &inputs).map_err(|error| RunError {
        error,
        op: Some(root.op.name()),
        origin: root.origin,
    })
}
