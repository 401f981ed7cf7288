#!/usr/bin/env python3
"""Strata against llama.cpp on a TinyLlama-shaped GGUF (random weights), same threads,
runs interleaved, medians reported next to the memory bandwidth measured in the same run.

    python3 tools/make_bench_model.py /tmp/bench1b          # HF directory, BF16
    /work/refvenv/bin/python tools/bench_vs_llamacpp.py /tmp/bench1b /tmp/benchgguf \
        [--types q4_0,q8_0,q4_k_m] [--rounds 3] [--threads 2]

Needs the reference stack (tools/requirements-ref.txt) plus `gguf` and `llama-cpp-python`.
Writes <out>/bench-f16.gguf, quantizes it with llama.cpp's own quantizer into
<out>/bench-<type>.gguf, then alternates `strata bench --json` and llama.cpp (prefill of a
128-token prompt, then decode one token at a time) for each type and prints a markdown
table: tok/s of each, their ratio, and decode as a fraction of the bandwidth roofline.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf_fixtures import GLOBAL_NAMES, LAYER_NAMES, permute, vocab  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FTYPES = {"q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q6_k": 18, "q4_k_s": 14}


def safetensors_bf16(hf_dir):
    """Yields (name, float32 array) from every shard, reading BF16 without numpy bf16."""
    index = hf_dir / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    for shard in shards:
        raw = np.memmap(hf_dir / shard, dtype=np.uint8, mode="r")
        n = int(np.frombuffer(raw[:8].tobytes(), dtype="<u8")[0])
        header = json.loads(raw[8 : 8 + n].tobytes())
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            data = raw[8 + n + begin : 8 + n + end]
            if info["dtype"] == "BF16":
                bits = np.frombuffer(data.tobytes(), dtype="<u2").astype(np.uint32) << 16
                arr = bits.view(np.float32)
            elif info["dtype"] == "F32":
                arr = np.frombuffer(data.tobytes(), dtype="<f4")
            else:
                arr = np.frombuffer(data.tobytes(), dtype="<f2").astype(np.float32)
            yield name, arr.reshape(info["shape"])


def to_gguf_f16(hf_dir, path):
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("bench")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_rope_dimension_count(cfg["hidden_size"] // n_head)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tok, tokens, types, merges = vocab(hf_dir, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    for key, add in [("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id)]:
        if tok_cfg.get(key) in ids:
            add(ids[tok_cfg[key]])
    for hf_name, data in safetensors_bf16(hf_dir):
        if hf_name in GLOBAL_NAMES:
            name = GLOBAL_NAMES[hf_name]
        else:
            _, _, layer, rest = hf_name.split(".", 3)
            name = f"blk.{layer}.{LAYER_NAMES[rest]}"
            if rest.startswith("self_attn.q_proj."):
                data = permute(data, n_head, n_head)
            elif rest.startswith("self_attn.k_proj."):
                data = permute(data, n_head, n_kv)
        data = np.ascontiguousarray(data, dtype=np.float32 if data.ndim == 1 else np.float16)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src, dst, ftype, threads):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed for {dst}")


def no_extra_buffer_types():
    """llama.cpp's model defaults with `use_extra_bufts` off. Its AMX buffer type (picked
    for Q4_0/Q8_0 on CPUs that report AMX) dies with SIGILL in VMs whose kernel has not
    enabled AMX tile state; turning extra buffer types off also turns off its repacked
    Q4_0/Q4_K layouts, so on such machines llama.cpp runs its plain CPU kernels."""
    import llama_cpp

    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_cpp.llama_model_default_params = params


def llamacpp_run(path, prompt, gen, threads):
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=len(prompt) + gen + 8, n_batch=len(prompt), n_threads=threads,
                n_threads_batch=threads, verbose=False)
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t)
    t = time.perf_counter()
    # Decode cost does not depend on which token is fed: replay prompt ids.
    for i in range(gen):
        llm.eval([prompt[i % len(prompt)]])
    decode = gen / (time.perf_counter() - t)
    del llm
    return prefill, decode


def strata_run(path, prompt_tokens, gen, threads):
    exe = ROOT / "target/release/strata"
    out = subprocess.run([str(exe), "bench", str(path), "--threads", str(threads), "--prompt-tokens",
                          str(prompt_tokens), "--gen-tokens", str(gen), "--runs", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--types", default="q4_0,q8_0,q4_k_m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--llamacpp-extra-bufts", action="store_true",
                    help="keep llama.cpp's extra buffer types (AMX, repacked layouts)")
    args = ap.parse_args()
    if not args.llamacpp_extra_bufts:
        no_extra_buffer_types()
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / "bench-f16.gguf"
    if not f16.exists():
        to_gguf_f16(args.hf_dir, f16)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(300, 30000, args.prompt_tokens)]
    rows = []
    for name in args.types.split(","):
        path = args.out / f"bench-{name}.gguf"
        if not path.exists():
            quantize(f16, path, FTYPES[name], args.threads)
        lp, ld, sp, sd, bw, roof = [], [], [], [], [], []
        for _ in range(args.rounds):
            p, d = llamacpp_run(path, prompt, args.gen_tokens, args.threads)
            lp.append(p), ld.append(d)
            s = strata_run(path, args.prompt_tokens, args.gen_tokens, args.threads)
            sp.append(s["prefill_tok_s"]), sd.append(s["decode_tok_s"])
            bw.append(s["mem_bandwidth_bytes_s"]), roof.append(s["decode_roofline_tok_s"])
        m = statistics.median
        rows.append((name, m(sp), m(lp), m(sd), m(ld), m(bw) / 1e9, m(roof), path.stat().st_size))
        print(json.dumps({"type": name, "strata_prefill": sp, "llamacpp_prefill": lp, "strata_decode": sd,
                          "llamacpp_decode": ld, "bandwidth": bw}), file=sys.stderr)
    print("| type | file | prefill Strata | prefill llama.cpp | ratio | decode Strata | decode llama.cpp | ratio "
          "| bandwidth | decode roofline | Strata / roofline | llama.cpp / roofline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, sp, lp, sd, ld, bw, roof, size in rows:
        print(f"| {name} | {size / 1e9:.2f} GB | {sp:.1f} | {lp:.1f} | {sp / lp:.2f} | {sd:.2f} | {ld:.2f} | "
              f"{sd / ld:.2f} | {bw:.1f} GB/s | {roof:.1f} | {sd / roof:.2f} | {ld / roof:.2f} |")


if __name__ == "__main__":
    main()
