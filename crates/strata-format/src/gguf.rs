//! GGUF (llama.cpp's single-file format), versions 2 and 3:
//!
//! ```text
//! "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//! kv_count × { string key | u32 value_type | value }
//! tensor_count × { string name | u32 n_dims | n_dims × u64 ne | u32 ggml_type | u64 offset }
//! padding to `general.alignment` (default 32)
//! tensor data (each tensor at data_start + offset, offset a multiple of the alignment)
//! ```
//!
//! Strings are `u64 length | bytes` (UTF-8); arrays are `u32 element_type | u64 length |
//! elements`. Everything is little-endian. `ne[0]` is the row length, so a tensor with
//! `ne = [cols, rows]` becomes a row-major [`HostTensor`] of shape `[rows, cols]`.
//!
//! Every count, length, dimension and offset is checked against a cap and against the
//! bytes that remain before anything is allocated, and every table against what a file
//! of this size may allocate ([`TableBudget`]); errors name the byte offset.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::FormatError;
use super::table_budget::{MAP_ENTRY_OVERHEAD, TableBudget};
use strata_tensor::tensor::{ByteSource, DType, HostTensor};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest string accepted (keys, tensor names, chat templates, tokens).
const MAX_STRING_BYTES: u64 = 64 << 20;
/// Longest tensor name accepted (ggml's own limit is 64 bytes).
const MAX_TENSOR_NAME_BYTES: u64 = 1024;
const MAX_TENSORS: u64 = 1 << 20;
const MAX_KV: u64 = 1 << 20;
/// ggml tensors have at most 4 dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays nest at most this deep.
const MAX_ARRAY_DEPTH: usize = 8;
/// Metadata values (array elements included) in one file; a 256k-token vocabulary with
/// merges and token types is about 800k.
const MAX_METADATA_VALUES: u64 = 1 << 22;
const MAX_ALIGNMENT: u64 = 1 << 20;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        use GgufValue::*;
        match *self {
            U8(v) => Some(v.into()),
            U16(v) => Some(v.into()),
            U32(v) => Some(v.into()),
            U64(v) => Some(v),
            I8(v) => u64::try_from(v).ok(),
            I16(v) => u64::try_from(v).ok(),
            I32(v) => u64::try_from(v).ok(),
            I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        use GgufValue::*;
        match *self {
            I8(v) => Some(v.into()),
            I16(v) => Some(v.into()),
            I32(v) => Some(v.into()),
            I64(v) => Some(v),
            U8(v) => Some(v.into()),
            U16(v) => Some(v.into()),
            U32(v) => Some(v.into()),
            U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Either float type (integers are not floats here: a wrong type is an error upstream).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// GGUF's name for the value type (`u32`, `string`, `array`, ...).
    pub fn type_name(&self) -> &'static str {
        use GgufValue::*;
        match self {
            U8(_) => "u8",
            I8(_) => "i8",
            U16(_) => "u16",
            I16(_) => "i16",
            U32(_) => "u32",
            I32(_) => "i32",
            F32(_) => "f32",
            Bool(_) => "bool",
            String(_) => "string",
            Array(_) => "array",
            U64(_) => "u64",
            I64(_) => "i64",
            F64(_) => "f64",
        }
    }
}

/// Where one tensor lives, as stored in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// GGML dimensions: `ne[0]` is the row length.
    pub ne: Vec<u64>,
    /// GGML type id as stored (0 = F32, 1 = F16, 8 = Q8_0, ...).
    pub ggml_type: u32,
    pub dtype: DType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Row-major shape (GGML `ne` reversed).
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file; tensors are zero-copy views into the memory map.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    /// Absolute byte offset of the tensor data section.
    pub data_start: u64,
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor infos in file order.
    pub infos: Vec<TensorInfo>,
    pub tensors: BTreeMap<String, HostTensor>,
}

/// GGML type id → dtype, for the types Strata can hold.
pub fn dtype_from_ggml(id: u32) -> Option<DType> {
    Some(match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        9 => DType::Q8_1,
        12 => DType::Q4_K,
        13 => DType::Q5_K,
        14 => DType::Q6_K,
        15 => DType::Q8_K,
        30 => DType::BF16,
        39 => DType::Mxfp4,
        _ => return None,
    })
}

