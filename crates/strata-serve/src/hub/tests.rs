use std::collections::HashMap;

use super::*;

fn repo(spec: &str) -> RepoRef {
    parse_spec(spec).unwrap()
}

#[test]
fn specs_parse_with_main_as_the_default_revision() {
    assert_eq!(repo("hf:org/model"), RepoRef { repo: "org/model".into(), revision: "main".into() });
    assert_eq!(repo("hf:org/model@v1.0").revision, "v1.0");
    assert_eq!(repo("hf:org/model@refs/pr/1").revision, "refs/pr/1");
    assert_eq!(repo("hf:Qwen/Qwen2.5-0.5B_x").repo, "Qwen/Qwen2.5-0.5B_x");
    assert_eq!(repo("hf:gpt2").repo, "gpt2");
    assert_eq!(repo("hf:org/model@abc").to_string(), "hf:org/model@abc");
}

#[test]
fn bad_specs_are_rejected_with_the_reason() {
    for (spec, reason) in [
        ("org/model", "does not start with `hf:`"),
        ("hf:", "repo id"),
        ("hf:a/b/c", "ORG/NAME"),
        ("hf:org/mo del", "may only use"),
        ("hf:org/-model", "may only use"),
        ("hf:org/a--b", "may only use"),
        ("hf:org/a..b", "may only use"),
        ("hf:org/model@", "revision"),
        ("hf:org/model@a b", "revision"),
        ("hf:org/model@..", "revision"),
        ("hf:org/model@.", "revision"),
        ("hf:org/model@refs/../x", "revision"),
        ("hf:org/model@a//b", "revision"),
        ("hf:org/model@v1..2", "revision"),
    ] {
        let err = parse_spec(spec).unwrap_err();
        assert_eq!(err.error_type(), "invalid_spec");
        let msg = err.to_string();
        assert!(msg.contains(reason) && msg.contains(spec), "{spec}: {msg}");
    }
    assert!(parse_spec(&format!("hf:org/{}", "a".repeat(100))).is_err());
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let p =
        RetryPolicy { attempts: 9, initial_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(1) };
    let waits: Vec<u128> = (1..=6).map(|n| p.backoff(n).as_millis()).collect();
    assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
    assert_eq!(p.backoff(u32::MAX), Duration::from_secs(1));
}

#[test]
fn environment_lookup_follows_huggingface_hub() {
    let from = |vars: &[(&str, &str)]| {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        HubClient::from_lookup(|k| map.get(k).cloned())
    };
    let c = from(&[]).unwrap();
    assert_eq!(c.endpoint(), DEFAULT_ENDPOINT);
    assert!(!c.has_token());

    let c =
        from(&[("HF_ENDPOINT", "http://mirror:8080/"), ("HF_TOKEN", " hf_a\n"), ("HUGGING_FACE_HUB_TOKEN", "hf_b")])
            .unwrap();
    assert_eq!(c.endpoint(), "http://mirror:8080");
    assert_eq!(c.token.as_deref(), Some("hf_a"));
    assert_eq!(from(&[("HUGGING_FACE_HUB_TOKEN", "hf_b")]).unwrap().token.as_deref(), Some("hf_b"));

    let dir = std::env::temp_dir().join(format!("strata-hub-unit-{}", std::process::id()));
    fs::create_dir_all(dir.join("huggingface")).unwrap();
    fs::write(dir.join("huggingface/token"), "hf_file\n").unwrap();
    let home = dir.to_str().unwrap();
    assert_eq!(from(&[("XDG_CACHE_HOME", home)]).unwrap().token.as_deref(), Some("hf_file"));
    let hf_home = dir.join("huggingface");
    assert_eq!(from(&[("HF_HOME", hf_home.to_str().unwrap())]).unwrap().token.as_deref(), Some("hf_file"));
    let path = dir.join("huggingface/token");
    assert_eq!(from(&[("HF_TOKEN_PATH", path.to_str().unwrap())]).unwrap().token.as_deref(), Some("hf_file"));
    assert_eq!(from(&[("HF_TOKEN", "hf_env"), ("HF_HOME", home)]).unwrap().token.as_deref(), Some("hf_env"));
    fs::remove_dir_all(&dir).unwrap();

    let err = from(&[("HF_ENDPOINT", "huggingface.co")]).unwrap_err();
    assert_eq!(err.error_type(), "invalid_endpoint");
    assert!(err.to_string().contains("HF_ENDPOINT"), "{err}");
}

#[test]
fn debug_output_hides_the_token() {
    let c = HubClient::new("https://hf.co", Some("hf_secret".into())).unwrap();
    let text = format!("{c:?}");
    assert!(!text.contains("hf_secret") && text.contains("redacted"), "{text}");
}

#[test]
fn digests_display_with_their_algorithm() {
    assert_eq!(Digest::Sha256("ab".into()).to_string(), "sha256:ab");
    assert_eq!(Digest::GitSha1("cd".into()).to_string(), "git-sha1:cd");
    assert_eq!(Digest::GitSha1("cd".into()).hex(), "cd");
}

#[test]
fn error_types_are_stable() {
    let e = HubError::Integrity { file: "f".into(), check: "sha256", expected: "a".into(), actual: "b".into() };
    assert_eq!(e.error_type(), "integrity");
    assert_eq!(e.to_string(), "f: sha256 mismatch: expected a, got b (the download was deleted; pull again)");
    assert_eq!(HubError::Cancelled.error_type(), "cancelled");
    assert_eq!(HubError::NotFound { what: "x".into(), url: "u".into() }.error_type(), "not_found");
}
