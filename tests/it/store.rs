//! The model store (`strata::store`): imports of each format, list/show/rm/cp, names
//! that try to leave the store, an Ollama store, and the CLI commands on top. Every test
//! has its own `STRATA_HOME` (a temporary directory handed to `Store::open`, or to the
//! binary's environment), so the tests may run in parallel.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;

use support::TempDir;

use strata::model::ModelSource;
use strata::store::{Format, Store, StoreError};

fn gguf_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/llama3.q4_0.gguf")
}

fn hf_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama3")
}

/// Every path under `dir`, relative to it, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            out.push(e.path().strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(root, &e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn a_gguf_file_is_imported_listed_shown_and_loaded() {
    let home = TempDir::new("gguf");
    let store = Store::open(&home.0);
    let m = store.import(&gguf_fixture(), "Tiny:Q4", false).unwrap();
    assert_eq!(m.name.to_string(), "tiny:q4", "names are lower case");
    assert_eq!(m.dir, home.0.join("models/library/tiny/q4"));
    assert_eq!(m.entry.format, Format::Gguf);
    let fixture_meta = std::fs::metadata(gguf_fixture()).unwrap();
    assert_eq!(m.entry.size, fixture_meta.len());
    assert_eq!(m.entry.source, gguf_fixture().canonicalize().unwrap().display().to_string());
    let d = m.entry.details.as_ref().expect("details from the GGUF header");
    assert_eq!((d.architecture.as_str(), d.quantization.as_str(), d.context_length), ("llama", "Q4_0", Some(512)));
    assert!(d.parameter_count > 100_000, "{d:?}");

    let path = store.resolve("tiny:q4").unwrap();
    assert_eq!(path, m.dir.join("model.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(gguf_fixture()).unwrap());
    if std::fs::metadata(&path).unwrap().dev() == fixture_meta.dev() {
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), fixture_meta.ino(), "hard-linked on one filesystem");
    }
    let entry: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.dir.join("entry.json")).unwrap()).unwrap();
    assert_eq!(entry["format"], "gguf");
    assert!(entry["imported_at"].as_str().unwrap().parse::<jiff::Timestamp>().is_ok());

    let listed = store.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name.to_string(), "tiny:q4");
    assert_eq!(store.show("TINY:q4").unwrap().entry, m.entry);
    assert!(matches!(store.get("tiny"), Err(StoreError::NotFound(n)) if n == "tiny:latest"));

    let source = ModelSource::from_path(path.to_str().unwrap()).unwrap();
    assert!(source.config_json.contains("\"llama\""));
    assert!(!source.tensors.is_empty());
}

#[test]
fn a_hugging_face_directory_is_imported_without_other_weights_or_hidden_files() {
    let home = TempDir::new("hf");
    let src = home.0.join("src/Llama3-HF");
    std::fs::create_dir_all(src.join("original")).unwrap();
    for f in std::fs::read_dir(hf_fixture()).unwrap().flatten() {
        std::fs::copy(f.path(), src.join(f.file_name())).unwrap();
    }
    // A Hugging Face cache snapshot: files are symbolic links into the blobs.
    std::fs::remove_file(src.join("config.json")).unwrap();
    std::os::unix::fs::symlink(hf_fixture().join("config.json"), src.join("config.json")).unwrap();
    for junk in ["original/consolidated.00.pth", "pytorch_model.bin", ".gitattributes"] {
        std::fs::write(src.join(junk), b"not needed").unwrap();
    }
    let store = Store::open(home.0.join("home"));
    let m = store.import(&src, "llama3-hf", false).unwrap();
    assert_eq!(m.entry.format, Format::Safetensors);
    let d = m.entry.details.as_ref().unwrap();
    assert_eq!((d.architecture.as_str(), d.quantization.as_str()), ("llama", "F32"));
    let files = tree(&m.path());
    assert_eq!(
        files,
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    );
    assert!(!std::fs::symlink_metadata(m.path().join("config.json")).unwrap().is_symlink(), "links are followed");
    let want: u64 = std::fs::read_dir(hf_fixture()).unwrap().flatten().map(|f| f.metadata().unwrap().len()).sum();
    assert_eq!(m.entry.size, want);
    let source = ModelSource::from_path(store.resolve("llama3-hf").unwrap().to_str().unwrap()).unwrap();
    assert!(source.tokenizer_json.len() > 100);
}

