#!/usr/bin/env python3
"""A long-prompt reference for latent attention: transformers' log-probs over a 4,096-token
prompt on the committed DeepSeek-V3 fixtures (tests/fixtures/hf/deepseek_v3 and
deepseek_v3_noq), far past their YaRN-scaled trained context, so that every position's
attention runs over thousands of cached latents.

Writes tests/fixtures/ref/<name>.long.json: the token ids (Python's pydoc_data.topics,
real English, through the fixture's own tokenizer), and per position the log-prob
transformers gives the next token, its argmax and the gap between its two best logits
(tests/it/latent_cache.rs compares Strata's prefill and its token-by-token decode with
these). transformers runs at F32 with eager attention, the whole prompt in one pass, which
decompresses every key and value per head: the computation Strata's latent-space
attention must equal.

    /work/venv/bin/python tools/make_mla_long_fixture.py [name ...]

Needs torch, transformers (tools/requirements-ref.txt).
"""
import json
import pathlib
import sys

import pydoc_data.topics
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENS = 4096


def text() -> str:
    topics = pydoc_data.topics.topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def main():
    names = sys.argv[1:] or ["deepseek_v3", "deepseek_v3_noq"]
    torch.manual_seed(0)
    for name in names:
        d = ROOT / "tests/fixtures/hf" / name
        tok = AutoTokenizer.from_pretrained(d)
        ids = tok(text(), add_special_tokens=False)["input_ids"][:TOKENS]
        assert len(ids) == TOKENS, len(ids)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        lp = torch.log_softmax(logits, -1)
        target = lp[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
        top2 = logits.topk(2, -1).values
        out = {
            "model": name,
            "generator": "tools/make_mla_long_fixture.py",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "text": "pydoc_data.topics, topics in sorted order joined by blank lines, the first 4096 tokens",
            "ids": ids,
            "target_logprobs": [round(float(x), 7) for x in target],
            "argmax": [int(x) for x in logits.argmax(-1)],
            "top2_gap": [round(float(a - b), 7) for a, b in top2.tolist()],
        }
        path = ROOT / "tests/fixtures/ref" / f"{name}.long.json"
        path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
        print(f"{path}: {len(ids)} tokens, min top-2 gap {min(out['top2_gap']):.2e}")


if __name__ == "__main__":
    main()
