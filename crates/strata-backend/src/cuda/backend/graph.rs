//! Decode steps as CUDA graphs (`STRATA_CUDA_GRAPHS=on`): a pass the model hands to
//! [`Backend::graphed`](crate::Backend::graphed) is captured on the backend's own
//! stream once, and the steps after it replay that graph: the pass's host side runs
//! against the captured ops ([`tape`](super::tape)) instead of the driver, the kernels
//! whose arguments changed (a position, a key count, an attention split) are updated in
//! the executable graph, and it is launched once. The device runs the pass's kernels back
//! to back, and the host launches none of them.
//!
//! A shape's first pass runs uncaptured (it grows the scratch the shape needs; nothing
//! may be allocated while capturing). A replay whose pass asks for other work than the
//! graph holds (another kernel, a copy elsewhere, an op more or fewer) is captured again.
//! While capturing or replaying, anything a graph cannot hold (an allocation, a copy from
//! pageable memory, staging that would have to wait for the device) refuses: the pass
//! then runs again uncaptured. A shape whose capture the driver itself refuses runs
//! kernel by kernel from then on.

use std::collections::{HashMap, HashSet};

use super::tape::{Launch, Op, node_params};
use super::*;

/// One executable graph.
struct Exec(sys::CUgraphExec);

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: the handle came from `cuGraphInstantiate` and is dropped once; nothing
        // launches it afterwards (the map held it).
        let _ = unsafe { cudarc::driver::result::graph::exec_destroy(self.0) };
    }
}

/// One captured graph.
struct Graph(sys::CUgraph);

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: a graph a capture made, destroyed once.
        let _ = unsafe { cudarc::driver::result::graph::destroy(self.0) };
    }
}

/// A shape's executable graph, and what replaying it needs.
struct Captured {
    exec: Exec,
    /// The graph it was made from, whose nodes name the executable's (kept with them) —
    /// `None` when the pass cannot be replayed (its nodes are not its ops one for one).
    replay: Option<(Graph, Vec<sys::CUgraphNode>)>,
    /// The pass's ops, in order: node `i` of the graph runs op `i`.
    ops: Vec<Op>,
}

// SAFETY: graph, node and executable handles are plain data; every use is under the
// backend's `Graphs` lock.
unsafe impl Send for Captured {}

/// How one pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Kernel by kernel.
    Direct,
    /// Captured, then launched as a graph.
    Capture,
}

/// The shapes this backend has run, and their executable graphs.
#[derive(Default)]
pub(super) struct Graphs {
    seen: HashSet<u64>,
    refused: HashSet<u64>,
    execs: HashMap<u64, Captured>,
    /// Graphs launched; how many of them were replayed, updated in place from a capture or
    /// made anew; kernel nodes updated in replays.
    pub(super) launched: u64,
    pub(super) replayed: u64,
    pub(super) updated: u64,
    pub(super) made: u64,
    pub(super) nodes_updated: u64,
}

impl Graphs {
    /// How a pass of `shape` runs: uncaptured the first time (and always, once the
    /// driver refused its capture), captured after.
    pub(super) fn plan(&mut self, shape: u64) -> Plan {
        match self.refused.contains(&shape) || self.seen.insert(shape) {
            true => Plan::Direct,
            false => Plan::Capture,
        }
    }

    /// Runs `shape` kernel by kernel from now on.
    pub(super) fn refuse(&mut self, shape: u64) {
        self.refused.insert(shape);
        self.execs.remove(&shape);
    }

