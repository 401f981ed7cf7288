//! The status endpoint and `strata top` (issue 23): a server on a MoE model at a budget
//! where layers and experts stream reports every unit's tier in `/api/strata/status`
//! (and as server-sent events), and `strata top`, driven in tmux as a person runs it,
//! shows the same tier counts.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A server on `qwen3_moe_mixed` (4 layers, one of them routing to 8 experts) with
/// 150 KB of budget: the first and last layers stay in memory, the two between and the
/// experts stream. Killed on drop.
struct Server {
    child: Child,
    home: std::path::PathBuf,
    addr: String,
    key: Option<String>,
}

impl Server {
    fn start(tag: &str) -> Server {
        Server::start_with(tag, &[])
    }

    /// With `extra` arguments to `strata serve` (`--api-key K` is then sent as the key).
    fn start_with(tag: &str, extra: &[&str]) -> Server {
        let home = std::env::temp_dir().join(format!("strata-status-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        let model = format!("{}/tests/fixtures/hf/qwen3_moe_mixed", env!("CARGO_MANIFEST_DIR"));
        let child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["serve", "-m", &model, "--port", "0", "--threads", "1", "--memory-budget", "150K"])
            .args(extra)
            .env("STRATA_HOME", &home)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid: Value =
            serde_json::from_str(&std::fs::read_to_string(support::wait_for_pid_file(&home)).unwrap()).unwrap();
        let addr = pid["addr"].as_str().unwrap().to_string();
        let key = extra.iter().position(|a| *a == "--api-key").map(|i| extra[i + 1].to_string());
        let s = Server { child, home, addr, key };
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
        let auth = self.key.as_ref().map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        write!(
            stream,
            "{head}\r\nHost: {}\r\n{auth}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
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
        let body = r#"{"model":"qwen3_moe_mixed","prompt":"Hello there, how are you","stream":false,"options":{"num_predict":8}}"#;
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
    // Four layers (cores), two resident (on the CPU: RAM) and two streamed, and 8 routed
    // experts, none read yet.
    let layer_tiers: Vec<&str> =
        units.iter().filter(|u| u["kind"] == "layer").map(|u| u["tier"].as_str().unwrap()).collect();
    assert_eq!(layer_tiers, ["ram", "storage", "storage", "ram"]);
    // No --draft: no speculation, and nothing drafted.
    assert_eq!((m["speculative"]["kind"].as_str(), m["speculative"]["drafted"].as_u64()), (Some("off"), Some(0)));
    assert_eq!(units.iter().filter(|u| u["kind"] == "expert").count(), 8);
    let counts = tier_counts(&before);
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 12);
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
    let glyph = |u: &Value| match u["tier"].as_str().unwrap() {
        "ram" => 'R',
        "storage" => '.',
        other => panic!("tier {other} on the CPU"),
    };
    let units = status["models"][0]["units"].as_array().unwrap().clone();
    let want: String = units.iter().filter(|u| u["kind"] == "layer").map(glyph).collect();
    let layers = screen.lines().find(|l| l.trim_start().starts_with("layers")).unwrap();
    assert_eq!(layers.split_whitespace().nth(1), Some(want.as_str()), "{screen}");
    assert_eq!(screen.lines().filter(|l| l.trim_start().starts_with("experts")).count(), 1, "{screen}");
}

/// A WebDriver session on headless Chromium (`chromedriver`), spoken to over plain HTTP.
struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

impl Browser {
    fn start() -> Browser {
        for tool in ["chromium", "chromedriver"] {
            assert!(
                Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success()),
                "{tool} is required for this test (Debian: apt install chromium chromium-driver; .ci/run installs them)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut b = Browser { driver, port, session: String::new() };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"]}}}});
        let v = b.call("POST", "/session", &caps);
        b.session = v["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_string();
        b
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let body = if body.is_null() { String::new() } else { body.to_string() };
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        // chromedriver keeps the connection open: read the headers, then Content-Length.
        let mut raw = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = s.read(&mut buf).unwrap();
            raw.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&raw);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                    .and_then(|v| v.parse::<usize>().ok());
                if n == 0 || len.is_some_and(|len| body.len() >= len) {
                    return serde_json::from_str(body).unwrap_or(Value::Null);
                }
            }
            assert!(n > 0, "chromedriver closed the connection: {text}");
        }
    }

    fn open(&self, url: &str) {
        self.call("POST", &format!("/session/{}/url", self.session), &serde_json::json!({ "url": url }));
    }

    fn eval(&self, script: &str) -> Value {
        let v = self.call(
            "POST",
            &format!("/session/{}/execute/sync", self.session),
            &serde_json::json!({"script": script, "args": []}),
        );
        v["value"].clone()
    }

    /// Polls `script` until `done` holds for its value (20 s at most).
    fn wait(&self, what: &str, script: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self.eval(script);
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: the page shows {v}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screenshot(&self, path: &std::path::Path) {
        let v = self.call("GET", &format!("/session/{}/screenshot", self.session), &Value::Null);
        use base64::Engine;
        let png = base64::engine::general_purpose::STANDARD.decode(v["value"].as_str().expect("a screenshot")).unwrap();
        assert!(png.starts_with(b"\x89PNG"));
        // `target/` is not there when CARGO_TARGET_DIR puts the build elsewhere.
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            self.call("DELETE", &format!("/session/{}", self.session), &Value::Null);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The status page in headless Chromium: the residency map has as many cells in each
/// tier as the JSON says, the charts take new points while a generation runs, and the
/// chat box streams a reply with per-token timings, and the model's speculative decoding
/// (n-gram drafts) shows with what it kept. A screenshot goes to
/// `target/status-page.png`. With an API key set, the page asks for it and shows no data.
#[test]
fn the_status_page_draws_the_status_in_a_real_browser() {
    let s = Server::start_with("ui", &["--draft", "ngram"]);
    let b = Browser::start();
    b.open(&format!("http://{}/ui", s.addr));
    let json = s.status();
    for (tier, n) in tier_counts(&json) {
        let script = format!("return document.querySelectorAll('.cell[data-tier={tier}]').length");
        b.wait(&format!("{n} {tier} cells"), &script, |v| v.as_u64() == Some(n));
    }
    // Charts: points accumulate once a second; a generation's reads show in the bytes chart.
    let points = "return Number(document.querySelector('[data-chart=bytes]').getAttribute('data-points'))";
    let before = b.wait("chart points", points, |v| v.as_u64() >= Some(2)).as_u64().unwrap();
    let during = std::thread::scope(|scope| {
        let h = scope.spawn(|| s.generate());
        let during = b.wait("more chart points", points, |v| v.as_u64() > Some(before));
        h.join().unwrap();
        during
    });
    assert!(during.as_u64() > Some(before));
    b.wait(
        "storage reads in the chart",
        "return Number(document.querySelector('[data-chart=bytes]').getAttribute('data-max'))",
        |v| v.as_f64().is_some_and(|x| x > 0.0),
    );
    // The chat box streams a reply, each token with its milliseconds.
    b.wait("the chat box", "return document.getElementById('chatmodel').options.length", |v| v.as_u64() >= Some(1));
    b.eval(
        "document.getElementById('prompt').value = 'Hello there'; document.getElementById('send').click(); return 0",
    );
    b.wait("a streamed reply", "return document.getElementById('replystats').textContent", |v| {
        v.as_str().is_some_and(|t| t.contains("tokens in"))
    });
    let toks = b.eval("return [...document.querySelectorAll('#reply .tok sub')].map(e => e.textContent)");
    let toks = toks.as_array().unwrap();
    assert!(!toks.is_empty() && toks.iter().all(|t| t.as_str().unwrap().ends_with("ms")), "{toks:?}");
    let spec = s.status()["models"][0]["speculative"].clone();
    assert_eq!(spec["kind"], "ngram", "{spec}");
    let want = format!("{} of {} drafted kept", spec["accepted"], spec["drafted"]);
    b.wait("the speculative decoding", "return document.querySelector('[data-speculative=ngram]').textContent", |v| {
        v.as_str().is_some_and(|t| t.starts_with("speculative ngram (n_max 16): ") && t.contains(&want))
    });
    // A model with its routed experts split between the GPU and the CPU (only on a GPU,
    // so given to the page's drawing here): its mode and counters, and a row per place
    // with a column per MoE layer.
    let split = b.eval(
        "const sec = document.querySelector('section.model'); drawSplit(sec, {mode: {n_cpu_moe: 1}, \
         plan: {decode: {total_s: 0.0025}, layers: [{layer: 1, in_vram: 0, on_cpu: 7, streamed: 0, from_storage: 1}, \
         {layer: 3, in_vram: 5, on_cpu: 0, streamed: 3, from_storage: 0}]}, steps: {gpu_experts: 40, cpu_experts: 24, \
         bytes_down: 4096, bytes_up: 2048, crossings: 12, cpu_s: 1.5, gpu_wait_s: 0.3, replans: 2}}); \
         const box = sec.querySelector('.split'); \
         return [box.querySelector('[data-split]').textContent, \
                 [...box.querySelectorAll('tr')].map(tr => [...tr.children].map(c => c.textContent).join(' '))]",
    );
    let head = split[0].as_str().unwrap_or_default();
    assert!(
        head.starts_with("experts split n_cpu_moe 1: predicted 2.50 ms/token; computed 40 on the GPU, 24 on the CPU"),
        "{head}"
    );
    assert!(head.contains("rows 4.0 KiB down, 2.0 KiB up in 12 crossings"), "{head}");
    let rows = ["layer 1 3", "in VRAM 0 5", "on CPU 7 0", "streamed 0 3", "storage 1 0"];
    assert_eq!(split[1], serde_json::json!(rows), "{split}");
    // The next status has no split: the table goes.
    b.wait("no split", "return document.querySelectorAll('.split').length", |v| v.as_u64() == Some(0));
    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/status-page.png");
    b.screenshot(&shot);
    drop(s);
    // With a key: the page asks for it and draws nothing until given.
    let locked = Server::start_with("ui-key", &["--api-key", "sesame"]);
    b.open(&format!("http://{}/ui", locked.addr));
    b.wait("the key prompt", "return getComputedStyle(document.getElementById('keyform')).display", |v| v == "block");
    assert_eq!(b.eval("return document.querySelectorAll('.cell').length").as_u64(), Some(0));
    assert_eq!(b.eval("return document.getElementById('server').hidden"), Value::Bool(true));
    b.eval("document.getElementById('key').value = 'sesame'; document.querySelector('#keyf button').click(); return 0");
    b.wait("cells once the key is given", "return document.querySelectorAll('.cell').length", |v| {
        v.as_u64() == Some(12)
    });
}
