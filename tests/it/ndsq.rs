//! NDSQ in `.cawsf` (issue 22): `convert --ndsq` writes each layer matrix as the seed's
//! L/S/D/R shards, a reader gives back exactly the sum of the decoded components, the
//! model runs, and a flipped byte in any NDSQ shard is named by `verify`.

use crate::support;

use strata::engine::session::{Engine, RunOptions};
use strata::format::cawsf::{self, Compression};
use strata::format::ndsq::{Ndsq, NdsqParams};
use strata::model::ModelSource;
use strata::model::convert::{ConvertOptions, Target, convert};
use strata::model::decoder::SeqStep;
use strata::quant::ReadF32;
use support::TempDir;

fn fixture(rel: &str) -> String {
    format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"))
}

const PARAMS: NdsqParams = NdsqParams { rank: 4, outlier_q: 0.01, pq_d: 8, pq_m: 4, pq_k: 16 };

fn convert_ndsq(src: &str, out: &std::path::Path, comp: Compression) {
    let opts =
        ConvertOptions { target: Target::Cawsf(comp), quant: None, threads: 2, ndsq: Some(PARAMS), sparse_ffn: None };
    convert(ModelSource::from_path(src).unwrap(), out, &opts, &mut |_| {}).unwrap();
}

#[test]
fn layer_matrices_read_back_as_the_sum_of_their_components() {
    let dir = TempDir::new("ndsq");
    for comp in [Compression::None, Compression::Zstd] {
        let out = dir.path(&format!("m-{}.cawsf", comp.name()));
        convert_ndsq(&fixture("hf/qwen2_moe"), &out, comp);
        let src = ModelSource::from_path(&fixture("hf/qwen2_moe")).unwrap();
        let back = ModelSource::from_path(out.to_str().unwrap()).unwrap();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut decomposed = 0;
        for (name, t) in &src.tensors {
            let b = &back.tensors[name];
            let layer_matrix = name.starts_with("model.layers.") && t.shape.len() == 2;
            let router = name.ends_with("mlp.gate.weight") || name.ends_with("shared_expert_gate.weight");
            if !layer_matrix || router {
                assert_eq!(b.to_f32_vec(), t.to_f32_vec(), "`{name}` is kept as it was");
                continue;
            }
            // The same decomposition, done here: the file holds exactly its components.
            let n = Ndsq::encode(&pool, &t.to_f32_vec(), t.shape[0], t.shape[1], &PARAMS).unwrap();
            let [l, s, d, r] = n.components();
            let sum: Vec<f32> = (0..l.len()).map(|i| l[i] + s[i] + d[i] + r[i]).collect();
            assert_eq!(b.to_f32_vec(), sum, "`{name}`");
            decomposed += 1;
        }
        assert!(decomposed > 10, "{decomposed} matrices decomposed");
        // `inspect` counts each component's bytes.
        let info = cawsf::inspect(&out).unwrap();
        assert_eq!(info["ndsq"]["tensors"], decomposed);
        for part in ["l_bytes", "s_bytes", "d_bytes", "r_bytes"] {
            assert!(info["ndsq"][part].as_u64().unwrap() > 0, "{part}: {}", info["ndsq"]);
        }
        eprintln!("{}: {decomposed} matrices decomposed", comp.name());
    }
}

/// The model runs from NDSQ shards, and spending more bits (8 per weight in R, rank 8)
/// brings its logits nearer the original's than fewer do (this file's 2 bits a weight).
/// Random tiny weights are noise, which no codec compresses: quality on a real model is
/// measured in docs/benchmarks.md.
#[test]
fn more_bits_bring_the_model_nearer_the_original() {
    let dir = TempDir::new("ndsq-bits");
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 11) % 400).collect();
    let logits = |p: &str| {
        let e = Engine::load(p, &RunOptions { threads: 2, ..Default::default() }).unwrap();
        let mut cache = e.model.new_cache(32).unwrap();
        e.model
            .forward(&mut [SeqStep { tokens: &ids, cache: &mut cache, all_logits: true, verify: false }])
            .unwrap()
            .remove(0)
    };
    let want = logits(&fixture("hf/llama3"));
    let err = |params: NdsqParams, tag: &str| {
        let out = dir.path(tag);
        let opts = ConvertOptions {
            target: Target::Cawsf(Compression::None),
            quant: None,
            threads: 2,
            ndsq: Some(params),
            sparse_ffn: None,
        };
        convert(ModelSource::from_path(&fixture("hf/llama3")).unwrap(), &out, &opts, &mut |_| {}).unwrap();
        let got = logits(out.to_str().unwrap());
        assert!(got.iter().all(|x| x.is_finite()));
        let e: f32 = got.iter().zip(&want).map(|(x, y)| (x - y).powi(2)).sum();
        (e / want.iter().map(|x| x * x).sum::<f32>()).sqrt()
    };
    let small = err(PARAMS, "small.cawsf");
    let large = err(NdsqParams { rank: 8, outlier_q: 0.01, pq_d: 4, pq_m: 4, pq_k: 256 }, "large.cawsf");
    eprintln!("relative logit error: {small:.3} at 2 bits a weight, {large:.3} at 8");
    assert!(large < small / 2.0, "{large} against {small}");
}