    /// Installs `graph`, a capture of `ops`, as the executable graph of `shape`. When its
    /// nodes are the ops one for one, it is made anew and kept for replays; else the
    /// shape's graph is updated in place when the driver can, or made anew.
    ///
    /// # Safety
    /// `graph` must be a valid graph captured in the current context.
    unsafe fn install(&mut self, shape: u64, graph: Graph, ops: Vec<Op>) -> Result<sys::CUgraphExec, DriverError> {
        // SAFETY: as the caller promises.
        if let Some(nodes) = unsafe { chain(graph.0, &ops) } {
            // SAFETY: as the caller promises.
            let exec =
                Exec(unsafe { cudarc::driver::result::graph::instantiate(graph.0, sys::CUgraphInstantiate_flags(0)) }?);
            self.made += 1;
            let handle = exec.0;
            self.execs.insert(shape, Captured { exec, replay: Some((graph, nodes)), ops });
            return Ok(handle);
        }
        if let Some(c) = self.execs.get_mut(&shape).filter(|c| c.replay.is_none()) {
            let mut info = std::mem::MaybeUninit::<sys::CUgraphExecUpdateResultInfo>::zeroed();
            // SAFETY: both handles are valid (the caller, and the map's); `info` is
            // written by the call.
            let rc = unsafe { sys::cuGraphExecUpdate_v2(c.exec.0, graph.0, info.as_mut_ptr()) };
            if rc == sys::CUresult::CUDA_SUCCESS {
                self.updated += 1;
                return Ok(c.exec.0);
            }
        }
        // SAFETY: as the caller promises.
        let exec =
            Exec(unsafe { cudarc::driver::result::graph::instantiate(graph.0, sys::CUgraphInstantiate_flags(0)) }?);
        self.made += 1;
        let handle = exec.0;
        self.execs.insert(shape, Captured { exec, replay: None, ops: Vec::new() });
        Ok(handle)
    }
}

/// The nodes of `graph` in the order they run, when it is one chain of `ops.len()` nodes
/// of the ops' kinds (a kernel node for each launch, a copy node for each copy); `None`
/// otherwise (work enqueued past the tape, cuBLAS's say).
///
/// # Safety
/// `graph` must be a valid graph.
unsafe fn chain(graph: sys::CUgraph, ops: &[Op]) -> Option<Vec<sys::CUgraphNode>> {
    use sys::CUgraphNodeType::{CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEMCPY};
    let ok = |rc: sys::CUresult| rc == sys::CUresult::CUDA_SUCCESS;
    let (mut node, mut n) = (std::ptr::null_mut(), 1usize);
    // SAFETY: room for one root node; `n` says how many were written, or that there are more.
    if ops.is_empty() || !ok(unsafe { sys::cuGraphGetRootNodes(graph, &mut node, &mut n) }) || n != 1 {
        return None;
    }
    let mut nodes = Vec::with_capacity(ops.len());
    loop {
        let mut ty = CU_GRAPH_NODE_TYPE_KERNEL;
        // SAFETY: `node` is a node of `graph`; `ty` is written by the call.
        let typed = ok(unsafe { sys::cuGraphNodeGetType(node, &mut ty) });
        let kind = match ops.get(nodes.len())? {
            Op::Kernel(_) => CU_GRAPH_NODE_TYPE_KERNEL,
            Op::Copy { .. } => CU_GRAPH_NODE_TYPE_MEMCPY,
        };
        if !typed || ty != kind {
            return None;
        }
        nodes.push(node);
        let (mut next, mut n) = (std::ptr::null_mut(), 0usize);
        // SAFETY: asks for the count alone (no array, no edge data).
        let counted =
            unsafe { sys::cuGraphNodeGetDependentNodes_v2(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut n) };
        match (ok(counted), n) {
            (true, 0) => break,
            (true, 1) => {}
            _ => return None,
        }
        // SAFETY: room for the one dependent node counted above.
        if !ok(unsafe { sys::cuGraphNodeGetDependentNodes_v2(node, &mut next, std::ptr::null_mut(), &mut n) }) {
            return None;
        }
        node = next;
    }
    (nodes.len() == ops.len()).then_some(nodes)
}

/// Why a capture did not give a graph.
enum Failed<E> {
    /// The pass's own error (nothing of it ran on the device).
    Work(E),
    /// Something the capture cannot hold, this once: run the pass again uncaptured.
    Refused,
    /// The driver would not capture or launch the pass: never capture its shape again.
    Driver(DriverError),
}

