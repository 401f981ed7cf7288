//! Row and column moves (copies, gathers, scatter-adds) and sampling's top-k.

use super::*;

impl CudaBackend {
    pub(super) fn gather_cols(
        &self,
        src: &CudaBuf,
        from: Cols,
        dst: &mut CudaBuf,
        to: Cols,
        rows: usize,
        width: usize,
    ) -> BackendResult<()> {
        if rows == 0 || width == 0 {
            return Ok(());
        }
        check_len(&[src.data.len()], from.end(rows, width), "copy_cols")?;
        check_len(&[dst.data.len()], to.end(rows, width), "copy_cols")?;
        let u = |x: usize| to_u32(x, "copy_cols");
        let (s_stride, d_stride, w32, n32) = (u(from.stride)?, u(to.stride)?, u(width)?, u(rows)?);
        let (sp, dp) = (ptr(&src.data, &self.stream, from.col), ptr(&dst.data, &self.stream, to.col));
        let mut b = Kernel::new(self.func("copy_cols_f32")?);
        b.arg(&sp).arg(&s_stride).arg(&dp).arg(&d_stride).arg(&w32).arg(&n32);
        // SAFETY: copy_cols_f32(src, src_stride, dst, dst_stride, width, n_rows) reads
        // `src[r * src_stride + j]` and writes `dst[r * dst_stride + j]` for r < n_rows,
        // j < width, from pointers already offset by each block's first column: both
        // ends were checked against the buffers above (`Cols::end`).
        unsafe { self.launch(&b, launch::rows(rows, width), "copy_cols") }
    }

