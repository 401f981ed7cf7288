#!/usr/bin/env python3
"""Parity fixtures for OpenAI's gpt-oss (GptOssForCausalLM; llama.cpp arch `gpt-oss`): attention sinks, sliding-window
and full attention alternating by layer, biases on q/k/v/o, on the router and on every expert projection, the clamped
SwiGLU (`gate` clamped above at swiglu_limit, `up` to ±limit, gate * sigmoid(alpha * gate) * (up + 1)), softmax over
the top-k router logits, YaRN RoPE without truncation.

Built on tools/make_arch_fixtures.py and tools/make_moe_fixtures.py (imported, not copied): the tiny byte-level BPE
tokenizer (+ the harmony markers below), seed choice, weight redraw (every parameter, sinks and biases included:
N(0, 0.2) projections, norms 1 + N(0, 0.1)), reference writer, converter runner, llama.cpp views and Q8_0. Files:

  tests/fixtures/hf/gpt_oss/               tiny random-weight checkpoint as transformers saves one (F32, experts stacked:
                                           mlp.experts.gate_up_proj [E, hidden, 2 * width] with gate and up
                                           interleaved by column, down_proj [E, width, hidden], their biases), the
                                           harmony chat template (llama.cpp models/templates/openai-gpt-oss-120b.jinja)
  tests/fixtures/ref/gpt_oss.json          transformers reference (schema of tools/make_arch_fixtures.py) plus
  tests/fixtures/ref/gpt_oss.logits.bin      "routing" ([prompt][layer][position] -> the top-k expert ids, best first)
                                           and "routing_min_logit_gap" (k-th minus (k+1)-th router logit)
  tests/fixtures/gguf/gpt_oss.f32.gguf     convert_hf_to_gguf.py --outtype f32 (its non-MXFP4 path: experts transposed,
                                           gate and up split into ffn_gate_exps / ffn_up_exps)
  tests/fixtures/gguf/gpt_oss.f32.llamacpp.json, gpt_oss.q8_0.gguf, gpt_oss.q8_0.llamacpp.json
  tests/fixtures/hf/gpt_oss_mxfp4/, ref/gpt_oss_mxfp4.*, gguf/gpt_oss_mxfp4.mxfp4.gguf (the converter keeps the
                                           MXFP4 experts) and gpt_oss_mxfp4.mxfp4_moe.gguf (llama.cpp's MXFP4_MOE
                                           quantization of it: the other matrices Q8_0), with their llama.cpp views

How to run (from the repository root; nothing is downloaded, everything is seeded and deterministic):

    /work/venv/bin/python tools/make_gpt_oss_fixtures.py

Environment: /work/venv (torch, transformers 5.23.0, tokenizers, safetensors, gguf); llama-cpp-python 0.3.36 built in
/tmp/lcppvenv (LCPP_PYTHON); its sdist in /tmp/lcpp/llama_cpp_python-0.3.36 (LCPP_DIR), as for
tools/make_moe_fixtures.py.

Sizes: hidden 64, 2 layers (sliding window 8, then full attention), 4 query heads and 2 KV heads of 16, 16 experts of
width 16, top-4; prompts of 23-26 tokens pass the window. swiglu_limit is the published 7.0 (llama.cpp fixes it), the
experts' gate/up weights GATE_UP_SCALE times the others' so that the clamp acts; every knob must move the logits.
"""

import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
import make_arch_fixtures as maf  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_moe_fixtures as mmf  # noqa: E402  (llama.cpp worker + Q8_0, fixture_files; it patches maf)

import shutil  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoTokenizer, GptOssConfig, GptOssForCausalLM  # noqa: E402

ROOT, HF_DIR, REF_DIR, GGUF_DIR = maf.ROOT, maf.HF_DIR, maf.REF_DIR, maf.GGUF_DIR
MAX_LOGPROB_DIFF = maf.MAX_LOGPROB_DIFF  # 1e-3
MAX_FIXTURE_BYTES = 2_500_000
LLAMA_FTYPE_MOSTLY_MXFP4_MOE = 38  # llama.h: the experts MXFP4, the other matrices Q8_0
MIN_LOGIT_GAP = 2e-3  # k-th minus (k+1)-th router logit, every layer and position of the prompts and continuations

maf.GENERATOR = "tools/make_gpt_oss_fixtures.py"
maf.GGUF_NAMES.update(gpt_oss="Strata Tiny gpt-oss", gpt_oss_mxfp4="Strata Tiny gpt-oss MXFP4")

# The harmony markers (all special in gpt-oss's tokenizer), appended after make_arch_fixtures' tokens.
HARMONY_TOKENS = ["<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
                  "<|message|>", "<|call|>"]
