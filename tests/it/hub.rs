//! `strata::hub` against a local HTTP server that serves a fixture repository in the
//! Hugging Face hub's URL layout: `/api/models/{repo}/revision/{rev}`,
//! `/api/models/{repo}/tree/{rev}?recursive=true` (paginated with `Link` headers) and
//! `/{repo}/resolve/{rev}/{path}` (optionally redirecting LFS files to `/cdn/{sha256}` on
//! another host name, as the hub redirects to its CDN).
//!
//! The repository is built from `tests/fixtures/hf/llama3` (made by
//! `tools/make_fixtures.py`); its tree JSON is computed here from the files: sizes,
//! SHA-256 for the LFS files, git blob sha1 for the others.

use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::Digest as _;
use strata::hub::{HubClient, HubError, Phase, Progress, RetryPolicy, Snapshot, parse_spec};

const REPO: &str = "strata-test/llama3";
const MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const PR1: &str = "fedcba9876543210fedcba9876543210fedcba98";
const TOKEN: &str = "hf_test_token";
/// `generation_config.json` at `refs/pr/1`.
const PR1_GENERATION_CONFIG: &str = "{\"bos_token_id\": 1, \"eos_token_id\": 2, \"pr\": 1}\n";

// ---------------------------------------------------------------------------------------
// The fixture hub.

#[derive(Clone)]
struct RepoFile {
    path: String,
    bytes: Arc<Vec<u8>>,
    lfs: bool,
}

impl RepoFile {
    fn sha256(&self) -> String {
        hex(&sha2::Sha256::digest(&self.bytes[..]))
    }

    fn git_oid(&self) -> String {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", self.bytes.len()).as_bytes());
        h.update(&self.bytes[..]);
        hex(&h.finalize())
    }

    fn tree_entry(&self) -> serde_json::Value {
        let mut e = serde_json::json!({
            "type": "file", "path": self.path, "size": self.bytes.len(), "oid": self.git_oid(),
        });
        if self.lfs {
            e["lfs"] = serde_json::json!({"oid": self.sha256(), "size": self.bytes.len(), "pointerSize": 134});
        }
        e
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Faults and features of the server, changeable while it runs.
#[derive(Default)]
struct Behaviour {
    /// Demand this bearer token on every request but `/cdn/`.
    require_token: Option<String>,
    /// The first response carrying this file sends its headers and only this many bytes.
    cut: Option<(String, usize)>,
    /// Serve this file with one byte changed.
    corrupt: Option<String>,
    /// Serve this file without its last byte (with a matching Content-Length).
    truncate: Option<String>,
    /// Answer `/resolve/` of LFS files with a 302 to `http://localhost:PORT/cdn/{sha256}`.
    redirect_lfs: bool,
    /// Answer Range requests with the whole file (200).
    ignore_range: bool,
    /// Entries per tree page.
    page_size: Option<usize>,
    /// Answer this many requests with 503 first.
    fail_first: usize,
}

#[derive(Clone, Debug)]
struct Logged {
    target: String,
    headers: HashMap<String, String>,
    status: u16,
}

struct Hub {
    port: u16,
    /// Repos by id, then commits by sha.
    repos: HashMap<String, HashMap<String, Vec<RepoFile>>>,
    /// Revision names by repo, to commits.
    refs: HashMap<String, HashMap<String, String>>,
    behaviour: Mutex<Behaviour>,
    log: Mutex<Vec<Logged>>,
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama3")
}

fn file(path: &str, bytes: Vec<u8>, lfs: bool) -> RepoFile {
    RepoFile { path: path.into(), bytes: Arc::new(bytes), lfs }
}

/// The llama3 fixture as a hub repository, plus files Strata must skip.
fn llama3_files() -> Vec<RepoFile> {
    let mut files: Vec<RepoFile> = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
        .iter()
        .map(|name| file(name, std::fs::read(fixture_dir().join(name)).unwrap(), false))
        .collect();
    files.push(file("model.safetensors", std::fs::read(fixture_dir().join("model.safetensors")).unwrap(), true));
    files.push(file(".gitattributes", b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n".to_vec(), false));
    files.push(file("README.md", b"# llama3 fixture\n".to_vec(), false));
    files.push(file("pytorch_model.bin", vec![7; 1000], true));
    files.push(file("original/params.json", b"{}\n".to_vec(), false));
    files
}

impl Hub {
    fn start(behaviour: Behaviour) -> Arc<Hub> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let main = llama3_files();
        let mut pr1 = main.clone();
        for f in &mut pr1 {
            if f.path == "generation_config.json" {
                f.bytes = Arc::new(PR1_GENERATION_CONFIG.as_bytes().to_vec());
            }
        }
        let no_tokenizer: Vec<RepoFile> = main.iter().filter(|f| f.path != "tokenizer.json").cloned().collect();
        let gguf_only: Vec<RepoFile> = main
            .iter()
            .filter(|f| f.path != "model.safetensors")
            .cloned()
            .chain([file("llama3.Q4_K_M.gguf", vec![1; 100], true)])
            .collect();
        let index = r#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors"}}"#;
        let sharded: Vec<RepoFile> = main
            .iter()
            .filter(|f| f.path != "model.safetensors")
            .cloned()
            .chain([
                file("model.safetensors.index.json", index.as_bytes().to_vec(), false),
                file("model-00001-of-00002.safetensors", vec![1; 3000], true),
                file("model-00002-of-00002.safetensors", vec![2; 2000], true),
                file("consolidated.safetensors", vec![3; 5000], true),
            ])
            .collect();
        let hub = Arc::new(Hub {
            port,
            repos: HashMap::from([
                (REPO.to_string(), HashMap::from([(MAIN.to_string(), main), (PR1.to_string(), pr1)])),
                ("strata-test/no-tokenizer".into(), HashMap::from([(MAIN.to_string(), no_tokenizer)])),
                ("strata-test/gguf-only".into(), HashMap::from([(MAIN.to_string(), gguf_only)])),
                ("strata-test/sharded".into(), HashMap::from([(MAIN.to_string(), sharded)])),
            ]),
            refs: HashMap::from([
                (REPO.to_string(), HashMap::from([("main".into(), MAIN.into()), ("refs/pr/1".into(), PR1.into())])),
                ("strata-test/no-tokenizer".into(), HashMap::from([("main".into(), MAIN.into())])),
                ("strata-test/gguf-only".into(), HashMap::from([("main".into(), MAIN.into())])),
                ("strata-test/sharded".into(), HashMap::from([("main".into(), MAIN.into())])),
            ]),
            behaviour: Mutex::new(behaviour),
            log: Mutex::new(Vec::new()),
        });
        let server = hub.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let hub = server.clone();
                std::thread::spawn(move || hub.serve(stream));
            }
        });
        hub
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn client(&self, token: Option<&str>) -> HubClient {
        HubClient::new(&self.url(), token.map(str::to_string)).unwrap().with_retry(RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        })
    }

