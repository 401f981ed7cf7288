//! Settings from the config file, the environment and flags, and `strata serve` as a
//! systemd service: readiness notifications, SIGHUP reloads, SIGTERM, journal logs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_strata");

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-config-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `strata` with none of the caller's STRATA_* variables.
fn strata() -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("STRATA_")) {
        cmd.env_remove(k);
    }
    cmd
}

/// `strata serve --print-config ARGS` with only `env` set of the STRATA_* variables.
fn print_config(home: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = strata();
    cmd.arg("serve").arg("--print-config").args(args);
    cmd.env("STRATA_HOME", home).envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `key = value` → (value, source) from `--print-config` output.
fn setting(listing: &str, key: &str) -> (String, String) {
    let line = listing
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key} is not set")))
        .unwrap_or_else(|| panic!("no `{key}` in\n{listing}"));
    let (value, source) = line.split_once(" # ").unwrap();
    let value = value.trim().strip_prefix(&format!("{key} = ")).unwrap_or("(unset)");
    (value.to_string(), source.trim().to_string())
}

fn shipped_config() -> String {
    format!("{}/config/strata.toml", env!("CARGO_MANIFEST_DIR"))
}

/// config/strata.toml names every setting, and its values are the built-in defaults, so
/// serving from it is serving with no config at all.
#[test]
fn the_shipped_config_documents_every_setting_at_its_default() {
    let home = temp_dir("shipped");
    let (ok, defaults, err) = print_config(&home, &[], &[]);
    assert!(ok, "{err}");
    let (ok, shipped, err) = print_config(&home, &["--config", &shipped_config()], &[]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(shipped_config()).unwrap();
    let keys: Vec<&str> = defaults.lines().filter(|l| !l.starts_with("# config file")).collect();
    assert!(keys.len() >= 15, "{defaults}");
    for line in keys {
        let key = line.trim_start_matches("# ").split([' ', '=']).next().unwrap();
        let (default, _) = setting(&defaults, key);
        let (value, source) = setting(&shipped, key);
        assert_eq!(value, default, "config/strata.toml sets `{key}` to something else than its default");
        // Every key is in the file: set, or shown commented out when it has no default.
        let present =
            text.lines().any(|l| l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key} = ")));
        assert!(present, "config/strata.toml does not mention `{key}`");
        if text.lines().any(|l| l.starts_with(&format!("{key} = "))) {
            assert!(source.ends_with("config/strata.toml"), "`{key}` came from {source}");
        }
    }
    std::fs::remove_dir_all(&home).ok();
}

#[test]
fn flags_beat_the_environment_which_beats_the_file_which_beats_the_defaults() {
    let home = temp_dir("precedence");
    let file = home.join("custom.toml");
    std::fs::write(&file, "port = 9000\nthreads = 3\nmemory-budget = \"1GiB\"\nmodel = [\"a=/m/a\", \"b=/m/b\"]\n")
        .unwrap();
    let file_s = file.to_str().unwrap();
    let (ok, out, err) = print_config(
        &home,
        &["--config", file_s, "--threads", "1"],
        &[("STRATA_PORT", "9100"), ("STRATA_MEMORY_BUDGET", "2GiB"), ("STRATA_KEEP_ALIVE", "1h")],
    );
    assert!(ok, "{err}");
    assert_eq!(setting(&out, "threads"), ("1".into(), "command line".into()));
    assert_eq!(setting(&out, "port"), ("9100".into(), "STRATA_PORT".into()));
    assert_eq!(setting(&out, "memory-budget"), ("\"2GiB\"".into(), "STRATA_MEMORY_BUDGET".into()));
    assert_eq!(setting(&out, "keep-alive"), ("\"1h\"".into(), "STRATA_KEEP_ALIVE".into()));
    assert_eq!(setting(&out, "model"), ("[\"a=/m/a\", \"b=/m/b\"]".into(), file_s.to_string()));
    assert_eq!(setting(&out, "queue-depth"), ("64".into(), "default".into()));
    // Lists in the environment are comma-separated.
    let (ok, out, _) = print_config(&home, &["--config", file_s], &[("STRATA_API_KEY", "k1,k2")]);
    assert!(ok);
    assert_eq!(setting(&out, "api-key").0, "[\"k1\", \"k2\"]");
    // STRATA_CONFIG names the file; $STRATA_HOME/strata.toml is found without naming it.
    let (_, out, _) = print_config(&home, &[], &[("STRATA_CONFIG", file_s)]);
    assert_eq!(setting(&out, "port"), ("9000".into(), file_s.to_string()));
    std::fs::copy(&file, home.join("strata.toml")).unwrap();
    let (_, out, _) = print_config(&home, &[], &[]);
    assert_eq!(setting(&out, "threads").0, "3");
    std::fs::remove_dir_all(&home).ok();
}

/// `cpu-moe` and `n-cpu-moe` reach the options a model loads with from the config file
/// and flags (the environment as `--print-config` shows it); the two together are
/// refused wherever they come from.
#[test]
fn the_expert_split_settings_reach_the_run_options() {
    use strata::sched::placement::Mode;
    let home = temp_dir("split");
    let file = home.join("split.toml");
    let split = |text: &str, args: &[&str]| -> Result<Mode, String> {
        std::fs::write(&file, text).unwrap();
        let argv = [&["strata", "--config", file.to_str().unwrap(), "bench", "strata-demo"][..], args].concat();
        let (cli, _) = strata::config::parse(argv).map_err(|e| e.to_string())?;
        let strata::cli::Command::Bench(bench) = cli.command else { panic!("not bench") };
        bench.run.to_options().map(|o| o.expert_split).map_err(|e| e.to_string())
    };
    assert_eq!(split("", &[]), Ok(Mode::Auto));
    assert_eq!(split("cpu-moe = true\n", &[]), Ok(Mode::CpuMoe));
    assert_eq!(split("n-cpu-moe = 3\n", &[]), Ok(Mode::NCpuMoe(3)));
    assert_eq!(split("", &["--cpu-moe"]), Ok(Mode::CpuMoe));
    assert_eq!(split("n-cpu-moe = 3\n", &["--n-cpu-moe", "1"]), Ok(Mode::NCpuMoe(1)));
    assert_eq!(split("cpu-moe = true\n", &["--cpu-moe=false"]), Ok(Mode::Auto));
    let err = split("cpu-moe = true\n", &["--n-cpu-moe", "2"]).unwrap_err();
    assert!(err.contains("--cpu-moe and --n-cpu-moe 2 cannot both be set"), "{err}");
    let err = split("n-cpu-moe = \"two\"\n", &[]).unwrap_err();
    assert!(err.contains("`n-cpu-moe`: expected an integer"), "{err}");
    let (ok, out, err) = print_config(&home, &[], &[("STRATA_N_CPU_MOE", "4")]);
    assert!(ok, "{err}");
    assert_eq!(setting(&out, "n-cpu-moe"), ("4".into(), "STRATA_N_CPU_MOE".into()));
    assert_eq!(setting(&out, "cpu-moe"), ("false".into(), "default".into()));
    let (ok, out, err) = print_config(&home, &[], &[("STRATA_CPU_MOE", "true")]);
    assert!(ok, "{err}");
    assert_eq!(setting(&out, "cpu-moe"), ("true".into(), "STRATA_CPU_MOE".into()));
    std::fs::remove_dir_all(&home).ok();
}

#[test]
fn a_bad_config_file_is_an_error_naming_the_file_and_key() {
    let home = temp_dir("bad");
    let file = home.join("bad.toml");
    let file_s = file.to_str().unwrap();
    for (text, expect) in [
        ("port = 99999\n", "`port`: invalid value '99999'"),
        // No value is coerced to its key's type.
        ("port = \"8080\"\n", "`port`: expected an integer, found the string \"8080\""),
        ("threads = 1e3\n", "`threads`: expected an integer, found the float 1000.0"),
        ("host = true\n", "`host`: expected a string or a number, found the boolean true"),
        ("expert-guess = \"yes\"\n", "`expert-guess`: expected `true` or `false`, found the string"),
        ("colour = \"blue\"\n", "`colour`: not a setting"),
        ("threads = [1, 2]\n", "`threads`: expected one value"),
        ("stream-policy = \"fifo\"\n", "`stream-policy`: invalid value 'fifo'"),
        ("port = 80\nport = 81\n", "duplicate key"),
        ("model = [{ a = 1 }]\n", "`model`: expected a string"),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = Command::new(BIN).args(["serve", "--config", file_s]).env("STRATA_HOME", &home).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {err}");
        assert!(err.contains(file_s) && err.contains(expect), "{text}: {err}");
    }
    // A path that is not a file says what it is; a FIFO is not opened (which would wait for
    // a writer).
    let fifo = home.join("fifo.toml");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let dir = home.join("strata.d");
    std::fs::create_dir(&dir).unwrap();
    for (path, expect) in [
        (Path::new("/nonexistent/strata.toml"), "/nonexistent/strata.toml: not found"),
        (&dir, "strata.d: is a directory"),
        (&fifo, "fifo.toml: not a regular file"),
        (Path::new("/dev/null"), "/dev/null: not a regular file"),
    ] {
        let mut child = Command::new(BIN)
            .args(["serve", "--config", path.to_str().unwrap()])
            .env("STRATA_HOME", &home)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                child.kill().ok();
                panic!("serve --config {} hung", path.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", path.display());
        assert!(err.contains(&format!("config file {}", path.display())) && err.contains(expect), "{err}");
    }
    std::fs::remove_dir_all(&home).ok();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An HTTP/1.1 request; returns the status code and the body.
fn request(port: u16, method: &str, path: &str, key: Option<&str>, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let len = body.len();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let code = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// A GET; returns the status code.
fn get(port: u16, path: &str, key: Option<&str>) -> u16 {
    request(port, "GET", path, key, "").0
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the child this test spawned.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// The next notification from the server, as systemd would receive it.
fn next_notification(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    // A signal that reaches the test process (its children's, say) interrupts the wait
    // (EINTR, seen once in CI): wait again.
    let n = loop {
        match sock.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r.expect("no notification from the server within 60 s"),
        }
    };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// The daemon as systemd runs it: settings from a config file and STRATA_PORT, READY=1
/// once the model is loaded, SIGHUP rereads the file (new API keys apply at once; other
/// changes are logged; a broken file, or one that drops the keys without `api-key = []`,
/// is refused and the old settings stay), SIGTERM
/// stops it with exit status 0, and log lines carry journal priorities.
#[test]
fn serve_from_a_config_file_under_systemd() {
    let dir = temp_dir("daemon");
    let config = dir.join("strata.toml");
    std::fs::write(&config, "port = 1\nthreads = 1\n").unwrap();
    let socket_path = dir.join("notify");
    let sock = UnixDatagram::bind(&socket_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // stderr is a file standing in for the journal stream: JOURNAL_STREAM names it.
    let log_path = dir.join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let meta = log.metadata().unwrap();
    let port = free_port();
    let mut server = strata()
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("STRATA_PORT", port.to_string())
        .env("STRATA_HOME", &dir)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let pid = server.id();

    let ready = next_notification(&sock);
    assert!(ready.starts_with("READY=1\n"), "{ready}");
    assert!(ready.contains(&format!("STATUS=serving on http://127.0.0.1:{port}")), "{ready}");
    assert_eq!(get(port, "/health", None), 200);
    assert_eq!(get(port, "/v1/models", None), 200);

    // Keys added to the file apply at the reload; a changed queue depth needs a restart.
    std::fs::write(&config, "port = 1\nthreads = 1\napi-key = [\"k1\"]\nqueue-depth = 3\n").unwrap();
    signal(pid, libc::SIGHUP);
    assert_eq!(next_notification(&sock), "RELOADING=1");
    assert_eq!(next_notification(&sock), "READY=1");
    assert_eq!(get(port, "/v1/models", None), 401);
    assert_eq!(get(port, "/v1/models", Some("k1")), 200);
    assert_eq!(get(port, "/health", None), 200);

    // A broken file is refused; the keys in force stay.
    std::fs::write(&config, "port = \"x\"\n").unwrap();
    signal(pid, libc::SIGHUP);
    assert_eq!(next_notification(&sock), "RELOADING=1");
    assert_eq!(next_notification(&sock), "READY=1");
    assert_eq!(get(port, "/v1/models", None), 401);
    assert_eq!(get(port, "/v1/models", Some("k1")), 200);

    // An emptied file, or one truncated before its keys (a tool rewriting it in place),
    // does not turn authentication off; only `api-key = []` does.
    for text in ["", "port = 1\nthreads = 1\n", "port = 1\napi-key = [\"\"]\n"] {
        std::fs::write(&config, text).unwrap();
        signal(pid, libc::SIGHUP);
        assert_eq!(next_notification(&sock), "RELOADING=1");
        assert_eq!(next_notification(&sock), "READY=1");
        assert_eq!(get(port, "/v1/models", None), 401, "after reloading {text:?}");
        assert_eq!(get(port, "/v1/models", Some("k1")), 200, "after reloading {text:?}");
    }
    std::fs::write(&config, "port = 1\nthreads = 1\napi-key = []\n").unwrap();
    signal(pid, libc::SIGHUP);
    assert_eq!(next_notification(&sock), "RELOADING=1");
    assert_eq!(next_notification(&sock), "READY=1");
    assert_eq!(get(port, "/v1/models", None), 200);

    signal(pid, libc::SIGTERM);
    assert_eq!(next_notification(&sock), "STOPPING=1");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");

    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 4, "{log}");
    for line in &lines {
        let level = line.get(..3).unwrap_or("");
        assert!(["<3>", "<4>", "<6>", "<7>"].contains(&level), "not a journal line: {line}");
        assert!(!line.contains('\x1b'), "colour codes in the journal: {line}");
    }
    assert!(lines.iter().any(|l| l.starts_with("<4>") && l.contains("queue-depth") && l.contains("restart")), "{log}");
    assert!(
        lines.iter().any(|l| l.starts_with("<3>") && l.contains("config not reloaded") && l.contains("`port`")),
        "{log}"
    );
    let refused = lines.iter().filter(|l| l.starts_with("<3>") && l.contains("would turn authentication off")).count();
    assert_eq!(refused, 3, "{log}");
    assert!(lines.iter().any(|l| l.starts_with("<4>") && l.contains("authentication is off")), "{log}");
    std::fs::remove_dir_all(&dir).ok();
}

/// SIGTERM with requests in flight: within the grace period they finish (200, a whole
/// answer); with no grace they are cancelled with a 503. Either way the exit status is 0.
#[test]
fn sigterm_drains_requests_within_the_grace_period_and_cancels_them_after() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    for grace in ["60s", "0s"] {
        let dir = temp_dir(&format!("grace-{grace}"));
        let port = free_port();
        let mut server = strata()
            .args(["serve", "--threads", "1", "--grace-period", grace, "--port", &port.to_string()])
            .env("STRATA_HOME", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() || get(port, "/health", None) != 200 {
            assert!(Instant::now() < deadline, "the server did not become healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Long prompts, each with its own start so that none reuses another's prefix:
        // the worker takes a while over each, so some are running or queued at SIGTERM.
        let done = Arc::new(AtomicUsize::new(0));
        let clients: Vec<_> = (0..3)
            .map(|i| {
                let done = done.clone();
                std::thread::spawn(move || {
                    let prompt = format!("{i}{i}{i} {}", "fish swim ".repeat(400));
                    let body = format!(
                        r#"{{"model":"strata-demo","messages":[{{"role":"user","content":"{prompt}"}}],"max_tokens":64}}"#
                    );
                    let answer = request(port, "POST", "/v1/chat/completions", None, &body);
                    done.fetch_add(1, Ordering::SeqCst);
                    answer
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let done_before = done.load(Ordering::SeqCst);
        signal(server.id(), libc::SIGTERM);
        let answers: Vec<(u16, String)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        let status = server.wait().unwrap();
        assert!(status.success(), "grace {grace}: {status}");
        assert!(done_before < 3, "every request finished before SIGTERM; the test needs longer ones");
        for (code, body) in &answers {
            match grace {
                "60s" => assert!(*code == 200 && body.contains("\"finish_reason\""), "{code} {body}"),
                _ => assert!(*code == 200 || (*code == 503 && body.contains("shutting down")), "{code} {body}"),
            }
        }
        if grace == "0s" {
            assert!(answers.iter().any(|(code, _)| *code == 503), "nothing was cancelled: {answers:?}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
