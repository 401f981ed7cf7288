#!/usr/bin/env bash
# What docs/gpu.md lists as not yet run on a GPU, in one script with two halves:
#
#   tools/gpu_check.sh pack      here (Rust toolchain): builds the release binary and the
#                                GPU op test, strips them, and copies them into gpu-run/
#                                (ignored by git; carry it, a few MiB)
#   tools/gpu_check.sh run DIR   on the GPU machine, from the repository root, with DIR
#                                the carried gpu-run/: writes results under $OUT (or
#                                DIR/out) and prints a summary
#
# `run` checks, in order: `strata doctor` and `--compile-kernels` (NVRTC and cuBLAS from
# the machine's Python wheels, found by scanning site-packages; STRATA_CUDA_LIBS adds
# directories); every CUDA op against the CPU op (tests/cuda_ops.rs, with
# STRATA_REQUIRE_GPU=1); `strata perplexity` on every committed fixture on cuda:0 against
# the CPU (F32/F16/BF16 models: log-probabilities within 1e-3; quantized ones: argmax
# agreement >= 0.99); greedy generations equal on F32 fixtures; and `strata serve
# --device cuda:0` answering the OpenAI and Ollama APIs; streaming into VRAM through the
# three tiers (tools/gpu_tiers.py). Timings are not judged here:
# `strata bench` gives them (docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."

pack() {
  cargo build --release --locked
  rm -rf gpu-run && mkdir -p gpu-run/bin
  cp target/release/strata gpu-run/bin/strata
  local name test_bin
  for name in cuda_ops batching grammar; do
    test_bin=$(cargo test --release --locked --test "$name" --no-run --message-format=json 2>/dev/null |
      NAME=$name python3 -c 'import json,os,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m.get("target", {}).get("name") == os.environ["NAME"]: print(m["executable"])' | tail -1)
    cp "$test_bin" "gpu-run/bin/$name"
  done
  strip gpu-run/bin/strata gpu-run/bin/cuda_ops gpu-run/bin/batching gpu-run/bin/grammar
  echo "gpu-run/: $(du -sh gpu-run | cut -f1); carry it (tests/fixtures travel with the tree)"
}