#[test]
fn an_existing_name_is_replaced_only_when_asked() {
    let home = TempDir::new("replace");
    let store = Store::open(&home.0);
    let first = store.import(&gguf_fixture(), "m", false).unwrap();
    let again = store.import(&hf_fixture(), "m:latest", false);
    assert!(matches!(again, Err(StoreError::Exists(ref n)) if n == "m:latest"), "{again:?}");
    assert_eq!(store.get("m").unwrap().entry, first.entry, "the first model is untouched");
    let second = store.import(&hf_fixture(), "m", true).unwrap();
    assert_eq!(second.entry.format, Format::Safetensors);
    assert_eq!(store.list().unwrap().len(), 1);
    assert!(!store.get("m").unwrap().dir.join("model.gguf").exists(), "nothing of the old model is left");
    assert_eq!(tree(&home.0.join("models/.tmp")), Vec::<String>::new());
}

#[test]
fn copy_and_remove() {
    let home = TempDir::new("cp-rm");
    let store = Store::open(&home.0);
    store.import(&gguf_fixture(), "orig:v1", false).unwrap();
    let copy = store.copy("orig:v1", "team/copy:v2", false).unwrap();
    assert_eq!(copy.name.to_string(), "team/copy:v2");
    assert_eq!(copy.dir, home.0.join("models/team/copy/v2"));
    let orig = store.get("orig:v1").unwrap();
    assert_eq!(
        (copy.entry.source.as_str(), copy.entry.details.as_ref()),
        (orig.entry.source.as_str(), orig.entry.details.as_ref())
    );
    let meta = |p: PathBuf| std::fs::metadata(p).unwrap();
    assert_eq!(meta(copy.path()).ino(), meta(orig.path()).ino(), "a copy is hard links");
    assert!(matches!(store.copy("orig:v1", "team/copy:v2", false), Err(StoreError::Exists(_))));
    assert!(matches!(store.copy("nope", "x", false), Err(StoreError::NotFound(_))));
    assert!(matches!(store.copy("orig:v1", "strata-demo", false), Err(StoreError::InvalidName { .. })));
    let names: Vec<String> = store.list().unwrap().iter().map(|m| m.name.to_string()).collect();
    assert_eq!(names, ["orig:v1", "team/copy:v2"]);

    assert_eq!(store.remove("ORIG:v1").unwrap().to_string(), "orig:v1");
    assert!(matches!(store.remove("orig:v1"), Err(StoreError::NotFound(_))));
    assert!(!home.0.join("models/library").exists(), "empty parents are pruned");
    // The copy still has its files.
    ModelSource::from_path(store.resolve("team/copy:v2").unwrap().to_str().unwrap()).unwrap();
    store.remove("team/copy:v2").unwrap();
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn names_that_try_to_leave_the_store_fail_and_touch_nothing() {
    let home = TempDir::new("traversal");
    let store_home = home.0.join("home");
    let store = Store::open(&store_home);
    store.import(&gguf_fixture(), "good", false).unwrap();
    // Things a bad name might reach.
    std::fs::write(home.0.join("secret"), b"keep").unwrap();
    std::fs::create_dir_all(home.0.join("home/models/library/x")).unwrap();
    let before = tree(&home.0);
    let attempts = [
        "../secret",
        "../../secret",
        "../../../secret:latest",
        "..",
        "..:latest",
        "good:..",
        "good:../../../secret",
        "./good",
        "/etc/passwd",
        "/tmp",
        "library/../../secret",
        "a/b/c",
        "x/..",
        "good\0",
        "good\n",
        "go od",
        "good:",
        ":latest",
        "",
        ".tmp",
        "library/.tmp",
        "-rf",
        "good:la/test",
        "g\\ood",
        "gööd",
    ];
    for name in attempts {
        let invalid = |r: Result<_, StoreError>| matches!(r, Err(StoreError::InvalidName { .. }));
        assert!(invalid(store.import(&gguf_fixture(), name, true).map(|_| ())), "import {name:?}");
        assert!(invalid(store.get(name).map(|_| ())), "get {name:?}");
        assert!(invalid(store.resolve(name).map(|_| ())), "resolve {name:?}");
        assert!(invalid(store.remove(name).map(|_| ())), "remove {name:?}");
        assert!(invalid(store.copy("good", name, true).map(|_| ())), "copy to {name:?}");
        assert!(invalid(store.copy(name, "other", true).map(|_| ())), "copy from {name:?}");
    }
    assert_eq!(tree(&home.0), before, "nothing was created, changed or removed");
    assert_eq!(std::fs::read(home.0.join("secret")).unwrap(), b"keep");
    let e = store.get("../secret").unwrap_err().to_string();
    assert!(e.contains("invalid model name"), "{e}");
}

#[test]
fn failed_and_killed_imports_leave_nothing_that_looks_valid() {
    let home = TempDir::new("failed");
    let store = Store::open(&home.0);
    let not_a_model = home.0.join("notes");
    std::fs::create_dir_all(&not_a_model).unwrap();
    std::fs::write(not_a_model.join("readme.txt"), b"hi").unwrap();
    let e = store.import(&not_a_model, "notes", false).unwrap_err();
    assert!(matches!(e, StoreError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("config.json"), "{e}");
    let fake = home.0.join("fake.gguf");
    std::fs::write(&fake, b"not gguf").unwrap();
    assert!(store.import(&fake, "fake", false).unwrap_err().to_string().contains("GGUF magic"));
    assert!(matches!(store.import(&home.0.join("missing.gguf"), "m", false), Err(StoreError::Io { .. })));
    // A FIFO is refused at once, not opened (which would wait for a writer forever).
    let fifo = home.0.join("fifo.gguf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = store.import(&fifo, "fifo", false).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert!(store.list().unwrap().is_empty());

    // What a killed import leaves: a staging directory of a process that is gone, and a
    // model directory without entry.json.
    let stale = home.0.join("models/.tmp/import-999999999-0-0");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("model.gguf"), b"partial").unwrap();
    let partial = home.0.join("models/library/half/latest");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model.gguf"), b"partial").unwrap();
    assert!(store.list().unwrap().is_empty(), "neither is listed");
    assert!(matches!(store.get("half"), Err(StoreError::NotFound(_))));
    store.import(&gguf_fixture(), "half", false).expect("an incomplete directory is not a model to protect");
    assert!(!stale.exists(), "the next import sweeps what dead processes left");
    assert_eq!(tree(&home.0.join("models/.tmp")), Vec::<String>::new());
    assert_eq!(store.get("half").unwrap().entry.size, std::fs::metadata(gguf_fixture()).unwrap().len());
}

/// An Ollama store as `ollama pull` leaves it: a manifest per name and tag, blobs by digest.
fn fake_ollama(root: &Path, manifest_path: &str, hex: &str, model_size: u64) {
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": format!("sha256:{}", "c".repeat(64)), "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": format!("sha256:{}", "a".repeat(64)), "size": 5},
            {"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{hex}"), "size": model_size},
            {"mediaType": "application/vnd.ollama.image.params", "digest": format!("sha256:{}", "b".repeat(64)), "size": 2},
        ]
    });
    let path = root.join("manifests").join(manifest_path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, manifest.to_string()).unwrap();
}

