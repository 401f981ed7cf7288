#!/usr/bin/env python3
"""Write a random-weight Qwen3-30B-A3B-shaped MoE GGUF (Q4_K experts) to benchmark expert streaming.

    /tmp/refvenv/bin/python tools/make_moe_bench_model.py \\
        [--out /tmp/moe_bench/qwen3moe-a3b-shape-4l.gguf] [--layers 4] [--seed 0] \\
        [--tokenizer-from tests/fixtures/gguf/qwen3_moe.f32.gguf] \\
        [--llama-python /tmp/lcppvenv/bin/python | --no-validate] [--bench-tokens 16]

Needs numpy and gguf-py (the `gguf` package, as in /tmp/refvenv). Validation runs
llama-cpp-python in a subprocess under --llama-python (it lives in another venv).

What it is for
--------------
Strata streams mixture-of-experts weights from NVMe and reads only the experts the router
picks. This file has the real Qwen3-30B-A3B's *per-layer* geometry, so the bytes streamed
per routed expert and the core bytes per layer are exactly the real model's at Q4_K, but only
--layers layers (default 4) and a tiny vocabulary, so it fits a small machine (default file
~1.41 GB; 48 layers would be ~16.9 GB). Its output is noise: it measures speed, not quality.

Shape (Qwen3-30B-A3B facts, checked against llama.cpp's qwen3moe loader
src/models/qwen3moe.cpp and conversion/qwen.py, and a public Megatron recipe for the model):
hidden 2048; 32 query heads and 4 KV heads of head_dim 128 (q 4096 wide, k/v 512 wide);
RMS q/k norms over head_dim; 128 experts, 8 used per token (softmax router,
norm_topk_prob=true, which llama.cpp's qwen3moe graph hard-codes); expert (moe)
intermediate 768; no shared expert; every layer is MoE; rope theta 1e6; rms eps 1e-6;
untied output head. The real model has 48 layers, vocab 151936, dense intermediate_size
6144 and 40960 context; here block_count = --layers, vocab = 507 (see below),
feed_forward_length = 6144 and context_length = 40960 are recorded as metadata.

Tensors (llama.cpp names; shapes are GGUF ne order, fastest-varying first, i.e. the reverse
of numpy/PyTorch order). Per layer N, in this file order:

    blk.N.attn_norm.weight      [2048]             F32  1 + N(0, 0.02)
    blk.N.attn_q.weight         [2048, 4096]       Q4_K
    blk.N.attn_k.weight         [2048, 512]        Q4_K
    blk.N.attn_v.weight         [2048, 512]        Q4_K
    blk.N.attn_output.weight    [4096, 2048]       Q4_K
    blk.N.attn_q_norm.weight    [128]              F32  1 + N(0, 0.02)
    blk.N.attn_k_norm.weight    [128]              F32  1 + N(0, 0.02)
    blk.N.ffn_norm.weight       [2048]             F32  1 + N(0, 0.02)
    blk.N.ffn_gate_inp.weight   [2048, 128]        F32  N(0, 0.02)  (the router)
    blk.N.ffn_gate_exps.weight  [2048, 768, 128]   Q4_K (stacked experts)
    blk.N.ffn_up_exps.weight    [2048, 768, 128]   Q4_K
    blk.N.ffn_down_exps.weight  [768, 2048, 128]   Q4_K

preceded by token_embd.weight [2048, 507] F16 N(0, 0.02) and followed by
output_norm.weight [2048] F32 and output.weight [2048, 507] F16 N(0, 0.02). These match
llama.cpp's create_tensor shapes for LLM_ARCH_QWEN3MOE ({n_embd, n_ff_exp, n_expert} for
gate/up exps, {n_ff_exp, n_embd, n_expert} for down exps) and the converter's stacking
(HF [n_expert, n_ff, n_embd] -> ne {n_embd, n_ff, n_expert}). Expert e of a stacked tensor
is the contiguous slice e of its outermost dimension.

Q4_K data is written raw: gguf-py takes a uint8 array whose last dimension is in bytes
(rows of ne0/256 blocks x 144 bytes) and converts it to the element shape itself. Each
144-byte super-block (256 weights) is fp16 d, fp16 dmin, 12 bytes of packed 6-bit
scales/mins, 128 bytes of 4-bit quants; weight = d*scale*q - dmin*min. Scales, mins and
quants are random bytes; d is drawn per block uniformly in [0.5, 1.5] x D and
dmin = 7.5 d, which makes the weights zero-mean with std ~ 258 D overall; D is chosen so
the std is ~0.02 (all values finite, |w| <= 1.5 x 945 D ~ 0.11). Sanity statistics of one dequantized
slice are printed.

Byte sizes (Q4_K: 144 bytes per 256 weights):
    one expert (gate+up+down)   3 x 768 x 2048 x 144/256 = 2,654,208 B (2.65 MB)
    one layer's experts         128 x that              = 339,738,624 B (340 MB)
    one layer's core            everything else in blk.N (attention Q4_K + norms F32 +
                                router F32)             = 11,682,816 B (11.7 MB)
    routed-experts-only bytes per token = layers x (core + 8 x expert)
                                = 4 x 32,916,480 = 131,665,920 B (132 MB) at 4 layers
                                (the real 48-layer model: 1.58 GB)
The script computes and prints these from the tensors it actually wrote, with the file size.

Tokenizer / vocabulary: every tokenizer.* key (tokenizer.ggml.model "gpt2", pre, tokens,
token_type, merges, eos/padding ids, chat_template) is copied verbatim from
tests/fixtures/gguf/qwen3_moe.f32.gguf, a tiny gpt2-style byte-level BPE of 507 tokens, and
n_vocab is that size. The tiny vocabulary makes token_embd and output (always resident, not
streamed; 2 MB each here vs ~311 MB each at F16 for the real 151936-token vocabulary) far
smaller than the real model's; it does not change the streamed (per-layer, per-expert) bytes.

Other metadata: general.architecture qwen3moe, qwen3moe.{block_count, context_length,
embedding_length, feed_forward_length, expert_feed_forward_length, expert_count,
expert_used_count, attention.head_count, attention.head_count_kv, attention.key_length,
attention.value_length, attention.layer_norm_rms_epsilon, rope.freq_base},
general.file_type MOSTLY_Q4_K_S (all large matrices Q4_K), general.quantization_version 2.

Determinism and writing: the output is a pure function of --layers and --seed (each tensor
has its own numpy stream keyed by seed and crc32(name), so layer N's tensors do not depend
on --layers). Tensors are generated and written one at a time (peak memory ~ one stacked
expert tensor, 113 MB). The file is written as OUT.tmp-PID in the same directory, fsynced,
then renamed onto OUT, so a partial file never has the final name.

Validation (unless --no-validate): in a subprocess, llama-cpp-python loads the file
(Llama(model_path, n_ctx=64, n_threads=2, verbose=False)), evaluates a short prompt and
checks that the logits are finite (proving llama.cpp accepts the metadata, names, shapes
and types), then times greedy decoding of --bench-tokens tokens one at a time (llama.cpp's
default settings otherwise: mmap, its own CPU kernels) and prints tok/s. That figure is
informative only: the file is in the page cache when it runs, and llama.cpp's default CPU
"repack" buffer type copies all Q4_K weights (~1.34 GB) into RAM at load, so it measures an
all-in-memory decode, not streaming; greedy decoding of random weights also soon loops on a
few tokens, reusing the same experts. (llama.cpp reports n_ctx 256: it rounds the context
up.) Measured on the 2-core AMD EPYC dev box: ~290 tok/s at 2 threads. On Intel CPUs with AMX,
llama.cpp's extra buffer types may crash with SIGILL; the validation then fails.
"""

