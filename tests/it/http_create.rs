//! `POST /api/create` and `/api/blobs/{digest}`: a GGUF uploaded as a blob becomes a store
//! model; a Modelfile's template, system message, messages and parameters apply to its
//! requests; bad uploads and requests are 4xx naming the field.

use crate::common;
use crate::support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{app_with, json, post_json, send};
use serde_json::{Value, json};
use sha2::Digest;
use strata::server::ServerConfig;

struct TempHome(std::path::PathBuf);

impl Drop for TempHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn blob(method: &str, digest: &str, body: Vec<u8>) -> Request<Body> {
    Request::builder().method(method).uri(format!("/api/blobs/{digest}")).body(Body::from(body)).unwrap()
}

async fn chat_counts(app: &axum::Router, model: &str, options: Value) -> Value {
    let body = json!({"model": model, "stream": false, "options": options,
        "messages": [{"role": "user", "content": "Hello"}]});
    let (status, _, out) = send(app, post_json("/api/chat", body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    json(&out)
}

#[tokio::test]
async fn blobs_become_models_with_their_modelfile() {
    let home = TempHome(std::env::temp_dir().join(format!("strata-http-create-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&home.0);
    let (app, _) = app_with(ServerConfig { store: Some(home.0.clone()), ..ServerConfig::default() }, 64);
    let gguf = std::fs::read(format!("{}/tests/fixtures/gguf/llama3.q4_0.gguf", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let hex: String = sha2::Sha256::digest(&gguf).iter().map(|b| format!("{b:02x}")).collect();
    let digest = format!("sha256:{hex}");

    // Upload: unknown first, refused under the wrong digest, then stored.
    assert_eq!(send(&app, blob("HEAD", &digest, vec![])).await.0, StatusCode::NOT_FOUND);
    let wrong = format!("sha256:{}", "0".repeat(64));
    let (status, _, out) = send(&app, blob("POST", &wrong, gguf.clone())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&out));
    assert!(json(&out)["error"].as_str().unwrap().contains(&hex), "names the body's digest");
    assert_eq!(send(&app, blob("HEAD", &wrong, vec![])).await.0, StatusCode::NOT_FOUND, "nothing half-written");
    assert_eq!(send(&app, blob("POST", "sha256:xyz", vec![1])).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(send(&app, blob("POST", &digest, gguf.clone())).await.0, StatusCode::CREATED);
    assert_eq!(send(&app, blob("HEAD", &digest, vec![])).await.0, StatusCode::OK);

    // A plain model from the blob, and one with a Modelfile.
    let create = |body: Value| post_json("/api/create", body);
    let (status, _, out) =
        send(&app, create(json!({"model": "plain", "files": {"m.gguf": digest}, "stream": false}))).await;
    assert_eq!((status, json(&out)), (StatusCode::OK, json!({"status": "success"})));
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    let body = json!({"model": "shaped", "files": {"m.gguf": digest}, "template": template,
        "system": "You are terse and kind.", "license": "MIT",
        "messages": [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"}],
        "parameters": {"num_predict": 3, "temperature": 0, "stop": ["zzz"]}});
    let (status, _, out) = send(&app, create(body)).await;
    assert_eq!(status, StatusCode::OK);
    let lines: Vec<Value> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(json).collect();
    assert_eq!(lines.last().unwrap()["status"], "success", "{lines:?}");

    let show = json(&send(&app, post_json("/api/show", json!({"model": "shaped"}))).await.2);
    assert_eq!(show["template"], template);
    assert_eq!(show["license"], "MIT");
    let mf = show["modelfile"].as_str().unwrap();
    assert!(
        mf.contains("SYSTEM \"\"\"You are terse and kind.\"\"\"") && mf.contains("MESSAGE user \"\"\"One\"\"\""),
        "{mf}"
    );
    assert!(show["parameters"].as_str().unwrap().contains("num_predict"), "{show}");

    // The template, system message and messages make the prompt; the parameters are the
    // defaults (the request's own options win).
    let plain = chat_counts(&app, "plain", json!({"num_predict": 3, "temperature": 0})).await;
    let shaped = chat_counts(&app, "shaped", json!({})).await;
    assert_eq!(shaped["eval_count"], 3, "num_predict from the Modelfile: {shaped}");
    let tok = |s: &str| s.len();
    let expected = "<system>You are terse and kind.<user>One<assistant>Two<user>Hello<assistant>";
    assert!(shaped["prompt_eval_count"].as_u64().unwrap() as usize <= tok(expected), "{shaped}");
    assert_ne!(shaped["prompt_eval_count"], plain["prompt_eval_count"]);
    let own = chat_counts(&app, "shaped", json!({"num_predict": 1})).await;
    assert_eq!(own["eval_count"], 1, "the request's options win");
    // A conversation with its own system message keeps it.
    let body = json!({"model": "shaped", "stream": false, "options": {"num_predict": 1},
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hello"}]});
    let with_system = json(&send(&app, post_json("/api/chat", body)).await.2);
    assert!(with_system["prompt_eval_count"].as_u64() < shaped["prompt_eval_count"].as_u64(), "{with_system}");

    // From another model: the store's (Modelfile overlaid) and a started-with one.
    let body = json!({"model": "shaped2", "from": "shaped", "system": "Other.", "stream": false});
    assert_eq!(send(&app, create(body)).await.0, StatusCode::OK);
    let show = json(&send(&app, post_json("/api/show", json!({"model": "shaped2"}))).await.2);
    assert_eq!(show["template"], template, "kept from `shaped`");
    assert!(show["modelfile"].as_str().unwrap().contains("SYSTEM \"\"\"Other.\"\"\""));
    let body = json!({"model": "fromhf", "from": "llama3", "system": "Hi.", "stream": false});
    let (status, _, out) = send(&app, create(body)).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    assert_eq!(chat_counts(&app, "fromhf", json!({"num_predict": 1})).await["done"], true);

    // Bad requests name their field.
    let bad = [
        (json!({"files": {"m.gguf": digest}}), "model"),
        (json!({"model": "x"}), "from"),
        (json!({"model": "x", "from": "plain", "files": {"m.gguf": digest}}), "files"),
        (json!({"model": "x", "files": {"m.gguf": "sha256:12"}}), "files"),
        (json!({"model": "x", "files": {"m.gguf": format!("sha256:{}", "a".repeat(64))}}), "files"),
        (json!({"model": "x", "from": "plain", "template": "{{ .System }} {{ .Prompt }}"}), "template"),
        (json!({"model": "x", "from": "plain", "template": "{% for %}"}), "template"),
        (json!({"model": "x", "from": "plain", "parameters": {"temperature": "hot"}}), "parameters"),
        (json!({"model": "x", "from": "plain", "messages": [{"role": "wizard", "content": "a"}]}), "messages[0]"),
        (json!({"model": "x", "from": "plain", "quantize": "q4_K_M"}), "quantize"),
        (json!({"model": "x", "from": "plain", "adapters": {"a": "sha256:00"}}), "adapters"),
        (json!({"model": "x", "modelfile": "FROM plain"}), "modelfile"),
        (json!({"model": "x", "from": "strata-demo"}), "from"),
        (json!({"model": "llama3", "from": "plain"}), "model"),
        (json!({"model": "../x", "from": "plain"}), "model"),
    ];
    for (body, field) in bad {
        let (status, _, out) = send(&app, create(body.clone())).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field) || field == "model", "{body}: {v}");
    }
    let (status, _, _) = send(&app, create(json!({"model": "x", "from": "nope"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A blob the loader would refuse is refused at create (400 naming `files`), before a
/// model is stored; so is a Modelfile whose template fails to render or whose parameters
/// are out of range. Nothing is stored by a refused create.
#[tokio::test]
async fn models_that_cannot_run_are_refused_at_create() {
    use strata::format::gguf::GgufValue;
    let home = TempHome(std::env::temp_dir().join(format!("strata-http-create-bad-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&home.0);
    let (app, _) = app_with(ServerConfig { store: Some(home.0.clone()), ..ServerConfig::default() }, 64);
    let upload = async |bytes: Vec<u8>| {
        let hex: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        let digest = format!("sha256:{hex}");
        assert_eq!(send(&app, blob("POST", &digest, bytes)).await.0, StatusCode::CREATED);
        digest
    };
    let fixture = "tests/fixtures/gguf/llama3.q4_0.gguf";
    let good = std::fs::read(format!("{}/{fixture}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let edited = |key: &str, value: GgufValue| {
        let mut parts = support::gguf::GgufParts::read(fixture);
        parts.set_meta(key.to_string(), value);
        parts.write()
    };
    let broken = [
        ("a file cut short", good[..good.len() - 1000].to_vec()),
        ("a context of 0 tokens", edited("llama.context_length", GgufValue::U32(0))),
        ("no attention heads", edited("llama.attention.head_count", GgufValue::U32(0))),
        ("a RoPE base of 0", edited("llama.rope.freq_base", GgufValue::F32(0.0))),
        ("a NaN epsilon", edited("llama.attention.layer_norm_rms_epsilon", GgufValue::F32(f32::NAN))),
        ("a width its tensors do not have", edited("llama.embedding_length", GgufValue::U32(40))),
    ];
    for (what, bytes) in broken {
        let digest = upload(bytes).await;
        let body = json!({"model": "broken", "files": {"m.gguf": digest}, "stream": false});
        let (status, _, out) = send(&app, post_json("/api/create", body)).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {v}");
        assert!(v["error"].as_str().unwrap().contains("files"), "{what}: {v}");
        let (status, _, _) = send(&app, post_json("/api/show", json!({"model": "broken"}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{what}: nothing stored");
    }

    let digest = upload(good).await;
    let base = json!({"model": "m", "files": {"m.gguf": digest}, "stream": false});
    assert_eq!(send(&app, post_json("/api/create", base)).await.0, StatusCode::OK);
    let bad = [
        (json!({"template": "{{ foo.bar.baz }}"}), "template"),
        (json!({"template": "{{ messages + 5 }}"}), "template"),
        (json!({"template": "{% for i in range(100000000) %}{% endfor %}"}), "template"),
        (json!({"parameters": {"top_p": 5}}), "parameters.top_p"),
        (json!({"parameters": {"num_ctx": 0}}), "parameters.num_ctx"),
        (json!({"parameters": {"num_predict": -7}}), "parameters.num_predict"),
        (json!({"parameters": {"sparse_ffn": "topk=2"}}), "parameters.sparse_ffn"),
    ];
    for (extra, field) in bad {
        let mut body = json!({"model": "x", "from": "m", "stream": false});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, _, out) = send(&app, post_json("/api/create", body.clone())).await;
        let v = json(&out);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field), "{body}: {v}");
    }
    let (status, _, _) = send(&app, post_json("/api/show", json!({"model": "x"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing stored");
    // A template that raises for this conversation only is still a template.
    let raising = "{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}\
        {% for m in messages %}{{ m.content }}{% endfor %}";
    let body = json!({"model": "x", "from": "m", "stream": false, "template": raising});
    assert_eq!(send(&app, post_json("/api/create", body)).await.0, StatusCode::OK);

    // One that renders a plain chat but fails on a message the request sends: that
    // request is a 400 naming the conversation, the plain chat still answers.
    let picky = "{% for m in messages %}{% if m.role == 'tool' %}{{ m.content.nope.deeper }}{% endif %}\
        {{ m.content }}{% endfor %}";
    let body = json!({"model": "picky", "from": "m", "stream": false, "template": picky});
    assert_eq!(send(&app, post_json("/api/create", body)).await.0, StatusCode::OK);
    let opts = json!({"num_predict": 1});
    chat_counts(&app, "picky", opts.clone()).await;
    let messages = json!([{"role": "user", "content": "Hi"}, {"role": "tool", "content": "42"}]);
    let chat = json!({"model": "picky", "stream": false, "options": opts.clone(), "messages": messages});
    let (status, _, out) = send(&app, post_json("/api/chat", chat)).await;
    let v = json(&out);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("cannot render this conversation"), "{v}");
    let openai = json!({"model": "picky", "max_tokens": 1, "messages": messages});
    let (status, _, out) = send(&app, post_json("/v1/chat/completions", openai)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&out));
}

/// A model whose `entry.json` does not read is deleted like any other (not a 500); a
/// server that starts removes what killed uploads left.
#[tokio::test]
async fn a_broken_model_is_deleted_and_a_starting_server_tidies_the_store() {
    let home = TempHome(std::env::temp_dir().join(format!("strata-http-broken-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&home.0);
    let dir = home.0.join("models/library/broken/latest");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("entry.json"), b"{\"format\": ").unwrap();
    let partial = home.0.join("blobs/blob-999999999-0-0.partial");
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    std::fs::write(&partial, b"half an upload").unwrap();
    let (app, _) = app_with(ServerConfig { store: Some(home.0.clone()), ..ServerConfig::default() }, 64);
    assert!(!partial.exists(), "a starting server removes killed uploads");
    let delete = || {
        let body = Body::from(json!({"model": "broken"}).to_string());
        Request::builder().method("DELETE").uri("/api/delete").body(body).unwrap()
    };
    let (status, _, out) = send(&app, delete()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&out));
    assert!(!dir.exists());
    assert_eq!(send(&app, delete()).await.0, StatusCode::NOT_FOUND);
}

/// Unmounts a test's tmpfs when dropped.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// An upload to a full disk is a 507 naming the file; nothing is left behind. Needs a
/// 1 MiB tmpfs (root, and a container that allows `mount`); skipped where there is none
/// (a unit test in `server::ollama::create` covers the mapping without one).
#[tokio::test]
async fn an_upload_to_a_full_disk_is_507_naming_the_file() {
    let home = TempHome(std::env::temp_dir().join(format!("strata-http-full-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&home.0);
    let blobs = home.0.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1M", "tmpfs"])
        .arg(&blobs)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (not root, or the container forbids mount)");
        return;
    }
    let _unmount = Mounted(blobs.clone());
    let (app, _) = app_with(ServerConfig { store: Some(home.0.clone()), ..ServerConfig::default() }, 64);
    let body = vec![7u8; 2 << 20];
    let hex: String = sha2::Sha256::digest(&body).iter().map(|b| format!("{b:02x}")).collect();
    let (status, _, out) = send(&app, blob("POST", &format!("sha256:{hex}"), body)).await;
    let error = json(&out)["error"].as_str().unwrap_or_default().to_string();
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{error}");
    assert!(error.contains(blobs.to_str().unwrap()) && error.contains(".partial"), "{error}");
    assert_eq!(std::fs::read_dir(&blobs).unwrap().count(), 0, "nothing half-written is left");
}
