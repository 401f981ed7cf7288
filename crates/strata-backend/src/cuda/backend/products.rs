//! The products: the decode matrix-vector kernels (one to `MATVEC_MAX_ROWS` rows), the
//! fused gated MLP, the prefill GEMM through cuBLAS, and the embeddings' lookup.

use super::*;

impl CudaBackend {
    /// `matvec_glu_packed_FMT` when both weights are packed, of one format and shape,
    /// and every sequence's rows take the matrix-vector kernel (`launch::fuses_glu`):
    /// one launch per `MATVEC_MAX_ROWS` rows instead of two matvecs and a GLU.
    pub(super) fn glu_fused(
        &self,
        x: &CudaBuf,
        seq_rows: &[usize],
        gate: &CudaWeight,
        up: &CudaWeight,
        act: Activation,
        out: &mut CudaBuf,
    ) -> Option<BackendResult<()>> {
        let gemm = self.blas.is_some() && !self.row_invariant;
        if !launch::fuses_glu(gate.kind(), up.kind(), seq_rows, gemm) {
            return None;
        }
        Some(self.matvec_glu(x, seq_rows.iter().sum(), gate, up, act, out))
    }

    /// `matvec_add_packed_FMT` when `w` is packed and every sequence's rows take the
    /// matrix-vector kernel (`launch::fuses_add`): `out[r] += x[r] · wᵀ` in one launch per
    /// `MATVEC_MAX_ROWS` rows instead of a matvec into a buffer and `add_rows`.
    pub(super) fn add_fused(
        &self,
        x: &CudaBuf,
        seq_rows: &[usize],
        w: &CudaWeight,
        out: &mut CudaBuf,
    ) -> Option<BackendResult<()>> {
        let gemm = self.blas.is_some() && !self.row_invariant;
        if !launch::fuses_add(w.kind(), seq_rows, gemm) {
            return None;
        }
        let rows = seq_rows.iter().sum();
        let fits = check_len(&[x.data.len()], rows * w.shape[1], "matmul_add")
            .and_then(|()| check_len(&[out.data.len()], rows * w.shape[0], "matmul_add"));
        Some(fits.and_then(|()| self.matvec_into(x, 0, rows, w, out, Store::Add)))
    }

    /// `y[rows, out] = x[rows, in] · w[out, in]ᵀ` with the fused-dequantising
    /// matrix-vector kernel, `MATVEC_MAX_ROWS` activation rows per launch.
    /// Rows `at..at + rows` of `x` and `y`; each row comes out the same whatever the
    /// launch's row count (a warp per output row keeps one sum per activation row).
    pub(super) fn matvec(
        &self,
        x: &CudaBuf,
        at: usize,
        rows: usize,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) -> BackendResult<()> {
        self.matvec_into(x, at, rows, w, y, Store::Set)
    }

