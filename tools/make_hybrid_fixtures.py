#!/usr/bin/env python3
"""Parity fixture for the hybrid linear-attention architecture: qwen3_next (Qwen3NextForCausalLM, issue 21).

Built on tools/make_arch_fixtures.py and tools/make_moe_fixtures.py (imported, not copied): the same tiny byte-level
BPE tokenizer, seed choice (clear greedy argmax at every step, varied continuations), weight redraw, reference
writer and routing record. For the model <name>:

  tests/fixtures/hf/<name>/                tiny random-weight transformers checkpoint (F32 safetensors, hidden 64,
                                           4 layers), tiny tokenizer, chat template
  tests/fixtures/ref/<name>.json           transformers reference, schema of tools/make_moe_fixtures.py (with
  tests/fixtures/ref/<name>.logits.bin       "routing"), plus "long_prompt": a prompt of more than 64 tokens (the
                                           chunk of transformers' chunked gated delta rule, and more than Strata's
                                           test prefill chunks) with its token ids and per-position log-probs

How to run (from the repository root; nothing is downloaded, everything is seeded and deterministic):

    /tmp/refvenv/bin/python tools/make_hybrid_fixtures.py

with the environment of tools/make_arch_fixtures.py (torch 2.15.0, transformers 5.23.0, tokenizers 0.23.3,
safetensors 0.8.0, numpy 2.4.6, jinja2 3.1.6; python 3.11.7, CPU). The versions are also recorded in the JSON.

Model (hidden 64, 4 layers, vocab = the tiny tokenizer's exact size, untied embeddings):
  * qwen3_next  layer_types [linear, linear, linear, full] (transformers' default pattern, full attention every
               4th layer). Full attention: 4 heads of 16, 2 KV heads, q/k RMS norms, partial RoPE (factor 0.25: 4
               of 16 dimensions), the output gated per head by sigmoid of the second half of q_proj. Linear
               attention: the gated delta rule with 2 key heads and 4 value heads of 16, a causal conv1d of 4 taps,
               a gated RMS norm on the output. MLP: 8 routed experts (top-2, width 16, norm_topk_prob) and a shared
               expert (width 32) scaled by sigmoid(shared_expert_gate) in every layer (llama.cpp's qwen3next has
               no dense layers; qwen3_5 below is dense throughout). RMS norms scale by 1 + w (zero-centred weights redrawn as
               make_fixtures does: w ~ 1 + N(0, 0.1)); the gated norm's weight is plain. Template
               Qwen-Qwen3-0.6B.jinja (the Qwen3 family template, as Qwen3-Next's).
Each also as GGUF: llama.cpp's convert_hf_to_gguf.py --no-mtp (the tiny checkpoints have no multi-token-prediction
layers, which the converter otherwise expects of these families) --outtype f32, run as tools/make_arch_fixtures.py runs
it, into tests/fixtures/gguf/<name>.f32.gguf, with llama.cpp's view (<name>.f32.llamacpp.json, schema of
tools/make_moe_fixtures.py: F32 KV cache, CPU, 2 threads). No Q8_0 variant: llama.cpp's own Q8_0 quantization of the
tiny qwen3_next moves its log-probs by up to 2.2 (top-1 agreement 0.52 with transformers), no reference to hold Strata
to. Each fixture is 2 to 2.5 MB (the checkpoint and its F32 GGUF), over the 1.5 MB of the other MoE fixtures.
The converter reshapes the linear-attention tensors: in_proj_qkvz becomes attn_qkv (all queries, all keys, all values)
and attn_gate (z); A_log is stored as ssm_a = -exp(A_log); RMS norm weights as 1 + w (not the gated norm's).
For Qwen3.5 the converter also reorders the value heads (grouped by key head to tiled). Qwen3.5's configs carry
"mrope_section" [1, 1, 0] (see model_specs).
"""

import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
import make_arch_fixtures as maf  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_moe_fixtures as mmf  # noqa: E402

