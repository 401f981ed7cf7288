#!/usr/bin/env python3
"""The items of docs/gpu.md's "not yet run" list that one command can check, run by
`tools/gpu_check.sh run` after its own checks.

Usage: gpu_items.py STRATA_BIN OUT_DIR [DEVICE [ITEM ...]]. DEVICE defaults to cuda:0;
`cpu` runs the same commands where there is no GPU (`tests/run.sh` does, so that this
script cannot rot between the sessions that have a GPU), and then the items that only mean
something on a GPU say so and pass. ITEMs default to all of them, in this order:

  ndsq     (item 13) an NDSQ `.cawsf` of the llama3 fixture: log-probs on DEVICE within
           1e-3 of the CPU's, and streamed (`--memory-budget 0`) equal to resident
  sparse   (item 15) a `--sparse-ffn` flat conversion of the llama3 fixture: `topk=0.6` on
           DEVICE within 1e-3 of the CPU with the same kept fraction, streamed neuron
           groups equal to resident, and `topk=1` identical to `off`
  status   (item 14) a MoE fixture served across the tiers: `/api/strata/status` puts the
           layers `/api/ps` calls resident in `vram` (the CPU: `ram`), its host tier's in
           `pinned`, the rest in `storage`; something was copied to the GPU; `strata top
           --once` shows the same tier counts
  hybrid   (item 12) Qwen3.5-MoE token by token against 500-token chunks: within 1e-5
  refused  (item 5) a server whose first model cannot fit the GPU at its context: that
           model's request gets a 503 naming the sizes, another model's a 200 (GPU only)
  kvtypes  (item 10) `strata bench` of the 1.1B Q4_0 with f32, f16 and q8_0 KV caches at a
           1024-token prompt: reported (GPU only)
  oom      (items 5 and 7) another process (torch, where Python has it) takes nearly all
           the free GPU memory: with it, `--memory-budget 1TiB` on the 1.1B warns with both
           sizes and runs, or is refused at load with the sizes (never a crash); a server
           whose model loaded answers a long prompt with a 503 or a 200 (never a 500), and
           a 200 once the memory is back (GPU only)
  matvec   (item 6) the block-per-row decode kernel (`STRATA_CUDA_MATVEC=wide`) against
           the warp-per-row one: log-probs within 1e-3 on five fixtures in chunks of 8 (the
           matrix-vector path), tests/it/cuda_ops/ and tests/it/batching.rs with it (where their
           binaries are beside STRATA_BIN), and decode of the 1.1B Q4_0 with each,
           interleaved: reported
  staging  (items 6 and 8) the small host-to-device copies staged in page-locked memory
           against `STRATA_CUDA_STAGING=off` (pageable, as before the twentieth session):
           identical log-probs on two fixtures, and decode of the 1.1B Q4_0 resident and
           from the host tier (`--memory-budget 0`) each way, two interleaved rounds, with
           the host's share of time in those copies, the launch overhead and the copy
           engine's busy and stall fractions: reported (GPU only)

and, only when named (not part of the default list; several minutes):

  graphs   decode steps as CUDA graphs (`STRATA_CUDA_GRAPHS=on`, on the `wide` and the
           `packed` kernels) against graphs off: `strata bench` of the 1.1B Q4_0, three
           interleaved rounds; at least 0.9 of the decode steps replayed with graphs on
           (judged); decode tok/s, launches, graphs and replays per token: reported (GPU
           only)
  disk     (items 4 and 15) the CPU streaming from this machine's disk, which held still
           on the GPU machines where the development VMs' disks drift: issue 17's sparse
           FFN speed (the 1.1B converted with `--sparse-ffn`, `tools/bench_sparse_pairs.py`
           at budget 0, a thread per core) and, where gguf-py imports (`tools/gpu_check.sh
           pack` carries it as gpu-run/gguf-py), issue 15's MoE roofline
           (`tools/make_moe_bench_model.py`, then `tools/bench_moe.py --device cpu`):
           reported

`refused`, `kvtypes`, `oom`, `matvec`, `graphs` and `disk` need the 1.1B bench model: made under $BENCH_DIR
(default /tmp) as b11 and b11.q4_0 with tools/make_bench_model.py (numpy) when not there
(about 15 s on the GPU machine). Exits 1 when a judged check fails. Needs no third-party
Python package. On an H200 all items took 70 to 80 s (2026-11-28), after `tools/gpu_check.sh
run`'s own 120 s; a session short of time runs single items.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

STRATA = OUT = DEVICE = ""
GPU = False
IDS = ""


def sh(args, out_path, timeout=120, env=None):
    """Runs `args` with stdout to `out_path` and stderr beside it, `env` added to the
    environment; the exit status."""
    with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
        try:
            return subprocess.run(args, stdout=out, stderr=err, timeout=timeout,
                                  env=dict(os.environ, **(env or {}))).returncode
        except subprocess.TimeoutExpired:
            print(f"     timed out after {timeout} s: {' '.join(args)}")
            return 124


def ppl(model, name, *args, ids=None, env=None):
    """`strata perplexity --json` of `model` on the check's tokens; the JSON, or None."""
    path = os.path.join(OUT, f"items-{name}.json")
    cmd = [STRATA, "perplexity", model, "--tokens-file", ids or IDS, "--json", "--kv-type", "f32", *args]
    if sh(cmd, path, env=env):
        print(f"     failed: {' '.join(cmd)} (see {path}.err)")
        return None
    return json.load(open(path))


