//! Helpers shared by the format, conversion and store tests: a scratch directory that
//! removes itself, and a model's tensors grouped the way `ModelWriter` takes them.
#![allow(dead_code)]

pub mod decode;
pub mod device;
pub mod gguf;
pub mod steps;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use strata::format::Group;
use strata::model::ModelSource;
use strata::tensor::HostTensor;

/// A fresh directory under the temp directory, unique per process and call, removed
/// when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("strata-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tensors of `src` by group, each group sorted by name.
pub fn groups(src: &ModelSource) -> BTreeMap<Group, Vec<(String, HostTensor)>> {
    let mut g: BTreeMap<Group, Vec<(String, HostTensor)>> = BTreeMap::new();
    for (name, t) in &src.tensors {
        g.entry(Group::of(name)).or_default().push((name.clone(), t.clone()));
    }
    for v in g.values_mut() {
        v.sort_by(|a, b| a.0.cmp(&b.0));
    }
    g
}

/// The PID file a `strata serve` using `home` as `$STRATA_HOME` writes
/// (`run/serve-ADDR.pid`), once it is there; panics after 30 s.
pub fn wait_for_pid_file(home: &std::path::Path) -> PathBuf {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let found = std::fs::read_dir(home.join("run"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "pid"));
        if let Some(p) = found {
            return p;
        }
        assert!(std::time::Instant::now() < deadline, "no PID file under {}", home.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Log-probabilities of a row of logits, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// The index of a row's largest logit (the first on ties).
pub fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold(0, |b, (j, &v)| if v > row[b] { j } else { b }) as u32
}