    fn log(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }

    /// Requests whose target contains `needle`.
    fn requests(&self, needle: &str) -> Vec<Logged> {
        self.log().into_iter().filter(|l| l.target.contains(needle)).collect()
    }

    fn file(&self, repo: &str, commit: &str, path: &str) -> Option<RepoFile> {
        self.repos.get(repo)?.get(commit)?.iter().find(|f| f.path == path).cloned()
    }

    fn serve(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let reply = self.route(&target, &headers);
        self.log.lock().unwrap().push(Logged { target, headers, status: reply.status });
        reply.send(stream);
    }

    fn route(&self, target: &str, headers: &HashMap<String, String>) -> Reply {
        let mut b = self.behaviour.lock().unwrap();
        if b.fail_first > 0 {
            b.fail_first -= 1;
            return Reply::status(503, "busy");
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        if let Some(sha) = path.strip_prefix("/cdn/") {
            let found = self.repos.values().flat_map(|c| c.values().flatten()).find(|f| f.lfs && f.sha256() == sha);
            return match found {
                Some(f) => self.bytes(&mut b, f, headers),
                None => Reply::status(404, "no such blob"),
            };
        }
        if let Some(token) = &b.require_token
            && headers.get("authorization") != Some(&format!("Bearer {token}"))
        {
            return Reply::status(401, "Invalid username or password.")
                .header("X-Error-Message", "Invalid credentials in Authorization header");
        }
        let segments: Vec<String> = path.trim_start_matches('/').split('/').map(percent_decode).collect();
        let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
        match seg.as_slice() {
            ["api", "models", org, name, "revision", rev] => self.revision(&format!("{org}/{name}"), rev),
            ["api", "models", org, name, "tree", rev] => self.tree(&b, &format!("{org}/{name}"), rev, query),
            [org, name, "resolve", rev, rest @ ..] => {
                let repo = format!("{org}/{name}");
                let Some(commit) = self.commit(&repo, rev) else { return repo_or_revision_missing(self, &repo) };
                let Some(f) = self.file(&repo, &commit, &rest.join("/")) else {
                    return Reply::status(404, "Entry not found").header("X-Error-Code", "EntryNotFound");
                };
                if f.lfs && b.redirect_lfs {
                    let location = format!("http://localhost:{}/cdn/{}", self.port, f.sha256());
                    return Reply::status(302, "").header("Location", &location).header("X-Repo-Commit", &commit);
                }
                let etag = if f.lfs { f.sha256() } else { f.git_oid() };
                self.bytes(&mut b, &f, headers).header("X-Repo-Commit", &commit).header("ETag", &format!("\"{etag}\""))
            }
            _ => Reply::status(404, "no route"),
        }
    }

    fn commit(&self, repo: &str, rev: &str) -> Option<String> {
        let commits = self.repos.get(repo)?;
        match commits.contains_key(rev) {
            true => Some(rev.to_string()),
            false => self.refs.get(repo)?.get(rev).cloned(),
        }
    }

    fn revision(&self, repo: &str, rev: &str) -> Reply {
        let Some(commit) = self.commit(repo, rev) else { return repo_or_revision_missing(self, repo) };
        let siblings: Vec<_> =
            self.repos[repo][&commit].iter().map(|f| serde_json::json!({"rfilename": f.path})).collect();
        Reply::json(&serde_json::json!({"id": repo, "sha": commit, "siblings": siblings}))
    }

    fn tree(&self, b: &Behaviour, repo: &str, rev: &str, query: &str) -> Reply {
        let Some(commit) = self.commit(repo, rev) else { return repo_or_revision_missing(self, repo) };
        if !query.contains("recursive=true") {
            return Reply::status(400, "expected recursive=true");
        }
        let mut entries: Vec<serde_json::Value> = self.repos[repo][&commit].iter().map(RepoFile::tree_entry).collect();
        entries.push(serde_json::json!({"type": "directory", "path": "original", "size": 0, "oid": "0".repeat(40)}));
        let start: usize = query.split('&').find_map(|kv| kv.strip_prefix("cursor=")).map_or(0, |c| c.parse().unwrap());
        let size = b.page_size.unwrap_or(entries.len());
        let end = (start + size).min(entries.len());
        let reply = Reply::json(&serde_json::Value::Array(entries[start..end].to_vec()));
        match end < entries.len() {
            true => {
                let next = format!("{}/api/models/{repo}/tree/{rev}?recursive=true&cursor={end}", self.url());
                reply.header("Link", &format!("<{next}>; rel=\"next\""))
            }
            false => reply,
        }
    }

    /// A file's bytes, honouring Range and the faults.
    fn bytes(&self, b: &mut Behaviour, f: &RepoFile, headers: &HashMap<String, String>) -> Reply {
        let mut bytes = f.bytes.to_vec();
        if b.corrupt.as_deref() == Some(f.path.as_str()) {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x55;
        }
        if b.truncate.as_deref() == Some(f.path.as_str()) {
            bytes.pop();
        }
        let total = bytes.len();
        let range =
            headers.get("range").and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse::<usize>().ok());
        let mut reply = match range {
            Some(start) if !b.ignore_range && start < total => {
                let end = total - 1;
                Reply {
                    status: 206,
                    headers: vec![("Content-Range".into(), format!("bytes {start}-{end}/{total}"))],
                    body: bytes[start..].to_vec(),
                    cut: None,
                }
            }
            _ => Reply { status: 200, headers: vec![], body: bytes, cut: None },
        };
        if let Some((path, n)) = &b.cut
            && *path == f.path
        {
            reply.cut = Some(*n);
            b.cut = None;
        }
        reply.header("Accept-Ranges", "bytes")
    }
}

