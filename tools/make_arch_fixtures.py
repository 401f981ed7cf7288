#!/usr/bin/env python3
"""Parity fixtures for the architectures beyond llama/mistral/qwen: gemma2, gemma3 (text-only Gemma3ForCausalLM),
phi3 (+ phi3_partial: partial rotary 0.75, Phi-4-mini style), olmo2, granite, smollm3, gemma (Gemma 1; listed
last so that the others keep their seeds; `make_arch_fixtures.py NAME...` regenerates only those).

For each model <name>:
  tests/fixtures/hf/<name>/               tiny random-weight transformers checkpoint (F32 safetensors, hidden 64)
                                          with the shared tiny byte-level BPE tokenizer and the model's REAL chat template
  tests/fixtures/ref/<name>.json          transformers reference (schema of tools/make_fixtures.py, plus "arch_config":
  tests/fixtures/ref/<name>.logits.bin    the architecture-specific config values and "sensitivity": how much each of
                                          them moves the logits)
  tests/fixtures/gguf/<name>.f32.gguf     the same checkpoint converted by llama.cpp's own convert_hf_to_gguf.py
                                          (--outtype f32)
  tests/fixtures/gguf/<name>.f32.llamacpp.json
                                          llama.cpp's view (schema of tools/make_llamacpp_fixtures.py, made by its
                                          llama_view: F32 KV cache, CPU, 2 threads), plus "gguf_hparams" (the arch
                                          keys of the GGUF) and "vs_transformers" (max |log-prob diff| on the same ids)

How to run (from the repository root; nothing is downloaded, everything is seeded and deterministic):

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 \
        numpy==2.4.6 jinja2==3.1.6 gguf==0.19.0 sentencepiece==0.2.3
    # llama-cpp-python 0.3.36 built into /tmp/lcppvenv (see tools/make_llamacpp_fixtures.py), its sdist unpacked in
    # /tmp/lcpp/llama_cpp_python-0.3.36 (the converter and the chat templates are taken from its vendor/llama.cpp)
    /tmp/refvenv/bin/python tools/make_arch_fixtures.py [name ...]

    LCPP_DIR (default /tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp) and LCPP_PYTHON (default
    /tmp/lcppvenv/bin/python) point elsewhere if needed. Only the named models' files are rewritten (all by default).

Versions used for the committed files: torch 2.15.0 (+cu132 wheel, run on the CPU), transformers 5.23.0,
tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6, jinja2 3.1.6, python 3.11.7; llama.cpp's converter and gguf-py
from the llama-cpp-python 0.3.36 sdist (vendor/llama.cpp), run with the torch/transformers above; llama-cpp-python
0.3.36 (gguf 0.19.0, numpy 2.4.6) for the llama.cpp references. The versions are also recorded in every JSON.

Tokenizer: the tiny byte-level BPE of tools/make_fixtures.py (train_base_tokenizer, GPT-2 pre-tokenizer regex), plus
added tokens for the chat templates below (EXTRA_SPECIAL_TOKENS; <think>/</think> as non-special added tokens, as in
SmolLM3/Qwen3). Vocabulary size = exact token count (no padding rows: llama.cpp's gemma3 converter drops padding rows
of token_embd while its gpt2 vocab keeps vocab_size entries, and padding rows would change log-softmax).

Chat templates (verbatim): gemma2 google-gemma-2-2b-it.jinja, phi3/phi3_partial microsoft-Phi-3.5-mini-instruct.jinja,
granite ibm-granite-granite-3.3-2B-Instruct.jinja, smollm3 HuggingFaceTB-SmolLM3-3B.jinja, all from llama.cpp's
models/templates/. Not in that folder: gemma3 uses google/gemma-3-*-it's tokenizer_config.json chat_template
(GEMMA3_TEMPLATE below), olmo2 allenai/OLMo-2-1124-*-Instruct's (OLMO2_TEMPLATE below). Chats per model: the chats of
make_fixtures.py, except gemma2 (its template rejects a system message: the first chat has none) and granite (its
template puts strftime_now() into the default system message: every chat has a system message so that the rendering
does not depend on the date); smollm3 gets one more chat with "/no_think".

Conversion (convert_hf_to_gguf.py run unmodified through runpy, with these patches applied to its classes first):
  * get_vocab_base_pre -> "gpt-2": the tiny tokenizer's hash is not in the converter's table (as for the committed
    llama3 GGUF, tools/make_gguf_fixtures.py); the pre-tokenizer really is GPT-2's.
  * Gemma2Model.set_vocab and Phi3MiniModel.set_vocab -> _set_vocab_gpt2: those converters read a SentencePiece
    tokenizer.model (Phi3 only unless tokenizer_class is GPT2Tokenizer); the tiny tokenizer is byte-level BPE, and
    _set_vocab_gpt2 is what Gemma3Model does without tokenizer.model and Phi3 does for Phi-4's GPT2Tokenizer.
  No GGUF metadata is edited afterwards.

Config choices forced by llama.cpp 0.3.36 (so that both references compute the same function):
  * gemma2/gemma3: query_pre_attn_scalar == head_dim (llama.cpp scales by 1/sqrt(head_dim) except for the 27B layer
    counts); gemma2 rope_theta 10000 (its converter writes no rope base); layer_types follow llama.cpp's fixed patterns
    (gemma2: every 2nd layer global; gemma3: every 6th), the converter writes no pattern.
  * phi3: sliding_window null (llama.cpp disables Phi SWA); rotary dims = partial_rotary_factor * head_dim.
  * smollm3: no_rope_layers [1,1,1,0] (llama.cpp hard-codes no RoPE on every 4th layer).
  * general.name is set explicitly (GGUF_NAMES): llama.cpp keys a Phi-3 tokenizer quirk on it.

Weights: make_fixtures.redraw_weights with std-0.2 projections, and for Gemma post-attention norms ~3 and post-FFN norms
~0.5 (see redraw_weights). llama.cpp's CPU GELU is an F16 lookup table (GGML_GELU_FP16): with Gemma's MLP carrying a
large share of the residual stream that alone moved the log-probs by 4e-4..2e-3; pick_seed emulates it and requires
< MAX_FP16_GELU_EFFECT, and the remaining transformers-vs-llama.cpp difference of the gemma fixtures (~1e-4) is that
table (recorded as "llamacpp_fp16_gelu_effect" in their ref JSON). The other models agree to ~1e-6.

Checks (the script fails otherwise): saved weights are the in-memory ones, all F32; each arch-specific knob moves the
logits ("sensitivity"; a sliding window only from position sliding_window on); cached greedy == uncached greedy;
transformers, the raw tokenizers library and the in-memory tokenizer agree on every string and chat; llama.cpp's
prompt ids equal transformers'; max |log-prob diff| transformers vs llama.cpp <= MAX_LOGPROB_DIFF; each model's
fixture files < 1 MB. Running it twice gives byte-identical files.

Note: tools/make_fixtures.py deletes tests/fixtures/hf/ and tests/fixtures/ref/ wholesale; run this script after it.
"""

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
FIX = ROOT / "tests" / "fixtures"
HF_DIR = FIX / "hf"
REF_DIR = FIX / "ref"
GGUF_DIR = FIX / "gguf"
GENERATOR = "tools/make_arch_fixtures.py"
LCPP_DIR = Path(os.environ.get("LCPP_DIR", "/tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp"))
LCPP_PYTHON = os.environ.get("LCPP_PYTHON", "/tmp/lcppvenv/bin/python")
TEMPLATES = LCPP_DIR / "models" / "templates"

