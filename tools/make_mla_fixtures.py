#!/usr/bin/env python3
"""Parity fixtures for DeepSeek-V3-style multi-head latent attention (MLA) with sigmoid, bias-corrected, grouped
routing (DeepseekV3ForCausalLM; llama.cpp arch `deepseek2`) and for GLM-4.5 (Glm4MoeForCausalLM; llama.cpp arch
`glm4moe`), which shares that router.

Written ahead of the Rust side: nothing here is committed by the script. Built on tools/make_arch_fixtures.py and
tools/make_moe_fixtures.py (imported, not copied): the tiny byte-level BPE tokenizer (+ the chat markers below), seed
choice, weight redraw, reference writer, converter runner (tokenizer pre type "gpt-2", explicit general.name),
llama.cpp views (F32 KV cache, CPU, 2 threads) and Q8_0 quantisation. For each model <name>:

  tests/fixtures/hf/<name>/                tiny random-weight checkpoint (F32 safetensors, hidden 64, 3 layers: layer 0
                                           dense (intermediate_size 64), layers 1-2 MoE with 16 routed experts of
                                           width 16 + 1 shared expert), tiny tokenizer, chat template
  tests/fixtures/ref/<name>.json           transformers reference (schema of tools/make_arch_fixtures.py), plus
  tests/fixtures/ref/<name>.logits.bin       "routing": per prompt, [layer][position] -> the chosen expert ids, by
                                           biased score, highest first (null for the dense layer 0);
                                           "routing_weights": their weights in the same order (after
                                           norm_topk_prob and routed_scaling_factor);
                                           "routing_rule"; "routing_min_score_gap" / "routing_min_group_gap": per
                                           prompt, the smallest k-th minus (k+1)-th biased score among the eligible
                                           experts and the smallest topk_group-th minus next group score (null: one
                                           group); "routing_positions_changed_by_bias": (layer, position) pairs whose
                                           expert set differs without e_score_correction_bias (must be > 0)
  tests/fixtures/gguf/<name>.f32.gguf      convert_hf_to_gguf.py --outtype f32 of that checkpoint
  tests/fixtures/gguf/<name>.f32.llamacpp.json
  tests/fixtures/gguf/<name>.q8_0.gguf     llama_cpp.llama_model_quantize(f32 -> LLAMA_FTYPE_MOSTLY_Q8_0 = 7)
  tests/fixtures/gguf/<name>.q8_0.llamacpp.json
                                           llama.cpp views (schema of tools/make_llamacpp_fixtures.py) plus
                                           "gguf_hparams" and "vs_transformers" (as in make_moe_fixtures)

Beyond deepseek_v3 (q_lora_rank, 4 expert groups, YaRN, an MTP layer), deepseek_v3_noq (no query bottleneck, one
group, plain RoPE) and glm4_moe:
  * deepseek_v2_lite, deepseek_v2: DeepseekV2ForCausalLM (model_type deepseek_v2), softmax routing with no correction
    bias and no normalisation, greedy (V2-Lite, no query bottleneck) or group_limited_greedy over 4 groups with YaRN
    mscale 0.707 (V2). llama.cpp ranks groups by their two best scores whatever the model, so deepseek_v2's llama.cpp
    log-probs differ from transformers' where that changes the kept groups (routing_positions_llamacpp_groups_differ
    in its ref JSON): that one model's F32 llama.cpp view is not held to transformers'.
  * deepseek_v3_k256: DeepSeek-V3 at widths K-quants fit (hidden, expert and latent widths of 256; 6 experts in 3
    groups), quantized by llama.cpp to Q4_K_M (LLAMA_FTYPE_MOSTLY_Q4_K_M = 15); only its ref JSON, the Q4_K_M GGUF
    and llama.cpp's view of it are kept (the checkpoint and F32 GGUF are ~17 MB).
Kept Q8_0 files: glm4_moe's and deepseek_v2_lite's; the DeepSeek-V3 and V2 Q8_0 files route apart from llama.cpp
(whose activations are rounded to 8 bits; top-1 0.87-0.94): written, not committed.

How to run (from the repository root; nothing is downloaded, everything is seeded and deterministic):

    /work/venv/bin/python tools/make_mla_fixtures.py [name ...]      # only the named models' files are rewritten

Environment actually used for these files: /work/venv with python 3.11.7, torch 2.15.0 (+cu132 wheel, run on the
CPU), transformers 5.23.0, tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6, jinja2 3.1.6, gguf 0.19.0 (the
versions of tools/make_arch_fixtures.py; also recorded in every JSON); llama-cpp-python 0.3.36 built in /tmp/lcppvenv
(+ gguf 0.19.0, numpy 2.4.6; LCPP_PYTHON); its sdist unpacked in /tmp/lcpp/llama_cpp_python-0.3.36, whose
vendor/llama.cpp (LCPP_DIR) gives convert_hf_to_gguf.py (+ conversion/deepseek.py, conversion/glm.py), gguf-py and
models/templates/. Note: tools/make_fixtures.py deletes tests/fixtures/hf/ and tests/fixtures/ref/ wholesale; run
this script after it.

Models (vocab = the tokenizer's exact size, 521; untied embeddings; eager attention, float32):
  * deepseek_v3      DeepseekV3ForCausalLM. MLA: 4 heads, q_lora_rank 32, kv_lora_rank 32, qk_nope_head_dim 16,
                     qk_rope_head_dim 8, v_head_dim 16, rope_interleave true, rope_theta 10000, YaRN as DeepSeek-V3
                     ships it (factor 4, original_max_position_embeddings 64, beta_fast 32, beta_slow 1, mscale 1.0,
                     mscale_all_dim 1.0), max_position_embeddings 256. Router: sigmoid, e_score_correction_bias,
                     n_group 4, topk_group 2, top-4 of 16, norm_topk_prob, routed_scaling_factor 2.5; config.json also
                     has "scoring_func": "sigmoid", "topk_method": "noaux_tc" (transformers ignores both; llama.cpp's
                     converter turns scoring_func into deepseek2.expert_gating_func, without which deepseek2 defaults
                     to softmax) and num_nextn_predict_layers 1. Template deepseek-ai-DeepSeek-V3.1.jinja (verbatim).
  * deepseek_v3_noq  the same but q_lora_rank null (plain q_proj, as DeepSeek-V2-Lite), n_group 1, topk_group 1, no
                     YaRN (rope_parameters {"rope_type": "default", "rope_theta": 10000}), num_nextn_predict_layers 0.
  * glm4_moe         Glm4MoeForCausalLM: 4 heads / 2 KV heads of 16, partial_rotary_factor 0.5 (NeoX rotation of the
                     first 8 dims), q/k/v bias, q/k RMS norms (use_qk_norm), sigmoid router with
                     e_score_correction_bias, n_group 2, topk_group 1, top-4 of 16, norm_topk_prob,
                     routed_scaling_factor 1.5, num_nextn_predict_layers 1. Template GLM-4.6.jinja (verbatim; llama.cpp
                     has no GLM-4.5 template, and GLM-4.5 and 4.6 share the format); no BOS added (the template writes
                     [gMASK]<sop>); eos <|endoftext|>, generation eos [<|endoftext|>, <|user|>, <|observation|>].
Tokenizer: make_arch_fixtures' tokens + MLA_TOKENS (DeepSeek's <｜begin▁of▁sentence｜> (BOS, added by the
tokenizer) and <｜end▁of▁sentence｜> (EOS, pad) special; <｜User｜>, <｜Assistant｜> and the tool markers non-special
added tokens as in DeepSeek's tokenizer.json; GLM's [gMASK], <sop>, <|observation|> special; llama.cpp's GLM vocab
code requires [gMASK], <|user|>, <|endoftext|>, <|observation|>). Both real templates render with it; chats are those
of make_fixtures.py.

config.json: as transformers 5.23 writes it (rope_parameters, not the published rope_scaling + rope_theta), except
that for the DeepSeek models the derived "head_dim" (= qk_rope_head_dim, 8) and "qk_head_dim" (24) that transformers
adds are removed, as published configs have neither (hub_config checks that transformers reads the same config and
weights back). Note arch_config["head_dim"] in the ref JSON is transformers' config.head_dim, i.e. 8 for DeepSeek.

Weights: make_arch_fixtures.redraw_weights (std-0.2 projections), plus e_score_correction_bias ~ N(0, 0.1) in every
MoE layer (transformers initialises it to zeros and the redraw only touches parameters); the script asserts that the
bias changes some expert choice on the prompts.

Multi-token prediction (deepseek_v3, glm4_moe): after the reference is computed, model.safetensors gets one MTP layer
model.layers.3.*, laid out as DeepSeek-V3's layer 61 / GLM-4.5's layer 92: a full MoE decoder layer (input_layernorm,
self_attn.*, post_attention_layernorm, mlp.gate.{weight,e_score_correction_bias}, mlp.experts.<e>.*,
mlp.shared_experts.*) + enorm, hnorm, eh_proj [H, 2H], shared_head.norm, shared_head.head [V, H], embed_tokens [V, H]
(the last two copies of lm_head / embed_tokens: DeepSeek-V3 shares them with its MTP module). transformers has no
module for them (load report: UNEXPECTED) and the script checks that it loads the directory to the same weights and
identical logits. llama.cpp's converter:
  * deepseek2 (DeepseekV2Model.skip_mtp = True, conversion/deepseek.py): drops every model.layers.<n >= 3>.* tensor;
    the GGUF has block_count 3 and no nextn key or tensor.
  * glm4moe (Glm4MoeModel): keeps them: block_count 4, glm4moe.nextn_predict_layers 1, blk.3.* with the decoder
    layer's usual names plus blk.3.nextn.{eh_proj,embed_tokens,enorm,hnorm,shared_head_head,shared_head_norm};
    llama.cpp then runs 3 layers (n_layer = block_count - nextn_predict_layers) and skips the MTP tensors.
  Both convert the directory as it is (no copy without the MTP layer is needed).

Config choices and patches forced by llama.cpp 0.3.36 (both references compute the same function; the F32
transformers-vs-llama.cpp differences are ~2e-6):
  * YaRN mscale (src/llama-context.cpp, src/models/deepseek2.cpp, the converter's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]):
    the converter writes only rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim (and no attn_factor); llama.cpp
    never reads mscale: it assumes mscale = 1, except for deepseek2 with mscale_all_dim != 1, where it takes
    mscale = mscale_all_dim (DeepSeek-V2-Lite's 0.707/0.707). It then uses cos/sin scaled by
    get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) and kq_scale = get_mscale(f, mscale_all_dim)^2 /
    sqrt(qk_nope + qk_rope), which is transformers' DeepSeek-V3 computation (attention_factor and
    yarn_apply_mscale) exactly when mscale == mscale_all_dim or mscale == 1 == mscale_all_dim. DeepSeek-V3's own
    values (1.0 / 1.0) satisfy that, so they are used unchanged.
  * rope_interleave true: deepseek2 uses llama.cpp's NORM rope (consecutive pairs), which is transformers'
    rope_interleave=True; the converter does not permute. glm4moe uses NEOX (rotate_half), as transformers.
  * deepseek_v3_noq: llama.cpp's deepseek2 loader requires deepseek2.attention.q_lora_rank unless the layer count is
    that of a known "lite" model (26 or 27 layers, or 48 with a 128256 vocab), and the converter writes the key only
    when q_lora_rank is set, so the plain converter's 3-layer GGUF fails to load ("key not found in model:
    deepseek2.attention.q_lora_rank"; checked). The converter runner therefore gets Q_LORA_PATCH: after
    DeepseekV2Model.set_gguf_parameters, q_lora_rank = 0 is written when config.json's is null (0 selects
    attn_q instead of attn_q_a/attn_q_a_norm/attn_q_b in the loader and graph). The noq GGUFs are the only ones that
    differ from a plain conversion, by that one key. No GGUF metadata is edited afterwards.
  * GLM: the converter writes no tokenizer.ggml.add_bos_token (llama.cpp's default for gpt2/"gpt-2" is no BOS) and
    bos_token_id = [gMASK]; prompt ids agree with transformers.

Routing and seeds: make_arch_fixtures.pick_seed's criteria (clear greedy argmax at every step, varied continuation),
then, over the prompts and their greedy continuations, every sparse layer and position: k-th minus (k+1)-th biased
score (sigmoid + bias, the value that chooses) among the experts of the kept groups >= MIN_SCORE_GAP, and, with
n_group > 1, topk_group-th minus (topk_group+1)-th group score (sum of a group's 2 largest biased scores) >=
MIN_GROUP_GAP. routing_of recomputes transformers' choice (route) and checks it against the router's own indices and
weights. Prompts: make_fixtures.PROMPTS (23-26 tokens; make_reference requires 14-30), so no prompt passes
original_max_position_embeddings (64): YaRN enters through its frequencies and attention scale only, both of which
apply at every position.

Q8_0: rows of 16 values (expert down projections, attn_k_b's rows of qk_nope_head_dim, ...) are not a multiple of
Q8_0's 32-value block and stay F16; norms, biases, routers F32; tensor_types in the q8_0 JSON lists all. Q8_0 moves
router inputs enough to change expert choices: its log-prob differences (0.2-0.5) are not bounded.

Sizes: MAX_FIXTURE_BYTES (4 MB per model) instead of make_arch_fixtures' 1 MB: with the dimensions above each F32
copy of the weights is ~0.9 MB (16 experts x 3 x 16 x 64 per MoE layer), and the MTP layer adds ~0.55 MB to the
safetensors (and to glm4moe's GGUFs).

Checks (the script fails otherwise): those of make_arch_fixtures (saved weights = in-memory ones, F32; every knob moves
the logits; cached greedy == uncached greedy; tokenizers agree; llama.cpp's prompt ids = transformers') plus: recomputed
routing = transformers'; the correction bias changes some choice; MTP layer ignored by transformers; F32 max |log-prob
diff| transformers vs llama.cpp <= MAX_LOGPROB_DIFF (1e-3); no tokenization mismatch; the Q8_0 GGUF contains Q8_0
tensors; each model's files < MAX_FIXTURE_BYTES. Running it twice gives byte-identical files.
"""

