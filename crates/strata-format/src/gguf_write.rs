//! Writing GGUF version 3, the layout `gguf.rs` reads (for `strata export`).
//!
//! The header, metadata and tensor table come first and need every tensor's name, shape
//! and type, not its bytes: [`write`] takes the table up front, then asks for each
//! tensor's bytes in order, so a model larger than RAM is written one tensor at a time.
//! The file is written under a temporary name and renamed at the end: an interrupted
//! export leaves nothing that looks like a model.

use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::path::Path;

use anyhow::{Context, bail};

use super::gguf::GgufValue;
use strata_tensor::tensor::DType;

/// Tensor data starts at, and each tensor's offset is, a multiple of this (GGUF's
/// default `general.alignment`).
pub const ALIGNMENT: u64 = 32;

/// One tensor of the table: its name, its shape outermost first (as Strata and
/// PyTorch give it; GGUF stores the reverse) and its stored type.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl TensorEntry {
    /// Bytes of its data.
    pub fn bytes(&self) -> anyhow::Result<usize> {
        let (&cols, n) = (self.shape.last().unwrap_or(&1), self.shape.iter().product::<usize>());
        let row = self.dtype.bytes_for(cols).with_context(|| {
            format!("tensor `{}`: {} columns are not whole {} blocks", self.name, cols, self.dtype.name())
        })?;
        Ok(row * (n / cols.max(1)))
    }
}

/// The GGML type id of a dtype llama.cpp reads as a weight (the inverse of
/// [`dtype_from_ggml`](super::gguf::dtype_from_ggml)), or `None`: Strata's own
/// `affine_q4` and `i8`, and the activation formats Q8_1 and Q8_K.
pub fn ggml_type(d: DType) -> Option<u32> {
    if matches!(d, DType::Q8_1 | DType::Q8_K) {
        return None;
    }
    (0..64).find(|&id| super::gguf::dtype_from_ggml(id) == Some(d))
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

/// A value's bytes after its type id. An array's elements must share one type.
fn value(out: &mut Vec<u8>, key: &str, v: &GgufValue) -> anyhow::Result<()> {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => string(out, s),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Array(items) => {
            let ty = items.first().map_or(4, type_id);
            if items.iter().any(|i| type_id(i) != ty) {
                bail!("metadata `{key}`: an array of mixed types");
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                value(out, key, i)?;
            }
        }
    }
    Ok(())
}

/// A GGUF of `metadata` and no tensors, in memory (to read back what an export would
/// write before writing it).
pub fn encode_metadata(metadata: &[(String, GgufValue)]) -> anyhow::Result<Vec<u8>> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut out, k);
        out.extend_from_slice(&type_id(v).to_le_bytes());
        value(&mut out, k, v)?;
    }
    out.resize((out.len() as u64).next_multiple_of(ALIGNMENT) as usize, 0);
    Ok(out)
}