fn repo_or_revision_missing(hub: &Hub, repo: &str) -> Reply {
    match hub.repos.contains_key(repo) {
        true => Reply::status(404, "Invalid rev id").header("X-Error-Code", "RevisionNotFound"),
        false => Reply::status(404, "Repository not found").header("X-Error-Code", "RepoNotFound"),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Close the connection after this many body bytes.
    cut: Option<usize>,
}

impl Reply {
    fn status(status: u16, msg: &str) -> Reply {
        Reply { status, headers: vec![], body: msg.as_bytes().to_vec(), cut: None }
    }

    fn json(v: &serde_json::Value) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: v.to_string().into_bytes(),
            cut: None,
        }
    }

    fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }

    fn send(self, mut stream: TcpStream) {
        let mut head =
            format!("HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n", self.status, self.body.len());
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let body = match self.cut {
            Some(n) => &self.body[..n],
            None => &self.body[..],
        };
        let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body)).and_then(|_| stream.flush());
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-hub-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

const DOWNLOADED: [&str; 5] =
    ["model.safetensors", "config.json", "tokenizer.json", "generation_config.json", "tokenizer_config.json"];

/// A progress report: file, phase, completed, total.
type Event = (String, Phase, u64, u64);

/// Downloads `spec` into `dest`, recording the progress reports.
fn pull(client: &HubClient, spec: &str, dest: &Path) -> (Result<Snapshot, HubError>, Vec<Event>) {
    let mut events = Vec::new();
    let mut progress = |p: &Progress<'_>| {
        events.push((p.file.path.clone(), p.phase, p.completed, p.total));
        ControlFlow::Continue(())
    };
    let result = client.download(&parse_spec(spec).unwrap(), dest, &mut progress);
    (result, events)
}