import copy
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
GENERATOR = "tools/make_mla_fixtures.py"

sys.path.insert(0, str(TOOLS))
import make_arch_fixtures as maf  # noqa: E402  (tokenizer, model redraw, reference writer, converter, views)
import make_fixtures as mf  # noqa: E402
import make_moe_fixtures as mmf  # noqa: E402  (llama.cpp worker + Q8_0, fixture_files; it patches maf, see below)

import gguf  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
)

ROOT, HF_DIR, REF_DIR, GGUF_DIR = maf.ROOT, maf.HF_DIR, maf.REF_DIR, maf.GGUF_DIR
MAX_LOGPROB_DIFF = maf.MAX_LOGPROB_DIFF  # 1e-3
# Per model: hf dir + ref + both GGUFs and their JSONs. The dimensions asked for (hidden 64, 3 layers, 16 experts of
# width 16, + one MTP layer in the safetensors) need 2.4-3.6 MB: the 1 MB of make_arch_fixtures cannot be met.
MAX_FIXTURE_BYTES = 4_000_000
MIN_SCORE_GAP = 1e-3  # k-th minus (k+1)-th biased sigmoid score among the eligible experts, every layer/position
MIN_GROUP_GAP = 1e-3  # topk_group-th minus (topk_group+1)-th group score, every layer/position (n_group > 1)
BIAS_STD = 0.1  # e_score_correction_bias ~ N(0, BIAS_STD) (transformers initialises it to zeros)

