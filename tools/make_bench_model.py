#!/usr/bin/env python3
"""Write a Hugging Face directory for a random-weight Llama model to benchmark with.

    python3 tools/make_bench_model.py OUT_DIR [--shape tinyllama|8b] [--layers N] [--seed S]
                                      [--max-shard-bytes B]

The model has TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 heads, 4 KV heads,
intermediate 5632, vocab 32000, untied head), or with `--shape 8b` Llama-3-8B's (hidden
4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocab 128256; 16 GB), BF16 weights drawn from N(0, 0.02) (norm
weights from N(1, 0.02)), and a byte-level BPE tokenizer of exactly 32000 ids (3 special
tokens, the 256 byte characters, a few hundred merges building common English words, and
filler tokens). Its output is noise: it exists to measure speed and memory, not quality.

Files written: config.json, generation_config.json, tokenizer.json,
tokenizer_config.json, and either model.safetensors or, when the weights exceed
--max-shard-bytes (default 2e9), model-0000K-of-0000N.safetensors shards plus
model.safetensors.index.json.

Needs only numpy. The safetensors files are written by hand (8-byte little-endian header
length, JSON header, raw data), streaming one chunk at a time so memory stays ~100 MB;
the `safetensors` package is not needed (its writers take whole tensors in memory). The
output is a pure function of the arguments: each tensor has its own seeded stream.
"""

import argparse
import json
import os
import sys
import time
import zlib
from statistics import NormalDist

import numpy as np

HIDDEN = 2048
INTERMEDIATE = 5632
LAYERS = 22
HEADS = 32
KV_HEADS = 4
VOCAB = 32000
MAX_POSITIONS = 2048
# hidden, intermediate, layers, heads, KV heads, vocab, positions
SHAPES = {
    "tinyllama": (HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB, MAX_POSITIONS),
    "8b": (4096, 14336, 32, 32, 8, 128256, 8192),
}
WEIGHT_STD = 0.02
NORM_STD = 0.02

SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2, as in Llama 2 / TinyLlama
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

# TinyLlama-1.1B-Chat's (Zephyr-style) chat template.
CHAT_TEMPLATE = (
    "{% for message in messages %}\n"
    "{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}"
)

# Words whose space-prefixed forms get merges, so English text encodes to fewer tokens
# than bytes (roughly like a real tokenizer on common words).
WORDS = """
the of and to in is that it for was on are as with be at by this have from or one had
not but what all were when we there can an your which their said if do will each about
how up out them then she many some so these would other into has more her two like him
see time could no make than first been its who now people my made over did down only way
find use may water long little very after words called just where most know get through
back much before go good new write our used me man too any day same right look think
also around another came come work three word must because does part even place well
such here take why things help put years different away again off went old number great
tell men say small every found still between name should home big give air line set own
under read last never us left end along while might next sound below saw something
thought both few those always looked show large often together asked house world going
want school important until form food keep children feet land side without boy once
animals life enough took sometimes four head above kind began almost live page got earth
need far hand high year mother light parts country father let night following picture
being study second eyes soon times story boys since white days ever paper hard near
sentence better best across during today others however sure means knew together ask
model token tokens memory layer layers weights server request answer question hello
""".split()