fn assert_identical_to_fixture(dest: &Path) {
    for name in DOWNLOADED {
        let got = std::fs::read(dest.join(name)).unwrap();
        let want = std::fs::read(fixture_dir().join(name)).unwrap();
        assert!(got == want, "{name} differs from the fixture");
    }
}

// ---------------------------------------------------------------------------------------
// Tests.

#[test]
fn full_download_matches_the_fixture_loads_and_reruns_without_downloading() {
    let hub = Hub::start(Behaviour { page_size: Some(4), ..Behaviour::default() });
    let dest = temp_dir("full");
    let (snapshot, events) = pull(&hub.client(None), &format!("hf:{REPO}"), &dest);
    let snapshot = snapshot.unwrap();
    assert_eq!(snapshot.commit, MAIN);
    assert_eq!(snapshot.dir, dest);
    let mut names: Vec<&str> = snapshot.files.iter().map(|f| f.remote.path.as_str()).collect();
    assert_eq!(names.remove(0), "model.safetensors", "weights come first");
    assert!(snapshot.files.iter().all(|f| f.downloaded && f.path == dest.join(&f.remote.path)));
    assert_identical_to_fixture(&dest);
    for skipped in ["README.md", ".gitattributes", "pytorch_model.bin", "original", ".partial"] {
        assert!(!dest.join(skipped).exists(), "{skipped} should not be in the model directory");
    }
    assert!(hub.requests("pytorch_model.bin").is_empty() && hub.requests("README").is_empty());
    assert!(dest.join(strata::hub::MANIFEST_NAME).is_file());
    // The tree was listed at the resolved commit, over several pages.
    assert!(hub.requests(&format!("/tree/{MAIN}?recursive=true")).len() >= 3);
    assert!(hub.requests("/resolve/").iter().all(|r| r.target.contains(MAIN) && r.status == 200));

    // Each file reports its progress up to its size, then Done.
    let size = std::fs::metadata(dest.join("model.safetensors")).unwrap().len();
    let last = events.iter().rev().find(|e| e.0 == "model.safetensors" && e.1 == Phase::Downloading).unwrap();
    assert_eq!((last.2, last.3), (size, size));
    for name in DOWNLOADED {
        assert!(events.iter().any(|e| e.0 == name && e.1 == Phase::Done), "{name}: no Done report");
    }

    let model = strata::model::ModelSource::from_path(dest.to_str().unwrap()).unwrap();
    assert!(!model.tensors.is_empty());

    // A second run reuses everything.
    let resolves = hub.requests("/resolve/").len();
    let (again, events) = pull(&hub.client(None), &format!("hf:{REPO}"), &dest);
    assert!(again.unwrap().files.iter().all(|f| !f.downloaded));
    assert_eq!(hub.requests("/resolve/").len(), resolves, "nothing downloaded again");
    assert!(events.iter().all(|e| e.1 == Phase::Reused));

    // Without the manifest, files on disk are hashed and kept.
    std::fs::remove_file(dest.join(strata::hub::MANIFEST_NAME)).unwrap();
    let (again, events) = pull(&hub.client(None), &format!("hf:{REPO}"), &dest);
    assert!(again.unwrap().files.iter().all(|f| !f.downloaded));
    assert!(events.iter().any(|e| e.1 == Phase::Checking));
    assert_eq!(hub.requests("/resolve/").len(), resolves);
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn token_is_sent_as_a_bearer_header() {
    let hub = Hub::start(Behaviour { require_token: Some(TOKEN.into()), ..Behaviour::default() });
    let dest = temp_dir("token");
    pull(&hub.client(Some(TOKEN)), &format!("hf:{REPO}"), &dest).0.unwrap();
    assert_identical_to_fixture(&dest);
    let log = hub.log();
    assert!(!log.is_empty());
    for r in &log {
        assert_eq!(r.headers.get("authorization").map(String::as_str), Some("Bearer hf_test_token"), "{}", r.target);
    }

    let err = pull(&hub.client(None), &format!("hf:{REPO}"), &temp_dir("no-token")).0.unwrap_err();
    assert_eq!(err.error_type(), "unauthorized");
    let msg = err.to_string();
    assert!(msg.contains("HF_TOKEN") && msg.contains(REPO) && msg.contains("401"), "{msg}");

    let err = pull(&hub.client(Some("hf_wrong")), &format!("hf:{REPO}"), &temp_dir("bad-token")).0.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("refused the token in HF_TOKEN") && msg.contains("Invalid credentials"), "{msg}");
    std::fs::remove_dir_all(&dest).unwrap();
}

