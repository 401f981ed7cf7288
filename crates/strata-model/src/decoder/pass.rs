//! One forward pass over the workspace: the layers, then the final norm and the head
//! over each sequence's selected rows, then what crosses back to the host. The device
//! work before the readback waits for nothing on the host in a decode step of a dense,
//! resident model, so it goes to the backend as one piece ([`Backend::graphed`]: one
//! CUDA graph with `STRATA_CUDA_GRAPHS=on`).

use super::*;

impl<B: Backend> DecoderModel<B> {
    /// The layers and the head over the workspace (see [`run`](Self::run)).
    pub(super) fn run_pass(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
        readback: Readback,
        ws: &mut Workspace<B>,
    ) -> Result<PassOutput, ModelError> {
        let c = &self.config;
        let be = &*self.backend;
        let out_rows: usize =
            batch.iter().map(|s| if s.every_row() { s.tokens.len() } else { s.tokens.len().min(1) }).sum();
        let shape = self.graph_shape(batch);
        let (counts, head_rows) = head_rows(batch);
        {
            let mut device = || self.device_pass(batch, cancelled, ws, &head_rows, out_rows);
            match shape {
                Some(shape) => be.graphed(shape, &mut device)?,
                None => device()?,
            }
        }
        let result = match readback {
            Readback::Full => (be.download(&ws.logits, out_rows * c.vocab_size)?, counts, Vec::new()),
            Readback::Top(k) => {
                let top = be.top_k(&ws.logits, out_rows, c.vocab_size, k)?;
                (Vec::new(), counts, top)
            }
            Readback::Both(k) => {
                let top = be.top_k(&ws.logits, out_rows, c.vocab_size, k)?;
                (be.download(&ws.logits, out_rows * c.vocab_size)?, counts, top)
            }
        };
        // Only a pass that completed advances the caches.
        for s in batch.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        Ok(result)
    }

    /// The device work of [`run_pass`](Self::run_pass): the layers, each sequence's rows
    /// gathered, the final norm, the head into `ws.logits`. It changes nothing on the host
    /// that a second run would see otherwise (the caches advance after it), so a backend
    /// may run it again.
    fn device_pass(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
        ws: &mut Workspace<B>,
        head_rows: &[usize],
        out_rows: usize,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let be = &*self.backend;
        let h = c.hidden_size;
        self.run_layers(batch, cancelled, ws)?;
        // Gather the rows whose logits are wanted, then the final norm and the head.
        let (mut row0, mut at) = (0, 0);
        for s in batch.iter() {
            let n = s.tokens.len();
            let (src, take) = match (s.every_row(), n) {
                (_, 0) => (row0, 0),
                (true, _) => (row0, n),
                (false, _) => (row0 + n - 1, 1),
            };
            be.copy_rows(&ws.x, Rows::Range { start: src, n: take }, h, &mut ws.picked, at)?;
            at += take;
            row0 += n;
        }
        be.rms_norm(&ws.picked, out_rows, &self.norm, c.rms_norm_eps, &mut ws.head_in)?;
        be.matmul_seqs(&ws.head_in, head_rows, &self.lm_head, &mut ws.logits)?;
        if c.logits_divisor != 1.0 {
            be.unary(&mut ws.logits, out_rows * c.vocab_size, Unary::Scale(1.0 / c.logits_divisor))?;
        }
        if let Some(cap) = c.final_softcap {
            be.unary(&mut ws.logits, out_rows * c.vocab_size, Unary::Softcap(cap))?;
        }
        Ok(())
    }

    /// The shape under which a pass of `batch` may go to the backend as one piece: a
    /// decode step (one new row per sequence, none verifying) of a model whose layers are
    /// all resident softmax attention and dense MLPs, computed on the device alone (no
    /// routing or kept neurons read back, no CPU side, no weights streamed). Its number
    /// of sequences; `None` otherwise.
    fn graph_shape(&self, batch: &[SeqStep<'_>]) -> Option<u64> {
        let decode = !batch.is_empty() && batch.iter().all(|s| s.tokens.len() == 1 && !s.verify);
        let plain = self.config.layers.iter().all(|l| l.mixer == Mixer::Attention && l.ffn == Ffn::Dense);
        let on_device = self.experts.is_none()
            && self.neurons.is_none()
            && self.cpu_side.is_none()
            && !self.guess_experts
            && !self.layers.is_streaming();
        (decode && plain && on_device).then_some(batch.len() as u64)
    }
}

/// How many rows of each sequence come back (its last, or all of them), and the head's
/// rows by sequence (a verifying sequence's rows each alone).
fn head_rows(batch: &[SeqStep<'_>]) -> (Vec<usize>, Vec<usize>) {
    let (mut counts, mut head_rows) = (Vec::with_capacity(batch.len()), Vec::with_capacity(batch.len()));
    for s in batch {
        let n = s.tokens.len();
        match (s.verify, n) {
            (_, 0) => {}
            (true, _) => head_rows.extend(std::iter::repeat_n(1, n)),
            (false, _) => head_rows.push(if s.all_logits { n } else { 1 }),
        }
        counts.push(match (s.every_row(), n) {
            (_, 0) => 0,
            (true, _) => n,
            (false, _) => 1,
        });
    }
    (counts, head_rows)
}
