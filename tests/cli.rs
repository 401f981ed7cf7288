//! The `strata` binary as a user runs it.

use std::io::Write;
use std::process::{Command, Stdio};

fn strata(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("running strata")
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/hf/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn run_on_the_demo_model_is_deterministic_with_a_seed() {
    let args = ["run", "strata-demo", "-p", "Hello", "-n", "12", "--seed", "5", "--threads", "1"];
    let (a, b) = (strata(&args), strata(&args));
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(a.stdout.len() > 1);
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn interactive_chat_reads_turns_from_stdin() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["run", &fixture("llama3"), "-n", "4", "--temperature", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\nand more\n/bye\nnot read\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // One answer line per turn.
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches('\n').count(), 2);
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = strata(&["run", "/no/such/model", "-p", "hi"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/model"));

    let out = strata(&["run", "strata-demo", "-p", "hi", "--top-p", "1.5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));

    let tmp = std::env::temp_dir().join(format!("strata-bad-tokens-{}.json", std::process::id()));
    std::fs::write(&tmp, "[1, 2, 999999]").unwrap();
    let out = strata(&["perplexity", &fixture("qwen2"), "--tokens-file", tmp.to_str().unwrap()]);
    std::fs::remove_file(&tmp).ok();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("999999"));
}

#[test]
fn perplexity_of_a_text_file() {
    let tmp = std::env::temp_dir().join(format!("strata-ppl-text-{}.txt", std::process::id()));
    std::fs::write(&tmp, "The quick brown fox jumps over the lazy dog.").unwrap();
    let out = strata(&["perplexity", &fixture("llama3"), "--file", tmp.to_str().unwrap()]);
    std::fs::remove_file(&tmp).ok();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("tokens ") && text.contains("ppl"), "{text}");
}
