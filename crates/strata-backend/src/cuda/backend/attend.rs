//! Attention and what feeds it: RoPE, the KV cache's stores, the attention kernels
//! (partials over key splits, then their combination), the gated delta rule.

use super::*;

impl CudaBackend {
    /// The device address of `freqs`' inverse frequencies: those already uploaded when
    /// they are the same (every layer's, in most models), else uploaded now.
    fn freqs_ptr(&self, s: &mut Scratch, freqs: &RopeFreqs) -> BackendResult<u64> {
        if s.freqs.as_ref().is_none_or(|(host, _)| *host != freqs.inv_freq) {
            self.not_capturing("rope frequencies")?;
            s.freqs = None;
            let mut dev = self.stream.alloc_zeros::<f32>(freqs.inv_freq.len().max(1)).map_err(dev_err("rope", 0))?;
            self.put(&freqs.inv_freq, &mut dev, "rope frequencies")?;
            s.freqs = Some((freqs.inv_freq.clone(), dev));
        }
        s.freqs.as_ref().map(|(_, d)| ptr(d, &self.stream, 0)).ok_or_else(no_scratch)
    }

    /// [`crate::Fused::RopeStore`] as one `rope_store_*` launch (grid: rows × every head
    /// of q, k and v), on the fused decode path (`STRATA_CUDA_MATVEC=packed`) where the
    /// kernel takes the heads ([`launch::rope_store`]); `None` otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_store(
        &self,
        q: &mut CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        (row0, n, at): (usize, usize, usize),
        heads: crate::RopeHeads,
        freqs: &RopeFreqs,
        (k_cache, v_cache): (&mut CudaBuf, &mut CudaBuf),
        ty: KvType,
    ) -> Option<BackendResult<()>> {
        let crate::RopeHeads { n_heads, n_kv_heads, head_dim } = heads;
        let pairs = freqs.inv_freq.len().min(head_dim / 2);
        if self.matvec != launch::Matvec::Packed || pairs == 0 {
            return None;
        }
        let shape = launch::rope_store(ty, n, n_heads, n_kv_heads, head_dim)?;
        if n == 0 {
            return Some(Ok(()));
        }
        let run = || -> BackendResult<()> {
            let (q_width, width) = (n_heads * head_dim, n_kv_heads * head_dim);
            let row_len = ty.row_len(width);
            check_len(&[q.data.len()], (row0 + n) * q_width, "rope_store")?;
            check_len(&[k.data.len(), v.data.len()], (row0 + n) * width, "rope_store")?;
            check_len(&[k_cache.data.len(), v_cache.data.len()], (at + n) * row_len, "rope_store")?;
            let u = |x: usize| to_u32(x, "rope_store");
            let (pos0, nh, nkv, hd, np) = (u(at)?, u(n_heads)?, u(n_kv_heads)?, u(head_dim)?, u(pairs)?);
            let mut s = self.scratch();
            let fp = self.freqs_ptr(&mut s, freqs)?;
            let st = &self.stream;
            let (qp, kp, vp) =
                (ptr(&q.data, st, row0 * q_width), ptr(&k.data, st, row0 * width), ptr(&v.data, st, row0 * width));
            let (kc, vc) = (ptr(&k_cache.data, st, at * row_len), ptr(&v_cache.data, st, at * row_len));
            let (af, il) = (freqs.attention_factor, freqs.interleaved as i32);
            let mut b = Kernel::new(self.func(launch::rope_store_kernel(ty))?);
            b.arg(&qp).arg(&kp).arg(&vp).arg(&kc).arg(&vc).arg(&pos0).arg(&nh).arg(&nkv).arg(&hd).arg(&np);
            b.arg(&fp).arg(&af).arg(&il);
            // SAFETY: rope_store_{f32,f16,q8_0}(q, k, v, k_cache, v_cache, pos0, n_heads,
            // n_kv_heads, head_dim, n_pairs, inv_freq, attn_factor, interleaved) per
            // kernels/README.md: `q`, `k` and `v` point at row `row0` of buffers holding
            // `row0 + n` rows of their widths, the caches at row `at` of `at + n` rows of
            // `ty.row_len(width)` floats (all checked above); `inv_freq` holds at least
            // `n_pairs ≤ head_dim / 2` values; the shape is one the kernel takes
            // (`launch::rope_store`: an even head of at most 512, whole Q8_0 blocks).
            unsafe { self.launch(&b, shape, "rope_store") }
        };
        Some(run())
    }

    pub(super) fn rotate(
        &self,
        x: &mut CudaBuf,
        n_heads: usize,
        head_dim: usize,
        positions: &[u32],
        freqs: &RopeFreqs,
    ) -> BackendResult<()> {
        // Partial RoPE rotates the first `2 * pairs` dimensions of each head.
        let pairs = freqs.inv_freq.len().min(head_dim / 2);
        if positions.is_empty() || pairs == 0 {
            return Ok(());
        }
        let mut s = self.scratch();
        // The positions already on the device when they are the same (a pass's q and k, and
        // every layer of it, rotate at the same positions): one upload a pass, not two a layer.
        let stale = s.positions.as_ref().is_none_or(|d| d.len() < positions.len()) || s.positions_host != positions;
        if stale {
            s.positions_host.clear();
            let pos = self.grow(&mut s.positions, positions.len(), "positions")?;
            self.put(positions, pos, "positions")?;
            s.positions_host.extend_from_slice(positions);
        }
        let pp = s.positions.as_ref().map(|d| ptr(d, &self.stream, 0)).ok_or_else(no_scratch)?;
        let fp = self.freqs_ptr(&mut s, freqs)?;
        let (xp, nh, hd, np, af, il) = (
            ptr(&x.data, &self.stream, 0),
            n_heads as u32,
            head_dim as u32,
            pairs as u32,
            freqs.attention_factor,
            freqs.interleaved as i32,
        );
        let mut b = Kernel::new(self.func("rope_f32")?);
        b.arg(&xp).arg(&pp).arg(&fp).arg(&nh).arg(&hd).arg(&np).arg(&af).arg(&il);
        // SAFETY: rope_f32(x, pos, inv_freq, n_heads, head_dim, n_pairs, attn_factor,
        // interleaved): `x` holds `positions.len() × n_heads × head_dim` floats, `pos` one
        // position per row, `inv_freq` at least `n_pairs` values (`n_pairs ≤ head_dim / 2`).
        unsafe { self.launch(&b, launch::rope(positions.len(), n_heads, pairs), "rope") }
    }

    pub(super) fn store_kv(
        &self,
        src: &CudaBuf,
        rows: Rows<'_>,
        width: usize,
        dst: &mut CudaBuf,
        at: usize,
        ty: KvType,
    ) -> BackendResult<()> {
        if ty == KvType::F32 {
            return self.copy_rows(src, rows, width, dst, at);
        }
        if rows.is_empty() || width == 0 {
            return Ok(());
        }
        let row_len = ty.row_len(width);
        check_rows(rows, width, src.data.len(), "kv_store")?;
        check_len(&[dst.data.len()], (at + rows.len()) * row_len, "kv_store")?;
        let shape = launch::kv_store(ty, rows.len(), width).ok_or_else(|| BackendError::Device {
            op: "storing the KV cache".into(),
            msg: format!("{} rows of {width} values are past the launch grid", rows.len()),
        })?;
        let (w32, n32) = (to_u32(width, "kv_store")?, to_u32(rows.len(), "kv_store")?);
        let mut s = self.scratch();
        let (sp, ip) = match rows {
            Rows::Range { start, .. } => (ptr(&src.data, &self.stream, start * width), 0),
            Rows::List(list) => {
                let ids = self.grow(&mut s.row_ids, list.len(), "kv_store row list")?;
                self.put(list, ids, "kv_store row list")?;
                (ptr(&src.data, &self.stream, 0), ptr(ids, &self.stream, 0))
            }
        };
        let dp = ptr(&dst.data, &self.stream, at * row_len);
        let name = match ty {
            KvType::F16 => "kv_store_f16",
            _ => "kv_store_q8_0",
        };
        let mut b = Kernel::new(self.func(name)?);
        b.arg(&sp).arg(&ip).arg(&dp).arg(&w32).arg(&n32);
        // SAFETY: kv_store_{f16,q8_0}(src, rows, dst, width, n_rows) per kernels/README.md:
        // `src` holds every source row (`check_rows`; a range starts at its first row and
        // passes no list, a list was just uploaded to the scratch), `dst` from row `at`
        // holds `n_rows` rows of `ty.row_len(width)` floats (`check_len`).
        unsafe { self.launch(&b, shape, "kv_store") }
    }

    pub(super) fn attend(
        &self,
        q: &CudaBuf,
        row0: usize,
        rows: usize,
        k: &CudaBuf,
        v: &CudaBuf,
        p: &AttnParams,
        out: &mut CudaBuf,
    ) -> BackendResult<()> {
        if rows == 0 {
            return Ok(());
        }
        if let Some(sinks) = p.sinks
            && sinks.len() < p.n_heads
        {
            return Err(BackendError::Device {
                op: "attention".into(),
                msg: format!("{} attention sinks for {} heads", sinks.len(), p.n_heads),
            });
        }
        if p.head_dim > launch::MAX_HEAD_DIM {
            return Err(BackendError::Compile(format!(
                "head_dim {} exceeds the kernels' {}",
                p.head_dim,
                launch::MAX_HEAD_DIM
            )));
        }
        let q_width = p.n_heads * p.head_dim;
        let kv_len = p.start_pos + rows;
        let kernel = self.attn.kernel(p.kv, rows, p.n_heads, p.n_kv_heads);
        let split = match self.row_invariant {
            true => launch::attn_split_fixed(kv_len),
            false => launch::attn_split(rows, kernel.heads, kv_len, self.sm_count),
        };
        if self.row_invariant {
            let per_row = launch::attn_partial_len(1, p.n_heads, p.head_dim, split);
            let group = (launch::ATTN_FIXED_SCRATCH / per_row.max(1)).max(1);
            if rows > group {
                // A long prompt over fixed splits: its rows in launches of `group` (each
                // row's result does not depend on the others).
                for g0 in (0..rows).step_by(group) {
                    let n = (rows - g0).min(group);
                    let at = AttnParams { start_pos: p.start_pos + g0, ..*p };
                    self.attention(q, row0 + g0, n, k, v, &at, out)?;
                }
                return Ok(());
            }
        }
        let mut s = self.scratch();
        let part = self.grow(
            &mut s.partial,
            launch::attn_partial_len(rows, p.n_heads, p.head_dim, split),
            "attention scratch",
        )?;
        let pp = ptr(part, &self.stream, 0);
        let (qp, kp, vp) =
            (ptr(&q.data, &self.stream, row0 * q_width), ptr(&k.data, &self.stream, 0), ptr(&v.data, &self.stream, 0));
        let (sp, nh, nkv, hd) = (p.start_pos as u32, p.n_heads as u32, p.n_kv_heads as u32, p.head_dim as u32);
        let window = p.sliding_window.unwrap_or(0) as u32;
        let softcap = p.softcap.unwrap_or(0.0); // 0: off
        let split_len = split.split_len as u32;
        let row_len = p.kv.row_len(p.n_kv_heads * p.head_dim);
        check_len(&[k.data.len(), v.data.len()], kv_len * row_len, "attention")?;
        let mut b = Kernel::new(self.func(kernel.name)?);
        b.arg(&qp)
            .arg(&kp)
            .arg(&vp)
            .arg(&pp)
            .arg(&sp)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&p.scale)
            .arg(&softcap)
            .arg(&window)
            .arg(&split_len);
        // SAFETY: attn_partial_{f32,f16,q8_0} or attn_group_{f32,f16,q8_0}(q, k, v, part,
        // start_pos, n_heads, n_kv_heads, head_dim, scale, softcap, window, split_len) per
        // kernels/README.md, on the grid of `kernel.heads` (the group kernel only where
        // `n_kv_heads` divides `n_heads`, `Attn::kernel`): `q` points at
        // query row `row0` of `rows` rows of `n_heads × head_dim`, the caches hold
        // `start_pos + rows` rows of `n_kv_heads × head_dim` values stored as `p.kv`
        // (checked above), the scratch `rows × n_heads × splits × (head_dim + 2)`;
        // `softcap` is a plain float (0: off).
        unsafe { self.launch(&b, launch::attn_partial(rows, kernel.heads, split), "attention") }?;
        let (op, splits) = (ptr(&out.data, &self.stream, row0 * q_width), split.splits as u32);
        let shape = launch::attn_combine(rows, p.n_heads, p.head_dim);
        let Some(sinks) = p.sinks else {
            let mut b = Kernel::new(self.func("attn_combine_f32")?);
            b.arg(&pp).arg(&op).arg(&splits).arg(&hd);
            // SAFETY: attn_combine_f32(part, out, splits, head_dim): the partials written just
            // above; `out` from row `row0` holds `rows × n_heads × head_dim` floats.
            return unsafe { self.launch(&b, shape, "attention") };
        };
        // The layer's sinks, one per query head, uploaded with the call (a few hundred bytes,
        // as the rope positions are; each layer has its own).
        let slot = self.grow(&mut s.sinks, p.n_heads, "attention sinks")?;
        self.put(&sinks[..p.n_heads], slot, "attention sinks")?;
        let skp = ptr(slot, &self.stream, 0);
        let mut b = Kernel::new(self.func("attn_combine_sinks_f32")?);
        b.arg(&pp).arg(&skp).arg(&op).arg(&splits).arg(&nh).arg(&hd);
        // SAFETY: attn_combine_sinks_f32(part, sinks, out, splits, n_heads, head_dim): the
        // partials written just above; `sinks` holds `n_heads` floats (checked and uploaded
        // above), read at `h < n_heads`; `out` from row `row0` holds `rows × n_heads ×
        // head_dim` floats.
        unsafe { self.launch(&b, shape, "attention") }
    }

    pub(super) fn delta(
        &self,
        d: &DeltaRule<'_, CudaBuf>,
        state: &mut CudaBuf,
        out: &mut CudaBuf,
    ) -> BackendResult<()> {
        let sh = &d.shape;
        let (conv_dim, value_dim) = (sh.conv_dim(), sh.value_dim());
        let (r0, n) = (d.row0, d.n);
        if n == 0 {
            return Ok(());
        }
        if !launch::delta_fits(sh) {
            return Err(BackendError::Compile(format!("no delta-rule kernel for {sh:?}")));
        }
        check_len(&[d.qkvz.data.len()], (r0 + n) * sh.qkvz_len(), "delta_rule")?;
        check_len(&[d.ba.data.len()], (r0 + n) * 2 * sh.n_v_heads, "delta_rule")?;
        check_len(&[out.data.len()], (r0 + n) * value_dim, "delta_rule")?;
        check_len(&[state.data.len()], sh.state_len(), "delta_rule")?;
        let w = d.weights;
        check_len(&[w.conv.data.len()], conv_dim * sh.conv_kernel, "delta_rule")?;
        check_len(&[w.neg_a.data.len(), w.dt_bias.data.len()], sh.n_v_heads, "delta_rule")?;
        check_len(&[w.norm.data.len()], sh.v_head_dim, "delta_rule")?;
        let mut scratch = self.scratch();
        let mixed = ptr(self.grow(&mut scratch.conv, n * conv_dim, "the delta rule's convolution")?, &self.stream, 0);
        let st = &self.stream;
        let qkvz = ptr(&d.qkvz.data, st, r0 * sh.qkvz_len());
        let ba = ptr(&d.ba.data, st, r0 * 2 * sh.n_v_heads);
        let (conv_state, s) = (ptr(&state.data, st, 0), ptr(&state.data, st, conv_dim * (sh.conv_kernel - 1)));
        let o = ptr(&out.data, st, r0 * value_dim);
        let u = |x: usize| x as u32;
        let (nn, nk, nv, dk, dv, taps) =
            (u(n), u(sh.n_k_heads), u(sh.n_v_heads), u(sh.k_head_dim), u(sh.v_head_dim), u(sh.conv_kernel));
        let (qg, bg, vt) = (i32::from(sh.qkvz_grouped), i32::from(sh.ba_grouped), i32::from(sh.v_tiled));
        let cw = ptr(&w.conv.data, st, 0);
        let mut b = Kernel::new(self.func("delta_conv_f32")?);
        b.arg(&qkvz).arg(&cw).arg(&conv_state).arg(&mixed).arg(&nn).arg(&nk).arg(&nv).arg(&dk).arg(&dv);
        b.arg(&taps).arg(&qg);
        // SAFETY: delta_conv_f32 per kernels/README.md: `qkvz` holds the n rows from `row0`
        // (checked above), `conv_w` conv_dim x taps floats, the state's first (taps - 1)
        // conv_dim floats the convolution's inputs, the scratch n x conv_dim floats.
        unsafe { self.launch(&b, launch::delta_conv(conv_dim), "delta_conv") }?;
        let (na, dt, nw) = (ptr(&w.neg_a.data, st, 0), ptr(&w.dt_bias.data, st, 0), ptr(&w.norm.data, st, 0));
        let mut b = Kernel::new(self.func("delta_rule_f32")?);
        b.arg(&mixed).arg(&qkvz).arg(&ba).arg(&na).arg(&dt).arg(&nw).arg(&s).arg(&o).arg(&nn).arg(&nk).arg(&nv);
        b.arg(&dk).arg(&dv).arg(&qg).arg(&bg).arg(&vt).arg(&sh.eps);
        // SAFETY: delta_rule_f32 per kernels/README.md: the scratch holds the n convolved
        // rows, `ba` n x 2 nv floats from `row0`, `s` nv x dk x dv floats after the conv
        // state, `out` n x value_dim floats from `row0`; dk <= 256 (`delta_fits`).
        unsafe { self.launch(&b, launch::delta_rule(sh.n_v_heads, sh.v_head_dim), "delta_rule") }
    }
}
