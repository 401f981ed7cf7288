//! Flat layer directory (after GdsLLM / OctoFlow): `manifest.json`, the model's text files
//! verbatim, `embed.bin`, `output.bin`, `norm.bin` and one `layer_NNN.bin` per decoder
//! layer. Every tensor starts 4 KiB-aligned and every `.bin` file is a whole number of
//! 4 KiB pages, so one layer is one aligned read (O_DIRECT, cuFile). The layout is
//! specified in `docs/formats.md`, "Flat layer directory".
//!
//! [`open`] checks the manifest against the files' sizes and memory-maps them (cheap for
//! any model size); [`verify`] reads every byte and checks the XXH3-64 checksums.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::checksum::{self, Hasher, Piece, StoredSums, SummedFile};
use super::units::layer_units;
use super::{Checkpoint, ConfigOrigin, FormatError, Group, ModelMeta, ModelWriter};
use strata_tensor::tensor::{AlignedBytes, ByteSource, DType, HostTensor};

/// The manifest's `format` value.
pub const FORMAT: &str = "strata-flat";
/// The manifest `version` this build reads and writes.
pub const VERSION: u64 = 1;
/// Alignment of every tensor offset, layer range and `.bin` file length, in bytes.
pub const ALIGN: u64 = 4096;
pub const MANIFEST: &str = "manifest.json";

/// Manifests larger than this are refused before they are read.
const MAX_MANIFEST_BYTES: u64 = 256 << 20;
/// Text files (tokenizer, config, template) larger than this are refused before they are read.
const MAX_TEXT_BYTES: u64 = 1 << 30;
/// Tensors with more dimensions than this are refused.
const MAX_DIMS: usize = 8;
/// Read size of [`verify`].
const VERIFY_CHUNK: usize = 1 << 20;

/// `config.json` keys copied into the manifest's `hyperparameters` when present.
const HYPERPARAMETERS: [&str; 18] = [
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "attention_bias",
    "sliding_window",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
];

const DTYPES: [DType; 16] = {
    use DType::*;
    [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K, Mxfp4, AffineQ4, I8]
};

/// The dtype with this [`DType::name`].
fn dtype_from_name(name: &str) -> Option<DType> {
    DTYPES.into_iter().find(|d| d.name() == name)
}

/// `layer_000.bin`, ..., `layer_999.bin`, `layer_1000.bin`, ...
pub fn layer_file_name(index: usize) -> String {
    format!("layer_{index:03}.bin")
}

/// What a file of the directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FileKind {
    Config,
    Tokenizer,
    TokenizerConfig,
    GenerationConfig,
    ChatTemplate,
    Embed,
    Output,
    Norm,
    Layer,
}

