//! Where each layer's bytes are stored, and how one read buffer holds them.
//!
//! A layer's tensors are grouped by file and sorted by offset; tensors closer than
//! [`MERGE_GAP`] share one read. Each read is widened to the alignment of direct I/O and
//! lands at an aligned place in the layer's buffer, so a flat `layer_NNN.bin` or a
//! `.cawsf` layer is one read, and a GGUF or safetensors layer (whose tensors are
//! adjacent in those files) is one read too. The tensors are then views of the buffer.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::io::{AlignedBuf, StorageFile};
use super::{LayerTensors, SchedError};
use strata_tensor::tensor::{ByteSource, DType, Encoded, Fixup, HostTensor};

/// Two tensors of a layer in the same file that are at most this far apart are read
/// together (reading the gap costs less than another request).
pub const MERGE_GAP: u64 = 256 << 10;

/// Reads are issued in chunks of this size (aligned for direct I/O) ...
const IO_CHUNK: usize = 4 << 20;
/// ... by this many threads at once.
const IO_STREAMS: usize = 2;

/// One read: `len` bytes at `offset` of file `file` into the buffer at `dst`. At least
/// `min` of them must exist (the rest is widening past the end of the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadOp {
    pub file: usize,
    pub offset: u64,
    pub len: usize,
    pub min: usize,
    pub dst: usize,
}

/// One tensor's place in the layer buffer.
#[derive(Clone, Debug)]
pub struct Slot {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub at: usize,
    pub len: usize,
    pub fixup: Option<Fixup>,
    /// A tensor stored encoded: its pieces' places (`at`, `len`) in the buffer, which
    /// [`Reader::fix`] decodes into this slot.
    pub decode: Option<(Arc<Encoded>, Places)>,
}

/// Places (`at`, `len`) in a layer buffer.
pub type Places = Vec<(usize, usize)>;

/// How to read one layer.
#[derive(Clone, Debug)]
pub struct LayerLayout {
    pub reads: Vec<ReadOp>,
    /// Buffer bytes: the reads, then the decoded tensors' slots.
    pub buf_len: usize,
    pub slots: Vec<Slot>,
}

impl LayerLayout {
    /// Whether the buffer holds every tensor as stored (no fixup, nothing to decode).
    pub fn as_stored(&self) -> bool {
        self.slots.iter().all(|s| s.fixup.is_none() && s.decode.is_none())
    }
}

