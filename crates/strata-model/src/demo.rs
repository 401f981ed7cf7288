//! The built-in demo model (`strata-demo`, DESIGN.md §7): a tiny Llama-shaped model with
//! deterministic random weights and a real byte-level BPE tokenizer, all made in memory so
//! that `strata serve` answers every API call end to end without a download. Its text is
//! noise by design.
//!
//! Everything here is a pure function of the constants in this file: two calls (in one
//! process or in two) give bit-identical tensors and JSON.

use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result, anyhow};
use rayon::prelude::*;
use serde_json::json;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, NormalizerWrapper, TokenizerBuilder, TokenizerImpl};

use crate::ModelSource;
use crate::config::ModelConfig;
use strata_format::{Checkpoint, ConfigOrigin};
use strata_tensor::tensor::HostTensor;

/// The name the demo model is served under.
pub const DEMO_NAME: &str = "strata-demo";

/// Shape of the demo model (written into its `config.json`).
struct DemoShape {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
}

const SHAPE: DemoShape = DemoShape {
    hidden_size: 128,
    intermediate_size: 320,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
};

/// Target size of the BPE vocabulary before the special tokens are appended.
const BPE_VOCAB_SIZE: usize = 507;

/// Llama-3-style special tokens, appended after the BPE vocabulary in this order.
const BOS: &str = "<|begin_of_text|>";
const EOS: &str = "<|end_of_text|>";
const START_HEADER: &str = "<|start_header_id|>";
const END_HEADER: &str = "<|end_header_id|>";
const EOT: &str = "<|eot_id|>";
const SPECIAL_TOKENS: [&str; 5] = [BOS, EOS, START_HEADER, END_HEADER, EOT];

/// Seed of every weight; each tensor's stream is this mixed with a hash of its name.
const WEIGHT_SEED: u64 = 0x5354_5241_5441_0001; // "STRATA" 1

/// Standard deviation of the projection and embedding weights.
const WEIGHT_STD: f32 = 0.1;
/// Norm weights are `1 + NORM_JITTER * N(0, 1)`: close to 1, but not all equal, so a
/// swapped or ignored norm weight shows up in a parity test.
const NORM_JITTER: f32 = 0.05;

/// The Llama 3 chat template (as shipped in Meta-Llama-3-8B-Instruct).
const CHAT_TEMPLATE: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// The text the demo tokenizer's merges are learned from (original prose, ~3 KB).
const CORPUS: &str = "\
Hello! I am a small demo model. My weights are random numbers, so the words I write \
are noise, but every part of the server around me is real: the tokenizer, the chat \
template, the sampler, the streaming of tokens and the counting of bytes.

The user asks a question and the assistant gives an answer. A system message may \
set the rules of the conversation before the first question. When the answer is \
complete, the assistant ends its turn, and the user can ask another question.

Once upon a time there was a little town by the river. In the morning the baker \
opened the shop, and the smell of fresh bread filled the street. Children walked to \
school, farmers brought apples and potatoes to the market, and the old clock on the \
tower struck eight. In the evening the lights came on one by one, and the people \
went home to eat, to read, and to sleep.

Water boils at 100 degrees Celsius at sea level. The Earth goes around the Sun once \
a year, which is about 365 days, and the Moon goes around the Earth about once a \
month. Light from the Sun takes a little more than eight minutes to reach us. There \
are seven continents and five oceans, and most of the surface of the planet is \
covered by water.

To make a cup of tea, heat the water, put the leaves in the pot, pour the water over \
them and wait three or four minutes. Then pour the tea into a cup. Some people add \
milk or sugar; others prefer it plain. Coffee is made in a similar way, with ground \
beans instead of leaves.

A computer follows instructions. A program is a list of those instructions, written \
in a language that people can read and that the machine can run. Memory holds the \
data the program is working on, and storage keeps files when the power is off. \
Reading from memory is fast; reading from storage is slower, which is why a good \
program reads each byte only once and keeps what it needs close at hand.

What is the weather like today? It is sunny in the north, cloudy in the west, and \
there may be rain in the south later this afternoon. Tomorrow will be cold and \
windy, with a chance of snow on the hills during the night.

