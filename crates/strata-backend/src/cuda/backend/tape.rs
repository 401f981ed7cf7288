//! What a pass puts on the compute stream, as the nodes of a CUDA graph hold it: each
//! kernel launch (function, shape, argument values) and each copy (addresses, bytes).
//!
//! A captured decode step keeps its list. The next step of the same shape then runs its
//! host side against the list instead of the driver ([`Mode::Replay`]): nothing is
//! enqueued, each op is compared with the captured one in its place. When the step asks
//! for the same work and only kernels' shapes or arguments differ (a position, a key
//! count, an attention split), those nodes are updated in the executable graph and it is
//! launched again: no capture, no launch per kernel. Anything else (another kernel, a
//! copy of other bytes or to another place, an op more or fewer) and the step is
//! captured again.

use cudarc::driver::{CudaFunction, sys};

/// The most arguments a kernel launch takes.
pub(super) const MAX_ARGS: usize = 24;

// Argument values are kept in 8-byte slots and handed to the driver by address: a 4-byte
// value must sit at its slot's first bytes.
#[cfg(not(target_endian = "little"))]
compile_error!("the CUDA launch arguments assume a little-endian host");

/// A value a kernel takes by value (a device address, a count, a scale).
pub(super) trait KernelArg: Copy {
    /// The value's bytes in the low bytes of a `u64`.
    fn bits(self) -> u64;
}

impl KernelArg for u64 {
    fn bits(self) -> u64 {
        self
    }
}

impl KernelArg for u32 {
    fn bits(self) -> u64 {
        u64::from(self)
    }
}

impl KernelArg for i32 {
    fn bits(self) -> u64 {
        u64::from(self as u32)
    }
}

impl KernelArg for f32 {
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

/// Argument values, each in an 8-byte slot.
#[derive(Clone, Copy)]
pub(super) struct Args {
    slots: [u64; MAX_ARGS],
    len: usize,
}

impl Args {
    pub(super) fn new() -> Self {
        Args { slots: [0; MAX_ARGS], len: 0 }
    }

    pub(super) fn push<T: KernelArg>(&mut self, v: T) {
        if let Some(slot) = self.slots.get_mut(self.len) {
            *slot = v.bits();
        }
        self.len += 1;
    }

    /// The slots, or `None` when more than [`MAX_ARGS`] were pushed.
    pub(super) fn get(&self) -> Option<&[u64]> {
        self.slots.get(..self.len)
    }
}

/// A kernel launch being put together: the function and its argument values, copied in
/// (so the caller's temporaries may go once they are pushed).
pub(super) struct Kernel<'f> {
    pub(super) func: &'f CudaFunction,
    pub(super) args: Args,
}

impl<'f> Kernel<'f> {
    pub(super) fn new(func: &'f CudaFunction) -> Self {
        Kernel { func, args: Args::new() }
    }

    /// Appends the next argument.
    pub(super) fn arg<T: KernelArg>(&mut self, v: &T) -> &mut Self {
        self.args.push(*v);
        self
    }
}

/// A kernel launch as its graph node holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Launch {
    /// The function's handle, as an address.
    pub(super) func: usize,
    pub(super) grid: (u32, u32, u32),
    pub(super) block: (u32, u32, u32),
    pub(super) args: Vec<u64>,
}

/// One piece of device work, as its graph node holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Kernel(Launch),
    /// `bytes` bytes from `src` (page-locked host memory or device memory) to `dst`.
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
}

/// Kernels of a replayed pass whose shape or arguments differ from the captured ones,
/// by index in the pass.
pub(super) type Updates = Vec<(usize, Launch)>;

/// How the ops of the pass in progress are handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Mode {
    /// Enqueued, not kept (no graph).
    #[default]
    Off,
    /// Enqueued on the capturing stream, and kept.
    Capture,
    /// Compared with the captured pass's ops, not enqueued.
    Replay,
}

/// What to do with an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Enqueue it.
    Enqueue,
    /// Nothing: the graph holds it (updated, if it differed).
    Held,
    /// The graph does not hold it: this pass must be captured again.
    Differs,
}

/// The ops of the pass in progress ([`Mode`]), and in a replay the updates the graph needs.
#[derive(Default)]
pub(super) struct Tape {
    mode: Mode,
    ops: Vec<Op>,
    /// Replay: the next captured op to compare, and whether one differed.
    at: usize,
    differs: bool,
    /// Replay: the kernels the graph must be updated with.
    updates: Updates,
}

impl Tape {
    pub(super) fn mode(&self) -> Mode {
        self.mode
    }

    /// Starts keeping the ops a capture enqueues.
    pub(super) fn capture(&mut self) {
        self.mode = Mode::Capture;
        self.ops.clear();
        self.updates.clear();
    }