#[test]
fn a_model_is_imported_from_an_ollama_store() {
    let home = TempDir::new("ollama");
    let ollama = home.0.join("ollama/models");
    let hex = "0123456789abcdef".repeat(4);
    std::fs::create_dir_all(ollama.join("blobs")).unwrap();
    std::fs::copy(gguf_fixture(), ollama.join(format!("blobs/sha256-{hex}"))).unwrap();
    let size = std::fs::metadata(gguf_fixture()).unwrap().len();
    fake_ollama(&ollama, "registry.ollama.ai/library/tiny/q4", &hex, size);
    fake_ollama(&ollama, "registry.ollama.ai/someone/tiny/latest", &hex, size);
    fake_ollama(&ollama, "hf.co/Org/Tiny-GGUF/Q4_0", &hex, size);

    let store = Store::open(home.0.join("home"));
    let m = store.import_ollama(&ollama, "tiny:q4", None, false).unwrap();
    assert_eq!(m.name.to_string(), "tiny:q4", "named as in Ollama");
    assert_eq!(m.entry.format, Format::Gguf);
    assert_eq!(m.entry.source, "ollama:tiny:q4");
    assert_eq!(m.entry.digest.as_deref(), Some(format!("sha256:{hex}").as_str()));
    assert_eq!(m.entry.digest_hex(), hex);
    assert_eq!(m.entry.details.as_ref().unwrap().quantization, "Q4_0");
    let blob = std::fs::metadata(ollama.join(format!("blobs/sha256-{hex}"))).unwrap();
    assert_eq!(std::fs::metadata(m.path()).unwrap().ino(), blob.ino(), "the blob is hard-linked");
    ModelSource::from_path(store.resolve("tiny:q4").unwrap().to_str().unwrap()).unwrap();

    assert_eq!(
        store.import_ollama(&ollama, "someone/tiny", None, false).unwrap().name.to_string(),
        "someone/tiny:latest"
    );
    let hf = store.import_ollama(&ollama, "hf.co/Org/Tiny-GGUF:Q4_0", None, false).unwrap();
    assert_eq!(hf.name.to_string(), "org/tiny-gguf:q4_0", "the host is dropped");
    assert_eq!(store.import_ollama(&ollama, "tiny:q4", Some("mine"), false).unwrap().name.to_string(), "mine:latest");
    assert!(matches!(store.import_ollama(&ollama, "tiny:q4", None, false), Err(StoreError::Exists(_))));

    let missing = store.import_ollama(&ollama, "absent", None, false).unwrap_err();
    assert!(matches!(missing, StoreError::OllamaNotFound { .. }), "{missing}");
    assert!(
        missing.to_string().contains("`absent:latest`") && missing.to_string().contains("OLLAMA_MODELS"),
        "{missing}"
    );
    for bad in ["../tiny", "tiny:../../x", "a/b/c/d", "/etc/passwd"] {
        let e = store.import_ollama(&ollama, bad, None, false).unwrap_err();
        assert!(matches!(e, StoreError::InvalidName { .. }), "{bad}: {e}");
    }
    // A manifest whose digest points elsewhere, one without a model layer, a short blob.
    fake_ollama(&ollama, "registry.ollama.ai/library/evil/latest", "../../../../etc/passwd", 1);
    let e = store.import_ollama(&ollama, "evil", None, false).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }) && e.to_string().contains("64 hex"), "{e}");
    let no_model = ollama.join("manifests/registry.ollama.ai/library/empty/latest");
    std::fs::create_dir_all(no_model.parent().unwrap()).unwrap();
    std::fs::write(&no_model, r#"{"schemaVersion": 2, "layers": []}"#).unwrap();
    let e = store.import_ollama(&ollama, "empty", None, false).unwrap_err();
    assert!(e.to_string().contains("application/vnd.ollama.image.model"), "{e}");
    fake_ollama(&ollama, "registry.ollama.ai/library/short/latest", &hex, size + 1);
    let e = store.import_ollama(&ollama, "short", None, false).unwrap_err();
    assert!(e.to_string().contains("incomplete"), "{e}");
}