impl FileKind {
    fn is_bin(self) -> bool {
        matches!(self, FileKind::Embed | FileKind::Output | FileKind::Norm | FileKind::Layer)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    version: u64,
    name: String,
    architecture: String,
    hyperparameters: Map<String, Value>,
    alignment: u64,
    num_layers: usize,
    files: Vec<FileEntry>,
    tensors: Vec<TensorEntry>,
    layers: Vec<LayerEntry>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    name: String,
    kind: FileKind,
    size: u64,
    xxh3: String,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorEntry {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    file: String,
    offset: u64,
    size: u64,
    xxh3: String,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayerEntry {
    index: usize,
    file: String,
    offset: u64,
    size: u64,
}

/// One decoder layer's weights: `len` bytes at `offset` of `path`, both multiples of
/// [`ALIGN`]; every tensor of the layer lies inside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerRange {
    pub index: usize,
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
}

/// What [`verify`] checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyReport {
    pub files: usize,
    pub tensors: usize,
    pub bytes: u64,
}

// ---------------------------------------------------------------------------------------
// Writing

/// Writes a flat layer directory, one group at a time (see [`ModelWriter`]): the text
/// files at [`create`], each group's `.bin` files as the group arrives, `manifest.json`
/// and the rename into place at `finish`. Dropped unfinished, it removes its temporary
/// directory.
pub struct FlatWriter {
    out: PathBuf,
    tmp: PathBuf,
    layers: usize,
    /// Groups written so far: 0 none, 1 the global one, `k + 1` layers `0..k` too.
    written: usize,
    manifest: Manifest,
    names: HashSet<String>,
    finished: bool,
}

/// Starts a flat directory at `out` (which must not exist) for a model of `layers`
/// decoder layers.
pub fn create(out: &Path, meta: &ModelMeta, layers: usize) -> anyhow::Result<FlatWriter> {
    let shown = out.display();
    if out.exists() {
        bail!("{shown}: already exists; refusing to overwrite it");
    }
    out.file_name().with_context(|| format!("{shown}: not a directory name"))?;
    let config: Value = serde_json::from_str(&meta.config_json)
        .with_context(|| format!("{shown}: the model's config.json is not valid JSON"))?;
    let architecture = config
        .get("model_type")
        .and_then(Value::as_str)
        .or_else(|| config.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str))
        .with_context(|| format!("{shown}: config.json has neither `model_type` nor `architectures`"))?;
    let hyperparameters: Map<String, Value> = HYPERPARAMETERS
        .iter()
        .filter_map(|&k| config.get(k).filter(|v| !v.is_null()).map(|v| (k.to_string(), v.clone())))
        .collect();
    super::temp::remove_stale(out)?;
    let tmp = super::temp::sibling(out)?;
    std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = FlatWriter {
        out: out.to_owned(),
        tmp,
        layers,
        written: 0,
        manifest: Manifest {
            format: FORMAT.into(),
            version: VERSION,
            name: meta.name.clone(),
            architecture: architecture.to_string(),
            hyperparameters,
            alignment: ALIGN,
            num_layers: layers,
            files: Vec::new(),
            tensors: Vec::new(),
            layers: Vec::with_capacity(layers),
        },
        names: HashSet::new(),
        finished: false,
    };
    let texts = [
        ("config.json", FileKind::Config, Some(&meta.config_json)),
        ("tokenizer.json", FileKind::Tokenizer, Some(&meta.tokenizer_json)),
        ("tokenizer_config.json", FileKind::TokenizerConfig, meta.tokenizer_config_json.as_ref()),
        ("generation_config.json", FileKind::GenerationConfig, meta.generation_config_json.as_ref()),
        ("chat_template.jinja", FileKind::ChatTemplate, meta.chat_template.as_ref()),
    ];
    for (name, kind, text) in texts {
        if let Some(text) = text {
            w.write_text(name, kind, text)?;
        }
    }
    Ok(w)
}

impl FlatWriter {
    fn write_text(&mut self, name: &str, kind: FileKind, text: &str) -> anyhow::Result<()> {
        let path = self.tmp.join(name);
        let mut f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .with_context(|| format!("writing {}", path.display()))?;
        let entry =
            FileEntry { name: name.into(), kind, size: text.len() as u64, xxh3: checksum::hex(text.as_bytes()) };
        self.manifest.files.push(entry);
        Ok(())
    }

    /// Writes `tensors` back to back into `name`, each padded with zeros to [`ALIGN`];
    /// returns the file's length.
    fn write_bin(&mut self, name: &str, kind: FileKind, tensors: &[&(String, HostTensor)]) -> anyhow::Result<u64> {
        static ZEROS: [u8; ALIGN as usize] = [0; ALIGN as usize];
        let path = self.tmp.join(name);
        let err = || format!("writing {}", path.display());
        let file = File::create(&path).with_context(err)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let mut hasher = Hasher::new();
        let mut offset = 0u64;
        for (tname, t) in tensors {
            let bytes = t.bytes();
            let pad = pad_to_align(bytes.len() as u64);
            out.write_all(bytes).and_then(|()| out.write_all(&ZEROS[..pad as usize])).with_context(err)?;
            hasher.update(bytes);
            hasher.update(&ZEROS[..pad as usize]);
            self.manifest.tensors.push(TensorEntry {
                name: tname.clone(),
                dtype: t.dtype.name().into(),
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                file: name.into(),
                offset,
                size: bytes.len() as u64,
                xxh3: checksum::hex(bytes),
            });
            offset += bytes.len() as u64 + pad;
        }
        let file = out.into_inner().map_err(|e| e.into_error()).with_context(err)?;
        file.sync_all().with_context(err)?;
        self.manifest.files.push(FileEntry { name: name.into(), kind, size: offset, xxh3: hasher.hex() });
        Ok(offset)
    }
}