/// Names of GGML types Strata does not read, for error messages.
fn ggml_type_name(id: u32) -> &'static str {
    match id {
        4 => "Q4_2 (removed)",
        5 => "Q4_3 (removed)",
        10 => "Q2_K",
        11 => "Q3_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        _ => "unknown",
    }
}

impl GgufFile {
    /// Memory-maps and parses a `.gguf` file.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let io = |source| FormatError::Io { path: path.to_owned(), source };
        let file = File::open(path).map_err(io)?;
        let map = strata_tensor::mapped::MappedFile::map(&file, path).map_err(io)?;
        Self::parse(Arc::new(map), path)
    }

    /// Parses GGUF bytes held by `src`; `path` is only used in error messages.
    pub fn parse(src: Arc<dyn ByteSource>, path: &Path) -> Result<Self, FormatError> {
        let budget = TableBudget::for_file(src.bytes().len() as u64);
        let mut r = Reader { bytes: src.bytes(), pos: 0, path, values_left: MAX_METADATA_VALUES, budget };
        let magic = r.take(4, "the magic")?;
        if magic != MAGIC {
            return Err(r.corrupt_at(0, format!("magic is {magic:02x?}, not \"GGUF\"")));
        }
        let version = r.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(
                    r.corrupt_at(4, "GGUF version 1 (32-bit counts) is not supported; re-convert the model".into())
                );
            }
            v if v.swap_bytes() <= 3 => {
                return Err(r.corrupt_at(4, format!("GGUF version {} is big-endian, not supported", v.swap_bytes())));
            }
            v => return Err(r.corrupt_at(4, format!("unsupported GGUF version {v} (supported: 2, 3)"))),
        }
        let n_tensors = r.count("tensor count", MAX_TENSORS, 32)?;
        r.charge(8, "the tensor table", n_tensors, TENSOR_FOOTPRINT)?;
        let n_kv = r.count("metadata count", MAX_KV, 13)?;
        r.charge(16, "the metadata table", n_kv, KV_BYTES)?;

        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let at = r.pos as u64;
            let key = r.string(MAX_STRING_BYTES, "a metadata key")?;
            let ty_at = r.pos as u64;
            let ty = r.u32("a value type")?;
            let value = r.value(ty, ty_at, 0).map_err(|e| e.with_context(&format!("metadata `{key}`")))?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(r.corrupt_at(at, format!("metadata key `{key}` appears twice")));
            }
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
                _ => {
                    return Err(FormatError::Invalid {
                        path: path.to_owned(),
                        msg: format!("general.alignment is {v:?}; it must be a power of two up to {MAX_ALIGNMENT}"),
                    });
                }
            },
        };

        let mut infos = Vec::with_capacity(n_tensors as usize);
        let mut info_at = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let at = r.pos as u64;
            info_at.push(at);
            infos.push(r.tensor_info()?);
        }
        let data_start = (r.pos as u64).next_multiple_of(alignment);
        let file_len = r.bytes.len() as u64;
        if n_tensors > 0 && data_start > file_len {
            return Err(r.corrupt_at(
                r.pos as u64,
                format!("data section at byte {data_start} starts past the end of the file"),
            ));
        }

        let mut tensors = BTreeMap::new();
        for (info, &at) in infos.iter().zip(&info_at) {
            let name = &info.name;
            if !info.offset.is_multiple_of(alignment) {
                return Err(r.corrupt_at(
                    at,
                    format!(
                        "tensor `{name}`: data offset {} is not a multiple of the alignment {alignment}",
                        info.offset
                    ),
                ));
            }
            let numel = info.ne.iter().product::<u64>(); // checked in `tensor_info`
            let len = info.dtype.bytes_for(numel as usize).map(|b| b as u64);
            let begin = data_start.checked_add(info.offset);
            let end = begin.zip(len).and_then(|(b, l)| b.checked_add(l));
            let (Some(begin), Some(len), Some(end)) = (begin, len, end) else {
                return Err(r.corrupt_at(at, format!("tensor `{name}`: size overflows")));
            };
            if end > file_len {
                return Err(r.corrupt_at(
                    at,
                    format!(
                        "tensor `{name}` ({} {:?}) needs bytes {begin}..{end}, past the end of the {file_len}-byte file",
                        info.dtype.name(),
                        info.ne
                    ),
                ));
            }
            let t = HostTensor::new(src.clone(), begin as usize, len as usize, info.dtype, info.shape());
            if tensors.insert(name.clone(), t).is_some() {
                return Err(r.corrupt_at(at, format!("tensor `{name}` appears twice")));
            }
        }
        Ok(GgufFile { path: path.to_owned(), version, alignment, data_start, metadata, infos, tensors })
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(GgufValue::as_u64)
    }

    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(GgufValue::as_i64)
    }

    /// A float value (stored as f32 or f64).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(GgufValue::as_f64).map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(GgufValue::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Option<&[GgufValue]> {
        self.get(key).and_then(GgufValue::as_array)
    }

    pub fn tensor(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }
}