maf.EXTRA_TOKENIZATION_STRINGS = maf.EXTRA_TOKENIZATION_STRINGS + [
    "<|start|>assistant<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi."
    "<|return|>",
    "<|start|>assistant<|channel|>commentary to=functions.get <|constrain|>json<|message|>{\"a\": 1}<|call|>",
]

ARCH_KEYS = ["num_local_experts", "num_experts_per_tok", "intermediate_size", "head_dim", "sliding_window",
             "layer_types", "swiglu_limit", "attention_bias", "rope_parameters", "tie_word_embeddings", "rms_norm_eps"]
YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}


def build_tokenizer():
    base, ids = maf.build_tokenizer()
    from tokenizers import AddedToken

    for content in HARMONY_TOKENS:
        if content in ids:
            continue
        n = base.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        assert n == 1, content
        ids[content] = base.token_to_id(content)
    assert len(set(ids.values())) == len(ids)
    return base, ids


def model_specs(V, ids):
    common = gpt_oss_spec(V, ids)
    return [
        common,
        # As OpenAI publishes gpt-oss: the experts MXFP4 (their width a multiple of MXFP4's 32-value blocks).
        dict(common, name="gpt_oss_mxfp4", cfg=GptOssConfig(**dict(common["cfg"].to_dict(), intermediate_size=32)),
             mxfp4=True),
    ]


def gpt_oss_spec(V, ids):
    return (
        dict(
            name="gpt_oss",
            cls=GptOssForCausalLM,
            cfg=GptOssConfig(
                vocab_size=V,
                hidden_size=64,
                intermediate_size=16,
                head_dim=16,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_hidden_layers=2,
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=8,
                num_local_experts=16,
                num_experts_per_tok=4,
                swiglu_limit=7.0,  # llama.cpp fixes 7.0 (the published value); see make_model
                attention_bias=True,
                max_position_embeddings=256,
                rms_norm_eps=1e-5,
                rope_parameters=dict(YARN),
                tie_word_embeddings=False,
                bos_token_id=ids["<|startoftext|>"],
                eos_token_id=ids["<|return|>"],
                pad_token_id=ids["<|endoftext|>"],
            ),
            tok=dict(add_bos=False, bos="<|startoftext|>", eos="<|return|>", pad="<|endoftext|>"),
            template=maf.read_template("openai-gpt-oss-120b.jinja"),
            template_source="llama.cpp models/templates/openai-gpt-oss-120b.jinja",
            gen=dict(bos_token_id=ids["<|startoftext|>"],
                     eos_token_id=[ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]],
                     pad_token_id=ids["<|endoftext|>"]),
            arch=ARCH_KEYS,
            knobs={
                "swiglu_limit": {"swiglu_limit": 100.0},  # the clamp acts
                "sliding_window": {"sliding_window": 64},
                "num_experts_per_tok": {"num_experts_per_tok": 2},
                "yarn": {"rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}},
            },
        )
    )