MAX_LOGPROB_DIFF = 1e-3  # transformers vs llama.cpp, F32 weights and KV cache
MAX_FP16_GELU_EFFECT = 3e-4  # gemma: llama.cpp's F16-table GELU alone, emulated in transformers
MAX_FIXTURE_BYTES = 1_000_000  # per model: hf dir + ref json/bin + gguf + llamacpp json


# ----------------------------------------------------------------------------------------------------------------------
# llama.cpp side (runs under LCPP_PYTHON: no torch there)
# ----------------------------------------------------------------------------------------------------------------------


def llamacpp_worker(gguf_path, ref_path, out_path, name):
    sys.path.insert(0, str(TOOLS))
    import make_llamacpp_fixtures as mlf  # noqa: E402  (llama_view, F32 KV cache, no extra buffer types)

    ref = json.loads(Path(ref_path).read_text(encoding="utf-8"))
    view = mlf.llama_view(Path(gguf_path), ref, None)
    view["generator"] = GENERATOR
    view["model"] = name
    view["reference"] = f"tests/fixtures/ref/{name}.json"
    Path(out_path).write_text(json.dumps(view, ensure_ascii=False) + "\n", encoding="utf-8")


# convert_hf_to_gguf.py, run as __main__ after patching its classes (see the docstring)
CONVERT_RUNNER = r"""
import runpy, sys
lcpp, hf_dir, out, patch_vocab, model_name = sys.argv[1:6]
sys.path.insert(0, lcpp + "/gguf-py")
sys.path.insert(0, lcpp)
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
if patch_vocab == "1":
    from conversion import gemma, phi
    gemma.Gemma2Model.set_vocab = base.TextModel._set_vocab_gpt2
    gemma.GemmaModel.set_vocab = base.TextModel._set_vocab_gpt2
    phi.Phi3MiniModel.set_vocab = base.TextModel._set_vocab_gpt2
sys.argv = ["convert_hf_to_gguf.py", "--outtype", "f32", "--model-name", model_name, "--outfile", out, hf_dir]
runpy.run_path(lcpp + "/convert_hf_to_gguf.py", run_name="__main__")
"""

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--llamacpp-worker":
    llamacpp_worker(*sys.argv[2:6])
    sys.exit(0)

# ----------------------------------------------------------------------------------------------------------------------
# transformers side
# ----------------------------------------------------------------------------------------------------------------------

sys.path.insert(0, str(TOOLS))
import make_fixtures as mf  # noqa: E402  (tokenizer, corpus, prompts, chats, reference helpers; sets torch threads)

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import AddedToken, Tokenizer  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    Gemma2Config,
    Gemma2ForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    GraniteConfig,
    GraniteForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedTokenizerFast,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

VERSIONS = dict(mf.VERSIONS, safetensors=__import__("safetensors").__version__, jinja2=__import__("jinja2").__version__)