/// Runs in a child process with `HF_ENDPOINT` and `HF_TOKEN` set, so that no test
/// changes this process's environment.
#[test]
fn from_env_reads_hf_endpoint_and_hf_token() {
    if let Ok(want) = std::env::var("STRATA_HUB_TEST_CHILD") {
        let client = HubClient::from_env().unwrap();
        let commit = client.resolve_commit(&parse_spec(&format!("hf:{REPO}")).unwrap()).unwrap();
        assert_eq!(commit, want);
        return;
    }
    let hub = Hub::start(Behaviour { require_token: Some("hf_from_env".into()), ..Behaviour::default() });
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["hub::from_env_reads_hf_endpoint_and_hf_token", "--exact", "--test-threads=1"])
        .env("STRATA_HUB_TEST_CHILD", MAIN)
        .env("HF_ENDPOINT", format!("{}/", hub.url()))
        .env("HF_TOKEN", "hf_from_env")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let revision = hub.requests("/revision/main");
    assert_eq!(revision.len(), 1, "the child asked this server");
    assert_eq!(revision[0].headers["authorization"], "Bearer hf_from_env");
}

#[test]
fn interrupted_download_resumes_with_a_range_request() {
    let size = std::fs::metadata(fixture_dir().join("model.safetensors")).unwrap().len() as usize;
    let half = size / 2;
    let hub = Hub::start(Behaviour { cut: Some(("model.safetensors".into(), half)), ..Behaviour::default() });
    let dest = temp_dir("interrupted");
    let (snapshot, events) = pull(&hub.client(None), &format!("hf:{REPO}"), &dest);
    snapshot.unwrap();
    assert_identical_to_fixture(&dest);
    let requests = hub.requests("/resolve/0123456789abcdef0123456789abcdef01234567/model.safetensors");
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].headers.get("range"), None);
    assert_eq!(requests[1].headers.get("range").map(String::as_str), Some(format!("bytes={half}-").as_str()));
    assert_eq!(requests[1].status, 206);
    // Progress never went backwards.
    let done: Vec<u64> = events.iter().filter(|e| e.0 == "model.safetensors").map(|e| e.2).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn a_partial_file_from_an_earlier_run_is_resumed() {
    let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    for ignore_range in [false, true] {
        let hub = Hub::start(Behaviour { ignore_range, ..Behaviour::default() });
        let dest = temp_dir(&format!("partial-{ignore_range}"));
        std::fs::create_dir_all(dest.join(".partial")).unwrap();
        std::fs::write(dest.join(".partial/model.safetensors.part"), &bytes[..1000]).unwrap();
        let (snapshot, events) = pull(&hub.client(None), &format!("hf:{REPO}"), &dest);
        snapshot.unwrap();
        assert_identical_to_fixture(&dest);
        let requests = hub.requests("/model.safetensors");
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].headers["range"], "bytes=1000-");
        assert_eq!(requests[0].status, if ignore_range { 200 } else { 206 });
        assert!(events.iter().any(|e| e.0 == "model.safetensors" && e.1 == Phase::Checking && e.2 == 1000));
        std::fs::remove_dir_all(&dest).unwrap();
    }
}

#[test]
fn a_cancelled_download_keeps_its_partial_file_and_resumes_later() {
    let hub = Hub::start(Behaviour::default());
    let dest = temp_dir("cancel");
    let mut progress = |p: &Progress<'_>| match p.file.path == "model.safetensors" && p.completed > 0 {
        true => ControlFlow::Break(()),
        false => ControlFlow::Continue(()),
    };
    let repo = parse_spec(&format!("hf:{REPO}")).unwrap();
    let err = hub.client(None).download(&repo, &dest, &mut progress).unwrap_err();
    assert_eq!(err.error_type(), "cancelled");
    let kept = std::fs::metadata(dest.join(".partial/model.safetensors.part")).unwrap().len();
    assert!(kept > 0);
    assert!(!dest.join("model.safetensors").exists());
    pull(&hub.client(None), &format!("hf:{REPO}"), &dest).0.unwrap();
    assert_identical_to_fixture(&dest);
    let last = hub.requests("/model.safetensors").pop().unwrap();
    assert_eq!(last.headers["range"], format!("bytes={kept}-"));
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn a_corrupted_file_is_an_error_naming_it_and_is_not_kept() {
    let hub = Hub::start(Behaviour { corrupt: Some("model.safetensors".into()), ..Behaviour::default() });
    let dest = temp_dir("corrupt");
    let err = pull(&hub.client(None), &format!("hf:{REPO}"), &dest).0.unwrap_err();
    assert_eq!(err.error_type(), "integrity");
    let model = llama3_files().into_iter().find(|f| f.path == "model.safetensors").unwrap();
    let msg = err.to_string();
    assert!(msg.starts_with("model.safetensors: sha256 mismatch: expected ") && msg.contains(&model.sha256()), "{msg}");
    assert!(!dest.join("model.safetensors").exists());
    assert!(!dest.join(".partial/model.safetensors.part").exists());

    // A git file is checked against its blob id; a short one against its size.
    for (name, behaviour, check) in [
        (
            "tokenizer_config.json",
            Behaviour { corrupt: Some("tokenizer_config.json".into()), ..Behaviour::default() },
            "tokenizer_config.json: git blob sha1 mismatch",
        ),
        (
            "tokenizer.json",
            Behaviour { truncate: Some("tokenizer.json".into()), ..Behaviour::default() },
            "/tokenizer.json: the connection closed after",
        ),
    ] {
        let hub = Hub::start(behaviour);
        let dest = temp_dir(&format!("corrupt-{name}"));
        let err = pull(&hub.client(None), &format!("hf:{REPO}"), &dest).0.unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(check), "{msg}");
        assert!(!dest.join(name).exists(), "{name} was left in place");
        let _ = std::fs::remove_dir_all(&dest);
    }
    let _ = std::fs::remove_dir_all(&dest);
}

