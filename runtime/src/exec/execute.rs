//! Running a prepared plan: the step loop, the live buffers, frees after the last reader,
//! and the trace of every step.

use std::time::Instant;

use kiln_codegen::cpu::CpuKernel;
use kiln_ir::fuse::KernelStep;
use kiln_ir::{Collective, Graph, Node, NodeId, Op, Scalar};
use std::sync::Arc;
use std::time::Duration;

use super::prepare::PreparedStep;
use super::{Prepared, check, cpu, dispatch};
use crate::trace::{self, KernelRun, MemoryPeak, StepKind};
use crate::{Buffer, Device, RunError, RuntimeError, collective, cuda, native, rows};

impl Prepared {
    /// Runs the plan with `inputs` bound to the graph's `Input` nodes, in order; returns the
    /// outputs' buffers (new buffers on every run). `check` compares every kernel with the
    /// reference executor, as [`super::run`] does.
    ///
    /// # Errors
    /// As [`super::run`].
    pub fn run(&mut self, inputs: &[Buffer], check: Option<f64>) -> Result<Vec<Buffer>, RunError> {
        self.run_owned(inputs.to_vec(), check)
    }

    /// [`Prepared::run`] on inputs handed over: a step that writes into an input's buffer
    /// ([`Prepared::writes_into_inputs`]) does so in place when the caller kept no other
    /// handle on it.
    ///
    /// # Errors
    /// As [`super::run`].
    pub fn run_owned(
        &mut self,
        inputs: Vec<Buffer>,
        check: Option<f64>,
    ) -> Result<Vec<Buffer>, RunError> {
        let gpu = match self.device {
            Device::Cpu => None,
            Device::Cuda(i) => Some(cuda::gpu(i)?),
        };
        let inputs = if inputs.iter().all(|b| b.device() == self.device) {
            inputs
        } else {
            super::on_device(&inputs, self.device)?
        };
        let Prepared { graph, steps, groups, gpu_groups, readers, outputs, dirty, .. } = self;
        let tracing = trace::enabled();
        let mut run = Run {
            graph,
            gpu,
            tracing,
            check,
            memory: tracing.then(MemoryPeak::default),
            bufs: Bufs { slots: vec![None; readers.len()], log: None },
            readers: readers.clone(),
            in_flight: Vec::new(),
            waited: Duration::ZERO,
        };
        for (&n, b) in graph.inputs().iter().zip(inputs) {
            run.bufs.insert(n, b);
        }
        // Whatever failed, no collective is left in flight: the group's next one must find
        // this rank's sequence where the other ranks' is.
        let ran = run.steps(steps, (groups, gpu_groups), dirty);
        let landed = run.land_all();
        ran?;
        landed?;
        if let Some(memory) = run.memory {
            trace::record_memory(memory);
        }
        Ok(outputs.iter().map(|o| run.bufs[o].clone()).collect())
    }
}

/// The state of one run of a plan.
struct Run<'a> {
    graph: &'a Graph,
    gpu: Option<&'static cuda::Gpu>,
    tracing: bool,
    check: Option<f64>,
    memory: Option<MemoryPeak>,
    bufs: Bufs,
    /// Readers still to come, per node.
    readers: Vec<u32>,
    /// Collectives issued to their groups' threads, in issue order, not yet waited for.
    in_flight: Vec<InFlight>,
    /// How long the last traced GPU step waited for the device (`settle`).
    waited: Duration,
}

/// A collective communicating while later steps run.
struct InFlight {
    node: NodeId,
    flight: Flight,
    issued: Instant,
    bytes_read: u64,
}

enum Flight {
    /// On a host group's communication thread.
    Host(collective::Pending<Buffer>),
    /// On an NCCL communicator's stream.
    Device(cuda::Queued),
}

