//! Hugging Face safetensors: `u64` little-endian header length, a JSON header
//! `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`, then the
//! data. Files are memory-mapped; tensors are zero-copy views into the map.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::FormatError;
use strata_tensor::tensor::{ByteSource, DType, Encoded, HostTensor, LazyBytes};

/// Headers larger than this are refused before anything is allocated.
const MAX_HEADER_BYTES: u64 = 100 << 20;

#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

/// Memory-maps one `.safetensors` file and returns its tensors by name.
pub fn load_file(path: &Path) -> Result<HashMap<String, HostTensor>, FormatError> {
    let io = |source| FormatError::Io { path: path.to_owned(), source };
    let file = File::open(path).map_err(io)?;
    let map = strata_tensor::mapped::MappedFile::map(&file, path).map_err(io)?;
    parse(Arc::new(map), path)
}

/// Parses safetensors bytes held by `src`; `path` is only used in error messages.
pub fn parse(src: Arc<dyn ByteSource>, path: &Path) -> Result<HashMap<String, HostTensor>, FormatError> {
    let bytes = src.bytes();
    let corrupt = |offset: u64, msg: String| FormatError::Corrupt { path: path.to_owned(), offset, msg };
    let file_len = bytes.len() as u64;
    if file_len < 8 {
        return Err(corrupt(0, format!("file is {file_len} bytes, too short for a safetensors header")));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
        return Err(corrupt(0, format!("header length {header_len} does not fit in a {file_len}-byte file")));
    }
    let data_start = 8 + header_len;
    let header: HashMap<String, serde_json::Value> = serde_json::from_slice(&bytes[8..data_start as usize])
        .map_err(|e| corrupt(8, format!("header is not valid JSON: {e}")))?;
    let mut out = HashMap::with_capacity(header.len());
    // MXFP4 as OpenAI stores it: `X_blocks` and `X_scales`, U8, paired below.
    let mut raw: HashMap<String, (u64, u64, Vec<usize>)> = HashMap::new();
    for (name, value) in header {
        if name == "__metadata__" {
            continue;
        }
        let entry: Entry = serde_json::from_value(value)
            .map_err(|e| corrupt(8, format!("tensor `{name}` has a malformed entry: {e}")))?;
        let dtype = match entry.dtype.as_str() {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "U8" if name.ends_with("_blocks") || name.ends_with("_scales") => {
                let [begin, end] = entry.data_offsets;
                let numel: Option<u64> = entry.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
                let (abs_begin, abs_end) = (data_start.saturating_add(begin), data_start.saturating_add(end));
                if begin > end || abs_end > file_len || numel != Some(end - begin) {
                    return Err(corrupt(abs_begin, format!("tensor `{name}` (U8 {:?}) does not fit", entry.shape)));
                }
                raw.insert(name, (abs_begin, end - begin, entry.shape));
                continue;
            }
            other => {
                return Err(FormatError::Invalid {
                    path: path.to_owned(),
                    msg: format!(
                        "tensor `{name}` has dtype {other}; supported: F32, F16, BF16 (and U8 MXFP4 `_blocks` and \
                         `_scales`)"
                    ),
                });
            }
        };
        let [begin, end] = entry.data_offsets;
        let numel = entry.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        let want = numel.and_then(|n| dtype.bytes_for(usize::try_from(n).ok()?)).map(|b| b as u64);
        let (abs_begin, abs_end) = (data_start.saturating_add(begin), data_start.saturating_add(end));
        if begin > end || abs_end > file_len || want != Some(end - begin) {
            return Err(corrupt(
                abs_begin,
                format!(
                    "tensor `{name}` ({} {:?}) claims bytes {begin}..{end} of the data section, \
                     which does not match its shape or lies past the end of the file",
                    entry.dtype, entry.shape
                ),
            ));
        }
        let t = HostTensor::new(src.clone(), abs_begin as usize, (end - begin) as usize, dtype, entry.shape);
        out.insert(name, t);
    }
    for (name, t) in mxfp4_pairs(&src, path, raw)? {
        out.insert(name, t);
    }
    Ok(out)
}