# (content, special): appended after make_fixtures.SPECIAL_TOKENS, in this order
EXTRA_SPECIAL_TOKENS = [
    ("<bos>", True),  # gemma
    ("<eos>", True),
    ("<pad>", True),
    ("<start_of_turn>", True),
    ("<end_of_turn>", True),
    ("<|endoftext|>", True),  # phi3, olmo2
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|end|>", True),
    ("<|pad|>", True),
    ("<|start_of_role|>", True),  # granite
    ("<|end_of_role|>", True),
    ("<|tool_call|>", True),
    ("<think>", False),  # smollm3 (non-special added tokens, as in SmolLM3 / Qwen3)
    ("</think>", False),
]

EXTRA_TOKENIZATION_STRINGS = [
    "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<|system|>\nBe brief.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\n<|endoftext|>",
    "<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|tool_call|>[]",
    "<think>\nhmm, <think>nested</think>\n</think>\nanswer",
]

# google/gemma-3-*-it tokenizer_config.json "chat_template" (not in llama.cpp's models/templates/)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

# allenai/OLMo-2-1124-*-Instruct tokenizer_config.json "chat_template" (no OLMo template in llama.cpp's folder)
OLMO2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<|system|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}{{ '<|assistant|>\\n'  + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ '<|assistant|>\\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}"
)


# general.name of each GGUF (--model-name; by default the converter derives it from the directory name). llama.cpp
# keys a tokenizer quirk on it: a name containing "phi3" or "phi-3" sets RSTRIP on every special token and needs
# <unk>, <s>, </s> in the vocabulary (llama-vocab.cpp); real Phi-3.5/Phi-4 conversions are named "Phi 3.5 Mini
# Instruct" / "Phi 4 Mini Instruct", which do not trigger it, and neither do these names.
GGUF_NAMES = {
    "gemma": "Strata Tiny Gemma",
    "gemma2": "Strata Tiny Gemma 2",
    "gemma3": "Strata Tiny Gemma 3",
    "phi3": "Strata Tiny Phi 3.5 Mini",
    "phi3_partial": "Strata Tiny Phi 4 Mini",
    "olmo2": "Strata Tiny OLMo 2",
    "granite": "Strata Tiny Granite 3.3",
    "smollm3": "Strata Tiny SmolLM3",
}


def read_template(fname):
    return (TEMPLATES / fname).read_text(encoding="utf-8")


def chats_for(name):
    base = [(list(m), agp) for m, agp in mf.CHATS]
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    if name in ("gemma", "gemma2"):  # "System role not supported"
        base[0] = ([m for m in base[0][0] if m["role"] != "system"], True)
    elif name == "granite":  # the default system message contains strftime_now('%B %d, %Y')
        base = [(m if m[0]["role"] == "system" else [sys_msg] + m, agp) for m, agp in base]
    elif name == "smollm3":
        base.append(
            (
                [
                    {"role": "system", "content": "Answer briefly. /no_think"},
                    {"role": "user", "content": "Hi!"},
                    {"role": "assistant", "content": "\nHello."},
                    {"role": "user", "content": "Bye!"},
                ],
                True,
            )
        )
    return base


# ----------------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------------


def model_specs(V, ids):
    """Specs: cls, cfg, tokenizer (bos added by the post-processor or not; bos/eos/pad strings), template, gen config,
    arch: the architecture-specific values recorded in the ref JSON, knobs: config edits whose effect on the logits is
    measured (each must move them)."""
    h = dict(vocab_size=V, hidden_size=64, max_position_embeddings=512)
    gemma_tok = dict(add_bos=True, bos="<bos>", eos="<eos>", pad="<pad>")
    gemma_gen = dict(bos_token_id=ids["<bos>"], eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]], pad_token_id=ids["<pad>"])
    g2_layers = ["sliding_attention", "full_attention"] * 2
    g3_layers = ["sliding_attention"] * 5 + ["full_attention"]
    phi_common = dict(
        **h,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        original_max_position_embeddings=512,
        sliding_window=None,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    phi_tok = dict(add_bos=False, bos="<|endoftext|>", eos="<|endoftext|>", pad="<|endoftext|>")
    phi_gen = dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=[ids["<|endoftext|>"], ids["<|end|>"]], pad_token_id=ids["<|endoftext|>"])
    return [
        dict(
            name="gemma2",
            cls=Gemma2ForCausalLM,
            cfg=Gemma2Config(
                **h,
                intermediate_size=32,
                num_hidden_layers=4,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                query_pre_attn_scalar=16,
                hidden_activation="gelu_pytorch_tanh",
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                sliding_window=8,
                layer_types=g2_layers,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
                tie_word_embeddings=True,
                bos_token_id=ids["<bos>"],
                eos_token_id=ids["<eos>"],
                pad_token_id=ids["<pad>"],
            ),
            tok=gemma_tok,
            template=read_template("google-gemma-2-2b-it.jinja"),
            template_source="llama.cpp models/templates/google-gemma-2-2b-it.jinja",
            gen=gemma_gen,
            gemma_norms=True,
            proj_std=0.1,
            arch=[
                "head_dim", "query_pre_attn_scalar", "hidden_activation", "sliding_window", "layer_types",
                "attn_logit_softcapping", "final_logit_softcapping", "rope_parameters", "tie_word_embeddings",
                "rms_norm_eps",
            ],
            knobs={
                "sliding_window": {"sliding_window": 512},
                "attn_logit_softcapping": {"attn_logit_softcapping": None},
                "final_logit_softcapping": {"final_logit_softcapping": None},
            },
        ),
        dict(
            name="gemma3",
            cls=Gemma3ForCausalLM,
            cfg=Gemma3TextConfig(
                **h,
                intermediate_size=16,
                num_hidden_layers=6,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                query_pre_attn_scalar=16,
                hidden_activation="gelu_pytorch_tanh",
                rms_norm_eps=1e-6,
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                },
                sliding_window=8,
                sliding_window_pattern=6,
                layer_types=g3_layers,
                attn_logit_softcapping=None,
                final_logit_softcapping=None,
                tie_word_embeddings=True,
                bos_token_id=ids["<bos>"],
                eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]],
                pad_token_id=ids["<pad>"],
            ),
            tok=gemma_tok,
            template=GEMMA3_TEMPLATE,
            template_source="google/gemma-3-*-it tokenizer_config.json chat_template (no gemma-3 template in llama.cpp's folder)",
            gen=gemma_gen,
            gemma_norms=True,
            proj_std=0.1,
            arch=[
                "head_dim", "query_pre_attn_scalar", "hidden_activation", "sliding_window", "sliding_window_pattern",
                "layer_types", "rope_parameters", "final_logit_softcapping", "attn_logit_softcapping",
                "tie_word_embeddings", "rms_norm_eps",
            ],
            knobs={
                "sliding_window": {"sliding_window": 512},
                "rope_local_base_freq": {
                    "rope_parameters": {
                        "sliding_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                    }
                },
            },
        ),
        dict(
            name="phi3",
            cls=Phi3ForCausalLM,
            cfg=Phi3Config(
                **phi_common,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
                tie_word_embeddings=False,
            ),
            tok=phi_tok,
            template=read_template("microsoft-Phi-3.5-mini-instruct.jinja"),
            template_source="llama.cpp models/templates/microsoft-Phi-3.5-mini-instruct.jinja",
            gen=phi_gen,
            arch=["rope_parameters", "original_max_position_embeddings", "sliding_window", "tie_word_embeddings"],
            knobs={},
        ),
        dict(
            name="phi3_partial",
            cls=Phi3ForCausalLM,
            cfg=Phi3Config(
                **phi_common,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
                tie_word_embeddings=True,
            ),
            tok=phi_tok,
            template=read_template("microsoft-Phi-3.5-mini-instruct.jinja"),
            template_source="llama.cpp models/templates/microsoft-Phi-3.5-mini-instruct.jinja",
            gen=phi_gen,
            arch=["rope_parameters", "original_max_position_embeddings", "sliding_window", "tie_word_embeddings"],
            knobs={
                "partial_rotary_factor": {
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
                }
            },
        ),
        dict(
            name="olmo2",
            cls=Olmo2ForCausalLM,
            cfg=Olmo2Config(
                **h,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-6,
                hidden_act="silu",
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                attention_bias=False,
                tie_word_embeddings=False,
                bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|endoftext|>"],
                pad_token_id=ids["<|pad|>"],
            ),
            tok=dict(add_bos=False, bos="<|endoftext|>", eos="<|endoftext|>", pad="<|pad|>"),
            template=OLMO2_TEMPLATE,
            template_source="allenai/OLMo-2-1124-*-Instruct tokenizer_config.json chat_template (none in llama.cpp's folder)",
            gen=dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|pad|>"]),
            arch=["rope_parameters", "rms_norm_eps", "tie_word_embeddings"],
            knobs={},
        ),
        dict(
            name="granite",
            cls=GraniteForCausalLM,
            cfg=GraniteConfig(
                **h,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-5,
                hidden_act="silu",
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                embedding_multiplier=2.0,
                attention_multiplier=0.2,
                residual_multiplier=0.7,
                logits_scaling=1.5,
                attention_bias=False,
                mlp_bias=False,
                tie_word_embeddings=True,
                bos_token_id=ids["<|end_of_text|>"],
                eos_token_id=ids["<|end_of_text|>"],
                pad_token_id=ids["<|end_of_text|>"],
            ),
            tok=dict(add_bos=False, bos="<|end_of_text|>", eos="<|end_of_text|>", pad="<|end_of_text|>"),
            template=read_template("ibm-granite-granite-3.3-2B-Instruct.jinja"),
            template_source="llama.cpp models/templates/ibm-granite-granite-3.3-2B-Instruct.jinja",
            gen=dict(bos_token_id=ids["<|end_of_text|>"], eos_token_id=ids["<|end_of_text|>"], pad_token_id=ids["<|end_of_text|>"]),
            arch=[
                "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling",
                "rope_parameters", "tie_word_embeddings",
            ],
            knobs={
                "embedding_multiplier": {"embedding_multiplier": 1.0},
                "attention_multiplier": {"attention_multiplier": 0.25},  # 1/sqrt(head_dim): the usual scale
                "residual_multiplier": {"residual_multiplier": 1.0},
                "logits_scaling": {"logits_scaling": 1.0},
            },
        ),
        dict(
            name="smollm3",
            cls=SmolLM3ForCausalLM,
            cfg=SmolLM3Config(
                **h,
                intermediate_size=16,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                rms_norm_eps=1e-6,
                hidden_act="silu",
                rope_parameters={"rope_type": "default", "rope_theta": 2000000.0},
                no_rope_layers=[1, 1, 1, 0],
                no_rope_layer_interval=4,
                use_sliding_window=False,
                sliding_window=None,
                attention_bias=False,
                tie_word_embeddings=True,
                bos_token_id=None,
                eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|end_of_text|>"],
            ),
            tok=dict(add_bos=False, bos=None, eos="<|im_end|>", pad="<|end_of_text|>"),
            template=read_template("HuggingFaceTB-SmolLM3-3B.jinja"),
            template_source="llama.cpp models/templates/HuggingFaceTB-SmolLM3-3B.jinja",
            gen=dict(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|end_of_text|>"]),
            arch=["no_rope_layers", "no_rope_layer_interval", "rope_parameters", "tie_word_embeddings"],
            knobs={"no_rope_layers": {"no_rope_layers": [1, 1, 1, 1]}},
        ),
        # Added after the others, so their seeds (by position) stay as they were.
        dict(
            name="gemma",
            cls=GemmaForCausalLM,
            cfg=GemmaConfig(
                **h,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                hidden_act="gelu_pytorch_tanh",
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                tie_word_embeddings=True,
                bos_token_id=ids["<bos>"],
                eos_token_id=ids["<eos>"],
                pad_token_id=ids["<pad>"],
            ),
            tok=gemma_tok,
            template=read_template("google-gemma-2-2b-it.jinja"),
            template_source="llama.cpp models/templates/google-gemma-2-2b-it.jinja (Gemma 1 and 2 share the format)",
            gen=gemma_gen,
            gemma_norms="plain",  # offsets N(0, 0.1): Gemma 1 has no post-norms to centre
            proj_std=0.2,
            arch=["head_dim", "hidden_act", "rope_parameters", "tie_word_embeddings", "rms_norm_eps"],
            knobs={},
        ),
    ]