    /// Starts comparing a pass with `captured`, the ops of its shape's graph.
    pub(super) fn replay(&mut self, captured: Vec<Op>) {
        self.mode = Mode::Replay;
        self.ops = captured;
        self.at = 0;
        self.differs = false;
        self.updates.clear();
    }

    /// A kernel launch of the pass.
    pub(super) fn kernel(&mut self, func: usize, grid: (u32, u32, u32), block: (u32, u32, u32), args: &[u64]) -> Step {
        let launch = || Launch { func, grid, block, args: args.to_vec() };
        match self.mode {
            Mode::Off => Step::Enqueue,
            Mode::Capture => {
                self.ops.push(Op::Kernel(launch()));
                Step::Enqueue
            }
            Mode::Replay => match self.ops.get(self.at) {
                Some(Op::Kernel(l)) if l.func == func => {
                    if (l.grid, l.block) != (grid, block) || l.args != args {
                        self.updates.push((self.at, launch()));
                    }
                    self.at += 1;
                    Step::Held
                }
                _ => self.differ(),
            },
        }
    }

    /// A copy of the pass.
    pub(super) fn copy(&mut self, dst: u64, src: u64, bytes: usize) -> Step {
        let op = Op::Copy { dst, src, bytes };
        match self.mode {
            Mode::Off => Step::Enqueue,
            Mode::Capture => {
                self.ops.push(op);
                Step::Enqueue
            }
            Mode::Replay if self.ops.get(self.at) == Some(&op) => {
                self.at += 1;
                Step::Held
            }
            Mode::Replay => self.differ(),
        }
    }

    fn differ(&mut self) -> Step {
        self.differs = true;
        Step::Differs
    }

    /// Ends a capture: the ops it enqueued.
    pub(super) fn end_capture(&mut self) -> Vec<Op> {
        self.mode = Mode::Off;
        std::mem::take(&mut self.ops)
    }

    /// Ends a replay: the captured ops, unchanged, and the updates the graph needs (the
    /// caller puts each into the list once the graph has it), or `Err` with the ops when
    /// the pass asked for other work than the graph holds.
    pub(super) fn end_replay(&mut self) -> Result<(Vec<Op>, Updates), Vec<Op>> {
        self.mode = Mode::Off;
        let ops = std::mem::take(&mut self.ops);
        if self.differs || self.at != ops.len() {
            return Err(ops);
        }
        Ok((ops, std::mem::take(&mut self.updates)))
    }
}