impl Run<'_> {
    /// One read of `n` is done; its buffer is freed after the last.
    fn done_reading(&mut self, n: NodeId) {
        let r = &mut self.readers[n.index()];
        *r -= 1;
        if *r == 0 {
            self.bufs.remove(&n);
        }
    }

    /// GPU work is queued, not done: a traced step waits for it so its time is its own, and
    /// the wait is noted for the step's event.
    fn settle(&mut self, at: &Node) -> Result<(), RunError> {
        match self.gpu {
            Some(g) if self.tracing => {
                let started = Instant::now();
                let waited = g.synchronize();
                self.waited = started.elapsed();
                waited.map_err(|error| RunError {
                    error,
                    op: Some(at.op.name()),
                    origin: at.origin,
                })
            }
            _ => Ok(()),
        }
    }

    /// Records a traced step and the memory live while its output is written.
    fn traced(
        &mut self,
        started: Instant,
        mut event: trace::Event,
        new: Option<(NodeId, &Buffer)>,
    ) {
        event.device = self.gpu.map_or(Device::Cpu, |g| g.device());
        event.waited = std::mem::take(&mut self.waited);
        trace::record(started, event);
        trace::track_memory(self.memory.as_mut(), self.graph, self.bufs.iter(), new);
    }

    /// The plan's steps in order; a step that reads a collective's result first waits for it.
    /// While a CUDA graph is captured, each step notes where it started and what it left;
    /// while one is updated, a step that is not `dirty` (none of its values changed) is
    /// skipped, its results taken from the capture (see `cuda/graph.rs`).
    fn steps(
        &mut self,
        steps: &mut [PreparedStep],
        schedule: (&[rows::RowGroup], &[Arc<cuda::GroupKernel>]),
        dirty: &[bool],
    ) -> Result<(), RunError> {
        let capturing = self.gpu.filter(|&g| cuda::graph_capturing(g));
        let mut index = 0;
        while index < steps.len() {
            let group = schedule.0.iter().position(|g| g.start == index);
            let end = group.map_or(index + 1, |g| schedule.0[g].end);
            if let Some(gpu) = self.gpu
                && !dirty[index..end].contains(&true)
                && let Some(left) = cuda::skip_graph_steps(gpu, index, end)
            {
                for (n, b) in left? {
                    self.bufs.insert(NodeId::new(n), b);
                }
                index = end;
                continue;
            }
            if let Some(gpu) = capturing {
                cuda::graph_step_starts(gpu, index);
                self.bufs.log = Some(Vec::new());
            }
            self.step(steps, index, group, schedule)?;
            if let Some(gpu) = capturing {
                cuda::graph_step_left(gpu, index, self.bufs.left());
            }
            index = end;
        }
        if let Some(gpu) = capturing {
            cuda::graph_step_starts(gpu, steps.len());
        }
        Ok(())
    }

    /// Step `index` (the row group `group`, when it starts one).
    fn step(
        &mut self,
        steps: &mut [PreparedStep],
        index: usize,
        group: Option<usize>,
        (groups, gpu_groups): (&[rows::RowGroup], &[Arc<cuda::GroupKernel>]),
    ) -> Result<(), RunError> {
        let graph = self.graph;
        if let Some(g) = group {
            let group = &groups[g];
            for s in &steps[group.start..group.end] {
                if let PreparedStep::Kernel { step, .. } = s {
                    self.land(&step.inputs)?;
                }
            }
            return self.row_group(&mut steps[group.start..group.end], group, gpu_groups.get(g));
        }
        match &mut steps[index] {
            PreparedStep::Node(n) => {
                self.land(graph.arg_slice(*n))?;
                self.node(*n, None)
            }
            PreparedStep::Alias(node, of) => {
                self.land(&[*of])?;
                let shared = self.bufs[&*of].clone();
                self.done_reading(*of);
                self.bufs.insert(*node, shared);
                Ok(())
            }
            PreparedStep::AssignInPlace { node, base, values } => {
                self.land(&[*base, values.0])?;
                self.assign(*node, *base, (values.0, &values.1))
            }
            PreparedStep::ScatterOntoFill(node, fill) => {
                self.land(&graph.arg_slice(*node)[1..])?;
                let Op::Full(value) = graph.node(*fill).op else {
                    return Err(RunError::from(RuntimeError::Graph(
                        kiln_ir::IrError::InvalidGraph("a scatter's fill is not a constant".into()),
                    )));
                };
                self.node(*node, Some(value))
            }
            PreparedStep::ScatterInPlace(node) => {
                self.land(graph.arg_slice(*node))?;
                self.scatter_in_place(*node)
            }
            PreparedStep::Library(node, operands) => {
                self.land(&operands.iter().map(|(n, _)| *n).collect::<Vec<_>>())?;
                self.library(*node, operands)
            }
            PreparedStep::Kernel { step, kernel, compile } => {
                self.land(&step.inputs)?;
                self.kernel(step, kernel.as_ref(), compile.take())
            }
        }
    }

    /// Issues a collective to its engine, to run while the steps after it do, until one
    /// reads its result: a host group's communication thread for a CPU plan, the NCCL
    /// communicator's stream for a GPU plan. `false` for a collective that runs in place (a
    /// GPU plan's tensors on a host group, which go through host copies).
    fn issue(&mut self, n: NodeId, c: &Collective) -> Result<bool, RunError> {
        let nccl = match self.gpu {
            None => None,
            Some(_) => match collective::engine(c.group) {
                Ok(collective::Engine::Nccl(nccl)) => Some(nccl),
                _ => return Ok(false),
            },
        };
        let issued = Instant::now();
        let node = self.graph.node(n);
        let arg = self.graph.arg_slice(n)[0];
        let input = self.bufs[&arg].clone();
        let bytes_read = trace::bytes(&input);
        let at = |error| RunError { error, op: Some(node.op.name()), origin: node.origin };
        let flight = match nccl {
            Some(nccl) => Flight::Device(nccl.start(c, input).map_err(at)?),
            None => {
                let len = collective::result_len(c, input.len());
                Flight::Host(collective::start(c, input, len).map_err(at)?)
            }
        };
        self.in_flight.push(InFlight { node: n, flight, issued, bytes_read });
        self.done_reading(arg);
        Ok(true)
    }

    /// Waits for the collectives whose results `reads` names.
    fn land(&mut self, reads: &[NodeId]) -> Result<(), RunError> {
        if self.in_flight.is_empty() {
            return Ok(());
        }
        for n in reads {
            if let Some(i) = self.in_flight.iter().position(|f| f.node == *n) {
                let f = self.in_flight.remove(i);
                self.arrive(f)?;
            }
        }
        Ok(())
    }

    /// Waits for every collective still in flight; the first failure is the result.
    fn land_all(&mut self) -> Result<(), RunError> {
        let mut first = Ok(());
        for f in std::mem::take(&mut self.in_flight) {
            let landed = self.arrive(f);
            if first.is_ok() {
                first = landed;
            }
        }
        first
    }

    /// Waits for one collective and makes its result a live buffer.
    fn arrive(&mut self, f: InFlight) -> Result<(), RunError> {
        let waiting = Instant::now();
        let node = self.graph.node(f.node);
        let (out, done) = match f.flight {
            Flight::Host(pending) => pending.wait_timed(),
            // Queued, not waited for: when tracing, `settle` waits so the time is its own.
            Flight::Device(queued) => (queued.land(), waiting),
        };
        let out =
            out.map_err(|error| RunError { error, op: Some(node.op.name()), origin: node.origin })?;
        self.settle(node)?;
        if self.tracing {
            let name = node.op.name();
            let mut e =
                trace::plain_event(name, StepKind::Collective, name.to_string(), String::new());
            e.shape = node.shape.to_string();
            e.bytes_read = f.bytes_read;
            e.bytes_written = trace::bytes(&out);
            e.sources = node.origin.into_iter().collect();
            e.duration = waiting.elapsed();
            e.overlapped = done.min(waiting).saturating_duration_since(f.issued);
            self.traced(waiting, e, Some((f.node, &out)));
        }
        self.bufs.insert(f.node, out);
        Ok(())
    }

    /// A node that is not a kernel (gather, scatter, cumsum, ...); `fill` is the value of a
    /// scatter's constant base, when its kernel was skipped.
    fn node(&mut self, n: NodeId, fill: Option<Scalar>) -> Result<(), RunError> {
        let started = Instant::now();
        let graph = self.graph;
        let args = graph.arg_slice(n);
        if let Op::Collective(c) = &graph.node(n).op
            && self.issue(n, c)?
        {
            return Ok(());
        }
        let (out, kind, bytes_read) = {
            let (arg_bufs, (out, kind)) = match fill {
                Some(value) => {
                    let arg_bufs: Vec<&Buffer> = args[1..].iter().map(|a| &self.bufs[a]).collect();
                    let out = native::scatter_into(
                        graph,
                        n,
                        native::Base::Fill(value, graph.node(n).dtype),
                        &arg_bufs,
                    )?;
                    (arg_bufs, (out, StepKind::Library))
                }
                None => {
                    let arg_bufs: Vec<&Buffer> = args.iter().map(|a| &self.bufs[a]).collect();
                    let out = dispatch::eval_node_on(self.gpu, graph, n, &arg_bufs)?;
                    if let (Some(scale), Some(_)) = (self.check, self.gpu) {
                        dispatch::check_custom(graph, n, &arg_bufs, &out.0, scale)?;
                    }
                    (arg_bufs, out)
                }
            };
            (out, kind, arg_bufs.iter().map(|b| trace::bytes(b)).sum())
        };
        let node = graph.node(n);
        self.settle(node)?;
        if self.tracing {
            let name = node.op.name();
            let mut e = trace::plain_event(name, kind, name.to_string(), String::new());
            e.shape = node.shape.to_string();
            e.bytes_read = bytes_read;
            e.bytes_written = trace::bytes(&out);
            e.sources = node.origin.into_iter().collect();
            e.duration = started.elapsed();
            self.traced(started, e, Some((n, &out)));
        }
        // A scatter onto a fill never read its base (no step wrote it).
        let read = if fill.is_some() { &args[1..] } else { args };
        for &a in read {
            self.done_reading(a);
        }
        self.bufs.insert(n, out);
        Ok(())
    }

    /// An `Assign` the plan writes into its base's buffer ([`PreparedStep::AssignInPlace`]):
    /// in place, or into a copy when the buffer is shared (a graph input the caller holds).
    fn assign(
        &mut self,
        n: NodeId,
        base: NodeId,
        (values, src): (NodeId, &kiln_ir::View),
    ) -> Result<(), RunError> {
        let node = self.graph.node(n);
        let at = |error| RunError { error, op: Some(node.op.name()), origin: node.origin };
        let Op::Assign(view) = &node.op else {
            return Err(at(RuntimeError::Graph(kiln_ir::IrError::InvalidGraph(
                "an in-place assign of another op".into(),
            ))));
        };
        if self.gpu.is_some() {
            return Err(at(RuntimeError::Graph(kiln_ir::IrError::InvalidGraph(
                "an in-place assign in a GPU plan".into(),
            ))));
        }
        let started = Instant::now();
        // In place when nothing else holds the base's buffer (a `cat` writes each piece into
        // one buffer instead of copying the whole result once per piece), else into a copy.
        let mut own = self.bufs.take(base);
        let in_place = own
            .as_mut()
            .is_some_and(|own| native::assign_in_place(own, view, &self.bufs[&values], src));
        let (out, bytes_read) = match own {
            Some(own) if in_place => (own, trace::bytes(&self.bufs[&values])),
            _ => {
                if let Some(own) = own {
                    self.bufs.insert(base, own);
                }
                let out = native::assign_from(&self.bufs[&base], view, &self.bufs[&values], src)
                    .map_err(at)?;
                (out, trace::bytes(&self.bufs[&base]) + trace::bytes(&self.bufs[&values]))
            }
        };
        if self.tracing {
            let mut e =
                trace::plain_event("assign", StepKind::Library, "assign".into(), String::new());
            e.shape = node.shape.to_string();
            e.bytes_read = bytes_read;
            e.bytes_written = trace::bytes(&out);
            e.sources = node.origin.into_iter().collect();
            e.duration = started.elapsed();
            self.traced(started, e, Some((n, &out)));
        }
        self.done_reading(base);
        self.done_reading(values);
        self.bufs.insert(n, out);
        Ok(())
    }

    /// A scatter the plan writes into its base's buffer ([`PreparedStep::ScatterInPlace`]): in
    /// place when nothing else holds the buffer (a value computed in this plan, a donated
    /// input: a static key/value cache's old keys), else as any scatter, into a copy.
    fn scatter_in_place(&mut self, n: NodeId) -> Result<(), RunError> {
        let graph = self.graph;
        let args = graph.arg_slice(n);
        let mut own = self.bufs.take(args[0]);
        let Some(base) = own.take_if(|b| self.gpu.is_none() && b.is_unique_on_host()) else {
            if let Some(b) = own {
                self.bufs.insert(args[0], b);
            }
            return self.node(n, None);
        };
        let started = Instant::now();
        let (index, src) = (&self.bufs[&args[1]], &self.bufs[&args[2]]);
        let bytes_read = trace::bytes(index) + trace::bytes(src);
        let out = native::scatter_into(graph, n, native::Base::Own(base), &[index, src])?;
        if self.tracing {
            let node = graph.node(n);
            let name = node.op.name();
            let mut e =
                trace::plain_event(name, StepKind::Library, name.to_string(), String::new());
            e.shape = node.shape.to_string();
            e.bytes_read = bytes_read;
            e.bytes_written = trace::bytes(src);
            e.sources = node.origin.into_iter().collect();
            e.duration = started.elapsed();
            self.traced(started, e, Some((n, &out)));
        }
        for &a in args {
            self.done_reading(a);
        }
        self.bufs.insert(n, out);
        Ok(())
    }

    /// A matrix product: `gemm` on the CPU, cuBLAS on a GPU.
    fn library(
        &mut self,
        node: NodeId,
        operands: &[(NodeId, kiln_ir::View)],
    ) -> Result<(), RunError> {
        let started = Instant::now();
        let n = self.graph.node(node);
        let at = |error| RunError { error, op: Some(n.op.name()), origin: n.origin };
        let mut kind = StepKind::Library;
        let out = match (&n.op, operands) {
            (Op::MatMul, [(a, va), (b, vb)]) => {
                let (a, b) = (&self.bufs[a], &self.bufs[b]);
                let (out, ran) =
                    dispatch::matmul_on(self.gpu, a, va, b, vb, n.origin).map_err(at)?;
                kind = ran;
                out
            }
            // A slice's gradient or an assignment whose values are read through a view
            // (the planner sends them here on the CPU only).
            (Op::Unview { view, shape }, [(x, src)]) => {
                native::unview_from(&self.bufs[x], src, view, shape.numel()).map_err(at)?
            }
            (Op::Assign(view), [(base, _), (values, src)]) => {
                native::assign_from(&self.bufs[base], view, &self.bufs[values], src).map_err(at)?
            }
            // A user's op on the CPU, reading its operands through their views.
            (Op::Custom(c), _) => {
                let inputs: Vec<_> = operands.iter().map(|(a, v)| (&self.bufs[a], v)).collect();
                crate::custom::run_cpu(c, &inputs, self.check.is_some()).map_err(at)?
            }
            _ => {
                // Fused attention: the planner reads views into it on the CPU only.
                let bufs: Vec<&Buffer> = operands.iter().map(|(a, _)| &self.bufs[a]).collect();
                let views: Vec<kiln_ir::View> = operands.iter().map(|(_, v)| v.clone()).collect();
                native::attention(&bufs, &views, &n.op).map_err(at)?
            }
        };
        self.settle(n)?;
        if self.tracing {
            let name = n.op.name();
            let ops = match (&n.op, self.gpu) {
                (Op::MatMul, None) => crate::matmul::cpu_path(n.dtype),
                _ => name,
            };
            let mut e = trace::plain_event(name, kind, ops.into(), String::new());
            let shapes: Vec<String> = operands.iter().map(|(_, v)| v.shape().to_string()).collect();
            e.shape = shapes.join(if name == "matmul" { " @ " } else { ", " });
            e.bytes_read = operands.iter().map(|(a, _)| trace::bytes(&self.bufs[a])).sum();
            e.bytes_written = trace::bytes(&out);
            e.sources = n.origin.into_iter().collect();
            e.duration = started.elapsed();
            self.traced(started, e, Some((node, &out)));
        }
        for (o, _) in operands {
            self.done_reading(*o);
        }
        self.bufs.insert(node, out);
        Ok(())
    }

    /// A fused kernel, on the CPU or a GPU; `compile` is its compile time when this is its
    /// first run.
    fn kernel(
        &mut self,
        k: &KernelStep,
        kernel: Option<&Arc<CpuKernel>>,
        compile: Option<Duration>,
    ) -> Result<(), RunError> {
        let started = Instant::now();
        let (outs, compile, generated, cuda_marks) = match self.gpu {
            None => {
                let outs = cpu::run_kernel(self.graph, k, kernel.map(|k| &**k), &self.bufs)?;
                (outs, compile, kernel.is_some(), Vec::new())
            }
            Some(g) => {
                let run = dispatch::run_gpu_kernel(g, self.graph, k, &self.bufs)?;
                self.settle(self.graph.node(k.outputs[0]))?;
                // Compiled while planning (in parallel), or now.
                (run.outputs, compile.or(run.compile), true, run.marks)
            }
        };
        if self.tracing {
            let info = KernelRun { compiled: kernel.cloned(), generated, compile, cuda_marks };
            let read = k.inputs.iter().map(|i| trace::bytes(&self.bufs[i])).sum();
            let written = outs.iter().map(trace::bytes).sum();
            let e = trace::kernel_event(self.graph, k, info, read, written, started.elapsed());
            self.traced(started, e, Some((k.outputs[0], &outs[0])));
        }
        match self.check {
            // A kernel that could not be compiled ran on the reference executor: comparing it
            // with the reference would compare the reference with itself.
            Some(_) if !generated => check::note_unchecked(&k.kernel),
            Some(scale) => {
                let expected = check::kernel_reference(self.graph, k, &self.bufs)?;
                for (i, (out, want)) in outs.iter().zip(&expected).enumerate() {
                    check::compare(self.graph, k, i, out, want, scale)?;
                }
            }
            None => {}
        }
        for &n in &k.inputs {
            self.done_reading(n);
        }
        for (node, buf) in k.outputs.iter().zip(outs) {
            self.bufs.insert(*node, buf);
        }
        Ok(())
    }

    /// A row group: its kernels run tile by tile (see [`crate::rows`]).
    fn row_group(
        &mut self,
        steps: &mut [PreparedStep],
        group: &rows::RowGroup,
        gpu_kernel: Option<&Arc<cuda::GroupKernel>>,
    ) -> Result<(), RunError> {
        let started = Instant::now();
        // The oracle compares every kernel's full outputs: a checked run keeps the group's
        // internal buffers whole.
        let keep_all = self.check.is_some();
        let (outs, events) = match (self.gpu, gpu_kernel) {
            (Some(g), Some(kernel)) => {
                let members: Vec<&KernelStep> = steps
                    .iter()
                    .map(|s| match s {
                        PreparedStep::Kernel { step, .. } => &**step,
                        _ => unreachable!("a row group holds kernel steps"),
                    })
                    .collect();
                let (graph, bufs) = (self.graph, &self.bufs);
                let dropped = if keep_all { &[][..] } else { &group.internal[..] };
                cuda::run_row_group(g, graph, &members, kernel, dropped, bufs, self.tracing)?
            }
            _ => rows::run_group(self.graph, steps, group, &self.bufs, self.tracing, keep_all)?,
        };
        // Laid end to end from the group's start: the kernels ran interleaved, tile by tile,
        // and their durations are their shares of the group's time.
        let mut at = started;
        for mut e in events {
            e.device = self.gpu.map_or(Device::Cpu, |g| g.device());
            let next = at + e.duration;
            trace::record(at, e);
            at = next;
        }
        for (node, buf) in outs {
            self.bufs.insert(node, buf);
        }
        trace::track_memory(self.memory.as_mut(), self.graph, self.bufs.iter(), None);
        // In order: a buffer a later member reads is not freed before that member is checked
        // (its read is counted).
        for s in steps.iter() {
            let PreparedStep::Kernel { step: k, .. } = s else { continue };
            if let Some(scale) = self.check {
                let expected = check::kernel_reference(self.graph, k, &self.bufs)?;
                for (i, (out, want)) in k.outputs.iter().zip(&expected).enumerate() {
                    check::compare(self.graph, k, i, &self.bufs[out], want, scale)?;
                }
            }
            for &n in &k.inputs {
                if keep_all || !group.internal.contains(&n) {
                    self.done_reading(n);
                }
            }
        }
        Ok(())
    }
}