def build_tokenizer():
    base = mf.train_base_tokenizer()
    for content, special in EXTRA_SPECIAL_TOKENS:
        tok = AddedToken(content, special=special, normalized=False)
        n = base.add_special_tokens([tok]) if special else base.add_tokens([tok])
        assert n == 1, content
    ids = {t: base.token_to_id(t) for t in mf.SPECIAL_TOKENS + [c for c, _ in EXTRA_SPECIAL_TOKENS]}
    assert len(set(ids.values())) == len(ids)
    return base, ids


def make_hf_tokenizer(spec, base):
    t = spec["tok"]
    tok_obj = mf.with_bos_processor(base, t["bos"]) if t["add_bos"] else Tokenizer.from_str(base.to_str())
    return PreTrainedTokenizerFast(
        tokenizer_object=tok_obj,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
        chat_template=spec["template"],
        bos_token=t["bos"],
        eos_token=t["eos"],
        pad_token=t["pad"],
        unk_token=None,
    )


def redraw_weights(model, seed, gemma_norms, proj_std):
    """make_fixtures.redraw_weights (N(0, 0.1) weights, norms 1 + N(0, 0.1)), except:
    * the projection matrices (everything but embeddings and norms) get std proj_std: with tied embeddings and
      std-0.1 projections the token's own embedding dominates the residual stream and greedy decoding just repeats a
      token; std 0.2 gives varied continuations;
    * Gemma's RMSNorm weights are offsets (scale = 1 + w): N(0, 0.1), except post_attention_layernorm 2 + N(0, 0.1)
      (scale ~3) and post_feedforward_layernorm -0.5 + N(0, 0.1) (scale ~0.5). Gemma normalizes each sub-layer's
      output, so these set the attention/MLP shares of the residual stream: a large MLP share makes llama.cpp's
      F16-table GELU move the log-probs by ~1e-3 (MAX_LOGPROB_DIFF itself), this one by ~1e-4; the strong attention
      also outruns the tied-embedding self-prediction that makes greedy decoding repeat a token."""
    mf.redraw_weights(model, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight") and "embed_tokens" not in name and "lm_head" not in name:
                p.mul_(proj_std / 0.1)
    if gemma_norms:
        g = torch.Generator().manual_seed(seed + 7)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    centre = 0.0
                    if gemma_norms == "plain":  # Gemma 1: no post-norms; see the MLP share below
                        pass
                    elif name.endswith("post_attention_layernorm.weight"):
                        centre = 2.0
                    elif name.endswith("post_feedforward_layernorm.weight"):
                        centre = -0.5
                    p.copy_(centre + 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float32))
            # Gemma 1 has no post-MLP norm to shrink the MLP's share of the residual stream (which carries
            # llama.cpp's F16-table GELU error): a smaller down projection does it instead.
            if gemma_norms == "plain":
                for name, p in model.named_parameters():
                    if name.endswith("mlp.down_proj.weight"):
                        p.mul_(0.25)