impl FormatError {
    fn with_context(self, what: &str) -> Self {
        match self {
            FormatError::Corrupt { path, offset, msg } => {
                FormatError::Corrupt { path, offset, msg: format!("{what}: {msg}") }
            }
            other => other,
        }
    }
}

/// What one tensor takes parsed, before its name and dimensions: its info, its offset in
/// the file while parsing, and its view in the map by name.
const TENSOR_BYTES: u64 = (size_of::<TensorInfo>() + size_of::<u64>() + size_of::<String>() + size_of::<HostTensor>())
    as u64
    + MAP_ENTRY_OVERHEAD;
/// What one tensor costs once its model is read, charged at the count: besides its parsed
/// info ([`TENSOR_BYTES`]), what `inspect` and a load build for it (layer maps, views,
/// reports). `strata inspect` on a file of a million tensors peaked at 2.7 GB, about
/// 2.7 kB a tensor; real models have a few thousand tensors in gigabytes of weights.
const TENSOR_FOOTPRINT: u64 = if TENSOR_BYTES > 2048 { TENSOR_BYTES } else { 2048 };
/// What one metadata entry takes parsed, before its key's bytes and its value's contents.
const KV_BYTES: u64 = (size_of::<String>() + size_of::<GgufValue>()) as u64 + MAP_ENTRY_OVERHEAD;

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Metadata values still allowed (guards against many huge arrays in a huge file).
    values_left: u64,
    /// What the tables may still allocate.
    budget: TableBudget,
}

impl<'a> Reader<'a> {
    fn corrupt_at(&self, offset: u64, msg: String) -> FormatError {
        FormatError::Corrupt { path: self.path.to_owned(), offset, msg }
    }

