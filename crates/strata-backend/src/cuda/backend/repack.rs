//! Streamed units repacked where they land: a weight of a block format the upload
//! pipeline copied into a device slot (a streamed layer, a cached expert, a neuron group)
//! comes in its stored layout; under `STRATA_CUDA_MATVEC=packed` it is rearranged into
//! the packed layout in its slot, on the compute stream after the copy (a device-to-device
//! copy into scratch, then `pack_blocks_u8` back), so streamed units decode on the packed
//! kernels as resident ones do. Two passes over the bytes in device memory per upload.

use super::*;

impl CudaBackend {
    /// Repacks the slot view `w` in place and says so, where the packed kernels can read
    /// it (`STRATA_CUDA_MATVEC=packed`, a format with a packed layout, whole blocks a row,
    /// a 16-byte aligned start); `false` (nothing done) otherwise.
    pub(super) fn repack_in_slot(&self, w: &CudaWeight) -> BackendResult<bool> {
        let Some((block, q0, q_len)) = super::super::packed::block_split(w.dtype) else { return Ok(false) };
        let rows_whole = w.shape.len() == 2 && w.shape[1].is_multiple_of(w.dtype.block_size());
        let p = w.ptr(&self.stream, 0);
        if !self.matvec.packs(w.dtype) || !rows_whole || !p.is_multiple_of(16) {
            return Ok(false);
        }
        let n_blocks = w.shape[0] * (w.shape[1] / w.dtype.block_size());
        let len = n_blocks * block;
        let mut s = self.scratch();
        let tmp = ptr(self.grow(&mut s.repack, len, "repacking a streamed weight")?, &self.stream, 0);
        self.stream.context().bind_to_thread().map_err(dev_err("repacking a streamed weight", 0))?;
        // SAFETY: the scratch holds `len` bytes (grown above) and the slot view `len` from
        // `p` (its tensor's bytes: whole blocks); both are device memory of this context,
        // and the copy is ordered on the compute stream after the upload into the slot.
        let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(tmp, p, len, self.stream.cu_stream()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(dev_err("repacking a streamed weight", len as u64)(DriverError(rc)));
        }
        let (n, b, q0, ql) = (n_blocks as u64, block as u32, q0 as u32, q_len as u32);
        let mut l = Kernel::new(self.func("pack_blocks_u8")?);
        l.arg(&tmp).arg(&p).arg(&n).arg(&b).arg(&q0).arg(&ql);
        // SAFETY: pack_blocks_u8(src, dst, n_blocks, block, q0, q_len) per kernels/README.md:
        // `src` (the scratch copy) and `dst` (the slot view) each hold `n_blocks × block`
        // bytes and do not overlap; `q0 + q_len ≤ block` (`block_split`).
        unsafe { self.launch(&l, launch::pack_blocks(n_blocks), "repacking a streamed weight") }?;
        Ok(true)
    }

    /// A second weight viewing the same slot as `w` (a tied weight), without repacking
    /// its bytes again; `None` for a weight of its own memory.
    pub(super) fn same_view(&self, w: &CudaWeight) -> Option<CudaWeight> {
        match &w.mem {
            WeightMem::Slot { hold, offset } => Some(CudaWeight {
                mem: WeightMem::Slot { hold: hold.clone(), offset: *offset },
                dtype: w.dtype,
                shape: w.shape.clone(),
                layout: w.layout,
            }),
            WeightMem::Owned { .. } => None,
        }
    }
}
