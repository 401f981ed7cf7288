#!/usr/bin/env python3
"""Parity fixtures for the mixture-of-experts architectures: mixtral (MixtralForCausalLM), qwen2_moe
(Qwen2MoeForCausalLM) and qwen3_moe (Qwen3MoeForCausalLM).

Written ahead of the Rust side (issue 15): until Strata reads these architectures, the generated files are not
committed (tests that walk every fixture, such as model::config's, would refuse them).

Built on tools/make_arch_fixtures.py (imported, not copied): the same tiny byte-level BPE tokenizer, seed choice,
weight redraw, reference writer, converter runner (tokenizer pre type "gpt-2", explicit general.name) and
transformers-vs-llama.cpp cross-check. For each model <name>:

  tests/fixtures/hf/<name>/                tiny random-weight transformers checkpoint (F32 safetensors, hidden 64,
                                           2 layers, 8 experts), tiny tokenizer, chat template
  tests/fixtures/ref/<name>.json           transformers reference, schema of tools/make_arch_fixtures.py, plus
  tests/fixtures/ref/<name>.logits.bin       "routing": per prompt, [layer][position] -> the router's top-k expert
                                           ids as transformers returns them (torch.topk of the softmax: highest
                                           probability first); "routing_min_logit_gap": per prompt, the smallest
                                           gap between the k-th and (k+1)-th largest router logit over all layers
                                           and positions (how robust the expert choice is to rounding)
  tests/fixtures/gguf/<name>.f32.gguf      llama.cpp's convert_hf_to_gguf.py --outtype f32 of that checkpoint
  tests/fixtures/gguf/<name>.f32.llamacpp.json
  tests/fixtures/gguf/<name>.q8_0.gguf     llama_cpp.llama_model_quantize(f32 -> LLAMA_FTYPE_MOSTLY_Q8_0 = 7)
  tests/fixtures/gguf/<name>.q8_0.llamacpp.json
                                           llama.cpp views (schema of tools/make_llamacpp_fixtures.py: F32 KV cache,
                                           CPU, 2 threads) plus "gguf_hparams" and "vs_transformers" (max |log-prob
                                           diff| and argmax agreement against the transformers logits)

How to run (from the repository root; nothing is downloaded, everything is seeded and deterministic):

    /tmp/refvenv/bin/python tools/make_moe_fixtures.py [name ...]     # e.g. `... qwen3_moe_mixed`: only that one

with the environment of tools/make_arch_fixtures.py (see its docstring: /tmp/refvenv with torch 2.15.0,
transformers 5.23.0, tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6, jinja2 3.1.6, gguf 0.19.0; llama-cpp-python
0.3.36 built in /tmp/lcppvenv; its sdist unpacked in /tmp/lcpp/llama_cpp_python-0.3.36, whose vendor/llama.cpp
provides convert_hf_to_gguf.py, gguf-py and the chat templates). LCPP_DIR / LCPP_PYTHON as there. Only the named
models' files are rewritten (all by default). Versions used for the committed files: those above (python 3.11.7,
CPU); they are also recorded in every JSON.

Models (hidden 64, 2 layers, vocab = the tiny tokenizer's exact size, untied embeddings: llama.cpp's qwen2moe
requires output.weight):
  * mixtral    num_local_experts 8, num_experts_per_tok 2, expert width (intermediate_size) 16, softmax -> top-2 ->
               renormalised; 4 heads / 2 KV heads; <s> BOS added; [INST] template (MISTRAL_TEMPLATE of
               tools/make_fixtures.py, the mistralai Mistral/Mixtral-Instruct-v0.1 template: llama.cpp's folder has
               no Mixtral template). llama.cpp arch `llama` with ffn_*_exps.
  * qwen2_moe  num_experts 8, top-2, moe_intermediate_size 8, norm_topk_prob false (softmax probabilities used as
               they are, which is what llama.cpp's qwen2moe graph hard-codes), shared expert
               (shared_expert_intermediate_size 32) scaled by sigmoid(shared_expert_gate); qkv bias; 4 heads /
               2 KV heads; template Qwen-Qwen2.5-7B-Instruct.jinja.
  * qwen3_moe  num_experts 8, top-4, moe_intermediate_size 16, norm_topk_prob true, q/k RMS norms, 4 heads of 16 /
               1 KV head; template Qwen-Qwen3-0.6B.jinja (the Qwen3 family template, as Qwen3-30B-A3B's).
               Every layer is sparse:
               transformers supports dense layers (mlp_only_layers / decoder_sparse_step) but llama.cpp 0.3.36
               cannot represent them in qwen3moe (its graph and tensor loader give every layer ffn_*_exps and the
               converter ignores both keys), so the dense layer was dropped (qwen3_moe_mixed has them instead).
  * qwen3_moe_mixed  (added last, so the others keep their seeds; transformers only: NO GGUF files, since llama.cpp
               cannot represent its dense layers, see above; spec field gguf=False makes main() skip the conversion,
               the llama.cpp views and their checks). qwen3_moe's settings but 4 layers, decoder_sparse_step 2,
               mlp_only_layers [3], intermediate_size 32. transformers' rule (Qwen3MoeDecoderLayer.__init__, and
               the same in Qwen2MoeDecoderLayer, transformers 5.23.0): layer i gets the sparse block
               (mlp.gate + mlp.experts) iff
                   i not in mlp_only_layers and num_experts > 0 and (i + 1) % decoder_sparse_step == 0,
               otherwise a dense SwiGLU MLP of width intermediate_size (mlp.gate_proj / up_proj / down_proj). Here:
               (i + 1) % 2 == 0 gives layers 1 and 3, mlp_only_layers removes 3: layer 1 sparse, layers 0, 2, 3
               dense. check_layer_pattern asserts that the rule, the loaded modules and the saved safetensors (names
               and shapes, per layer) all say exactly that. Its config.json names the expert count "num_experts",
               as published Qwen3-MoE configs do (transformers 5.23 writes "num_local_experts" for qwen3_moe; see
               hub_num_experts, which checks that transformers reads the rewritten file back identically).
               Files: tests/fixtures/hf/qwen3_moe_mixed/, tests/fixtures/ref/qwen3_moe_mixed.{json,logits.bin};
               its "routing" has one entry per layer, null for a dense layer (no router), and
               "routing_min_logit_gap" covers the sparse layers only. < 1 MB in all.
Q8_0: ffn_down_exps rows have expert-width (16 or 8) columns, not a multiple of Q8_0's block of 32, so llama.cpp's
quantizer stores them as F16 (other matrices Q8_0; norms, biases, routers, shared-expert gate F32); the q8_0 JSON's
tensor_types lists every tensor's type. Expert width 32 would take each model over the size budget (MAX_FIXTURE_BYTES).

Seeds: make_arch_fixtures.pick_seed's criteria (clear greedy argmax at every step, varied continuation) and also a
clear router decision: the gap between the k-th and (k+1)-th largest router logit is >= MIN_ROUTER_GAP at every
layer and position of every prompt and of its greedy continuation, so that llama.cpp's F32 rounding cannot pick
another expert (Q8_0 weights move the router inputs far more than that: Q8_0 routing can differ).

Checks (the script fails otherwise): those of make_arch_fixtures (saved weights = in-memory ones, F32; knobs move
the logits; cached greedy == uncached greedy; tokenizers agree; llama.cpp's prompt ids = transformers') plus: F32
max |log-prob diff| transformers vs llama.cpp <= MAX_LOGPROB_DIFF; the Q8_0 GGUF contains Q8_0 tensors; each model's
files < MAX_FIXTURE_BYTES. Running it twice gives byte-identical files.

Note: tools/make_fixtures.py deletes tests/fixtures/hf/ and tests/fixtures/ref/ wholesale; run this script after it.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
GENERATOR = "tools/make_moe_fixtures.py"
LLAMA_FTYPE_MOSTLY_Q8_0 = 7


# ----------------------------------------------------------------------------------------------------------------------
# llama.cpp side (runs under LCPP_PYTHON: no torch there)
# ----------------------------------------------------------------------------------------------------------------------


def llamacpp_worker(gguf_path, ref_path, out_path, name, variant, quant_src):
    sys.path.insert(0, str(TOOLS))
    import make_llamacpp_fixtures as mlf  # noqa: E402  (llama_view: F32 KV cache, no extra buffer types; quantize)

    if quant_src != "-":
        mlf.quantize(Path(quant_src), Path(gguf_path), LLAMA_FTYPE_MOSTLY_Q8_0)
    ref = json.loads(Path(ref_path).read_text(encoding="utf-8"))
    view = mlf.llama_view(Path(gguf_path), ref, None if variant == "f32" else variant)
    view["generator"] = GENERATOR
    view["model"] = name
    view["reference"] = f"tests/fixtures/ref/{name}.json"
    Path(out_path).write_text(json.dumps(view, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--llamacpp-worker":
    llamacpp_worker(*sys.argv[2:8])
    sys.exit(0)

# ----------------------------------------------------------------------------------------------------------------------
# transformers side
# ----------------------------------------------------------------------------------------------------------------------

sys.path.insert(0, str(TOOLS))
import make_arch_fixtures as maf  # noqa: E402
import make_fixtures as mf  # noqa: E402

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT, HF_DIR, REF_DIR, GGUF_DIR = maf.ROOT, maf.HF_DIR, maf.REF_DIR, maf.GGUF_DIR
MAX_LOGPROB_DIFF = maf.MAX_LOGPROB_DIFF  # 1e-3
MAX_FIXTURE_BYTES = 1_500_000  # per model, hf dir + ref + both GGUFs and their JSONs
MIN_ROUTER_GAP = 2e-3  # k-th minus (k+1)-th largest router logit, every layer/position

maf.GENERATOR = GENERATOR  # make_reference writes it into the ref JSON
maf.GGUF_NAMES.update(
    mixtral="Strata Tiny Mixtral",
    qwen2_moe="Strata Tiny Qwen2 MoE",
    qwen3_moe="Strata Tiny Qwen3 MoE",
    qwen3_moe_mixed="Strata Tiny Qwen3 MoE Mixed",  # unused: no GGUF
)

MOE_ARCH_KEYS = {
    "mixtral": ["num_local_experts", "num_experts_per_tok", "router_jitter_noise", "rope_parameters",
                "sliding_window", "tie_word_embeddings", "rms_norm_eps"],
    "qwen2_moe": ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                  "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "qkv_bias", "rope_parameters",
                  "use_sliding_window", "tie_word_embeddings", "rms_norm_eps"],
    "qwen3_moe": ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                  "decoder_sparse_step", "mlp_only_layers", "attention_bias", "rope_parameters", "use_sliding_window",
                  "tie_word_embeddings", "rms_norm_eps"],
}


def model_specs(V, ids):
    h = dict(vocab_size=V, hidden_size=64, max_position_embeddings=512, num_hidden_layers=2, hidden_act="silu")
    qwen_tok = dict(add_bos=False, bos=None, eos="<|im_end|>", pad="<|endoftext|>")
    qwen_gen = dict(eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"])
    return [
        dict(
            name="mixtral",
            cls=MixtralForCausalLM,
            cfg=MixtralConfig(
                **h,
                intermediate_size=16,  # Mixtral's expert width
                num_attention_heads=4,
                num_key_value_heads=2,
                num_local_experts=8,
                num_experts_per_tok=2,
                router_jitter_noise=0.0,
                rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                sliding_window=None,
                tie_word_embeddings=False,
                bos_token_id=ids["<s>"],
                eos_token_id=ids["</s>"],
                pad_token_id=None,
            ),
            tok=dict(add_bos=True, bos="<s>", eos="</s>", pad=None),
            template=mf.MISTRAL_TEMPLATE,
            template_source="tools/make_fixtures.py MISTRAL_TEMPLATE (mistralai Mistral/Mixtral-Instruct-v0.1 "
                            "template; no Mixtral template in llama.cpp's models/templates/)",
            gen=dict(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"]),
            arch=MOE_ARCH_KEYS["mixtral"],
            knobs={"num_experts_per_tok": {"num_experts_per_tok": 1}},
        ),
        dict(
            name="qwen2_moe",
            cls=Qwen2MoeForCausalLM,
            cfg=Qwen2MoeConfig(
                **h,
                intermediate_size=32,  # unused: every layer is sparse
                moe_intermediate_size=8,
                shared_expert_intermediate_size=32,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=False,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                qkv_bias=True,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                use_sliding_window=False,
                tie_word_embeddings=False,  # llama.cpp's qwen2moe requires output.weight
                bos_token_id=None,
                eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"],
            ),
            tok=qwen_tok,
            template=maf.read_template("Qwen-Qwen2.5-7B-Instruct.jinja"),
            template_source="llama.cpp models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
            gen=qwen_gen,
            arch=MOE_ARCH_KEYS["qwen2_moe"],
            knobs={"norm_topk_prob": {"norm_topk_prob": True}},
        ),
        dict(
            name="qwen3_moe",
            cls=Qwen3MoeForCausalLM,
            cfg=Qwen3MoeConfig(
                **h,
                intermediate_size=32,  # unused: every layer is sparse
                moe_intermediate_size=16,
                num_attention_heads=4,
                num_key_value_heads=1,  # 2 would take the files just over the size budget
                head_dim=16,
                num_experts=8,
                num_experts_per_tok=4,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                attention_bias=False,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                use_sliding_window=False,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"],
            ),
            tok=qwen_tok,
            template=maf.read_template("Qwen-Qwen3-0.6B.jinja"),
            template_source="llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja",
            gen=qwen_gen,
            arch=MOE_ARCH_KEYS["qwen3_moe"],
            knobs={"norm_topk_prob": {"norm_topk_prob": False}, "num_experts_per_tok": {"num_experts_per_tok": 2}},
        ),
        # Added after the others, so their seeds (by position) stay as they were. transformers only: no GGUF.
        dict(
            name="qwen3_moe_mixed",
            cls=Qwen3MoeForCausalLM,
            cfg=Qwen3MoeConfig(
                **{**h, "num_hidden_layers": 4},
                intermediate_size=32,  # the dense layers' MLP width (layers 0, 2, 3)
                moe_intermediate_size=16,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=16,
                num_experts=8,
                num_experts_per_tok=4,
                norm_topk_prob=True,
                decoder_sparse_step=2,  # sparse iff (i + 1) % 2 == 0: layers 1, 3 ...
                mlp_only_layers=[3],  # ... minus layer 3: only layer 1 is sparse
                attention_bias=False,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                use_sliding_window=False,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"],
            ),
            tok=qwen_tok,
            template=maf.read_template("Qwen-Qwen3-0.6B.jinja"),
            template_source="llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja",
            gen=qwen_gen,
            arch=MOE_ARCH_KEYS["qwen3_moe"],
            knobs={"norm_topk_prob": {"norm_topk_prob": False}, "num_experts_per_tok": {"num_experts_per_tok": 2}},
            gguf=False,  # llama.cpp's qwen3moe cannot represent dense layers
            sparse_layers=[1],  # what transformers' rule gives; checked against the saved checkpoint
            max_bytes=1_000_000,
            hub_num_experts=True,  # config.json says "num_experts" (see hub_num_experts)
        ),
    ]


# ----------------------------------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------------------------------


def routing_of(model, ids):
    """(ids[layer][position] -> top-k expert ids, or None for a dense layer (no router); min gap between the k-th
    and (k+1)-th largest router logit over the sparse layers)."""
    records = {}

    def hook_for(i):
        def hook(mod, inp, out):
            logits, _, idx = out
            top = torch.topk(logits.float(), mod.top_k + 1, dim=-1).values
            records[i] = ([[int(e) for e in row] for row in idx], float((top[:, -2] - top[:, -1]).min()))

        return hook

    handles = [layer.mlp.gate.register_forward_hook(hook_for(i)) for i, layer in enumerate(model.model.layers)
               if hasattr(layer.mlp, "gate")]  # dense layers (Qwen3MoeMLP) have no router
    try:
        mf.logits_of(model, ids)
    finally:
        for hd in handles:
            hd.remove()
    assert len(records) == len(handles) >= 1
    n = model.config.num_hidden_layers
    return [records[i][0] if i in records else None for i in range(n)], min(r[1] for r in records.values())


_pick_seed = maf.pick_seed


def pick_seed(spec, hf_tok, first_seed, notes):
    """make_arch_fixtures.pick_seed, then the router gap over the prompts and their greedy continuations."""
    seed = first_seed
    while seed < first_seed + 400:
        scratch = []
        seed = _pick_seed(spec, hf_tok, seed, scratch)
        model = maf.make_model(spec, seed)
        gap = float("inf")
        for text in mf.PROMPTS:
            ids = hf_tok(text)["input_ids"]
            g = mf.greedy_with_cache(model, ids, mf.N_GREEDY)
            gap = min(gap, routing_of(model, ids + g[:-1])[1])
        if gap >= MIN_ROUTER_GAP:
            notes.extend(scratch)
            notes.append(f"{spec['name']}: seed {seed}: min router gap (prompts + greedy) {gap:.4f}")
            return seed
        seed += 1
    raise RuntimeError(f"no suitable seed for {spec['name']}")


maf.pick_seed = pick_seed  # used by maf.build_model


# ----------------------------------------------------------------------------------------------------------------------
# llama.cpp
# ----------------------------------------------------------------------------------------------------------------------


def llamacpp_reference(name, variant, gguf_path, ref, quant_src=None):
    out = GGUF_DIR / f"{name}.{variant}.llamacpp.json"
    if quant_src is not None and gguf_path.exists():
        gguf_path.unlink()
    r = subprocess.run(
        [maf.LCPP_PYTHON, str(Path(__file__).resolve()), "--llamacpp-worker", str(gguf_path),
         str(REF_DIR / f"{name}.json"), str(out), name, variant, str(quant_src) if quant_src else "-"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        print(r.stdout[-5000:], r.stderr[-5000:])
        raise RuntimeError(f"llama.cpp reference failed for {name} {variant}")
    view = json.loads(out.read_text(encoding="utf-8"))
    maf.annotate_view(view, name, gguf_path, ref)
    out.write_text(json.dumps(view, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return view


# Runs under LCPP_PYTHON: make_llamacpp_fixtures.quantize(src, dst, ftype).
QUANTIZE = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import make_llamacpp_fixtures as m; "
            "m.quantize(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))")


def quantize(src, dst, ftype):
    tools = str(Path(__file__).resolve().parent)
    r = subprocess.run([maf.LCPP_PYTHON, "-c", QUANTIZE, tools, str(src), str(dst), str(ftype)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-5000:], r.stderr[-5000:])
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} (ftype {ftype}) failed")


def fixture_files(name, gguf=True):
    files = sorted((HF_DIR / name).iterdir())
    files += [REF_DIR / f"{name}.json", REF_DIR / f"{name}.logits.bin"]
    for v in ("f32", "q8_0") if gguf else ():
        files += [GGUF_DIR / f"{name}.{v}.gguf", GGUF_DIR / f"{name}.{v}.llamacpp.json"]
    return files


def hub_num_experts(spec, d, ref, notes):
    """transformers 5.x writes Qwen3-MoE's expert count as "num_local_experts" (Qwen3MoeConfig.attribute_map maps
    num_experts -> num_local_experts); published Qwen3-MoE checkpoints (Qwen/Qwen3-30B-A3B) have "num_experts".
    Rewrites config.json that way (same formatting as transformers: indent 2, sorted keys) and checks that transformers
    reads the same config and weights back. Returns the reloaded reference model."""
    p = d / "config.json"
    cfg = json.loads(p.read_text(encoding="utf-8"))
    n = cfg.pop("num_local_experts")
    assert "num_experts" not in cfg
    cfg["num_experts"] = n
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    again = maf.load_ref(spec, d)
    assert again.config.num_experts == ref.config.num_experts == n
    assert again.config.to_dict() == ref.config.to_dict()
    for (k1, v1), (k2, v2) in zip(ref.state_dict().items(), again.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2), k1
    notes.append(f"{spec['name']}: config.json: num_local_experts -> num_experts ({n}), as published Qwen3-MoE configs")
    return again


def check_layer_pattern(spec, d, ref, notes):
    """transformers' rule (Qwen2Moe/Qwen3MoeDecoderLayer.__init__): layer i is sparse iff i not in mlp_only_layers
    and num_experts > 0 and (i + 1) % decoder_sparse_step == 0. Checked three ways: the rule, the loaded modules, and
    the tensor names and shapes in the saved safetensors."""
    from safetensors import safe_open

    c = ref.config
    rule = [i for i in range(c.num_hidden_layers)
            if i not in c.mlp_only_layers and c.num_experts > 0 and (i + 1) % c.decoder_sparse_step == 0]
    modules = [i for i, layer in enumerate(ref.model.layers) if hasattr(layer.mlp, "gate")]
    assert rule == modules == spec["sparse_layers"], (rule, modules, spec["sparse_layers"])
    shapes = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            for k in sf.keys():
                shapes[k] = tuple(sf.get_slice(k).get_shape())
    H, I, M, E = c.hidden_size, c.intermediate_size, c.moe_intermediate_size, c.num_experts
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.mlp."
        got = {k[len(p):]: v for k, v in shapes.items() if k.startswith(p)}
        if i in rule:
            want = {"gate.weight": (E, H)}
            for e in range(E):
                want.update({f"experts.{e}.gate_proj.weight": (M, H), f"experts.{e}.up_proj.weight": (M, H),
                             f"experts.{e}.down_proj.weight": (H, M)})
        else:
            want = {"gate_proj.weight": (I, H), "up_proj.weight": (I, H), "down_proj.weight": (H, I)}
        assert got == want, (i, sorted(got.items())[:6])
    notes.append(f"{spec['name']}: sparse layers {rule} (rule = modules = safetensors), dense layers "
                 f"{[i for i in range(c.num_hidden_layers) if i not in rule]} with mlp.{{gate,up,down}}_proj of width {I}")


def add_routing(spec, ref_model, refj):
    """Routing of every prompt into the ref JSON (rewritten in make_reference's format)."""
    routing, gaps = [], []
    for p in refj["prompts"]:
        r, gap = routing_of(ref_model, p["ids"])
        assert all(layer is None or len(layer) == len(p["ids"]) for layer in r)
        routing.append(r)
        gaps.append(gap)
    refj["routing"] = routing
    refj["routing_min_logit_gap"] = gaps
    (REF_DIR / f"{spec['name']}.json").write_text(json.dumps(refj, indent=1, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")
    return min(gaps)


def main():
    names = sys.argv[1:]
    for d in (HF_DIR, REF_DIR, GGUF_DIR):
        d.mkdir(parents=True, exist_ok=True)
    notes = maf.Notes()
    base, ids = maf.build_tokenizer()
    V = base.get_vocab_size(with_added_tokens=True)
    notes.append(f"tokenizer: {V} tokens (= vocab_size of every model)")
    specs = model_specs(V, ids)
    unknown = set(names) - {s["name"] for s in specs}
    assert not unknown, f"unknown model(s) {sorted(unknown)}"
    summary = []
    for i, spec in enumerate(specs):
        spec["first_seed"] = 40000 + 1000 * i
        if names and spec["name"] not in names:
            continue
        name = spec["name"]
        d, mem_tok, ref, seed = maf.build_model(spec, base, notes)
        if spec.get("hub_num_experts"):
            ref = hub_num_experts(spec, d, ref, notes)
        disk_tok = AutoTokenizer.from_pretrained(d)
        spec["sensitivity"] = maf.sensitivity(spec, ref, disk_tok(mf.PROMPTS[0])["input_ids"], notes)
        refj = maf.make_reference(spec, d, disk_tok, mem_tok, ref, seed, notes)
        gap = add_routing(spec, ref, refj)
        notes.append(f"{name}: routing recorded, min router logit gap on the prompts {gap:.4f}")
        if "sparse_layers" in spec:
            check_layer_pattern(spec, d, ref, notes)
        if not spec.get("gguf", True):
            size = sum(f.stat().st_size for f in fixture_files(name, gguf=False))
            notes.append(f"{name}: transformers only (no GGUF); fixture total {size} bytes")
            summary.append((name, None, None, None, None, size))
            assert size < spec.get("max_bytes", MAX_FIXTURE_BYTES), (name, size)
            continue

        f32 = GGUF_DIR / f"{name}.f32.gguf"
        maf.convert(spec, d, f32)
        view = llamacpp_reference(name, "f32", f32, refj)
        q8 = GGUF_DIR / f"{name}.q8_0.gguf"
        qview = llamacpp_reference(name, "q8_0", q8, refj, quant_src=f32)
        vs, qvs = view["vs_transformers"], qview["vs_transformers"]
        assert view["gguf_hparams"]["tokenizer.ggml.model"] == "gpt2", view["gguf_hparams"]
        qtypes = sorted(set(qview["tensor_types"].values()))
        assert "Q8_0" in qtypes, qtypes
        size = sum(f.stat().st_size for f in fixture_files(name))
        notes.append(
            f"{name}: F32 transformers vs llama.cpp: max |logprob diff| {vs['max_abs_logprob_diff']:.2e} "
            f"(mean {vs['mean_abs_logprob_diff']:.2e}, {vs['n_logprobs']} tokens), argmax agreement "
            f"{vs['argmax_agreement']:.3f}, tokenization mismatches {len(vs['tokenization_mismatches'])}; "
            f"Q8_0 ({qtypes}): max |logprob diff| {qvs['max_abs_logprob_diff']:.2e}, top-1 agreement "
            f"{qvs['argmax_agreement']:.3f}; fixture total {size} bytes"
        )
        summary.append((name, vs["max_abs_logprob_diff"], vs["argmax_agreement"], qvs["max_abs_logprob_diff"],
                        qvs["argmax_agreement"], size))
        assert vs["max_abs_logprob_diff"] <= MAX_LOGPROB_DIFF, (name, vs)
        assert not vs["tokenization_mismatches"], vs
        assert size < MAX_FIXTURE_BYTES, (name, size)

    print()
    print("files:")
    for name, d32, *_ in summary:
        for p in fixture_files(name, gguf=d32 is not None):
            h = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
            print(f"  {p.stat().st_size:>9}  {h}  {p.relative_to(ROOT)}")
    print()
    print(f"{'model':<10} {'f32 max|dlogprob|':>18} {'f32 argmax':>10} {'q8 max|dlogprob|':>17} {'q8 top-1':>9} "
          f"{'bytes':>9}")
    for name, d32, a32, dq8, aq8, size in summary:
        if d32 is None:
            print(f"{name:<10} {'(no GGUF)':>18} {'':>10} {'':>17} {'':>9} {size:>9}")
            continue
        print(f"{name:<10} {d32:>18.2e} {a32:>10.3f} {dq8:>17.2e} {aq8:>9.3f} {size:>9}")
    print("versions:", json.dumps(maf.VERSIONS))


if __name__ == "__main__":
    main()