Please write a short story about a cat who wanted to fly. Thank you for your help! \
Could you explain how this works, step by step? Here is a simple example: first we \
count the words, then we sort them, and finally we print the ten most common ones.

The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. \
How much wood would a woodchuck chuck if a woodchuck could chuck wood? Numbers such \
as 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42 and 2024 appear in text as well as words.

Good morning, good afternoon and good night. Yes, no, maybe. I think that this is \
true, but I am not sure. Let me know if you have any other questions.
";

/// Builds the demo model in memory (a few milliseconds; see the tests for the time).
pub fn demo_source() -> Result<ModelSource> {
    let tok = build_tokenizer()?;
    // The embedding and head have a row for every token id, rounded up to a multiple of
    // 64 like real checkpoints (with the default sizes there is no padding).
    let vocab_size = tok.size.div_ceil(64) * 64;
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": SHAPE.hidden_size,
        "intermediate_size": SHAPE.intermediate_size,
        "num_hidden_layers": SHAPE.num_hidden_layers,
        "num_attention_heads": SHAPE.num_attention_heads,
        "num_key_value_heads": SHAPE.num_key_value_heads,
        "head_dim": SHAPE.hidden_size / SHAPE.num_attention_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": null,
        "max_position_embeddings": 4096,
        "vocab_size": vocab_size,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": tok.bos,
        "eos_token_id": [tok.eos, tok.eot],
        "torch_dtype": "float32",
    });
    let tokenizer_config = json!({
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": null,
        "add_bos_token": true,
        "add_eos_token": false,
        "clean_up_tokenization_spaces": true,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": added_tokens_decoder(&tok),
    });
    let generation_config = json!({
        "bos_token_id": tok.bos,
        "eos_token_id": [tok.eos, tok.eot],
    });
    let config_json = serde_json::to_string_pretty(&config)?;
    let config = ModelConfig::from_json(&config_json)?;
    let checkpoint = Checkpoint {
        name: DEMO_NAME.to_string(),
        config_json,
        config_origin: ConfigOrigin::Context(DEMO_NAME.to_string()),
        tokenizer_json: tok.json,
        tokenizer_config_json: Some(serde_json::to_string_pretty(&tokenizer_config)?),
        generation_config_json: Some(serde_json::to_string_pretty(&generation_config)?),
        chat_template: None,
        tensors: demo_tensors(vocab_size),
        routing: None,
        sums: Default::default(),
    };
    Ok(ModelSource { checkpoint, config })
}

/// The demo tokenizer, serialized, with the ids the configs refer to.
struct DemoTokenizer {
    json: String,
    /// Number of token ids, special tokens included.
    size: usize,
    bos: u32,
    eos: u32,
    eot: u32,
}

/// Trains a byte-level BPE on [`CORPUS`] (deterministic: the trainer breaks count ties
/// by pair id, and the byte alphabet is sorted), then appends the special tokens and a
/// post-processor that prepends `<|begin_of_text|>`, as Llama 3's tokenizer does.
fn build_tokenizer() -> Result<DemoTokenizer> {
    let mut tokenizer: TokenizerImpl<BPE, NormalizerWrapper, ByteLevel, PostProcessorWrapper, ByteLevel> =
        TokenizerBuilder::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
            .with_post_processor(None)
            .with_decoder(Some(ByteLevel::default()))
            .build()
            .map_err(|e| anyhow!("building the demo tokenizer: {e}"))?;
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(BPE_VOCAB_SIZE)
        .min_frequency(2)
        .initial_alphabet(alphabet)
        .build();
    tokenizer
        .train(&mut trainer, CORPUS.split_inclusive('\n'))
        .map_err(|e| anyhow!("training the demo tokenizer: {e}"))?;
    let specials = SPECIAL_TOKENS.iter().map(|s| AddedToken::from(*s, true));
    tokenizer.add_special_tokens(specials).map_err(|e| anyhow!("adding the demo special tokens: {e}"))?;

    let id = |s: &str| tokenizer.token_to_id(s).with_context(|| format!("demo tokenizer lacks {s}"));
    let (bos, eos, eot) = (id(BOS)?, id(EOS)?, id(EOT)?);
    let template = TemplateProcessing::builder()
        .try_single(format!("{BOS} $A"))
        .map_err(|e| anyhow!("demo post-processor: {e}"))?
        .try_pair(format!("{BOS} $A {BOS}:1 $B:1"))
        .map_err(|e| anyhow!("demo post-processor: {e}"))?
        .special_tokens(vec![(BOS, bos)])
        .build()
        .map_err(|e| anyhow!("demo post-processor: {e}"))?;
    tokenizer.with_post_processor(Some(PostProcessorWrapper::Template(template)));

    let json = tokenizer.to_string(false).map_err(|e| anyhow!("serializing the demo tokenizer: {e}"))?;
    Ok(DemoTokenizer { json, size: tokenizer.get_vocab_size(true), bos, eos, eot })
}

