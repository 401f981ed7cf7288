#!/usr/bin/env python3
"""SmolLM2-135M-Instruct (or any GGUF) on real text: llama.cpp's log-probabilities
against Strata's, on the same token ids.

    python3 tools/smollm2_vs_llamacpp.py MODEL.gguf [--tokens 1024] [--strata target/release/strata]

Needs llama-cpp-python (the reference stack, tools/requirements-ref.txt) and numpy. The
text is Python's `pydoc_data.topics`. llama.cpp runs with an F32 KV cache and every
position's logits; Strata runs `strata perplexity --tokens-file` on llama.cpp's own
tokenization of the text (and the script checks `strata tokenize` gives the same ids).
Prints both perplexities, their relative difference, top-1 agreement and the mean and
max |Δ log-probability|.
"""

import argparse
import json
import math
import subprocess
import tempfile

import numpy as np
import pydoc_data.topics
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--strata", default="target/release/strata")
    a = ap.parse_args()

    text = "\n\n".join(list(pydoc_data.topics.topics.values())[:40])[:20000]
    llm = Llama(model_path=a.model, n_ctx=max(2048, a.tokens), logits_all=True, verbose=False,
                type_k=0, type_v=0)
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)[: a.tokens]
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    top = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    ref = [float(logits[i, ids[i + 1]] - lse[i]) for i in range(len(ids) - 1)]
    ref_ppl = math.exp(-sum(ref) / len(ref))

    tok = json.loads(subprocess.run([a.strata, "tokenize", a.model, "-", "--json", "--special"], input=text,
                                    capture_output=True, text=True, check=True).stdout)["ids"]
    print(f"tokenization: {'identical' if tok[: len(ids)] == ids else 'DIFFERENT'} on {len(ids)} tokens")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(ids, f)
        f.flush()
        got = json.loads(subprocess.run([a.strata, "perplexity", a.model, "--tokens-file", f.name, "--json",
                                         "--device", "cpu"], capture_output=True, text=True, check=True).stdout)
    d = [abs(x - y) for x, y in zip(got["logprobs"], ref)]
    agree = sum(int(x) == int(y) for x, y in zip(got["argmax"], logits.argmax(1))) / len(ids)
    print(f"perplexity: strata {got['ppl']:.4f}, llama.cpp {ref_ppl:.4f} ({100 * (got['ppl'] / ref_ppl - 1):+.3f}%)")
    print(f"top-1 agreement {agree:.4f}; |Δ log-prob| mean {sum(d) / len(d):.4f}, max {max(d):.4f}")


if __name__ == "__main__":
    main()
