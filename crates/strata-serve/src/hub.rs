//! Downloading models from the Hugging Face hub: the download half of `strata pull
//! hf:ORG/REPO[@REVISION]`.
//!
//! The protocol is the one `huggingface_hub` (the Python library) speaks:
//! - endpoint `$HF_ENDPOINT` or `https://huggingface.co`; token `$HF_TOKEN` (then
//!   `$HUGGING_FACE_HUB_TOKEN`, then the file `huggingface-cli login` writes), sent as
//!   `Authorization: Bearer <token>`;
//! - `GET /api/models/{repo}/revision/{revision}` resolves the revision (branch, tag,
//!   `refs/pr/N` or commit) to a commit sha. Everything after that is fetched at that
//!   commit, so a branch that moves during a pull cannot mix two versions;
//! - `GET /api/models/{repo}/tree/{commit}?recursive=true` lists the files with their
//!   sizes, git blob sha1 (`oid`) and, for LFS files, their SHA-256 (`lfs.oid`). Pages
//!   are chained with `Link: <...>; rel="next"` headers;
//! - `GET /{repo}/resolve/{commit}/{path}` serves a file, usually through redirects to a
//!   CDN (the token is only forwarded to the same host). `Range: bytes=N-` resumes.
//!
//! [`HubClient::plan`] picks the files a model directory needs (see [`select_files`]),
//! [`HubClient::fetch`] downloads them into a directory, [`HubClient::download`] does
//! both. Each file is streamed into `DEST/.partial/NAME.part`, hashed on the way (SHA-256
//! for LFS files, the git blob sha1 for the others), checked against the size and hash
//! the tree reported, and renamed into place. A dropped connection resumes with a
//! `Range` request within the run (with backoff); a later run resumes from the `.part`
//! file and skips files it already verified (recorded in `DEST/.strata-hub.json`).

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use self::http::{Ctx, is_hex, quote};
use self::select::{SINGLE_WEIGHTS, WEIGHTS_INDEX, is_plain_name};
use self::transfer::{Manifest, verify_existing};

/// The public hub, used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The revision of a spec without `@REVISION`.
pub const DEFAULT_REVISION: &str = "main";
/// Written in the destination directory: the repo, commit and verified files.
pub const MANIFEST_NAME: &str = ".strata-hub.json";
/// Where incomplete downloads live inside the destination directory.
pub const PARTIAL_DIR: &str = ".partial";

/// Caps on what the hub's JSON answers may make us hold in memory.
const MAX_JSON_BYTES: u64 = 64 << 20;
const MAX_TREE_PAGES: usize = 10_000;
const CHUNK: usize = 256 << 10;

/// Errors of the hub client. Messages name the URL, repository or file concerned.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{spec}` is not a hub model: {msg} (expected hf:ORG/REPO or hf:ORG/REPO@REVISION)")]
    InvalidSpec { spec: String, msg: String },
    #[error("HF_ENDPOINT `{endpoint}` must be an http:// or https:// URL")]
    InvalidEndpoint { endpoint: String },
    #[error("{url}: HTTP {status}: {msg}")]
    Unauthorized { url: String, status: u16, msg: String },
    #[error("{what} not found on the hub ({url})")]
    NotFound { what: String, url: String },
    #[error("{url}: HTTP {status}{msg}")]
    Http { url: String, status: u16, msg: String },
    #[error("{url}: {msg}")]
    Network { url: String, msg: String },
    #[error("{url}: unexpected answer from the hub: {msg}")]
    BadResponse { url: String, msg: String },
    #[error("hf:{repo}: {msg}")]
    MissingFiles { repo: String, msg: String },
    #[error("{file}: {check} mismatch: expected {expected}, got {actual} (the download was deleted; pull again)")]
    Integrity { file: String, check: &'static str, expected: String, actual: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: another download into this directory is running", dir.display())]
    Busy { dir: PathBuf },
    #[error("download cancelled")]
    Cancelled,
}

impl HubError {
    /// Stable machine-readable kind, for API error bodies and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            HubError::InvalidSpec { .. } => "invalid_spec",
            HubError::InvalidEndpoint { .. } => "invalid_endpoint",
            HubError::Unauthorized { .. } => "unauthorized",
            HubError::NotFound { .. } => "not_found",
            HubError::Http { .. } => "http",
            HubError::Network { .. } => "network",
            HubError::BadResponse { .. } => "bad_response",
            HubError::MissingFiles { .. } => "missing_files",
            HubError::Integrity { .. } => "integrity",
            HubError::Io { .. } => "io",
            HubError::Busy { .. } => "busy",
            HubError::Cancelled => "cancelled",
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> HubError + '_ {
    move |source| HubError::Io { path: path.to_path_buf(), source }
}