/// `added_tokens_decoder` of `tokenizer_config.json`, as transformers writes it.
fn added_tokens_decoder(tok: &DemoTokenizer) -> serde_json::Value {
    let first = tok.bos as usize;
    let entries = SPECIAL_TOKENS.iter().enumerate().map(|(i, s)| {
        let entry = json!({
            "content": s, "lstrip": false, "normalized": false, "rstrip": false,
            "single_word": false, "special": true,
        });
        ((first + i).to_string(), entry)
    });
    serde_json::Value::Object(entries.collect())
}

/// Every weight of the demo model, by Hugging Face name, in f32.
fn demo_tensors(vocab_size: usize) -> HashMap<String, HostTensor> {
    let h = SHAPE.hidden_size;
    let ffn = SHAPE.intermediate_size;
    let head_dim = h / SHAPE.num_attention_heads;
    let q_dim = SHAPE.num_attention_heads * head_dim;
    let kv_dim = SHAPE.num_key_value_heads * head_dim;

    // (name, shape, mean, std) of every tensor; generated in parallel below (each has
    // its own stream, so the result does not depend on the order).
    let mut specs: Vec<(String, Vec<usize>, f32, f32)> = Vec::new();
    let mut matrix = |name: String, shape: [usize; 2]| specs.push((name, shape.to_vec(), 0.0, WEIGHT_STD));
    matrix("model.embed_tokens.weight".into(), [vocab_size, h]);
    matrix("lm_head.weight".into(), [vocab_size, h]);
    for i in 0..SHAPE.num_hidden_layers {
        let p = format!("model.layers.{i}");
        matrix(format!("{p}.self_attn.q_proj.weight"), [q_dim, h]);
        matrix(format!("{p}.self_attn.k_proj.weight"), [kv_dim, h]);
        matrix(format!("{p}.self_attn.v_proj.weight"), [kv_dim, h]);
        matrix(format!("{p}.self_attn.o_proj.weight"), [h, q_dim]);
        matrix(format!("{p}.mlp.gate_proj.weight"), [ffn, h]);
        matrix(format!("{p}.mlp.up_proj.weight"), [ffn, h]);
        matrix(format!("{p}.mlp.down_proj.weight"), [h, ffn]);
    }
    let mut norm = |name: String| specs.push((name, vec![h], 1.0, NORM_JITTER));
    norm("model.norm.weight".into());
    for i in 0..SHAPE.num_hidden_layers {
        norm(format!("model.layers.{i}.input_layernorm.weight"));
        norm(format!("model.layers.{i}.post_attention_layernorm.weight"));
    }
    specs
        .into_par_iter()
        .map(|(name, shape, mean, std)| {
            let t = random_tensor(&name, shape, mean, std);
            (name, t)
        })
        .collect()
}