import argparse
import os
import subprocess
import sys
import time
import zlib

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

ARCH = "qwen3moe"
HIDDEN = 2048
HEADS = 32
KV_HEADS = 4
HEAD_DIM = 128
EXPERTS = 128
EXPERTS_USED = 8
MOE_FF = 768
DENSE_FF = 6144          # Qwen3-30B-A3B's intermediate_size (metadata only; no dense FFN)
CONTEXT = 40960          # Qwen3-30B-A3B's max_position_embeddings
ROPE_THETA = 1e6
RMS_EPS = 1e-6
REAL_LAYERS = 48
REAL_VOCAB = 151936
DEFAULT_LAYERS = 4
DEFAULT_OUT = "/tmp/moe_bench/qwen3moe-a3b-shape-4l.gguf"
DEFAULT_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                 "tests", "fixtures", "gguf", "qwen3_moe.f32.gguf")
DEFAULT_LLAMA_PY = "/tmp/lcppvenv/bin/python"

WEIGHT_STD = 0.02
NORM_STD = 0.02
QK_BLOCK, QK_BYTES = gguf.GGML_QUANT_SIZES[QT.Q4_K]   # 256 weights, 144 bytes
# std of (scale*q - 7.5*min) over uniform 6-bit scale/min and 4-bit q, in units of d
Q4K_STD_PER_D = float(np.sqrt(
    (31.5 ** 2 + (64 ** 2 - 1) / 12) * (7.5 ** 2 + (16 ** 2 - 1) / 12) - (31.5 * 7.5) ** 2
    + 7.5 ** 2 * (64 ** 2 - 1) / 12))