/// A repository at a revision (branch, tag, `refs/pr/N` or commit sha).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoRef {
    /// `ORG/NAME` (or a bare legacy `NAME`).
    pub repo: String,
    pub revision: String,
}

impl fmt::Display for RepoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hf:{}@{}", self.repo, self.revision)
    }
}

/// Parses `hf:ORG/REPO[@REVISION]`. The revision defaults to `main`.
pub fn parse_spec(spec: &str) -> Result<RepoRef, HubError> {
    let bad = |msg: &str| HubError::InvalidSpec { spec: spec.to_string(), msg: msg.to_string() };
    let rest = spec.strip_prefix("hf:").ok_or_else(|| bad("it does not start with `hf:`"))?;
    let (repo, revision) = match rest.split_once('@') {
        Some((repo, revision)) => (repo, revision),
        None => (rest, DEFAULT_REVISION),
    };
    check_repo_id(repo).map_err(|msg| bad(&msg))?;
    if revision.is_empty() || revision.len() > 255 || revision.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("the revision after `@` must be a non-empty name without spaces"));
    }
    // Git's rules for ref names, as far as a path is concerned: the revision names a
    // download directory.
    if revision.split('/').any(|part| part.is_empty() || part.starts_with('.')) || revision.contains("..") {
        return Err(bad("the revision after `@` must be a branch, tag or commit name (no empty, `.` or `..` parts)"));
    }
    Ok(RepoRef { repo: repo.to_string(), revision: revision.to_string() })
}

/// The hub's rules for repo ids (huggingface_hub `validate_repo_id`): one or two
/// segments of `[A-Za-z0-9_.-]` that start and end with a letter, digit or `_`, no `--`
/// or `..`, at most 96 characters.
fn check_repo_id(repo: &str) -> Result<(), String> {
    let segments: Vec<&str> = repo.split('/').collect();
    if repo.is_empty() || repo.len() > 96 || segments.len() > 2 {
        return Err(format!("repo id `{repo}` must be ORG/NAME of at most 96 characters"));
    }
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for s in segments {
        let ok = s.chars().all(|c| word(c) || c == '-' || c == '.')
            && s.starts_with(word)
            && s.ends_with(word)
            && !s.contains("--")
            && !s.contains("..");
        if !ok {
            return Err(format!("repo id `{repo}`: `{s}` may only use letters, digits, `_`, `-` and `.`"));
        }
    }
    Ok(())
}

/// How a file's content is checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Digest {
    /// An LFS file: the SHA-256 of its content (lower-case hex).
    Sha256(String),
    /// A file stored in git: its blob id, sha1 of `"blob {len}\0"` + content.
    GitSha1(String),
}

impl Digest {
    /// The hash, lower-case hex.
    pub fn hex(&self) -> &str {
        match self {
            Digest::Sha256(h) | Digest::GitSha1(h) => h,
        }
    }
}

impl fmt::Display for Digest {
    /// `sha256:<hex>` or `git-sha1:<hex>` (the former is an Ollama-style digest).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Digest::Sha256(h) => write!(f, "sha256:{h}"),
            Digest::GitSha1(h) => write!(f, "git-sha1:{h}"),
        }
    }
}

/// A file of a repository at a commit, as the tree API reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    /// Path in the repository (`/`-separated).
    pub path: String,
    pub size: u64,
    pub digest: Digest,
}

/// What [`HubClient::fetch`] downloads: the commit and the files a model needs.
#[derive(Clone, Debug)]
pub struct Plan {
    pub repo: RepoRef,
    /// The commit sha the revision resolved to; every file is fetched at it.
    pub commit: String,
    /// The files to download, weights first.
    pub files: Vec<RemoteFile>,
    /// Paths in the repository that are not downloaded.
    pub skipped: Vec<String>,
}

impl Plan {
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// A completed download.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub repo: RepoRef,
    pub commit: String,
    /// The model directory (the `dest` given to [`HubClient::fetch`]).
    pub dir: PathBuf,
    pub files: Vec<LocalFile>,
}

/// A verified file of a [`Snapshot`].
#[derive(Clone, Debug)]
pub struct LocalFile {
    /// Where it is on disk.
    pub path: PathBuf,
    pub remote: RemoteFile,
    /// False when a verified copy from an earlier run was kept.
    pub downloaded: bool,
}

/// What a file is doing, for progress reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Hashing a copy already on disk (a `.part` file or a file without a manifest entry).
    Checking,
    /// Bytes arriving: `completed` of `total`.
    Downloading,
    /// Downloaded, verified and in place.
    Done,
    /// A copy from an earlier run was already verified; nothing was downloaded.
    Reused,
}

