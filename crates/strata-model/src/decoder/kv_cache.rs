//! One sequence's KV cache (and linear-attention state), in the buffers of the backend
//! of the model that made it.

use super::*;

/// Keys and values of one sequence, per layer: `[capacity, n_kv_heads * head_dim]`, in
/// the buffers of the backend of the model that made it.
pub(super) struct KvBufs<B: Backend> {
    pub(super) k: Vec<B::Buf>,
    pub(super) v: Vec<B::Buf>,
}

/// Positions a KV cache's buffers grow by, at least.
pub const KV_BLOCK: usize = 256;

/// One sequence's KV cache. It belongs to the model that made it: passing it to
/// another model's forward pass is an error. Its buffers are allocated by need, in
/// [`KV_BLOCK`]s growing by half again, up to `capacity` positions.
pub struct KvCache {
    pub(super) bufs: Box<dyn Any + Send>, // KvBufs<B> of the model's backend
    /// Per layer, a linear-attention layer's state (`LinearAttnConfig::state_len`
    /// floats, in a buffer of the model's backend; `None` for attention layers): fixed
    /// in size, charged to the memory budget when the cache is made.
    pub(super) states: Vec<Option<Box<dyn LinState>>>,
    /// The states went further than the cache's length (a pass that failed part way, a
    /// shorter length asked for): they are zeroed before the next pass uses them.
    pub(super) states_stale: bool,
    pub(super) len: usize,
    pub(super) capacity: usize,
    /// Positions the buffers hold now.
    pub(super) allocated: usize,
    /// Bytes one position takes, over every layer.
    pub(super) position_bytes: u64,
    /// Its allocated bytes, held against the scheduler's memory budget.
    pub(super) memory: Reservation,
    /// The bytes of `states`, likewise.
    pub(super) state_memory: Reservation,
    /// The first `rows` positions ran as whole prompt chunks of `chunk` tokens from
    /// position 0, as any fresh prompt that starts with them runs them.
    pub(super) grid: Grid,
    /// This sequence's `--sparse-ffn` setting (a request's `sparse_ffn`); `None`: the
    /// model's.
    pub sparse_ffn: Option<SparseFfn>,
    /// What the model gave for a position's last row (see [`KvCache::keep_output`]).
    pub(super) kept_output: Option<KeptOutput>,
    /// The linear-attention states a verifying pass saved after each of its rows
    /// ([`SeqStep::verify`]), for [`KvCache::truncate`] to go back to.
    pub(super) row_states: Option<RowStates>,
    /// A draft model's cache for the same sequence and the tokens it holds (speculative
    /// decoding), carried with this one so that a follow-up request's draft starts
    /// from it. Its bytes count in [`allocated_bytes`](Self::allocated_bytes).
    pub draft: Option<Box<(KvCache, Vec<u32>)>>,
}

/// A verifying pass's linear-attention states, on the host: `rows[j][l]` is layer
/// `l`'s state after the pass's row `j` (empty for an attention layer), the pass having
/// started at position `from`.
pub(super) struct RowStates {
    from: usize,
    rows: Vec<Vec<Vec<f32>>>,
}

/// A forward pass's output for a sequence's last new position: every logit, or the
/// most likely entries.
#[derive(Clone, Debug)]
pub enum LastOutput {
    Logits(Vec<f32>),
    Top(TopK),
}

/// The output for the last of a cache's first `len` positions, under `sparse_ffn`.
#[derive(Debug)]
pub(super) struct KeptOutput {
    pub(super) len: usize,
    pub(super) sparse_ffn: Option<SparseFfn>,
    pub(super) out: LastOutput,
}