/// The kernel-node parameters of `launch`, reading its arguments from `slots` (one per
/// argument, which must outlive the driver call the parameters go to).
pub(super) fn node_params(launch: &Launch, slots: &mut [*mut std::ffi::c_void]) -> sys::CUDA_KERNEL_NODE_PARAMS {
    for (p, a) in slots.iter_mut().zip(&launch.args) {
        *p = (a as *const u64).cast_mut().cast();
    }
    // SAFETY: an all-zero CUDA_KERNEL_NODE_PARAMS is valid plain data (null pointers and
    // handles, zero sizes); the fields that matter are set below.
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    p.func = launch.func as sys::CUfunction;
    (p.gridDimX, p.gridDimY, p.gridDimZ) = launch.grid;
    (p.blockDimX, p.blockDimY, p.blockDimZ) = launch.block;
    p.sharedMemBytes = 0;
    p.kernelParams = slots.as_mut_ptr();
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(func: usize, grid: u32, args: &[u64]) -> Launch {
        Launch { func, grid: (grid, 1, 1), block: (128, 1, 1), args: args.to_vec() }
    }

    /// A pass of three ops: a kernel, a copy, a kernel.
    fn captured(t: &mut Tape, pos: u64) -> Vec<Op> {
        t.capture();
        assert_eq!(t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, pos]), Step::Enqueue);
        assert_eq!(t.copy(0x100, 0x200, 16), Step::Enqueue);
        assert_eq!(t.kernel(2, (8, 1, 1), (128, 1, 1), &[11]), Step::Enqueue);
        t.end_capture()
    }

    #[test]
    fn a_capture_keeps_every_op_in_order() {
        let mut t = Tape::default();
        let ops = captured(&mut t, 5);
        assert_eq!(
            ops,
            vec![
                Op::Kernel(launch(1, 4, &[10, 5])),
                Op::Copy { dst: 0x100, src: 0x200, bytes: 16 },
                Op::Kernel(launch(2, 8, &[11]))
            ]
        );
        assert_eq!(t.mode(), Mode::Off);
        assert_eq!(t.kernel(1, (1, 1, 1), (1, 1, 1), &[]), Step::Enqueue, "off: nothing kept");
        assert!(t.end_capture().is_empty());
    }

    #[test]
    fn the_same_pass_replays_with_nothing_to_update() {
        let mut t = Tape::default();
        let ops = captured(&mut t, 5);
        t.replay(ops.clone());
        assert_eq!(t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 5]), Step::Held);
        assert_eq!(t.copy(0x100, 0x200, 16), Step::Held);
        assert_eq!(t.kernel(2, (8, 1, 1), (128, 1, 1), &[11]), Step::Held);
        assert_eq!(t.end_replay(), Ok((ops, Vec::new())));
    }

    #[test]
    fn another_position_or_split_updates_just_that_node() {
        let mut t = Tape::default();
        let ops = captured(&mut t, 5);
        t.replay(ops);
        assert_eq!(t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 6]), Step::Held);
        assert_eq!(t.copy(0x100, 0x200, 16), Step::Held);
        assert_eq!(t.kernel(2, (9, 1, 1), (128, 1, 1), &[11]), Step::Held);
        let (mut ops, updates) = t.end_replay().unwrap();
        assert_eq!(ops, captured(&mut Tape::default(), 5), "the list is the graph's until it is updated");
        assert_eq!(updates, vec![(0, launch(1, 4, &[10, 6])), (2, launch(2, 9, &[11]))]);
        // The list as the updated graph holds it: the next step compares with that.
        for (i, l) in updates {
            ops[i] = Op::Kernel(l);
        }
        t.replay(ops);
        assert_eq!(t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 6]), Step::Held);
        assert_eq!(t.copy(0x100, 0x200, 16), Step::Held);
        assert_eq!(t.kernel(2, (9, 1, 1), (128, 1, 1), &[11]), Step::Held);
        assert_eq!(t.end_replay().map(|(_, u)| u), Ok(Vec::new()));
    }

    #[test]
    fn other_work_than_the_graph_holds_asks_for_a_capture() {
        let mut t = Tape::default();
        let ops = captured(&mut t, 5);
        // Another kernel in the first place.
        t.replay(ops.clone());
        assert_eq!(t.kernel(3, (4, 1, 1), (128, 1, 1), &[10, 5]), Step::Differs);
        assert_eq!(t.end_replay(), Err(ops.clone()), "the captured list comes back unchanged");
        // A copy to another place, or of other length.
        for (dst, bytes) in [(0x108, 16), (0x100, 32)] {
            t.replay(ops.clone());
            assert_eq!(t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 5]), Step::Held);
            assert_eq!(t.copy(dst, 0x200, bytes), Step::Differs);
            assert!(t.end_replay().is_err());
        }
        // A kernel where the graph has a copy.
        t.replay(ops.clone());
        t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 5]);
        assert_eq!(t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 5]), Step::Differs);
        assert!(t.end_replay().is_err());
        // One op fewer, or one more.
        t.replay(ops.clone());
        t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 5]);
        t.copy(0x100, 0x200, 16);
        assert!(t.end_replay().is_err(), "the last kernel is missing");
        t.replay(ops.clone());
        t.kernel(1, (4, 1, 1), (128, 1, 1), &[10, 5]);
        t.copy(0x100, 0x200, 16);
        t.kernel(2, (8, 1, 1), (128, 1, 1), &[11]);
        assert_eq!(t.copy(0x100, 0x200, 16), Step::Differs);
        assert!(t.end_replay().is_err());
    }

    #[test]
    fn arguments_keep_their_bytes_and_count() {
        let (a, b, c, d) = (0x1234_5678_9abc_def0u64, 7u32, -2i32, 1.5f32);
        assert_eq!(a.bits(), a);
        assert_eq!(b.bits(), 7);
        assert_eq!(c.bits(), 0xffff_fffe);
        assert_eq!(d.bits(), u64::from(1.5f32.to_bits()));
        // A 4-byte value read back from its slot's address, as the driver reads it.
        let slot = c.bits();
        // SAFETY: `slot` is 8 bytes; its first 4 are read as an i32 (little-endian).
        assert_eq!(unsafe { *(&slot as *const u64).cast::<i32>() }, -2);
        let mut args = Args::new();
        for i in 0..MAX_ARGS as u32 {
            args.push(i);
        }
        assert_eq!(args.get().map(<[u64]>::len), Some(MAX_ARGS));
        args.push(a);
        assert!(args.get().is_none(), "one argument too many is refused, not dropped");
        let l = launch(9, 3, &[a, u64::from(b)]);
        let mut slots = [std::ptr::null_mut(); 2];
        let p = node_params(&l, &mut slots);
        assert_eq!((p.gridDimX, p.blockDimX, p.sharedMemBytes), (3, 128, 0));
        // SAFETY: the slots point at `l.args`, alive here.
        assert_eq!(unsafe { *slots[1].cast::<u32>() }, 7);
    }
}