maf.GENERATOR = GENERATOR  # make_reference writes it into the ref JSON (make_moe_fixtures set its own)
maf.GGUF_NAMES.update(
    deepseek_v3="Strata Tiny DeepSeek V3",
    deepseek_v3_noq="Strata Tiny DeepSeek V2 Lite",
    glm4_moe="Strata Tiny GLM 4.5",
    deepseek_v2_lite="Strata Tiny DeepSeek V2 Lite (V2 config)",
    deepseek_v2="Strata Tiny DeepSeek V2",
    deepseek_v3_k256="Strata Tiny DeepSeek V3 K256",
)
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15

# (content, special): appended after make_arch_fixtures' tokens. DeepSeek-V3.1 marks <｜begin▁of▁sentence｜> and
# <｜end▁of▁sentence｜> special and the role / tool markers non-special (as <think>, </think>); GLM-4.5's markers are
# all special (<|system|>, <|user|>, <|assistant|>, <|endoftext|> are already in make_arch_fixtures' list).
MLA_TOKENS = [
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<｜User｜>", False),
    ("<｜Assistant｜>", False),
    ("<｜tool▁calls▁begin｜>", False),
    ("<｜tool▁calls▁end｜>", False),
    ("<｜tool▁call▁begin｜>", False),
    ("<｜tool▁call▁end｜>", False),
    ("<｜tool▁sep｜>", False),
    ("<｜tool▁output▁begin｜>", False),
    ("<｜tool▁output▁end｜>", False),
    ("[gMASK]", True),
    ("<sop>", True),
    ("<|observation|>", True),
]

maf.EXTRA_TOKENIZATION_STRINGS = maf.EXTRA_TOKENIZATION_STRINGS + [
    "<｜begin▁of▁sentence｜>sys<｜User｜>Hi!<｜Assistant｜><think></think>Hello.<｜end▁of▁sentence｜>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    "<｜tool▁output▁begin｜>ok<｜tool▁output▁end｜>",
    "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\n<think></think>\nHello<|observation|><|endoftext|>",
]

DS_ARCH_KEYS = ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "qk_head_dim", "v_head_dim",
                "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                "first_k_dense_replace", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob",
                "scoring_func", "topk_method", "rope_interleave", "rope_parameters", "max_position_embeddings",
                "num_nextn_predict_layers", "attention_bias", "tie_word_embeddings", "rms_norm_eps"]