def q4k_nbytes(ne):
    """Bytes of a Q4_K tensor with GGUF shape ne (ne[0] a multiple of 256)."""
    assert ne[0] % QK_BLOCK == 0
    return int(np.prod(ne)) // QK_BLOCK * QK_BYTES


def tensor_specs(layers, vocab):
    """(name, ne, kind) in file order. kind: 'q4k', 'f16', 'norm' (F32 ~1), 'f32' (F32 ~0)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    specs = [("token_embd.weight", (HIDDEN, vocab), "f16")]
    for i in range(layers):
        p = f"blk.{i}"
        specs += [
            (f"{p}.attn_norm.weight", (HIDDEN,), "norm"),
            (f"{p}.attn_q.weight", (HIDDEN, q), "q4k"),
            (f"{p}.attn_k.weight", (HIDDEN, kv), "q4k"),
            (f"{p}.attn_v.weight", (HIDDEN, kv), "q4k"),
            (f"{p}.attn_output.weight", (q, HIDDEN), "q4k"),
            (f"{p}.attn_q_norm.weight", (HEAD_DIM,), "norm"),
            (f"{p}.attn_k_norm.weight", (HEAD_DIM,), "norm"),
            (f"{p}.ffn_norm.weight", (HIDDEN,), "norm"),
            (f"{p}.ffn_gate_inp.weight", (HIDDEN, EXPERTS), "f32"),
            (f"{p}.ffn_gate_exps.weight", (HIDDEN, MOE_FF, EXPERTS), "q4k"),
            (f"{p}.ffn_up_exps.weight", (HIDDEN, MOE_FF, EXPERTS), "q4k"),
            (f"{p}.ffn_down_exps.weight", (MOE_FF, HIDDEN, EXPERTS), "q4k"),
        ]
    specs += [
        ("output_norm.weight", (HIDDEN,), "norm"),
        ("output.weight", (HIDDEN, vocab), "f16"),
    ]
    return specs


def spec_nbytes(ne, kind):
    if kind == "q4k":
        return q4k_nbytes(ne)
    return int(np.prod(ne)) * (2 if kind == "f16" else 4)


def spec_info(ne, kind):
    """(numpy shape, numpy dtype, raw_dtype) for GGUFWriter.add_tensor_info."""
    np_shape = tuple(reversed(ne))
    if kind == "q4k":
        # gguf-py wants raw quantized data as uint8 with the last dim in bytes per row.
        return (*np_shape[:-1], np_shape[-1] // QK_BLOCK * QK_BYTES), np.uint8, QT.Q4_K
    if kind == "f16":
        return np_shape, np.float16, None
    return np_shape, np.float32, None


def make_q4k(rng, ne, std=WEIGHT_STD):
    """Random Q4_K blocks (uint8, numpy shape with bytes last) with sane fp16 d/dmin."""
    np_shape, _, _ = spec_info(ne, "q4k")
    nblocks = int(np.prod(ne)) // QK_BLOCK
    raw = np.frombuffer(rng.bytes(nblocks * QK_BYTES), dtype=np.uint8).reshape(nblocks, QK_BYTES).copy()
    base = std / Q4K_STD_PER_D
    d = (base * rng.uniform(0.5, 1.5, size=nblocks)).astype(np.float16)
    dmin = (d.astype(np.float32) * 7.5).astype(np.float16)
    raw[:, 0:2] = d.view(np.uint8).reshape(nblocks, 2)
    raw[:, 2:4] = dmin.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(np_shape)


def make_tensor(name, ne, kind, seed):
    # A stream per tensor, keyed by name: values do not depend on --layers.
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    np_shape = tuple(reversed(ne))
    if kind == "q4k":
        return make_q4k(rng, ne)
    if kind == "f16":
        return rng.normal(0.0, WEIGHT_STD, size=np_shape).astype(np.float16)
    if kind == "norm":
        return (1.0 + rng.normal(0.0, NORM_STD, size=np_shape)).astype(np.float32)
    return rng.normal(0.0, WEIGHT_STD, size=np_shape).astype(np.float32)


def read_tokenizer(path):
    """[(key, value, type, sub_type)] for every tokenizer.* key of a GGUF file, and n_vocab."""
    reader = gguf.GGUFReader(path)
    out = []
    n_vocab = None
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = field.contents()
        out.append((key, val, vtype, sub))
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(val)
    if n_vocab is None:
        sys.exit(f"{path}: no tokenizer.ggml.tokens")
    return out, n_vocab


def fixture_kvs(fixture, arch, keys, general):
    """Every key-value of the GGUF `fixture` but the writer's own, for a bench model of
    `arch`: `{arch}.K` set to `keys[K]` (those the fixture lacks appended, F32 or U32),
    the `general.*` keys the fixture has replaced by `general`'s. Returns the
    `(key, value, type, sub_type)` list and the vocabulary's size."""
    reader = gguf.GGUFReader(fixture)
    keys = dict(keys)
    out, vocab = [], None
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.quantization_version"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = field.contents()
        short = key.removeprefix(arch + ".")
        if short in keys:
            val = keys.pop(short)
        elif key in general:
            val = general[key]
        if key == "tokenizer.ggml.tokens":
            vocab = len(val)
        out.append((key, val, vtype, sub))
    for short, val in keys.items():   # keys the fixture lacks
        vtype = gguf.GGUFValueType.FLOAT32 if isinstance(val, float) else gguf.GGUFValueType.UINT32
        out.append((f"{arch}.{short}", val, vtype, None))
    return out, vocab