def bytes_to_unicode():
    """GPT-2's byte -> printable character table used by ByteLevel pre-tokenizers."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_tokenizer():
    """tokenizer.json contents (a dict): byte-level BPE with exactly VOCAB ids."""
    byte_chars = bytes_to_unicode()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[byte_chars[b]] = len(vocab)
    merges = []
    for word in WORDS:
        chars = [byte_chars[b] for b in (" " + word).encode("utf-8")]
        prefix = chars[0]
        for c in chars[1:]:
            merged = prefix + c
            if merged not in vocab:
                vocab[merged] = len(vocab)
                merges.append(f"{prefix} {c}")
            prefix = merged
    n_filler = VOCAB - len(vocab)
    assert n_filler >= 0, "too many merges for the vocabulary"
    for i in range(n_filler):
        vocab[f"<|filler_{i}|>"] = len(vocab)
    assert len(vocab) == VOCAB

    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(SPECIALS)
    ]
    bos = SPECIALS[BOS_ID]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [BOS_ID], "tokens": [bos]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": merges,
        },
    }


def configs(layers):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": WEIGHT_STD,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": "bfloat16",
    }
    generation = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID,
                  "max_length": MAX_POSITIONS}
    tokenizer_config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": SPECIALS[BOS_ID],
        "eos_token": SPECIALS[EOS_ID],
        "unk_token": SPECIALS[UNK_ID],
        "pad_token": SPECIALS[EOS_ID],
        "clean_up_tokenization_spaces": False,
        "legacy": False,
        "model_max_length": MAX_POSITIONS,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in enumerate(SPECIALS)
        },
    }
    return config, generation, tokenizer_config


def tensor_specs(layers):
    """(name, shape, mean, std) in file order: embeddings, layer by layer, norm, head."""
    head_dim = HIDDEN // HEADS
    q, kv = HEADS * head_dim, KV_HEADS * head_dim
    specs = [("model.embed_tokens.weight", (VOCAB, HIDDEN), 0.0, WEIGHT_STD)]
    for i in range(layers):
        p = f"model.layers.{i}"
        specs += [
            (f"{p}.input_layernorm.weight", (HIDDEN,), 1.0, NORM_STD),
            (f"{p}.self_attn.q_proj.weight", (q, HIDDEN), 0.0, WEIGHT_STD),
            (f"{p}.self_attn.k_proj.weight", (kv, HIDDEN), 0.0, WEIGHT_STD),
            (f"{p}.self_attn.v_proj.weight", (kv, HIDDEN), 0.0, WEIGHT_STD),
            (f"{p}.self_attn.o_proj.weight", (HIDDEN, q), 0.0, WEIGHT_STD),
            (f"{p}.post_attention_layernorm.weight", (HIDDEN,), 1.0, NORM_STD),
            (f"{p}.mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN), 0.0, WEIGHT_STD),
            (f"{p}.mlp.up_proj.weight", (INTERMEDIATE, HIDDEN), 0.0, WEIGHT_STD),
            (f"{p}.mlp.down_proj.weight", (HIDDEN, INTERMEDIATE), 0.0, WEIGHT_STD),
        ]
    specs += [
        ("model.norm.weight", (HIDDEN,), 1.0, NORM_STD),
        ("lm_head.weight", (VOCAB, HIDDEN), 0.0, WEIGHT_STD),
    ]
    return specs


def bf16_quantile_table(mean, std):
    """65536 BF16 bit patterns: the normal distribution's quantiles at (i + 0.5) / 65536.

    Indexing it with uniform random uint16 values draws (finely quantized) normal samples
    at the cost of a table lookup, far faster than drawing float normals.
    """
    dist = NormalDist(mean, std)
    f32 = np.array([dist.inv_cdf((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return rounded.astype("<u2")


def write_tensor(f, table, rng, numel, chunk=1 << 22):
    """Streams numel random BF16 values to f, `chunk` at a time."""
    left = numel
    while left:
        n = min(chunk, left)
        idx = np.frombuffer(rng.bytes(2 * n), dtype="<u2")
        f.write(memoryview(np.take(table, idx)))
        left -= n


def plan_shards(specs, max_bytes):
    """Groups consecutive tensors into shards of at most max_bytes (one tensor bigger than
    that gets a shard of its own)."""
    shards, cur, cur_bytes = [], [], 0
    for spec in specs:
        nbytes = 2 * int(np.prod(spec[1]))
        if cur and cur_bytes + nbytes > max_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(spec)
        cur_bytes += nbytes
    if cur:
        shards.append(cur)
    return shards


def write_safetensors(path, specs, tables, seed):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _, _ in specs:
        nbytes = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as the safetensors library writes
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape, mean, std in specs:
            # A stream per tensor, keyed by name: the values do not depend on --layers or
            # on the sharding.
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            write_tensor(f, tables[(mean, std)], rng, int(np.prod(shape)))
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama",
                    help="TinyLlama-1.1B's shape (default) or Llama-3-8B's")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the shape's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-bytes", type=float, default=2e9,
                    help="largest safetensors file (default 2e9 bytes)")
    args = ap.parse_args()
    global HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB, MAX_POSITIONS
    HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB, MAX_POSITIONS = SHAPES[args.shape]
    if args.layers is None:
        args.layers = LAYERS
    if args.layers < 1:
        ap.error("--layers must be at least 1")

    t0 = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    config, generation, tokenizer_config = configs(args.layers)
    files = {
        "config.json": config,
        "generation_config.json": generation,
        "tokenizer_config.json": tokenizer_config,
        "tokenizer.json": make_tokenizer(),
    }
    for name, obj in files.items():
        with open(os.path.join(args.out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    specs = tensor_specs(args.layers)
    tables = {key: bf16_quantile_table(*key) for key in {(s[2], s[3]) for s in specs}}
    shards = plan_shards(specs, int(args.max_shard_bytes))
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
    total = 0
    for fname, shard in zip(names, shards):
        nbytes = write_safetensors(os.path.join(args.out_dir, fname), shard, tables, args.seed)
        total += nbytes
        print(f"  {fname}: {len(shard)} tensors, {nbytes / 1e9:.2f} GB ({time.time() - t0:.1f} s)",
              file=sys.stderr)
    if len(shards) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {s[0]: fname for fname, shard in zip(names, shards) for s in shard}}
        with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    params = total // 2
    print(f"wrote {args.out_dir}: {params / 1e9:.3f}B parameters, {total / 1e9:.2f} GB of BF16 "
          f"weights in {len(shards)} file(s), {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