def to_openai_mxfp4(w):
    """w [..., rows, cols] (cols a multiple of 32) quantized by gguf-py's MXFP4 (ggml's reference quantizer), laid
    out as OpenAI's checkpoints store it: blocks [..., rows, cols / 32, 16] (byte i of a group: value 2i in the low
    nibble, 2i + 1 in the high one) and scales [..., rows, cols / 32] (the E8M0 byte)."""
    q = gguf.quants.quantize(w.float().contiguous().numpy(), gguf.GGMLQuantizationType.MXFP4)
    q = q.reshape(*w.shape[:-1], w.shape[-1] // 32, 17)
    scales, qs = q[..., 0], q[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # GGML: value j low nibble of byte j, j + 16 high
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return torch.from_numpy(blocks.copy()), torch.from_numpy(scales.astype(np.uint8).copy())


def write_mxfp4_checkpoint(f32_dir, out_dir, notes):
    """The F32 checkpoint in f32_dir rewritten as OpenAI publishes gpt-oss: the experts' gate_up_proj and down_proj
    as MXFP4 `_blocks` / `_scales` ([experts, out, in / 32, ...]: gate_up's rows interleaved gate, up), their biases
    and everything else as saved, `quantization_config: {quant_method: mxfp4}` in config.json. Returns the names of
    the tensors replaced."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in out_dir.iterdir():
        f.unlink()
    for f in f32_dir.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, out_dir / f.name)
    tensors = {}
    for f in sorted(f32_dir.glob("*.safetensors")):
        tensors.update(load_file(f))
    replaced = []
    for name in sorted(tensors):
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            w = tensors.pop(name).transpose(-1, -2)  # [experts, out, in]
            tensors[name + "_blocks"], tensors[name + "_scales"] = to_openai_mxfp4(w)
            replaced.append(name)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4",
                                  "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    notes.append(f"gpt_oss_mxfp4: {len(replaced)} expert tensors as MXFP4 blocks and scales")
    return replaced


def mxfp4_reference(spec, d, notes):
    """transformers' own reading of the MXFP4 checkpoint (on the CPU it dequantizes the blocks), in F32: logits of
    the prompts, and the tokens, written as make_arch_fixtures' reference."""
    model = GptOssForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.eval()
    mem = maf.make_model(spec, spec["seed"])
    for (n, a), (_, b) in zip(model.named_parameters(), mem.named_parameters()):
        assert a.dtype == torch.float32 and torch.equal(a, b), (n, a.dtype)
    notes.append("gpt_oss_mxfp4: transformers' dequantisation of the checkpoint equals the in-memory model, "
                 "parameter for parameter")
    return model


def routing_of(model, ids):
    """ids[layer][position] -> the top-k expert ids (best first), and the smallest k-th minus (k+1)-th router
    logit. The recorded choice is checked against transformers' router's own indices."""
    records = {}

    def hook_for(i):
        def hook(mod, inp, out):
            logits, _, idx = out
            top = torch.topk(logits.float(), mod.top_k + 1, dim=-1)
            assert torch.equal(top.indices[:, :-1], idx), i
            records[i] = ([[int(e) for e in row] for row in idx], float((top.values[:, -2] - top.values[:, -1]).min()))

        return hook

    handles = [layer.mlp.router.register_forward_hook(hook_for(i)) for i, layer in enumerate(model.model.layers)]
    try:
        mf.logits_of(model, ids)
    finally:
        for hd in handles:
            hd.remove()
    return [records[i][0] for i in range(len(handles))], min(r[1] for r in records.values())


GATE_UP_SCALE = 3.0  # expert gate/up weights N(0, 0.6): pre-activations ~N(0, 4.8), so |x| > 7 happens


_make_model = maf.make_model


def make_model(spec, seed):
    """make_arch_fixtures' model, with the experts' gate/up weights GATE_UP_SCALE times larger (and their down
    weights as much smaller) so that the clamp at swiglu_limit = 7 (which llama.cpp fixes) acts."""
    model = _make_model(spec, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(GATE_UP_SCALE)
            layer.mlp.experts.down_proj.div_(GATE_UP_SCALE)
            if spec.get("mxfp4"):
                # On MXFP4's grid already, so that seeds are judged on the model as published (requantizing
                # values on the grid gives them back exactly).
                for p in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                    p.copy_(mxfp4_round_trip(p.transpose(-1, -2)).transpose(-1, -2))
    return model


def mxfp4_round_trip(w):
    """w [..., cols] through gguf-py's MXFP4 quantizer and back."""
    q = gguf.quants.quantize(w.float().contiguous().numpy(), gguf.GGMLQuantizationType.MXFP4)
    return torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.MXFP4).reshape(w.shape).copy())


maf.make_model = make_model

_pick_seed = mmf._pick_seed  # make_arch_fixtures' own (make_moe_fixtures replaced maf.pick_seed with its router check)


def pick_seed(spec, hf_tok, first_seed, notes):
    """make_arch_fixtures' criteria, then no router near-tie (< MIN_LOGIT_GAP) on the prompts or their greedy
    continuations, so that summation order cannot flip an expert choice."""
    seed = first_seed
    while True:
        seed = _pick_seed(spec, hf_tok, seed, notes)
        model = maf.make_model(spec, seed)
        gap = float("inf")
        for text in mf.PROMPTS:
            ids = hf_tok(text)["input_ids"]
            g = mf.greedy_with_cache(model, ids, mf.N_GREEDY, [])
            gap = min(gap, routing_of(model, ids + g)[1])
        if gap >= MIN_LOGIT_GAP:
            notes.append(f"gpt_oss: seed {seed}: min router logit gap (prompts + greedy) {gap:.4f}")
            return seed
        notes.append(f"gpt_oss: seed {seed} skipped: router logit gap {gap:.2e}")
        seed += 1


maf.pick_seed = pick_seed


def add_routing(ref, refj, name):
    routing, gaps = [], []
    for p in refj["prompts"]:
        r, gap = routing_of(ref, p["ids"])
        routing.append(r)
        gaps.append(gap)
    refj["routing"] = routing
    refj["routing_min_logit_gap"] = gaps
    refj["routing_rule"] = ("router logits = x W^T + b; the top-k by logit, best first; weights = softmax over those "
                            "k logits")
    (REF_DIR / f"{name}.json").write_text(json.dumps(refj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def fixture_files(name, quants):
    files = sorted((HF_DIR / name).iterdir()) + [REF_DIR / f"{name}.json", REF_DIR / f"{name}.logits.bin"]
    for v in quants:
        files += [GGUF_DIR / f"{name}.{v}.gguf", GGUF_DIR / f"{name}.{v}.llamacpp.json"]
    return files


def main():
    names = sys.argv[1:]
    for d in (HF_DIR, REF_DIR, GGUF_DIR):
        d.mkdir(parents=True, exist_ok=True)
    notes = maf.Notes()
    base, ids = build_tokenizer()
    V = base.get_vocab_size(with_added_tokens=True)
    notes.append(f"tokenizer: {V} tokens; harmony ids: " + json.dumps({t: ids[t] for t in HARMONY_TOKENS}))
    for i, spec in enumerate(model_specs(V, ids)):
        spec["first_seed"] = 70000 + 1000 * i
        name = spec["name"]
        if names and name not in names:
            continue
        mxfp4 = spec.get("mxfp4", False)
        if mxfp4:
            # Built in F32 under another name, rewritten as OpenAI's MXFP4 checkpoint; only that is kept.
            f32_spec = dict(spec, name=name + "_f32")
            maf.GGUF_NAMES[f32_spec["name"]] = maf.GGUF_NAMES[name]
            d32, mem_tok, _, seed = maf.build_model(f32_spec, base, notes)
            spec["seed"] = seed
            d = HF_DIR / name
            write_mxfp4_checkpoint(d32, d, notes)
            shutil.rmtree(d32)
            ref = mxfp4_reference(spec, d, notes)
        else:
            d, mem_tok, ref, seed = maf.build_model(spec, base, notes)
        disk_tok = AutoTokenizer.from_pretrained(d)
        spec["sensitivity"] = maf.sensitivity(spec, ref, disk_tok(mf.PROMPTS[0])["input_ids"], notes)
        refj = maf.make_reference(spec, d, disk_tok, mem_tok, ref, seed, notes)
        add_routing(ref, refj, name)

        # llama.cpp's converter keeps an MXFP4 checkpoint's experts MXFP4 (the rest F32).
        first = "mxfp4" if mxfp4 else "f32"
        path = GGUF_DIR / f"{name}.{first}.gguf"
        maf.convert(spec, d, path)
        view = mmf.llamacpp_reference(name, first, path, refj)
        quants = [first]
        vs = view["vs_transformers"]
        line = (f"{name}: {first} transformers vs llama.cpp: max |logprob diff| {vs['max_abs_logprob_diff']:.2e} (mean "
                f"{vs['mean_abs_logprob_diff']:.2e}, {vs['n_logprobs']} tokens), argmax agreement "
                f"{vs['argmax_agreement']:.3f}, tokenization mismatches {len(vs['tokenization_mismatches'])}; "
                f"tensor types {sorted(set(view['tensor_types'].values()))}")
        if mxfp4:
            # llama.cpp's own MXFP4_MOE quantization of its conversion (`llama-quantize ... MXFP4_MOE`).
            moe = GGUF_DIR / f"{name}.mxfp4_moe.gguf"
            mmf.quantize(path, moe, LLAMA_FTYPE_MOSTLY_MXFP4_MOE)
            mvs = mmf.llamacpp_reference(name, "mxfp4_moe", moe, refj)
            quants.append("mxfp4_moe")
            line += (f"; MXFP4_MOE ({sorted(set(mvs['tensor_types'].values()))}): max |logprob diff| "
                     f"{mvs['vs_transformers']['max_abs_logprob_diff']:.2e}, top-1 agreement "
                     f"{mvs['vs_transformers']['argmax_agreement']:.3f}")
        if not mxfp4:
            q8 = GGUF_DIR / f"{name}.q8_0.gguf"
            qvs = mmf.llamacpp_reference(name, "q8_0", q8, refj, quant_src=path)["vs_transformers"]
            quants.append("q8_0")
            line += (f"; Q8_0: max |logprob diff| {qvs['max_abs_logprob_diff']:.2e}, top-1 agreement "
                     f"{qvs['argmax_agreement']:.3f}")
        size = sum(f.stat().st_size for f in fixture_files(name, quants))
        notes.append(line + f"; fixture total {size} bytes")
        # llama.cpp rounds the activations to 8 bits for its MXFP4 products: held to the quantized fixtures' bounds.
        if mxfp4:
            assert vs["argmax_agreement"] >= 0.95 and vs["mean_abs_logprob_diff"] <= 0.1, (name, vs)
        else:
            assert vs["max_abs_logprob_diff"] <= MAX_LOGPROB_DIFF, (name, vs)
        assert not vs["tokenization_mismatches"], vs
        assert size < MAX_FIXTURE_BYTES, (name, size)
    print("versions:", json.dumps(maf.VERSIONS))


if __name__ == "__main__":
    main()
