#!/usr/bin/env bash
# Coverage-guided fuzzing of Strata's file parsers with cargo-fuzz (libFuzzer), issue 5.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]
#
# Runs each target (default: all of gguf gguf_source safetensors cawsf flat_manifest) for
# SECONDS (default 60), one after the other, from fuzz/corpus/<target> (kept between runs)
# plus a seed corpus made fresh from the fixtures in fuzz/work/seeds/<target>:
#
#   gguf, gguf_source  tests/fixtures/gguf/*.gguf: each cut after its header, and a
#                      "tiny" copy (same metadata and tensor names, rows shrunk to one
#                      block) that still loads, where it is at most 64 KiB; from each
#                      quantized mixture-of-experts fixture (*.q8_0.gguf with `*_exps`
#                      tensors) an "experts" copy (one layer, two whole experts, so it
#                      passes the expert checks) and variants one step from it whose
#                      expert count, top-k, expert width or stacked shapes disagree;
#   safetensors        tests/fixtures/hf/*/model*.safetensors: header-only cuts and tiny
#                      copies (every tensor two values);
#   cawsf              `strata convert tests/fixtures/gguf/llama3.q4_0.gguf X.cawsf`;
#   flat_manifest      the manifest.json of `strata convert ... --format flat`; the target
#                      reads the rest of that directory (STRATA_FUZZ_FLAT_MODEL).
#
# cawsf and flat_manifest are skipped, with a message, when the built binary has no
# `convert` command. Every crash, leak, timeout or out-of-memory input libFuzzer writes
# is moved to tests/fixtures/fuzz/<target>/, where tests/it/fuzz_regressions.rs replays it
# on stable. Minimize one (the result lands in fuzz/artifacts/<target>/minimized-from-*)
# and replace the original with it:
#   cargo +nightly fuzz tmin --fuzz-dir fuzz <target> tests/fixtures/fuzz/<target>/<file>
# (flat_manifest also needs STRATA_FUZZ_FLAT_MODEL=fuzz/work/models/flat, which this
# script leaves in place). Exits 1 if any target found something.
#
# Needs the nightly toolchain; installs cargo-fuzz if it is missing. Environment:
# STRATA_BIN (default: target/release/strata, built first), FUZZ_SANITIZER (default
# address; `none` builds faster and runs ~2x faster, fine for safe Rust), FUZZ_ARGS
# (extra libFuzzer flags, e.g. `-seed=1`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

secs=${1:-60}
shift || true
all=(gguf gguf_source safetensors cawsf flat_manifest)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
[[ $secs =~ ^[0-9]+$ ]] || { echo "usage: tools/fuzz.sh [SECONDS] [TARGET...]" >&2; exit 2; }

rustup toolchain list | grep -q '^nightly' || { echo "tools/fuzz.sh needs a nightly toolchain (rustup toolchain install nightly)" >&2; exit 2; }
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# The fuzz workspace resolves the main crate's dependencies at the versions the main
# lock file pins (cargo adds libfuzzer-sys on top).
[[ -f fuzz/Cargo.lock ]] || cp Cargo.lock fuzz/Cargo.lock

work=$root/fuzz/work
seeds=$work/seeds
rm -rf "$seeds" "$work/models"
mkdir -p "$seeds" "$work/models" "$work/logs"
scratch=$(mktemp -d -t strata-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# --- seeds ------------------------------------------------------------------------------
python3 - "$root" "$seeds" <<'PY'
import glob, json, os, struct, sys

root, seeds = sys.argv[1], sys.argv[2]
# GGML type id -> (values per block, bytes per block), for the types Strata reads.
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
         8: (32, 34), 9: (32, 36), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292)}
MAX_SEED = 64 << 10
SCALAR = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}

def put(target, name, data):
    os.makedirs(os.path.join(seeds, target), exist_ok=True)
    with open(os.path.join(seeds, target, name), "wb") as f:
        f.write(data)