GLM_ARCH_KEYS = ["head_dim", "use_qk_norm", "attention_bias", "n_routed_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group",
                 "routed_scaling_factor", "norm_topk_prob", "rope_parameters", "num_nextn_predict_layers",
                 "tie_word_embeddings", "rms_norm_eps"]

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
# DeepSeek-V2's own YaRN mscales (0.707 / 0.707; its factor is 40, ours 4 as above).
YARN_V2 = dict(YARN, mscale=0.707, mscale_all_dim=0.707)
DS2_ARCH_KEYS = [k for k in DS_ARCH_KEYS if k not in ("rope_interleave", "num_nextn_predict_layers")]
PLAIN_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def model_specs(V, ids):
    ds = dict(
        vocab_size=V,
        hidden_size=64,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        intermediate_size=64,
        moe_intermediate_size=16,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        rope_interleave=True,
        max_position_embeddings=256,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        attention_bias=False,
        tie_word_embeddings=False,
        scoring_func="sigmoid",  # not read by transformers; in DeepSeek-V3's config.json, and llama.cpp's converter
        topk_method="noaux_tc",  # writes expert_gating_func from scoring_func (deepseek2 defaults to softmax)
        bos_token_id=ids["<｜begin▁of▁sentence｜>"],
        eos_token_id=ids["<｜end▁of▁sentence｜>"],
        pad_token_id=None,
    )
    ds_tok = dict(add_bos=True, bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>", pad="<｜end▁of▁sentence｜>")
    ds_gen = dict(bos_token_id=ids["<｜begin▁of▁sentence｜>"], eos_token_id=ids["<｜end▁of▁sentence｜>"])
    ds_template = maf.read_template("deepseek-ai-DeepSeek-V3.1.jinja")
    ds_io = dict(tok=ds_tok, template=ds_template, gen=ds_gen,
                 template_source="llama.cpp models/templates/deepseek-ai-DeepSeek-V3.1.jinja")
    # DeepSeek-V2 / V2-Lite (DeepseekV2ForCausalLM): the same layers; softmax routing with no correction bias and no
    # normalisation (transformers 5.23 ignores norm_topk_prob, false in both published configs), greedy (V2-Lite) or
    # group_limited_greedy (V2: groups ranked by their best expert); interleaved RoPE always (no rope_interleave key).
    ds2 = {k: v for k, v in ds.items() if k not in ("rope_interleave", "topk_method")}
    ds2.update(scoring_func="softmax", norm_topk_prob=False)
    ds_knobs = {
        "routed_scaling_factor": {"routed_scaling_factor": 1.0},
        "norm_topk_prob": {"norm_topk_prob": False},
        "rope_interleave": {"rope_interleave": False},
    }
    return [
        dict(
            name="deepseek_v3",
            cls=DeepseekV3ForCausalLM,
            cfg=DeepseekV3Config(**ds, q_lora_rank=32, n_group=4, topk_group=2, rope_parameters=dict(YARN),
                                 num_mtp_layers=1),
            **ds_io,
            arch=DS_ARCH_KEYS,
            knobs={**ds_knobs, "topk_group": {"topk_group": 3}, "yarn": {"rope_parameters": dict(PLAIN_ROPE)}},
            mtp=True,
            hub_config=True,
        ),
        dict(
            name="deepseek_v3_noq",
            cls=DeepseekV3ForCausalLM,
            cfg=DeepseekV3Config(**ds, q_lora_rank=None, n_group=1, topk_group=1, rope_parameters=dict(PLAIN_ROPE),
                                 num_mtp_layers=0),
            **ds_io,
            arch=DS_ARCH_KEYS,
            knobs=ds_knobs,
            mtp=False,
            hub_config=True,
        ),
        dict(
            name="glm4_moe",
            cls=Glm4MoeForCausalLM,
            cfg=Glm4MoeConfig(
                vocab_size=V,
                hidden_size=64,
                num_hidden_layers=3,
                first_k_dense_replace=1,
                intermediate_size=64,
                moe_intermediate_size=16,
                n_routed_experts=16,
                num_experts_per_tok=4,
                n_group=2,
                topk_group=1,
                n_shared_experts=1,
                routed_scaling_factor=1.5,
                norm_topk_prob=True,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                use_qk_norm=True,
                attention_bias=True,
                hidden_act="silu",
                rms_norm_eps=1e-5,
                max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                tie_word_embeddings=False,
                num_mtp_layers=1,
                bos_token_id=None,
                eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
                pad_token_id=ids["<|endoftext|>"],
            ),
            tok=dict(add_bos=False, bos=None, eos="<|endoftext|>", pad="<|endoftext|>"),
            template=maf.read_template("GLM-4.6.jinja"),
            template_source="llama.cpp models/templates/GLM-4.6.jinja (no GLM-4.5 template in that folder; "
                            "zai-org/GLM-4.5 and GLM-4.6 share the format)",
            gen=dict(eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
                     pad_token_id=ids["<|endoftext|>"]),
            arch=GLM_ARCH_KEYS,
            knobs={
                "routed_scaling_factor": {"routed_scaling_factor": 1.0},
                "norm_topk_prob": {"norm_topk_prob": False},
                "topk_group": {"topk_group": 2},
                "partial_rotary_factor": {
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}},
            },
            mtp=True,
            hub_config=False,
        ),
        dict(
            name="deepseek_v2_lite",
            cls=DeepseekV2ForCausalLM,
            cfg=DeepseekV2Config(**dict(ds2, routed_scaling_factor=1.0), q_lora_rank=None, topk_method="greedy",
                                 n_group=1, topk_group=1, rope_parameters=dict(PLAIN_ROPE)),
            **ds_io,
            arch=DS2_ARCH_KEYS,
            knobs={"routed_scaling_factor": {"routed_scaling_factor": 2.0}},
            mtp=False,
            hub_config=True,
        ),
        dict(
            name="deepseek_v2",
            cls=DeepseekV2ForCausalLM,
            cfg=DeepseekV2Config(**dict(ds2, routed_scaling_factor=16.0), q_lora_rank=32,
                                 topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                 rope_parameters=dict(YARN_V2)),
            **ds_io,
            arch=DS2_ARCH_KEYS,
            knobs={"routed_scaling_factor": {"routed_scaling_factor": 1.0}, "topk_group": {"topk_group": 3},
                   "yarn": {"rope_parameters": dict(PLAIN_ROPE)}},
            mtp=False,
            hub_config=True,
        ),
        # Widths that K-quants fit (rows of 256); only its Q4_K_M GGUF and reference are kept (see kquant_files).
        dict(
            name="deepseek_v3_k256",
            cls=DeepseekV3ForCausalLM,
            cfg=DeepseekV3Config(**dict(ds, hidden_size=256, intermediate_size=256, moe_intermediate_size=256,
                                        n_routed_experts=6, num_experts_per_tok=2, kv_lora_rank=256,
                                        qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=64),
                                 q_lora_rank=256, n_group=3, topk_group=2, rope_parameters=dict(YARN),
                                 num_mtp_layers=0),
            **ds_io,
            arch=DS_ARCH_KEYS,
            knobs={**ds_knobs, "topk_group": {"topk_group": 3}, "yarn": {"rope_parameters": dict(PLAIN_ROPE)}},
            mtp=False,
            hub_config=True,
            kquant=True,
        ),
    ]