def make_model(spec, seed):
    torch.manual_seed(seed)
    model = spec["cls"](copy.deepcopy(spec["cfg"]))
    model.eval()
    redraw_weights(model, seed, spec.get("gemma_norms", False), spec.get("proj_std", 0.2))
    return model


class Fp16TableGelu(torch.nn.Module):
    """llama.cpp's CPU GELU (ggml-cpu vec.h, GGML_GELU_FP16): input rounded to F16, looked up in an F16 table of
    gelu-tanh; x <= -10 -> 0, x >= 10 -> x."""

    def forward(self, x):
        y = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


def fp16_gelu_effect(model, hf_tok):
    """Max |log-prob change| over the prompts when the GELU is llama.cpp's F16-table one (Gemma's MLP)."""
    worst = 0.0
    exact = [mf.logits_of(model, hf_tok(t)["input_ids"]) for t in mf.PROMPTS]
    acts = [layer.mlp.act_fn for layer in model.model.layers]
    for layer in model.model.layers:
        layer.mlp.act_fn = Fp16TableGelu()
    try:
        for t, a in zip(mf.PROMPTS, exact):
            ids = hf_tok(t)["input_ids"]
            b = mf.logits_of(model, ids)
            la, lb = torch.log_softmax(a.double(), -1), torch.log_softmax(b.double(), -1)
            nxt = torch.tensor(ids[1:])
            pos = torch.arange(len(ids) - 1)
            worst = max(worst, float((la[pos, nxt] - lb[pos, nxt]).abs().max()))
    finally:
        for layer, act in zip(model.model.layers, acts):
            layer.mlp.act_fn = act
    return worst


