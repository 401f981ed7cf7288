#!/usr/bin/env python3
"""Design study for gate-predicted sparse FFN loading (issue 17), on a real model.

    python3 tools/sparse_ffn_study.py MODEL.gguf TOKENS.json [--tokens N] [--json OUT]

An independent reference forward pass (numpy/torch, weights dequantized by gguf-py) of a
GGUF `llama` model over real text, dense and with each token's SwiGLU neurons cut to
those with the largest |silu(gate . x)| (`topk` F: the top fraction F per token and
layer). For each setting it reports what issue 17 asks of the feature: perplexity
change, top-1 agreement with the dense run, mean |delta log-prob| of the next token,
and mean KL(dense || sparse). It also reports what the storage layout depends on: the
fraction of neuron groups of G neurons that hold at least one kept neuron, per token
(decode) and over a whole 128-token window (a prompt's union), for G from 1 to 256.

These are the reference's figures for the selection rule, not the feature's: the
feature must report its own on the same model and text. TOKENS.json is a list of ids
(`strata tokenize MODEL - --json < text`). Needs numpy, torch and gguf-py.
"""

import argparse
import json
import math
import sys

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize


def load(path):
    r = GGUFReader(path)
    kv = {}
    for f in r.fields.values():
        if f.types and len(f.data) == 1:
            v = f.parts[f.data[0]]
            kv[f.name] = v.tolist()[0] if hasattr(v, "tolist") and v.size == 1 else v
    t = {}
    for tensor in r.tensors:
        a = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        t[tensor.name] = torch.from_numpy(a.reshape(shape).copy())
    return kv, t


def rope(x, pos, theta):
    # GGUF `llama` stores Q/K permuted so that RoPE rotates adjacent pairs.
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * cos[:, None, :] - x1 * sin[:, None, :]
    out[..., 1::2] = x0 * sin[:, None, :] + x1 * cos[:, None, :]
    return out


def forward(kv, t, ids, keep=None, record=None):
    """Logits for `ids`; `keep(a)` returns the mask of neurons kept for activations `a`."""
    n_layer = kv["llama.block_count"]
    n_head, n_kv = kv["llama.attention.head_count"], kv["llama.attention.head_count_kv"]
    eps = kv["llama.attention.layer_norm_rms_epsilon"]
    theta = kv.get("llama.rope.freq_base", 10000.0)
    emb = t["token_embd.weight"]
    x = emb[torch.tensor(ids)]
    n = len(ids)
    pos = torch.arange(n)
    mask = torch.full((n, n), float("-inf")).triu(1)

    def norm(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w

    for l in range(n_layer):
        p = f"blk.{l}."
        h = norm(x, t[p + "attn_norm.weight"])
        q = (h @ t[p + "attn_q.weight"].T).view(n, n_head, -1)
        k = (h @ t[p + "attn_k.weight"].T).view(n, n_kv, -1)
        v = (h @ t[p + "attn_v.weight"].T).view(n, n_kv, -1)
        hd = q.shape[-1]
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        rep = n_head // n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + mask
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v).reshape(n, -1)
        x = x + o @ t[p + "attn_output.weight"].T
        h = norm(x, t[p + "ffn_norm.weight"])
        a = torch.nn.functional.silu(h @ t[p + "ffn_gate.weight"].T)
        u = h @ t[p + "ffn_up.weight"].T
        if keep is not None:
            m = keep(a)
            if record is not None:
                record.append(m)
            a = a * m
        x = x + (a * u) @ t[p + "ffn_down.weight"].T
    x = norm(x, t["output_norm.weight"])
    head = t.get("output.weight", emb)
    return x @ head.T


def topk_keep(frac):
    def keep(a):
        k = max(1, math.ceil(frac * a.shape[-1]))
        idx = a.abs().topk(k, dim=-1).indices
        return torch.zeros_like(a).scatter_(-1, idx, 1.0)

    return keep


