//! The backend seam (DESIGN.md §4) as a forward pass uses it, checked on the CPU with a
//! recording wrapper around the CPU backend: decode steps allocate no buffers (the
//! workspace is reused), weights are made once per resident layer, a failing op is an
//! error the caller sees (never a panic) and the model keeps working afterwards, the
//! device top-k path picks what the full-logits path picks, and a pass that hands back
//! both gives the backend's own top entries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use strata::backend::cpu::CpuBackend;
use strata::backend::{
    Activation, AttnParams, Backend, BackendError, BackendResult, Cols, RopeFreqs, Rows, TopK, Unary,
};
use strata::model::config::ModelConfig;
use strata::model::decoder::{DecoderModel, KvCache, ModelError, SeqStep};
use strata::model::demo::demo_source;
use strata::model::{LanguageModel, Readback};
use strata::tensor::HostTensor;

/// The CPU backend, counting allocations and weight uploads, and failing `matmul` on
/// request (as a GPU out of memory would).
struct Recording {
    cpu: CpuBackend,
    allocs: AtomicUsize,
    weights: AtomicUsize,
    fail_matmul: AtomicBool,
    /// `top_k` reports its `logsumexp` one step up (as a device whose sum rounds
    /// otherwise than the host's scan of the same row might).
    skew_lse: AtomicBool,
}

impl Backend for Recording {
    type Buf = Vec<f32>;
    type Weight = HostTensor;

    fn name(&self) -> String {
        "recording".into()
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
    fn launch_stats(&self) -> Option<strata::backend::LaunchStats> {
        None
    }
    fn alloc(&self, len: usize) -> BackendResult<Vec<f32>> {
        self.allocs.fetch_add(1, Ordering::SeqCst);
        self.cpu.alloc(len)
    }
    fn upload(&self, data: &[f32]) -> BackendResult<Vec<f32>> {
        self.allocs.fetch_add(1, Ordering::SeqCst);
        self.cpu.upload(data)
    }
    fn download(&self, buf: &Vec<f32>, len: usize) -> BackendResult<Vec<f32>> {
        self.cpu.download(buf, len)
    }
    fn weight(&self, t: &HostTensor) -> BackendResult<HostTensor> {
        self.weights.fetch_add(1, Ordering::SeqCst);
        self.cpu.weight(t)
    }
    fn top_k(&self, logits: &Vec<f32>, rows: usize, vocab: usize, k: usize) -> BackendResult<Vec<TopK>> {
        let mut top = self.cpu.top_k(logits, rows, vocab, k)?;
        if self.skew_lse.load(Ordering::SeqCst) {
            top.iter_mut().for_each(|t| t.lse = f32::from_bits(t.lse.to_bits() + 1));
        }
        Ok(top)
    }
    fn embedding(&self, table: &HostTensor, ids: &[u32], out: &mut Vec<f32>) -> BackendResult<()> {
        self.cpu.embedding(table, ids, out)
    }
    fn matmul(&self, x: &Vec<f32>, rows: usize, w: &HostTensor, out: &mut Vec<f32>) -> BackendResult<()> {
        if self.fail_matmul.load(Ordering::SeqCst) {
            return Err(BackendError::OutOfMemory { what: "a test".into(), bytes: 1 << 30, msg: "injected".into() });
        }
        self.cpu.matmul(x, rows, w, out)
    }
    fn add_bias(&self, x: &mut Vec<f32>, rows: usize, bias: &HostTensor) -> BackendResult<()> {
        self.cpu.add_bias(x, rows, bias)
    }
    fn rms_norm(&self, x: &Vec<f32>, rows: usize, w: &HostTensor, eps: f32, out: &mut Vec<f32>) -> BackendResult<()> {
        self.cpu.rms_norm(x, rows, w, eps, out)
    }
    fn rope(&self, x: &mut Vec<f32>, h: usize, d: usize, pos: &[u32], f: &RopeFreqs) -> BackendResult<()> {
        self.cpu.rope(x, h, d, pos, f)
    }
    fn copy_rows(
        &self,
        src: &Vec<f32>,
        rows: Rows<'_>,
        row_len: usize,
        dst: &mut Vec<f32>,
        dst_row: usize,
    ) -> BackendResult<()> {
        self.cpu.copy_rows(src, rows, row_len, dst, dst_row)
    }
    fn copy_cols(
        &self,
        src: &Vec<f32>,
        from: Cols,
        dst: &mut Vec<f32>,
        to: Cols,
        rows: usize,
        width: usize,
    ) -> BackendResult<()> {
        self.cpu.copy_cols(src, from, dst, to, rows, width)
    }
    fn attention(
        &self,
        q: &Vec<f32>,
        row0: usize,
        rows: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        p: &AttnParams,
        out: &mut Vec<f32>,
    ) -> BackendResult<()> {
        self.cpu.attention(q, row0, rows, k, v, p, out)
    }
    fn delta_rule(
        &self,
        d: &strata::backend::delta::DeltaRule<'_, Vec<f32>>,
        state: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) -> BackendResult<()> {
        self.cpu.delta_rule(d, state, out)
    }
    fn glu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize, act: Activation) -> BackendResult<()> {
        self.cpu.glu(gate, up, len, act)
    }
    fn unary(&self, x: &mut Vec<f32>, len: usize, op: Unary) -> BackendResult<()> {
        self.cpu.unary(x, len, op)
    }
    fn add_rows(
        &self,
        x: &mut Vec<f32>,
        y: &Vec<f32>,
        row_len: usize,
        rows: Rows<'_>,
        weights: Option<&[f32]>,
    ) -> BackendResult<()> {
        self.cpu.add_rows(x, y, row_len, rows, weights)
    }
}

