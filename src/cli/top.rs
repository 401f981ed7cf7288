//! `strata top`: a running daemon's status in the terminal, redrawn live: where each
//! model's weights are (one character per unit, by tier), the rates of the last
//! interval (tokens, storage reads, hit rates, I/O stall, host-to-device copies), the
//! batch and the KV memory. It reads `/api/strata/status`, as the status page does.

use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::out;
use super::serve::{http_get, running};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// The server listening on this port (default: the one running with this
    /// `$STRATA_HOME`; `STRATA_API_KEY` is sent as its key).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Print one screen and exit (rates need two samples: this takes two, `interval`
    /// apart).
    #[arg(long)]
    pub once: bool,
}

pub fn main(args: TopArgs) -> anyhow::Result<()> {
    if !(0.1..=3600.0).contains(&args.interval) {
        anyhow::bail!("--interval {} is not between 0.1 and 3600 seconds", args.interval);
    }
    let servers = running(args.port)?;
    let Some((_, server)) = servers.first() else { anyhow::bail!("no running server") };
    if servers.len() > 1 {
        anyhow::bail!("{} servers run with this STRATA_HOME: choose one with --port", servers.len());
    }
    let addr = server.addr.clone();
    let fetch = || -> anyhow::Result<Value> { Ok(serde_json::from_str(&http_get(&addr, "/api/strata/status")?)?) };
    let width = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).unwrap_or(100usize).max(40);
    let mut prev = fetch()?;
    loop {
        std::thread::sleep(Duration::from_secs_f64(args.interval));
        let now = fetch()?;
        let screen = render(&addr, Some(&prev), &now, width);
        if args.once {
            out!("{screen}")?;
            return Ok(());
        }
        // Home, clear, draw: one write, so the terminal never shows half a screen.
        out!("\x1b[H\x1b[2J{screen}")?;
        prev = now;
    }
}

/// Bytes in binary units (a rate or a count from the JSON's numbers).
fn size(b: f64) -> String {
    crate::sched::plan::human_size(b.max(0.0) as u64)
}

/// `a / b` as a percentage, or `-` without a denominator.
fn pct(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.0}%", 100.0 * a / b) } else { "-".into() }
}

/// The character a unit's tier draws as.
fn glyph(tier: &str) -> char {
    match tier {
        "vram" => 'V',
        "pinned" => 'P',
        "ram" => 'R',
        _ => '.',
    }
}

