//! The layers of one forward pass: each sequence's new tokens embedded, then every
//! layer's mixer (attention, latent attention or the gated delta rule) and FFN (dense,
//! routed experts or kept neurons) over the batch's rows, into the residual stream.

use super::*;

impl<B: Backend> DecoderModel<B> {
    /// Embeds the new tokens of every sequence and runs every layer over them, writing
    /// keys and values into the caches (without advancing them). Leaves the residual
    /// stream `(rows, hidden)` in `ws.x`.
    pub(super) fn run_layers(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
        ws: &mut Workspace<B>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let be = &*self.backend;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);

        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for s in batch.iter_mut() {
            let needed = s.cache.len + s.tokens.len();
            if needed > s.cache.capacity {
                return Err(ModelError::ContextFull { needed, capacity: s.cache.capacity });
            }
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(ModelError::BadToken { id, vocab: c.vocab_size });
            }
            self.reserve_cache(s.cache, needed)?;
            ids.extend_from_slice(s.tokens);
            positions.extend((s.cache.len..needed).map(|p| p as u32));
        }
        let rows = ids.len();
        let parts = Part::of(batch);
        // Rows per part: a part's results do not depend on what shares the batch.
        let seq_rows: Vec<usize> = parts.iter().map(|p| p.n).collect();
        // Each part's sparse FFN setting, likewise.
        let sparse: Vec<SparseFfn> =
            parts.iter().map(|p| batch[p.seq].cache.sparse_ffn.unwrap_or(self.sparse)).collect();
        for s in batch.iter_mut() {
            s.cache.begin_row_states(if s.verify { s.tokens.len() } else { 0 });
        }
        // Recency in the expert cache is counted in forward passes.
        if let Some(experts) = &self.experts {
            experts.step();
        }
        if let Some(neurons) = &self.neurons {
            neurons.step();
        }
        let Workspace { x, normed, q, k, v, attn, proj, gate, up, scratch, moe: moe_bufs, attn_gate, lin, mla, .. } =
            ws;

        be.embedding(&self.embed, &ids, x)?;
        if c.embed_scale != 1.0 {
            be.unary(x, rows * h, Unary::Scale(c.embed_scale))?;
        }
        let eps = c.rms_norm_eps;
        // Q/K norms run over each head's row, or over a token's whole Q (K) row.
        let (q_norm_rows, k_norm_rows) = match c.spec().qk_norm {
            QkNorm::Whole => (rows, rows),
            _ => (rows * c.n_heads, rows * c.n_kv_heads),
        };
        for l in 0..c.n_layers {
            if cancelled() {
                return Err(ModelError::Cancelled);
            }
            let w = self.layers.layer(l)?;
            let guess = self.guess_experts(&w, x, rows, normed, moe_bufs.as_mut())?;

            // Attention over the normed stream (or the stream itself when the family
            // normalizes only after).
            let input: &B::Buf = match &w.attn_norm {
                Some(n) => {
                    be.rms_norm(x, rows, n, eps, normed)?;
                    normed
                }
                None => x,
            };
            // Whether the mixer's output is already in `x` (a fused product added it).
            let mut added = false;
            match &w.mixer {
                MixerWeights::Attention(aw) => {
                    be.matmul_seqs_each(input, &seq_rows, &mut [(&aw.wq, q), (&aw.wk, k), (&aw.wv, v)])?;
                    if let Some([bq, bk, bv]) = &aw.bias_qkv {
                        be.add_bias(q, rows, bq)?;
                        be.add_bias(k, rows, bk)?;
                        be.add_bias(v, rows, bv)?;
                    }
                    if let Some([qn, kn]) = &aw.qk_norm {
                        be.rms_norm(q, q_norm_rows, qn, eps, scratch)?;
                        be.copy_rows(scratch, Rows::first(rows), q_dim, q, 0)?;
                        be.rms_norm(k, k_norm_rows, kn, eps, scratch)?;
                        be.copy_rows(scratch, Rows::first(rows), kv_dim, k, 0)?;
                    }
                    // RoPE and the stores as one op per sequence where the backend fuses
                    // them (the same bits), else RoPE over the batch and the stores.
                    let heads = RopeHeads { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: hd };
                    let fused = match &self.rope[l] {
                        Some(rope) => rope_store(be, batch, &parts, l, self.kv_type, (heads, rope), (q, k, v))?,
                        None => false,
                    };
                    if let (Some(rope), false) = (&self.rope[l], fused) {
                        be.rope(q, c.n_heads, hd, &positions, rope)?;
                        be.rope(k, c.n_kv_heads, hd, &positions, rope)?;
                    }

                    for &Part { seq, row0, n, start_pos } in &parts {
                        let s = &mut batch[seq];
                        let cache = s.cache.bufs.downcast_mut::<KvBufs<B>>().ok_or(ModelError::ForeignCache)?;
                        let ty = self.kv_type;
                        if !fused {
                            be.kv_store(k, Rows::Range { start: row0, n }, kv_dim, &mut cache.k[l], start_pos, ty)?;
                            be.kv_store(v, Rows::Range { start: row0, n }, kv_dim, &mut cache.v[l], start_pos, ty)?;
                        }
                        let p = AttnParams {
                            n_heads: c.n_heads,
                            n_kv_heads: c.n_kv_heads,
                            head_dim: hd,
                            start_pos,
                            scale: c.attn_scale,
                            sliding_window: c.layers[l].sliding_window,
                            softcap: c.attn_softcap,
                            kv: self.kv_type,
                            sinks: aw.sinks.as_deref(),
                        };
                        be.attention(q, row0, n, &cache.k[l], &cache.v[l], &p, attn)?;
                    }
                    // Qwen3-Next gates each head's output by the sigmoid of its gate rows.
                    let o_in: &B::Buf = match (&aw.gate, attn_gate.as_mut()) {
                        (Some(wg), Some(g)) => {
                            be.matmul_seqs(input, &seq_rows, wg, g)?;
                            be.glu(g, attn, rows * q_dim, Activation::Sigmoid)?;
                            g
                        }
                        _ => attn,
                    };
                    // The output product added straight into the residual stream where
                    // nothing comes between (no bias, post-norm or scale) and the backend
                    // fuses it.
                    let plain = aw.bias_o.is_none() && w.attn_post_norm.is_none() && c.residual_scale == 1.0;
                    let mut add = Fused::MatmulAdd { x: o_in, seq_rows: &seq_rows, w: &aw.wo, out: &mut *x };
                    match plain.then(|| be.fused(&mut add)).flatten() {
                        Some(done) => {
                            done?;
                            added = true;
                        }
                        None => {
                            be.matmul_seqs(o_in, &seq_rows, &aw.wo, proj)?;
                            if let Some(b) = &aw.bias_o {
                                be.add_bias(proj, rows, b)?;
                            }
                        }
                    }
                }
                MixerWeights::Latent(mw) => {
                    let no_bufs =
                        || ModelError::Sched(SchedError::Build { layer: l, msg: "no latent-attention buffers".into() });
                    let bufs = mla.as_mut().ok_or_else(no_bufs)?;
                    let rope = self.rope[l].as_ref().ok_or_else(no_bufs)?;
                    let mut caches = Vec::with_capacity(batch.len());
                    for s in batch.iter_mut() {
                        let cache = s.cache.bufs.downcast_mut::<KvBufs<B>>().ok_or(ModelError::ForeignCache)?;
                        caches.push(&mut cache.k[l]);
                    }
                    let at: Vec<(usize, usize)> = parts.iter().map(|p| (p.seq, p.start_pos)).collect();
                    let step =
                        MlaStep { input, positions: &positions, seq_rows: &seq_rows, at: &at, rope, kv: self.kv_type };
                    let out = MlaOut { q: &mut *q, kv: &mut *k, attn: &mut *attn, proj: &mut *proj };
                    mla::forward(be, c, mw, step, bufs, out, &mut caches)?;
                }
                MixerWeights::Linear(lw) => {
                    let no_bufs =
                        || ModelError::Sched(SchedError::Build { layer: l, msg: "no linear-attention state".into() });
                    let la = c.linear_attn.as_ref().ok_or_else(no_bufs)?;
                    let (qkvz_buf, ba_buf, mixed) = lin.as_mut().ok_or_else(no_bufs)?;
                    be.matmul_seqs(input, &seq_rows, &lw.qkvz, qkvz_buf)?;
                    be.matmul_seqs(input, &seq_rows, &lw.ba, ba_buf)?;
                    // Each part's tokens in order through its sequence's state; a verifying
                    // sequence's state is saved after each of its rows.
                    for &Part { seq, row0, n, start_pos } in &parts {
                        let s = &mut batch[seq];
                        let state = s.cache.state_mut::<B>(l, la.state_len()).ok_or_else(no_bufs)?;
                        let d = DeltaRule { shape: lw.shape, weights: &lw.small, qkvz: qkvz_buf, ba: ba_buf, row0, n };
                        be.delta_rule(&d, state, mixed)?;
                        if s.verify {
                            s.cache.save_row_state(l, start_pos).map_err(ModelError::Backend)?;
                        }
                    }
                    be.matmul_seqs(mixed, &seq_rows, &lw.out, proj)?;
                }
            }
            if !added {
                residual(be, c, x, proj, w.attn_post_norm.as_ref(), normed, rows)?;
            }

            // The gated MLP, likewise.
            let input: &B::Buf = match &w.ffn_norm {
                Some(n) => {
                    be.rms_norm(x, rows, n, eps, normed)?;
                    normed
                }
                None => x,
            };
            let mut bufs = MlpBufs { gate: &mut *gate, up: &mut *up };
            // Whether the FFN's output is already in `x`.
            let mut added_ffn = false;
            match &w.ffn {
                // Added into `x` as it goes where nothing comes between (the MLP reads the
                // normed stream, not `x` itself).
                FfnWeights::Dense(mlp)
                    if w.ffn_norm.is_some() && w.ffn_post_norm.is_none() && c.residual_scale == 1.0 =>
                {
                    moe::mlp_forward_add(be, c, mlp, normed, &seq_rows, &mut bufs, x, proj)?;
                    added_ffn = true;
                }
                FfnWeights::Dense(mlp) => moe::mlp_forward(be, c, mlp, input, &seq_rows, &mut bufs, proj)?,
                FfnWeights::Moe(mw) => {
                    let bufs_moe = moe_bufs
                        .as_mut()
                        .ok_or(ModelError::Sched(SchedError::Build { layer: l, msg: "no MoE buffers".into() }))?;
                    let cpu = self.cpu_side.as_deref();
                    let block = MoeBlock { layer: l, weights: mw, source: self, input, rows, seq_rows: &seq_rows, cpu };
                    let taken = moe::moe_forward(be, c, block, &mut bufs, bufs_moe, proj)?;
                    self.score_expert_guess(guess, &taken);
                }
                FfnWeights::Neurons(nw) => {
                    let nb = moe_bufs.as_mut().ok_or(ModelError::Sched(SchedError::Build {
                        layer: l,
                        msg: "no sparse FFN buffers".into(),
                    }))?;
                    let block = SparseBlock {
                        layer: l,
                        weights: nw,
                        source: self,
                        input,
                        seq_rows: &seq_rows,
                        settings: &sparse,
                    };
                    let (kept, total) = sparse::sparse_forward(be, c, block, &mut bufs, nb, proj)?;
                    let stats = self.layers.stats();
                    stats.neuron_groups_kept.fetch_add(kept, std::sync::atomic::Ordering::Relaxed);
                    stats.neuron_groups_total.fetch_add(total, std::sync::atomic::Ordering::Relaxed);
                }
            }
            if !added_ffn {
                residual(be, c, x, proj, w.ffn_post_norm.as_ref(), normed, rows)?;
            }
        }
        if let Some(side) = &self.cpu_side {
            side.end_pass();
        }
        Ok(())
    }
}