def build_tokenizer():
    base, ids = maf.build_tokenizer()
    from tokenizers import AddedToken

    for content, special in MLA_TOKENS:
        tok = AddedToken(content, special=special, normalized=False)
        n = base.add_special_tokens([tok]) if special else base.add_tokens([tok])
        assert n == 1, content
        ids[content] = base.token_to_id(content)
    assert len(set(ids.values())) == len(ids)
    return base, ids


# ----------------------------------------------------------------------------------------------------------------------
# Weights: make_arch_fixtures' redraw, plus the router's e_score_correction_bias (a buffer: the redraw skips it)
# ----------------------------------------------------------------------------------------------------------------------


def routers(model):
    return [(i, layer.mlp.gate) for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]


def redraw_bias(model, seed):
    g = torch.Generator().manual_seed(seed + 13)
    with torch.no_grad():
        for _, gate in routers(model):
            if not hasattr(gate, "e_score_correction_bias"):  # DeepSeek-V2
                continue
            b = gate.e_score_correction_bias
            b.copy_(BIAS_STD * torch.randn(b.shape, generator=g, dtype=torch.float32))


_make_model = maf.make_model


def make_model(spec, seed):
    model = _make_model(spec, seed)
    redraw_bias(model, seed)
    return model


maf.make_model = make_model  # used by maf.pick_seed and maf.build_model


# ----------------------------------------------------------------------------------------------------------------------
# Routing (DeepseekV3TopkRouter / Glm4MoeTopkRouter, transformers 5.23: the same rule)
# ----------------------------------------------------------------------------------------------------------------------