#[test]
fn a_flipped_byte_in_any_ndsq_shard_is_named() {
    let dir = TempDir::new("ndsq-flip");
    let out = dir.path("m.cawsf");
    convert_ndsq(&fixture("hf/llama3"), &out, Compression::None);
    let clean = std::fs::read(&out).unwrap();
    assert!(cawsf::verify(&out).is_ok());
    // The first shard of each NDSQ kind: flip its payload's last byte.
    let info = cawsf::inspect(&out).unwrap();
    let bank =
        info["sections"].as_array().unwrap().iter().find(|s| s["type"] == 3).unwrap()["offset"].as_u64().unwrap();
    let mut pos = bank as usize;
    let mut seen = std::collections::HashSet::new();
    while pos + 12 <= clean.len() && seen.len() < 4 {
        let (kind, csize) = (clean[pos], u32::from_le_bytes(clean[pos + 8..pos + 12].try_into().unwrap()) as usize);
        if kind <= 3 && csize > 0 && seen.insert(kind) {
            let mut bad = clean.clone();
            bad[pos + 12 + csize - 1] ^= 0x40;
            std::fs::write(&out, &bad).unwrap();
            let err = cawsf::verify(&out).unwrap_err().to_string();
            let name = ["NDSQ L", "NDSQ R", "NDSQ S", "NDSQ D"][kind as usize];
            assert!(err.contains(name) && err.contains("checksum mismatch") && err.contains("tensor `"), "{err}");
        }
        pos += 12 + csize;
    }
    assert_eq!(seen.len(), 4, "every NDSQ shard kind was flipped");
}

#[test]
fn ndsq_needs_a_cawsf_output_and_sane_settings() {
    let dir = TempDir::new("ndsq-bad");
    let src = || ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    let flat = ConvertOptions { target: Target::Flat, quant: None, threads: 1, ndsq: Some(PARAMS), sparse_ffn: None };
    let err = format!("{:#}", convert(src(), &dir.path("f"), &flat, &mut |_| {}).unwrap_err());
    assert!(err.contains(".cawsf"), "{err}");
    let bad = NdsqParams { pq_k: 300, ..PARAMS };
    let opts = ConvertOptions {
        target: Target::Cawsf(Compression::None),
        quant: None,
        threads: 1,
        ndsq: Some(bad),
        sparse_ffn: None,
    };
    let err = format!("{:#}", convert(src(), &dir.path("c.cawsf"), &opts, &mut |_| {}).unwrap_err());
    assert!(err.contains("--pq-k 300"), "{err}");
    assert!(!dir.path("c.cawsf").exists());
}

/// `strata export` of an NDSQ model writes the reconstructed weights: the GGUF computes
/// what the `.cawsf` does.
#[test]
fn an_ndsq_model_exports_to_gguf_reconstructed() {
    let dir = TempDir::new("ndsq-export");
    let cawsf_path = dir.path("m.cawsf");
    convert_ndsq(&fixture("hf/llama3"), &cawsf_path, Compression::None);
    let gguf = dir.path("m.gguf");
    let src = ModelSource::from_path(cawsf_path.to_str().unwrap()).unwrap();
    strata::engine::export::export(&src, &gguf, None, 2).unwrap();
    let ids: Vec<u32> = (0..16).map(|i| (i * 53 + 7) % 400).collect();
    let logits = |p: &std::path::Path| {
        let e = Engine::load(p.to_str().unwrap(), &RunOptions { threads: 2, ..Default::default() }).unwrap();
        let mut cache = e.model.new_cache(32).unwrap();
        e.model
            .forward(&mut [SeqStep { tokens: &ids, cache: &mut cache, all_logits: true, verify: false }])
            .unwrap()
            .remove(0)
    };
    assert_eq!(logits(&cawsf_path), logits(&gguf));
}

