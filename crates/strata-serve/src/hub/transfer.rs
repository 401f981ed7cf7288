//! Streaming files to disk: `.part` files, resume, hashing, the manifest of verified files.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::ControlFlow;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::hash::Hasher;
use super::http::{Ctx, Failure, classify_ureq, header, parse_content_range_start};
use super::{CHUNK, Digest, HubClient, HubError, MANIFEST_NAME, PARTIAL_DIR, Phase, Plan, RemoteFile, io_err};

impl HubClient {
    /// Streams `file` into `part` (resuming from its length) until it is complete and
    /// verified. On a mismatch the part file is deleted.
    pub(super) fn fetch_file(
        &self,
        repo: &str,
        commit: &str,
        file: &RemoteFile,
        part: &Path,
        report: &mut dyn FnMut(Phase, u64) -> ControlFlow<()>,
    ) -> Result<(), HubError> {
        let mut part = Part::open(file, part, report)?;
        let url = self.resolve_url(repo, commit, &file.path);
        let ctx = Ctx { repo, revision: commit, file: Some(&file.path) };
        let mut failures = 0;
        while part.have < file.size {
            let before = part.have;
            match self.stream_once(&url, &ctx, &mut part, report) {
                Ok(()) if part.have == file.size => {}
                Ok(()) => {
                    let msg = format!("the connection closed after {} of {} bytes", part.have, file.size);
                    self.after_failure(&url, msg, &mut failures, part.have > before)?;
                }
                Err(Failure::Transient(msg)) => self.after_failure(&url, msg, &mut failures, part.have > before)?,
                Err(Failure::Fatal(e)) => {
                    if matches!(e, HubError::Integrity { .. }) {
                        part.discard();
                    }
                    return Err(e);
                }
            }
        }
        part.finish()
    }

    /// One request for the bytes `part` lacks, appending what arrives.
    fn stream_once(
        &self,
        url: &str,
        ctx: &Ctx<'_>,
        part: &mut Part<'_>,
        report: &mut dyn FnMut(Phase, u64) -> ControlFlow<()>,
    ) -> Result<(), Failure> {
        let resp = self.request(url, part.have).map_err(|e| classify_ureq(url, e))?;
        self.check_status(&resp, url, ctx)?;
        if resp.status().as_u16() == 206 {
            let range = header(&resp, "content-range").unwrap_or_default();
            if parse_content_range_start(&range) != Some(part.have) {
                let msg = format!("asked for bytes={}- and got Content-Range `{range}`", part.have);
                return Err(HubError::BadResponse { url: url.to_string(), msg }.into());
            }
        } else if part.have > 0 {
            // The server ignored the Range header: start over.
            part.restart()?;
        }
        if report(Phase::Downloading, part.have).is_break() {
            return Err(HubError::Cancelled.into());
        }
        let mut body = resp.into_body().into_reader();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::Transient(format!("reading the body: {e}"))),
            };
            part.append(&buf[..n])?;
            if report(Phase::Downloading, part.have).is_break() {
                return Err(HubError::Cancelled.into());
            }
        }
    }
}

/// A `.part` file being filled, with the hash of what it holds so far.
pub(super) struct Part<'a> {
    file: &'a RemoteFile,
    path: &'a Path,
    out: File,
    /// Bytes in the file (and fed to `hasher`).
    have: u64,
    hasher: Hasher,
}