/// A progress report, sent at least once per phase of each file and once per chunk
/// received. `index` counts from 0 to `count - 1` over the plan's files.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub file: &'a RemoteFile,
    pub index: usize,
    pub count: usize,
    pub phase: Phase,
    pub completed: u64,
    pub total: u64,
}

/// The progress callback. Returning `ControlFlow::Break(())` stops the download with
/// [`HubError::Cancelled`], keeping the partial file for a later resume.
pub type ProgressFn<'a> = dyn FnMut(&Progress<'_>) -> ControlFlow<()> + 'a;

/// How transient failures (dropped connections, timeouts, 5xx, 408, 429) are retried.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts without progress before giving up (a download that receives bytes
    /// starts counting again).
    pub attempts: u32,
    /// The first wait; it doubles after each failure up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 5, initial_backoff: Duration::from_secs(1), max_backoff: Duration::from_secs(16) }
    }
}

impl RetryPolicy {
    fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// A client for one hub endpoint. Cheap to share: it holds a connection pool.
pub struct HubClient {
    endpoint: String,
    token: Option<String>,
    retry: RetryPolicy,
    agent: ureq::Agent,
}

impl fmt::Debug for HubClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubClient")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("retry", &self.retry)
            .finish()
    }
}

impl HubClient {
    /// A client for `endpoint` (trailing `/` ignored) sending `token`, if any, as a
    /// bearer token.
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Self, HubError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
            || endpoint.contains(char::is_whitespace)
        {
            return Err(HubError::InvalidEndpoint { endpoint });
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .user_agent(concat!("strata/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(20)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .build()
            .into();
        let token = token.filter(|t| !t.trim().is_empty()).map(|t| t.trim().to_string());
        Ok(HubClient { endpoint, token, retry: RetryPolicy::default(), agent })
    }

    /// A client configured like `huggingface_hub`: `HF_ENDPOINT`, and the token from
    /// `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, or the file at `HF_TOKEN_PATH` (default
    /// `$HF_HOME/token`, `HF_HOME` defaulting to `$XDG_CACHE_HOME/huggingface` or
    /// `~/.cache/huggingface`).
    pub fn from_env() -> Result<Self, HubError> {
        Self::from_lookup(|key| std::env::var(key).ok().filter(|v| !v.is_empty()))
    }

    fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, HubError> {
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| fs::read_to_string(token_path(&var)?).ok());
        Self::new(&endpoint, token)
    }

    /// Replaces the retry policy (tests use short backoffs).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The commit sha `repo.revision` points at.
    pub fn resolve_commit(&self, repo: &RepoRef) -> Result<String, HubError> {
        #[derive(Deserialize)]
        struct RevisionInfo {
            sha: String,
        }
        let url = format!("{}/api/models/{}/revision/{}", self.endpoint, repo.repo, quote(&repo.revision, false));
        let ctx = Ctx { repo: &repo.repo, revision: &repo.revision, file: None };
        let (info, _): (RevisionInfo, _) = self.get_json(&url, &ctx)?;
        if !is_hex(&info.sha, 40) {
            return Err(HubError::BadResponse { url, msg: format!("`sha` is `{}`, not a commit id", info.sha) });
        }
        Ok(info.sha.to_ascii_lowercase())
    }

    /// Every file of `repo` at `revision` (a commit sha is best: see [`Self::resolve_commit`]).
    pub fn list_files(&self, repo: &str, revision: &str) -> Result<Vec<RemoteFile>, HubError> {
        #[derive(Deserialize)]
        struct Entry {
            #[serde(rename = "type")]
            kind: String,
            path: String,
            #[serde(default)]
            size: u64,
            #[serde(default)]
            oid: String,
            lfs: Option<Lfs>,
        }
        #[derive(Deserialize)]
        struct Lfs {
            oid: String,
            size: u64,
        }
        let ctx = Ctx { repo, revision, file: None };
        let mut url = format!("{}/api/models/{repo}/tree/{}?recursive=true", self.endpoint, quote(revision, false));
        let mut files = Vec::new();
        for _ in 0..MAX_TREE_PAGES {
            let (entries, next): (Vec<Entry>, _) = self.get_json(&url, &ctx)?;
            for e in entries.into_iter().filter(|e| e.kind == "file") {
                let bad = |msg: String| HubError::BadResponse { url: url.clone(), msg: format!("`{}`: {msg}", e.path) };
                let (size, digest) = match &e.lfs {
                    Some(lfs) if is_hex(&lfs.oid, 64) => (lfs.size, Digest::Sha256(lfs.oid.to_ascii_lowercase())),
                    Some(lfs) => return Err(bad(format!("lfs.oid `{}` is not a SHA-256", lfs.oid))),
                    None if is_hex(&e.oid, 40) => (e.size, Digest::GitSha1(e.oid.to_ascii_lowercase())),
                    None => return Err(bad(format!("oid `{}` is not a git blob id", e.oid))),
                };
                files.push(RemoteFile { path: e.path, size, digest });
            }
            match next {
                Some(next) => url = self.absolute(&next),
                None => return Ok(files),
            }
        }
        Err(HubError::BadResponse { url, msg: format!("the tree listing has more than {MAX_TREE_PAGES} pages") })
    }

    /// Resolves the revision, lists the tree and selects the files to download
    /// ([`select_files`]); fetches the safetensors index when the weights are sharded.
    pub fn plan(&self, repo: &RepoRef) -> Result<Plan, HubError> {
        let commit = self.resolve_commit(repo)?;
        let tree = self.list_files(&repo.repo, &commit)?;
        let index = match tree.iter().find(|f| f.path == WEIGHTS_INDEX) {
            Some(index) if !tree.iter().any(|f| f.path == SINGLE_WEIGHTS) => {
                let bytes = self.fetch_small(&repo.repo, &commit, index)?;
                Some(String::from_utf8(bytes).map_err(|_| HubError::BadResponse {
                    url: self.resolve_url(&repo.repo, &commit, WEIGHTS_INDEX),
                    msg: "the index is not UTF-8".into(),
                })?)
            }
            _ => None,
        };
        let (files, skipped) = select_files(repo, &tree, index.as_deref())?;
        Ok(Plan { repo: repo.clone(), commit, files, skipped })
    }

    /// [`Self::plan`] then [`Self::fetch`].
    pub fn download(&self, repo: &RepoRef, dest: &Path, progress: &mut ProgressFn<'_>) -> Result<Snapshot, HubError> {
        let plan = self.plan(repo)?;
        self.fetch(&plan, dest, progress)
    }

    /// Downloads the plan's files into `dest` (created if needed), resuming partial
    /// files and keeping copies verified by an earlier run. Holds a lock on the
    /// directory while it runs.
    pub fn fetch(&self, plan: &Plan, dest: &Path, progress: &mut ProgressFn<'_>) -> Result<Snapshot, HubError> {
        let partial = dest.join(PARTIAL_DIR);
        fs::create_dir_all(&partial).map_err(io_err(&partial))?;
        let lock_path = partial.join("lock");
        let lock = File::create(&lock_path).map_err(io_err(&lock_path))?;
        if lock.try_lock().is_err() {
            return Err(HubError::Busy { dir: dest.to_path_buf() });
        }
        let mut manifest = Manifest::for_plan(dest, plan);
        let mut out = Vec::with_capacity(plan.files.len());
        for (index, file) in plan.files.iter().enumerate() {
            if !is_plain_name(&file.path) {
                return Err(HubError::BadResponse {
                    url: self.resolve_url(&plan.repo.repo, &plan.commit, &file.path),
                    msg: format!("`{}` is not a plain file name", file.path),
                });
            }
            let mut report = |phase, completed| {
                progress(&Progress { file, index, count: plan.files.len(), phase, completed, total: file.size })
            };
            let path = dest.join(&file.path);
            let downloaded = if manifest.has(file, &path) || verify_existing(file, &path, &mut report)? {
                if report(Phase::Reused, file.size).is_break() {
                    return Err(HubError::Cancelled);
                }
                false
            } else {
                let part = partial.join(format!("{}.part", file.path));
                self.fetch_file(&plan.repo.repo, &plan.commit, file, &part, &mut report)?;
                fs::rename(&part, &path).map_err(io_err(&path))?;
                if report(Phase::Done, file.size).is_break() {
                    return Err(HubError::Cancelled);
                }
                true
            };
            manifest.record(file);
            manifest.write(dest)?;
            out.push(LocalFile { path, remote: file.clone(), downloaded });
        }
        drop(lock);
        // Best effort: a `.part` of a file no longer in the plan is left for the user.
        let _ = fs::remove_file(&lock_path);
        let _ = fs::remove_dir(&partial);
        Ok(Snapshot { repo: plan.repo.clone(), commit: plan.commit.clone(), dir: dest.to_path_buf(), files: out })
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{path}`.
    pub fn resolve_url(&self, repo: &str, revision: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{}/{}", self.endpoint, quote(revision, false), quote(path, true))
    }
}

/// Where `huggingface-cli login` keeps the token.
fn token_path(var: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(path) = var("HF_TOKEN_PATH") {
        return Some(path.into());
    }
    let home = match var("HF_HOME") {
        Some(home) => PathBuf::from(home),
        None => {
            let cache =
                var("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| Some(Path::new(&var("HOME")?).join(".cache")));
            cache?.join("huggingface")
        }
    };
    Some(home.join("token"))
}

mod hash;
mod http;
mod select;
mod transfer;

pub use select::select_files;

#[cfg(test)]
mod tests;