/// A linear-attention state in a buffer of the model's backend, saved and put back
/// through the host without the backend at hand.
pub(super) trait LinState: Send {
    fn len(&self) -> usize;
    fn to_host(&self) -> BackendResult<Vec<f32>>;
    fn write_host(&mut self, data: &[f32]) -> BackendResult<()>;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A buffer and its length (a backend may allocate more).
pub(super) struct StateBuf<T> {
    pub(super) buf: T,
    pub(super) len: usize,
}

impl<T: HostCopy + Send + 'static> LinState for StateBuf<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn to_host(&self) -> BackendResult<Vec<f32>> {
        let mut v = self.buf.to_host()?;
        v.truncate(self.len);
        Ok(v)
    }

    fn write_host(&mut self, data: &[f32]) -> BackendResult<()> {
        self.buf.write_host(data)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        &mut self.buf
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Grid {
    pub(super) chunk: usize,
    pub(super) rows: usize,
}

impl KvCache {
    /// Positions already cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes its buffers hold now (keys and values, and linear-attention state), a
    /// draft's cache carried with it included.
    pub fn allocated_bytes(&self) -> u64 {
        self.memory.bytes() + self.state_memory.bytes() + self.draft.as_ref().map_or(0, |d| d.0.allocated_bytes())
    }

    /// Bytes one position takes, over every layer: a full cache is `capacity` times this.
    pub fn position_bytes(&self) -> u64 {
        self.position_bytes
    }

    /// The most of its first `limit` positions that ran as whole prompt chunks from
    /// position 0 (a multiple of the chunk size). Where the backend's rows depend on the
    /// chunking ([`Backend::chunking_changes_rows`](strata_backend::Backend::chunking_changes_rows)),
    /// only these are reused: a fresh prompt that starts with them cuts them into the
    /// same chunks, and its later chunks start at the same place.
    pub fn grid_rows(&self, limit: usize) -> usize {
        let rows = self.grid.rows.min(self.len).min(limit);
        rows - rows % self.grid.chunk.max(1)
    }

    /// Records a prompt chunk of `n` tokens from position `start`, in a pass that cuts
    /// prompts into chunks of `chunk`.
    pub fn note_prompt_chunk(&mut self, start: usize, n: usize, chunk: usize) {
        if self.grid.chunk != chunk {
            self.grid = Grid { chunk, rows: 0 };
        }
        if start == self.grid.rows && n == chunk {
            self.grid.rows += n;
        }
    }

    /// Sets its length to `len`, no more than it holds.
    fn cut_to(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.grid.rows = self.grid.rows.min(self.len);
        // Positions past `len` may be written again with other tokens.
        if self.kept_output.as_ref().is_some_and(|k| k.len > self.len) {
            self.kept_output = None;
        }
    }

    /// Keeps `out`, what the model gave for the last position the cache holds now (a
    /// prompt's last row), so that a request repeating exactly that prompt can start
    /// from it ([`kept_output`](Self::kept_output)) instead of running its last rows
    /// again.
    pub fn keep_output(&mut self, out: LastOutput) {
        self.kept_output = Some(KeptOutput { len: self.len, sparse_ffn: self.sparse_ffn, out });
    }

    /// The output [`keep_output`](Self::keep_output) kept, while the cache holds
    /// exactly the positions it was kept at (going back further, or running other
    /// tokens there, drops it) and runs under the same `sparse_ffn` setting.
    pub fn kept_output(&self) -> Option<&LastOutput> {
        let k = self.kept_output.as_ref()?;
        (k.len == self.len && k.sparse_ffn == self.sparse_ffn && !self.states_stale).then_some(&k.out)
    }

    /// A copy of its linear-attention state (`None` for a cache of attention layers
    /// only), to [`restore_states`](Self::restore_states) later.
    /// On a GPU this copies the states to the host; a copy that fails gives `None`.
    pub fn states_snapshot(&self) -> Option<Vec<Vec<f32>>> {
        if self.states_stale || self.states.iter().all(Option::is_none) {
            return None;
        }
        self.states.iter().map(|s| s.as_ref().map_or(Ok(Vec::new()), |s| s.to_host())).collect::<Result<_, _>>().ok()
    }

    /// Layer `l`'s state buffer (of backend `B`), `len` floats long; `None` for an
    /// attention layer, or a cache of another backend.
    pub(super) fn state_mut<B: Backend>(&mut self, l: usize, len: usize) -> Option<&mut B::Buf> {
        let s = self.states.get_mut(l)?.as_mut().filter(|s| s.len() == len)?;
        s.as_any_mut().downcast_mut::<B::Buf>()
    }

    /// Zeroes the states of a cache that went back (see `states_stale`).
    pub(super) fn fresh_states(&mut self) -> BackendResult<()> {
        if std::mem::take(&mut self.states_stale) {
            for s in self.states.iter_mut().flatten() {
                s.write_host(&vec![0.0; s.len()])?;
            }
        }
        Ok(())
    }

    /// Goes back to `len` positions with the linear-attention state a
    /// [`states_snapshot`](Self::states_snapshot) took there (the keys and values
    /// before `len` are still the cache's own). A snapshot of another shape, or a `len`
    /// past the cache's, empties it instead.
    pub fn restore_states(&mut self, len: usize, states: Vec<Vec<f32>>) {
        let fits = states.len() == self.states.len()
            && states.iter().zip(&self.states).all(|(a, b)| a.len() == b.as_ref().map_or(0, |b| b.len()));
        let put = fits
            && len <= self.len
            && self.states.iter_mut().zip(&states).all(|(b, a)| b.as_mut().is_none_or(|b| b.write_host(a).is_ok()));
        match put {
            true => {
                self.states_stale = false;
                self.cut_to(len);
            }
            false => {
                self.states_stale = true;
                self.cut_to(0);
            }
        }
    }

    /// Empties a cache whose linear-attention state went further than its length (a
    /// pass that failed part way); a cache of attention layers only is left as it is.
    pub(super) fn forget_states(&mut self) {
        if self.states.iter().any(Option::is_some) {
            self.states_stale = true;
            self.cut_to(0);
        }
    }

    /// Forgets everything after the first `len` positions (for reusing a shared prefix,
    /// or dropping a verifying pass's rejected rows). A linear-attention state goes back
    /// only to the end of one of the rows of the last pass, when that pass verified
    /// ([`SeqStep::verify`]); a shorter `len` otherwise empties the cache (check
    /// [`len`](Self::len) afterwards).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len && !self.rewind_states(len) {
            self.forget_states();
        }
        self.cut_to(len);
    }

    /// Puts back the state the last (verifying) pass saved after the row that ends at
    /// `len`; false when it saved none there.
    fn rewind_states(&mut self, len: usize) -> bool {
        let Some(saved) = self.row_states.take() else { return false };
        let ran = saved.from + saved.rows.len();
        if self.states_stale || self.len != ran || len <= saved.from || len > ran {
            return false;
        }
        let row = &saved.rows[len - saved.from - 1];
        let fits = row.len() == self.states.len()
            && row.iter().zip(&self.states).all(|(a, b)| a.len() == b.as_ref().map_or(0, |b| b.len()));
        fits && self.states.iter_mut().zip(row).all(|(b, a)| b.as_mut().is_none_or(|b| b.write_host(a).is_ok()))
    }

    /// Starts a pass that runs `rows` rows of this cache's sequence alone (verifying:
    /// their states are saved row by row), or none (0): earlier saved states go.
    pub(super) fn begin_row_states(&mut self, rows: usize) {
        let linear = self.states.iter().any(Option::is_some);
        self.row_states = (rows > 0 && linear)
            .then(|| RowStates { from: self.len, rows: vec![vec![Vec::new(); self.states.len()]; rows] });
    }

    /// Saves layer `l`'s state after the verifying pass's row at position `pos`.
    pub(super) fn save_row_state(&mut self, l: usize, pos: usize) -> BackendResult<()> {
        let (Some(saved), Some(Some(state))) = (self.row_states.as_mut(), self.states.get(l)) else { return Ok(()) };
        if let Some(slot) = pos.checked_sub(saved.from).and_then(|j| saved.rows.get_mut(j)) {
            slot[l] = state.to_host()?;
        }
        Ok(())
    }
}