    /// [`matvec`](Self::matvec), its sums stored into `y` or (`Store::Add`, packed
    /// weights only: `matvec_add_packed_FMT`) added to what `y` holds.
    fn matvec_into(
        &self,
        x: &CudaBuf,
        at: usize,
        rows: usize,
        w: &CudaWeight,
        y: &mut CudaBuf,
        store: Store,
    ) -> BackendResult<()> {
        let (out, inn) = (w.shape[0], w.shape[1]);
        let fmt = launch::format_name(w.dtype)
            .ok_or_else(|| BackendError::Compile(format!("no kernel reads {} weights", w.dtype.name())))?;
        let packed = w.kind().packed;
        let name = match (store, packed) {
            (Store::Set, _) => self.matvec.kernel(&fmt, packed),
            (Store::Add, true) => format!("matvec_add_packed_{fmt}"),
            (Store::Add, false) => return Err(BackendError::Compile(format!("no kernel adds {fmt} products"))),
        };
        let f = self.func(&name)?;
        let wp = w.ptr(&self.stream, 0);
        let (qp, dp) = w.matvec_ptrs(&self.stream);
        for r0 in (at..at + rows).step_by(launch::MATVEC_MAX_ROWS) {
            let n = (at + rows - r0).min(launch::MATVEC_MAX_ROWS);
            let (xp, yp) = (ptr(&x.data, &self.stream, r0 * inn), ptr(&y.data, &self.stream, r0 * out));
            let (n, o, i) = (n as u32, out as u32, inn as u32);
            let mut b = Kernel::new(f);
            match packed {
                true => b.arg(&qp).arg(&dp),
                false => b.arg(&wp),
            };
            b.arg(&xp).arg(&yp).arg(&n).arg(&o).arg(&i);
            // SAFETY: matvec_FMT(w, x, y, rows, out, in) per kernels/README.md: `w` holds
            // `out × in` values of its format (matvec_packed_FMT and matvec_add_packed_FMT
            // (q, d, ...): `q` and `d` its packed quants and scales, or an element weight's
            // bytes, every row 16-byte aligned (checked when it was made), and null;
            // `Store::Add` is only asked for those), `x` at least `(r0 + n) × in` floats and `y`
            // `(r0 + n) × out` (the workspace is sized for `rows`); the grid has a warp
            // (`matvec_wide_FMT`: a block; the packed kernels: half a warp) per output row.
            unsafe { self.launch(&b, self.matvec.shape(out, packed), "matvec") }?;
        }
        Ok(())
    }

    /// `y[r] = act(x[r] · gateᵀ) ⊙ (x[r] · upᵀ)` for rows `0..rows` with
    /// `matvec_glu_packed_FMT`, `MATVEC_MAX_ROWS` activation rows per launch; both
    /// weights packed, of one format and shape ([`launch::fuses_glu`]).
    pub(super) fn matvec_glu(
        &self,
        x: &CudaBuf,
        rows: usize,
        gate: &CudaWeight,
        up: &CudaWeight,
        act: Activation,
        y: &mut CudaBuf,
    ) -> BackendResult<()> {
        let (out, inn) = (gate.shape[0], gate.shape[1]);
        check_len(&[x.data.len()], rows * inn, "matmul_glu")?;
        check_len(&[y.data.len()], rows * out, "matmul_glu")?;
        let fmt = launch::format_name(gate.dtype)
            .ok_or_else(|| BackendError::Compile(format!("no kernel reads {} weights", gate.dtype.name())))?;
        let f = self.func(&format!("matvec_glu_packed_{fmt}"))?;
        let ((qg, dg), (qu, du)) = (gate.matvec_ptrs(&self.stream), up.matvec_ptrs(&self.stream));
        let (code, alpha, limit) = launch::glu_code(act);
        for r0 in (0..rows).step_by(launch::MATVEC_MAX_ROWS) {
            let n = (rows - r0).min(launch::MATVEC_MAX_ROWS);
            let (xp, yp) = (ptr(&x.data, &self.stream, r0 * inn), ptr(&y.data, &self.stream, r0 * out));
            let (n, o, i) = (n as u32, out as u32, inn as u32);
            let mut b = Kernel::new(f);
            b.arg(&qg).arg(&dg).arg(&qu).arg(&du).arg(&xp).arg(&yp).arg(&n).arg(&o).arg(&i);
            b.arg(&code).arg(&alpha).arg(&limit);
            // SAFETY: matvec_glu_packed_FMT(qg, dg, qu, du, x, y, rows, out, in, act, alpha,
            // limit) per kernels/README.md: `qg`/`dg` and `qu`/`du` are the packed quants and
            // scales (element formats: the aligned bytes and null) of two `out × in`
            // weights of format FMT (checked by the caller), `x`
            // holds at least `(r0 + n) × in` floats and `y` `(r0 + n) × out` (checked
            // above); the grid has half a warp per output row, as matvec_packed_FMT's.
            unsafe { self.launch(&b, launch::matvec_packed(out), "matmul_glu") }?;
        }
        Ok(())
    }