def gguf_parts(b):
    """(metadata bytes, alignment, tensor infos, data start) of a well-formed GGUF file."""
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", b, 8)
    def u32():
        nonlocal pos
        pos += 4
        return struct.unpack_from("<I", b, pos - 4)[0]
    def u64():
        nonlocal pos
        pos += 8
        return struct.unpack_from("<Q", b, pos - 8)[0]
    def string():
        nonlocal pos
        n = u64()
        pos += n
        return b[pos - n:pos].decode()
    def value(ty):
        nonlocal pos
        if ty == 8:
            return string()
        if ty == 9:
            elem, n = u32(), u64()
            return [value(elem) for _ in range(n)]
        pos += SCALAR[ty]
        return struct.unpack_from({0: "<B", 1: "<b", 7: "<B", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                                   10: "<Q", 11: "<q", 12: "<d"}[ty], b, pos - SCALAR[ty])[0]
    alignment = 32
    for _ in range(n_kv):
        key = string()
        v = value(u32())
        if key == "general.alignment":
            alignment = v
    meta_end = pos
    infos = []
    for _ in range(n_tensors):
        name = string()
        ne = [u64() for _ in range(u32())]
        infos.append((name, ne, u32(), u64()))
    data_start = -(-pos // alignment) * alignment
    return b[24:meta_end], n_kv, alignment, infos, data_start

def assemble(meta, n_kv, alignment, tensors):
    """A GGUF file from metadata bytes and (name, ne, type, data) tensors."""
    head, data = bytearray(), bytearray()
    for name, ne, ty, raw in tensors:
        head += struct.pack("<Q", len(name.encode())) + name.encode() + struct.pack("<I", len(ne))
        head += b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ty, len(data))
        data += raw
        data += bytes(-len(data) % alignment)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv)) + meta + head
    out += bytes(-len(out) % alignment)
    return bytes(out + data)

def nbytes(ne, ty):
    bs, bb = BLOCK[ty]
    n = 1
    for d in ne:
        n *= d
    return n // bs * bb

def tiny_gguf(b):
    """Same metadata and tensor names; every matrix keeps its rows but has one block per
    row, filled with the original tensor's first bytes."""
    meta, n_kv, alignment, infos, data_start = gguf_parts(b)
    tensors = []
    for name, ne, ty, off in infos:
        if len(ne) > 1:
            ne = [BLOCK[ty][0]] + ne[1:]
        tensors.append((name, ne, ty, b[data_start + off:data_start + off + nbytes(ne, ty)]))
    return assemble(meta, n_kv, alignment, tensors)

def set_u32(meta, key, value):
    """`meta` with the u32 value of `key` replaced (the fixtures store counts as u32)."""
    k = key.encode()
    at = meta.find(struct.pack("<Q", len(k)) + k + struct.pack("<I", 4))
    if at < 0:
        return meta
    at += 12 + len(k)
    return meta[:at] + struct.pack("<I", value) + meta[at + 4:]

def get_u32(meta, key, default):
    k = key.encode()
    at = meta.find(struct.pack("<Q", len(k)) + k + struct.pack("<I", 4))
    return default if at < 0 else struct.unpack_from("<I", meta, at + 12 + len(k))[0]

MOE_EXPERTS = 2

def experts_gguf(b, edit=None):
    """A mixture-of-experts file that still loads, small enough to fuzz: its first layer
    (`{arch}.block_count` 1) with its first MOE_EXPERTS experts (`{arch}.expert_count`,
    the stacked `*_exps` tensors and the router cut to match, every expert whole), no
    `output.weight` (tied embeddings), the other matrices shrunk as in tiny_gguf.
    `edit(arch, meta, tensors)` returns a variant."""
    meta, n_kv, alignment, infos, data_start = gguf_parts(b)
    arch = "llama"
    for cand in ("llama", "qwen2moe", "qwen3moe"):
        if (cand + ".expert_count").encode() in meta:
            arch = cand
    meta = set_u32(meta, arch + ".block_count", 1)
    meta = set_u32(meta, arch + ".expert_count", MOE_EXPERTS)
    used = get_u32(meta, arch + ".expert_used_count", MOE_EXPERTS)
    meta = set_u32(meta, arch + ".expert_used_count", min(used, MOE_EXPERTS))
    tensors = []
    for name, ne, ty, off in infos:
        if name == "output.weight" or (name.startswith("blk.") and not name.startswith("blk.0.")):
            continue
        if "_exps." in name and len(ne) == 3:
            ne = ne[:2] + [MOE_EXPERTS]  # expert-major: the first experts lead
        elif ".ffn_gate_inp." in name and len(ne) == 2:
            ne = [ne[0], MOE_EXPERTS]
        elif len(ne) > 1:
            ne = [BLOCK[ty][0]] + ne[1:]
        tensors.append([name, ne, ty, b[data_start + off:data_start + off + nbytes(ne, ty)]])
    if edit:
        meta, tensors = edit(arch, meta, tensors)
    return assemble(meta, n_kv, alignment, tensors)

