//! A GGUF file as values, for tests that rewrite fixtures (bad metadata, mutated tensor
//! tables): read one, change its metadata or tensor infos, write it back.

use std::path::Path;
use std::sync::Arc;

use strata::format::gguf::{GgufFile, GgufValue, TensorInfo};
use strata::tensor::{AlignedBytes, ByteSource};

/// A GGUF file as values, to mutate the metadata and tensor table and write it back.
pub struct GgufParts {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, GgufValue)>,
    pub infos: Vec<TensorInfo>,
    pub data: Vec<u8>,
}

impl GgufParts {
    /// `general.architecture`, if the file names one.
    pub fn arch(&self) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == "general.architecture").and_then(|(_, v)| v.as_str())
    }

    /// Sets metadata `key` to `value`, adding the key if the file lacks it.
    pub fn set_meta(&mut self, key: String, value: GgufValue) {
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// A fixture, by its path under the repository root.
    pub fn read(rel: &str) -> GgufParts {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let src: Arc<dyn ByteSource> = Arc::new(AlignedBytes::from_slice(&bytes));
        let f = GgufFile::parse(src, Path::new(rel)).expect("fixture parses");
        GgufParts {
            version: f.version,
            alignment: f.alignment,
            metadata: f.metadata.clone().into_iter().collect(),
            infos: f.infos.clone(),
            data: bytes[f.data_start as usize..].to_vec(),
        }
    }

    /// The GGUF encoding (the data section as read, so mutated tensor infos point at
    /// the original bytes).
    pub fn write(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.infos.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend(value_type(value).to_le_bytes());
            put_value(&mut out, value);
        }
        for t in &self.infos {
            put_string(&mut out, &t.name);
            out.extend((t.ne.len() as u32).to_le_bytes());
            t.ne.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(t.offset.to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(self.alignment as usize), 0);
        out.extend(&self.data);
        out
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn value_type(v: &GgufValue) -> u32 {
    use GgufValue::*;
    match v {
        U8(_) => 0,
        I8(_) => 1,
        U16(_) => 2,
        I16(_) => 3,
        U32(_) => 4,
        I32(_) => 5,
        F32(_) => 6,
        Bool(_) => 7,
        String(_) => 8,
        Array(_) => 9,
        U64(_) => 10,
        I64(_) => 11,
        F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    use GgufValue::*;
    match v {
        U8(x) => out.push(*x),
        I8(x) => out.extend(x.to_le_bytes()),
        U16(x) => out.extend(x.to_le_bytes()),
        I16(x) => out.extend(x.to_le_bytes()),
        U32(x) => out.extend(x.to_le_bytes()),
        I32(x) => out.extend(x.to_le_bytes()),
        F32(x) => out.extend(x.to_le_bytes()),
        Bool(x) => out.push(u8::from(*x)),
        String(s) => put_string(out, s),
        Array(items) => {
            // Arrays are homogeneous; an empty one is written as u8.
            out.extend(items.first().map_or(0, value_type).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        U64(x) => out.extend(x.to_le_bytes()),
        I64(x) => out.extend(x.to_le_bytes()),
        F64(x) => out.extend(x.to_le_bytes()),
    }
}
