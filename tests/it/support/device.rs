//! A test backend standing in for a GPU: buffers and weights of its own types (so a
//! host vector cannot pass for one), computed by the CPU backend's kernels, and every
//! crossing counted: weights made (uploaded) with their bytes, values copied down
//! (`download`, `to_host`) and up (`upload`, `write_host`), each with its length.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use strata::backend::cpu::CpuBackend;
use strata::backend::delta::{DeltaRule, DeltaWeights};
use strata::backend::{
    Activation, AttnParams, Backend, BackendResult, Cols, Fused, HostCopy, KvType, LaunchStats, RopeFreqs, Rows, TopK,
    Unary,
};
use strata::tensor::HostTensor;

/// What crossed between the host and the stand-in device.
#[derive(Debug, Default)]
pub struct Crossings {
    pub weights: AtomicU64,
    pub weight_bytes: AtomicU64,
    /// The length (values) of every copy down and up, in order.
    pub down: Mutex<Vec<usize>>,
    pub up: Mutex<Vec<usize>>,
    /// Fused ops run ([`Device::fusing`]), by kind: `Glu`, `MatmulAdd`, `RopeStore`.
    pub fused: Mutex<Vec<&'static str>>,
    /// The shapes of the passes handed over as one piece ([`Device::graphing`]).
    pub graphed: Mutex<Vec<u64>>,
}

impl Crossings {
    fn down(&self, len: usize) {
        self.down.lock().unwrap().push(len);
    }
    fn up(&self, len: usize) {
        self.up.lock().unwrap().push(len);
    }
    /// Forgets the copies so far (weights stay counted).
    pub fn clear(&self) {
        self.down.lock().unwrap().clear();
        self.up.lock().unwrap().clear();
        self.fused.lock().unwrap().clear();
        self.graphed.lock().unwrap().clear();
    }
    /// How many fused ops of `kind` ran since the last `clear`.
    pub fn fused(&self, kind: &str) -> usize {
        self.fused.lock().unwrap().iter().filter(|&&k| k == kind).count()
    }
    /// The copies down and up of exactly `len` values since the last `clear`.
    pub fn of_len(&self, len: usize) -> (usize, usize) {
        let count = |v: &Mutex<Vec<usize>>| v.lock().unwrap().iter().filter(|&&n| n == len).count();
        (count(&self.down), count(&self.up))
    }
}

/// A buffer in the stand-in device's memory.
pub struct DevBuf {
    data: Vec<f32>,
    log: Arc<Crossings>,
}

impl HostCopy for DevBuf {
    fn to_host(&self) -> BackendResult<Vec<f32>> {
        self.log.down(self.data.len());
        Ok(self.data.clone())
    }
    fn write_host(&mut self, data: &[f32]) -> BackendResult<()> {
        self.log.up(data.len());
        self.data.write_host(data)
    }
}

/// A weight in the stand-in device's memory.
pub struct DevWeight(HostTensor);

pub struct Device {
    cpu: CpuBackend,
    pub log: Arc<Crossings>,
    /// Runs the fusions a GPU backend runs ([`Device::fusing`]).
    fuses: bool,
    /// Takes passes as one piece, running each twice ([`Device::graphing`]).
    graphs: bool,
}

impl Device {
    /// Computing as `cpu` does.
    pub fn new(cpu: CpuBackend) -> Self {
        Device { cpu, log: Arc::default(), fuses: false, graphs: false }
    }

    /// A device that takes [`Fused::Glu`], [`Fused::MatmulAdd`] and [`Fused::RopeStore`]
    /// as one op each, as CUDA's fused decode path does: each computed here by the ops
    /// it stands for (so with their bits) and counted in `log.fused`.
    pub fn fusing(mut self) -> Self {
        self.fuses = true;
        self
    }

    /// A device that takes the passes `Backend::graphed` hands it as CUDA's graphs do,
    /// and runs each twice (as a refused capture does): so a pass that is not the same
    /// the second time shows. Their shapes are counted in `log.graphed`.
    pub fn graphing(mut self) -> Self {
        self.graphs = true;
        self
    }