/// One screen for `now`, with rates over the interval since `prev`.
pub fn render(addr: &str, prev: Option<&Value>, now: &Value, width: usize) -> String {
    let f = |v: &Value, path: &[&str]| path.iter().fold(v, |v, k| &v[*k]).as_f64().unwrap_or(0.0);
    let dt = prev.map_or(0.0, |p| f(now, &["time"]) - f(p, &["time"]));
    let delta = |path: &[&str]| prev.map_or(0.0, |p| f(now, path) - f(p, path));
    let mut s = String::new();
    let mut line = |text: String| {
        s.push_str(&text);
        s.push('\n');
    };
    let ready = if now["ready"].as_bool() == Some(true) { "ready" } else { "loading" };
    line(format!("strata top: {addr}, {ready} (Ctrl-C quits)"));
    let rate = |tokens: f64, secs: f64| if secs > 0.0 { format!("{:.1} tok/s", tokens / secs) } else { "-".into() };
    line(format!(
        "tokens: prompt {}, generated {} | last {:.1} s: prefill {}, decode {}",
        f(now, &["tokens", "prompt"]),
        f(now, &["tokens", "generated"]),
        dt,
        rate(delta(&["tokens", "prompt"]), delta(&["tokens", "prefill_seconds"])),
        rate(delta(&["tokens", "generated"]), delta(&["tokens", "decode_seconds"])),
    ));
    let models = now["models"].as_array().cloned().unwrap_or_default();
    if models.is_empty() {
        line("no model loaded".into());
    }
    let tokens_done = delta(&["tokens", "prompt"]) + delta(&["tokens", "generated"]);
    for (i, m) in models.iter().enumerate() {
        let name = m["name"].as_str().unwrap_or("?");
        let before = prev.and_then(|p| p["models"].as_array()?.iter().find(|x| x["name"] == m["name"]).cloned());
        let d = |path: &[&str]| before.as_ref().map_or(0.0, |b| f(m, path) - f(b, path));
        line(String::new());
        line(format!(
            "{name} on {} ({}), context {}",
            m["device"]["device"].as_str().unwrap_or("?"),
            m["device"]["name"].as_str().unwrap_or("?"),
            f(m, &["context_length"])
        ));
        let tiers: Vec<String> = m["tiers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| format!("{} {} ({})", t["tier"].as_str().unwrap_or("?"), f(t, &["units"]), size(f(t, &["bytes"]))))
            .collect();
        line(format!("  tiers    {}", tiers.join("   ")));
        let b = &m["batching"];
        line(format!(
            "  batch    running {}, waiting {}, of {} | KV {} of {}",
            f(b, &["running"]),
            f(b, &["waiting"]),
            f(b, &["parallel"]),
            size(f(b, &["kv_cache_bytes"])),
            size(f(b, &["kv_cache_limit_bytes"]))
        ));
        // Rates over the interval; per token over the tokens the whole server did then
        // (one model: its own).
        let c = |k: &str| d(&["counters", k]);
        let per_s = |x: f64| if dt > 0.0 { format!("{}/s", size(x / dt)) } else { "-".into() };
        let per_token = if tokens_done > 0.0 && models.len() == 1 {
            format!(", {}/token", size(c("bytes_read") / tokens_done))
        } else {
            String::new()
        };
        line(format!(
            "  storage  read {}{per_token} | layer hits {} | expert hits {} | I/O stall {}",
            per_s(c("bytes_read")),
            pct(c("layer_hits"), c("layer_requests")),
            pct(c("expert_hits"), c("expert_requests")),
            pct(c("stall_ns") / 1e9, dt)
        ));
        line(format!("  to GPU   {} | copying {}", per_s(c("h2d_bytes")), pct(c("copy_ns") / 1e9, dt)));
        let sp = &m["speculative"];
        if sp["kind"].as_str().is_some_and(|k| k != "off") || f(sp, &["drafted"]) > 0.0 {
            let draft = sp["draft"].as_str().map_or(String::new(), |d| format!(" {d}"));
            line(format!(
                "  spec     {}{draft} (n_max {}): kept {} of {} ({}), {:.2} tokens/pass | last interval kept {}",
                sp["kind"].as_str().unwrap_or("?"),
                f(sp, &["n_max"]),
                f(sp, &["accepted"]),
                f(sp, &["drafted"]),
                pct(f(sp, &["accepted"]), f(sp, &["drafted"])),
                f(sp, &["tokens_per_step"]),
                pct(d(&["speculative", "accepted"]), d(&["speculative", "drafted"])),
            ));
        }
        split_lines(&mut line, &m["residency"]["split"], width);
        let units = m["units"].as_array().cloned().unwrap_or_default();
        let layers: String =
            units.iter().filter(|u| u["kind"] == "layer").map(|u| glyph(u["tier"].as_str().unwrap_or(""))).collect();
        wrap(&mut line, "  layers   ", &layers, width);
        let mut by_layer: Vec<(u64, String)> = Vec::new();
        for u in units.iter().filter(|u| u["kind"] == "expert") {
            let l = u["layer"].as_u64().unwrap_or(0);
            match by_layer.last_mut() {
                Some((last, cells)) if *last == l => cells.push(glyph(u["tier"].as_str().unwrap_or(""))),
                _ => by_layer.push((l, glyph(u["tier"].as_str().unwrap_or("")).to_string())),
            }
        }
        for (l, cells) in by_layer {
            wrap(&mut line, &format!("  experts {l:<3}"), &cells, width);
        }
        if i + 1 == models.len() {
            line(String::new());
            line("  V vram  P pinned  R ram  . storage".into());
        }
    }
    s
}

/// A model's routed experts split between the GPU and the CPU (`residency.split`,
/// nothing when null): the mode and what the plan predicts, the two sides' counters since
/// it loaded, and per MoE layer its experts in VRAM / on the CPU / streamed / on storage.
fn split_lines(line: &mut impl FnMut(String), split: &Value, width: usize) {
    if !split.is_object() {
        return;
    }
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let mode = match &split["mode"] {
        Value::String(m) => m.replace('_', "-"),
        m => format!("n-cpu-moe {}", m["n_cpu_moe"]),
    };
    let t = &split["steps"];
    // `null`: a plan through a rate not measured.
    let predicted = split["plan"]["decode"]["total_s"].as_f64().map_or("-".into(), |s| format!("{:.2}", 1e3 * s));
    line(format!(
        "  split    {mode}, predicted {predicted} ms/token | experts GPU {}, CPU {} | rows {} down, {} up, {} \
         crossings | CPU {:.1} s, GPU wait {:.1} s | replans {}",
        f(t, "gpu_experts"),
        f(t, "cpu_experts"),
        size(f(t, "bytes_down")),
        size(f(t, "bytes_up")),
        f(t, "crossings"),
        f(t, "cpu_s"),
        f(t, "gpu_wait_s"),
        f(t, "replans"),
    ));
    let cells: Vec<String> = split["plan"]["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            let n = |k| f(l, k);
            format!("{}:{}/{}/{}/{}", n("layer"), n("in_vram"), n("on_cpu"), n("streamed"), n("from_storage"))
        })
        .collect();
    let label = "  placed   ";
    let mut row = String::new();
    for cell in cells {
        if !row.is_empty() && label.len() + row.len() + 1 + cell.len() > width {
            line(format!("{label}{row}"));
            row.clear();
        }
        if !row.is_empty() {
            row.push(' ');
        }
        row.push_str(&cell);
    }
    let legend = "  (layer:vram/cpu/streamed/storage)";
    match row.is_empty() {
        true => {}
        false if label.len() + row.len() + legend.len() <= width => line(format!("{label}{row}{legend}")),
        false => {
            line(format!("{label}{row}"));
            line(format!("{label}{}", legend.trim_start()));
        }
    }
}