impl CudaBackend {
    /// [`Backend::graphed`] on a backend with graphs.
    pub(super) fn run_graphed<E: From<BackendError>>(
        &self,
        graphs: &Mutex<Graphs>,
        shape: u64,
        work: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut g = graphs.lock().unwrap_or_else(|e| e.into_inner());
        if g.plan(shape) == Plan::Direct {
            drop(g);
            return work();
        }
        let replayed = match g.execs.get(&shape).is_some_and(|c| c.replay.is_some()) {
            true => self.replay(&mut g, shape, work),
            false => Err(Failed::Refused),
        };
        let failed = match replayed {
            Ok(()) => return Ok(()),
            Err(Failed::Work(e)) => return Err(e),
            // Other work than the graph holds: captured again.
            Err(Failed::Refused) => match self.capture(&mut g, shape, work) {
                Ok(()) => return Ok(()),
                Err(f) => f,
            },
            Err(f) => f,
        };
        // Nothing captured ran: what the scratch says the device holds may not be there.
        self.forget_uploads();
        match failed {
            Failed::Work(e) => return Err(e),
            Failed::Refused => {}
            Failed::Driver(e) => {
                tracing::warn!(shape, error = ?e, "a CUDA graph capture failed: this batch shape runs kernel by kernel");
                g.refuse(shape);
            }
        }
        drop(g);
        work()
    }