def diff(a, b):
    return max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))


def verdict(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return ok


def convert(src, name, *args):
    dest = os.path.join(OUT, name)
    if sh([STRATA, "convert", src, dest, *args], dest + ".log"):
        print(f"     failed: strata convert {src} {dest} {' '.join(args)} (see {dest}.log.err)")
        return None
    return dest


def ndsq():
    model = convert("tests/fixtures/hf/llama3", "items-llama3-ndsq.cawsf", "--format", "cawsf", "--ndsq", "--pq-k", "16")
    if not model:
        return False
    cpu = ppl(model, "ndsq-cpu", "--device", "cpu")
    dev = ppl(model, "ndsq-dev", "--device", DEVICE)
    streamed = ppl(model, "ndsq-streamed", "--device", DEVICE, "--memory-budget", "0")
    if not (cpu and dev and streamed):
        return False
    ok = verdict(diff(dev, cpu) <= 1e-3, f"NDSQ on {DEVICE} against the CPU: max |dlogprob| {diff(dev, cpu):.2e}")
    return verdict(streamed["logprobs"] == dev["logprobs"],
                   f"NDSQ streamed (budget 0) against resident on {DEVICE}: max |dlogprob| {diff(streamed, dev):.2e}") and ok


def sparse():
    model = convert("tests/fixtures/hf/llama3", "items-llama3-sparse.flat", "--sparse-ffn", "--sparse-group", "32")
    if not model:
        return False
    k = ("--sparse-ffn", "topk=0.6")
    cpu = ppl(model, "sparse-cpu", "--device", "cpu", *k)
    dev = ppl(model, "sparse-dev", "--device", DEVICE, *k)
    streamed = ppl(model, "sparse-streamed", "--device", DEVICE, "--memory-budget", "0", "--expert-cache", "0", *k)
    every = ppl(model, "sparse-topk1", "--device", DEVICE, "--sparse-ffn", "topk=1")
    off = ppl(model, "sparse-off", "--device", DEVICE, "--sparse-ffn", "off")
    if not (cpu and dev and streamed and every and off):
        return False
    kept = (cpu["sparse_ffn"]["kept_fraction"], dev["sparse_ffn"]["kept_fraction"])
    ok = verdict(diff(dev, cpu) <= 1e-3 and kept[0] == kept[1],
                 f"sparse FFN topk=0.6 on {DEVICE} against the CPU: max |dlogprob| {diff(dev, cpu):.2e}, "
                 f"kept fraction {kept[1]} (CPU {kept[0]})")
    ok = verdict(streamed["logprobs"] == dev["logprobs"],
                 f"sparse FFN with streamed neuron groups against resident on {DEVICE}: "
                 f"max |dlogprob| {diff(streamed, dev):.2e}") and ok
    return verdict(every["logprobs"] == off["logprobs"],
                   f"sparse FFN topk=1 against off on {DEVICE}: max |dlogprob| {diff(every, off):.2e}") and ok


def ranges(text):
    """`"0-2,5"` → {0, 1, 2, 5}."""
    out = set()
    for part in filter(None, (text or "").split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def get(port, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body and json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def free_port():
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate(port, model, prompt, tokens):
    """A non-streaming `/api/generate` of `tokens` tokens: (status, body)."""
    return get(port, "/api/generate", {"model": model, "prompt": prompt, "stream": False,
                                       "options": {"num_predict": tokens}})


class Server:
    """`strata serve` on a free port with its own $STRATA_HOME, stopped on exit."""

    def __init__(self, name, *args):
        port = free_port()
        self.port, self.log = port, os.path.join(OUT, f"items-{name}-serve.log")
        env = dict(os.environ, STRATA_HOME=os.path.join(OUT, f"items-{name}-home"))
        self.proc = subprocess.Popen([STRATA, "serve", "--port", str(port), *args], env=env,
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def __enter__(self):
        for _ in range(240):
            try:
                if get(self.port, "/health")[0] == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"the server did not come up: see {self.log}")

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def status():
    model = "tests/fixtures/hf/qwen3_moe_mixed"
    try:
        with Server("status", "-m", model, "--device", DEVICE, "--memory-budget", "150K",
                    "--host-budget", "100K") as server:
            port = server.port
            code, body = generate(port, "qwen3_moe_mixed", "hi", 8)
            if code != 200:
                return verdict(False, f"status: generate answered {code}: {body[:300]}")
            st = json.loads(get(port, "/api/strata/status")[1])
            ps = json.loads(get(port, "/api/ps")[1])
            env = dict(os.environ, STRATA_HOME=os.path.join(OUT, "items-status-home"))
            top = subprocess.run([STRATA, "top", "--once", "--port", str(port)], env=env, capture_output=True,
                                 text=True, timeout=30).stdout
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        return verdict(False, f"status: {e}")
    open(os.path.join(OUT, "items-status.json"), "w").write(json.dumps({"status": st, "ps": ps, "top": top}, indent=1))
    m, r = st["models"][0], ps["models"][0]["residency"]
    resident, host = ranges(r["resident_layers"]), ranges((r.get("host_tier") or {}).get("layers"))
    home = "vram" if GPU else "ram"
    want = {l: home if l in resident else "pinned" if l in host else "storage" for l in range(r["layers"])}
    got = {u["layer"]: u["tier"] for u in m["units"] if u["kind"] == "layer"}
    tiers = {t["tier"]: t["units"] for t in m["tiers"]}
    shown = dict(re.findall(r"(vram|pinned|ram|storage) (\d+) \(", top))
    ok = verdict(got == want, f"status: layer tiers {got} (from /api/ps: {want})")
    h2d = m["counters"]["h2d_bytes"]
    ok = verdict(h2d > 0 or not GPU, f"status: {h2d} bytes copied to the GPU") and ok
    ok = verdict(host or not GPU, f"status: host tier layers {sorted(host)}") and ok
    return verdict(shown == {k: str(v) for k, v in tiers.items()},
                   f"status: strata top shows tiers {shown} (the page: {tiers})") and ok


def hybrid():
    ids = os.path.join(OUT, "items-ids-500.json")
    json.dump([(i * 7919 + 13) % 250 + 3 for i in range(500)], open(ids, "w"))
    model = "tests/fixtures/hf/qwen3_5_moe"
    one = ppl(model, "hybrid-chunk1", "--device", DEVICE, "--chunk", "1", ids=ids)
    whole = ppl(model, "hybrid-chunk512", "--device", DEVICE, "--chunk", "512", ids=ids)
    if not (one and whole):
        return False
    d = diff(one, whole)
    return verdict(d <= 1e-5, f"hybrid: Qwen3.5-MoE on {DEVICE}, 500 tokens: token by token against one chunk, "
                   f"max |dlogprob| {d:.2e} (issue 21: within 1e-5; the CPU gives 0)")


def bench_model():
    """The 1.1B Q4_0 flat model (made when missing), or None."""
    base = os.environ.get("BENCH_DIR", "/tmp")
    hf, q4 = os.path.join(base, "b11"), os.path.join(base, "b11.q4_0")
    if not os.path.exists(q4):
        t = time.time()
        if not os.path.exists(os.path.join(hf, "config.json")) and sh(
                [sys.executable, "tools/make_bench_model.py", hf], os.path.join(OUT, "items-make-b11.log"), 300):
            print(f"     failed: tools/make_bench_model.py {hf} (see {OUT}/items-make-b11.log.err)")
            return None
        if sh([STRATA, "convert", hf, q4, "--format", "flat", "--quant", "q4_0"], os.path.join(OUT, "items-b11.log"), 300):
            print(f"     failed: strata convert {hf} {q4} (see {OUT}/items-b11.log.err)")
            return None
        print(f"     made {q4} in {time.time() - t:.0f} s")
    return q4


def refused():
    if not GPU:
        print("     skipped on the CPU: it refuses no model at load for its context")
        return True
    model = bench_model()
    if not model:
        return False
    # 10M tokens of the 1.1B's KV cache are about a TiB; strata-demo's fit.
    try:
        with Server("refused", "--device", DEVICE, "--model", f"big={model}", "--model", "strata-demo",
                    "--ctx-size", "10000000") as server:
            big = generate(server.port, "big", "hi", 4)
            demo = generate(server.port, "strata-demo", "hi", 4)
    except (RuntimeError, OSError) as e:
        return verdict(False, f"refused: {e}")
    ok = verdict(big[0] == 503 and "GiB" in big[1], f"refused: the model that cannot fit got {big[0]}: {big[1][:300]}")
    return verdict(demo[0] == 200, f"refused: strata-demo afterwards got {demo[0]}") and ok


def kvtypes():
    if not GPU:
        print("     skipped on the CPU: docs/benchmarks.md has the CPU's KV-cache figures")
        return True
    model = bench_model()
    if not model:
        return False
    ok = True
    for kv in ("f32", "f16", "q8_0"):
        path = os.path.join(OUT, f"items-kv-{kv}.json")
        if sh([STRATA, "bench", model, "--device", DEVICE, "--json", "--prompt-tokens", "1024", "--gen-tokens", "64",
               "--runs", "2", "--kv-type", kv], path, 300):
            ok = verdict(False, f"kvtypes: bench with --kv-type {kv} (see {path}.err)")
            continue
        r = json.load(open(path))
        print(f"     1.1B Q4_0 on {DEVICE}, KV {kv}: prefill {r['prefill_tok_s']:.0f} tok/s, "
              f"decode {r['decode_tok_s']:.1f} tok/s at a 1024-token prompt (reported)")
    return ok


HOG = """
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
held = torch.empty(max(free - int(sys.argv[1]), 0), dtype=torch.uint8, device="cuda")
print("holding", held.numel(), "of", free, flush=True)
time.sleep(900)
"""


class Hog:
    """A process that holds all but `leave` bytes of the GPU's free memory."""

    def __init__(self, leave):
        self.proc = subprocess.Popen([sys.executable, "-c", HOG, str(leave)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)

    def __enter__(self):
        line = self.proc.stdout.readline()
        if not line.startswith("holding"):
            self.proc.kill()
            raise RuntimeError(f"the memory hog did not start: {line.strip()}")
        print(f"     another process is {line.strip()} bytes")
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def oom():
    if not GPU:
        print("     skipped on the CPU: it needs a GPU whose memory another process can take")
        return True
    if subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                      capture_output=True).returncode:
        print("     skipped: this Python has no torch with CUDA to take the GPU's memory")
        return True
    model = bench_model()
    if not model:
        return False
    ok = True
    # A budget above what is free, on a model larger than what is free (a CUDA context
    # takes a few hundred MiB of the GiB left).
    path = os.path.join(OUT, "items-oom-budget.json")
    try:
        with Hog(1 << 30):
            code = sh([STRATA, "bench", model, "--device", DEVICE, "--json", "--prompt-tokens", "8", "--gen-tokens", "8",
                       "--runs", "1", "--memory-budget", "1TiB"], path, 300)
    except RuntimeError as e:
        return verdict(False, f"oom: {e}")
    err = open(path + ".err").read()
    warned = "--memory-budget" in err and "free on" in err
    refused = "cannot run on" in err and "free" in err
    ok = verdict((code == 0 and warned) or (code == 1 and refused),
                 f"oom: --memory-budget 1TiB with 1 GiB free: exit {code}, "
                 f"{'warned' if warned else 'refused at load' if refused else 'neither warned nor refused'}: "
                 f"{err.strip().splitlines()[-1][:300] if err.strip() else ''}") and ok
    long_prompt = " ".join(["word"] * 3000)
    try:
        with Server("oom", "--device", DEVICE, "--model", f"big={model}", "--ctx-size", "4096") as server:
            warm = generate(server.port, "big", "hi", 4)
            with Hog(48 << 20):
                squeezed = generate(server.port, "big", long_prompt, 4)
            after = generate(server.port, "big", long_prompt, 4)
            health = get(server.port, "/health")
    except (RuntimeError, OSError) as e:
        return verdict(False, f"oom: {e}")
    ok = verdict(warm[0] == 200, f"oom: the model loaded and answered ({warm[0]})") and ok
    ok = verdict(squeezed[0] in (200, 503), f"oom: a 3000-word prompt with 48 MiB of the GPU free got {squeezed[0]} "
                                             f"({'a real out-of-memory' if squeezed[0] == 503 else 'it fit'}): "
                                             f"{squeezed[1][:300]}") and ok
    return verdict(after[0] == 200 and health[0] == 200,
                   f"oom: with the memory back, the same prompt got {after[0]}, /health {health[0]}") and ok


def matvec():
    wide, warp = {"STRATA_CUDA_MATVEC": "wide"}, {"STRATA_CUDA_MATVEC": "warp"}
    ok = True
    for name in ("llama3.gguf", "llama3.f16.gguf", "llama3.q4_0.gguf", "llama3.q8_0.gguf", "llama256.q4_k_m.gguf"):
        model = os.path.join("tests/fixtures/gguf", name)
        a = ppl(model, f"matvec-warp-{name}", "--device", DEVICE, "--chunk", "8", env=warp)
        b = ppl(model, f"matvec-wide-{name}", "--device", DEVICE, "--chunk", "8", env=wide)
        if not (a and b):
            ok = False
            continue
        ok = verdict(diff(a, b) <= 1e-3, f"matvec wide against warp on {DEVICE}, {name}: max |dlogprob| "
                                         f"{diff(a, b):.2e}") and ok
    binary = os.path.join(os.path.dirname(STRATA), "it")  # every integration test (tests/it)
    for test in ("cuda_ops", "batching"):
        if GPU and os.path.exists(binary):
            path = os.path.join(OUT, f"items-matvec-{test}.txt")
            code = sh([binary, f"{test}::", "--nocapture", "--test-threads", "1"], path, 300,
                      env=dict(wide, STRATA_REQUIRE_GPU="1"))
            ok = verdict(code == 0, f"tests/{test}.rs with STRATA_CUDA_MATVEC=wide (see {path})") and ok
    if not GPU:
        print("     speed skipped on the CPU: STRATA_CUDA_MATVEC picks a CUDA kernel")
        return ok
    model = bench_model()
    if not model:
        return False
    decode = {"warp": [], "wide": []}
    for r in range(3):
        for kind in decode:
            path = os.path.join(OUT, f"items-matvec-{kind}-{r}.json")
            if sh([STRATA, "bench", model, "--device", DEVICE, "--json", "--prompt-tokens", "128", "--gen-tokens", "128",
                   "--runs", "2"], path, 300, env={"STRATA_CUDA_MATVEC": kind}):
                ok = verdict(False, f"matvec: bench with STRATA_CUDA_MATVEC={kind} (see {path}.err)")
                continue
            decode[kind].append(json.load(open(path))["decode_tok_s"])
    med = {k: sorted(v)[len(v) // 2] for k, v in decode.items() if v}
    print(f"     1.1B Q4_0 on {DEVICE}, decode tok/s over 3 interleaved rounds: warp {decode['warp']}, "
          f"wide {decode['wide']}; medians {med} (reported)")
    return ok


def staging():
    on, off = {"STRATA_CUDA_STAGING": "on"}, {"STRATA_CUDA_STAGING": "off"}
    ok = True
    for name in ("llama3.gguf", "llama3.q4_0.gguf"):
        model = os.path.join("tests/fixtures/gguf", name)
        a = ppl(model, f"staging-on-{name}", "--device", DEVICE, env=on)
        b = ppl(model, f"staging-off-{name}", "--device", DEVICE, env=off)
        if not (a and b):
            ok = False
            continue
        ok = verdict(diff(a, b) == 0, f"staged small copies against pageable ones on {DEVICE}, {name}: max "
                                      f"|dlogprob| {diff(a, b):.2e} (identical expected)") and ok
    if not GPU:
        print("     speed skipped on the CPU: STRATA_CUDA_STAGING is for CUDA copies")
        return ok
    model = bench_model()
    if not model:
        return False
    rows = {}
    for r in range(2):
        for where, extra in (("resident", []), ("host tier", ["--memory-budget", "0"])):
            for kind, env in (("staged", on), ("pageable", off)):
                path = os.path.join(OUT, f"items-staging-{kind}-{where.replace(' ', '-')}-{r}.json")
                if sh([STRATA, "bench", model, "--device", DEVICE, "--json", "--prompt-tokens", "16", "--gen-tokens",
                       "64", "--runs", "2", *extra], path, 300, env=env):
                    ok = verdict(False, f"staging: bench {where} {kind} (see {path}.err)")
                    continue
                d = json.load(open(path))
                up = d.get("upload") or {}
                rows.setdefault((where, kind), []).append(
                    (d["decode_tok_s"], d.get("host_copy_fraction"), d.get("launch_overhead_fraction"),
                     up.get("copy_busy_fraction"), up.get("copy_stall_fraction"), up.get("decode_fraction_of_roofline")))
    for (where, kind), rs in rows.items():
        print(f"     1.1B Q4_0 {where}, {kind}: (decode tok/s, host in small copies, launch overhead, copy busy, "
              f"copy stall, of the H2D bound) per round {[tuple(round(x, 3) if x is not None else None for x in r) for r in rs]} "
              f"(reported)")
    return ok


def graphs():
    if not GPU:
        print("     skipped on the CPU: STRATA_CUDA_GRAPHS is for CUDA decode steps")
        return True
    model = bench_model()
    if not model:
        return False
    ok, rows = True, {}
    kinds = (("off", {"STRATA_CUDA_GRAPHS": "off"}), ("on", {"STRATA_CUDA_GRAPHS": "on"}),
             ("on, packed", {"STRATA_CUDA_GRAPHS": "on", "STRATA_CUDA_MATVEC": "packed"}))
    for r in range(3):
        for kind, env in kinds:
            path = os.path.join(OUT, f"items-graphs-{kind.replace(', ', '-')}-{r}.json")
            if sh([STRATA, "bench", model, "--device", DEVICE, "--json", "--prompt-tokens", "128", "--gen-tokens", "128",
                   "--runs", "2"], path, 300, env=env):
                ok = verdict(False, f"graphs: bench with graphs {kind} (see {path}.err)")
                continue
            d = json.load(open(path))
            rows.setdefault(kind, []).append(tuple(d.get(k) for k in (
                "decode_tok_s", "launches_per_token", "graphs_per_token", "graph_replays_per_token")))
    for kind, rs in rows.items():
        print(f"     1.1B Q4_0, graphs {kind}: (decode tok/s, launches, graphs, replays per token) per round "
              f"{[tuple(round(x, 3) if x is not None else None for x in r) for r in rs]} (reported)")
        if kind != "off":
            replayed = min(r[3] or 0.0 for r in rs)
            ok = verdict(replayed >= 0.9, f"graphs {kind}: decode steps replayed, the lowest round {replayed:.2f} "
                                          f"per token (0.9 at least)") and ok
    return ok


def disk():
    base = os.environ.get("BENCH_DIR", "/tmp")
    if not bench_model():
        return False
    hf, sparse_model = os.path.join(base, "b11"), os.path.join(base, "b11.sparse")
    ok = True
    if not os.path.exists(sparse_model) and sh(
            [STRATA, "convert", hf, sparse_model, "--format", "flat", "--quant", "q4_0", "--sparse-ffn"],
            os.path.join(OUT, "items-b11-sparse.log"), 300):
        return verdict(False, f"disk: strata convert --sparse-ffn (see {OUT}/items-b11-sparse.log.err)")
    path = os.path.join(OUT, "items-sparse-pairs.json")
    threads = str(os.cpu_count() or 1)
    if sh([sys.executable, "tools/bench_sparse_pairs.py", sparse_model, "--gen", "16", "--pairs", "6", "--threads",
           threads], path, 600, env={"STRATA_BIN": STRATA}):
        ok = verdict(False, f"disk: tools/bench_sparse_pairs.py (see {path}.err)")
    else:
        d = json.load(open(path))
        print(f"     sparse FFN, 1.1B Q4_0 at budget 0 on the CPU ({threads} threads): topk=0.5 against off, pair ratios "
              f"{[round(r, 3) for r in d['ratios']]}, median {d['median_ratio']:.3f} (off {d['median_off']:.2f}, "
              f"topk=0.5 {d['median_sparse']:.2f} tok/s; {d['bytes_per_token_off'] / 2**20:.1f} against "
              f"{d['bytes_per_token_sparse'] / 2**20:.1f} MiB a token); each run against its own reads replayed: "
              f"off {d.get('of_replay_off')}, topk=0.5 {d.get('of_replay_sparse')} (reported)")
    gguf_py = os.path.abspath(os.path.join(os.path.dirname(STRATA), "..", "gguf-py"))
    env = {"PYTHONPATH": os.pathsep.join(p for p in [gguf_py, os.environ.get("PYTHONPATH", "")] if p)}
    if subprocess.run([sys.executable, "-c", "import gguf, numpy"], env=dict(os.environ, **env),
                      capture_output=True).returncode:
        print(f"     MoE: skipped, gguf-py and numpy do not import (looked in {gguf_py})")
        return ok
    moe = os.path.join(base, "moe_bench", "qwen3moe-a3b-shape-4l.gguf")
    if not os.path.exists(moe) and sh([sys.executable, "tools/make_moe_bench_model.py", "--no-validate", "--out", moe],
                                      os.path.join(OUT, "items-moe-make.log"), 600, env=env):
        return verdict(False, f"disk: tools/make_moe_bench_model.py (see {OUT}/items-moe-make.log.err)")
    path = os.path.join(OUT, "items-moe-cpu.txt")
    if sh([sys.executable, "tools/bench_moe.py", moe, "--device", "cpu", "--threads", threads, "--rounds", "3"], path,
          900, env={"STRATA_BIN": STRATA}):
        return verdict(False, f"disk: tools/bench_moe.py --device cpu (see {path}.err)")
    print(f"     MoE on the CPU ({threads} threads) from this disk (reported):")
    print("".join("       " + line for line in open(path)))
    return ok


ITEMS = {"ndsq": ndsq, "sparse": sparse, "status": status, "hybrid": hybrid, "refused": refused, "kvtypes": kvtypes,
         "oom": oom, "matvec": matvec, "staging": staging, "graphs": graphs, "disk": disk}
# Run only when named.
OPT_IN = {"graphs", "disk"}


def main():
    global STRATA, OUT, DEVICE, GPU, IDS
    if len(sys.argv) < 3 or any(a not in ITEMS for a in sys.argv[4:]):
        sys.exit(__doc__)
    STRATA, OUT = sys.argv[1], sys.argv[2]
    DEVICE = sys.argv[3] if len(sys.argv) > 3 else "cuda:0"
    GPU = DEVICE != "cpu"
    os.makedirs(OUT, exist_ok=True)
    IDS = os.path.join(OUT, "items-ids.json")
    json.dump([(i * 7919 + 13) % 250 + 3 for i in range(96)], open(IDS, "w"))
    failed = []
    for name in sys.argv[4:] or [i for i in ITEMS if i not in OPT_IN]:
        t = time.time()
        print(f"-- {name}")
        if not ITEMS[name]():
            failed.append(name)
        print(f"   ({time.time() - t:.0f} s)")
    if failed:
        print("FAILED:", ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