def route(gate, logits, use_bias=True):
    if hasattr(gate, "topk_method"):
        return route_v2(gate, logits)
    """transformers' rule, recomputed: scores = sigmoid(logits); choice = scores + e_score_correction_bias;
    group score = sum of the 2 largest choice values of each of n_group equal groups; keep the topk_group best
    groups; top_k experts by choice among them; weights = scores of those (/ their sum if norm_topk_prob) *
    routed_scaling_factor. Returns (ids sorted by choice value, descending; their weights; min expert gap; min
    group gap)."""
    scores = logits.float().sigmoid()
    choice = scores + gate.e_score_correction_bias if use_bias else scores.clone()
    T, E = choice.shape
    G, k = gate.num_group, gate.top_k
    groups = choice.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)
    group_gap = float("inf")
    if G > 1:
        gs = groups.sort(dim=-1, descending=True).values
        group_gap = float((gs[:, gate.topk_group - 1] - gs[:, gate.topk_group]).min())
    keep = torch.zeros_like(groups).scatter_(1, groups.topk(gate.topk_group, dim=-1).indices, 1.0)
    keep = keep.unsqueeze(-1).expand(T, G, E // G).reshape(T, E).bool()
    masked = choice.masked_fill(~keep, float("-inf"))
    top = masked.sort(dim=-1, descending=True)
    idx = top.indices[:, :k]
    gap = top.values[:, k - 1] - top.values[:, k]
    expert_gap = float(gap[torch.isfinite(gap)].min()) if torch.isfinite(gap).any() else float("inf")
    w = scores.gather(1, idx)
    if gate.norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * gate.routed_scaling_factor
    return idx, w, expert_gap, group_gap


def route_v2(gate, logits):
    """DeepseekV2TopkRouter's rule, recomputed: scores = softmax(logits); greedy: top_k by score;
    group_limited_greedy: groups ranked by their best score, topk_group kept, the others' scores set to 0, top_k by
    score; weights = those scores * routed_scaling_factor (never normalised). The gaps are in log-probabilities (router
    logits), as softmax probabilities of 16 experts are close in absolute terms: the expert gap is the k-th minus the
    (k+1)-th logit among the kept experts, the group gap the smaller of the topk_group-th minus next log group score
    under transformers' rule (best expert) and under llama.cpp's (sum of the 2 best, which its deepseek2 uses whatever
    the model). Returns what route returns, plus the rows whose kept groups differ under llama.cpp's rule."""
    scores = logits.float().softmax(dim=-1)
    T, E = scores.shape
    k = gate.top_k
    group_gap, llamacpp_differs = float("inf"), 0
    if gate.topk_method == "group_limited_greedy":
        G, kg = gate.num_group, gate.topk_group
        per_group = scores.view(T, G, E // G)
        best = per_group.max(dim=-1).values.log()
        two = per_group.topk(2, dim=-1).values.sum(-1).log()
        kept = best.topk(kg, dim=-1).indices
        llamacpp_differs = sum(set(a) != set(b) for a, b in zip(kept.tolist(), two.topk(kg, dim=-1).indices.tolist()))
        if G > kg:
            gb, gt = best.sort(dim=-1, descending=True).values, two.sort(dim=-1, descending=True).values
            group_gap = min(float((gb[:, kg - 1] - gb[:, kg]).min()), float((gt[:, kg - 1] - gt[:, kg]).min()))
        keep = torch.zeros_like(best).scatter_(1, kept, 1.0)
        keep = keep.unsqueeze(-1).expand(T, G, E // G).reshape(T, E).bool()
        scores = scores.masked_fill(~keep, 0.0)
    else:
        assert gate.topk_method == "greedy", gate.topk_method
    top = scores.sort(dim=-1, descending=True)
    idx = top.indices[:, :k]
    gap = top.values[:, k - 1].log() - top.values[:, k].log()
    w = scores.gather(1, idx) * gate.routed_scaling_factor
    return idx, w, float(gap.min()), group_gap, llamacpp_differs


def routing_of(model, ids):
    """Per sparse layer: expert ids and weights per position, the min gaps, and the ids without the correction bias;
    None for a dense layer. Checks the recomputed choice against the router's own output."""
    records = {}

    def hook_for(i):
        def hook(mod, inp, out):
            logits, weights, idx = out
            mine, w, gap, ggap, *differs = route(mod, logits)
            assert [sorted(r) for r in mine.tolist()] == [sorted(r) for r in idx.tolist()], i
            order = [[r.index(e) for e in m] for r, m in zip(idx.tolist(), mine.tolist())]
            theirs = torch.stack([weights[t, order[t]] for t in range(len(order))])
            assert torch.allclose(theirs, w, rtol=1e-6, atol=1e-7), i
            nobias = route(mod, logits, use_bias=False)[0] if hasattr(mod, "e_score_correction_bias") else mine
            records[i] = dict(ids=mine.tolist(), weights=w.tolist(), gap=gap, group_gap=ggap,
                              ids_without_bias=nobias.tolist(), llamacpp_groups_differ=sum(differs))

        return hook

    handles = [gate.register_forward_hook(hook_for(i)) for i, gate in routers(model)]
    try:
        mf.logits_of(model, ids)
    finally:
        for hd in handles:
            hd.remove()
    assert len(records) == len(handles) >= 1
    return [records.get(i) for i in range(model.config.num_hidden_layers)]


def gaps(recs):
    live = [r for r in recs if r is not None]
    return min(r["gap"] for r in live), min(r["group_gap"] for r in live)


def bias_changes(recs):
    """(layer, position) pairs whose chosen expert set differs without the correction bias."""
    return sum(sorted(a) != sorted(b) for r in recs if r is not None for a, b in zip(r["ids"], r["ids_without_bias"]))


_pick_seed = mmf._pick_seed  # make_arch_fixtures.pick_seed (make_moe_fixtures replaced maf.pick_seed with its own)


def pick_seed(spec, hf_tok, first_seed, notes):
    """make_arch_fixtures.pick_seed (clear greedy argmax at every step, varied continuation), then a clear router
    decision on the prompts and their greedy continuations: expert gap >= MIN_SCORE_GAP and group gap >=
    MIN_GROUP_GAP, both on the biased scores that choose."""
    seed = first_seed
    while seed < first_seed + 400:
        scratch = []
        seed = _pick_seed(spec, hf_tok, seed, scratch)
        model = maf.make_model(spec, seed)
        gap, ggap = float("inf"), float("inf")
        for text in mf.PROMPTS:
            ids = hf_tok(text)["input_ids"]
            g = mf.greedy_with_cache(model, ids, mf.N_GREEDY)
            a, b = gaps(routing_of(model, ids + g[:-1]))
            gap, ggap = min(gap, a), min(ggap, b)
        if gap >= MIN_SCORE_GAP and ggap >= MIN_GROUP_GAP:
            notes.extend(scratch)
            notes.append(f"{spec['name']}: seed {seed}: min expert score gap (prompts + greedy) {gap:.4f}, "
                         f"min group gap {ggap:.4f}")
            return seed
        seed += 1
    raise RuntimeError(f"no suitable seed for {spec['name']}")


maf.pick_seed = pick_seed  # used by maf.build_model


def add_routing(spec, ref_model, refj, notes):
    """Routing of every prompt into the ref JSON (rewritten in make_reference's format)."""
    routing, weights, sgaps, ggaps, changed, differ = [], [], [], [], 0, 0
    for p in refj["prompts"]:
        recs = routing_of(ref_model, p["ids"])
        assert all(r is None or len(r["ids"]) == len(p["ids"]) for r in recs)
        routing.append([None if r is None else r["ids"] for r in recs])
        weights.append([None if r is None else [[round(x, 7) for x in w] for w in r["weights"]] for r in recs])
        a, b = gaps(recs)
        sgaps.append(a)
        ggaps.append(None if b == float("inf") else b)
        changed += bias_changes(recs)
        differ += sum(r["llamacpp_groups_differ"] for r in recs if r is not None)
    v2 = spec["cls"] is DeepseekV2ForCausalLM
    assert v2 or changed > 0, f"{spec['name']}: the correction bias changes no expert choice"
    refj["routing"] = routing
    refj["routing_weights"] = weights
    refj["routing_rule"] = (
        f"softmax(router logits) chooses ({spec['cfg'].topk_method}"
        + (": groups ranked by their best score, topk_group groups kept, " if spec["cfg"].n_group > 1 else ": ")
        + "top-k experts by score); weights = those scores * routed_scaling_factor, never normalised. "
        "routing[prompt][layer][position] lists the chosen expert ids by score, highest first (null: dense layer); "
        "routing_weights the weights in the same order" if v2 else
        "sigmoid(router logits) + e_score_correction_bias chooses: groups ranked by the sum of their 2 largest "
        "biased scores, topk_group groups kept, top-k experts by biased score among them; weights = unbiased "
        "sigmoid scores of the chosen, / their sum (norm_topk_prob), * routed_scaling_factor. routing[prompt][layer]"
        "[position] lists the chosen expert ids by biased score, highest first (null: dense layer); "
        "routing_weights the weights in the same order")
    refj["routing_min_score_gap"] = sgaps
    refj["routing_min_group_gap"] = ggaps
    if not v2:
        refj["routing_positions_changed_by_bias"] = changed
    else:
        refj["routing_gaps_in"] = "log-probabilities (router logits)"
        if spec["cfg"].n_group > 1:
            refj["routing_positions_llamacpp_groups_differ"] = differ
    (REF_DIR / f"{spec['name']}.json").write_text(json.dumps(refj, indent=1, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")
    notes.append(f"{spec['name']}: routing recorded; min expert score gap {min(sgaps):.4f}, min group gap "
                 f"{min([g for g in ggaps if g is not None], default=float('nan')):.4f}; without the correction bias "
                 f"{changed} (layer, position) expert sets would differ")


# ----------------------------------------------------------------------------------------------------------------------
# config.json as published, multi-token-prediction layer
# ----------------------------------------------------------------------------------------------------------------------


def same_model(a, b):
    assert a.config.to_dict() == b.config.to_dict()
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def hub_config(spec, d, ref, notes):
    """transformers 5.23 writes DeepSeek-V3's derived "head_dim" (= qk_rope_head_dim) and "qk_head_dim" (= nope + rope)
    into config.json; published DeepSeek-V3 / V2-Lite configs have neither (DeepseekV3Config.__post_init__ derives
    both). Drops them and checks that transformers reads the same config and weights back."""
    p = d / "config.json"
    cfg = json.loads(p.read_text(encoding="utf-8"))
    assert cfg.pop("head_dim") == cfg["qk_rope_head_dim"]
    assert cfg.pop("qk_head_dim") == cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    again = maf.load_ref(spec, d)
    same_model(ref, again)
    notes.append(f"{spec['name']}: config.json without the derived head_dim / qk_head_dim (as published configs)")
    return again


def mtp_tensors(spec, ref, seed):
    """One multi-token-prediction layer, model.layers.<num_hidden_layers>.*, laid out as DeepSeek-V3's layer 61 and
    GLM-4.5's layer 92 / GLM-4.5-Air's layer 46: a full (MoE) decoder layer plus enorm, hnorm, eh_proj [H, 2H],
    shared_head.norm, shared_head.head [V, H] and embed_tokens [V, H]. The decoder layer comes from the same
    architecture with one more layer (seeded; make_model's redraw); embed_tokens and shared_head.head are copies of
    the main model's embedding and lm_head (DeepSeek-V3 shares them between the model and its MTP module)."""
    cfg = copy.deepcopy(spec["cfg"])
    n = cfg.num_hidden_layers
    cfg.num_hidden_layers = n + 1
    big = maf.make_model(dict(spec, cfg=cfg), seed + 1)
    with tempfile.TemporaryDirectory() as tmp:
        big.save_pretrained(tmp, safe_serialization=True)
        sd = load_file(str(Path(tmp) / "model.safetensors"))
    pre = f"model.layers.{n}."
    out = {k: v.contiguous() for k, v in sd.items() if k.startswith(pre)}
    assert any(".mlp.experts." in k for k in out) and any(".mlp.gate.e_score_correction_bias" in k for k in out)
    H = cfg.hidden_size
    g = torch.Generator().manual_seed(seed + 29)
    out[pre + "enorm.weight"] = 1.0 + 0.1 * torch.randn(H, generator=g)
    out[pre + "hnorm.weight"] = 1.0 + 0.1 * torch.randn(H, generator=g)
    out[pre + "eh_proj.weight"] = 0.1 * torch.randn(H, 2 * H, generator=g)
    out[pre + "shared_head.norm.weight"] = 1.0 + 0.1 * torch.randn(H, generator=g)
    out[pre + "shared_head.head.weight"] = ref.lm_head.weight.detach().clone()
    out[pre + "embed_tokens.weight"] = ref.model.embed_tokens.weight.detach().clone()
    return out


def add_mtp(spec, d, ref, seed, refj, notes):
    """Adds the MTP layer to model.safetensors after the reference was computed, and checks that transformers loads
    the directory to the same model (it has no module for these tensors) and the same logits."""
    st = d / "model.safetensors"
    sd = load_file(str(st))
    with safe_open(str(st), framework="pt") as f:
        meta = f.metadata()
    extra = mtp_tensors(spec, ref, seed)
    assert not set(extra) & set(sd)
    save_file({**sd, **extra}, str(st), metadata=meta)
    st.chmod(0o644)
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    assert cfg["num_nextn_predict_layers"] == 1, cfg.get("num_nextn_predict_layers")
    again = maf.load_ref(spec, d)
    same_model(ref, again)
    for p in refj["prompts"]:
        assert torch.equal(mf.logits_of(again, p["ids"]), mf.logits_of(ref, p["ids"]))
    n = sum(v.numel() for v in extra.values())
    notes.append(f"{spec['name']}: MTP layer model.layers.{spec['cfg'].num_hidden_layers}.* added "
                 f"({len(extra)} tensors, {n} values); transformers reloads the same weights and identical logits")
    return sorted(extra)


# ----------------------------------------------------------------------------------------------------------------------
# llama.cpp
# ----------------------------------------------------------------------------------------------------------------------

# Inserted into make_arch_fixtures' converter runner before it hands over to convert_hf_to_gguf.py (see the docstring:
# llama.cpp's deepseek2 loader requires attention.q_lora_rank unless the layer count is that of a "lite" model).
Q_LORA_PATCH = r"""
from conversion import deepseek as _ds
_sgp = _ds.DeepseekV2Model.set_gguf_parameters
def _set_gguf_parameters(self):
    _sgp(self)
    if self.hparams.get("q_lora_rank") is None:
        self.gguf_writer.add_q_lora_rank(0)
_ds.DeepseekV2Model.set_gguf_parameters = _set_gguf_parameters
"""
_ANCHOR = 'sys.argv = ["convert_hf_to_gguf.py"'
assert maf.CONVERT_RUNNER.count(_ANCHOR) == 1
maf.CONVERT_RUNNER = maf.CONVERT_RUNNER.replace(_ANCHOR, Q_LORA_PATCH + _ANCHOR)


def llamacpp_reference(name, variant, gguf_path, ref, quant_src=None):
    view = mmf.llamacpp_reference(name, variant, gguf_path, ref, quant_src)
    view["generator"] = GENERATOR
    out = GGUF_DIR / f"{name}.{variant}.llamacpp.json"
    out.write_text(json.dumps(view, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return view


quantize = mmf.quantize


def kquant_files(name):
    return [REF_DIR / f"{name}.json", REF_DIR / f"{name}.logits.bin", GGUF_DIR / f"{name}.q4_k_m.gguf",
            GGUF_DIR / f"{name}.q4_k_m.llamacpp.json"]


def kquant_ggufs(spec, d, refj, notes):
    """The K-quant model: F32 conversion in a temporary folder, checked against transformers (its view is not kept),
    then llama_model_quantize(f32 -> LLAMA_FTYPE_MOSTLY_Q4_K_M = 15) and llama.cpp's view of that. The checkpoint is
    removed afterwards (F32 at these widths is ~17 MB); the ref JSON keeps the prompts, logits and routing. Returns
    the F32 and Q4_K_M views."""
    name = spec["name"]
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{name}.f32.gguf"
        maf.convert(spec, d, f32)
        view = llamacpp_reference(name, "f32", f32, refj)
        (GGUF_DIR / f"{name}.f32.llamacpp.json").unlink()
        q4 = GGUF_DIR / f"{name}.q4_k_m.gguf"
        quantize(f32, q4, LLAMA_FTYPE_MOSTLY_Q4_K_M)
        qview = llamacpp_reference(name, "q4_k_m", q4, refj)
    shutil.rmtree(d)
    qtypes = sorted(set(qview["tensor_types"].values()))
    assert "Q4_K" in qtypes, qtypes
    notes.append(f"{name}: Q4_K_M tensor types {qtypes}; checkpoint {d.relative_to(ROOT)} and F32 GGUF not kept")
    return view, qview


def gguf_tensors(path):
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}


def main():
    names = sys.argv[1:]
    for d in (HF_DIR, REF_DIR, GGUF_DIR):
        d.mkdir(parents=True, exist_ok=True)
    notes = maf.Notes()
    base, ids = build_tokenizer()
    V = base.get_vocab_size(with_added_tokens=True)
    notes.append(f"tokenizer: {V} tokens (= vocab_size of every model); added ids: "
                 + json.dumps({c: ids[c] for c, _ in MLA_TOKENS}, ensure_ascii=False))
    specs = model_specs(V, ids)
    unknown = set(names) - {s["name"] for s in specs}
    assert not unknown, f"unknown model(s) {sorted(unknown)}"
    summary = []
    for i, spec in enumerate(specs):
        spec["first_seed"] = 60000 + 1000 * i
        if names and spec["name"] not in names:
            continue
        name = spec["name"]
        d, mem_tok, ref, seed = maf.build_model(spec, base, notes)
        if spec["hub_config"]:
            ref = hub_config(spec, d, ref, notes)
        disk_tok = AutoTokenizer.from_pretrained(d)
        spec["sensitivity"] = maf.sensitivity(spec, ref, disk_tok(mf.PROMPTS[0])["input_ids"], notes)
        refj = maf.make_reference(spec, d, disk_tok, mem_tok, ref, seed, notes)
        add_routing(spec, ref, refj, notes)
        if spec["mtp"]:
            add_mtp(spec, d, ref, seed, refj, notes)
        if spec.get("kquant"):
            view, qview = kquant_ggufs(spec, d, refj, notes)
            files = kquant_files(name)
        else:
            view, qview = llamacpp_ggufs(spec, d, refj, notes)
            files = mmf.fixture_files(name)
        vs, qvs = view["vs_transformers"], qview["vs_transformers"]
        assert view["gguf_hparams"]["tokenizer.ggml.model"] == "gpt2", view["gguf_hparams"]
        qtypes = sorted(set(qview["tensor_types"].values()))
        size = sum(f.stat().st_size for f in files)
        notes.append(
            f"{name}: F32 transformers vs llama.cpp: max |logprob diff| {vs['max_abs_logprob_diff']:.2e} "
            f"(mean {vs['mean_abs_logprob_diff']:.2e}, {vs['n_logprobs']} tokens), argmax agreement "
            f"{vs['argmax_agreement']:.3f}, tokenization mismatches {len(vs['tokenization_mismatches'])}; "
            f"{qview['variant']} ({qtypes}): max |logprob diff| {qvs['max_abs_logprob_diff']:.2e}, top-1 agreement "
            f"{qvs['argmax_agreement']:.3f}; fixture total {size} bytes"
        )
        summary.append((name, files, seed, vs["max_abs_logprob_diff"], vs["argmax_agreement"],
                        qvs["max_abs_logprob_diff"], qvs["argmax_agreement"], size))
        # llama.cpp ranks expert groups by their two best scores whatever the model (DeepSeek-V2's
        # group_limited_greedy ranks by the best): where that changes a choice it cannot match transformers.
        differ = refj.get("routing_positions_llamacpp_groups_differ", 0)
        if differ:
            notes.append(f"{name}: llama.cpp keeps other expert groups than transformers at {differ} (layer, position)s; "
                         "its F32 log-probs are not held to transformers'")
        assert differ or vs["max_abs_logprob_diff"] <= MAX_LOGPROB_DIFF, (name, vs)
        assert not vs["tokenization_mismatches"], vs
        assert all(p["same_ids_as_transformers"] for p in view["prompts"]), name
        assert size < MAX_FIXTURE_BYTES, (name, size)

    print()
    print("files:")
    for name, files, *_ in summary:
        for p in files:
            h = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
            print(f"  {p.stat().st_size:>9}  {h}  {p.relative_to(ROOT)}")
    print()
    print(f"{'model':<16} {'seed':>6} {'f32 max|dlogprob|':>18} {'f32 argmax':>10} {'q max|dlogprob|':>17} "
          f"{'q top-1':>9} {'bytes':>9}")
    for name, _, seed, d32, a32, dq8, aq8, size in summary:
        print(f"{name:<16} {seed:>6} {d32:>18.2e} {a32:>10.3f} {dq8:>17.2e} {aq8:>9.3f} {size:>9}")
    print("versions:", json.dumps(maf.VERSIONS))


def llamacpp_ggufs(spec, d, refj, notes):
    """F32 conversion and its Q8_0 quantization, both kept with llama.cpp's views. Returns the two views."""
    name = spec["name"]
    f32 = GGUF_DIR / f"{name}.f32.gguf"
    maf.convert(spec, d, f32)
    tensors = gguf_tensors(f32)
    L = spec["cfg"].num_hidden_layers
    mtp_in_gguf = sorted(t for t in tensors if t.startswith(f"blk.{L}."))
    notes.append(f"{name}: GGUF: {len(tensors)} tensors; blk.{L}.* (MTP): "
                 f"{mtp_in_gguf if mtp_in_gguf else 'none'}")
    view = llamacpp_reference(name, "f32", f32, refj)
    q8 = GGUF_DIR / f"{name}.q8_0.gguf"
    qview = llamacpp_reference(name, "q8_0", q8, refj, quant_src=f32)
    qtypes = sorted(set(qview["tensor_types"].values()))
    assert "Q8_0" in qtypes, qtypes
    return view, qview


if __name__ == "__main__":
    main()