run() {
  local dir=${1:?usage: tools/gpu_check.sh run DIR}
  local bin="$dir/bin/strata" out=${OUT:-$dir/out}
  mkdir -p "$out"
  export STRATA_HOME="$out/home" RUST_BACKTRACE=1
  local failed=()
  echo "== doctor"
  "$bin" doctor --json >"$out/doctor.json" || failed+=(doctor)
  "$bin" doctor --compile-kernels --json >"$out/doctor-compile.json" || failed+=("doctor --compile-kernels")
  echo "== CUDA ops against the CPU ops"
  STRATA_REQUIRE_GPU=1 "$dir/bin/cuda_ops" --nocapture --test-threads 1 >"$out/cuda_ops.txt" 2>&1 || failed+=(cuda_ops)
  grep -E "test result|panicked" "$out/cuda_ops.txt" | tail -5
  echo "== batching: each sequence as alone, engines on cuda:0 (docs/gpu.md item 10)"
  "$dir/bin/batching" --nocapture --test-threads 1 >"$out/batching.txt" 2>&1 || failed+=(batching)
  grep -E "test result|panicked|differs" "$out/batching.txt" | tail -8
  echo "== structured output: constrained generation, engines on cuda:0 (docs/gpu.md item 11)"
  "$dir/bin/grammar" --nocapture --test-threads 1 >"$out/grammar.txt" 2>&1 || failed+=(grammar)
  grep -E "test result|panicked" "$out/grammar.txt" | tail -5

  echo "== perplexity, cuda:0 against cpu"
  local ids="$out/ids.json"
  python3 -c 'import json; print(json.dumps([(i * 7919 + 13) % 250 + 3 for i in range(96)]))' >"$ids"
  for model in tests/fixtures/gguf/*.gguf tests/fixtures/hf/*/; do
    local name
    name=$(basename "$model")
    for dev in cpu cuda:0; do
      "$bin" perplexity "$model" --tokens-file "$ids" --json --kv-type f32 --device "$dev" >"$out/ppl-$name-$dev.json" \
        2>"$out/ppl-$name-$dev.err" || failed+=("perplexity $name $dev")
    done
    python3 - "$out/ppl-$name-cpu.json" "$out/ppl-$name-cuda:0.json" "$name" <<'EOF' || failed+=("parity $name")
import json, sys
cpu, gpu, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
diff = max(abs(a - b) for a, b in zip(cpu["logprobs"], gpu["logprobs"]))
agree = sum(a == b for a, b in zip(cpu["argmax"], gpu["argmax"])) / len(cpu["argmax"])
quantized = any(q in name for q in ("q4", "q5", "q6", "q8"))
ok = agree >= 0.99 if quantized else diff <= 1e-3
print(f"{'ok  ' if ok else 'FAIL'} {name}: max |dlogprob| {diff:.2e}, argmax agreement {agree:.3f}, "
      f"ppl {cpu['ppl']:.4f} vs {gpu['ppl']:.4f}")
sys.exit(0 if ok else 1)
EOF
  done

  echo "== MoE models with streamed experts (budget 0, a device expert cache of 25%), cuda:0 against cpu"
  for model in tests/fixtures/gguf/*moe*.gguf tests/fixtures/gguf/mixtral*.gguf tests/fixtures/hf/*moe*/ tests/fixtures/hf/mixtral/; do
    local name
    name=$(basename "$model")
    "$bin" perplexity "$model" --tokens-file "$ids" --json --kv-type f32 --device cuda:0 --memory-budget 0 --expert-cache 25% \
      >"$out/ppl-$name-cuda-streamed.json" 2>"$out/ppl-$name-cuda-streamed.err" || failed+=("streamed $name")
    python3 - "$out/ppl-$name-cpu.json" "$out/ppl-$name-cuda-streamed.json" "$name" <<'EOF' || failed+=("streamed parity $name")
import json, sys
cpu, gpu, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
diff = max(abs(a - b) for a, b in zip(cpu["logprobs"], gpu["logprobs"]))
agree = sum(a == b for a, b in zip(cpu["argmax"], gpu["argmax"])) / len(cpu["argmax"])
e = gpu["experts"]
hits = sum(l["hits"] for l in e["layers"]); misses = sum(l["misses"] for l in e["layers"])
ok = e["mode"] == "on_demand" and (agree >= 0.99 if "q8" in name else diff <= 1e-3)
print(f"{'ok  ' if ok else 'FAIL'} {name} streamed: max |dlogprob| {diff:.2e}, argmax agreement {agree:.3f}, "
      f"expert hits {hits} misses {misses}")
sys.exit(0 if ok else 1)
EOF
  done

  echo "== streaming into VRAM: VRAM budgets 100/50/25/0%, with and without a host tier, GGUF/flat/.cawsf"
  python3 tools/gpu_tiers.py "$bin" "$out/tiers" || failed+=("streaming into VRAM")

  echo "== greedy generation, cuda:0 against cpu (F32 fixtures)"
  for model in tests/fixtures/gguf/llama3.gguf tests/fixtures/gguf/qwen2.gguf tests/fixtures/hf/llama3/; do
    local a b
    a=$("$bin" run "$model" -p "The capital of" --max-tokens 24 --temperature 0 --device cpu 2>/dev/null || true)
    b=$("$bin" run "$model" -p "The capital of" --max-tokens 24 --temperature 0 --device cuda:0 2>/dev/null || true)
    if [[ -n $a && $a == "$b" ]]; then echo "ok   $model"; else
      echo "FAIL $model: cpu [$a] cuda [$b]"
      failed+=("greedy $model")
    fi
  done

  echo "== serve --device cuda:0"
  "$bin" serve --device cuda:0 --port 8765 >"$out/serve.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do curl -sf localhost:8765/health >/dev/null 2>&1 && break; sleep 0.5; done
  curl -sf localhost:8765/health | tee "$out/health.json" && echo
  curl -sf localhost:8765/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"strata-demo","messages":[{"role":"user","content":"hi"}],"max_tokens":8}' >"$out/chat.json" ||
    failed+=("serve chat")
  curl -sf localhost:8765/api/generate \
    -d '{"model":"strata-demo","prompt":"hi","stream":false,"options":{"num_predict":8}}' >"$out/generate.json" ||
    failed+=("serve generate")
  curl -sf localhost:8765/api/ps | tee "$out/ps.json" && echo
  curl -sf localhost:8765/metrics | grep -E "strata_model_(device|vram)" || true
  kill "$pid" && wait "$pid" || true

  if ((${#failed[@]})); then
    printf 'FAILED: %s\n' "${failed[@]}"
    return 1
  fi
  echo "all GPU checks passed"
}

case ${1:-} in
  pack) pack ;;
  run) shift && run "$@" ;;
  *) sed -n '2,19p' "$0" && exit 2 ;;
esac