def retensor(match, change):
    """An experts_gguf edit: `change(tensor)` on every tensor whose name contains `match`."""
    def edit(arch, meta, tensors):
        for t in tensors:
            if match in t[0]:
                change(t)
        return meta, tensors
    return edit

def remeta(key, value):
    """An experts_gguf edit: `{arch}.<key>` set to `value` (Mixtral's expert width is
    `llama.feed_forward_length`)."""
    def edit(arch, meta, tensors):
        k = "feed_forward_length" if (arch, key) == ("llama", "expert_feed_forward_length") else key
        return set_u32(meta, arch + "." + k, value), tensors
    return edit

# Expert metadata and stacked shapes that disagree, each one step from a file that loads
# (tests/it/moe_bad_files.rs checks the errors these give).
MOE_VARIANTS = {
    "experts": None,
    "experts.count_over": remeta("expert_count", MOE_EXPERTS + 1),
    "experts.count_under": remeta("expert_count", 1),
    "experts.count_zero": remeta("expert_count", 0),
    "experts.used_zero": remeta("expert_used_count", 0),
    "experts.used_over": remeta("expert_used_count", MOE_EXPERTS + 1),
    "experts.width": remeta("expert_feed_forward_length", 3),
    "experts.down_narrow": retensor("blk.0.ffn_down_exps.", lambda t: t[1].__setitem__(0, t[1][0] // 2)),
    "experts.gate_2d": retensor("blk.0.ffn_gate_exps.", lambda t: t.__setitem__(1, [t[1][0], t[1][1] * t[1][2]])),
    "experts.up_huge": retensor("blk.0.ffn_up_exps.", lambda t: t[1].__setitem__(2, 1 << 40)),
}

for path in sorted(glob.glob(os.path.join(root, "tests/fixtures/gguf/*.gguf"))):
    b = open(path, "rb").read()
    stem = os.path.basename(path)[:-5]
    _, _, _, infos, data_start = gguf_parts(b)
    tiny = tiny_gguf(b)
    # The quantized MoE fixtures: expert seeds (the f32 ones would only repeat them).
    moe = stem.endswith(".q8_0") and any("_exps." in i[0] for i in infos)
    for target in ("gguf", "gguf_source"):
        put(target, stem + ".header.gguf", b[:data_start])
        # Larger inputs only slow every execution down (-max_len is the largest seed).
        for name, data in ((stem + ".tiny.gguf", tiny), (stem + ".gguf", b)):
            if len(data) <= MAX_SEED:
                put(target, name, data)
        if moe:
            for variant, edit in MOE_VARIANTS.items():
                data = experts_gguf(b, edit)
                if len(data) <= MAX_SEED:
                    put(target, stem + "." + variant + ".gguf", data)

for path in sorted(glob.glob(os.path.join(root, "tests/fixtures/hf/*/model*.safetensors"))):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b)[0]
    header = json.loads(b[8:8 + n])
    stem = os.path.basename(os.path.dirname(path)) + "." + os.path.basename(path)[:-12]
    put("safetensors", stem + ".header.safetensors", b[:8 + n])
    tiny, data = {}, bytearray()
    for name, e in header.items():
        if name == "__metadata__":
            tiny[name] = e
            continue
        width = {"F32": 4, "F16": 2, "BF16": 2}[e["dtype"]]
        begin = 8 + n + e["data_offsets"][0]
        shape = [1] * (len(e["shape"]) - 1) + [2]
        tiny[name] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [len(data), len(data) + 2 * width]}
        data += b[begin:begin + 2 * width]
    text = json.dumps(tiny, separators=(",", ":")).encode()
    put("safetensors", stem + ".tiny.safetensors", struct.pack("<Q", len(text)) + text + data)
PY

# The seeds of cawsf and flat_manifest must come from the current writer: build it.
if [[ -z ${STRATA_BIN:-} ]]; then
  cargo build --release --bin strata >"$work/logs/strata-build.log" 2>&1 ||
    echo "cargo build --release failed (see $work/logs/strata-build.log); using the existing binary, if any" >&2