def group_fractions(masks, sizes, window, n_layer, sort=False):
    """Per G: the mean fraction of G-neuron groups holding a kept neuron, per token and
    over `window`-token windows (the union a prompt reads). `masks` holds one mask per
    layer and chunk, chunk-major. With `sort`, each layer's neurons are first ordered by
    how often they were kept in the first chunk (most often first), and the later chunks
    are measured: a layout calibrated on one text, judged on the next."""
    if sort:
        calib, masks = masks[:n_layer], masks[n_layer:]
        orders = [(-m.mean(0)).argsort() for m in calib]
        masks = [m[:, orders[i % n_layer]] for i, m in enumerate(masks)]
    out = {}
    for g in sizes:
        tok, win = [], []
        for m in masks:
            n, width = m.shape
            groups = m[:, : width // g * g].reshape(n, -1, g).amax(-1)
            tok.append(groups.mean().item())
            for s in range(0, n - window + 1, window):
                win.append(groups[s : s + window].amax(0).mean().item())
        out[g] = (float(np.mean(tok)), float(np.mean(win)) if win else None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("tokens")
    ap.add_argument("--tokens-used", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    kv, t = load(args.model)
    ids = json.load(open(args.tokens))
    ids = ids["ids"] if isinstance(ids, dict) else ids
    ids = ids[: args.tokens_used]
    chunks = [ids[s : s + args.chunk] for s in range(0, len(ids) - args.chunk + 1, args.chunk)]

    def run(keep, record=None):
        lps, tops = [], []
        for c in chunks:
            logits = forward(kv, t, c, keep, record)
            lp = torch.log_softmax(logits.double(), -1)
            lps.append(lp[:-1])
            tops.append(lp[:-1].argmax(-1))
        return lps, tops, [torch.tensor(c[1:]) for c in chunks]

    dense_lp, dense_top, targets = run(None)
    nll = lambda lps: -torch.cat([lp.gather(1, y[:, None])[:, 0] for lp, y in zip(lps, targets)])
    dense_nll = nll(dense_lp)
    dense_ppl = math.exp(dense_nll.mean().item())
    rows = []
    print(f"dense: perplexity {dense_ppl:.3f} over {len(dense_nll)} predictions")
    n_layer = kv["llama.block_count"]
    sizes = (1, 8, 32, 64, 128, 256)
    print("topk  ppl     dppl%   top1    mean|dlp|  KL       groups needed per token, G=" + "/".join(map(str, sizes))
          + " (stored order | ordered by calibrated frequency)")
    for frac in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        masks = []
        lp, top, _ = run(topk_keep(frac), masks)
        s_nll = nll(lp)
        ppl = math.exp(s_nll.mean().item())
        agree = torch.cat([a == b for a, b in zip(top, dense_top)]).double().mean().item()
        dlp = (s_nll - dense_nll).abs().mean().item()
        kl = torch.cat([(d.exp() * (d - s)).sum(-1) for d, s in zip(dense_lp, lp)]).mean().item()
        groups = group_fractions(masks, sizes, 128, n_layer)
        ordered = group_fractions(masks, sizes, 128, n_layer, sort=len(chunks) > 1)
        rows.append({"topk": frac, "ppl": ppl, "ppl_change": ppl / dense_ppl - 1, "top1": agree,
                     "mean_abs_dlogprob": dlp, "kl": kl,
                     "groups": {str(g): {"per_token": a, "per_128_window": b} for g, (a, b) in groups.items()},
                     "groups_frequency_ordered": {str(g): {"per_token": a, "per_128_window": b}
                                                  for g, (a, b) in ordered.items()}})
        print(f"{frac:.1f}   {ppl:7.3f} {100 * (ppl / dense_ppl - 1):+7.2f}  {agree:.4f}  {dlp:.5f}    {kl:.5f}  "
              + " ".join(f"{groups[g][0]:.2f}" for g in sizes) + " | " + " ".join(f"{ordered[g][0]:.2f}" for g in sizes))
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "predictions": len(dense_nll), "dense_ppl": dense_ppl, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
