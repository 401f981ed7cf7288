#!/usr/bin/env python3
"""Streaming into VRAM on a GPU (issue 16's proof), run by `tools/gpu_check.sh run`.

For a GGUF fixture and its flat and `.cawsf` conversions, on cuda:0:
- log-probs of 96 tokens identical (bit for bit, as JSON floats) to the fully resident
  GPU run at VRAM budgets of 100%, 50%, 25% and 0 of the layer weights, each without a
  host tier and with one that holds every streamed layer;
- from `strata bench --json` at the same settings: bytes read from storage and bytes
  copied to the GPU per decoded token within 10% of what the plan predicts (storage:
  the layers in neither tier; H2D: every layer not resident in VRAM), and the streaming
  slots within the ring.

Usage: gpu_tiers.py STRATA_BIN OUT_DIR [DEVICE]. DEVICE defaults to cuda:0; `cpu` runs
the same mechanics where there is no GPU (no host tier, nothing copied). Exits 1 when a
check fails. Needs no third-party Python package.
"""

import json
import os
import subprocess
import sys


def sh(args, out_path):
    with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
        return subprocess.run(args, stdout=out, stderr=err).returncode


def main():
    strata, out = sys.argv[1], sys.argv[2]
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda:0"
    gpu = device != "cpu"
    os.makedirs(out, exist_ok=True)
    ids = os.path.join(out, "tiers-ids.json")
    with open(ids, "w") as f:
        json.dump([(i * 7919 + 13) % 250 + 3 for i in range(96)], f)
    gguf = "tests/fixtures/gguf/llama3.gguf"
    sources = {"gguf": gguf}
    for fmt in ("flat", "cawsf"):
        dest = os.path.join(out, f"llama3-{fmt}" + (".cawsf" if fmt == "cawsf" else ""))
        if sh([strata, "convert", gguf, dest, "--format", fmt], dest + ".log") == 0:
            sources[fmt] = dest
        else:
            print(f"FAIL convert to {fmt}: see {dest}.log.err")
    failed = []
    for fmt, model in sources.items():
        ref_path = os.path.join(out, f"tiers-{fmt}-resident.json")
        if sh([strata, "perplexity", model, "--tokens-file", ids, "--json", "--kv-type", "f32", "--device", device], ref_path):
            failed.append(f"{fmt} resident")
            continue
        ref = json.load(open(ref_path))
        # The layer bytes the budget governs, from a streamed bench run's report.
        probe = os.path.join(out, f"tiers-{fmt}-probe.json")
        bench = [strata, "bench", model, "--json", "--device", device, "--prompt-tokens", "8", "--gen-tokens", "16",
                 "--runs", "2"]
        if sh(bench + ["--memory-budget", "0", "--host-budget", "0"], probe):
            failed.append(f"{fmt} bench probe")
            continue
        streamable = json.load(open(probe))["streamable_bytes"]
        for pct in (100, 50, 25, 0):
            for host in (0, streamable):
                case = f"{fmt} VRAM {pct}% host {'all' if host else 0}"
                budget = ["--memory-budget", str(streamable * pct // 100), "--host-budget", str(host)]
                p = os.path.join(out, f"tiers-{fmt}-{pct}-{host}.json")
                if sh([strata, "perplexity", model, "--tokens-file", ids, "--json", "--kv-type", "f32", "--device", device] + budget, p):
                    failed.append(case)
                    continue
                got = json.load(open(p))
                same = got["logprobs"] == ref["logprobs"]
                b = p.replace(".json", "-bench.json")
                if sh(bench + budget, b):
                    failed.append(case + " bench")
                    continue
                r = json.load(open(b))
                plan, up = r["plan"], r.get("upload")
                per_layer = streamable / max(plan["layers"], 1)
                on_device = plan["resident_bytes"] if plan["mode"] == "streaming" else streamable
                in_host = (plan.get("host_tier") or {}).get("resident_bytes", 0)
                want_read = streamable - on_device - in_host
                want_h2d = streamable - on_device if gpu else 0.0
                read = r["bytes_read_per_token"]
                h2d = up["h2d_bytes_per_token"] if up else 0.0
                near = lambda a, b: abs(a - b) <= 0.1 * max(b, per_layer * 0.05)
                # VRAM for weights: the layers resident there within the budget, the
                # slots within the ring.
                within = plan["resident_bytes"] <= plan["budget_bytes"] or plan["mode"] == "resident"
                ring = within and (up is None or up["slot_bytes_in_use"] <= up["ring_bytes"])
                ok = same and near(read, want_read) and near(h2d, want_h2d) and ring
                print(f"{'ok  ' if ok else 'FAIL'} {case}: log-probs {'identical' if same else 'DIFFER'}, "
                      f"read/token {read:.0f} (plan {want_read:.0f}), H2D/token {h2d:.0f} (plan {want_h2d:.0f}), "
                      f"slots {up['slot_bytes_in_use'] if up else 0} of ring {up['ring_bytes'] if up else 0}, "
                      f"decode {r['decode_tok_s']:.1f} tok/s")
                if not ok:
                    failed.append(case)
    if failed:
        print("FAILED:", "; ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