fi
bin=${STRATA_BIN:-$root/target/release/strata}
flat_model=
if "$bin" convert --help >/dev/null 2>&1; then
  src=tests/fixtures/gguf/llama3.q4_0.gguf
  if "$bin" convert "$src" "$work/models/m.cawsf" --format cawsf >"$work/logs/convert-cawsf.log" 2>&1; then
    mkdir -p "$seeds/cawsf"
    cp "$work/models/m.cawsf" "$seeds/cawsf/llama3.q4_0.cawsf"
    # and one whose layer matrices are NDSQ shards, for the NDSQ parsers
    "$bin" convert "$src" "$seeds/cawsf/llama3.ndsq.cawsf" --format cawsf --ndsq --rank 4 --pq-k 16 \
      >>"$work/logs/convert-cawsf.log" 2>&1 || echo "strata convert --ndsq failed" >&2
  else
    echo "strata convert --format cawsf failed (see $work/logs/convert-cawsf.log)" >&2
  fi
  if "$bin" convert "$src" "$work/models/flat" --format flat >"$work/logs/convert-flat.log" 2>&1; then
    flat_model=$work/models/flat
    mkdir -p "$seeds/flat_manifest"
    cp "$flat_model/manifest.json" "$seeds/flat_manifest/llama3.q4_0.manifest.json"
  else
    echo "strata convert --format flat failed (see $work/logs/convert-flat.log)" >&2
  fi
fi

# --- runs -------------------------------------------------------------------------------
# One build of every target, then the binaries run directly: `cargo fuzz run` per target
# would rebuild whenever a source file changed in between.
sanitizer=${FUZZ_SANITIZER:-address}
cargo +nightly fuzz build --fuzz-dir fuzz --sanitizer "$sanitizer" >"$work/logs/build.log" 2>&1 ||
  { tail -30 "$work/logs/build.log" >&2; echo "cargo fuzz build failed (see $work/logs/build.log)" >&2; exit 2; }
bins=$root/fuzz/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release
declare -A result
found=0
for t in "${targets[@]}"; do
  if [[ ! -d $seeds/$t ]]; then
    result[$t]="skipped: no seeds (the built strata has no working \`convert\` command to make them)"
    echo "== $t: ${result[$t]}"
    continue
  fi
  corpus=$root/fuzz/corpus/$t
  artifacts=$root/fuzz/artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  # Inputs up to the largest seed (libFuzzer mutates within -max_len).
  max_len=$(find "$seeds/$t" -type f -printf '%s\n' | sort -n | tail -1)
  log=$work/logs/$t.log
  echo "== $t: ${secs}s, max_len $max_len, log $log"
  rc=0
  STRATA_FUZZ_TMP=$scratch STRATA_FUZZ_FLAT_MODEL=$flat_model "$bins/$t" "$corpus" "$seeds/$t" \
    -max_total_time="$secs" -rss_limit_mb=4096 -timeout=10 -max_len="$max_len" \
    -artifact_prefix="$artifacts/" -print_final_stats=1 ${FUZZ_ARGS:-} >"$log" 2>&1 || rc=$?
  runs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [^ ]+' || true)
  stats="runs ${runs:-?}, ${last:-no coverage line}"
  shopt -s nullglob
  finds=("$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*)
  shopt -u nullglob
  if [[ ${#finds[@]} -gt 0 ]]; then
    found=1
    mkdir -p "tests/fixtures/fuzz/$t"
    names=
    for f in "${finds[@]}"; do
      mv "$f" "tests/fixtures/fuzz/$t/"
      names+=" ${f##*/}"
    done
    result[$t]="FOUND${names} (moved to tests/fixtures/fuzz/$t/; see $log) | $stats"
  elif [[ $rc -ne 0 ]]; then
    found=1
    result[$t]="FAILED (exit $rc, no artifact; see $log)"
    tail -20 "$log" >&2
  else
    result[$t]="ok | $stats"
  fi
  echo "   ${result[$t]}"
done

echo
echo "== summary (${secs}s per target)"
for t in "${targets[@]}"; do
  printf '%-14s %s\n' "$t" "${result[$t]}"
done
exit $found