def pick_seed(spec, hf_tok, first_seed, notes):
    """As make_fixtures.pick_seed: first seed whose greedy continuations have a clear argmax at every step and are
    not a single repeated token. For the GELU models also: llama.cpp's F16-table GELU moves the prompts' log-probs by
    at most MAX_FP16_GELU_EFFECT, so that llama.cpp stays well within MAX_LOGPROB_DIFF of the exact computation."""
    for seed in range(first_seed, first_seed + 200):
        model = make_model(spec, seed)
        ok, worst = True, float("inf")
        for text in mf.PROMPTS:
            gm = []
            g = mf.greedy_with_cache(model, hf_tok(text)["input_ids"], mf.N_GREEDY, gm)
            worst = min(worst, min(gm))
            if min(gm) < mf.MIN_GREEDY_MARGIN or len(set(g)) < 3:
                ok = False
                break
        if ok and spec.get("gemma_norms"):
            effect = fp16_gelu_effect(model, hf_tok)
            spec["fp16_gelu_effect"] = effect
            if effect > MAX_FP16_GELU_EFFECT:
                notes.append(f"{spec['name']}: seed {seed} skipped: F16-table GELU moves log-probs by {effect:.2e}")
                ok = False
        if ok:
            notes.append(f"{spec['name']}: seed {seed} (min greedy-step margin {worst:.4f})")
            return seed
    raise RuntimeError(f"no suitable seed for {spec['name']}")


def load_ref(spec, d):
    m = spec["cls"].from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def with_config(spec, ref, edits):
    """The reference model's weights under an edited config (non-persistent buffers such as inv_freq recomputed)."""
    cfg = ref.config.__class__.from_dict({**ref.config.to_dict(), **edits})
    cfg._attn_implementation = "eager"
    m = spec["cls"](cfg)
    missing, unexpected = m.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    m.tie_weights()
    m.eval()
    return m


def build_model(spec, base, notes):
    name = spec["name"]
    d = HF_DIR / name
    if d.exists():
        for f in d.iterdir():
            f.unlink()
    d.mkdir(parents=True, exist_ok=True)
    hf_tok = make_hf_tokenizer(spec, base)
    seed = pick_seed(spec, hf_tok, spec["first_seed"], notes)
    model = make_model(spec, seed)
    model.save_pretrained(d, safe_serialization=True)
    for f in d.glob("*.safetensors"):
        f.chmod(0o644)  # written 0600
    GenerationConfig(**spec["gen"]).save_pretrained(d)
    hf_tok.save_pretrained(d)

    from safetensors import safe_open

    st = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    names = {}
    for f in st:
        with safe_open(d / f, framework="pt") as sf:
            for k in sf.keys():
                names[k] = sf.get_slice(k).get_dtype()
    assert set(names.values()) == {"F32"}, set(names.values())
    assert ("lm_head.weight" in names) == (not spec["cfg"].tie_word_embeddings), name
    notes.append(f"{name}: {len(st)} safetensors file(s), {len(names)} tensors, F32")

    ref = load_ref(spec, d)
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2), k1
    return d, hf_tok, ref, seed


def sensitivity(spec, ref, ids, notes):
    """Each architecture-specific knob must change the logits; sliding windows must not matter before the window."""
    out = {}
    base = mf.logits_of(ref, ids)
    for knob, edits in spec["knobs"].items():
        other = mf.logits_of(with_config(spec, ref, edits), ids)
        diff = float((base - other).abs().max())
        assert diff > 1e-2, (spec["name"], knob, diff)
        entry = {"edit": edits, "max_abs_logit_change": diff}
        if knob == "sliding_window":
            w = ref.config.sliding_window
            before = float((base[:w] - other[:w]).abs().max())
            assert before < 1e-5, (spec["name"], before)
            entry["max_abs_logit_change_before_window"] = before
        out[knob] = entry
        notes.append(f"{spec['name']}: {knob}: setting {edits} changes logits by up to {diff:.3f}")
    return out


def arch_config(spec, ref):
    c = ref.config.to_dict()
    out = {"model_type": c["model_type"], "architectures": c.get("architectures")}
    for k in spec["arch"]:
        out[k] = c.get(k, getattr(ref.config, k, None))
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
        out[k] = c[k]
    out["head_dim"] = getattr(ref.config, "head_dim", None) or c["hidden_size"] // c["num_attention_heads"]
    return out