def write_gguf(out, arch, metadata, tok_kvs, specs, info, make, progress_suffix):
    """Writes a GGUF of `arch` to `out` as OUT.tmp-PID, fsynced, then renamed (a partial
    file never has the final name): `metadata(writer)` adds the model's key-values, then
    the quantization version and the tokenizer's `tok_kvs` (from `read_tokenizer`); each
    `(name, ne, kind)` of `specs` gets `info(ne, kind)` (numpy shape, dtype, raw type)
    and the array `make(name, ne, kind)`, whose size `info`'s bytes must match. Tensors
    are made and written one at a time; each one named ending in `progress_suffix` is
    reported on stderr."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.tmp-{os.getpid()}"
    w = gguf.GGUFWriter(tmp, arch)
    try:
        metadata(w)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, val, vtype, sub in tok_kvs:
            w.add_key_value(key, val, vtype, sub_type=sub)
        sizes = {}
        for name, ne, kind in specs:
            np_shape, dtype, raw = info(ne, kind)
            sizes[name] = int(np.prod(np_shape)) * np.dtype(dtype).itemsize
            w.add_tensor_info(name, np_shape, np.dtype(dtype), sizes[name], raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        t0 = time.time()
        for name, ne, kind in specs:
            arr = make(name, ne, kind)
            assert arr.nbytes == sizes[name], name
            w.write_tensor_data(arr)
            if name.endswith(progress_suffix):
                print(f"  wrote {name.rsplit('.', 2)[0]} ({time.time() - t0:.1f} s)", file=sys.stderr)
        for f in w.fout:
            f.flush()
            os.fsync(f.fileno())
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_model(out, layers, seed, tokenizer_path):
    tok_kvs, vocab = read_tokenizer(tokenizer_path)
    specs = tensor_specs(layers, vocab)

    def metadata(w):
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(f"Strata MoE bench: Qwen3-30B-A3B shape, {layers} layers, random Q4_K")
        w.add_block_count(layers)
        w.add_context_length(CONTEXT)
        w.add_embedding_length(HIDDEN)
        w.add_feed_forward_length(DENSE_FF)
        w.add_expert_feed_forward_length(MOE_FF)
        w.add_expert_count(EXPERTS)
        w.add_expert_used_count(EXPERTS_USED)
        w.add_head_count(HEADS)
        w.add_head_count_kv(KV_HEADS)
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
        w.add_layer_norm_rms_eps(RMS_EPS)
        w.add_rope_freq_base(ROPE_THETA)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_S)

    write_gguf(out, ARCH, metadata, tok_kvs, specs, spec_info, lambda name, ne, kind: make_tensor(name, ne, kind, seed),
               "ffn_down_exps.weight")
    return specs, vocab


def q4k_sanity(path):
    """Dequantizes a slice of blk.0's first expert's gate and checks it is finite and small."""
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    assert t.tensor_type == QT.Q4_K and list(t.shape) == [HIDDEN, MOE_FF, EXPERTS], (t.tensor_type, t.shape)
    vals = gguf.quants.dequantize(np.asarray(t.data[0, :16]), QT.Q4_K)
    assert np.isfinite(vals).all()
    return float(vals.mean()), float(vals.std()), float(np.abs(vals).max())


VALIDATE_SRC = r"""
import math, sys, time
import numpy as np
import llama_cpp
path, n_bench = sys.argv[1], int(sys.argv[2])
t0 = time.time()
llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_threads=2, verbose=False)
t_load = time.time() - t0
print(f"loaded: n_vocab={llm.n_vocab()} n_ctx={llm.n_ctx()} n_embd={llm.n_embd()} ({t_load:.2f} s)")
toks = llm.tokenize(b"Hello world, this is a test", add_bos=False)[:6]