// ---------------------------------------------------------------------------------------
// The CLI, through the binary with its own STRATA_HOME.

fn strata(home: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env("STRATA_HOME", home)
        .env("OLLAMA_MODELS", home.join("no-ollama"))
        .output()
        .expect("running strata");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn cli_import_list_show_cp_rm() {
    let home = TempDir::new("cli");
    let h = &home.0;
    let gguf = gguf_fixture();
    let (ok, out, err) = strata(h, &["import", gguf.to_str().unwrap(), "--name", "tiny:q4"]);
    assert!(ok, "{err}");
    assert!(out.contains("imported tiny:q4 (gguf, llama Q4_0"), "{out}");
    let (ok, out, err) = strata(h, &["import", hf_fixture().to_str().unwrap()]);
    assert!(ok && out.contains("imported llama3:latest (safetensors"), "{out}{err}");
    let (ok, _, err) = strata(h, &["import", gguf.to_str().unwrap(), "--name", "tiny:q4"]);
    assert!(!ok && err.contains("already exists") && err.contains("--force"), "{err}");
    let (ok, _, err) = strata(h, &["import", gguf.to_str().unwrap(), "--name", "tiny:q4", "--force"]);
    assert!(ok, "{err}");
    let (ok, _, err) = strata(h, &["import", gguf.to_str().unwrap(), "--name", "../escape"]);
    assert!(!ok && err.contains("invalid model name"), "{err}");
    let (ok, _, err) = strata(h, &["import", "ollama:llama3"]);
    assert!(!ok && err.contains("Ollama has no model `llama3:latest`") && err.contains("OLLAMA_MODELS"), "{err}");

    let (ok, out, _) = strata(h, &["list"]);
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines.len() == 3, "{out}");
    assert!(lines[1].starts_with("llama3:latest") && lines[2].starts_with("tiny:q4"), "{out}");
    let (ok, out, _) = strata(h, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(ok && v.as_array().unwrap().len() == 2, "{out}");
    assert_eq!(v[1]["name"], "tiny:q4");
    assert_eq!(v[1]["format"], "gguf");
    assert_eq!(v[1]["details"]["architecture"], "llama");
    assert!(Path::new(v[1]["path"].as_str().unwrap()).is_file());

    let (ok, out, _) = strata(h, &["show", "tiny:q4"]);
    assert!(ok && out.contains("Q4_0") && out.contains("architecture") && out.contains("model.gguf"), "{out}");
    let (ok, out, _) = strata(h, &["show", "TINY:q4", "--json"]);
    assert!(ok);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["details"]["context_length"], 512);
    // `inspect` and `verify` take store names too.
    let (ok, out, err) = strata(h, &["inspect", "tiny:q4", "--json"]);
    assert!(ok && out.contains("\"gguf\""), "{out}{err}");
    let (ok, _, err) = strata(h, &["verify", "tiny:q4"]);
    assert!(!ok && err.contains("model.gguf: not a format with checksums"), "{err}");
    let (ok, _, err) = strata(h, &["verify", "ghost:v9"]);
    assert!(!ok && err.contains("ghost:v9") && err.contains("strata list"), "{err}");
    let (ok, _, err) = strata(h, &["show", "nope"]);
    assert!(!ok && err.contains("`nope:latest`") && err.contains("strata list"), "{err}");

    let (ok, out, err) = strata(h, &["cp", "tiny:q4", "tiny:copy"]);
    assert!(ok && out.contains("copied 'tiny:q4' to 'tiny:copy'"), "{out}{err}");
    let (ok, _, err) = strata(h, &["cp", "tiny:q4", "tiny:copy"]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let (ok, _, err) = strata(h, &["cp", "missing", "x"]);
    assert!(!ok && err.contains("`missing:latest`") && err.contains("strata list"), "{err}");
    // A model copied onto its own name, however it is written, is refused.
    let (ok, out, err) = strata(h, &["cp", "llama3", "LLAMA3:latest"]);
    assert!(!ok && !out.contains("copied") && err.contains("the same model, `llama3:latest`"), "{out}{err}");

    // A store name is a model SPEC for every command that runs one.
    let (ok, out, err) = strata(h, &["run", "tiny:copy", "-p", "Hello", "-n", "3", "--threads", "1"]);
    assert!(ok && !out.is_empty(), "{err}");
    let (ok, _, err) = strata(h, &["run", "ghost:v9", "-p", "Hello"]);
    assert!(!ok && err.contains("ghost:v9") && err.contains("strata list"), "{err}");

    let (ok, out, err) = strata(h, &["rm", "tiny:q4", "nope"]);
    assert!(!ok && out.contains("deleted 'tiny:q4'") && err.contains("`nope:latest`"), "{out}{err}");
    let (ok, out, _) = strata(h, &["ls"]);
    assert!(ok && !out.contains("tiny:q4\n") && out.contains("tiny:copy"), "{out}");
    let (ok, _, _) = strata(h, &["rm", "tiny:copy", "llama3"]);
    assert!(ok);
    let (ok, out, err) = strata(h, &["list"]);
    assert!(ok && out.lines().count() == 1 && err.contains("strata import"), "{out}{err}");
}

#[test]
fn cli_imports_from_ollama_models() {
    let home = TempDir::new("cli-ollama");
    let ollama = home.0.join("no-ollama"); // the OLLAMA_MODELS `strata()` sets
    let hex = "fe".repeat(32);
    std::fs::create_dir_all(ollama.join("blobs")).unwrap();
    std::fs::copy(gguf_fixture(), ollama.join(format!("blobs/sha256-{hex}"))).unwrap();
    fake_ollama(
        &ollama,
        "registry.ollama.ai/library/tiny/latest",
        &hex,
        std::fs::metadata(gguf_fixture()).unwrap().len(),
    );
    let (ok, out, err) = strata(&home.0, &["import", "ollama:tiny"]);
    assert!(ok && out.contains("imported tiny:latest") && out.contains("ollama:tiny:latest"), "{out}{err}");
    let (ok, out, _) = strata(&home.0, &["show", "tiny", "--json"]);
    assert!(ok);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap()["digest"], format!("sha256:{hex}"));
    let (ok, out, err) = strata(&home.0, &["import", "ollama:tiny", "--name", "other:v1"]);
    assert!(ok && out.contains("imported other:v1"), "{out}{err}");
}