    /// Charges `n` entries of `each` bytes of `table` to the budget; an error names the
    /// offset `at`.
    fn charge(&mut self, at: u64, table: &str, n: u64, each: u64) -> Result<(), FormatError> {
        self.budget.take(table, n, each).map_err(|msg| self.corrupt_at(at, msg))
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(self.corrupt_at(
                self.pos as u64,
                format!("{what} needs {n} bytes but the file ends {} bytes later", self.remaining()),
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FormatError> {
        Ok(self.take(N as u64, what)?.try_into().expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A u64 count of items that take at least `min_bytes` each: capped at `cap` and at
    /// what the rest of the file can hold.
    fn count(&mut self, what: &str, cap: u64, min_bytes: u64) -> Result<u64, FormatError> {
        let at = self.pos as u64;
        let n = self.u64(what)?;
        if n > cap || n.saturating_mul(min_bytes) > self.remaining() {
            return Err(self.corrupt_at(
                at,
                format!("{what} {n} is more than the cap {cap} or than the {} bytes left can hold", self.remaining()),
            ));
        }
        Ok(n)
    }

    fn string(&mut self, cap: u64, what: &str) -> Result<String, FormatError> {
        let at = self.pos as u64;
        let len = self.u64(what)?;
        if len > cap || len > self.remaining() {
            return Err(self.corrupt_at(
                at,
                format!("{what} has length {len}, more than the cap {cap} or the {} bytes left", self.remaining()),
            ));
        }
        self.charge(at, what, 1, len)?;
        let raw = self.take(len, what)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.corrupt_at(at + 8, format!("{what} is not UTF-8: {e}"))),
        }
    }

    /// Smallest encoding of one value of type `ty` (for checking array lengths).
    fn min_value_bytes(ty: u32) -> Option<u64> {
        Some(match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => 8,
            9 => 12,
            _ => return None,
        })
    }

    fn value(&mut self, ty: u32, ty_at: u64, depth: usize) -> Result<GgufValue, FormatError> {
        if self.values_left == 0 {
            return Err(self.corrupt_at(ty_at, format!("more than {MAX_METADATA_VALUES} metadata values")));
        }
        self.values_left -= 1;
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>("a u8")?[0]),
            1 => GgufValue::I8(self.array::<1>("an i8")?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array("a u16")?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array("an i16")?)),
            4 => GgufValue::U32(self.u32("a u32")?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array("an i32")?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array("an f32")?)),
            7 => {
                let at = self.pos as u64;
                match self.array::<1>("a bool")?[0] {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    b => return Err(self.corrupt_at(at, format!("bool value is {b}, not 0 or 1"))),
                }
            }
            8 => GgufValue::String(self.string(MAX_STRING_BYTES, "a string value")?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt_at(ty_at, format!("arrays nested more than {MAX_ARRAY_DEPTH} deep")));
                }
                let elem_at = self.pos as u64;
                let elem = self.u32("an array element type")?;
                let Some(min) = Self::min_value_bytes(elem) else {
                    return Err(self.corrupt_at(elem_at, format!("unknown array element type {elem}")));
                };
                let len_at = self.pos as u64;
                let len = self.u64("an array length")?;
                if len > self.values_left || len.saturating_mul(min) > self.remaining() {
                    return Err(self.corrupt_at(
                        len_at,
                        format!(
                            "array length {len} is more than the {} bytes left can hold (or than the cap on values)",
                            self.remaining()
                        ),
                    ));
                }
                self.charge(len_at, "an array", len, size_of::<GgufValue>() as u64)?;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem, elem_at, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64("a u64")?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array("an i64")?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array("an f64")?)),
            other => return Err(self.corrupt_at(ty_at, format!("unknown value type {other}"))),
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, FormatError> {
        let name = self.string(MAX_TENSOR_NAME_BYTES, "a tensor name")?;
        let dims_at = self.pos as u64;
        let n_dims = self.u32("a dimension count")?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(
                self.corrupt_at(dims_at, format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"))
            );
        }
        // The name twice (the info's and the map's key), the dimensions twice (`ne`, `shape`).
        self.charge(dims_at, "the tensor table", 1, name.len() as u64 + 16 * n_dims as u64)?;
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(self.u64("a dimension")?);
        }
        let numel = ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        // No tensor can hold more values than a file can hold bytes (every type takes at
        // least 4 bits per value); this also keeps `numel` within `usize`.
        let limit = (self.bytes.len() as u64).saturating_mul(2).min(isize::MAX as u64);
        if numel.is_none_or(|n| n > limit) {
            return Err(self.corrupt_at(dims_at, format!("tensor `{name}` dimensions {ne:?} are larger than the file")));
        }
        let type_at = self.pos as u64;
        let ggml_type = self.u32("a tensor type")?;
        let Some(dtype) = dtype_from_ggml(ggml_type) else {
            return Err(self.corrupt_at(
                type_at,
                format!(
                    "tensor `{name}` has GGML type {ggml_type} ({}), which Strata does not read",
                    ggml_type_name(ggml_type)
                ),
            ));
        };
        if !ne[0].is_multiple_of(dtype.block_size() as u64) {
            return Err(self.corrupt_at(
                dims_at,
                format!("tensor `{name}`: row length {} is not a whole number of {} blocks", ne[0], dtype.name()),
            ));
        }
        let offset = self.u64("a tensor offset")?;
        Ok(TensorInfo { name, ne, ggml_type, dtype, offset })
    }
}

#[cfg(test)]
mod tests;