    /// The ops `op` stands for, on the CPU.
    fn run_fused(&self, op: &mut Fused<'_, Self>) -> Option<(&'static str, BackendResult<()>)> {
        let cpu = &self.cpu;
        Some(match op {
            Fused::Glu { x, seq_rows, gate, up, act, out } => {
                let rows: usize = seq_rows.iter().sum();
                let width = gate.0.shape[0];
                let mut u = vec![0f32; rows * width];
                let r = cpu
                    .matmul_seqs_each(&x.data, seq_rows, &mut [(&gate.0, &mut out.data), (&up.0, &mut u)])
                    .and_then(|()| cpu.glu(&mut out.data, &u, rows * width, *act));
                ("Glu", r)
            }
            Fused::MatmulAdd { x, seq_rows, w, out } => {
                let rows: usize = seq_rows.iter().sum();
                let width = w.0.shape[0];
                let mut y = vec![0f32; rows * width];
                let r = cpu
                    .matmul_seqs(&x.data, seq_rows, &w.0, &mut y)
                    .and_then(|()| cpu.add_rows(&mut out.data, &y, width, Rows::first(rows), None));
                ("MatmulAdd", r)
            }
            Fused::RopeStore { q, k, v, row0, n, at, heads, freqs, k_cache, v_cache, ty } => {
                let (q_width, width) = (heads.n_heads * heads.head_dim, heads.n_kv_heads * heads.head_dim);
                let positions: Vec<u32> = (*at..*at + *n).map(|p| p as u32).collect();
                let mut qs = q.data[*row0 * q_width..(*row0 + *n) * q_width].to_vec();
                let mut ks = k.data[*row0 * width..(*row0 + *n) * width].to_vec();
                let r = cpu
                    .rope(&mut qs, heads.n_heads, heads.head_dim, &positions, freqs)
                    .and_then(|()| cpu.rope(&mut ks, heads.n_kv_heads, heads.head_dim, &positions, freqs))
                    .and_then(|()| cpu.kv_store(&ks, Rows::first(*n), width, &mut k_cache.data, *at, *ty))
                    .and_then(|()| {
                        let rows = Rows::Range { start: *row0, n: *n };
                        cpu.kv_store(&v.data, rows, width, &mut v_cache.data, *at, *ty)
                    });
                q.data[*row0 * q_width..(*row0 + *n) * q_width].copy_from_slice(&qs);
                ("RopeStore", r)
            }
            Fused::SparseGroupsRow { .. } => return None,
        })
    }

    fn buf(&self, data: Vec<f32>) -> DevBuf {
        DevBuf { data, log: self.log.clone() }
    }
}

fn weights_of(d: &DeltaWeights<DevBuf>) -> DeltaWeights<Vec<f32>> {
    DeltaWeights {
        conv: d.conv.data.clone(),
        neg_a: d.neg_a.data.clone(),
        dt_bias: d.dt_bias.data.clone(),
        norm: d.norm.data.clone(),
    }
}

impl Backend for Device {
    type Buf = DevBuf;
    type Weight = DevWeight;

