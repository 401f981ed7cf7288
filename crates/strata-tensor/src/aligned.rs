//! Page-aligned host buffers, the target of storage reads and of a GPU's copy engine, and
//! the page-locking hook ([`HostPin`]) a backend gives them.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::tensor::ByteSource;

/// Alignment of every [`AlignedBuf`]: a page, which covers the memory alignment that
/// `O_DIRECT` asks for on every filesystem we know of.
pub const BUF_ALIGN: usize = 4096;

/// An owned heap buffer aligned to [`BUF_ALIGN`], the target of the storage reader's reads.
/// `len` bytes are valid; capacity is a multiple of [`BUF_ALIGN`] and always initialized
/// (fresh allocations are zeroed), so growing never exposes uninitialized memory.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    /// Page-locks the allocation for a GPU's copy engine ([`AlignedBuf::pin_with`]).
    pin: Option<Arc<dyn HostPin>>,
    /// Whether the current allocation is page-locked.
    pinned: bool,
}

/// Page-locks host memory so that a GPU's copy engine can read it directly (CUDA's
/// `cuMemHostRegister`). A buffer the OS refuses to lock (`ulimit -l`, systemd's
/// `LimitMEMLOCK`) stays usable: copies from it are slower, not wrong.
pub trait HostPin: Send + Sync {
    /// Locks `len` bytes at `ptr`; false when refused.
    fn pin(&self, ptr: *mut u8, len: usize) -> bool;
    /// Unlocks what [`HostPin::pin`] locked at `ptr`, before the memory is freed.
    fn unpin(&self, ptr: *mut u8);
}

/// A zero-sized type with the buffer's alignment, for a well-aligned dangling pointer.
#[repr(align(4096))]
struct Page;
const _: () = assert!(align_of::<Page>() == BUF_ALIGN);

// SAFETY: `AlignedBuf` owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only (`as_slice`).
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// An empty buffer; allocates nothing.
    pub fn new() -> Self {
        AlignedBuf { ptr: NonNull::<Page>::dangling().cast(), len: 0, cap: 0, pin: None, pinned: false }
    }

    /// Page-locks this buffer's allocation now and every one it grows into, until it is
    /// freed. Returns whether the current allocation is locked (an empty one counts).
    pub fn pin_with(&mut self, pin: Arc<dyn HostPin>) -> bool {
        if self.pinned {
            return true;
        }
        if self.cap > 0 {
            self.pinned = pin.pin(self.ptr.as_ptr(), self.cap);
        }
        self.pin = Some(pin);
        self.pinned || self.cap == 0
    }

    /// Whether the allocation is page-locked for a GPU's copy engine.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// An empty buffer with room for at least `cap` bytes.
    pub fn with_capacity(cap: usize) -> Self {
        let mut buf = Self::new();
        buf.reserve_discarding(cap);
        buf
    }

    /// Bytes that are valid.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (a multiple of [`BUF_ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` initialized bytes (or dangling and
        // aligned with `len == 0`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Sets the length to `len`, growing the allocation if needed. The contents are
    /// unspecified afterwards (lost when it reallocates), but always initialized.
    pub fn resize_discarding(&mut self, len: usize) {
        self.reserve_discarding(len);
        self.len = len;
    }

    /// The whole capacity, for reading into.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation holds `cap` initialized bytes and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// Sets the length after a read into [`AlignedBuf::spare_mut`]; `len` is at most the
    /// capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "length {len} past the capacity {}", self.cap);
        self.len = len;
    }

    /// Makes room for `cap` bytes; the contents are lost when it reallocates, and `len`
    /// is reset to 0 either way.
    pub fn reserve_discarding(&mut self, cap: usize) {
        self.len = 0;
        if cap <= self.cap {
            return;
        }
        let new_cap = cap.div_ceil(BUF_ALIGN).checked_mul(BUF_ALIGN).expect("buffer size overflows usize");
        let layout = Layout::from_size_align(new_cap, BUF_ALIGN).expect("buffer size overflows isize");
        // SAFETY: `new_cap > 0` since `cap > self.cap >= 0`.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else { std::alloc::handle_alloc_error(layout) };
        self.free();
        self.ptr = ptr;
        self.cap = new_cap;
        if let Some(pin) = &self.pin {
            self.pinned = pin.pin(self.ptr.as_ptr(), self.cap);
        }
    }

    fn free(&mut self) {
        if self.cap > 0 {
            if self.pinned
                && let Some(pin) = &self.pin
            {
                pin.unpin(self.ptr.as_ptr());
            }
            self.pinned = false;
            // SAFETY: allocated in `reserve_discarding` with exactly this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.cap, BUF_ALIGN)) };
            self.ptr = NonNull::<Page>::dangling().cast();
            self.cap = 0;
            self.len = 0;
        }
    }
}

impl Default for AlignedBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.free();
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf(len {}, capacity {})", self.len, self.cap)
    }
}

impl ByteSource for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_page_aligned_and_grows() {
        let mut b = AlignedBuf::new();
        assert_eq!(b.capacity(), 0);
        assert!(b.as_slice().is_empty());
        assert!((b.as_slice().as_ptr() as usize).is_multiple_of(BUF_ALIGN));
        b.reserve_discarding(5000);
        assert_eq!(b.capacity(), 8192);
        assert!((b.spare_mut().as_ptr() as usize).is_multiple_of(BUF_ALIGN));
        assert!(b.spare_mut().iter().all(|&x| x == 0));
        b.reserve_discarding(100);
        assert_eq!(b.capacity(), 8192);
    }
}
