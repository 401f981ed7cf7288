//! The latent KV cache of multi-head latent attention (DeepSeek-V3): what it keeps a
//! token, and a long prompt's log-probs through it. A cached position holds one row per
//! layer, the normed latent and the shared RoPE key (`kv_lora_rank + qk_rope_head_dim`
//! values), where a per-head cache would hold every head's key and value. Over a
//! 4,096-token prompt (16 times the fixture's trained context), the prompt run in
//! 512-row chunks and the same tokens decoded one at a time give the log-probs that
//! transformers gives (tools/make_mla_long_fixture.py), which decompresses every head's
//! keys and values.

use crate::support;

use serde_json::Value;
use strata::backend::KvType;
use strata::engine::session::{Engine, RunOptions};
use strata::model::decoder::SeqStep;

fn engine(name: &str, kv: KvType, context: usize) -> Engine {
    let dir = format!("{}/tests/fixtures/hf/{name}", env!("CARGO_MANIFEST_DIR"));
    let opts = RunOptions { threads: 2, context, kv_type: Some(kv), ..Default::default() };
    Engine::load(&dir, &opts).unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

#[test]
fn a_cached_position_holds_the_latent_and_the_rope_key_per_layer() {
    let e = engine("deepseek_v3", KvType::F32, 64);
    let c = e.model.config();
    let a = c.mla.expect("latent attention");
    let width = a.kv_lora_rank + a.qk_rope_head_dim;
    assert_eq!(width, 40);
    let layers = c.layers.len();
    for (kv, bytes_a_row) in [(KvType::F32, 4 * width), (KvType::F16, 2 * width), (KvType::Q8_0, 2 * 36)] {
        let e = engine("deepseek_v3", kv, 64);
        let cache = e.model.new_cache(64).unwrap();
        assert_eq!(cache.position_bytes(), (layers * bytes_a_row) as u64, "{kv:?}");
    }
    // What a cache of every head's key and value would take, at F32.
    let per_head = layers * c.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim) * 4;
    let latent = engine("deepseek_v3", KvType::F32, 64).model.new_cache(64).unwrap().position_bytes();
    assert_eq!((per_head as u64, latent), (1920, 480), "a quarter of the per-head cache at these widths");
}

/// Every position's log-prob of the next token, through one cache, feeding `ids` in
/// pieces of `step` tokens.
fn log_probs(e: &Engine, ids: &[u32], step: usize) -> (Vec<f64>, Vec<u32>) {
    let mut cache = e.model.new_cache(ids.len()).unwrap();
    let vocab = e.model.config().vocab_size;
    let (mut lp, mut best) = (Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()));
    for (i, piece) in ids.chunks(step).enumerate() {
        let logits = e
            .model
            .forward(&mut [SeqStep { tokens: piece, cache: &mut cache, all_logits: true, verify: false }])
            .unwrap()
            .remove(0);
        for (j, row) in logits.chunks(vocab).enumerate() {
            let at = i * step + j;
            best.push(support::argmax(row));
            if let Some(&next) = ids.get(at + 1) {
                lp.push(support::log_softmax(row)[next as usize]);
            }
        }
    }
    (lp, best)
}

#[test]
fn a_long_prompt_matches_transformers_through_prefill_and_decode() {
    for name in ["deepseek_v3", "deepseek_v3_noq"] {
        let path = format!("{}/tests/fixtures/ref/{name}.long.json", env!("CARGO_MANIFEST_DIR"));
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let ids: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let want: Vec<f64> = r["target_logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let argmax: Vec<u32> = r["argmax"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let gap: Vec<f64> = r["top2_gap"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(ids.len(), 4096);
        let e = engine(name, KvType::F32, ids.len());
        let (prefill, best) = log_probs(&e, &ids, 512);
        let (decode, _) = log_probs(&e, &ids, 1);
        let most = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        let (vs_ref, paths) = (most(&prefill, &want), most(&prefill, &decode));
        eprintln!("{name}: max |Δ log-prob| prefill vs transformers {vs_ref:.2e}, prefill vs decode {paths:.2e}");
        assert!(vs_ref < 1e-3, "{name}: {vs_ref}");
        assert!(paths < 1e-4, "{name}: {paths}");
        // The argmax agrees wherever the two best logits are apart by more than rounding.
        let flips = (0..ids.len()).filter(|&i| gap[i] > 1e-3 && best[i] != argmax[i]).count();
        assert_eq!(flips, 0, "{name}");
        // Decoding far past the trained context still changes with the position: the
        // last positions are not all one token.
        assert!(best[3000..].iter().any(|&b| b != best[3000]), "{name}");
    }
}
