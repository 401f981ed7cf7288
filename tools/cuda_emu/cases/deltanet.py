"""Cases of deltanet.cu: the gated DeltaNet convolution and delta rule against a numpy
reference."""

from __future__ import annotations

import math

from harness import Case, cdiv, compare_nmse


def delta_ref(qkvz, ba, conv_w, neg_a, dt_bias, norm_w, state, nk, nv, dk, dv, taps, qg, bg, vt, eps):
    """crates/strata-backend/src/delta.rs's `mix` in float64: (out, new state)."""
    import numpy as np
    r, key_dim, value_dim = nv // nk, nk * dk, nv * dv
    conv_dim, group = 2 * key_dim + value_dim, 2 * dk + 2 * r * dv
    n = qkvz.shape[0]
    hist = state[:(taps - 1) * conv_dim].reshape(taps - 1, conv_dim).astype(np.float64)
    S = state[(taps - 1) * conv_dim:].reshape(nv, dk, dv).astype(np.float64)
    out = np.zeros((n, value_dim))
    silu = lambda x: x / (1 + np.exp(-x))
    for t in range(n):
        row = qkvz[t].astype(np.float64)
        if qg:
            parts = [row[g * group:(g + 1) * group] for g in range(nk)]
            mixed = np.concatenate([p[:dk] for p in parts] + [p[dk:2 * dk] for p in parts]
                                   + [p[2 * dk:2 * dk + r * dv] for p in parts])
            z = np.concatenate([p[2 * dk + r * dv:] for p in parts])
        else:
            mixed, z = row[:conv_dim], row[conv_dim:]
        window = np.vstack([hist, mixed[None, :]])  # taps x conv_dim, oldest first
        conv = silu((window.T * conv_w.astype(np.float64)).sum(axis=1))
        hist = window[1:]
        q, k, v = conv[:key_dim].reshape(nk, dk), conv[key_dim:2 * key_dim].reshape(nk, dk), conv[2 * key_dim:]
        q = q / np.sqrt((q * q).sum(axis=1, keepdims=True) + 1e-6) / math.sqrt(dk)
        k = k / np.sqrt((k * k).sum(axis=1, keepdims=True) + 1e-6)
        bat = ba[t].astype(np.float64)
        for h in range(nv):
            g = h % nk if vt else h // r
            b, a = (bat[g * 2 * r + h % r], bat[g * 2 * r + r + h % r]) if bg else (bat[h], bat[nv + h])
            beta = 1 / (1 + math.exp(-b))
            x = a + dt_bias[h]
            decay = math.exp(neg_a[h] * (x if x > 20 else math.log1p(math.exp(x))))
            S[h] *= decay
            delta = (v[h * dv:(h + 1) * dv] - S[h].T @ k[g]) * beta
            S[h] += np.outer(k[g], delta)
            o = S[h].T @ q[g]
            o = o / math.sqrt((o * o).mean() + eps)
            out[t, h * dv:(h + 1) * dv] = norm_w * o * silu(z[h * dv:(h + 1) * dv])
    return out, np.concatenate([hist.ravel(), S.ravel()])


def cases_deltanet():
    import numpy as np
    cs = []

    def run_case(nk, nv, dk, dv, taps, qg, bg, vt, cuts):
        def run(c, rng):
            key_dim, value_dim = nk * dk, nv * dv
            conv_dim, row_len = 2 * key_dim + value_dim, 2 * key_dim + 2 * value_dim
            n = sum(cuts)
            qkvz = rng.standard_normal((n, row_len)).astype(np.float32)
            ba = rng.standard_normal((n, 2 * nv)).astype(np.float32)
            conv_w = (rng.standard_normal((conv_dim, taps)) * 0.5).astype(np.float32)
            neg_a = -np.exp(rng.standard_normal(nv)).astype(np.float32)
            dt_bias = rng.standard_normal(nv).astype(np.float32)
            norm_w = rng.standard_normal(dv).astype(np.float32)
            state0 = (rng.standard_normal((taps - 1) * conv_dim + nv * dk * dv) * 0.3).astype(np.float32)
            eps = 1e-6
            ref_out, ref_state = delta_ref(qkvz, ba, conv_w, neg_a, dt_bias, norm_w, state0, nk, nv, dk, dv,
                                           taps, qg, bg, vt, eps)
            bcw, bna, bdt, bnw = c.buf(conv_w), c.buf(neg_a), c.buf(dt_bias), c.buf(norm_w)
            # The state's two parts (one buffer on the GPU: the conv inputs, then S).
            split = (taps - 1) * conv_dim
            bconv, bs = c.buf(state0[:split].copy(), True), c.buf(state0[split:].copy(), True)
            outs = []
            at = 0
            for m in cuts:  # the state carries from call to call
                bq, bb = c.buf(qkvz[at:at + m].copy()), c.buf(ba[at:at + m].copy())
                bmix, bo = c.out((m, conv_dim), np.float32), c.out((m, value_dim), np.float32)
                c.launch("delta_conv_f32", (cdiv(conv_dim, 256),), (256,), bq, bcw, bconv, bmix, m, nk, nv, dk,
                         dv, taps, int(qg))
                c.launch("delta_rule_f32", (nv,), (cdiv(dv, 32) * 32,), bmix, bq, bb, bna, bdt, bnw, bs, bo, m,
                         nk, nv, dk, dv, int(qg), int(bg), int(vt), eps)
                outs.append(bo.read())
                at += m
            got = np.concatenate(outs)
            got_state = np.concatenate([bconv.read(), bs.read()])
            return (f'{compare_nmse("out", got, ref_out, 1e-9)}; '
                    f'{compare_nmse("state", got_state, ref_state, 1e-9)}')
        return run
    for nk, nv, dk, dv, taps, qg, bg, vt, cuts in (
            (2, 4, 8, 4, 4, True, True, False, (5,)),
            (2, 4, 24, 20, 4, False, False, False, (3, 1, 4)),
            (2, 6, 16, 40, 4, False, False, True, (1, 1)),
            (1, 2, 128, 128, 4, True, True, False, (2,)),
            (3, 3, 8, 33, 2, False, True, False, (6,))):
        lay = f"{'grouped' if qg else 'whole'}{' tiled' if vt else ''}"
        cs.append(Case(f"delta nk={nk} nv={nv} dk={dk} dv={dv} taps={taps} {lay} cuts={cuts}", "delta_conv_f32",
                       run_case(nk, nv, dk, dv, taps, qg, bg, vt, cuts)))
    return cs