def last_logits():
    # llama-cpp-python's eval() no longer fills llm.scores unless logits_all; read the
    # last token's logits straight from the context.
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


# llama_decode may return before the graph finishes; reading the logits synchronizes,
# so the timed region includes it.
t0 = time.time()
llm.eval(toks)
logits = last_logits()
t_prompt = time.time() - t0
bad = int((~np.isfinite(logits)).sum())
if bad:
    sys.exit(f"FAIL: {bad} non-finite logits")
if float(logits.std()) == 0.0:
    sys.exit("FAIL: logits are constant")
top = int(logits.argmax())
print(f"prompt of {len(toks)} tokens evaluated in {t_prompt:.2f} s; logits finite "
      f"(min {logits.min():.3f}, max {logits.max():.3f}, std {logits.std():.3f}, argmax {top})")
tok = top
times = []
for _ in range(n_bench):
    t0 = time.time()
    llm.eval([tok])
    row = last_logits()
    times.append(time.time() - t0)
    if not np.isfinite(row).all():
        sys.exit("FAIL: non-finite logits while decoding")
    tok = int(row.argmax())
total = sum(times)
print(f"decode: {n_bench} tokens in {total:.2f} s = {n_bench / total:.2f} tok/s "
      f"(first {times[0] * 1e3:.0f} ms, median {sorted(times)[len(times) // 2] * 1e3:.0f} ms/token)")