    /// [`Backend::matmul_seqs_each`]: the weights `launch::multi_groups` puts together
    /// (packed, of one format and `in`, every sequence on the matrix-vector kernel) in
    /// one `matvec_multi_packed_FMT` launch per `MATVEC_MAX_ROWS` rows, every other
    /// weight through `matmul_seqs`.
    pub(super) fn products_each(
        &self,
        x: &CudaBuf,
        seq_rows: &[usize],
        each: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> BackendResult<()> {
        let gemm = self.blas.is_some() && !self.row_invariant;
        let kinds: Vec<_> = each.iter().map(|(w, _)| w.kind()).collect();
        for group in launch::multi_groups(&kinds, seq_rows, gemm) {
            match group[..] {
                [i] => {
                    let (w, out) = &mut each[i];
                    self.matmul_seqs(x, seq_rows, w, out)?;
                }
                _ => self.matvec_multi(x, seq_rows.iter().sum(), each, &group)?,
            }
        }
        Ok(())
    }

    /// `y_i[r] = x[r] · w_iᵀ` for rows `0..rows` and the weights `each[i]` of `group`
    /// (2 to `MATVEC_MULTI_MAX` of them, packed, of one format and `in`:
    /// [`launch::multi_groups`]) with `matvec_multi_packed_FMT`, `MATVEC_MAX_ROWS`
    /// activation rows per launch.
    fn matvec_multi(
        &self,
        x: &CudaBuf,
        rows: usize,
        each: &[(&CudaWeight, &mut CudaBuf)],
        group: &[usize],
    ) -> BackendResult<()> {
        let first = each[group[0]].0;
        let inn = first.shape[1];
        check_len(&[x.data.len()], rows * inn, "matmul_seqs_each")?;
        let fmt = launch::format_name(first.dtype)
            .ok_or_else(|| BackendError::Compile(format!("no kernel reads {} weights", first.dtype.name())))?;
        let f = self.func(&format!("matvec_multi_packed_{fmt}"))?;
        // Unused weights: null pointers and 0 rows.
        let (mut qd, mut outs) = ([(0u64, 0u64); launch::MATVEC_MULTI_MAX], [0usize; launch::MATVEC_MULTI_MAX]);
        for (slot, &i) in group.iter().enumerate() {
            let (w, y) = &each[i];
            check_len(&[y.data.len()], rows * w.shape[0], "matmul_seqs_each")?;
            (qd[slot], outs[slot]) = (w.matvec_ptrs(&self.stream), w.shape[0]);
        }
        let out32 = outs.map(|o| o as u32);
        for r0 in (0..rows).step_by(launch::MATVEC_MAX_ROWS) {
            let mut ys = [0u64; launch::MATVEC_MULTI_MAX];
            for (slot, &i) in group.iter().enumerate() {
                ys[slot] = ptr(&each[i].1.data, &self.stream, r0 * outs[slot]);
            }
            let xp = ptr(&x.data, &self.stream, r0 * inn);
            let (n, i) = ((rows - r0).min(launch::MATVEC_MAX_ROWS) as u32, inn as u32);
            let mut b = Kernel::new(f);
            for s in 0..launch::MATVEC_MULTI_MAX {
                b.arg(&qd[s].0).arg(&qd[s].1).arg(&ys[s]).arg(&out32[s]);
            }
            b.arg(&xp).arg(&n).arg(&i);
            // SAFETY: matvec_multi_packed_FMT(q0, d0, y0, out0, ..., x, rows, in) per
            // kernels/README.md: each used `q_i`/`d_i` are the packed quants and scales
            // (element formats: the aligned bytes and null) of an `out_i × in` weight of format FMT (one format and `in`: the caller's
            // group), each `y_i` a distinct buffer (distinct `&mut`) of at least
            // `rows × out_i` floats and `x` of `rows × in` (checked above); unused slots
            // have `out_i = 0` and are never read; the grid is each weight's packed grid in turn.
            unsafe { self.launch(&b, launch::matvec_multi(&outs), "matmul_seqs_each") }?;
        }
        Ok(())
    }

    /// The prefill product through cuBLAS: f32 weights as they are; any other format
    /// dequantised to f16 a tile of output rows at a time (so the scratch stays small
    /// even for a vocabulary-sized head) against `x` converted to f16, accumulated in
    /// f32 on the tensor cores. Rows `at..at + rows` of `x` and `y`.
    fn gemm(
        &self,
        blas: &cudarc::cublas::CudaBlas,
        x: &CudaBuf,
        at: usize,
        rows: usize,
        w: &CudaWeight,
        y: &mut CudaBuf,
    ) -> BackendResult<()> {
        use cudarc::cublas::sys::cudaDataType::{CUDA_R_16F, CUDA_R_32F};
        // cuBLAS enqueues past the tape: a replay cannot compare it (its capture is not
        // replayed, `graph::chain`, so only a pass that changed shape gets here).
        self.not_replaying("cuBLAS GEMM")?;
        let (out, inn) = (w.shape[0], w.shape[1]);
        // cuBLAS runs on whatever context is current on this thread (the worker's, not
        // the loader's): make it this device's.
        self.stream.context().bind_to_thread().map_err(dev_err("cuBLAS GEMM", 0))?;
        let (xp, yp) = (ptr(&x.data, &self.stream, at * inn), ptr(&y.data, &self.stream, at * out));
        let shape = GemmShape { out, rows, inn, ldc: out };
        if w.dtype == DType::F32 {
            return gemm_ex(blas, shape, (w.ptr(&self.stream, 0), CUDA_R_32F), (xp, CUDA_R_32F), yp);
        }
        let mut s = self.scratch();
        let fmt = launch::format_name(w.dtype).unwrap_or_default();
        let tile = launch::gemm_tile_rows(out, inn);
        let x16 = ptr(self.grow(&mut s.x16, rows * inn, "converting activations for GEMM")?, &self.stream, 0);
        let w16 = ptr(self.grow(&mut s.w16, tile * inn, "dequantising a weight for GEMM")?, &self.stream, 0);
        let nx = (rows * inn) as u64;
        let mut b = Kernel::new(self.func("f32_to_f16")?);
        b.arg(&xp).arg(&x16).arg(&nx);
        // SAFETY: f32_to_f16(x, y, n): `x` holds `rows × in` floats, the scratch as many.
        unsafe { self.launch(&b, launch::elementwise(rows * inn), "f32_to_f16") }?;
        let row_bytes = w.dtype.bytes_for(inn).unwrap_or(0);
        for o0 in (0..out).step_by(tile.max(1)) {
            let n_out = (out - o0).min(tile);
            let n = (n_out * inn) as u64;
            let wp = w.ptr(&self.stream, o0 * row_bytes);
            let (qp, dp) = if w.repacked() { w.packed_ptrs(&self.stream, o0) } else { (wp, 0) };
            let name = if w.repacked() { format!("dequant_packed_{fmt}_f16") } else { format!("dequant_{fmt}_f16") };
            let mut b = Kernel::new(self.func(&name)?);
            match w.repacked() {
                true => b.arg(&qp).arg(&dp),
                false => b.arg(&wp),
            };
            b.arg(&w16).arg(&n);
            // SAFETY: dequant_FMT_f16(w, out, n): from output row `o0`, `w` holds
            // `n_out × in` values of its format (dequant_packed_FMT_f16(q, d, out, n): `q`
            // and `d` row `o0`'s packed quants and scales); the f16 scratch holds `tile × in`.
            unsafe { self.launch(&b, launch::dequant(w.dtype, n), "dequant") }?;
            // Output rows `o0..o0 + n_out` start at row `o0` of the column-major C.
            let tile_shape = GemmShape { out: n_out, ..shape };
            gemm_ex(blas, tile_shape, (w16, CUDA_R_16F), (x16, CUDA_R_16F), yp + (o0 * 4) as u64)?;
        }
        Ok(())
    }

    /// [`Backend::matmul`] over rows `at..at + rows` of `x` and `out`.
    pub(super) fn matmul_at(
        &self,
        x: &CudaBuf,
        at: usize,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuf,
    ) -> BackendResult<()> {
        if rows == 0 {
            return Ok(());
        }
        match &self.blas {
            Some(blas) if rows > launch::MATVEC_MAX_ROWS && !self.row_invariant => self.gemm(blas, x, at, rows, w, out),
            _ => self.matvec(x, at, rows, w, out),
        }
    }

    pub(super) fn embed(&self, table: &CudaWeight, ids: &[u32], out: &mut CudaBuf) -> BackendResult<()> {
        let dim = table.shape[1];
        let fmt = launch::format_name(table.dtype)
            .ok_or_else(|| BackendError::Compile(format!("no kernel reads {} embeddings", table.dtype.name())))?;
        let mut s = self.scratch();
        let slot = self.grow(&mut s.ids, ids.len(), "token ids")?;
        self.put(ids, slot, "token ids")?;
        let (tp, ip, op, d) =
            (table.ptr(&self.stream, 0), ptr(slot, &self.stream, 0), ptr(&out.data, &self.stream, 0), dim as u32);
        let (qp, dp) = if table.repacked() { table.packed_ptrs(&self.stream, 0) } else { (tp, 0) };
        let name = if table.repacked() { format!("embed_packed_{fmt}") } else { format!("embed_{fmt}") };
        let mut b = Kernel::new(self.func(&name)?);
        match table.repacked() {
            true => b.arg(&qp).arg(&dp),
            false => b.arg(&tp),
        };
        b.arg(&ip).arg(&op).arg(&d);
        // SAFETY: embed_FMT(table, ids, out, dim): ids (checked < vocab by the model) index
        // rows of the `[vocab, dim]` table (embed_packed_FMT(q, d, ...): its packed quants
        // and scales); `out` holds `ids.len() × dim` floats.
        unsafe { self.launch(&b, launch::embedding(ids.len()), "embedding") }
    }
}

/// What a matrix-vector launch does with its sums.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// `y = x · wᵀ`.
    Set,
    /// `y += x · wᵀ` (`matvec_add_packed_FMT`).
    Add,
}