import torch  # noqa: E402
from transformers import (  # noqa: E402
    TokenizersBackend,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

GENERATOR = "tools/make_hybrid_fixtures.py"
maf.GENERATOR = GENERATOR
maf.GGUF_NAMES.update(qwen3_next="Strata Tiny Qwen3 Next", qwen3_5="Strata Tiny Qwen3.5",
                      qwen3_5_moe="Strata Tiny Qwen3.5 MoE")  # unused: no GGUF
REF_DIR = maf.REF_DIR
MAX_FIXTURE_BYTES = 1_500_000  # as tools/make_moe_fixtures.py
LONG_TEXT = " ".join(mf.PROMPTS * 2)  # more than 64 tokens


def model_specs(V, ids):
    qwen_tok = dict(add_bos=False, bos=None, eos="<|im_end|>", pad="<|endoftext|>")
    qwen_gen = dict(eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"])
    hybrid = dict(vocab_size=V, hidden_size=64, max_position_embeddings=512, num_hidden_layers=4, hidden_act="silu",
                  layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_conv_kernel_dim=4, attention_bias=False, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=ids["<|im_end|>"],
                  pad_token_id=ids["<|endoftext|>"])
    # Qwen3.5's RoPE is multimodal (sections of the rotary pairs follow time, height and width positions, all one
    # position for text); llama.cpp requires the sections to fit the rotary dimensions (4 here: 2 pairs) and its
    # converter writes Qwen3.5's default [11, 11, 10] when the config has none.
    qwen35_rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                   "mrope_section": [1, 1, 0]}
    qwen35_arch = ["layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                   "linear_value_head_dim", "linear_conv_kernel_dim", "rope_parameters", "tie_word_embeddings",
                   "rms_norm_eps"]
    partial = {"partial_rotary_factor": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 0.5, "mrope_section": [2, 2, 0]}}}
    return [
        dict(
            name="qwen3_next",
            cls=Qwen3NextForCausalLM,
            cfg=Qwen3NextConfig(
                vocab_size=V,
                hidden_size=64,
                max_position_embeddings=512,
                num_hidden_layers=4,
                hidden_act="silu",
                layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_conv_kernel_dim=4,
                intermediate_size=32,  # unused: every layer routes
                moe_intermediate_size=16,
                shared_expert_intermediate_size=32,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],  # llama.cpp's qwen3next cannot represent a dense layer
                attention_bias=False,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"],
            ),
            tok=dict(add_bos=False, bos=None, eos="<|im_end|>", pad="<|endoftext|>"),
            template=maf.read_template("Qwen-Qwen3-0.6B.jinja"),
            template_source="llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja",
            gen=dict(eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"]),
            arch=["layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
                  "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
                  "decoder_sparse_step", "mlp_only_layers", "rope_parameters", "tie_word_embeddings",
                  "rms_norm_eps"],
            gguf=True,
            max_bytes=2_500_000,
            knobs={"norm_topk_prob": {"norm_topk_prob": False},
                   "partial_rotary_factor": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": 0.5}}},
        ),
        # Added after qwen3_next, so that its seed (by position) stays as it was.
        dict(
            name="qwen3_5",
            cls=Qwen3_5ForCausalLM,
            cfg=Qwen3_5TextConfig(**{**hybrid, "rope_parameters": qwen35_rope}, intermediate_size=64),
            tok=qwen_tok,
            template=maf.read_template("Qwen-Qwen3-0.6B.jinja"),
            template_source="llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja",
            gen=qwen_gen,
            arch=qwen35_arch,
            knobs=partial,
            gguf=True,
            max_bytes=2_500_000,
        ),
        dict(
            name="qwen3_5_moe",
            cls=Qwen3_5MoeForCausalLM,
            cfg=Qwen3_5MoeTextConfig(**{**hybrid, "rope_parameters": qwen35_rope}, num_experts=8, num_experts_per_tok=2,
                                     moe_intermediate_size=16, shared_expert_intermediate_size=32),
            tok=qwen_tok,
            template=maf.read_template("Qwen-Qwen3-0.6B.jinja"),
            template_source="llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja",
            gen=qwen_gen,
            arch=qwen35_arch + ["num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                "shared_expert_intermediate_size"],
            knobs={**partial, "num_experts_per_tok": {"num_experts_per_tok": 1}},
            gguf=True,
            max_bytes=3_000_000,
        ),
    ]


def arch_config(spec, ref):
    """make_arch_fixtures.arch_config, with the keys a config does not have as null (Qwen3.5-MoE's text config has
    no intermediate_size: every layer routes)."""
    c = ref.config.to_dict()
    out = {"model_type": c["model_type"], "architectures": c.get("architectures")}
    for k in spec["arch"]:
        out[k] = c.get(k, getattr(ref.config, k, None))
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        out[k] = c.get(k)
    out["head_dim"] = getattr(ref.config, "head_dim", None) or c["hidden_size"] // c["num_attention_heads"]
    return out


maf.arch_config = arch_config


def add_long_prompt(spec, ref, disk_tok, refj, notes):
    """A prompt longer than transformers' delta-rule chunk (64): its ids and per-position log-probs."""
    ids = [int(x) for x in disk_tok(LONG_TEXT, add_special_tokens=True)["input_ids"]]
    assert len(ids) > 64, len(ids)
    lp = torch.log_softmax(mf.logits_of(ref, ids).double(), dim=-1)
    refj["long_prompt"] = dict(text=LONG_TEXT, ids=ids,
                               logprobs=[float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)],
                               argmax=[int(a) for a in lp.argmax(-1)])
    (REF_DIR / f"{spec['name']}.json").write_text(json.dumps(refj, indent=1, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")
    notes.append(f"{spec['name']}: long prompt of {len(ids)} tokens")


def gguf_references(spec, d, refj, notes):
    """llama.cpp's conversion (F32, then Q8_0 by its quantizer) and its views of both."""
    name = spec["name"]
    runner = maf.CONVERT_RUNNER
    assert '"--outtype", "f32"' in runner
    maf.CONVERT_RUNNER = runner.replace('"--outtype", "f32"', '"--no-mtp", "--outtype", "f32"')
    try:
        f32 = maf.GGUF_DIR / f"{name}.f32.gguf"
        maf.convert(spec, d, f32)
    finally:
        maf.CONVERT_RUNNER = runner
    view = mmf.llamacpp_reference(name, "f32", f32, refj)
    vs = view["vs_transformers"]
    notes.append(f"{name}: F32 transformers vs llama.cpp: max |logprob diff| {vs['max_abs_logprob_diff']:.2e}, argmax "
                 f"agreement {vs['argmax_agreement']:.3f}")
    assert vs["max_abs_logprob_diff"] <= maf.MAX_LOGPROB_DIFF, vs
    assert not vs["tokenization_mismatches"], vs


def main():
    names = sys.argv[1:]
    for d in (maf.HF_DIR, REF_DIR):
        d.mkdir(parents=True, exist_ok=True)
    notes = maf.Notes()
    base, ids = maf.build_tokenizer()
    V = base.get_vocab_size(with_added_tokens=True)
    notes.append(f"tokenizer: {V} tokens (= vocab_size)")
    for i, spec in enumerate(model_specs(V, ids)):
        spec["first_seed"] = 70000 + 1000 * i
        name = spec["name"]
        if names and name not in names:
            continue
        # make_moe_fixtures' seed choice also wants clear router decisions; a dense model has no router.
        maf.pick_seed = mmf.pick_seed if hasattr(spec["cfg"], "num_experts") else mmf._pick_seed
        d, mem_tok, ref, seed = maf.build_model(spec, base, notes)
        # The tokenizer files as they are (tokenizer_config.json says TokenizersBackend): AutoTokenizer would
        # put transformers' Qwen3_5Tokenizer over qwen3_5_moe_text, which NFC-normalizes what tokenizer.json
        # does not (Strata reads tokenizer.json).
        disk_tok = TokenizersBackend.from_pretrained(d)
        spec["sensitivity"] = maf.sensitivity(spec, ref, disk_tok(mf.PROMPTS[0])["input_ids"], notes)
        refj = maf.make_reference(spec, d, disk_tok, mem_tok, ref, seed, notes)
        if hasattr(ref.config, "num_experts"):
            gap = mmf.add_routing(spec, ref, refj)
            notes.append(f"{name}: routing recorded, min router logit gap on the prompts {gap:.4f}")
        add_long_prompt(spec, ref, disk_tok, refj, notes)
        if spec.get("gguf"):
            gguf_references(spec, d, refj, notes)
        files = mmf.fixture_files(name, gguf=False)
        if spec.get("gguf"):
            files += [maf.GGUF_DIR / f"{name}.f32.gguf", maf.GGUF_DIR / f"{name}.f32.llamacpp.json"]
        size = sum(f.stat().st_size for f in files)
        notes.append(f"{name}: fixture total {size} bytes")
        assert size < spec.get("max_bytes", MAX_FIXTURE_BYTES), (name, size)
    print("versions:", json.dumps(maf.VERSIONS))


if __name__ == "__main__":
    main()