/// Writes `path`: `metadata` in order, then the `tensors` table, then each tensor's
/// bytes as `data(i)` gives them (exactly [`TensorEntry::bytes`] of them), in table
/// order, under a temporary name ([`temp::sibling`](super::temp::sibling)) that `check`
/// reads before it becomes `path`: `path` appears only written in full and checked, and
/// is never overwritten. Returns the file's size.
pub fn write(
    path: &Path,
    metadata: &[(String, GgufValue)],
    tensors: &[TensorEntry],
    mut data: impl FnMut(usize) -> anyhow::Result<Vec<u8>>,
    check: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut head = b"GGUF".to_vec();
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut head, k);
        head.extend_from_slice(&type_id(v).to_le_bytes());
        value(&mut head, k, v)?;
    }
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut at = 0u64;
    for t in tensors {
        let ty = ggml_type(t.dtype)
            .with_context(|| format!("tensor `{}`: llama.cpp does not read {} weights", t.name, t.dtype.name()))?;
        string(&mut head, &t.name);
        head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            head.extend_from_slice(&(d as u64).to_le_bytes());
        }
        head.extend_from_slice(&ty.to_le_bytes());
        head.extend_from_slice(&at.to_le_bytes());
        offsets.push(at);
        at = (at + t.bytes()? as u64).next_multiple_of(ALIGNMENT);
    }
    head.resize((head.len() as u64).next_multiple_of(ALIGNMENT) as usize, 0);

    super::temp::remove_stale(path)?;
    let tmp = super::temp::sibling(path)?;
    let result = (|| -> anyhow::Result<u64> {
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        out.write_all(&head)?;
        let start = head.len() as u64;
        for (i, t) in tensors.iter().enumerate() {
            let bytes = data(i)?;
            let want = t.bytes()?;
            if bytes.len() != want {
                bail!("tensor `{}`: {} bytes of data, the table says {want}", t.name, bytes.len());
            }
            let pad = start + offsets[i] - out.stream_position()?;
            out.write_all(&vec![0u8; pad as usize])?;
            out.write_all(&bytes)?;
        }
        let end = out.stream_position()?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(end)
    })()
    .with_context(|| format!("writing {}", tmp.display()))
    .and_then(|size| {
        check(&tmp)?;
        if path.symlink_metadata().is_ok() {
            bail!("{}: appeared while writing; not overwriting it", path.display());
        }
        Ok(size)
    });
    match result {
        Ok(size) => {
            std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
            Ok(size)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use strata_quant::ReadF32;

    /// What `write` writes, `GgufFile` reads back: every value type, arrays, shapes in
    /// GGUF's order, block tensors, offsets on the alignment.
    #[test]
    fn written_files_read_back() {
        let dir = std::env::temp_dir().join(format!("strata-gguf-write-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        let meta = vec![
            ("general.architecture".to_string(), GgufValue::String("llama".into())),
            ("u32".into(), GgufValue::U32(7)),
            ("f32".into(), GgufValue::F32(0.5)),
            ("b".into(), GgufValue::Bool(true)),
            ("i32s".into(), GgufValue::Array(vec![GgufValue::I32(-1), GgufValue::I32(2)])),
            ("strs".into(), GgufValue::Array(vec![GgufValue::String("a".into()), GgufValue::String("bc".into())])),
        ];
        let tensors = vec![
            TensorEntry { name: "w".into(), shape: vec![3, 2], dtype: DType::F32 },
            TensorEntry { name: "q".into(), shape: vec![1, 32], dtype: DType::Q8_0 },
        ];
        let w: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let q = vec![0x11u8; 34];
        let size =
            write(&path, &meta, &tensors, |i| Ok(if i == 0 { w.clone() } else { q.clone() }), |_| Ok(())).unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.get_str("general.architecture"), Some("llama"));
        assert_eq!(f.get_u64("u32"), Some(7));
        assert_eq!(f.get_f32("f32"), Some(0.5));
        assert_eq!(f.get_bool("b"), Some(true));
        assert_eq!(f.get_array("i32s").unwrap().len(), 2);
        assert_eq!(f.get_array("strs").unwrap()[1].as_str(), Some("bc"));
        let t = f.tensor("w").unwrap();
        assert_eq!((t.shape.clone(), t.to_f32_vec()), (vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let t = f.tensor("q").unwrap();
        assert_eq!((t.shape.clone(), t.dtype, t.bytes()), (vec![1, 32], DType::Q8_0, &q[..]));
        // Wrong data length: nothing is left behind.
        let bad = dir.join("bad.gguf");
        let err = write(&bad, &meta, &tensors, |_| Ok(vec![0u8; 3]), |_| Ok(())).unwrap_err();
        assert!(format!("{err:#}").contains("3 bytes of data"), "{err:#}");
        assert!(!bad.exists() && std::fs::read_dir(&dir).unwrap().count() == 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// MXFP4 is GGML type 39 both ways: 17-byte blocks whose tensors end off the
    /// alignment (51 bytes here), the next one placed after padding.
    #[test]
    fn mxfp4_tensors_write_as_type_39_and_read_back() {
        assert_eq!(ggml_type(DType::Mxfp4), Some(39));
        let dir = std::env::temp_dir().join(format!("strata-gguf-mxfp4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        let meta = vec![("general.architecture".to_string(), GgufValue::String("llama".into()))];
        let tensors = vec![
            TensorEntry { name: "e".into(), shape: vec![3, 32], dtype: DType::Mxfp4 },
            TensorEntry { name: "w".into(), shape: vec![2], dtype: DType::F32 },
        ];
        // Block r: exponent 127 + r, nibble j = j in both halves of every byte.
        let e: Vec<u8> = (0..3u8).flat_map(|r| std::iter::once(127 + r).chain((0..16).map(|j| j | (j << 4)))).collect();
        let w: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        write(&path, &meta, &tensors, |i| Ok(if i == 0 { e.clone() } else { w.clone() }), |_| Ok(())).unwrap();
        let raw = std::fs::read(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.infos[0].ggml_type, 39);
        let t = f.tensor("e").unwrap();
        assert_eq!((t.shape.clone(), t.dtype, t.bytes()), (vec![3, 32], DType::Mxfp4, &e[..]));
        let vals = t.to_f32_vec();
        let k = strata_quant::mxfp4::KVALUES;
        for r in 0..3 {
            for j in 0..32 {
                assert_eq!(vals[r * 32 + j], k[j % 16] as f32 * 2f32.powi(r as i32 - 1), "block {r} value {j}");
            }
        }
        assert_eq!(f.tensor("w").unwrap().to_f32_vec(), [1.5, -2.0]);
        assert!(raw.len() as u64 >= f.data_start + 64 + 8);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