#[test]
fn missing_repos_and_revisions_are_named() {
    let hub = Hub::start(Behaviour::default());
    let err = pull(&hub.client(None), "hf:nobody/nothing", &temp_dir("missing")).0.unwrap_err();
    assert_eq!(err.error_type(), "not_found");
    assert!(err.to_string().starts_with("repository `nobody/nothing` not found on the hub"), "{err}");
    let err = pull(&hub.client(None), &format!("hf:{REPO}@v9"), &temp_dir("missing-rev")).0.unwrap_err();
    assert!(err.to_string().starts_with(&format!("revision `v9` of `{REPO}` not found")), "{err}");
}

#[test]
fn repos_without_safetensors_or_tokenizer_are_refused() {
    let hub = Hub::start(Behaviour::default());
    let err = pull(&hub.client(None), "hf:strata-test/gguf-only", &temp_dir("gguf")).0.unwrap_err();
    assert_eq!(err.error_type(), "missing_files");
    assert!(err.to_string().contains("model.safetensors") && err.to_string().contains(".gguf"), "{err}");
    let err = pull(&hub.client(None), "hf:strata-test/no-tokenizer", &temp_dir("no-tok")).0.unwrap_err();
    assert!(err.to_string().contains("no tokenizer.json"), "{err}");
    assert!(hub.requests("/resolve/").is_empty(), "nothing downloaded");
}