/// An exclusive `flock` on `path` through an open file of its own, as a writer in another
/// process (another PID namespace, say) holds its staging directory.
fn hold(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: flock(2) on a descriptor `f` owns.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    f
}

#[test]
fn the_sweep_keeps_what_a_live_writer_holds_whatever_its_pid() {
    let home = TempDir::new("held");
    let store = Store::open(&home.0);
    // PIDs that this process cannot see: a writer in another PID namespace.
    let tmp = home.0.join("models/.tmp");
    let (held, loose) = (tmp.join("import-999999999-0-0"), tmp.join("import-999999998-0-0"));
    for dir in [&held, &loose] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("model.gguf"), b"in progress").unwrap();
    }
    let lock = hold(&held);
    store.import(&gguf_fixture(), "a", false).unwrap();
    assert!(held.join("model.gguf").exists(), "a held staging directory survives the sweep");
    assert!(!loose.exists(), "one no writer holds is swept");
    drop(lock);
    store.copy("a", "b", false).unwrap();
    assert_eq!(tree(&tmp), Vec::<String>::new(), "swept once its writer is gone");
}

#[test]
fn a_model_whose_entry_does_not_read_can_be_removed() {
    let home = TempDir::new("broken");
    let store = Store::open(&home.0);
    for name in ["broken", "huge"] {
        let m = store.import(&gguf_fixture(), name, false).unwrap();
        std::fs::write(m.dir.join("entry.json"), b"{\"format\": ").unwrap();
    }
    let huge = home.0.join("models/library/huge/latest/entry.json");
    std::fs::write(&huge, vec![b' '; 2 << 20]).unwrap();
    assert!(matches!(store.get("broken"), Err(StoreError::Corrupt { .. })));
    assert_eq!(store.remove("broken").unwrap().to_string(), "broken:latest");
    assert!(!home.0.join("models/library/broken").exists());
    let (ok, out, err) = strata(&home.0, &["rm", "huge"]);
    assert!(ok && out.contains("deleted 'huge:latest'"), "{out}{err}");
    assert!(matches!(store.remove("huge"), Err(StoreError::NotFound(_))));
    assert_eq!(tree(&home.0.join("models")), [".tmp"]);
}