def make_reference(spec, d, disk_tok, mem_tok, ref, seed, notes):
    """make_fixtures.make_reference with the model's own chats and extra tokenization strings."""
    name = spec["name"]
    V = ref.config.vocab_size
    raw = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert len(disk_tok) == raw.get_vocab_size(with_added_tokens=True) == V, (len(disk_tok), V)
    prompts, blobs, offset = [], [], 0
    for text in mf.PROMPTS:
        ids = [int(x) for x in disk_tok(text, add_special_tokens=True)["input_ids"]]
        assert ids == raw.encode(text).ids
        assert (ids[0] == disk_tok.bos_token_id) == spec["tok"]["add_bos"], (name, ids[:2])
        assert 14 <= len(ids) <= 30, (name, len(ids))
        lg = mf.logits_of(ref, ids)
        lp = torch.log_softmax(lg.double(), dim=-1)
        gm = []
        greedy = mf.greedy_with_cache(ref, ids, mf.N_GREEDY, gm)
        assert greedy == mf.greedy_no_cache(ref, ids, mf.N_GREEDY), name
        assert min(gm) >= mf.MIN_GREEDY_MARGIN / 2, (name, gm)
        top2 = torch.topk(lg, 2, dim=-1).values
        notes.append(
            f"{name}: prompt len {len(ids)}, logit std {float(lg.std()):.3f}, "
            f"min top1-top2 margin {float((top2[:, 0] - top2[:, 1]).min()):.4f}, min greedy-step margin {min(gm):.4f}"
        )
        prompts.append(
            dict(
                text=text,
                ids=ids,
                logits_offset=offset,
                n_positions=len(ids),
                logprobs=[float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)],
                greedy=greedy,
            )
        )
        blobs.append(lg.numpy().astype("<f4").tobytes(order="C"))
        offset += len(ids) * V

    toks = []
    for text in mf.TOKENIZATION_STRINGS + EXTRA_TOKENIZATION_STRINGS:
        ids = [int(x) for x in disk_tok(text, add_special_tokens=False)["input_ids"]]
        ids_ws = [int(x) for x in disk_tok(text, add_special_tokens=True)["input_ids"]]
        decoded = disk_tok.decode(ids, skip_special_tokens=False)
        assert raw.encode(text, add_special_tokens=False).ids == ids, (name, text)
        assert raw.encode(text, add_special_tokens=True).ids == ids_ws, (name, text)
        assert raw.decode(ids, skip_special_tokens=False) == decoded, (name, text)
        assert mem_tok(text, add_special_tokens=True)["input_ids"] == ids_ws, (name, text)
        toks.append(dict(text=text, ids=ids, ids_with_special=ids_ws, decoded=decoded))

    chats = []
    for messages, agp in chats_for(name):
        rendered = disk_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
        cids = mf.chat_ids(disk_tok, messages, agp)
        assert rendered == mem_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp), name
        assert cids == [int(x) for x in disk_tok(rendered, add_special_tokens=False)["input_ids"]], name
        assert cids == raw.encode(rendered, add_special_tokens=False).ids, name
        chats.append(dict(messages=messages, add_generation_prompt=agp, rendered=rendered, ids=cids))

    out = {
        "model": name,
        "dir": str(d.relative_to(ROOT)),
        "stored_dtype": "F32",
        "vocab_size": V,
        "generator": GENERATOR,
        "versions": VERSIONS,
        "seed": seed,
        "arch_config": arch_config(spec, ref),
        "chat_template_source": spec["template_source"],
        "special_tokens": {
            "bos": spec["tok"]["bos"],
            "bos_added_by_tokenizer": spec["tok"]["add_bos"],
            "eos": spec["tok"]["eos"],
            "pad": spec["tok"]["pad"],
        },
        "sensitivity": spec["sensitivity"],
        "llamacpp_fp16_gelu_effect": spec.get("fp16_gelu_effect"),
        "prompts": prompts,
        "tokenization": toks,
        "chat": chats,
    }
    (REF_DIR / f"{name}.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (REF_DIR / f"{name}.logits.bin").write_bytes(b"".join(blobs))
    return out


# ----------------------------------------------------------------------------------------------------------------------
# llama.cpp conversion and reference
# ----------------------------------------------------------------------------------------------------------------------


def convert(spec, d, out):
    if out.exists():
        out.unlink()
    patch = "1" if spec["cls"] in (GemmaForCausalLM, Gemma2ForCausalLM, Phi3ForCausalLM) else "0"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0")
    env.pop("NO_LOCAL_GGUF", None)  # the converter then puts its own gguf-py first
    r = subprocess.run(
        [sys.executable, "-c", CONVERT_RUNNER, str(LCPP_DIR), str(d), str(out), patch, GGUF_NAMES[spec["name"]]],
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        print(r.stdout[-5000:], r.stderr[-5000:])
        raise RuntimeError(f"convert_hf_to_gguf.py failed for {spec['name']}")
    return r.stderr


def gguf_hparams(path):
    r = gguf.GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    out = {}
    for k, f in r.fields.items():
        if not (k.startswith(arch + ".") or k in ("general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre")
                or k.startswith("tokenizer.ggml.add_") or k.endswith("_token_id")):
            continue
        v = f.contents()
        out[k] = v
    return out


def annotate_view(view, name, gguf_path, ref):
    """Adds to a llama.cpp view its GGUF's architecture settings ("gguf_hparams") and how it compares with the
    transformers reference on the same token ids ("vs_transformers")."""
    diffs, agree, n = [], 0, 0
    logits = np.fromfile(REF_DIR / f"{name}.logits.bin", dtype="<f4")
    V = ref["vocab_size"]
    assert view["n_vocab"] == V, (view["n_vocab"], V)
    for hp, lp in zip(ref["prompts"], view["prompts"]):
        assert lp["ids"] == hp["ids"], (name, lp["ids"], hp["ids"])
        diffs += [abs(a - b) for a, b in zip(hp["logprobs"], lp["logprobs"])]
        lg = logits[hp["logits_offset"]: hp["logits_offset"] + hp["n_positions"] * V].reshape(hp["n_positions"], V)
        agree += int((lg.argmax(-1) == np.array(lp["argmax"])).sum())
        n += hp["n_positions"]
    # tokenization of the tricky strings: llama.cpp (special=True) vs transformers
    tok_mismatch = [t["text"] for t, v in zip(ref["tokenization"], view["tokenization"]) if t["ids"] != v["special"]]
    view["gguf_hparams"] = gguf_hparams(gguf_path)
    view["vs_transformers"] = {
        "max_abs_logprob_diff": max(diffs),
        "mean_abs_logprob_diff": sum(diffs) / len(diffs),
        "n_logprobs": len(diffs),
        "argmax_agreement": agree / n,
        "tokenization_mismatches": tok_mismatch,
    }


def llamacpp_reference(name, gguf_path, ref):
    out = GGUF_DIR / f"{name}.f32.llamacpp.json"
    r = subprocess.run(
        [LCPP_PYTHON, str(Path(__file__).resolve()), "--llamacpp-worker", str(gguf_path), str(REF_DIR / f"{name}.json"),
         str(out), name],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        print(r.stdout[-5000:], r.stderr[-5000:])
        raise RuntimeError(f"llama.cpp reference failed for {name}")
    view = json.loads(out.read_text(encoding="utf-8"))
    annotate_view(view, name, gguf_path, ref)
    out.write_text(json.dumps(view, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return view


class Notes(list):
    """Printed as they come (a failed check still shows what led to it)."""

    def append(self, line):
        print(line, flush=True)
        super().append(line)


def fixture_files(name):
    files = sorted((HF_DIR / name).iterdir())
    files += [REF_DIR / f"{name}.json", REF_DIR / f"{name}.logits.bin"]
    files += [GGUF_DIR / f"{name}.f32.gguf", GGUF_DIR / f"{name}.f32.llamacpp.json"]
    return files


def main():
    names = sys.argv[1:]
    for d in (HF_DIR, REF_DIR, GGUF_DIR):
        d.mkdir(parents=True, exist_ok=True)
    notes = Notes()
    base, ids = build_tokenizer()
    V = base.get_vocab_size(with_added_tokens=True)
    notes.append(f"tokenizer: {V} tokens (= vocab_size of every model); added ids: " + json.dumps(
        {c: ids[c] for c, _ in EXTRA_SPECIAL_TOKENS}))
    specs = model_specs(V, ids)
    unknown = set(names) - {s["name"] for s in specs}
    assert not unknown, f"unknown model(s) {sorted(unknown)}"
    summary = []
    for i, spec in enumerate(specs):
        spec["first_seed"] = 20000 + 1000 * i  # 200 candidates each
        if names and spec["name"] not in names:
            continue
        name = spec["name"]
        d, mem_tok, ref, seed = build_model(spec, base, notes)
        disk_tok = AutoTokenizer.from_pretrained(d)
        spec["sensitivity"] = sensitivity(spec, ref, disk_tok(mf.PROMPTS[0])["input_ids"], notes)
        refj = make_reference(spec, d, disk_tok, mem_tok, ref, seed, notes)
        gpath = GGUF_DIR / f"{name}.f32.gguf"
        convert(spec, d, gpath)
        view = llamacpp_reference(name, gpath, refj)
        vs = view["vs_transformers"]
        size = sum(f.stat().st_size for f in fixture_files(name))
        notes.append(
            f"{name}: transformers vs llama.cpp: max |logprob diff| {vs['max_abs_logprob_diff']:.2e} "
            f"(mean {vs['mean_abs_logprob_diff']:.2e}, {vs['n_logprobs']} tokens), argmax agreement "
            f"{vs['argmax_agreement']:.3f}, tokenization mismatches {len(vs['tokenization_mismatches'])}, "
            f"add_bos {view['add_bos']}; fixture total {size} bytes"
        )
        summary.append((name, vs["max_abs_logprob_diff"], vs["argmax_agreement"], size, view["add_bos"]))
        assert vs["max_abs_logprob_diff"] <= MAX_LOGPROB_DIFF, (name, vs)
        assert size < MAX_FIXTURE_BYTES, (name, size)

    print()
    print("files:")
    for name, *_ in summary:
        for p in fixture_files(name):
            h = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
            print(f"  {p.stat().st_size:>9}  {h}  {p.relative_to(ROOT)}")
    print()
    print(f"{'model':<14} {'max|dlogprob| hf vs llama.cpp':>30} {'argmax agree':>13} {'bytes':>9}  add_bos")
    for name, dmax, agree, size, add_bos in summary:
        print(f"{name:<14} {dmax:>30.2e} {agree:>13.3f} {size:>9}  {add_bos}")
    print("versions:", json.dumps(VERSIONS))


if __name__ == "__main__":
    main()