    pub(super) fn gather_rows(
        &self,
        src: &CudaBuf,
        rows: Rows<'_>,
        row_len: usize,
        dst: &mut CudaBuf,
        dst_row: usize,
    ) -> BackendResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        check_rows(rows, row_len, src.data.len(), "copy_rows")?;
        check_len(&[dst.data.len()], (dst_row + rows.len()) * row_len, "copy_rows")?;
        if row_len == 0 {
            return Ok(());
        }
        let list = match rows {
            Rows::Range { start, n } => {
                let (from, to) =
                    (ptr(&src.data, &self.stream, start * row_len), ptr(&dst.data, &self.stream, dst_row * row_len));
                // SAFETY: both ranges of `n * row_len` floats lie inside their buffers
                // (checked above), which the stream orders every use of.
                return unsafe { self.copy_device(to, from, n * row_len * 4, "copy_rows") };
            }
            Rows::List(list) => list,
        };
        let (len32, n32) = (to_u32(row_len, "copy_rows")?, to_u32(list.len(), "copy_rows")?);
        let mut s = self.scratch();
        let ids = self.grow(&mut s.row_ids, list.len(), "copy_rows row list")?;
        self.put(list, ids, "copy_rows row list")?;
        let (sp, ip, dp) = (
            ptr(&src.data, &self.stream, 0),
            ptr(ids, &self.stream, 0),
            ptr(&dst.data, &self.stream, dst_row * row_len),
        );
        let mut b = Kernel::new(self.func("gather_rows_f32")?);
        b.arg(&sp).arg(&ip).arg(&dp).arg(&len32).arg(&n32);
        // SAFETY: gather_rows_f32(src, rows, dst, row_len, n_rows): every listed row is
        // below `src`'s row count (`check_rows`), so each read `src[rows[i] × row_len ..
        // + row_len]` is in bounds; `dst` from row `dst_row` holds `n_rows × row_len`
        // floats (`check_len`); the scratch holds the `n_rows` row ids just uploaded.
        unsafe { self.launch(&b, launch::rows(list.len(), row_len), "copy_rows") }
    }

    pub(super) fn scatter_add(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        row_len: usize,
        rows: Rows<'_>,
        weights: Option<&[f32]>,
    ) -> BackendResult<()> {
        check_rows(rows, row_len, x.data.len(), "add_rows")?;
        check_len(&[y.data.len()], rows.len() * row_len, "add_rows")?;
        if let Some(w) = weights
            && w.len() != rows.len()
        {
            return Err(BackendError::Device {
                op: "add_rows".into(),
                msg: format!("{} weights for {} rows", w.len(), rows.len()),
            });
        }
        if rows.is_empty() || row_len == 0 {
            return Ok(());
        }
        let (x0, list) = match rows {
            Rows::Range { start, n } if weights.is_none() => {
                let (xp, yp) = (ptr(&x.data, &self.stream, start * row_len), ptr(&y.data, &self.stream, 0));
                return self.elementwise("add_f32", xp, yp, n * row_len);
            }
            Rows::Range { start, .. } => (start * row_len, None),
            Rows::List(list) => {
                check_distinct(list, "add_rows")?;
                (0, Some(list))
            }
        };
        let (len32, n32) = (to_u32(row_len, "add_rows")?, to_u32(rows.len(), "add_rows")?);
        let mut s = self.scratch();
        // Left null: no list (a range: row `i` past `x`'s offset), no weights (weight 1).
        let mut ip = 0u64;
        if let Some(list) = list {
            let ids = self.grow(&mut s.row_ids, list.len(), "add_rows row list")?;
            self.put(list, ids, "add_rows row list")?;
            ip = ptr(ids, &self.stream, 0);
        }
        let mut wp = 0u64;
        if let Some(w) = weights {
            let slot = self.grow(&mut s.row_weights, w.len(), "add_rows weights")?;
            self.put(w, slot, "add_rows weights")?;
            wp = ptr(slot, &self.stream, 0);
        }
        let (xp, yp) = (ptr(&x.data, &self.stream, x0), ptr(&y.data, &self.stream, 0));
        let mut b = Kernel::new(self.func("add_rows_f32")?);
        b.arg(&xp).arg(&yp).arg(&ip).arg(&wp).arg(&len32).arg(&n32);
        // SAFETY: add_rows_f32(x, y, rows, w, row_len, n_rows): every destination row (a
        // listed one, or `start + i` for a range, `x` then pointing at row `start`) is
        // below `x`'s row count (`check_rows`), and listed rows are distinct
        // (`check_distinct`), so each row has one writer and nothing else is written; `y` holds
        // `n_rows × row_len` floats (`check_len`); the row ids and weights (exactly
        // `n_rows`, checked above) were just uploaded to scratch, or are null (identity
        // rows, weight 1), which the kernel tests for.
        unsafe { self.launch(&b, launch::rows(rows.len(), row_len), "add_rows") }
    }

    pub(super) fn sample_top_k(
        &self,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        k: usize,
    ) -> BackendResult<Vec<TopK>> {
        let k = k.clamp(1, MAX_TOP_K);
        let mut s = self.scratch();
        // The ids, values and logsumexps side by side in one buffer, so that one copy
        // brings them back: `rows × k` ids, `rows × k` values, `rows` sums (f32 bits).
        let words = rows * (2 * k + 1);
        let top = self.grow(&mut s.top, words, "top-k results")?;
        let (idx, val, lse) =
            (ptr(top, &self.stream, 0), ptr(top, &self.stream, rows * k), ptr(top, &self.stream, 2 * rows * k));
        let lp = ptr(&logits.data, &self.stream, 0);
        let (v32, k32) = (vocab as u32, k as u32);
        let name = if k == 1 { "argmax_f32" } else { "topk_f32" };
        let mut b = Kernel::new(self.func(name)?);
        b.arg(&lp).arg(&v32);
        if k > 1 {
            b.arg(&k32);
        }
        b.arg(&idx).arg(&val).arg(&lse);
        // SAFETY: argmax_f32(logits, vocab, idx, val, lse) / topk_f32(logits, vocab, k,
        // idx, val, lse): `logits` holds `rows × vocab` floats, the outputs `rows × k`,
        // `rows × k` and `rows` 4-byte words, disjoint parts of the scratch (grown to
        // `rows × (2k + 1)` above); one block per row.
        unsafe { self.launch(&b, launch::sample(rows), name) }?;
        let mut back = vec![0u32; words];
        let st = &self.stream;
        st.memcpy_dtoh(&s.top.as_ref().map(|b| b.slice(..words)).ok_or_else(no_scratch)?, &mut back)
            .map_err(dev_err("top-k readback", 0))?;
        st.synchronize().map_err(dev_err("top-k readback", 0))?;
        let (ids, rest) = back.split_at(rows * k);
        let (vals, lses) = rest.split_at(rows * k);
        let vals: Vec<f32> = vals.iter().map(|&b| f32::from_bits(b)).collect();
        // Slots past the row's non-NaN logits come back as id u32::MAX: drop them.
        Ok((0..rows)
            .map(|r| {
                let n = ids[r * k..][..k].iter().take_while(|&&i| i != u32::MAX).count();
                TopK {
                    ids: ids[r * k..][..n].to_vec(),
                    logits: vals[r * k..][..n].to_vec(),
                    lse: f32::from_bits(lses[r]),
                }
            })
            .collect())
    }
}