/// OpenAI's MXFP4 tensors (`X_blocks` `[..., groups, 16]`, `X_scales` `[..., groups]`,
/// both U8: 32 FP4 values a group, byte `i` holding values `2i` and `2i + 1`, and the
/// group's E8M0 scale) as one GGML MXFP4 tensor `X` `[..., groups · 32]`, decoded from the
/// two ranges of the file on first use (the file keeps them apart; GGML keeps each
/// group's scale before its values).
fn mxfp4_pairs(
    src: &Arc<dyn ByteSource>,
    path: &Path,
    mut raw: HashMap<String, (u64, u64, Vec<usize>)>,
) -> Result<Vec<(String, HostTensor)>, FormatError> {
    let invalid = |msg: String| FormatError::Invalid { path: path.to_owned(), msg };
    let mut names: Vec<String> = raw.keys().filter(|n| n.ends_with("_blocks")).cloned().collect();
    names.sort();
    let mut out = Vec::new();
    for blocks_name in names {
        let stem = blocks_name.trim_end_matches("_blocks").to_string();
        let (b_at, b_len, b_shape) = raw.remove(&blocks_name).expect("listed");
        let Some((s_at, s_len, s_shape)) = raw.remove(&format!("{stem}_scales")) else {
            return Err(invalid(format!("tensor `{blocks_name}` has no `{stem}_scales` in the same file")));
        };
        let groups = b_len / 16;
        if b_shape.last() != Some(&16) || s_shape[..] != b_shape[..b_shape.len() - 1] || s_len != groups as u64 {
            return Err(invalid(format!(
                "`{blocks_name}` {b_shape:?} and `{stem}_scales` {s_shape:?} are not MXFP4 blocks ([..., G, 16]) and \
                 their scales ([..., G])"
            )));
        }
        let mut shape = s_shape.clone();
        let g = shape.pop().unwrap_or(0);
        shape.push(g * 32);
        let len = groups as usize * 17;
        let decode = move |pieces: &[&[u8]], out: &mut [u8]| -> Result<(), String> {
            let [blocks, scales] = pieces else { return Err("two pieces expected".into()) };
            for ((o, b), &s) in out.chunks_exact_mut(17).zip(blocks.chunks_exact(16)).zip(scales.iter()) {
                let block = strata_quant::mxfp4::from_openai(b.try_into().expect("16 bytes"), s);
                o[0] = block.e;
                o[1..].copy_from_slice(&block.qs);
            }
            Ok(())
        };
        let encoded = Encoded {
            path: Arc::from(path),
            pieces: vec![(b_at, b_len as usize), (s_at, s_len as usize)],
            len,
            decode: Box::new(decode),
        };
        let lazy = LazyBytes::encoded(encoded, src.clone(), 0);
        out.push((stem, HostTensor::lazy(Arc::new(lazy), DType::Mxfp4, shape)));
    }
    if let Some(name) = raw.keys().next() {
        return Err(invalid(format!("tensor `{name}` (U8) has no `_blocks` to go with")));
    }
    Ok(out)
}

#[derive(Deserialize)]
struct Index {
    weight_map: HashMap<String, String>,
}

/// Loads every tensor of a Hugging Face model directory: `model.safetensors`, or the
/// shards named by `model.safetensors.index.json`.
pub fn load_dir(dir: &Path) -> Result<HashMap<String, HostTensor>, FormatError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return load_file(&single);
    }
    let index_path = dir.join("model.safetensors.index.json");
    let text =
        std::fs::read_to_string(&index_path).map_err(|source| FormatError::Io { path: index_path.clone(), source })?;
    let index: Index = serde_json::from_str(&text)
        .map_err(|e| FormatError::Invalid { path: index_path.clone(), msg: format!("not a safetensors index: {e}") })?;
    let mut shards: Vec<&String> = index.weight_map.values().collect();
    shards.sort();
    shards.dedup();
    let mut out = HashMap::new();
    for shard in shards {
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(FormatError::Invalid {
                path: index_path,
                msg: format!("shard name `{shard}` is not a plain file name"),
            });
        }
        let shard_path: PathBuf = dir.join(shard);
        out.extend(load_file(&shard_path)?);
    }
    for name in index.weight_map.keys() {
        if !out.contains_key(name) {
            return Err(FormatError::Invalid {
                path: index_path,
                msg: format!("tensor `{name}` is listed in the index but missing from its shard"),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tensor::tensor::AlignedBytes;

    fn file(header: &str, data: &[u8]) -> Arc<dyn ByteSource> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        Arc::new(AlignedBytes::from_slice(&v))
    }

    #[test]
    fn parses_a_tensor() {
        let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let src = file(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#, &data);
        let t = parse(src, Path::new("x")).unwrap();
        assert_eq!(t["a"].as_f32(), &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn rejects_hostile_headers() {
        let cases = [
            (file(r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#, &[0; 12]), "does not match"),
            (file(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,1200]}}"#, &[0; 12]), "past the end"),
            (file(r#"{"a":{"dtype":"I64","shape":[3],"data_offsets":[0,24]}}"#, &[0; 24]), "dtype I64"),
            (file(r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,12]}}"#, &[0; 12]), "shape"),
            (
                file(
                    r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}}"#,
                    &[],
                ),
                "past the end",
            ),
            (file("not json", &[]), "JSON"),
        ];
        for (src, want) in cases {
            let err = parse(src, Path::new("m.safetensors")).unwrap_err().to_string();
            assert!(err.contains(want) && err.contains("m.safetensors"), "{err}");
        }
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        let err = parse(Arc::new(AlignedBytes::from_slice(&huge)), Path::new("m")).unwrap_err();
        assert!(err.to_string().contains("header length"));
    }
}