/// [`Fused::RopeStore`] for every sequence of the batch (its new rows rotated and
/// stored into layer `l`'s caches) where the backend fuses it: `false` when it does not
/// (nothing was done; the caller rotates and stores). A backend fuses all of a batch's
/// sequences or none, as the choice depends only on the shapes and the cache type.
fn rope_store<B: Backend>(
    be: &B,
    batch: &mut [SeqStep<'_>],
    parts: &[Part],
    l: usize,
    ty: KvType,
    (heads, freqs): (RopeHeads, &RopeFreqs),
    (q, k, v): (&mut B::Buf, &mut B::Buf, &B::Buf),
) -> Result<bool, ModelError> {
    for (i, &Part { seq, row0, n, start_pos }) in parts.iter().enumerate() {
        let cache = batch[seq].cache.bufs.downcast_mut::<KvBufs<B>>().ok_or(ModelError::ForeignCache)?;
        let (k_cache, v_cache) = (&mut cache.k[l], &mut cache.v[l]);
        let mut op =
            Fused::RopeStore { q: &mut *q, k: &mut *k, v, row0, n, at: start_pos, heads, freqs, k_cache, v_cache, ty };
        match (be.fused(&mut op), i) {
            (Some(done), _) => done?,
            (None, 0) => return Ok(false),
            (None, _) => {
                return Err(ModelError::Backend(strata_backend::BackendError::Device {
                    op: "rope_store".into(),
                    msg: "fused for one sequence of a batch and not for another".into(),
                }));
            }
        }
    }
    Ok(true)
}

/// `x += residual_scale * post_norm(branch)` for `rows` rows: the end of each half of a
/// block, whichever the norm placement (`post_norm` is `None` for pre-norm families).
fn residual<B: Backend>(
    be: &B,
    c: &ModelConfig,
    x: &mut B::Buf,
    branch: &mut B::Buf,
    post_norm: Option<&B::Weight>,
    normed: &mut B::Buf,
    rows: usize,
) -> Result<(), ModelError> {
    let len = rows * c.hidden_size;
    let out = match post_norm {
        Some(n) => {
            be.rms_norm(branch, rows, n, c.rms_norm_eps, normed)?;
            normed
        }
        None => branch,
    };
    if c.residual_scale != 1.0 {
        be.unary(out, len, Unary::Scale(c.residual_scale))?;
    }
    Ok(be.add_rows(x, out, c.hidden_size, Rows::first(rows), None)?)
}