/// The caches a model makes for its sequences.
impl<B: Backend> DecoderModel<B> {
    /// An empty KV cache for up to `capacity` positions; nothing is allocated until a
    /// forward pass (or [`reserve_cache`](Self::reserve_cache)) needs it.
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError> {
        let c = &self.config;
        let width = self.kv_type.row_len(c.n_kv_heads * c.head_dim);
        // A latent layer caches one row (read as keys and as values), an attention
        // layer two.
        let rows_cached: usize = c.layers.iter().map(|l| l.mixer.cached_rows()).sum();
        let position_bytes = (rows_cached * width * std::mem::size_of::<f32>()) as u64;
        let bufs = KvBufs::<B> { k: Vec::new(), v: Vec::new() };
        // Linear-attention state: fixed, allocated (and charged) now.
        let mut states: Vec<Option<Box<dyn LinState>>> = Vec::with_capacity(c.layers.len());
        for l in &c.layers {
            states.push(match (l.mixer, &c.linear_attn) {
                (Mixer::Linear, Some(la)) => {
                    let buf = self.backend.alloc(la.state_len()).map_err(ModelError::Backend)?;
                    Some(Box::new(StateBuf { buf, len: la.state_len() }))
                }
                _ => None,
            });
        }
        let state_bytes = states.iter().flatten().map(|s| (s.len() * std::mem::size_of::<f32>()) as u64).sum();
        let memory = self.layers.reserve(0);
        let state_memory = self.layers.reserve(state_bytes);
        Ok(KvCache {
            bufs: Box::new(bufs),
            states,
            states_stale: false,
            memory,
            state_memory,
            len: 0,
            capacity,
            allocated: 0,
            position_bytes,
            grid: Grid::default(),
            sparse_ffn: None,
            kept_output: None,
            row_states: None,
            draft: None,
        })
    }