/// `cells` after `label`, cut to lines of `width`.
fn wrap(line: &mut impl FnMut(String), label: &str, cells: &str, width: usize) {
    let room = width.saturating_sub(label.len()).max(8);
    let chars: Vec<char> = cells.chars().collect();
    for (k, chunk) in chars.chunks(room).enumerate() {
        let head = if k == 0 { label.to_string() } else { " ".repeat(label.len()) };
        line(format!("{head}{}", chunk.iter().collect::<String>()));
    }
    if chars.is_empty() {
        line(label.trim_end().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(time: f64, generated: u64, read: u64) -> Value {
        json!({"time": time, "ready": true,
            "tokens": {"prompt": 10, "generated": generated, "prefill_seconds": 0.5, "decode_seconds": generated as f64 / 20.0},
            "models": [{"name": "m", "device": {"device": "cpu", "name": "CPU"}, "context_length": 512,
                "batching": {"running": 1, "waiting": 2, "parallel": 4, "kv_cache_bytes": 2048, "kv_cache_limit_bytes": 4096},
                "tiers": [{"tier": "vram", "units": 0, "bytes": 0}, {"tier": "pinned", "units": 0, "bytes": 0},
                          {"tier": "ram", "units": 1, "bytes": 1024}, {"tier": "storage", "units": 3, "bytes": 3072}],
                "units": [{"kind": "layer", "layer": 0, "tier": "ram", "bytes": 1024},
                          {"kind": "layer", "layer": 1, "tier": "storage", "bytes": 1024},
                          {"kind": "expert", "layer": 1, "expert": 0, "tier": "storage", "bytes": 512},
                          {"kind": "expert", "layer": 1, "expert": 1, "tier": "storage", "bytes": 512}],
                "counters": {"bytes_read": read, "layer_requests": 4, "layer_hits": 1, "stall_ns": 250_000_000u64},
                "speculative": {"kind": "draft", "draft": "small", "n_max": 16, "accepted": generated / 2,
                    "drafted": generated, "tokens_per_step": 2.5}}]})
    }

    #[test]
    fn a_screen_shows_tiers_map_and_rates() {
        let (a, b) = (sample(100.0, 20, 0), sample(101.0, 40, 2 << 20));
        let screen = render("127.0.0.1:11434", Some(&a), &b, 80);
        assert!(screen.contains("ram 1 (1.0 KiB)") && screen.contains("storage 3 (3.0 KiB)"), "{screen}");
        assert!(screen.contains("decode 20.0 tok/s"), "{screen}");
        assert!(screen.contains("read 2.0 MiB/s, 102.4 KiB/token"), "{screen}");
        assert!(screen.contains("running 1, waiting 2, of 4 | KV 2.0 KiB of 4.0 KiB"), "{screen}");
        assert!(screen.contains("layers   R.") && screen.contains("experts 1  .."), "{screen}");
        let draft = "spec     draft small (n_max 16): kept 20 of 40 (50%), 2.50 tokens/pass | last interval kept 50%";
        assert!(screen.contains(draft), "{screen}");
        // Without a previous sample there are no rates.
        assert!(render("x", None, &b, 80).contains("decode -"));
    }

    #[test]
    fn a_split_shows_its_mode_counters_and_layers() {
        let mut m = sample(101.0, 40, 0);
        m["models"][0]["residency"] = json!({"split": {"mode": {"n_cpu_moe": 1}, "replan_every": 128,
            "plan": {"decode": {"total_s": 0.0025}, "layers": [
                {"layer": 1, "experts": 8, "in_vram": 0, "on_cpu": 7, "streamed": 0, "from_storage": 1},
                {"layer": 3, "experts": 8, "in_vram": 5, "on_cpu": 0, "streamed": 3, "from_storage": 0}]},
            "steps": {"gpu_experts": 40, "cpu_experts": 24, "bytes_down": 4096, "bytes_up": 2048, "crossings": 12,
                "cpu_s": 1.5, "gpu_wait_s": 0.3, "replans": 2}}});
        let screen = render("x", None, &m, 100);
        let want = "split    n-cpu-moe 1, predicted 2.50 ms/token | experts GPU 40, CPU 24 | rows 4.0 KiB down, \
                    2.0 KiB up, 12 crossings | CPU 1.5 s, GPU wait 0.3 s | replans 2";
        assert!(screen.contains(want), "{screen}");
        assert!(screen.contains("placed   1:0/7/0/1 3:5/0/3/0  (layer:vram/cpu/streamed/storage)"), "{screen}");
        // A plan through a rate not measured predicts infinity, `null` in the JSON.
        m["models"][0]["residency"]["split"]["plan"]["decode"]["total_s"] = Value::Null;
        assert!(render("x", None, &m, 100).contains("split    n-cpu-moe 1, predicted - ms/token |"));
        // Without a split, no split lines.
        assert!(!render("x", None, &sample(101.0, 40, 0), 100).contains("split "));
        // Many layers wrap to the width.
        let layers: Vec<Value> = (0..40).map(|l| json!({"layer": l, "in_vram": 8, "on_cpu": 0})).collect();
        m["models"][0]["residency"]["split"]["plan"]["layers"] = json!(layers);
        let screen = render("x", None, &m, 60);
        let placed: Vec<&str> = screen.lines().filter(|l| l.starts_with("  placed")).collect();
        assert!(placed.len() > 3 && placed.iter().all(|l| l.len() <= 60), "{screen}");
    }

    #[test]
    fn long_maps_wrap_to_the_width() {
        let mut lines = Vec::new();
        wrap(&mut |l| lines.push(l), "  layers   ", &".".repeat(50), 31);
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.len() <= 31));
    }
}