impl<'a> Part<'a> {
    /// Opens (or creates) the part file and hashes what an earlier run left in it.
    fn open(
        file: &'a RemoteFile,
        path: &'a Path,
        report: &mut dyn FnMut(Phase, u64) -> ControlFlow<()>,
    ) -> Result<Self, HubError> {
        let out =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io_err(path))?;
        let have = out.metadata().map_err(io_err(path))?.len();
        let mut part = Part { file, path, out, have: 0, hasher: Hasher::new(file) };
        if have > file.size {
            part.restart()?;
        } else if have > 0 {
            if report(Phase::Checking, have).is_break() {
                return Err(HubError::Cancelled);
            }
            hash_prefix(&mut part.out, have, &mut part.hasher).map_err(io_err(path))?;
            part.have = have;
        }
        Ok(part)
    }

    fn restart(&mut self) -> Result<(), HubError> {
        self.out.set_len(0).map_err(io_err(self.path))?;
        self.out.seek(SeekFrom::Start(0)).map_err(io_err(self.path))?;
        self.have = 0;
        self.hasher = Hasher::new(self.file);
        Ok(())
    }

    /// Appends bytes; more than the tree's size is an integrity error.
    fn append(&mut self, bytes: &[u8]) -> Result<(), HubError> {
        if self.have + bytes.len() as u64 > self.file.size {
            return Err(HubError::Integrity {
                file: self.file.path.clone(),
                check: "size",
                expected: self.file.size.to_string(),
                actual: format!("more than {}", self.file.size),
            });
        }
        self.out.write_all(bytes).map_err(io_err(self.path))?;
        self.hasher.update(bytes);
        self.have += bytes.len() as u64;
        Ok(())
    }

    /// Syncs the complete file and checks its hash; a mismatch deletes it.
    fn finish(self) -> Result<(), HubError> {
        self.out.sync_all().map_err(io_err(self.path))?;
        let (check, expected) = match &self.file.digest {
            Digest::Sha256(h) => ("sha256", h),
            Digest::GitSha1(h) => ("git blob sha1", h),
        };
        let actual = self.hasher.finish();
        if &actual != expected {
            let _ = fs::remove_file(self.path);
            return Err(HubError::Integrity {
                file: self.file.path.clone(),
                check,
                expected: expected.clone(),
                actual,
            });
        }
        Ok(())
    }

    fn discard(self) {
        let _ = fs::remove_file(self.path);
    }
}

/// Feeds the first `len` bytes of `file` to `hasher`.
fn hash_prefix(file: &mut File, len: u64, hasher: &mut Hasher) -> io::Result<()> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = file.take(len);
    let mut buf = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buf)? {
            0 => return Ok(()),
            n => hasher.update(&buf[..n]),
        }
    }
}

/// Whether a file already at `path` (without a manifest entry) is `file`.
pub(super) fn verify_existing(
    file: &RemoteFile,
    path: &Path,
    report: &mut dyn FnMut(Phase, u64) -> ControlFlow<()>,
) -> Result<bool, HubError> {
    let Ok(meta) = fs::metadata(path) else { return Ok(false) };
    if !meta.is_file() || meta.len() != file.size {
        return Ok(false);
    }
    if report(Phase::Checking, 0).is_break() {
        return Err(HubError::Cancelled);
    }
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut hasher = Hasher::new(file);
    hash_prefix(&mut f, file.size, &mut hasher).map_err(io_err(path))?;
    Ok(hasher.finish() == file.digest.hex())
}

/// `DEST/.strata-hub.json`: where the directory came from and which files were verified.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Manifest {
    repo: String,
    revision: String,
    commit: String,
    files: BTreeMap<String, ManifestEntry>,
}

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ManifestEntry {
    size: u64,
    digest: Digest,
}

impl Manifest {
    /// The manifest of `dir` (see [`Manifest::read`]), now describing `plan`.
    pub(super) fn for_plan(dir: &Path, plan: &Plan) -> Self {
        let mut manifest = Manifest::read(dir);
        manifest.repo = plan.repo.repo.clone();
        manifest.revision = plan.repo.revision.clone();
        manifest.commit = plan.commit.clone();
        manifest
    }

    /// Records `file` as verified in place.
    pub(super) fn record(&mut self, file: &RemoteFile) {
        self.files.insert(file.path.clone(), ManifestEntry { size: file.size, digest: file.digest.clone() });
    }

    /// The manifest, or an empty one when it is missing or unreadable (files are then
    /// verified by hashing them).
    fn read(dir: &Path) -> Self {
        fs::read(dir.join(MANIFEST_NAME)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    /// Whether `file` was verified at `path` by an earlier run and is still its size.
    pub(super) fn has(&self, file: &RemoteFile, path: &Path) -> bool {
        let entry = ManifestEntry { size: file.size, digest: file.digest.clone() };
        self.files.get(&file.path) == Some(&entry)
            && fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == file.size)
    }

    pub(super) fn write(&self, dir: &Path) -> Result<(), HubError> {
        let tmp = dir.join(PARTIAL_DIR).join("manifest.json.tmp");
        let text = serde_json::to_string_pretty(self).expect("a manifest serializes");
        fs::write(&tmp, text).map_err(io_err(&tmp))?;
        let path = dir.join(MANIFEST_NAME);
        fs::rename(&tmp, &path).map_err(io_err(&path))
    }
}
