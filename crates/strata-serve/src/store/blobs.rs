//! Blobs for `POST /api/create`: `$STRATA_HOME/blobs/sha256-<hex>`, each written as
//! `blobs/blob-PID-N-NANOS.partial` under its writer's lock and renamed into place once
//! its digest is checked. [`Store::tidy`] removes what killed uploads left and the blobs
//! no model uses.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::staging::{self, Held};
use super::{Result, Store, io};
use strata_format::temp;

/// How long an unused blob is kept: a client uploads a blob and then creates a model from
/// it, maybe through another server that shares this `$STRATA_HOME` and starts (and
/// tidies) in between.
pub const BLOB_GRACE: Duration = Duration::from_secs(60 * 60);

/// A blob being uploaded: a `.partial` file this process holds, removed when dropped
/// unless [`persist`](Self::persist)ed.
pub struct BlobPartial(Held);

impl BlobPartial {
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The file, open for writing.
    pub fn file(&self) -> &fs::File {
        self.0.file()
    }

    /// Flushes the file to the disk and renames it to `to` (a [`Store::blob_path`]).
    pub fn persist(self, to: &Path) -> std::io::Result<()> {
        self.file().sync_all()?;
        fs::rename(self.path(), to)?;
        if let Some(parent) = to.parent() {
            let _ = temp::sync_dir(parent);
        }
        self.0.disarm();
        Ok(())
    }
}

/// What [`Store::tidy`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tidied {
    /// Partial uploads that no live writer held.
    pub partials: Vec<PathBuf>,
    /// Blobs no model uses, older than [`BLOB_GRACE`].
    pub blobs: Vec<PathBuf>,
    /// The bytes of those blobs (freed once no model directory links them either).
    pub blob_bytes: u64,
}

impl Store {
    fn blobs_dir(&self) -> PathBuf {
        self.home.join("blobs")
    }

    /// Where the blob `sha256:<hex>` is kept (`POST /api/blobs`).
    pub fn blob_path(&self, hex: &str) -> PathBuf {
        self.blobs_dir().join(format!("sha256-{hex}"))
    }

    /// A fresh partial file to write a blob to, beside the blobs (what killed uploads
    /// left there is removed first).
    pub fn blob_partial(&self) -> Result<BlobPartial> {
        let dir = self.blobs_dir();
        staging::sweep_partials(&dir);
        Held::create_file(&mut || super::install::fresh_in(&dir, "blob", ".partial")).map(BlobPartial)
    }

    /// What a server does as it starts: sweeps `models/.tmp/` as every store write does,
    /// removes the partial uploads no live writer holds, and the blobs that no model's
    /// `entry.json` names (`digest`) and that are older than [`BLOB_GRACE`] at `now`.
    pub fn tidy(&self, now: SystemTime) -> Result<Tidied> {
        self.sweep();
        let dir = self.blobs_dir();
        let mut tidied = Tidied { partials: staging::sweep_partials(&dir), ..Tidied::default() };
        let used: HashSet<String> = self.list()?.into_iter().filter_map(|m| m.entry.digest).collect();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(tidied),
            Err(e) => return Err(io(&dir)(e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(hex) = name.strip_prefix("sha256-") else { continue };
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) || used.contains(&format!("sha256:{hex}"))
            {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            let old = meta.modified().is_ok_and(|m| now.duration_since(m).is_ok_and(|age| age >= BLOB_GRACE));
            if meta.is_file() && old && fs::remove_file(entry.path()).is_ok() {
                tidied.blob_bytes += meta.len();
                tidied.blobs.push(entry.path());
            }
        }
        Ok(tidied)
    }
}
