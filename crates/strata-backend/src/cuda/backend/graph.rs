//! Decode steps as CUDA graphs (`STRATA_CUDA_GRAPHS=on`): a pass the model hands to
//! [`Backend::graphed`](crate::Backend::graphed) is captured on the backend's own
//! stream, the executable graph of its shape is updated in place with it (or made, the
//! first time or when the driver cannot update it) and launched once, so the device runs
//! the pass's kernels back to back instead of one host launch at a time.
//!
//! A shape's first pass runs uncaptured (it grows the scratch the shape needs; nothing
//! may be allocated while capturing). While capturing, anything the capture cannot hold
//! (an allocation, a copy from pageable memory, staging that would have to wait for the
//! device) refuses: the pass then runs again uncaptured. A shape whose capture the driver
//! itself refuses runs kernel by kernel from then on.

use std::collections::{HashMap, HashSet};

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

// SAFETY: a graph handle is plain data; every use is under the backend's `Graphs` lock.
unsafe impl Send for Exec {}

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
    execs: HashMap<u64, Exec>,
    /// Graphs launched, and how many of them were updated in place or made anew.
    pub(super) launched: u64,
    pub(super) updated: u64,
    pub(super) made: u64,
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

    /// The executable graph of `shape`, made to run `graph`: updated in place when the
    /// driver can, else made anew.
    ///
    /// # Safety
    /// `graph` must be a valid graph captured in the current context.
    unsafe fn install(&mut self, shape: u64, graph: sys::CUgraph) -> Result<sys::CUgraphExec, DriverError> {
        if let Some(exec) = self.execs.get(&shape) {
            let mut info = std::mem::MaybeUninit::<sys::CUgraphExecUpdateResultInfo>::zeroed();
            // SAFETY: both handles are valid (the caller, and the map's); `info` is
            // written by the call.
            let rc = unsafe { sys::cuGraphExecUpdate_v2(exec.0, graph, info.as_mut_ptr()) };
            if rc == sys::CUresult::CUDA_SUCCESS {
                self.updated += 1;
                return Ok(exec.0);
            }
        }
        // SAFETY: as the caller promises.
        let exec = unsafe { cudarc::driver::result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }?;
        self.made += 1;
        self.execs.insert(shape, Exec(exec));
        Ok(exec)
    }
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
        let failed = match self.capture(&mut g, shape, work) {
            Ok(()) => return Ok(()),
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

    /// Captures `work`, installs it as `shape`'s graph and launches it.
    fn capture<E: From<BackendError>>(
        &self,
        g: &mut Graphs,
        shape: u64,
        work: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<(), Failed<E>> {
        let st = &self.stream;
        // The stream idle: the staging memory may be filled from its start again.
        st.synchronize().map_err(Failed::Driver)?;
        if let Some(staging) = &self.staging {
            staging.lock().unwrap_or_else(|e| e.into_inner()).restart();
        }
        self.refusal.store(false, Ordering::Relaxed);
        st.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(Failed::Driver)?;
        self.capturing.store(true, Ordering::Relaxed);
        let done = work();
        self.capturing.store(false, Ordering::Relaxed);
        let status = st.capture_status();
        // SAFETY: the stream is capturing (begun above); the graph it gives is destroyed below.
        let ended = unsafe { cudarc::driver::result::stream::end_capture(st.cu_stream()) };
        let graph = match ended {
            Ok(graph) if !graph.is_null() => Some(graph),
            _ => None,
        };
        let destroy = |graph: Option<sys::CUgraph>| {
            if let Some(graph) = graph {
                // SAFETY: a graph the capture made, destroyed once.
                let _ = unsafe { cudarc::driver::result::graph::destroy(graph) };
            }
        };
        let invalidated = !matches!(status, Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE));
        if self.refusal.swap(false, Ordering::Relaxed) {
            destroy(graph);
            return Err(Failed::Refused);
        }
        match (done, ended, graph) {
            (Err(e), Ok(_), graph) if !invalidated => {
                destroy(graph);
                Err(Failed::Work(e))
            }
            (_, Err(e), graph) => {
                destroy(graph);
                Err(Failed::Driver(e))
            }
            (Ok(()), Ok(_), Some(graph)) if !invalidated => {
                // SAFETY: `graph` was just captured in this context; the exec outlives
                // the launch (the map keeps it until the next install of this shape,
                // which comes after a synchronisation).
                let installed = unsafe { g.install(shape, graph) };
                destroy(Some(graph));
                let exec = installed.map_err(Failed::Driver)?;
                // SAFETY: `exec` is a valid executable graph of this context.
                match unsafe { sys::cuGraphLaunch(exec, st.cu_stream()) } {
                    sys::CUresult::CUDA_SUCCESS => {
                        g.launched += 1;
                        Ok(())
                    }
                    rc => Err(Failed::Driver(DriverError(rc))),
                }
            }
            (_, _, graph) => {
                destroy(graph);
                Err(Failed::Driver(DriverError(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)))
            }
        }
    }

    /// `Err` (and the capture refused) when a graph is being captured: for what a
    /// capture cannot hold (allocations, synchronising copies).
    pub(super) fn not_capturing(&self, what: &str) -> BackendResult<()> {
        if !self.capturing.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.refusal.store(true, Ordering::Relaxed);
        Err(BackendError::Device { op: what.into(), msg: "not possible while capturing a CUDA graph".into() })
    }

    /// Forgets what the scratch remembers uploading (a capture that did not run).
    fn forget_uploads(&self) {
        let mut s = self.scratch();
        s.positions_host.clear();
        s.freqs = None;
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