print("llama.cpp: OK")
"""


def validate(path, llama_py, n_bench):
    if not os.path.exists(llama_py):
        print(f"validation skipped: {llama_py} not found", file=sys.stderr)
        return False
    r = subprocess.run([llama_py, "-c", VALIDATE_SRC, path, str(n_bench)])
    if r.returncode != 0:
        print(f"llama.cpp validation FAILED (exit {r.returncode})", file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"output GGUF (default {DEFAULT_OUT})")
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                    help=f"MoE layers (default {DEFAULT_LAYERS}; the real model has {REAL_LAYERS})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-from", default=DEFAULT_TOKENIZER,
                    help="GGUF whose tokenizer.* keys are copied (default the qwen3_moe fixture)")
    ap.add_argument("--llama-python", default=DEFAULT_LLAMA_PY,
                    help=f"python with llama_cpp for validation (default {DEFAULT_LLAMA_PY})")
    ap.add_argument("--no-validate", action="store_true", help="skip the llama.cpp load/decode check")
    ap.add_argument("--bench-tokens", type=int, default=16, help="tokens to time llama.cpp decoding")
    args = ap.parse_args()
    if args.layers < 1:
        ap.error("--layers must be at least 1")

    t0 = time.time()
    specs, vocab = write_model(args.out, args.layers, args.seed, args.tokenizer_from)
    size = os.path.getsize(args.out)

    nbytes = {name: spec_nbytes(ne, kind) for name, ne, kind in specs}
    exps = [n for n in nbytes if n.startswith("blk.0.") and "_exps." in n]
    layer_experts = sum(nbytes[n] for n in exps)
    expert = layer_experts // EXPERTS
    core = sum(v for n, v in nbytes.items() if n.startswith("blk.0.") and n not in exps)
    resident = sum(v for n, v in nbytes.items() if not n.startswith("blk."))
    per_token = args.layers * (core + EXPERTS_USED * expert)
    mean, std, amax = q4k_sanity(args.out)

    print(f"wrote {args.out} in {time.time() - t0:.1f} s")
    print(f"  file size:                    {size:,} B ({size / 1e9:.3f} GB)")
    print(f"  layers {args.layers}, vocab {vocab}, {EXPERTS} experts, top-{EXPERTS_USED}, "
          f"expert width {MOE_FF}, hidden {HIDDEN}")
    print(f"  one expert (gate+up+down):    {expert:,} B ({expert / 1e6:.3f} MB)")
    print(f"  one layer's experts:          {layer_experts:,} B ({layer_experts / 1e6:.1f} MB)")
    print(f"  one layer's core (non-expert):{core:,} B ({core / 1e6:.3f} MB)")
    print(f"  embedding+head+final norm:    {resident:,} B ({resident / 1e6:.3f} MB, resident)")
    print(f"  routed-experts-only bytes/token = {args.layers} x ({core:,} + {EXPERTS_USED} x {expert:,})"
          f" = {per_token:,} B ({per_token / 1e6:.1f} MB)")
    real = REAL_LAYERS * (core + EXPERTS_USED * expert)
    print(f"    (real {REAL_LAYERS}-layer model: {real:,} B = {real / 1e9:.2f} GB/token)")
    print(f"  Q4_K sanity (blk.0 expert 0 gate, 16 rows): mean {mean:+.5f} std {std:.5f} max|w| {amax:.4f}")

    if not args.no_validate:
        if not validate(args.out, args.llama_python, args.bench_tokens):
            sys.exit(1)


if __name__ == "__main__":
    main()