/// What a stored range holds: a tensor as it is used (with its fixup), or piece `k` of
/// an encoded tensor.
enum Piece<'a> {
    Tensor(&'a HostTensor, Option<Fixup>),
    Encoded(&'a Arc<Encoded>, usize),
}

/// Plans the reads of every layer. A layer some of whose tensors are neither stored in
/// a file ([`HostTensor::origin`]) nor stored encoded in one ([`HostTensor::encoded`])
/// gets `None`. Returns the distinct files (in first-seen order) and the layouts.
pub fn plan_layers(sources: &[LayerTensors], align: u64) -> (Vec<Arc<Path>>, Vec<Option<LayerLayout>>) {
    let mut files: Vec<Arc<Path>> = Vec::new();
    let mut file_index: HashMap<Arc<Path>, usize> = HashMap::new();
    let mut layouts = Vec::with_capacity(sources.len());
    for layer in sources {
        // (file, offset, len, tensor name, what)
        let mut placed: Vec<(usize, u64, usize, &String, Piece<'_>)> = Vec::with_capacity(layer.tensors.len());
        let mut streamable = true;
        let mut names: Vec<&String> = layer.tensors.keys().collect();
        names.sort();
        let mut file_of = |path: &Arc<Path>| {
            let next = files.len();
            *file_index.entry(path.clone()).or_insert_with(|| {
                files.push(path.clone());
                next
            })
        };
        for name in names {
            let t = &layer.tensors[name];
            if let Some(o) = t.origin() {
                placed.push((file_of(&o.path), o.offset, t.byte_len(), name, Piece::Tensor(t, o.fixup)));
            } else if let Some(e) = t.encoded() {
                let file = file_of(&e.path);
                placed
                    .extend(e.pieces.iter().enumerate().map(|(k, &(at, n))| (file, at, n, name, Piece::Encoded(e, k))));
            } else {
                streamable = false;
                break;
            }
        }
        if !streamable {
            layouts.push(None);
            continue;
        }
        placed.sort_by_key(|&(file, offset, ..)| (file, offset));
        let (mut reads, mut slots): (Vec<ReadOp>, Vec<Slot>) = (Vec::new(), Vec::new());
        // Encoded tensors' pieces as they are placed: name -> (encoded, piece places).
        let mut encoded: HashMap<&String, (&Arc<Encoded>, Places)> = HashMap::new();
        let mut buf_len = 0usize;
        let mut i = 0;
        while i < placed.len() {
            // One read: ranges i..j of the same file, each starting within MERGE_GAP of
            // the end of the previous one.
            let (file, first) = (placed[i].0, placed[i].1);
            let mut end = first + placed[i].2 as u64;
            let mut j = i + 1;
            while j < placed.len() && placed[j].0 == file && placed[j].1 <= end.saturating_add(MERGE_GAP) {
                end = end.max(placed[j].1 + placed[j].2 as u64);
                j += 1;
            }
            let start = first / align * align;
            let wide_end = end.div_ceil(align) * align;
            let dst = buf_len;
            let len = (wide_end - start) as usize;
            reads.push(ReadOp { file, offset: start, len, min: (end - start) as usize, dst });
            for (_, offset, n, name, what) in &placed[i..j] {
                let at = dst + (offset - start) as usize;
                match what {
                    Piece::Tensor(t, fixup) => slots.push(Slot {
                        name: (*name).clone(),
                        dtype: t.dtype,
                        shape: t.shape.clone(),
                        at,
                        len: *n,
                        fixup: *fixup,
                        decode: None,
                    }),
                    Piece::Encoded(e, k) => {
                        let entry = encoded.entry(name).or_insert_with(|| (e, vec![(0, 0); e.pieces.len()]));
                        entry.1[*k] = (at, *n);
                    }
                }
            }
            buf_len += len;
            i = j;
        }
        // The decoded tensors after the reads, each 64-byte aligned.
        let mut decoded: Vec<_> = encoded.into_iter().collect();
        decoded.sort_by_key(|(name, _)| *name);
        for (name, (e, pieces)) in decoded {
            let t = &layer.tensors[name];
            let at = buf_len.next_multiple_of(64);
            slots.push(Slot {
                name: name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                at,
                len: e.len,
                fixup: None,
                decode: Some((e.clone(), pieces)),
            });
            buf_len = at + e.len;
        }
        layouts.push(Some(LayerLayout { reads, buf_len, slots }));
    }
    (files, layouts)
}

/// Part of a read: `dst.len()` bytes at `offset`, of which at least `min` must exist.
struct Chunk<'a> {
    file: &'a StorageFile,
    offset: u64,
    dst: &'a mut [u8],
    min: usize,
}

/// Reads layers from their files into buffers, counting every byte.
pub struct Reader {
    files: Vec<StorageFile>,
    layouts: Vec<Option<LayerLayout>>,
    /// Whether [`fix`](Self::fix) repacks the weights that have them into the CPU's
    /// 16-row panels, as the CPU backend's `weight` does with resident ones.
    repack: bool,
}

impl Reader {
    /// Opens the files the layers are stored in (`O_DIRECT` where possible, unless
    /// `buffered`) and plans each layer's reads. Bytes read are added to `counter`. With
    /// `repack`, the layers' weights that have 16-row panels on this CPU come out as
    /// panels.
    pub fn open(
        sources: &[LayerTensors],
        counter: &Arc<AtomicU64>,
        buffered: bool,
        repack: bool,
    ) -> io::Result<Reader> {
        let (paths, _) = plan_layers(sources, 1);
        let open = |p: &Arc<Path>| match buffered {
            true => StorageFile::open_buffered(p),
            false => StorageFile::open(p),
        };
        let files = paths.iter().map(open).collect::<io::Result<Vec<_>>>()?;
        let files: Vec<StorageFile> = files.into_iter().map(|f| f.with_counter(counter.clone())).collect();
        let align = files.iter().map(|f| f.alignment() as u64).fold(super::io::BUF_ALIGN as u64, u64::max);
        let (again, layouts) = plan_layers(sources, align);
        debug_assert_eq!(again, paths);
        Ok(Reader { files, layouts, repack })
    }

    pub fn n_layers(&self) -> usize {
        self.layouts.len()
    }

    /// How layer `i` is read, or `None` when it cannot be streamed.
    pub fn layout(&self, i: usize) -> Option<&LayerLayout> {
        self.layouts.get(i).and_then(Option::as_ref)
    }

    /// The files layers are read from.
    pub fn paths(&self) -> Vec<std::path::PathBuf> {
        self.files.iter().map(|f| f.path().to_path_buf()).collect()
    }

    /// Whether every file is read with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.files.iter().all(StorageFile::is_direct)
    }

    /// Reads layer `i` into `buf`; [`fix`](Self::fix) then makes it usable.
    pub fn read(&self, i: usize, buf: &mut AlignedBuf) -> Result<(), SchedError> {
        self.read_many(&mut [(i, buf)], IO_STREAMS)
    }

    /// Reads several units at once (a layer's routed experts), each into its buffer,
    /// with `streams` requests in flight: the chunks of every read are taken in turn, so
    /// one request is always queued at the device while another completes.
    pub fn read_many(&self, units: &mut [(usize, &mut AlignedBuf)], streams: usize) -> Result<(), SchedError> {
        let mut chunks: Vec<(usize, Chunk<'_>)> = Vec::new();
        for (i, buf) in units.iter_mut() {
            let i = *i;
            let layout = self.layout(i).ok_or(SchedError::NotStreamable(i))?;
            buf.resize_discarding(layout.buf_len);
            let mut rest = buf.as_mut_slice();
            let mut at = 0;
            for r in &layout.reads {
                let (_, tail) = rest.split_at_mut(r.dst - at);
                let (mut this, tail) = tail.split_at_mut(r.len);
                rest = tail;
                at = r.dst + r.len;
                let mut off = 0;
                while !this.is_empty() {
                    let n = this.len().min(IO_CHUNK);
                    let (head, tail) = this.split_at_mut(n);
                    let min = r.min.saturating_sub(off).min(n);
                    let c = Chunk { file: &self.files[r.file], offset: r.offset + off as u64, dst: head, min };
                    chunks.push((i, c));
                    this = tail;
                    off += n;
                }
            }
        }
        let queue = std::sync::Mutex::new(chunks.into_iter());
        let work = || -> Result<(), (usize, io::Error)> {
            loop {
                let Some((i, c)) = queue.lock().unwrap_or_else(|e| e.into_inner()).next() else { return Ok(()) };
                c.file.read_at_least(c.offset, c.dst, c.min).map_err(|e| (i, e))?;
            }
        };
        let result = std::thread::scope(|s| {
            let others: Vec<_> = (1..streams.max(1)).map(|_| s.spawn(work)).collect();
            let mine = work();
            others.into_iter().map(|h| h.join().expect("an I/O worker panicked")).fold(mine, Result::and)
        });
        result.map_err(|(i, e)| SchedError::Io { layer: i, msg: e.to_string() })
    }

    /// Applies the tensors' fixups to layer `i` as [`read`](Self::read) left it, and
    /// decodes its encoded tensors into their slots (done by the compute thread, so that
    /// the I/O thread goes straight on to the next read).
    pub fn fix(&self, i: usize, buf: &mut AlignedBuf) -> Result<(), SchedError> {
        let Some(layout) = self.layout(i) else { return Ok(()) };
        let bytes = buf.as_mut_slice();
        // Decoded slots lie after every read, so the pieces can be borrowed beside them.
        let read_end = layout.reads.iter().map(|r| r.dst + r.len).max().unwrap_or(0);
        let (stored, after) = bytes.split_at_mut(read_end);
        for s in &layout.slots {
            if let Some((e, pieces)) = &s.decode {
                let parts: Vec<&[u8]> = pieces.iter().map(|&(at, n)| &stored[at..at + n]).collect();
                (e.decode)(&parts, &mut after[s.at - read_end..s.at - read_end + s.len]).map_err(|m| {
                    SchedError::Io { layer: i, msg: format!("{}: tensor `{}` as read: {m}", e.path.display(), s.name) }
                })?;
            }
        }
        for s in &layout.slots {
            if let Some(fixup) = s.fixup {
                fixup.apply_in_place(&mut stored[s.at..s.at + s.len], s.shape.first().copied().unwrap_or(1));
            }
        }
        for s in layout.slots.iter().filter(|s| self.panels(s)) {
            strata_quant::panels::repack_in_place(s.dtype, &mut bytes[s.at..s.at + s.len], s.shape[0], s.shape[1]);
        }
        Ok(())
    }

    /// Whether slot `s` comes out as panels.
    fn panels(&self, s: &Slot) -> bool {
        self.repack && strata_quant::panels::eligible(s.dtype, &s.shape)
    }

    /// The tensors of layer `i` as views of `src`, which holds what [`read`](Self::read) put
    /// in a buffer.
    pub fn tensors(&self, i: usize, src: Arc<dyn ByteSource>) -> LayerTensors {
        let layout = self.layout(i).expect("only streamable layers are read");
        let tensors = layout
            .slots
            .iter()
            .map(|s| {
                let view = match self.panels(s) {
                    true => HostTensor::new_panels,
                    false => HostTensor::new,
                };
                (s.name.clone(), view(src.clone(), s.at, s.len, s.dtype, s.shape.clone()))
            })
            .collect();
        LayerTensors { index: i, tensors }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tensor::mapped::MappedFile;
    use strata_tensor::tensor::TensorOrigin;

    fn tensor_at(map: &Arc<MappedFile>, offset: usize, len: usize) -> HostTensor {
        HostTensor::new(map.clone(), offset, len, DType::F32, vec![len / 4])
    }

    #[test]
    fn adjacent_tensors_are_one_aligned_read_and_far_ones_two() {
        let dir = std::env::temp_dir().join(format!("strata-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.bin");
        let size = 2 * MERGE_GAP as usize + 3 * 4096;
        std::fs::write(&path, (0..size).map(|i| (i % 251) as u8).collect::<Vec<_>>()).unwrap();
        let map = Arc::new(MappedFile::map(&std::fs::File::open(&path).unwrap(), &path).unwrap());
        let far = size - 400;
        let tensors = [
            ("a".to_string(), tensor_at(&map, 100, 40)),
            ("b".to_string(), tensor_at(&map, 140, 4000)),
            ("c".to_string(), tensor_at(&map, far, 200)),
        ];
        let layer = LayerTensors { index: 0, tensors: tensors.into_iter().collect() };
        assert_eq!(
            layer.tensors["c"].origin(),
            Some(&TensorOrigin { path: Arc::from(path.as_path()), offset: far as u64, fixup: None })
        );
        let (files, layouts) = plan_layers(std::slice::from_ref(&layer), 4096);
        assert_eq!(files.len(), 1);
        let l = layouts[0].as_ref().unwrap();
        let far_start = far as u64 / 4096 * 4096;
        assert_eq!(
            l.reads,
            vec![
                ReadOp { file: 0, offset: 0, len: 8192, min: 4140, dst: 0 },
                ReadOp { file: 0, offset: far_start, len: 4096, min: size - far_start as usize - 200, dst: 8192 },
            ]
        );

        let counter = Arc::new(AtomicU64::new(0));
        let reader = Reader::open(std::slice::from_ref(&layer), &counter, false, false).unwrap();
        let mut buf = AlignedBuf::new();
        reader.read(0, &mut buf).unwrap();
        reader.fix(0, &mut buf).unwrap();
        assert!(counter.load(std::sync::atomic::Ordering::Relaxed) >= 8192 + 400);
        let read = reader.tensors(0, Arc::new(buf));
        for name in ["a", "b", "c"] {
            assert_eq!(read.tensors[name].bytes(), layer.tensors[name].bytes(), "{name}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_tensor_without_a_file_makes_its_layer_resident() {
        let t = HostTensor::from_f32(&[1.0, 2.0], vec![2]);
        let layer = LayerTensors { index: 0, tensors: [("x".to_string(), t)].into_iter().collect() };
        let (files, layouts) = plan_layers(&[layer], 4096);
        assert!(files.is_empty() && layouts[0].is_none());
    }
}