/// The live buffers of a run, by node index.
pub(crate) struct Bufs {
    slots: Vec<Option<Buffer>>,
    /// The nodes given buffers since the log was started (a step being captured).
    log: Option<Vec<NodeId>>,
}

impl Bufs {
    fn insert(&mut self, n: NodeId, b: Buffer) {
        if let Some(log) = &mut self.log {
            log.push(n);
        }
        self.slots[n.index()] = Some(b);
    }

    fn remove(&mut self, n: &NodeId) {
        self.slots[n.index()] = None;
    }

    fn take(&mut self, n: NodeId) -> Option<Buffer> {
        self.slots[n.index()].take()
    }

    /// The live buffers.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (NodeId, &Buffer)> {
        self.slots.iter().enumerate().filter_map(|(i, b)| b.as_ref().map(|b| (NodeId::new(i), b)))
    }

    /// Ends the log: the logged nodes still live, with their device blocks.
    fn left(&mut self) -> Vec<cuda::StepOutput> {
        let log = self.log.take().unwrap_or_default();
        log.into_iter()
            .filter_map(|n| {
                let b = self.slots[n.index()].as_ref()?;
                let block = b.device_block()?;
                Some(cuda::StepOutput { node: n.index(), block, dtype: b.dtype(), len: b.len() })
            })
            .collect()
    }
}

impl std::ops::Index<&NodeId> for Bufs {
    type Output = Buffer;
    fn index(&self, n: &NodeId) -> &Buffer {
        self.slots[n.index()]
            .as_ref()
            .expect("a step reads only buffers computed before it and not yet freed")
    }
}