/// One cuBLAS product `y[rows, out] = x[rows, in] · w[out, in]ᵀ` on row-major data,
/// `y`'s rows `ldc` apart.
#[derive(Clone, Copy)]
struct GemmShape {
    out: usize,
    rows: usize,
    inn: usize,
    ldc: usize,
}

/// `cublasGemmEx` on device addresses: in cuBLAS's column-major terms C(out × rows) =
/// Wᵀ · X with W (in × out, ld in), X (in × rows, ld in) and C (ld `ldc`), accumulated in
/// f32. `w` and `x` carry their element types.
fn gemm_ex(
    blas: &cudarc::cublas::CudaBlas,
    g: GemmShape,
    w: (u64, cudarc::cublas::sys::cudaDataType),
    x: (u64, cudarc::cublas::sys::cudaDataType),
    y: u64,
) -> BackendResult<()> {
    use cudarc::cublas::sys as cb;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: `w` holds `out × in` values and `x` `rows × in` of their types, `y` has
    // `rows` rows of `ldc ≥ out` floats (the callers size them so); all were written
    // on the stream the handle is bound to, which orders this call after them.
    let status = unsafe {
        cb::cublasGemmEx(
            *blas.handle(),
            cb::cublasOperation_t::CUBLAS_OP_T,
            cb::cublasOperation_t::CUBLAS_OP_N,
            g.out as i32,
            g.rows as i32,
            g.inn as i32,
            &alpha as *const f32 as *const _,
            w.0 as *const _,
            w.1,
            g.inn as i32,
            x.0 as *const _,
            x.1,
            g.inn as i32,
            &beta as *const f32 as *const _,
            y as *mut _,
            cb::cudaDataType::CUDA_R_32F,
            g.ldc as i32,
            cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    if status == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    let what = format!("cuBLAS GEMM ({}×{} by {}×{})", g.rows, g.inn, g.out, g.inn);
    Err(match status {
        cb::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED => {
            BackendError::OutOfMemory { what, bytes: 0, msg: format!("{status:?}") }
        }
        _ => BackendError::Device { op: what, msg: format!("{status:?}") },
    })
}