/// `mean + std * N(0, 1)` values from a stream seeded by the tensor's name, so each
/// tensor is independent of the order tensors are made in.
fn random_tensor(name: &str, shape: Vec<usize>, mean: f32, std: f32) -> HostTensor {
    let mut rng = SplitMix64(WEIGHT_SEED ^ fnv1a(name.as_bytes()));
    let n: usize = shape.iter().product();
    let mut data = Vec::with_capacity(n + 1);
    while data.len() < n {
        let (a, b) = rng.normal_pair();
        data.push(mean + std * a);
        data.push(mean + std * b);
    }
    data.truncate(n);
    HostTensor::from_f32(&data, shape)
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// SplitMix64 (Steele, Lea & Flood 2014): tiny, fast, and good enough for test weights.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: 53 random bits, never 0 (so `ln` is finite).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Two independent standard normals (Box–Muller).
    fn normal_pair(&mut self) -> (f32, f32) {
        let r = (-2.0 * self.uniform().ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * self.uniform()).sin_cos();
        ((r * cos) as f32, (r * sin) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;
    use tokenizers::Tokenizer;

    fn config(src: &ModelSource) -> serde_json::Value {
        serde_json::from_str(&src.config_json).unwrap()
    }

    #[test]
    fn two_calls_are_identical() {
        let a = demo_source().unwrap();
        let b = demo_source().unwrap();
        assert_eq!(a.name, DEMO_NAME);
        assert_eq!(a.config_json, b.config_json);
        assert_eq!(a.tokenizer_json, b.tokenizer_json);
        assert_eq!(a.tokenizer_config_json, b.tokenizer_config_json);
        assert_eq!(a.generation_config_json, b.generation_config_json);
        assert_eq!(a.tensors.len(), b.tensors.len());
        for (name, t) in &a.tensors {
            let u = &b.tensors[name];
            assert_eq!(t.shape, u.shape, "{name}");
            assert_eq!(t.bytes(), u.bytes(), "{name}");
        }
    }

    /// Pins the learned merges and the weights, so a change in the tokenizers crate's
    /// trainer or in the PRNG (either would change every demo output) is noticed.
    #[test]
    fn output_is_pinned() {
        let src = demo_source().unwrap();
        let tok = Tokenizer::from_str(&src.tokenizer_json).unwrap();
        assert_eq!(tok.get_vocab_size(true), 512);
        let ids = tok.encode("Hello, the user asks a question.", false).unwrap();
        let want = ["H", "ell", "o", ",", "Ġthe", "Ġus", "er", "Ġas", "ks", "Ġa", "Ġquestion", "."];
        assert_eq!(ids.get_tokens(), want);
        assert_eq!(ids.get_ids(), [39, 366, 78, 11, 259, 384, 263, 313, 432, 258, 359, 13]);
        let emb = src.tensors["model.embed_tokens.weight"].as_f32();
        // Box–Muller goes through libm (ln, cos, sin), so allow an ulp or so.
        for (got, want) in emb[..2].iter().zip([-0.002_976_585_2, -0.038_866_09]) {
            assert!((got - want).abs() < 1e-7, "{got} vs {want}");
        }
    }

    #[test]
    fn tokenizer_round_trips_any_utf8() {
        let src = demo_source().unwrap();
        let tok = Tokenizer::from_str(&src.tokenizer_json).unwrap();
        let texts = [
            "Hello, world! The quick brown fox.",
            "emoji 🦀🚀👩‍👩‍👧 and CJK 日本語の文章、中文，한국어",
            "  leading spaces, tabs\tand\nnewlines\r\n\n  ",
            "ünïcödé — “quotes” … €100 ½ ∑ x² 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
            "",
        ];
        for text in texts {
            let enc = tok.encode(text, false).unwrap();
            assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
        }
        // Special tokens are single ids; the post-processor adds BOS like Llama 3.
        let bos = tok.token_to_id(BOS).unwrap();
        let eot = tok.token_to_id(EOT).unwrap();
        let enc = tok.encode("hi<|eot_id|>", true).unwrap();
        assert_eq!(enc.get_ids().first(), Some(&bos));
        assert_eq!(enc.get_ids().last(), Some(&eot));
        assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), "hi");
    }

    #[test]
    fn configs_agree_with_tokenizer() {
        let src = demo_source().unwrap();
        let tok = Tokenizer::from_str(&src.tokenizer_json).unwrap();
        let cfg = config(&src);
        let vocab = cfg["vocab_size"].as_u64().unwrap() as usize;
        assert!(tok.get_vocab_size(true) <= vocab && vocab.is_multiple_of(64));
        let id = |s| tok.token_to_id(s).unwrap() as u64;
        assert_eq!(cfg["bos_token_id"], id(BOS));
        let generation: serde_json::Value =
            serde_json::from_str(src.generation_config_json.as_deref().unwrap()).unwrap();
        assert_eq!(generation["eos_token_id"], json!([id(EOS), id(EOT)]));
        let tc: serde_json::Value = serde_json::from_str(src.tokenizer_config_json.as_deref().unwrap()).unwrap();
        assert_eq!(tc["eos_token"], EOT);
        assert_eq!(tc["added_tokens_decoder"][id(EOT).to_string()]["content"], EOT);
        // The chat template renders with minijinja to the Llama 3 layout.
        let mut env = minijinja::Environment::new();
        env.add_template("chat", tc["chat_template"].as_str().unwrap()).unwrap();
        let out = env
            .get_template("chat")
            .unwrap()
            .render(minijinja::context! {
                messages => vec![minijinja::context! { role => "user", content => " Hi! " }],
                bos_token => BOS,
                add_generation_prompt => true,
            })
            .unwrap();
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn tensors_have_the_configured_shapes() {
        let src = demo_source().unwrap();
        let cfg = config(&src);
        let get = |k: &str| cfg[k].as_u64().unwrap() as usize;
        let (h, ffn, vocab) = (get("hidden_size"), get("intermediate_size"), get("vocab_size"));
        let head_dim = h / get("num_attention_heads");
        let kv = get("num_key_value_heads") * head_dim;
        let layers = get("num_hidden_layers");
        let mut want: HashMap<String, Vec<usize>> = HashMap::new();
        want.insert("model.embed_tokens.weight".into(), vec![vocab, h]);
        want.insert("lm_head.weight".into(), vec![vocab, h]);
        want.insert("model.norm.weight".into(), vec![h]);
        for i in 0..layers {
            let p = format!("model.layers.{i}");
            for (n, s) in [
                ("input_layernorm", vec![h]),
                ("post_attention_layernorm", vec![h]),
                ("self_attn.q_proj", vec![h, h]),
                ("self_attn.k_proj", vec![kv, h]),
                ("self_attn.v_proj", vec![kv, h]),
                ("self_attn.o_proj", vec![h, h]),
                ("mlp.gate_proj", vec![ffn, h]),
                ("mlp.up_proj", vec![ffn, h]),
                ("mlp.down_proj", vec![h, ffn]),
            ] {
                want.insert(format!("{p}.{n}.weight"), s);
            }
        }
        assert_eq!(src.tensors.len(), want.len());
        for (name, shape) in &want {
            let t = src.tensors.get(name).unwrap_or_else(|| panic!("missing {name}"));
            assert_eq!(&t.shape, shape, "{name}");
            assert_eq!(t.numel(), t.as_f32().len(), "{name}");
            assert!(t.as_f32().iter().all(|v| v.is_finite()), "{name}");
        }
        // Weights look like N(0, 0.1), norms like 1 ± small.
        let w = src.tensors["model.layers.0.mlp.up_proj.weight"].as_f32();
        let mean = w.iter().sum::<f32>() / w.len() as f32;
        let std = (w.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / w.len() as f32).sqrt();
        assert!(mean.abs() < 0.005 && (std - WEIGHT_STD).abs() < 0.005, "{mean} {std}");
        let n = src.tensors["model.norm.weight"].as_f32();
        assert!(n.iter().all(|v| (v - 1.0).abs() < 0.3));
        assert!(n.iter().any(|&v| v != n[0]));
    }

    /// Runs at every server start, so it has to be quick; prints the time (no bound
    /// asserted: timing belongs in benchmarks).
    #[test]
    fn build_time_is_printed() {
        let t0 = std::time::Instant::now();
        let tok = build_tokenizer().unwrap();
        let t_tok = t0.elapsed();
        let t1 = std::time::Instant::now();
        let src = demo_source().unwrap();
        let t_all = t1.elapsed();
        eprintln!(
            "demo: tokenizer {:.1} ms ({} ids, {} bytes of JSON), whole model {:.1} ms",
            t_tok.as_secs_f64() * 1e3,
            tok.size,
            tok.json.len(),
            t_all.as_secs_f64() * 1e3
        );
        assert_eq!(src.tokenizer_json, tok.json);
    }
}
