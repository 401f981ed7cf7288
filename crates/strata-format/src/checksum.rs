//! XXH3-64 checksums, as the `.cawsf` `checksum_index` and the flat manifest record them:
//! lowercase hex of the 64-bit hash (16 digits).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::FormatError;
use strata_tensor::tensor::ByteSource;

/// The XXH3-64 of `bytes` (seed 0) as 16 lowercase hex digits.
pub fn hex(bytes: &[u8]) -> String {
    format!("{:016x}", xxh3_64(bytes))
}

/// A streaming XXH3-64, for data written or read in pieces.
#[derive(Default, Clone)]
pub struct Hasher(Xxh3);

impl Hasher {
    pub fn new() -> Self {
        Hasher(Xxh3::new())
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    /// The hash so far as 16 lowercase hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0.digest())
    }
}

/// `len` bytes at `offset` of a stored file and the XXH3-64 (hex) its index records for
/// them.
#[derive(Clone, Debug)]
pub struct Piece {
    pub offset: u64,
    pub len: u64,
    pub xxh3: String,
}

/// One file of a model whose stored checksums [`StoredSums`] checks.
pub struct SummedFile {
    pub path: PathBuf,
    pub bytes: Arc<dyn ByteSource>,
    /// What records the checksums, for messages: `manifest.json`, `META`.
    pub index: &'static str,
}

/// The checksums a flat directory or `.cawsf` file records for each tensor's stored
/// bytes (a flat tensor, a `.cawsf` tensor's shards), kept by the reader at no cost so
/// that whoever reads a tensor in full (`convert`, `export`) checks it for the price of
/// a hash of bytes it reads anyway. Opening a model checks none of them.
#[derive(Default)]
pub struct StoredSums {
    files: Vec<SummedFile>,
    /// Tensor name → (index into `files`, piece) for each piece of it.
    tensors: HashMap<String, Vec<(usize, Piece)>>,
}

impl StoredSums {
    /// Adds `file`; returns its index for [`StoredSums::add`].
    pub fn add_file(&mut self, file: SummedFile) -> usize {
        self.files.push(file);
        self.files.len() - 1
    }

    /// Records that `piece` of file `file` belongs to tensor `name`.
    pub fn add(&mut self, name: &str, file: usize, piece: Piece) {
        self.tensors.entry(name.to_owned()).or_default().push((file, piece));
    }

    /// Hashes tensor `name`'s stored pieces and compares each with its recorded
    /// checksum: the first mismatch is an error naming the file, the offset and the
    /// tensor. A tensor without recorded pieces passes.
    pub fn check(&self, name: &str) -> Result<(), FormatError> {
        for (file, p) in self.tensors.get(name).map_or(&[][..], Vec::as_slice) {
            let f = &self.files[*file];
            let range = usize::try_from(p.offset).ok().zip(usize::try_from(p.offset + p.len).ok());
            let Some(bytes) = range.and_then(|(a, b)| f.bytes.bytes().get(a..b)) else {
                let msg = format!("tensor `{name}`: {} bytes at {} lie outside the file", p.len, p.offset);
                return Err(FormatError::Corrupt { path: f.path.clone(), offset: p.offset, msg });
            };
            let got = hex(bytes);
            if got != p.xxh3 {
                let (start, end) = (p.offset, p.offset + p.len);
                let msg = format!(
                    "checksum mismatch in tensor `{name}` (bytes {start}..{end}): xxh3 {got}, {} says {}",
                    f.index, p.xxh3
                );
                return Err(FormatError::Corrupt { path: f.path.clone(), offset: p.offset, msg });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_equals_one_shot_and_matches_the_reference_value() {
        // XXH3-64 of the empty input with seed 0 (the xxHash reference value).
        assert_eq!(hex(b""), "2d06800538d394c2");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut h = Hasher::new();
        for chunk in data.chunks(333) {
            h.update(chunk);
        }
        assert_eq!(h.hex(), hex(&data));
    }

    #[test]
    fn stored_sums_name_the_file_offset_and_tensor_of_a_mismatch() {
        let data: Vec<u8> = (0..64u8).collect();
        let mut sums = StoredSums::default();
        let bytes = Arc::new(strata_tensor::tensor::AlignedBytes::from_slice(&data));
        let f = sums.add_file(SummedFile { path: "m/layer_000.bin".into(), bytes, index: "manifest.json" });
        sums.add("a", f, Piece { offset: 0, len: 32, xxh3: hex(&data[..32]) });
        sums.add("b", f, Piece { offset: 32, len: 32, xxh3: hex(&data[..32]) });
        sums.add("c", f, Piece { offset: 60, len: 8, xxh3: hex(&data[60..]) });
        assert!(sums.check("a").is_ok());
        assert!(sums.check("unrecorded").is_ok());
        let e = sums.check("b").unwrap_err().to_string();
        assert!(e.starts_with("m/layer_000.bin: at byte 32: checksum mismatch in tensor `b`"), "{e}");
        assert!(sums.check("c").unwrap_err().to_string().contains("outside the file"));
    }
}
