//! The status endpoint and `strata top` (issue 23): a server on a MoE model at a budget
//! where layers and experts stream reports every unit's tier in `/api/strata/status`
//! (and as server-sent events), and `strata top`, driven in tmux as a person runs it,
//! shows the same tier counts.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A server on `qwen3_moe` (2 layers of 8 experts) with 100 KB of budget: the layer
/// cores fit, the experts stream. Killed on drop.
struct Server {
    child: Child,
    home: std::path::PathBuf,
    addr: String,
}

impl Server {
    fn start(tag: &str) -> Server {
        let home = std::env::temp_dir().join(format!("strata-status-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        let model = format!("{}/tests/fixtures/hf/qwen3_moe", env!("CARGO_MANIFEST_DIR"));
        let child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["serve", "-m", &model, "--port", "0", "--threads", "1", "--memory-budget", "100K"])
            .env("STRATA_HOME", &home)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid: Value =
            serde_json::from_str(&std::fs::read_to_string(support::wait_for_pid_file(&home)).unwrap()).unwrap();
        let addr = pid["addr"].as_str().unwrap().to_string();
        let s = Server { child, home, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while s.get("/health").0 != 200 {
            assert!(Instant::now() < deadline, "the server never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    /// Status code and body of a request (`Connection: close`).
    fn request(&self, head: &str, body: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            stream,
            "{head}\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        let _ = stream.read_to_string(&mut raw);
        let code = raw.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, raw.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string()))
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.request(&format!("GET {path} HTTP/1.1"), "")
    }

    fn status(&self) -> Value {
        let (code, body) = self.get("/api/strata/status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    fn generate(&self) {
        let body =
            r#"{"model":"qwen3_moe","prompt":"Hello there, how are you","stream":false,"options":{"num_predict":8}}"#;
        let (code, text) = self.request("POST /api/generate HTTP/1.1", body);
        assert_eq!(code, 200, "{text}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// (tier, units) of the model's `tiers`.
fn tier_counts(status: &Value) -> Vec<(String, u64)> {
    status["models"][0]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["tier"].as_str().unwrap().to_string(), t["units"].as_u64().unwrap()))
        .collect()
}

#[test]
fn status_reports_every_unit_by_tier_and_counts_what_a_generation_reads() {
    let s = Server::start("json");
    let before = s.status();
    let m = &before["models"][0];
    let units = m["units"].as_array().unwrap();
    // Two layer cores, resident (CPU: RAM), and 2 x 8 routed experts, none read yet.
    assert_eq!(units.iter().filter(|u| u["kind"] == "layer").count(), 2);
    assert_eq!(units.iter().filter(|u| u["kind"] == "expert").count(), 16);
    let counts = tier_counts(&before);
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 18);
    assert_eq!(counts.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(), ["vram", "pinned", "ram", "storage"]);
    assert!(counts.iter().any(|(t, n)| t == "storage" && *n > 0), "{counts:?}");
    for (tier, n) in &counts {
        let listed = units.iter().filter(|u| u["tier"] == tier.as_str()).count() as u64;
        assert_eq!(listed, *n, "{tier}");
    }
    s.generate();
    let after = s.status();
    let (a, b) = (&before["models"][0]["counters"], &after["models"][0]["counters"]);
    assert!(b["bytes_read"].as_u64() > a["bytes_read"].as_u64(), "experts were read: {b}");
    assert!(after["tokens"]["generated"].as_u64().unwrap() > 0);
    assert!(after["time"].as_f64() > before["time"].as_f64());
    // The events variant sends the same object, first at once.
    let mut stream = TcpStream::connect(&s.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET /api/strata/status/events?interval_ms=200 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 65536];
    while seen.matches("\ndata: ").count() + usize::from(seen.contains("\r\n\r\ndata: ")) < 2 {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the event stream ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("text/event-stream"), "{seen}");
    let first = seen.split("data: ").nth(1).unwrap().lines().next().unwrap();
    let event: Value = serde_json::from_str(first).unwrap();
    assert_eq!(tier_counts(&event).len(), 4);
    let (code, body) = s.get("/api/strata/status/events?interval_ms=1");
    assert_eq!(code, 400, "{body}");
}

#[test]
fn top_in_tmux_shows_the_tier_counts_of_the_json() {
    assert!(
        Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success()),
        "tmux is required for this test (Debian: apt install tmux; .ci/run installs it)"
    );
    let s = Server::start("top");
    s.generate();
    let session = format!("strata-top-{}", std::process::id());
    let cmd =
        format!("STRATA_HOME={} COLUMNS=100 {} top --interval 0.3", s.home.display(), env!("CARGO_BIN_EXE_strata"));
    let tmux = |args: &[&str]| Command::new("tmux").args(args).output().unwrap();
    let _ = tmux(&["kill-session", "-t", &session]);
    let o = tmux(&["new-session", "-d", "-s", &session, "-x", "110", "-y", "40", &cmd]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut screen = String::new();
    while !screen.contains("tiers ") {
        assert!(Instant::now() < deadline, "strata top drew nothing: {screen}");
        std::thread::sleep(Duration::from_millis(200));
        screen = String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned();
    }
    let _ = tmux(&["send-keys", "-t", &session, "C-c", ""]);
    let _ = tmux(&["kill-session", "-t", &session]);
    let status = s.status();
    let line = screen.lines().find(|l| l.trim_start().starts_with("tiers")).unwrap();
    for (tier, n) in tier_counts(&status) {
        assert!(line.contains(&format!("{tier} {n} (")), "`{tier} {n}` not in: {line}\n{screen}");
    }
    // The map: one character per unit, layer cores then each layer's experts.
    let layers = screen.lines().find(|l| l.trim_start().starts_with("layers")).unwrap();
    assert!(layers.trim_end().ends_with("RR"), "{layers}");
    assert_eq!(screen.lines().filter(|l| l.trim_start().starts_with("experts")).count(), 2, "{screen}");
}
