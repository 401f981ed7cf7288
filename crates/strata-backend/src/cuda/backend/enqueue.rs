//! What the backend puts on its compute stream: kernel launches (through the graph tape
//! while a decode step is captured or replayed, [`tape`](super::tape)), device-to-device
//! copies, the small host-to-device copies staged in page-locked memory, and the scratch
//! slots they fill.

use super::*;

impl CudaBackend {
    /// Launches `k` with `shape`, and counts the launch. While a graph is captured the
    /// launch is also kept on the tape; while one is replayed it is only compared with
    /// the captured launch in its place (and refused when the graph holds other work).
    ///
    /// # Safety
    /// The arguments pushed on `k` must match the kernel's parameters, and every buffer
    /// must hold what the kernel reads and writes with this launch shape.
    pub(super) unsafe fn launch(&self, k: &Kernel<'_>, shape: Shape, op: &str) -> BackendResult<()> {
        let args = k.args.get().ok_or_else(|| BackendError::Device {
            op: op.into(),
            msg: format!("more than {} kernel arguments", tape::MAX_ARGS),
        })?;
        if self.capturing.load(Ordering::Relaxed) {
            let func = k.func.cu_function() as usize;
            match self.tape().kernel(func, shape.grid, shape.block, args) {
                Step::Enqueue => {}
                Step::Held => return Ok(()),
                Step::Differs => return self.not_capturing(op),
            }
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { self.enqueue(k.func, args, shape) }.map_err(dev_err(op, 0))
    }

    /// Enqueues `func` with the argument values `args` on the compute stream.
    ///
    /// # Safety
    /// As [`CudaBackend::launch`].
    pub(super) unsafe fn enqueue(&self, func: &CudaFunction, args: &[u64], shape: Shape) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); tape::MAX_ARGS];
        for (p, a) in params.iter_mut().zip(args) {
            *p = (a as *const u64).cast_mut().cast();
        }
        let params = &mut params[..args.len()];
        // SAFETY: each parameter points at its value's 8-byte slot, alive through the call
        // (the driver copies the values); the rest is the caller's contract.
        unsafe {
            cudarc::driver::result::launch_kernel(
                func.cu_function(),
                shape.grid,
                shape.block,
                0,
                self.stream.cu_stream(),
                params,
            )
        }
    }

    /// Copies `bytes` bytes from device address `src` to `dst` on the compute stream
    /// (kept on, or compared with, the tape as [`CudaBackend::launch`] does).
    ///
    /// # Safety
    /// Both ranges must be allocated device memory of `bytes` bytes, staying so until the
    /// copy has run.
    pub(super) unsafe fn copy_device(&self, dst: u64, src: u64, bytes: usize, op: &str) -> BackendResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        if self.capturing.load(Ordering::Relaxed) {
            match self.tape().copy(dst, src, bytes) {
                Step::Enqueue => {}
                Step::Held => return Ok(()),
                Step::Differs => return self.not_capturing(op),
            }
        }
        self.stream.context().bind_to_thread().map_err(dev_err(op, 0))?;
        // SAFETY: the caller's contract.
        let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream.cu_stream()) };
        match rc {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            rc => Err(dev_err(op, 0)(DriverError(rc))),
        }
    }

    pub(super) fn tape(&self) -> std::sync::MutexGuard<'_, tape::Tape> {
        self.tape.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot of `n` elements at least: the existing allocation, or a bigger one.
    pub(super) fn grow<'s, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        slot: &'s mut Option<CudaSlice<T>>,
        n: usize,
        what: &str,
    ) -> BackendResult<&'s mut CudaSlice<T>> {
        if slot.as_ref().is_none_or(|s| s.len() < n) {
            self.not_capturing(what)?;
            *slot = None;
            let bytes = (n.max(1) * std::mem::size_of::<T>()) as u64;
            *slot = Some(self.stream.alloc_zeros::<T>(n.max(1)).map_err(dev_err(what, bytes))?);
        }
        slot.as_mut().ok_or_else(|| BackendError::Device { op: what.into(), msg: "no scratch".into() })
    }

    /// Copies host values into the front of a device slot (which holds at least as many).
    /// Small ones (up to [`crate::cuda::staging::HALF`]) go through the page-locked staging.
    pub(super) fn put<T: cudarc::driver::DeviceRepr>(
        &self,
        src: &[T],
        dst: &mut CudaSlice<T>,
        what: &str,
    ) -> BackendResult<()> {
        if src.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice_mut(..src.len());
        let t = std::time::Instant::now();
        // SAFETY: `DeviceRepr` values are plain bytes, `size_of_val(src)` of them.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src)) };
        let dp = view.device_ptr_mut(&self.stream).0;
        let done = match self.staging.as_ref() {
            Some(staging) if self.capturing.load(Ordering::Relaxed) => {
                // Captured or replayed: the bytes go to a place in staging the graph's copy
                // reads when it runs (so staging must not wait for the device to get it).
                let mut staging = staging.lock().unwrap_or_else(|e| e.into_inner());
                if !staging.fits(bytes.len()) {
                    return self.not_capturing(what);
                }
                // SAFETY: it fits in the half being filled: no copy still reads that place.
                let at = unsafe { staging.place(bytes) }.map_err(dev_err(what, 0))?;
                match self.tape().copy(dp, at as u64, bytes.len()) {
                    // SAFETY: `view` holds `src.len()` values and stays allocated until the
                    // copy has run (it is freed on this stream, after it).
                    Step::Enqueue => unsafe { staging.enqueue(at, bytes.len(), dp) }.map_err(dev_err(what, 0)),
                    Step::Held => Ok(()),
                    Step::Differs => return self.not_capturing(what),
                }
            }
            // SAFETY: as just above.
            Some(staging) => match unsafe { staging.lock().unwrap_or_else(|e| e.into_inner()).copy(bytes, dp) } {
                Some(r) => r.map_err(dev_err(what, 0)),
                None => self.stream.memcpy_htod(src, &mut view).map_err(dev_err(what, 0)),
            },
            // From pageable memory, which a graph cannot copy from.
            None => {
                self.not_capturing(what)?;
                self.stream.memcpy_htod(src, &mut view).map_err(dev_err(what, 0))
            }
        };
        self.put_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.puts.fetch_add(1, Ordering::Relaxed);
        done
    }

    /// Launches a 1-D elementwise kernel `name(a, b, n)`.
    pub(super) fn elementwise(&self, name: &str, a: u64, b: u64, n: usize) -> BackendResult<()> {
        let n32 = n as u32;
        let mut l = Kernel::new(self.func(name)?);
        l.arg(&a).arg(&b).arg(&n32);
        // SAFETY: add_f32 / silu_mul_f32 / gelu_mul_f32 / sigmoid_mul_f32 (x, y, n): both buffers hold at
        // least `n` floats (checked by the callers against their lengths).
        unsafe { self.launch(&l, launch::elementwise(n), name) }?;
        Ok(())
    }

    /// Launches a 1-D in-place kernel `name(x, n, param)`.
    pub(super) fn elementwise_unary(&self, name: &str, x: u64, n: usize, param: f32) -> BackendResult<()> {
        let n32 = n as u32;
        let mut l = Kernel::new(self.func(name)?);
        l.arg(&x).arg(&n32).arg(&param);
        // SAFETY: scale_f32(x, n, factor) / softcap_f32(x, n, cap): `x` holds at least `n`
        // floats (checked by the caller against its length).
        unsafe { self.launch(&l, launch::elementwise(n), name) }?;
        Ok(())
    }
}