#[test]
fn tidying_removes_killed_uploads_and_old_blobs_no_model_uses() {
    let home = TempDir::new("tidy");
    let store = Store::open(&home.0);
    let blobs = home.0.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let blob = |c: char| blobs.join(format!("sha256-{}", c.to_string().repeat(64)));
    for c in ['a', 'b', 'c'] {
        std::fs::copy(gguf_fixture(), blob(c)).unwrap();
    }
    store.create_from_blob("used", &"a".repeat(64), Default::default()).unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 3600);
    for c in ['a', 'b'] {
        std::fs::File::options().write(true).open(blob(c)).unwrap().set_modified(hour_ago).unwrap();
    }
    let (killed, uploading) = (blobs.join("blob-999999999-0-0.partial"), blobs.join("blob-999999998-0-0.partial"));
    std::fs::write(&killed, b"half").unwrap();
    std::fs::write(&uploading, b"half").unwrap();
    let lock = hold(&uploading);
    let t = store.tidy(std::time::SystemTime::now()).unwrap();
    assert_eq!(t.partials, std::slice::from_ref(&killed));
    assert_eq!(t.blobs, [blob('b')], "used, and recent, blobs are kept");
    assert_eq!(t.blob_bytes, std::fs::metadata(gguf_fixture()).unwrap().len());
    assert!(blob('a').exists() && blob('c').exists() && uploading.exists() && !killed.exists());
    drop(lock);
    // Once the model is gone, so is its blob; a new upload sweeps what the last one left.
    store.remove("used").unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(2 * 3600);
    assert_eq!(store.tidy(later).unwrap().blobs.len(), 2);
    let partial = store.blob_partial().unwrap();
    assert!(!uploading.exists());
    let name = partial.path().to_owned();
    drop(partial);
    assert!(!name.exists(), "an upload that is not kept is removed");
    assert_eq!(tree(&blobs), Vec::<String>::new());
}