    /// Runs `work`'s host side against `shape`'s captured ops; when it asks for the same
    /// work, updates the kernel nodes whose arguments changed and launches the graph.
    fn replay<E: From<BackendError>>(
        &self,
        g: &mut Graphs,
        shape: u64,
        work: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<(), Failed<E>> {
        let Some(c) = g.execs.get_mut(&shape) else { return Err(Failed::Refused) };
        self.prepare().map_err(Failed::Driver)?;
        self.tape().replay(std::mem::take(&mut c.ops));
        self.capturing.store(true, Ordering::Relaxed);
        let done = work();
        self.capturing.store(false, Ordering::Relaxed);
        let refused = self.refusal.swap(false, Ordering::Relaxed);
        let (mut ops, updates) = match self.tape().end_replay() {
            Ok(kept) if !refused && done.is_ok() => kept,
            Ok((ops, _)) | Err(ops) => {
                c.ops = ops;
                // The host side ran without its device work: nothing it uploaded is there.
                self.scratch().positions_host.clear();
                return Err(match done {
                    Err(e) if !refused => Failed::Work(e),
                    _ => Failed::Refused,
                });
            }
        };
        let Some((_, nodes)) = &c.replay else { return Err(Failed::Refused) };
        for (i, launch) in updates.iter().cloned() {
            // SAFETY: `nodes[i]` is the kernel node of op `i` in the graph `c.exec` was
            // made from (`chain`), and `launch` is a launch of the same function.
            unsafe { set_kernel(c.exec.0, nodes[i], &launch) }.map_err(Failed::Driver)?;
            ops[i] = Op::Kernel(launch);
        }
        c.ops = ops;
        let exec = c.exec.0;
        // SAFETY: `exec` is a valid executable graph of this context (the map keeps it).
        unsafe { self.launch_graph(g, exec) }?;
        g.replayed += 1;
        g.nodes_updated += updates.len() as u64;
        Ok(())
    }

    /// Launches `exec` on the compute stream, and counts it.
    ///
    /// # Safety
    /// `exec` must be a valid executable graph of this context, kept until it has run.
    unsafe fn launch_graph<E>(&self, g: &mut Graphs, exec: sys::CUgraphExec) -> Result<(), Failed<E>> {
        // SAFETY: as the caller promises.
        match unsafe { sys::cuGraphLaunch(exec, self.stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => {
                g.launched += 1;
                Ok(())
            }
            rc => Err(Failed::Driver(DriverError(rc))),
        }
    }

    /// Readies the backend for a captured or replayed pass: the stream idle, the staging
    /// filled from its start (so that a pass's copies read the same places each step),
    /// the positions uploaded again (so that each step uploads what its capture did),
    /// nothing refused yet.
    fn prepare(&self) -> Result<(), DriverError> {
        self.stream.synchronize()?;
        if let Some(staging) = &self.staging {
            staging.lock().unwrap_or_else(|e| e.into_inner()).restart();
        }
        self.scratch().positions_host.clear();
        self.refusal.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Captures `work`, installs it as `shape`'s graph and launches it.
    fn capture<E: From<BackendError>>(
        &self,
        g: &mut Graphs,
        shape: u64,
        work: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<(), Failed<E>> {
        let st = &self.stream;
        self.prepare().map_err(Failed::Driver)?;
        st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(Failed::Driver)?;
        self.tape().capture();
        self.capturing.store(true, Ordering::Relaxed);
        let done = work();
        self.capturing.store(false, Ordering::Relaxed);
        let ops = self.tape().end_capture();
        let status = st.capture_status();
        // SAFETY: the stream is capturing (begun above); the graph it gives is dropped or kept below.
        let ended = unsafe { cudarc::driver::result::stream::end_capture(st.cu_stream()) };
        let graph = match ended {
            Ok(graph) if !graph.is_null() => Some(Graph(graph)),
            _ => None,
        };
        let invalidated = !matches!(status, Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE));
        if self.refusal.swap(false, Ordering::Relaxed) {
            return Err(Failed::Refused);
        }
        match (done, ended, graph) {
            (Err(e), Ok(_), _) if !invalidated => Err(Failed::Work(e)),
            (_, Err(e), _) => Err(Failed::Driver(e)),
            (Ok(()), Ok(_), Some(graph)) if !invalidated => {
                // SAFETY: `graph` was just captured in this context; the exec outlives
                // the launch (the map keeps it until the next install of this shape,
                // which comes after a synchronisation).
                let exec = unsafe { g.install(shape, graph, ops) }.map_err(Failed::Driver)?;
                // SAFETY: `exec` is a valid executable graph of this context.
                unsafe { self.launch_graph(g, exec) }
            }
            _ => Err(Failed::Driver(DriverError(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED))),
        }
    }

    /// `Err` (and the capture or replay refused) when a graph is being captured or
    /// replayed: for what a graph cannot hold (allocations, synchronising copies) and for
    /// work a replayed graph does not hold.
    pub(super) fn not_capturing(&self, what: &str) -> BackendResult<()> {
        if !self.capturing.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.refusal.store(true, Ordering::Relaxed);
        Err(BackendError::Device { op: what.into(), msg: "not possible while capturing a CUDA graph".into() })
    }

    /// `Err` (and the replay refused) when a graph is being replayed: for device work
    /// that does not go through the tape.
    pub(super) fn not_replaying(&self, what: &str) -> BackendResult<()> {
        match self.capturing.load(Ordering::Relaxed) && self.tape().mode() == tape::Mode::Replay {
            true => self.not_capturing(what),
            false => Ok(()),
        }
    }

    /// Forgets what the scratch remembers uploading (a capture that did not run).
    fn forget_uploads(&self) {
        let mut s = self.scratch();
        s.positions_host.clear();
        s.freqs = None;
    }
}

/// Sets the parameters of kernel node `node` of `exec` to `launch`'s.
///
/// # Safety
/// `node` must be a kernel node of the graph `exec` was instantiated from, and `launch`'s
/// arguments must match its function's parameters.
unsafe fn set_kernel(exec: sys::CUgraphExec, node: sys::CUgraphNode, launch: &Launch) -> Result<(), DriverError> {
    let mut slots = [std::ptr::null_mut(); tape::MAX_ARGS];
    let n = launch.args.len().min(tape::MAX_ARGS);
    let params = node_params(launch, &mut slots[..n]);
    // SAFETY: as the caller promises; `params` points at `slots`, which point at
    // `launch.args`, all alive through the call (the driver copies the values).
    match unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec, node, &params) } {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        rc => Err(DriverError(rc)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_runs_directly_once_then_captured_until_refused() {
        let mut g = Graphs::default();
        assert_eq!(g.plan(1), Plan::Direct, "the first pass grows the scratch");
        assert_eq!(g.plan(1), Plan::Capture);
        assert_eq!(g.plan(1), Plan::Capture);
        assert_eq!(g.plan(2), Plan::Direct, "another batch size starts over");
        g.refuse(1);
        assert_eq!(g.plan(1), Plan::Direct);
        assert_eq!(g.plan(2), Plan::Capture);
    }
}