    fn name(&self) -> String {
        "stand-in device".into()
    }
    fn device_bytes(&self) -> u64 {
        0
    }
    fn free_memory(&self) -> Option<u64> {
        None
    }
    fn memory_bandwidth(&self) -> Option<f64> {
        None
    }
    fn launch_stats(&self) -> Option<LaunchStats> {
        None
    }
    fn alloc(&self, len: usize) -> BackendResult<DevBuf> {
        Ok(self.buf(self.cpu.alloc(len)?))
    }
    fn upload(&self, data: &[f32]) -> BackendResult<DevBuf> {
        self.log.up(data.len());
        Ok(self.buf(self.cpu.upload(data)?))
    }
    fn download(&self, buf: &DevBuf, len: usize) -> BackendResult<Vec<f32>> {
        self.log.down(len);
        self.cpu.download(&buf.data, len)
    }
    fn weight(&self, t: &HostTensor) -> BackendResult<DevWeight> {
        self.log.weights.fetch_add(1, Ordering::SeqCst);
        self.log.weight_bytes.fetch_add(t.byte_len() as u64, Ordering::SeqCst);
        Ok(DevWeight(self.cpu.weight(t)?))
    }
    fn repacks_weights(&self) -> bool {
        self.cpu.repacks_weights()
    }
    fn top_k(&self, logits: &DevBuf, rows: usize, vocab: usize, k: usize) -> BackendResult<Vec<TopK>> {
        self.log.down(rows * k);
        self.cpu.top_k(&logits.data, rows, vocab, k)
    }
    fn embedding(&self, table: &DevWeight, ids: &[u32], out: &mut DevBuf) -> BackendResult<()> {
        self.cpu.embedding(&table.0, ids, &mut out.data)
    }
    fn matmul(&self, x: &DevBuf, rows: usize, w: &DevWeight, out: &mut DevBuf) -> BackendResult<()> {
        self.cpu.matmul(&x.data, rows, &w.0, &mut out.data)
    }
    fn matmul_seqs(&self, x: &DevBuf, seq_rows: &[usize], w: &DevWeight, out: &mut DevBuf) -> BackendResult<()> {
        self.cpu.matmul_seqs(&x.data, seq_rows, &w.0, &mut out.data)
    }
    fn matmul_seqs_each(
        &self,
        x: &DevBuf,
        seq_rows: &[usize],
        each: &mut [(&DevWeight, &mut DevBuf)],
    ) -> BackendResult<()> {
        let mut inner: Vec<(&HostTensor, &mut Vec<f32>)> = each.iter_mut().map(|(w, o)| (&w.0, &mut o.data)).collect();
        self.cpu.matmul_seqs_each(&x.data, seq_rows, &mut inner)
    }
    fn add_bias(&self, x: &mut DevBuf, rows: usize, bias: &DevWeight) -> BackendResult<()> {
        self.cpu.add_bias(&mut x.data, rows, &bias.0)
    }
    fn rms_norm(&self, x: &DevBuf, rows: usize, w: &DevWeight, eps: f32, out: &mut DevBuf) -> BackendResult<()> {
        self.cpu.rms_norm(&x.data, rows, &w.0, eps, &mut out.data)
    }
    fn rope(&self, x: &mut DevBuf, h: usize, d: usize, pos: &[u32], f: &RopeFreqs) -> BackendResult<()> {
        self.cpu.rope(&mut x.data, h, d, pos, f)
    }
    fn kv_store(
        &self,
        src: &DevBuf,
        rows: Rows<'_>,
        width: usize,
        dst: &mut DevBuf,
        at: usize,
        ty: KvType,
    ) -> BackendResult<()> {
        self.cpu.kv_store(&src.data, rows, width, &mut dst.data, at, ty)
    }
    fn kv_types(&self) -> &'static [KvType] {
        self.cpu.kv_types()
    }
    fn copy_rows(&self, src: &DevBuf, rows: Rows<'_>, len: usize, dst: &mut DevBuf, at: usize) -> BackendResult<()> {
        self.cpu.copy_rows(&src.data, rows, len, &mut dst.data, at)
    }
    fn copy_cols(
        &self,
        src: &DevBuf,
        from: Cols,
        dst: &mut DevBuf,
        to: Cols,
        rows: usize,
        w: usize,
    ) -> BackendResult<()> {
        self.cpu.copy_cols(&src.data, from, &mut dst.data, to, rows, w)
    }
    fn attention(
        &self,
        q: &DevBuf,
        row0: usize,
        rows: usize,
        k: &DevBuf,
        v: &DevBuf,
        p: &AttnParams,
        out: &mut DevBuf,
    ) -> BackendResult<()> {
        self.cpu.attention(&q.data, row0, rows, &k.data, &v.data, p, &mut out.data)
    }
    fn delta_rule(&self, d: &DeltaRule<'_, DevBuf>, state: &mut DevBuf, out: &mut DevBuf) -> BackendResult<()> {
        let weights = weights_of(d.weights);
        let inner =
            DeltaRule { shape: d.shape, weights: &weights, qkvz: &d.qkvz.data, ba: &d.ba.data, row0: d.row0, n: d.n };
        self.cpu.delta_rule(&inner, &mut state.data, &mut out.data)
    }
    fn glu(&self, gate: &mut DevBuf, up: &DevBuf, len: usize, act: Activation) -> BackendResult<()> {
        self.cpu.glu(&mut gate.data, &up.data, len, act)
    }
    fn unary(&self, x: &mut DevBuf, len: usize, op: Unary) -> BackendResult<()> {
        self.cpu.unary(&mut x.data, len, op)
    }
    fn add_rows(
        &self,
        x: &mut DevBuf,
        y: &DevBuf,
        row_len: usize,
        rows: Rows<'_>,
        weights: Option<&[f32]>,
    ) -> BackendResult<()> {
        self.cpu.add_rows(&mut x.data, &y.data, row_len, rows, weights)
    }
    fn fused(&self, op: &mut Fused<'_, Self>) -> Option<BackendResult<()>> {
        if !self.fuses {
            return None;
        }
        let (kind, done) = self.run_fused(op)?;
        self.log.fused.lock().unwrap().push(kind);
        Some(done)
    }
    fn graphed<E: From<strata::backend::BackendError>>(
        &self,
        shape: u64,
        work: &mut dyn FnMut() -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.graphs {
            return work();
        }
        self.log.graphed.lock().unwrap().push(shape);
        work()?;
        work()
    }
    fn on_workers<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.cpu.on_workers(f)
    }
}