/// Waits until a staging directory under `tmp` holds a complete model (`entry.json`): the
/// moment a replacing import publishes. `false`: the import ended first.
fn wait_for_staged_model(tmp: &Path, child: &mut std::process::Child) -> bool {
    loop {
        let entries = std::fs::read_dir(tmp).into_iter().flatten().flatten();
        if entries.into_iter().any(|e| e.path().join("entry.json").exists()) {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_forced_import_killed_mid_way_leaves_the_model_whole() {
    let home = TempDir::new("kill");
    let h = &home.0;
    // The old model is a directory of many files, so removing it takes a while.
    let old = h.join("src/old-hf");
    std::fs::create_dir_all(&old).unwrap();
    for f in std::fs::read_dir(hf_fixture()).unwrap().flatten() {
        std::fs::hard_link(f.path(), old.join(f.file_name())).unwrap();
    }
    for i in 0..2000 {
        std::fs::write(old.join(format!("extra-{i:04}.json")), b"{}").unwrap();
    }
    let (ok, _, err) = strata(h, &["import", old.to_str().unwrap(), "--name", "v"]);
    assert!(ok, "{err}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["import", gguf_fixture().to_str().unwrap(), "--name", "v", "--force"])
        .env("STRATA_HOME", h)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let killed = wait_for_staged_model(&h.join("models/.tmp"), &mut child);
    let _ = child.kill();
    child.wait().unwrap();
    // The next store write sweeps what the killed import left.
    let (ok, _, err) = strata(h, &["cp", "v", "w"]);
    assert!(ok, "killed: {killed}: {err}");
    let (ok, out, err) = strata(h, &["list", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|m| m["name"].as_str()).collect();
    assert!(ok && names == ["v:latest", "w:latest"], "killed: {killed}: {out}{err}");
    let store = Store::open(h);
    ModelSource::from_path(store.resolve("v").unwrap().to_str().unwrap()).expect("whole, old or new");
    assert_eq!(tree(&h.join("models/.tmp")), Vec::<String>::new());
}