    /// Grows `cache` to hold at least `positions` (at most its capacity), keeping what
    /// it holds: by a [`KV_BLOCK`] or half its size again, whichever is more, so that a
    /// growing sequence copies its cache a bounded number of times.
    pub fn reserve_cache(&self, cache: &mut KvCache, positions: usize) -> Result<(), ModelError> {
        let positions = positions.min(cache.capacity);
        if positions <= cache.allocated {
            return Ok(());
        }
        let grown = (cache.allocated + cache.allocated / 2).max(positions).next_multiple_of(KV_BLOCK);
        let target = grown.min(cache.capacity);
        let width = self.kv_type.row_len(self.config.n_kv_heads * self.config.head_dim);
        let be = &*self.backend;
        let bufs = cache.bufs.downcast_mut::<KvBufs<B>>().ok_or(ModelError::ForeignCache)?;
        // Charged before the buffers exist, so that a streaming budget makes room first.
        let memory = self.layers.reserve(target as u64 * cache.position_bytes);
        // A linear-attention layer keeps no keys or values, nor a latent one values:
        // one placeholder float.
        let fresh = |old: Option<&B::Buf>, attn: bool| -> Result<B::Buf, ModelError> {
            if !attn {
                return Ok(be.alloc(1)?);
            }
            let mut buf = be.alloc(target * width)?;
            if let Some(old) = old.filter(|_| cache.len > 0) {
                be.copy_rows(old, Rows::first(cache.len), width, &mut buf, 0)?;
            }
            Ok(buf)
        };
        let n = self.config.n_layers;
        let mut next = KvBufs::<B> { k: Vec::with_capacity(n), v: Vec::with_capacity(n) };
        for (l, layer) in self.config.layers.iter().enumerate() {
            next.k.push(fresh(bufs.k.get(l), layer.mixer.cached_rows() > 0)?);
            next.v.push(fresh(bufs.v.get(l), layer.mixer.cached_rows() > 1)?);
        }
        *bufs = next;
        cache.memory = memory;
        cache.allocated = target;
        Ok(())
    }
}