/// A flipped byte in the CODEBOOKS or ROUTING section is named by `verify`, and `open`
/// refuses the file naming the section.
#[test]
fn a_flipped_byte_in_codebooks_or_routing_is_named() {
    let dir = TempDir::new("ndsq-sections");
    let out = dir.path("m.cawsf");
    convert_ndsq(&fixture("hf/llama3"), &out, Compression::None);
    let clean = std::fs::read(&out).unwrap();
    let info = cawsf::inspect(&out).unwrap();
    for (kind, name) in [(2, "CODEBOOKS"), (4, "ROUTING")] {
        let s = info["sections"].as_array().unwrap().iter().find(|s| s["type"] == kind).expect(name);
        let at = (s["offset"].as_u64().unwrap() + s["size"].as_u64().unwrap() / 2) as usize;
        let mut bad = clean.clone();
        bad[at] ^= 0x10;
        std::fs::write(&out, &bad).unwrap();
        let err = cawsf::verify(&out).unwrap_err().to_string();
        assert!(err.contains(&format!("section {name}: checksum mismatch")), "{err}");
        let err = format!("{:#}", ModelSource::from_path(out.to_str().unwrap()).err().unwrap());
        assert!(err.contains(&format!("section {name}")), "{err}");
    }
}

/// Every NDSQ shard has a routing entry; ranking is deterministic; a budget keeps shards
/// in rank order within it; `--route-budget` leaves out exactly the R shards over
/// it (each matrix then reads back as the sum of the components it kept).
#[test]
fn routing_ranks_every_shard_and_a_budget_leaves_out_exactly_what_it_skips() {
    use strata::format::route::{Budget, OPTIONAL, apply_budget, routing_key, select};
    let dir = TempDir::new("ndsq-route");
    let out = dir.path("m.cawsf");
    convert_ndsq(&fixture("hf/llama3"), &out, Compression::None);
    let spec = out.to_str().unwrap();
    let source = ModelSource::from_path(spec).unwrap();
    let routing = source.routing.clone().expect("an NDSQ file has a ROUTING section");
    let decomposed = cawsf::inspect(&out).unwrap()["ndsq"]["tensors"].as_u64().unwrap() as usize;
    assert_eq!(routing.entries.len(), 5 * decomposed, "five shards per matrix, each with a key");
    let tok = strata::engine::tokenizer::TextTokenizer::for_model(&source).unwrap();
    let ids = |prompt: &str| tok.encode(prompt, false).unwrap();
    let key = routing_key(&source, &routing, &ids("The quick brown fox")).unwrap();
    let a = select(&routing, &key, &[], None);
    let b = select(&routing, &routing_key(&source, &routing, &ids("The quick brown fox")).unwrap(), &[], None);
    let order = |s: &strata::format::route::Selection| s.shards.iter().map(|r| r.entry.shard).collect::<Vec<_>>();
    assert_eq!(order(&a), order(&b));
    assert!(a.shards.windows(2).all(|w| w[0].score >= w[1].score));
    let other = select(&routing, &routing_key(&source, &routing, &ids("1 2 3 4 5 6 7 8 9")).unwrap(), &[], None);
    assert_ne!(order(&a), order(&other), "another prompt ranks otherwise");
    for pct in [0.0, 10.0, 50.0, 100.0] {
        let s = select(&routing, &key, &OPTIONAL, Some(Budget::Percent(pct)));
        let budget = s.summary.budget_bytes.unwrap();
        assert!(s.summary.kept_bytes <= budget, "{pct}%: {:?}", s.summary);
        assert!(s.shards.iter().all(|r| OPTIONAL.contains(&r.entry.component)));
        // Greedy in rank order: every skipped shard was too big for what was left then.
        let mut left = budget;
        for r in &s.shards {
            assert_eq!(r.kept, r.entry.cost <= left, "{pct}%: shard {}", r.entry.shard);
            if r.kept {
                left -= r.entry.cost;
            }
        }
    }
    // Half the R bytes: a matrix whose R shard was skipped reads back as L + S + D.
    let mut routed = ModelSource::from_path(spec).unwrap();
    let summary = apply_budget(&mut routed, &ids("The quick brown fox"), Budget::Percent(50.0)).unwrap();
    assert!(summary.kept > 0 && summary.kept < summary.candidates, "{summary:?}");
    let sel = select(&routing, &key, &OPTIONAL, Some(Budget::Percent(50.0)));
    let skipped: std::collections::HashMap<(String, &str), bool> =
        sel.shards.iter().map(|r| ((r.entry.tensor.clone(), r.entry.component), !r.kept)).collect();
    let src = ModelSource::from_path(&fixture("hf/llama3")).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let mut checked = 0;
    for (name, t) in &src.tensors {
        let Some(&skip_r) = skipped.get(&(name.clone(), "R")) else { continue };
        let n = Ndsq::encode(&pool, &t.to_f32_vec(), t.shape[0], t.shape[1], &PARAMS).unwrap();
        let [l, s, d, r] = n.components();
        let want: Vec<f32> = (0..l.len()).map(|i| l[i] + s[i] + d[i] + if skip_r { 0.0 } else { r[i] }).collect();
        assert_eq!(routed.tensors[name].to_f32_vec(), want, "`{name}` (R skipped: {skip_r})");
        checked += 1;
    }
    assert_eq!(checked, decomposed);
}