fn model() -> (DecoderModel<Recording>, Arc<Recording>) {
    let source = demo_source().unwrap();
    let config = ModelConfig::from_json(&source.config_json).unwrap();
    let be = Arc::new(Recording {
        cpu: CpuBackend::new(2),
        allocs: AtomicUsize::new(0),
        weights: AtomicUsize::new(0),
        fail_matmul: AtomicBool::new(false),
        skew_lse: AtomicBool::new(false),
    });
    (DecoderModel::new(config, &source, be.clone()).unwrap(), be)
}

const PROMPT: [u32; 9] = [5, 17, 99, 3, 250, 42, 7, 1, 64];

#[test]
fn decode_allocates_nothing_and_weights_are_made_once() {
    let (m, be) = model();
    let c = m.config.clone();
    // Every layer tensor once, plus the embedding, final norm and head (tied or not).
    let made = be.weights.load(Ordering::SeqCst);
    let qk_norm = c.spec().qk_norm != strata::model::spec::QkNorm::None;
    let per_layer = 9 + 3 * c.attention_bias as usize + 2 * qk_norm as usize;
    assert_eq!(made, c.n_layers * per_layer + 3, "weights made at load");

    let mut cache = m.new_cache(64).unwrap();
    m.forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }]).unwrap();
    let (allocs, weights) = (be.allocs.load(Ordering::SeqCst), be.weights.load(Ordering::SeqCst));
    for t in 0..20u32 {
        let mut step = [SeqStep { tokens: &[t + 3], cache: &mut cache, all_logits: false, verify: false }];
        m.forward_top_k(&mut step, 1, &|| false).unwrap();
        m.forward(&mut [SeqStep { tokens: &[t + 4], cache: &mut cache, all_logits: false, verify: false }]).unwrap();
    }
    assert_eq!(be.allocs.load(Ordering::SeqCst), allocs, "decode steps allocated buffers");
    assert_eq!(be.weights.load(Ordering::SeqCst), weights, "decode steps re-made weights");
    assert_eq!(cache.len(), PROMPT.len() + 40);
}

