//! A GPU plan replayed as a CUDA graph (see `cuda::graph`): the first call captures the plan
//! with copies into its own input buffers before it and out of its output buffers after it;
//! every later call walks the plan's changed steps on the host to update the launches whose
//! arguments changed (the copies' addresses, constants, random keys) and launches the graph
//! once.

use kiln_ir::Op;
use kiln_ir::settings::Setting;

use super::{Prepared, all_on_device};
use crate::{Buffer, Device, RunError, cuda, trace};

/// How [`Prepared::run_graphed`] ran a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphRun {
    /// Captured as a CUDA graph, then launched.
    Captured {
        /// Kernel launches the graph holds.
        launches: usize,
    },
    /// The graph launched again.
    Replayed {
        /// Launches that took new arguments first.
        updated: usize,
    },
    /// Launched step by step, for this reason.
    Stepwise(String),
}

/// A plan's CUDA graph, or why it has none.
#[derive(Default)]
pub(crate) enum GraphState {
    /// Not captured yet.
    #[default]
    Untried,
    Ready(Box<cuda::Captured>),
    /// The capture or an update failed: the plan runs step by step from then on.
    Unavailable(String),
}

impl Prepared {
    /// Runs the plan as [`Prepared::run`] does; on a GPU, as a CUDA graph: captured by the
    /// first call, then launched once per call (see the module documentation). A plan that
    /// cannot be captured (host work, a collective), a traced run and `KILN_CUDA_GRAPHS=0`
    /// run step by step, and [`GraphRun::Stepwise`] says why.
    ///
    /// # Errors
    /// As [`Prepared::run`].
    pub fn run_graphed(&mut self, inputs: &[Buffer]) -> Result<(Vec<Buffer>, GraphRun), RunError> {
        let Device::Cuda(ordinal) = self.device else {
            let why = "the plan runs on the CPU".to_string();
            return Ok((self.run(inputs, None)?, GraphRun::Stepwise(why)));
        };
        let why = if Setting::CudaGraphs.text().is_some_and(|v| v.trim() == "0") {
            Some("KILN_CUDA_GRAPHS=0".to_string())
        } else if trace::enabled() {
            Some("profiling times each step".to_string())
        } else {
            None
        };
        if matches!(self.cuda_graph, GraphState::Untried) && self.communicates() {
            let why = "the plan communicates (collectives run outside graphs)";
            self.cuda_graph = GraphState::Unavailable(why.to_string());
        }
        if let Some(why) = why {
            return Ok((self.run(inputs, None)?, GraphRun::Stepwise(why)));
        }
        let gpu = cuda::gpu(ordinal)?;
        let inputs = &*all_on_device(inputs, self.device)?;
        // The results: new buffers from the device's cache on every call, which the graph's
        // last launches copy the plan's outputs into.
        let results = self
            .outputs
            .iter()
            .map(|&o| {
                let node = self.graph.node(o);
                Buffer::on_gpu(gpu, node.dtype, node.shape.numel())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let walked = match std::mem::take(&mut self.cuda_graph) {
            GraphState::Ready(mut captured) => {
                cuda::update_graph(&mut captured, || self.walk(gpu, inputs, &results))
                    .map(|((), updated)| (captured, GraphRun::Replayed { updated }))
                    .map_err(|e| e.to_string())
            }
            GraphState::Untried => {
                // Compiled and loaded before the capture, which should hold launches only.
                cuda::load_copies(gpu)?;
                let arena = cuda::Arena::new(gpu);
                cuda::capture_graph(gpu, arena, || self.walk(gpu, inputs, &results))
                    .map(|((), captured)| {
                        let launches = captured.launches();
                        (Box::new(captured), GraphRun::Captured { launches })
                    })
                    .map_err(|e| e.to_string())
            }
            GraphState::Unavailable(why) => Err(why),
        };
        match walked {
            Ok((captured, run)) => {
                // The graph holds every value now.
                self.dirty.fill(false);
                let launched = captured.launch();
                self.cuda_graph = GraphState::Ready(captured);
                launched?;
                Ok((results, run))
            }
            Err(why) => {
                // Nothing was launched: the plan runs step by step, now and from now on.
                self.cuda_graph = GraphState::Unavailable(why.clone());
                Ok((self.run(inputs, None)?, GraphRun::Stepwise(why)))
            }
        }
    }

    /// Whether the plan has a collective.
    fn communicates(&self) -> bool {
        let graph = &self.graph;
        graph.topo_order().iter().any(|&n| matches!(graph.node(n).op, Op::Collective(_)))
    }

    /// The plan as a graph holds it: `inputs` copied into buffers of the graph's own, the
    /// plan run on those, its outputs copied into `results`.
    fn walk(
        &mut self,
        gpu: &'static cuda::Gpu,
        inputs: &[Buffer],
        results: &[Buffer],
    ) -> Result<(), RunError> {
        let own = inputs
            .iter()
            .map(|b| Buffer::on_gpu(gpu, b.dtype(), b.len()))
            .collect::<Result<Vec<_>, _>>()?;
        copy_all(gpu, inputs, &own)?;
        let outputs = self.run(&own, None)?;
        copy_all(gpu, &outputs, results)?;
        Ok(())
    }
}

/// Copies each of `from` into the buffer of `to` at the same position (same dtype and
/// length).
fn copy_all(gpu: &'static cuda::Gpu, from: &[Buffer], to: &[Buffer]) -> Result<(), RunError> {
    let mut copies = Vec::with_capacity(from.len());
    for (a, b) in from.iter().zip(to) {
        let bytes = (a.len() * a.dtype().size_in_bytes()) as u64;
        copies.push((a.device_ptr(gpu)?, b.device_ptr(gpu)?, bytes));
    }
    // SAFETY: both buffers of each pair are on `gpu`, hold `bytes` bytes (same dtype and
    // length) and start at blocks of the device's allocator (512-byte aligned); they live
    // until the stream has run the copies, since freed blocks are reused only by later work
    // on the same stream (a graph's own blocks, by its later launches).
    unsafe { cuda::copies(gpu, &copies) }?;
    Ok(())
}