/// Zero bytes that follow `len` bytes to reach the next multiple of [`ALIGN`].
fn pad_to_align(len: u64) -> u64 {
    (ALIGN - len % ALIGN) % ALIGN
}

impl ModelWriter for FlatWriter {
    fn write_group(&mut self, group: Group, tensors: &[(String, HostTensor)]) -> anyhow::Result<()> {
        let expected = match self.written {
            0 => Some(Group::Global),
            k if k <= self.layers => Some(Group::Layer(k - 1)),
            _ => None,
        };
        if Some(group) != expected {
            bail!(
                "{}: got group {group:?}, expected {expected:?} (global first, then layers in order)",
                self.out.display()
            );
        }
        for (name, t) in tensors {
            let shown = self.out.display();
            if Group::of(name) != group {
                bail!("{shown}: tensor `{name}` belongs to {:?}, not {group:?}", Group::of(name));
            }
            if t.dtype.bytes_for(t.numel()) != Some(t.bytes().len()) {
                bail!(
                    "{shown}: tensor `{name}`: {} bytes do not hold {} {:?}",
                    t.bytes().len(),
                    t.dtype.name(),
                    t.shape
                );
            }
            if self.names.contains(name) || tensors.iter().filter(|(n, _)| n == name).count() > 1 {
                bail!("{shown}: tensor `{name}` was handed over twice");
            }
        }
        self.names.extend(tensors.iter().map(|(n, _)| n.clone()));
        match group {
            Group::Global => {
                let pick = |f: &dyn Fn(&str) -> bool| tensors.iter().filter(|(n, _)| f(n)).collect::<Vec<_>>();
                let embed = pick(&|n| n == "model.embed_tokens.weight");
                let output = pick(&|n| n == "lm_head.weight");
                let norm = pick(&|n| n != "model.embed_tokens.weight" && n != "lm_head.weight");
                for (name, kind, ts) in [
                    ("embed.bin", FileKind::Embed, embed),
                    ("output.bin", FileKind::Output, output),
                    ("norm.bin", FileKind::Norm, norm),
                ] {
                    if !ts.is_empty() {
                        self.write_bin(name, kind, &ts)?;
                    }
                }
            }
            Group::Layer(index) => {
                let file = layer_file_name(index);
                // Every tensor starts on a page, so each unit (the core, each expert)
                // written back to back is one aligned range of its own.
                let units = layer_units(tensors);
                let ordered: Vec<_> = units.iter().flat_map(|u| &u.tensors).map(|&i| &tensors[i]).collect();
                let size = self.write_bin(&file, FileKind::Layer, &ordered)?;
                self.manifest.layers.push(LayerEntry { index, file, offset: 0, size });
            }
        }
        self.written += 1;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> anyhow::Result<()> {
        let shown = self.out.display().to_string();
        if self.written != self.layers + 1 {
            let layers_done = self.written.saturating_sub(1);
            bail!(
                "{shown}: finished after {layers_done} of {} layers (global group written: {})",
                self.layers,
                self.written > 0
            );
        }
        let path = self.tmp.join(MANIFEST);
        let text = serde_json::to_vec_pretty(&self.manifest).context("serializing the manifest")?;
        let mut f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        f.write_all(&text).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", path.display()))?;
        if self.out.exists() {
            bail!("{shown}: appeared while converting; refusing to overwrite it");
        }
        std::fs::rename(&self.tmp, &self.out).with_context(|| format!("renaming {} to {shown}", self.tmp.display()))?;
        self.finished = true;
        if let Some(parent) = self.out.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Makes the rename durable; not every filesystem can sync a directory.
            let _ = File::open(parent).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

impl Drop for FlatWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading

/// A manifest whose every entry has been checked against the directory's files.
struct Checked {
    dir: PathBuf,
    manifest: Manifest,
    dtypes: Vec<DType>,
}

impl Checked {
    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

fn invalid(path: &Path, msg: String) -> FormatError {
    FormatError::Invalid { path: path.to_owned(), msg }
}

/// Reads `manifest.json` and checks it: format and version, file names, every file's
/// size on disk, every tensor's dtype, shape, size, alignment and bounds, layer ranges.
/// Reads no weight bytes.
fn read_manifest(dir: &Path) -> Result<Checked, FormatError> {
    let mpath = dir.join(MANIFEST);
    let text = read_capped(&mpath, MAX_MANIFEST_BYTES)?;
    let value: Value = serde_json::from_slice(&text).map_err(|e| invalid(&mpath, format!("not valid JSON: {e}")))?;
    let field = |key: &str| brief(&value.get(key).unwrap_or(&Value::Null).to_string());
    if value.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(invalid(&mpath, format!("`format` is {}, expected \"{FORMAT}\"", field("format"))));
    }
    if value.get("version").and_then(Value::as_u64) != Some(VERSION) {
        return Err(invalid(&mpath, format!("`version` is {}; this build reads version {VERSION}", field("version"))));
    }
    let manifest: Manifest =
        serde_path_to_error::deserialize(value).map_err(|e| invalid(&mpath, format!("malformed manifest: {e}")))?;
    let dtypes = check(dir, &mpath, &manifest)?;
    Ok(Checked { dir: dir.to_owned(), manifest, dtypes })
}

/// Text from a file for an error message, cut to 40 characters.
fn brief(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// Reads a whole file of at most `cap` bytes (checked before reading).
fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, FormatError> {
    let io = |source| FormatError::Io { path: path.to_owned(), source };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > cap {
        return Err(invalid(path, format!("{len} bytes is more than the {cap}-byte limit")));
    }
    let mut out = Vec::with_capacity(len as usize);
    file.take(cap).read_to_end(&mut out).map_err(io)?;
    Ok(out)
}

/// A plain file name inside the directory: no separators, no `..`, not hidden, not the manifest.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\\', '\0']) && !name.starts_with('.') && name != MANIFEST
}

fn is_hex16(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Checks a parsed manifest against the files in `dir`; returns each tensor's dtype.
fn check(dir: &Path, mpath: &Path, m: &Manifest) -> Result<Vec<DType>, FormatError> {
    if m.alignment != ALIGN {
        return Err(invalid(mpath, format!("`alignment` is {}, version {VERSION} requires {ALIGN}", m.alignment)));
    }
    if m.num_layers != m.layers.len() {
        return Err(invalid(
            mpath,
            format!("`num_layers` is {} but {} layers are listed", m.num_layers, m.layers.len()),
        ));
    }
    let mut files: HashMap<&str, &FileEntry> = HashMap::with_capacity(m.files.len());
    for f in &m.files {
        if !plain_name(&f.name) {
            return Err(invalid(mpath, format!("file name {:?} is not a plain file name", f.name)));
        }
        if !is_hex16(&f.xxh3) {
            return Err(invalid(
                mpath,
                format!("file `{}`: `xxh3` {:?} is not 16 lowercase hex digits", f.name, f.xxh3),
            ));
        }
        if files.insert(&f.name, f).is_some() {
            return Err(invalid(mpath, format!("file `{}` is listed twice", f.name)));
        }
        if f.kind != FileKind::Layer && m.files.iter().filter(|g| g.kind == f.kind).count() > 1 {
            return Err(invalid(mpath, format!("more than one file of kind {:?}", f.kind)));
        }
        let path = dir.join(&f.name);
        let actual = std::fs::metadata(&path).map_err(|source| FormatError::Io { path: path.clone(), source })?.len();
        if actual != f.size {
            let msg = format!("file is {actual} bytes, {MANIFEST} says {} (truncated or replaced?)", f.size);
            return Err(FormatError::Corrupt { path, offset: actual.min(f.size), msg });
        }
        if f.kind.is_bin() && f.size % ALIGN != 0 {
            return Err(invalid(&path, format!("length {} is not a multiple of {ALIGN}", f.size)));
        }
        if !f.kind.is_bin() && f.size > MAX_TEXT_BYTES {
            return Err(invalid(&path, format!("{} bytes is more than the {MAX_TEXT_BYTES}-byte limit", f.size)));
        }
    }
    for kind in [FileKind::Config, FileKind::Tokenizer] {
        if !m.files.iter().any(|f| f.kind == kind) {
            return Err(invalid(mpath, format!("no file of kind {kind:?}")));
        }
    }
    let bin_file = |name: &str, what: &str| -> Result<&FileEntry, FormatError> {
        match files.get(name) {
            Some(f) if f.kind.is_bin() => Ok(f),
            Some(_) => Err(invalid(mpath, format!("{what}: file `{name}` is not a .bin file"))),
            None => Err(invalid(mpath, format!("{what}: file `{name}` is not listed in `files`"))),
        }
    };
    for (i, l) in m.layers.iter().enumerate() {
        let what = format!("layer {i}");
        let f = bin_file(&l.file, &what)?;
        if l.index != i || f.kind != FileKind::Layer {
            return Err(invalid(mpath, format!("{what}: entry has index {} in a file of kind {:?}", l.index, f.kind)));
        }
        if l.offset % ALIGN != 0 || l.size % ALIGN != 0 || l.offset.checked_add(l.size).is_none_or(|e| e > f.size) {
            let msg = format!("{MANIFEST}: {what}: range {}+{} is unaligned or past the end", l.offset, l.size);
            return Err(FormatError::Corrupt { path: dir.join(&l.file), offset: l.offset, msg });
        }
    }
    let mut names = HashSet::with_capacity(m.tensors.len());
    let mut dtypes = Vec::with_capacity(m.tensors.len());
    let mut by_file: HashMap<&str, Vec<(u64, u64, &str)>> = HashMap::new();
    for t in &m.tensors {
        let what = format!("tensor `{}`", t.name);
        if !names.insert(t.name.as_str()) {
            return Err(invalid(mpath, format!("{what} is listed twice")));
        }
        let f = bin_file(&t.file, &what)?;
        let shape = match t.shape.len() {
            n if n > MAX_DIMS => format!("{n} dimensions"),
            _ => format!("{:?}", t.shape),
        };
        let corrupt = |msg: String| FormatError::Corrupt {
            path: dir.join(&t.file),
            offset: t.offset,
            msg: format!("{MANIFEST}: {what} ({} {shape}, {} bytes): {msg}", brief(&t.dtype), t.size),
        };
        let dtype = dtype_from_name(&t.dtype).ok_or_else(|| corrupt("unknown dtype".into()))?;
        if t.shape.len() > MAX_DIMS {
            return Err(corrupt(format!("more than {MAX_DIMS} dimensions")));
        }
        let numel = t.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let want = numel.and_then(|n| usize::try_from(n).ok()).and_then(|n| dtype.bytes_for(n));
        if want.map(|b| b as u64) != Some(t.size) {
            return Err(corrupt("the size does not match the shape and dtype".into()));
        }
        if t.offset % ALIGN != 0 {
            return Err(corrupt(format!("offset is not a multiple of {ALIGN}")));
        }
        let end = t.offset.checked_add(t.size).filter(|&e| e <= f.size);
        let end = end.ok_or_else(|| corrupt(format!("lies past the end of the {}-byte file", f.size)))?;
        if !is_hex16(&t.xxh3) {
            return Err(corrupt(format!("`xxh3` {:?} is not 16 lowercase hex digits", t.xxh3)));
        }
        match (Group::of(&t.name), f.kind) {
            (Group::Layer(i), FileKind::Layer) => {
                let l = m.layers.get(i).ok_or_else(|| corrupt(format!("layer {i} is not listed in `layers`")))?;
                if l.file != t.file || t.offset < l.offset || end > l.offset + l.size {
                    return Err(corrupt(format!("lies outside layer {i}'s range in `{}`", l.file)));
                }
            }
            (Group::Global, FileKind::Embed | FileKind::Output | FileKind::Norm) => {}
            (group, kind) => return Err(corrupt(format!("a {group:?} tensor cannot be stored in a {kind:?} file"))),
        }
        by_file.entry(&t.file).or_default().push((t.offset, end, &t.name));
        dtypes.push(dtype);
    }
    for (file, mut spans) in by_file {
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            let msg = format!("{MANIFEST}: tensors `{}` and `{}` overlap", w[0].2, w[1].2);
            return Err(FormatError::Corrupt { path: dir.join(file), offset: w[1].0, msg });
        }
    }
    Ok(dtypes)
}

/// Opens a flat layer directory: checks the manifest against the files' sizes,
/// memory-maps the `.bin` files and reads the text files. Checksums are not read
/// (see [`verify`]), so opening costs the same for any model size; each tensor's is
/// kept in the source's `sums` for whoever reads it in full.
pub fn open(dir: &Path) -> anyhow::Result<Checkpoint> {
    let c = read_manifest(dir)?;
    let m = &c.manifest;
    let mut maps: HashMap<&str, (Arc<dyn ByteSource>, usize)> = HashMap::new();
    let mut sums = StoredSums::default();
    for f in m.files.iter().filter(|f| f.kind.is_bin()) {
        let (path, bytes) = (c.path(&f.name), map_file(&c.path(&f.name), f.size)?);
        let at = sums.add_file(SummedFile { path, bytes: bytes.clone(), index: MANIFEST });
        maps.insert(&f.name, (bytes, at));
    }
    let mut tensors = HashMap::with_capacity(m.tensors.len());
    for (t, &dtype) in m.tensors.iter().zip(&c.dtypes) {
        let (src, at) = maps[t.file.as_str()].clone();
        sums.add(&t.name, at, Piece { offset: t.offset, len: t.size, xxh3: t.xxh3.clone() });
        // The checks in `read_manifest` bound offset + size by the (mapped) file length.
        let shape = t.shape.iter().map(|&d| d as usize).collect();
        tensors.insert(t.name.clone(), HostTensor::new(src, t.offset as usize, t.size as usize, dtype, shape));
    }
    let text = |kind: FileKind| -> Result<Option<String>, FormatError> {
        let Some(f) = m.files.iter().find(|f| f.kind == kind) else { return Ok(None) };
        let path = c.path(&f.name);
        let bytes = read_capped(&path, MAX_TEXT_BYTES)?;
        String::from_utf8(bytes).map(Some).map_err(|e| invalid(&path, format!("not UTF-8 text: {e}")))
    };
    let required = |kind: FileKind| -> Result<String, FormatError> {
        text(kind)?.ok_or_else(|| invalid(&dir.join(MANIFEST), format!("no file of kind {kind:?}")))
    };
    Ok(Checkpoint {
        name: m.name.clone(),
        config_json: required(FileKind::Config)?,
        config_origin: ConfigOrigin::File(dir.join("config.json")),
        tokenizer_json: required(FileKind::Tokenizer)?,
        tokenizer_config_json: text(FileKind::TokenizerConfig)?,
        generation_config_json: text(FileKind::GenerationConfig)?,
        chat_template: text(FileKind::ChatTemplate)?,
        tensors,
        routing: None,
        sums,
    })
}

/// Memory-maps a `.bin` file whose length the manifest says is `size`.
fn map_file(path: &Path, size: u64) -> Result<Arc<dyn ByteSource>, FormatError> {
    let io = |source| FormatError::Io { path: path.to_owned(), source };
    if size == 0 {
        return Ok(Arc::new(AlignedBytes::zeroed(0)));
    }
    let file = File::open(path).map_err(io)?;
    let map = strata_tensor::mapped::MappedFile::map(&file, path).map_err(io)?;
    if map.bytes().len() as u64 != size {
        let msg = format!("file is {} bytes, {MANIFEST} says {size} (changed while opening?)", map.bytes().len());
        return Err(FormatError::Corrupt { path: path.to_owned(), offset: 0, msg });
    }
    Ok(Arc::new(map))
}

/// Reads every file of the directory and checks its XXH3-64 against the manifest. A
/// mismatch in a `.bin` file names the first tensor whose bytes differ (or the padding
/// byte that is not zero).
pub fn verify(dir: &Path) -> Result<VerifyReport, FormatError> {
    let c = read_manifest(dir)?;
    let mut report = VerifyReport { files: 0, tensors: 0, bytes: 0 };
    let mut buf = vec![0u8; VERIFY_CHUNK];
    for f in &c.manifest.files {
        let path = c.path(&f.name);
        let io = |source| FormatError::Io { path: path.clone(), source };
        let mut file = File::open(&path).map_err(io)?;
        let mut hasher = Hasher::new();
        let mut len = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        if len != f.size {
            let msg = format!("read {len} bytes, {MANIFEST} says {} (changed while verifying?)", f.size);
            return Err(FormatError::Corrupt { path, offset: len.min(f.size), msg });
        }
        let got = hasher.hex();
        if got != f.xxh3 {
            if f.kind.is_bin() {
                return Err(locate_corruption(&c, f, &got));
            }
            let msg = format!("checksum mismatch: xxh3 {got}, {MANIFEST} says {}", f.xxh3);
            return Err(FormatError::Invalid { path, msg });
        }
        report.files += 1;
        report.bytes += len;
    }
    report.tensors = c.manifest.tensors.len();
    Ok(report)
}

/// The error for a `.bin` file whose checksum differs: the first tensor whose own
/// checksum differs, else the first non-zero padding byte, else the file checksum.
fn locate_corruption(c: &Checked, f: &FileEntry, got: &str) -> FormatError {
    let path = c.path(&f.name);
    let src = match map_file(&path, f.size) {
        Ok(src) => src,
        Err(e) => return e,
    };
    let bytes = src.bytes();
    let mut tensors: Vec<&TensorEntry> = c.manifest.tensors.iter().filter(|t| t.file == f.name).collect();
    tensors.sort_unstable_by_key(|t| t.offset);
    let mut covered = 0u64;
    let mut first_nonzero_padding = None;
    for t in &tensors {
        let (start, end) = (t.offset as usize, (t.offset + t.size) as usize);
        let here = checksum::hex(&bytes[start..end]);
        if here != t.xxh3 {
            let msg = format!(
                "checksum mismatch in tensor `{}` (bytes {start}..{end}): xxh3 {here}, {MANIFEST} says {}",
                t.name, t.xxh3
            );
            return FormatError::Corrupt { path, offset: t.offset, msg };
        }
        first_nonzero_padding = first_nonzero_padding.or_else(|| nonzero_at(bytes, covered, t.offset));
        covered = covered.max(t.offset + t.size);
    }
    first_nonzero_padding = first_nonzero_padding.or_else(|| nonzero_at(bytes, covered, f.size));
    match first_nonzero_padding {
        Some(offset) => {
            FormatError::Corrupt { path, offset, msg: "checksum mismatch: padding byte is not zero".into() }
        }
        None => {
            let msg = format!("checksum mismatch: xxh3 {got}, {MANIFEST} says {} (every tensor matches)", f.xxh3);
            FormatError::Corrupt { path, offset: 0, msg }
        }
    }
}

/// The offset of the first non-zero byte in `bytes[from..to]`.
fn nonzero_at(bytes: &[u8], from: u64, to: u64) -> Option<u64> {
    if from >= to {
        return None;
    }
    bytes[from as usize..to as usize].iter().position(|&b| b != 0).map(|i| from + i as u64)
}

/// The manifest as JSON for `strata inspect --json`: format, version, name,
/// architecture, hyperparameters, files, the tensor table, per-layer bytes and totals.
pub fn inspect(dir: &Path) -> anyhow::Result<Value> {
    let c = read_manifest(dir)?;
    let m = &c.manifest;
    let mut by_dtype: Map<String, Value> = Map::new();
    for t in &m.tensors {
        let e = by_dtype.entry(t.dtype.clone()).or_insert_with(|| json!({"tensors": 0u64, "bytes": 0u64}));
        e["tensors"] = json!(e["tensors"].as_u64().unwrap_or(0) + 1);
        e["bytes"] = json!(e["bytes"].as_u64().unwrap_or(0) + t.size);
    }
    let bin_bytes: u64 = m.files.iter().filter(|f| f.kind.is_bin()).map(|f| f.size).sum();
    let tensors: Vec<Value> = m
        .tensors
        .iter()
        .map(|t| json!({"name": t.name, "dtype": t.dtype, "shape": t.shape, "file": t.file, "offset": t.offset, "size": t.size}))
        .collect();
    Ok(json!({
        "format": m.format,
        "version": m.version,
        "name": m.name,
        "architecture": m.architecture,
        "hyperparameters": m.hyperparameters,
        "alignment": m.alignment,
        "num_layers": m.num_layers,
        "file_bytes": bin_bytes,
        "tensor_bytes": m.tensors.iter().map(|t| t.size).sum::<u64>(),
        "dtypes": by_dtype,
        "files": m.files,
        "tensors": tensors,
        "layers": m.layers,
    }))
}

/// Each decoder layer's byte range, in layer order (checked like [`open`] does).
pub fn layer_ranges(dir: &Path) -> anyhow::Result<Vec<LayerRange>> {
    let c = read_manifest(dir)?;
    let ranges = c.manifest.layers.iter().map(|l| LayerRange {
        index: l.index,
        path: c.path(&l.file),
        offset: l.offset,
        len: l.size,
    });
    Ok(ranges.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DTYPES {
            assert_eq!(dtype_from_name(d.name()), Some(d));
        }
        assert_eq!(dtype_from_name("f32"), None);
    }

    #[test]
    fn padding_reaches_the_next_page() {
        assert_eq!(pad_to_align(0), 0);
        assert_eq!(pad_to_align(1), 4095);
        assert_eq!(pad_to_align(4096), 0);
        assert_eq!(pad_to_align(4097), 4095);
    }

    #[test]
    fn layer_files_have_at_least_three_digits() {
        assert_eq!(layer_file_name(7), "layer_007.bin");
        assert_eq!(layer_file_name(123), "layer_123.bin");
        assert_eq!(layer_file_name(1234), "layer_1234.bin");
    }

    #[test]
    fn each_expert_is_one_aligned_range_after_the_core() {
        use crate::units::testing::{EXPERTS, assert_unit_layout, moe_layer, tiny_meta};
        for mixtral in [false, true] {
            let dir = std::env::temp_dir().join(format!("strata-flat-unit-{}-moe-{mixtral}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let out = dir.join("m");
            let layer = moe_layer(mixtral);
            let mut w = Box::new(create(&out, &tiny_meta(), 1).unwrap());
            w.write_group(Group::Global, &[("model.norm.weight".into(), HostTensor::from_f32(&[1.0; 8], vec![8]))])
                .unwrap();
            w.write_group(Group::Layer(0), &layer).unwrap();
            w.finish().unwrap();
            let m = read_manifest(&out).unwrap().manifest;
            let spans: Vec<(String, u64, u64)> = m
                .tensors
                .iter()
                .filter(|t| t.file == layer_file_name(0))
                .map(|t| (t.name.clone(), t.offset, t.offset + t.size))
                .collect();
            assert_eq!(spans.len(), layer.len());
            assert_unit_layout(&spans, 0, EXPERTS);
            let src = open(&out).unwrap();
            for (name, t) in &layer {
                let r = &src.tensors[name];
                assert_eq!((r.dtype, &r.shape, r.bytes()), (t.dtype, &t.shape, t.bytes()), "{name}");
            }
            verify(&out).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn only_plain_names_are_accepted() {
        assert!(plain_name("layer_000.bin"));
        for bad in ["", "../x", "a/b", ".hidden", "manifest.json", "a\\b"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }
}