#[test]
fn a_revision_other_than_main_is_resolved_and_downloaded_at_its_commit() {
    let hub = Hub::start(Behaviour::default());
    let dest = temp_dir("revision");
    let snapshot = pull(&hub.client(None), &format!("hf:{REPO}@refs/pr/1"), &dest).0.unwrap();
    assert_eq!(snapshot.commit, PR1);
    assert_eq!(snapshot.repo.revision, "refs/pr/1");
    assert_eq!(std::fs::read_to_string(dest.join("generation_config.json")).unwrap(), PR1_GENERATION_CONFIG);
    assert_eq!(hub.requests("/revision/refs%2Fpr%2F1").len(), 1);
    assert!(hub.requests("/resolve/").iter().all(|r| r.target.contains(PR1)));

    // Pulling main into the same directory replaces the file that differs.
    let snapshot = pull(&hub.client(None), &format!("hf:{REPO}"), &dest).0.unwrap();
    let changed: Vec<&str> = snapshot.files.iter().filter(|f| f.downloaded).map(|f| f.remote.path.as_str()).collect();
    assert_eq!(changed, ["generation_config.json"]);
    assert_identical_to_fixture(&dest);
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn lfs_files_follow_redirects_without_leaking_the_token() {
    let hub = Hub::start(Behaviour { redirect_lfs: true, require_token: Some(TOKEN.into()), ..Behaviour::default() });
    let dest = temp_dir("redirect");
    pull(&hub.client(Some(TOKEN)), &format!("hf:{REPO}"), &dest).0.unwrap();
    assert_identical_to_fixture(&dest);
    let resolve = hub.requests("/resolve/0123456789abcdef0123456789abcdef01234567/model.safetensors");
    assert_eq!(resolve[0].status, 302);
    let cdn = hub.requests("/cdn/");
    assert_eq!(cdn.len(), 1);
    assert_eq!(cdn[0].status, 200);
    assert_eq!(cdn[0].headers.get("host").map(String::as_str), Some(format!("localhost:{}", hub.port).as_str()));
    assert_eq!(cdn[0].headers.get("authorization"), None, "the token stays with the hub's host");
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn transient_server_errors_are_retried() {
    let hub = Hub::start(Behaviour { fail_first: 2, ..Behaviour::default() });
    let dest = temp_dir("retry");
    pull(&hub.client(None), &format!("hf:{REPO}"), &dest).0.unwrap();
    assert_identical_to_fixture(&dest);
    assert_eq!(hub.log().iter().filter(|r| r.status == 503).count(), 2);

    let hub = Hub::start(Behaviour { fail_first: 100, ..Behaviour::default() });
    let err = pull(&hub.client(None), &format!("hf:{REPO}"), &temp_dir("retry-fail")).0.unwrap_err();
    assert_eq!(err.error_type(), "network");
    let msg = err.to_string();
    assert!(msg.contains("/api/models/strata-test/llama3/revision/main") && msg.contains("HTTP 503"), "{msg}");
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn an_unreachable_endpoint_names_the_url() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let client = HubClient::new(&format!("http://127.0.0.1:{port}"), None).unwrap().with_retry(RetryPolicy {
        attempts: 2,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    });
    let err = pull(&client, &format!("hf:{REPO}"), &temp_dir("unreachable")).0.unwrap_err();
    assert_eq!(err.error_type(), "network");
    assert!(err.to_string().contains(&format!("http://127.0.0.1:{port}/api/models/{REPO}/revision/main")), "{err}");
}

#[test]
fn list_files_reports_sizes_and_digests() {
    let hub = Hub::start(Behaviour { page_size: Some(2), ..Behaviour::default() });
    let files = hub.client(None).list_files(REPO, "main").unwrap();
    let fixture = llama3_files();
    assert_eq!(files.len(), fixture.len(), "every file of every page, no directories");
    for f in &fixture {
        let got = files.iter().find(|g| g.path == f.path).unwrap();
        assert_eq!(got.size, f.bytes.len() as u64);
        let want = if f.lfs { format!("sha256:{}", f.sha256()) } else { format!("git-sha1:{}", f.git_oid()) };
        assert_eq!(got.digest.to_string(), want);
    }
}

#[test]
fn sharded_weights_are_planned_from_the_index() {
    let hub = Hub::start(Behaviour::default());
    let client = hub.client(None);
    let plan = client.plan(&parse_spec("hf:strata-test/sharded").unwrap()).unwrap();
    let names: Vec<&str> = plan.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        names[..3],
        ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    );
    assert!(plan.skipped.iter().any(|s| s == "consolidated.safetensors"));
    assert!(hub.requests("consolidated").is_empty());
    let dest = temp_dir("sharded");
    let snapshot = client.fetch(&plan, &dest, &mut |_: &Progress<'_>| ControlFlow::Continue(())).unwrap();
    assert_eq!(snapshot.files.len(), plan.files.len());
    assert_eq!(std::fs::read(dest.join("model-00002-of-00002.safetensors")).unwrap(), vec![2; 2000]);
    assert!(!dest.join("consolidated.safetensors").exists());
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn a_directory_being_downloaded_into_is_locked() {
    let hub = Hub::start(Behaviour::default());
    let dest = temp_dir("locked");
    std::fs::create_dir_all(dest.join(".partial")).unwrap();
    let held = std::fs::File::create(dest.join(".partial/lock")).unwrap();
    held.lock().unwrap();
    let err = pull(&hub.client(None), &format!("hf:{REPO}"), &dest).0.unwrap_err();
    assert_eq!(err.error_type(), "busy");
    assert!(err.to_string().contains("another download"), "{err}");
    drop(held);
    pull(&hub.client(None), &format!("hf:{REPO}"), &dest).0.unwrap();
    assert_identical_to_fixture(&dest);
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn pulls_land_in_the_store_as_is_or_quantized() {
    use strata::store::Store;
    use strata::store::pull::{PullEvent, default_name, pull_hf};
    let hub = Hub::start(Behaviour::default());
    let home = temp_dir("store");
    let store = Store::open(&home);
    let spec = format!("hf:{REPO}");
    let mut saw = (false, false, false);
    let mut on = |e: PullEvent<'_>| {
        match e {
            PullEvent::Download(_) => saw.0 = true,
            PullEvent::Convert(_) => saw.1 = true,
            PullEvent::Importing => saw.2 = true,
            PullEvent::Listing(_) => {}
        }
        std::ops::ControlFlow::Continue(())
    };
    let plain = pull_hf(&store, &hub.client(None), &spec, None, None, false, &mut on).unwrap();
    let repo = strata::hub::parse_spec(&spec).unwrap();
    assert_eq!(plain.name.to_string(), default_name(&repo, None));
    let quant =
        pull_hf(&store, &hub.client(None), &spec, Some(strata::tensor::DType::Q8_0), None, false, &mut on).unwrap();
    assert!(quant.name.to_string().ends_with(":q8_0"), "{}", quant.name);
    assert_eq!(saw, (true, true, true));
    // Both load by name; the quantized one holds Q8_0 matrices; the downloads are gone.
    let from_store = |name: &str| strata::model::ModelSource::from_path(store.resolve(name).unwrap().to_str().unwrap());
    let m = from_store(&plain.name.to_string()).unwrap();
    assert_eq!(m.tensors["model.layers.0.mlp.up_proj.weight"].dtype, strata::tensor::DType::F32);
    let q = from_store(&quant.name.to_string()).unwrap();
    assert_eq!(q.tensors["model.layers.0.mlp.up_proj.weight"].dtype, strata::tensor::DType::Q8_0);
    assert!(!home.join("downloads/hf").join(REPO).join("main").exists());
    // A taken name is refused before anything is downloaded.
    let before = hub.requests("/resolve/").len();
    let err =
        pull_hf(&store, &hub.client(None), &spec, None, None, false, &mut |_| std::ops::ControlFlow::Continue(()))
            .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(hub.requests("/resolve/").len(), before);

    // The CLI, with the hub and the store from the environment of its own process.
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .env("HF_ENDPOINT", hub.url())
            .env_remove("HF_TOKEN")
            .env("STRATA_HOME", &home)
            .output()
            .unwrap()
    };
    let o = cli(&["pull", &spec, "--name", "cli-pulled:v1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "cli-pulled:v1");
    let o = cli(&["list"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("cli-pulled:v1"));
    let o = cli(&["pull", "llama3"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("hf:ORG/REPO"));
    std::fs::remove_dir_all(&home).unwrap();
}

/// `/api/pull` on a real `strata serve` (its own process, with `HF_ENDPOINT` pointing at
/// the local hub): Ollama's progress lines, the model in `/api/tags` afterwards, and
/// clean 4xx answers for what cannot be pulled.
#[test]
fn api_pull_streams_ollama_progress_into_the_store() {
    let hub = Hub::start(Behaviour::default());
    let home = temp_dir("serve");
    let bin = env!("CARGO_BIN_EXE_strata");
    let mut server = std::process::Command::new(bin)
        .args(["serve", "--port", "0", "--threads", "1"])
        .env("STRATA_HOME", &home)
        .env("HF_ENDPOINT", hub.url())
        .env_remove("HF_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = support::wait_for_pid_file(&home);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pid: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&pid_file).unwrap()).unwrap();
    let base = format!("http://{}", pid["addr"].as_str().unwrap());
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let post = |body: serde_json::Value| {
        let mut r = agent
            .post(&format!("{base}/api/pull"))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        let status = r.status().as_u16();
        let text: String = r.body_mut().read_to_string().unwrap();
        (status, text)
    };

    // Streaming (the default): NDJSON progress ending in success.
    let (status, text) = post(serde_json::json!({ "model": format!("hf:{REPO}") }));
    assert_eq!(status, 200, "{text}");
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.first().unwrap()["status"], "pulling manifest");
    assert_eq!(lines.last().unwrap()["status"], "success", "{text}");
    let mut weights = lines.iter().filter(|l| l["digest"].as_str().is_some_and(|d| d.starts_with("sha256:")));
    let last = weights.next_back().expect("a pulling line for the LFS weights");
    assert_eq!(last["completed"], last["total"]);
    assert!(lines.iter().any(|l| l["status"] == "writing manifest"));
    let tags: serde_json::Value = serde_json::from_str(
        &agent.get(&format!("{base}/api/tags")).call().unwrap().body_mut().read_to_string().unwrap(),
    )
    .unwrap();
    let want = format!("{REPO}:latest");
    assert!(tags["models"].as_array().unwrap().iter().any(|m| m["name"] == want.as_str()), "{tags}");

    // Without streaming, with conversion: one final object.
    let (status, text) =
        post(serde_json::json!({ "model": format!("hf:{REPO}"), "stream": false, "quantize": "q8_0" }));
    assert_eq!((status, text.trim()), (200, r#"{"status":"success"}"#));

    // What cannot be pulled is a 4xx with Ollama's error body.
    for (body, code) in [
        (serde_json::json!({ "model": "llama3" }), 400),
        (serde_json::json!({ "model": "" }), 400),
        (serde_json::json!({ "model": "hf:../x" }), 400),
        (serde_json::json!({ "model": format!("hf:{REPO}"), "quantize": "q3_z" }), 400),
        (serde_json::json!({ "model": "hf:nobody/nothing", "stream": false }), 404),
    ] {
        let (status, text) = post(body.clone());
        assert_eq!(status, code, "{body}: {text}");
        assert!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["error"].is_string(), "{text}");
    }
    // Streaming, a missing repository ends with an error line.
    let (status, text) = post(serde_json::json!({ "model": "hf:nobody/nothing" }));
    assert_eq!(status, 200);
    assert!(text.lines().last().unwrap().contains("\"error\""), "{text}");

    server.kill().unwrap();
    let _ = server.wait();
    std::fs::remove_dir_all(&home).ok();
}