#[test]
fn a_failing_op_is_an_error_and_the_model_recovers() {
    let (m, be) = model();
    let mut cache = m.new_cache(64).unwrap();
    be.fail_matmul.store(true, Ordering::SeqCst);
    let err =
        m.forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }]).unwrap_err();
    assert!(matches!(err, ModelError::Backend(BackendError::OutOfMemory { .. })), "{err:?}");
    assert!(err.to_string().contains("GPU memory"), "{err}");
    // The failed pass did not advance the cache; the next one runs normally.
    assert_eq!(cache.len(), 0);
    be.fail_matmul.store(false, Ordering::SeqCst);
    let logits =
        m.forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut cache, all_logits: false, verify: false }]).unwrap();
    assert_eq!(logits[0].len(), m.config.vocab_size);
    assert_eq!(cache.len(), PROMPT.len());
}

#[test]
fn device_top_k_matches_the_full_logits() {
    let (m, _) = model();
    let vocab = m.config.vocab_size;
    let (mut a, mut b) = (m.new_cache(64).unwrap(), m.new_cache(64).unwrap());
    let full = m.forward(&mut [SeqStep { tokens: &PROMPT, cache: &mut a, all_logits: false, verify: false }]).unwrap();
    let top = m.forward_top_k(
        &mut [SeqStep { tokens: &PROMPT, cache: &mut b, all_logits: false, verify: false }],
        8,
        &|| false,
    );
    let (row, top) = (&full[0], &top.unwrap()[0]);
    assert_eq!(row.len(), vocab);
    let mut order: Vec<usize> = (0..vocab).collect();
    order.sort_by(|&i, &j| row[j].total_cmp(&row[i]).then(i.cmp(&j)));
    let want: Vec<u32> = order[..8].iter().map(|&i| i as u32).collect();
    assert_eq!(top.ids, want);
    assert_eq!(top.logits, want.iter().map(|&i| row[i as usize]).collect::<Vec<_>>());
    let lse = strata::engine::sampler::log_softmax(row)[want[0] as usize];
    assert!((top.logits[0] - top.lse - lse).abs() < 1e-5, "log-probability from lse");
}

/// A pass that hands back both the logits and the top entries
/// (`Readback::Both`, for a batch where one sequence samples from every logit
/// and another from its top entries) gives the logits `forward` gives and the top entries
/// `forward_top_k` gives over the same batch: the backend's own (here with a `logsumexp`
/// the host's scan of the row would not give), so that a sequence gets what it gets from
/// a pass of top entries alone.
#[test]
fn logits_and_top_k_together_give_what_each_pass_gives() {
    let (m, be) = model();
    be.skew_lse.store(true, Ordering::SeqCst);
    let prompts: [&[u32]; 2] = [&PROMPT, &PROMPT[2..7]];
    let fresh = || [m.new_cache(64).unwrap(), m.new_cache(64).unwrap()];
    let (mut c1, mut c2, mut c3) = (fresh(), fresh(), fresh());
    let rows = LanguageModel::forward_rows(&m, &mut steps(prompts, &mut c1), Readback::Both(5), &|| false).unwrap();
    assert_eq!(rows.counts, [1, 1], "one row a sequence");
    let vocab = m.config().vocab_size;
    let both: Vec<(&[f32], &TopK)> = rows.logits.chunks(vocab).zip(&rows.top).collect();
    let full = m.forward(&mut steps(prompts, &mut c2)).unwrap();
    let top = m.forward_top_k(&mut steps(prompts, &mut c3), 5, &|| false).unwrap();
    assert_eq!((c1[0].len(), c1[1].len()), (prompts[0].len(), prompts[1].len()));
    for (&(logits, t), (full, top)) in both.iter().zip(full.iter().zip(&top)) {
        assert_eq!(logits, &full[..]);
        assert_eq!((&t.ids, &t.logits, t.lse.to_bits()), (&top.ids, &top.logits, top.lse.to_bits()));
        assert_ne!(t.lse, strata::backend::cpu::top_k_row(logits, 5).lse, "the backend's logsumexp, not the host's");
    }
}

/// One step of each prompt, on its own cache.
fn steps<'a>(prompts: [&'a [u32]; 2], caches: &'a mut [KvCache; 2]) -> [SeqStep<'a>; 2] {
    let [a, b] = caches;
    [
        SeqStep { tokens: prompts[0], cache: a, all_logits: false, verify: false },
        SeqStep { tokens: prompts[1], cache: b, all_logits: false, verify: false },
    ]
}