/// Under a memory budget an NDSQ model streams: each layer's compressed shards are read
/// from the file and decoded after the read (not reconstructed once and kept), and the
/// logits are those of the resident model exactly. Bytes read per pass are the shards',
/// well under the layers' F32 size.
#[test]
fn an_ndsq_model_streams_its_compressed_shards() {
    use std::sync::atomic::Ordering;
    let dir = TempDir::new("ndsq-stream");
    let out = dir.path("m.cawsf");
    convert_ndsq(&fixture("hf/llama3"), &out, Compression::None);
    let spec = out.to_str().unwrap();
    let ids: Vec<u32> = (0..12).map(|i| (i * 29 + 5) % 400).collect();
    let run = |budget: Option<u64>| {
        let opts = RunOptions { threads: 2, memory_budget: budget, ..Default::default() };
        let e = Engine::load(spec, &opts).unwrap();
        let mut cache = e.model.new_cache(32).unwrap();
        let logits = e
            .model
            .forward(&mut [SeqStep { tokens: &ids, cache: &mut cache, all_logits: true, verify: false }])
            .unwrap()
            .remove(0);
        let s = e.model.scheduler();
        (logits, s.summary().mode, s.stats().bytes_read.load(Ordering::Relaxed), s.summary().plan.streamable_bytes)
    };
    let (resident, mode, ..) = run(None);
    assert_eq!(mode, "resident");
    let (streamed, mode, read, layer_bytes) = run(Some(0));
    assert_eq!(mode, "streaming");
    assert_eq!(streamed, resident);
    let f32_bytes: u64 = {
        let src = ModelSource::from_path(spec).unwrap();
        src.tensors
            .iter()
            .filter(|(n, t)| n.starts_with("model.layers.") && t.encoded().is_some())
            .map(|(_, t)| t.byte_len() as u64)
            .sum()
    };
    // What was read: every layer's range of the file (its shards, compressed, well under
    // the F32 size), once for the pass and at most once more for the prefetch of the next
    // step (2 layers, prefetch depth 2), plus the probe when the file opened.
    let info = cawsf::inspect(&out).unwrap();
    let shards: u64 =
        ["l_bytes", "s_bytes", "d_bytes", "r_bytes"].iter().map(|k| info["ndsq"][k].as_u64().unwrap()).sum();
    let ranges: u64 = cawsf::layer_ranges(&out).unwrap().iter().map(|r| r.len).sum();
    assert!(ranges < f32_bytes / 2, "the layers hold {ranges} bytes for {f32_bytes} bytes of F32 matrices");
    assert!(read >= shards && read <= 2 * ranges + 65536, "read {read} bytes: shards {shards}, layers {ranges}");
    assert!(layer_bytes > 0);
}
