//! The `strata` binary as a user runs it.

use crate::support;

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

    // Settings out of range are usage errors (exit 2, as clap's own), also where only the
    // command can judge them.
    for (args, named) in [
        (&["--top-p", "1.5"][..], "top_p"),
        (&["--temperature", "NaN"], "temperature"),
        (&["--prefetch-depth", "0"], "--prefetch-depth"),
        (&["--threads", "100000"], "--threads"),
        (&["--raw", "--system", "Be brief."], "--system has no effect with --raw"),
        (&["--cpu-moe", "--n-cpu-moe", "2"], "'--cpu-moe[=<BOOL>]' cannot be used with '--n-cpu-moe <N>'"),
        (&["--n-cpu-moe", "abc"], "invalid value 'abc' for '--n-cpu-moe <N>'"),
        (&["--n-cpu-moe=-1"], "invalid value '-1' for '--n-cpu-moe <N>'"),
        (&["--cpu-moe=maybe"], "invalid value 'maybe' for '--cpu-moe[=<BOOL>]'"),
    ] {
        let out = strata(&[&["run", "strata-demo", "-p", "hi", "-n", "1"][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(named), "{args:?}");
    }
    let out = strata(&["bench", "strata-demo", "--ctx-size", "3", "--prompt-tokens", "4", "--gen-tokens", "2"]);
    assert_eq!(out.status.code(), Some(2), "a bench past the context");
    assert!(String::from_utf8_lossy(&out.stderr).contains("context of 3"));

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

/// An error whose cause is part of its own message (a file error: `PATH: CAUSE`) says the
/// cause once, not again after it.
#[test]
fn an_error_says_its_cause_once() {
    let dir = support::TempDir::new("cli-cause-once");
    let flat = dir.path("m.flat");
    let out = strata(&["convert", &fixture("llama3"), flat.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(flat.join("layer_001.bin")).unwrap();
    let cause = std::io::Error::from_raw_os_error(libc::ENOENT).to_string();
    for args in [&["verify"][..], &["inspect"], &["run", "-p", "hi", "-n", "1"]] {
        let out = strata(&[&args[..1], &[flat.to_str().unwrap()], &args[1..]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("layer_001.bin"), "{args:?}: {err}");
        assert_eq!(err.matches(&cause).count(), 1, "{args:?}: {err}");
    }
}

/// Output that cannot be written (stdout on a full disk) is an error, exit 1, not a panic.
#[cfg(target_os = "linux")]
#[test]
fn a_full_stdout_is_an_error_not_a_panic() {
    let home = support::TempDir::new("cli-dev-full");
    let llama = fixture("llama3");
    for args in [
        &["list"][..],
        &["serve", "--print-config"],
        &["tokenize", "strata-demo", "hello"],
        &["inspect", &llama],
        &["run", "strata-demo", "-p", "hi", "-n", "2"],
    ] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .env("STRATA_HOME", &home.0)
            .env_remove("STRATA_CONFIG")
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("writing to stdout") && !err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `strata serve` writes its PID file under STRATA_HOME; `strata ps` asks that server what
/// it has loaded and `strata stop` stops it (exit 0, PID file removed).
#[test]
fn serve_ps_and_stop_find_the_server_through_its_pid_file() {
    let home = std::env::temp_dir().join(format!("strata-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let bin = env!("CARGO_BIN_EXE_strata");
    let server = Command::new(bin)
        .args(["serve", "--port", "0", "--threads", "1", "--log-format", "json"])
        .env("STRATA_HOME", &home)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid_file = support::wait_for_pid_file(&home);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let with_home = |args: &[&str]| Command::new(bin).args(args).env("STRATA_HOME", &home).output().unwrap();
    // The demo model is loaded at start; poll until the worker reports it.
    let mut listing = String::new();
    while !listing.contains("strata-demo") {
        assert!(std::time::Instant::now() < deadline, "ps never listed the model: {listing}");
        let ps = with_home(&["ps"]);
        assert!(ps.status.success(), "{}", String::from_utf8_lossy(&ps.stderr));
        listing = String::from_utf8_lossy(&ps.stdout).into_owned();
    }
    let stop = with_home(&["stop"]);
    assert!(stop.status.success(), "{}", String::from_utf8_lossy(&stop.stderr));
    let out = server.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(!pid_file.exists());
    // --log-format json: every log line is a JSON object.
    let log = String::from_utf8_lossy(&out.stderr);
    let json_lines = log.lines().filter(|l| l.starts_with('{'));
    assert!(json_lines.clone().count() >= 2, "{log}");
    for line in json_lines {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    let again = with_home(&["stop"]);
    assert!(!again.status.success(), "stop without a server is an error");
    std::fs::remove_dir_all(&home).ok();
}

#[test]
fn tokenize_gives_llama_cpp_ids_for_gguf_files() {
    // The fixtures record llama.cpp's tokenization, special tokens parsed and no BOS
    // added (tools/make_llamacpp_fixtures.py), as `strata tokenize` does without --special.
    let gguf = |f: &str| format!("{}/tests/fixtures/gguf/{f}", env!("CARGO_MANIFEST_DIR"));
    for name in ["qwen2", "llama3", "mistral.f16"] {
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(gguf(&format!("{name}.llamacpp.json"))).unwrap()).unwrap();
        let model = gguf(&format!("{name}.gguf"));
        for case in reference["tokenization"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let out = strata(&["tokenize", model.as_str(), text, "--json"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(got["ids"], case["special"], "{name} {text:?}");
            assert_eq!(got["pieces"].as_array().unwrap().len(), case["special"].as_array().unwrap().len());
        }
        // --special adds what a prompt starts with (llama.cpp's add_bos).
        let out = strata(&["tokenize", model.as_str(), "Hi", "--json", "--special"]);
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let plain: serde_json::Value =
            serde_json::from_slice(&strata(&["tokenize", model.as_str(), "Hi", "--json"]).stdout).unwrap();
        let extra = got["ids"].as_array().unwrap().len() - plain["ids"].as_array().unwrap().len();
        assert_eq!(extra, reference["add_bos"].as_bool().unwrap() as usize, "{name}");
    }
    // One `id<TAB>piece` line per token without --json; a missing model is an error.
    let out = strata(&["tokenize", "strata-demo", "Hello world"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.is_empty());
    assert!(text.lines().all(|l| l.split_once('\t').is_some_and(|(id, _)| id.parse::<u32>().is_ok())));
    let out = strata(&["tokenize", "/no/such/model.gguf", "x"]);
    assert_eq!(out.status.code(), Some(1));
}

/// Two daemons on different ports share one STRATA_HOME (one per GPU, as
/// deploy/README.md describes): both start, each with its own PID file; `strata ps` lists
/// both; `strata stop --port` stops one and `strata stop` the rest. A third started on a
/// port in use fails without touching the others' files.
#[test]
fn two_daemons_share_one_store_and_ps_and_stop_take_a_port() {
    let home = std::env::temp_dir().join(format!("strata-home-two-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let bin = env!("CARGO_BIN_EXE_strata");
    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (a, b) = (free_port(), free_port());
    // Started at the same instant: the old single PID file let both pass its check and
    // the second overwrite the first.
    let serve = |port: u16| {
        Command::new(bin)
            .args(["serve", "--port", &port.to_string(), "--threads", "1"])
            .env("STRATA_HOME", &home)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (mut sa, mut sb) = (serve(a), serve(b));
    let run = home.join("run");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let pid_files = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&run)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".pid"))
            .collect();
        v.sort();
        v
    };
    while pid_files().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "both daemons should write a PID file: {:?}", pid_files());
        assert!(sa.try_wait().unwrap().is_none() && sb.try_wait().unwrap().is_none(), "a daemon exited");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(pid_files(), {
        let mut want = vec![format!("serve-127.0.0.1_{a}.pid"), format!("serve-127.0.0.1_{b}.pid")];
        want.sort();
        want
    });
    let with_home = |args: &[&str]| Command::new(bin).args(args).env("STRATA_HOME", &home).output().unwrap();
    let mut listing = String::new();
    while !(listing.contains(&format!("127.0.0.1:{a}")) && listing.contains(&format!("127.0.0.1:{b}"))) {
        assert!(std::time::Instant::now() < deadline, "ps should list both servers: {listing}");
        let ps = with_home(&["ps"]);
        listing = String::from_utf8_lossy(&ps.stdout).into_owned();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let only_b = with_home(&["ps", "--port", &b.to_string()]);
    let text = String::from_utf8_lossy(&only_b.stdout);
    assert!(text.contains(&format!("127.0.0.1:{b}")) && text.matches("server pid").count() == 1, "{text}");

    // A third on a port in use: refused, and the others' PID files stay.
    let third = Command::new(bin)
        .args(["serve", "--port", &a.to_string(), "--threads", "1"])
        .env("STRATA_HOME", &home)
        .output()
        .unwrap();
    assert!(!third.status.success());
    assert_eq!(pid_files().len(), 2);

    let stop_a = with_home(&["stop", "--port", &a.to_string()]);
    assert!(stop_a.status.success(), "{}", String::from_utf8_lossy(&stop_a.stderr));
    assert!(sa.wait().unwrap().success());
    assert_eq!(pid_files(), vec![format!("serve-127.0.0.1_{b}.pid")]);
    assert!(sb.try_wait().unwrap().is_none(), "stopping one daemon left the other running");
    let none = with_home(&["stop", "--port", &a.to_string()]);
    assert!(!none.status.success(), "no server is left on that port");
    let stop_all = with_home(&["stop"]);
    assert!(stop_all.status.success(), "{}", String::from_utf8_lossy(&stop_all.stderr));
    assert!(sb.wait().unwrap().success());
    assert!(pid_files().is_empty());
    std::fs::remove_dir_all(&home).ok();
}

/// `strata export`: a GGUF and a one-line report (JSON with `--json`); a format llama.cpp
/// does not read, or an NDSQ setting out of range for `convert`, is a clear error.
#[test]
fn export_writes_a_gguf_and_refuses_what_llama_cpp_cannot_read() {
    let dir = std::env::temp_dir().join(format!("strata-cli-export-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("m.gguf");
    let o = strata(&["export", &fixture("qwen2"), out.to_str().unwrap(), "--quant", "q8_0", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["architecture"].as_str(), report["tokenizer"].as_str()), (Some("qwen2"), Some("gpt2/qwen2")));
    assert!(report["converted"].as_u64().unwrap() > 0 && out.exists());
    let o = strata(&["export", &fixture("qwen2"), dir.join("a.gguf").to_str().unwrap(), "--quant", "affine_q4"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("llama.cpp does not read it"));
    let o = strata(&[
        "convert",
        &fixture("qwen2"),
        dir.join("n.cawsf").to_str().unwrap(),
        "--format",
        "cawsf",
        "--ndsq",
        "--pq-m",
        "3",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pq-m 3"), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `strata route` ranks an NDSQ file's shards for a prompt, the same way each time and
/// within a budget; `--route-budget` runs the model with the shards it keeps; a model
/// without a ROUTING section, or a run without a prompt, is a clear error.
#[test]
fn route_ranks_shards_within_a_budget_and_run_uses_it() {
    let dir = std::env::temp_dir().join(format!("strata-cli-route-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.cawsf");
    let m = model.to_str().unwrap();
    let o = strata(&["convert", &fixture("llama3"), m, "--format", "cawsf", "--ndsq", "--rank", "4", "--pq-k", "16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let args = ["route", m, "-p", "Once upon a time", "--budget", "4KiB", "--components", "R,S", "--json"];
    let (a, b) = (strata(&args), strata(&args));
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(a.stdout, b.stdout, "the same ranking each time");
    let r: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(r["budget_bytes"], 4096);
    assert!(r["kept_bytes"].as_u64().unwrap() <= 4096 && r["kept"].as_u64().unwrap() > 0, "{r}");
    let shards = r["shards"].as_array().unwrap();
    assert!(shards.iter().all(|s| s["component"] == "R" || s["component"] == "S"));
    assert_eq!(shards.iter().filter(|s| s["kept"] == true).count() as u64, r["kept"].as_u64().unwrap());
    let text = strata(&["route", m, "-p", "Once upon a time", "--top", "3"]);
    let out = String::from_utf8_lossy(&text.stdout);
    assert_eq!(out.lines().count(), 5, "a header, three shards, the summary:\n{out}");
    let run = strata(&["run", m, "-p", "Hello", "-n", "4", "--temperature", "0", "--route-budget", "25%"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let no_prompt = strata(&["run", m, "-n", "4", "--route-budget", "25%"]);
    assert!(String::from_utf8_lossy(&no_prompt.stderr).contains("give one with --prompt"));
    let plain = strata(&["route", &fixture("llama3"), "-p", "Hello"]);
    assert!(!plain.status.success());
    assert!(String::from_utf8_lossy(&plain.stderr).contains("no ROUTING section"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A text longer than the context is scored in windows of the context, each from an
/// empty cache (the last row of one window predicting the next's first token); one token
/// leaves nothing to score.
#[test]
fn perplexity_past_the_context_scores_windows() {
    let ids: Vec<u32> = (0..40).map(|i| 1 + (i * 37) % 200).collect();
    let write = |name: &str, ids: &[u32]| {
        let path = std::env::temp_dir().join(format!("strata-ppl-{name}-{}.json", std::process::id()));
        std::fs::write(&path, serde_json::to_string(ids).unwrap()).unwrap();
        path
    };
    let logprobs = |ids: &[u32], ctx: &str| -> Vec<f64> {
        let path = write(&format!("{}-{ctx}", ids.len()), ids);
        let out = strata(&[
            "perplexity",
            &fixture("llama3"),
            "--tokens-file",
            path.to_str().unwrap(),
            "--json",
            "--ctx-size",
            ctx,
        ]);
        std::fs::remove_file(&path).ok();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let windowed = logprobs(&ids, "16");
    assert_eq!(windowed.len(), 39, "every token after the first is scored");
    let first = logprobs(&ids[..17], "64");
    let second = logprobs(&ids[16..33], "64");
    let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    // Positions 1..=16 are the first window's (the 16th predicted from its last row).
    assert!(close(&windowed[..16], &first[..16]), "{:?} vs {:?}", &windowed[..16], &first[..16]);
    assert!(close(&windowed[16..31], &second[..15]), "{:?} vs {:?}", &windowed[16..31], &second[..15]);
    assert!(!close(&windowed[16..31], &logprobs(&ids, "64")[16..31]), "one long pass differs");

    let one = write("one", &ids[..1]);
    let out = strata(&["perplexity", &fixture("llama3"), "--tokens-file", one.to_str().unwrap()]);
    std::fs::remove_file(&one).ok();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tokens to score"));
}

/// `--draft`: `run` and `bench` speculate (from the context, or with a draft model) and
/// say what was drafted and kept; the answer is the one the model gives without; a draft
/// of another vocabulary is an error naming both models.
#[test]
fn run_and_bench_speculate_with_a_draft() {
    let model = format!("{}/tests/fixtures/gguf/llama3.q4_0.gguf", env!("CARGO_MANIFEST_DIR"));
    let prompt = "one two three four five six seven; one two three four five six seven; one two";
    let run = |extra: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
        cmd.args(["run", &model, "-p", prompt, "-n", "24", "--temperature", "0", "--threads", "1"]);
        cmd.args(extra).env_remove("STRATA_DRAFT");
        if let Some(draft) = env {
            cmd.env("STRATA_DRAFT", draft);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        (out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (plain, quiet) = run(&[], None);
    assert!(!quiet.contains("speculative"), "{quiet}");
    for (extra, env) in [(&["--draft", "ngram"][..], None), (&[], Some("ngram"))] {
        let (text, said) = run(extra, env);
        assert_eq!(text, plain, "{extra:?} {env:?}: the same answer");
        let line = said.lines().find(|l| l.starts_with("speculative ngram (n_max 16, n_min 0, p_min auto): "));
        assert!(line.is_some_and(|l| !l.contains(": 0 drafted")), "{said}");
    }

    let out = strata(&[
        "bench",
        &model,
        "--draft",
        &model,
        "--draft-p-min",
        "0",
        "--draft-max",
        "8",
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "16",
        "--runs",
        "1",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["speculative"];
    assert_eq!((s["kind"].as_str(), s["draft"].as_str()), (Some("draft"), Some("llama3.q4_0")), "{s}");
    assert_eq!((s["n_max"].as_u64(), s["n_min"].as_u64(), s["p_min"].as_f64()), (Some(8), Some(0), Some(0.0)));
    let count = |k: &str| s[k].as_u64().unwrap();
    let (drafted, accepted, steps) = (count("drafted"), count("accepted"), count("steps"));
    // The model drafting for itself, greedy: every draft is kept, up to 9 tokens a pass.
    assert!(drafted > 0 && accepted == drafted, "{s}");
    assert!(steps < 16 && s["tokens_per_step"].as_f64().unwrap() > 1.0, "{s}");
    assert!(s["acceptance_rate"].as_f64() == Some(1.0) && s["draft_seconds"].as_f64().unwrap() > 0.0, "{s}");
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0);
    // Without a draft the object says `off`.
    let out = strata(&["bench", &model, "--prompt-tokens", "8", "--gen-tokens", "4", "--runs", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["speculative"]["kind"].as_str(), v["speculative"]["drafted"].as_u64()), (Some("off"), Some(0)));

    let out = strata(&["run", &model, "--draft", &fixture("gemma"), "-p", "hi", "-n", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("draft model `gemma` cannot draft for `llama3.q4_0`"), "{err}");
    let out = strata(&["run", &model, "--draft-min", "5", "--draft-max", "4", "-p", "hi"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--draft-min 5 is more than --draft-max 4"));
}
