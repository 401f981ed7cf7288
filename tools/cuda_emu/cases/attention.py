"""Cases of attention.cu: split attention and its combine (softcaps, sinks, windows,
grouped kernels), the KV stores and the fused RoPE + KV store, with their numpy references."""

from __future__ import annotations

import math

from harness import Case, CaseFail, Ctx, compare_exact, compare_nmse


def attn_ref_heads(q, k, v, start_pos, nh, nkv, hd, window):
    """(row, head, pos, first visible key, the head's query, its KV head's keys and values
    [cap, hd]) for every query row and head, in float64."""
    import numpy as np
    rows = q.shape[0]
    qd = q.astype(np.float64).reshape(rows, nh, hd)
    kd = k.astype(np.float64).reshape(-1, nkv, hd)
    vd = v.astype(np.float64).reshape(-1, nkv, hd)
    grp = nh // nkv
    for r in range(rows):
        pos = start_pos + r
        first = max(0, pos + 1 - window) if window > 0 else 0
        for h in range(nh):
            yield r, h, pos, first, qd[r, h], kd[:, h // grp], vd[:, h // grp]


def attn_ref_partial(q, k, v, start_pos, nh, nkv, hd, scale, window, split_len, splits, softcap=0.0):
    import numpy as np
    part = np.zeros((q.shape[0], nh, splits, hd + 2))
    for r, h, pos, first, qh, kh, vh in attn_ref_heads(q, k, v, start_pos, nh, nkv, hd, window):
        for s in range(splits):
            lo, hi = max(first, s * split_len), min(pos + 1, (s + 1) * split_len)
            if lo >= hi:
                part[r, h, s, hd] = -np.inf
                continue
            sc = np.float32(scale) * (kh[lo:hi] @ qh)
            if softcap != 0:
                cap = float(np.float32(softcap))
                sc = cap * np.tanh(sc / cap)
            m = sc.max()
            e = np.exp(sc - m)
            part[r, h, s, :hd] = e @ vh[lo:hi]
            part[r, h, s, hd] = m
            part[r, h, s, hd + 1] = e.sum()
    return part


def attn_ref_combine(part, hd, sinks=None):
    """The merged attention of partials [rows, heads, splits, hd + 2]; with `sinks` (one
    logit per head) each head's sink joins the denominator: e^(sink - M), M the max of
    the sink and the scores."""
    import numpy as np
    m = part[..., hd]
    M = m.max(axis=-1, keepdims=True)
    if sinks is not None:
        sk = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None], M.shape)
        M = np.maximum(M, sk)
    w = np.where(np.isfinite(m), np.exp(np.where(np.isfinite(m), m - M, 0)), 0.0)
    num = (w[..., None] * part[..., :hd]).sum(axis=-2)
    den = (w * part[..., hd + 1]).sum(axis=-1)
    if sinks is not None:
        den = den + np.where(np.isfinite(sk[..., 0]), np.exp(np.where(np.isfinite(sk[..., 0]), sk[..., 0] - M[..., 0], 0)), 0)
    return num / den[..., None]


def attn_ref_sinks(q, k, v, start_pos, nh, nkv, hd, scale, window, sinks):
    """Attention with sinks written out (no splits): softmax over [scores, sink], the
    sink's weight dropped. An independent check of attn_ref_combine's sink term."""
    import numpy as np
    rows = q.shape[0]
    out = np.zeros((rows, nh, hd))
    for r, h, pos, first, qh, kh, vh in attn_ref_heads(q, k, v, start_pos, nh, nkv, hd, window):
        sc = np.float32(scale) * (kh[first:pos + 1] @ qh)
        allsc = np.append(sc, float(sinks[h]))
        e = np.exp(allsc - allsc.max())
        out[r, h] = (e[:-1] / e.sum()) @ vh[first:pos + 1]
    return out.reshape(rows, nh * hd)


def kv_encode(kv, x):
    """Rows of x (float32, [rows, width]) as the CPU stores them (crates/strata-backend/src/cpu/kv.rs), in a
    float32 buffer [rows, row_len]: f16 two per float; q8_0 per 32 values the scale
    max|x|/127 then 32 signed bytes round(x/d) (halves away from zero) clamped to ±127."""
    import numpy as np
    rows, width = x.shape
    if kv == "f32":
        return x.copy()
    if kv == "f16":
        h = np.zeros((rows, 2 * ((width + 1) // 2)), np.float16)
        h[:, :width] = x.astype(np.float16)
        return h.view(np.float32)
    nb = (width + 31) // 32
    out = np.zeros((rows, nb, 9), np.float32)
    for b in range(nb):
        blk = x[:, 32 * b:32 * b + 32]
        d = (np.abs(blk).max(axis=1) / np.float32(127)).astype(np.float32)
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
        y = (blk * inv[:, None]).astype(np.float32).astype(np.float64)  # exact: |y| + 0.5 cannot round
        q = np.clip(np.sign(y) * np.floor(np.abs(y) + 0.5), -127, 127).astype(np.int8)
        qs = np.zeros((rows, 32), np.int8)
        qs[:, :blk.shape[1]] = q
        out[:, b, 0] = d
        out[:, b, 1:] = qs.view(np.float32)
    return out.reshape(rows, nb * 9)


def kv_decode(kv, buf, width):
    """The values a cache of kv_encode's layout holds, as float64 [rows, width]."""
    import numpy as np
    rows = buf.shape[0]
    if kv == "f32":
        return buf.astype(np.float64)
    if kv == "f16":
        return buf.view(np.float16)[:, :width].astype(np.float64)
    blocks = buf.reshape(rows, -1, 9)
    d = blocks[:, :, 0].astype(np.float32)
    q = blocks[:, :, 1:].copy().view(np.int8).astype(np.float32)
    return (d[:, :, None] * q).astype(np.float32).reshape(rows, -1)[:, :width].astype(np.float64)


def cases_kv_store():
    import numpy as np
    cs = []

    def store(kv, src_rows, n_rows, width, listed):
        def run(c: Ctx, rng):
            src = (rng.standard_normal((src_rows, width)) * rng.uniform(0.01, 100)).astype(np.float32)
            src[0, :min(width, 40)] = 0.0  # an all-zero block: d = 0
            if width > 3:
                src[-1, 1] = 0.5 * float(np.abs(src[-1, :32]).max()) / 127 * 3  # a value on a rounding tie
            rows = (rng.permutation(src_rows)[:n_rows] if listed else np.arange(n_rows)).astype(np.uint32)
            want = kv_encode(kv, src[rows])
            bs, bd = c.buf(src), c.out(want.shape, np.float32)
            bi = c.buf(rows) if listed else None
            blocks = (width + 31) // 32
            grid = (n_rows, (width + 255) // 256) if kv == "f16" else (n_rows, (blocks + 7) // 8)
            c.launch(f"kv_store_{kv}", grid, (256,), bs, bi, bd, width, n_rows)
            got = bd.read()
            if kv == "f16" and width % 2:
                got, want = got.view(np.uint16)[:, :width], want.view(np.uint16)[:, :width]  # padding untouched
            return compare_exact("dst", got.view(np.uint32) if got.dtype == np.float32 else got,
                                 want.view(np.uint32) if want.dtype == np.float32 else want)
        return run
    for kv in ("f16", "q8_0"):
        for src_rows, n_rows, width, listed in ((3, 3, 64, False), (5, 3, 77, True), (2, 2, 1, False),
                                                (4, 4, 300, True), (9, 6, 1024, False), (3, 2, 33, True)):
            cs.append(Case(f"kv_store_{kv} src_rows={src_rows} n_rows={n_rows} width={width} "
                           f"rows={'list' if listed else 'null'}", f"kv_store_{kv}",
                           store(kv, src_rows, n_rows, width, listed)))
    return cs


def cases_rope_store():
    """rope_store_KV against numpy's rotation (q) and, bit for bit, against the work it
    fuses: rope_f32 of q and of k (rope.cu), then kv_store_KV of k and of v."""
    import numpy as np
    cs = []

    def run_case(kv, rows, nh, nkv, hd, inter, factor, pos0, pairs=None):
        def run(c: Ctx, rng):
            n_arg = hd // 2 if pairs is None else pairs
            npr = min(n_arg, hd // 2)
            width = nkv * hd
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
            v = rng.standard_normal((rows, width)).astype(np.float32)
            inv = (10000.0 ** (-np.arange(n_arg, dtype=np.float64) * 2 / (2 * npr))).astype(np.float32)
            row_len = kv_encode(kv, np.zeros((1, width), np.float32)).shape[1]
            bq, bk, bv, bi = c.buf(q, True), c.buf(k), c.buf(v), c.buf(inv)
            bkc, bvc = c.out((rows, row_len), np.float32), c.out((rows, row_len), np.float32)
            c.launch(f"rope_store_{kv}", (rows, nh + 2 * nkv), (128,), bq, bk, bv, bkc, bvc, pos0, nh, nkv, hd,
                     n_arg, bi, np.float32(factor), inter)
            # The unfused kernels on copies: rope_f32 of q and k, then the stores.
            pos = (pos0 + np.arange(rows)).astype(np.uint32)
            uq, uk, bp = c.buf(q.copy(), True), c.buf(k.copy(), True), c.buf(pos)
            c.launch("rope_f32", (rows, nh), (n_arg,), uq, bp, bi, nh, hd, n_arg, np.float32(factor), inter)
            c.launch("rope_f32", (rows, nkv), (n_arg,), uk, bp, bi, nkv, hd, n_arg, np.float32(factor), inter)
            ukc, uvc = c.out((rows, row_len), np.float32), c.out((rows, row_len), np.float32)
            if kv == "f32":
                want_k, want_v = uk.read(), v
            else:
                blocks = (width + 31) // 32
                grid = (rows, (width + 255) // 256) if kv == "f16" else (rows, (blocks + 7) // 8)
                c.launch(f"kv_store_{kv}", grid, (256,), uk, None, ukc, width, rows)
                c.launch(f"kv_store_{kv}", grid, (256,), bv, None, uvc, width, rows)
                want_k, want_v = ukc.read(), uvc.read()
            bits = lambda a: np.ascontiguousarray(a, np.float32).view(np.uint32)
            compare_exact("q", bits(bq.read()), bits(uq.read()))
            compare_exact("k_cache", bits(bkc.read()), bits(want_k))
            compare_exact("v_cache", bits(bvc.read()), bits(want_v))
            ang = (pos[:, None].astype(np.float32) * inv[None, :npr]).astype(np.float64)
            cs_, sn = np.cos(ang) * factor, np.sin(ang) * factor
            xr = q.astype(np.float64).reshape(rows, nh, hd)
            ia, ib = (np.arange(npr) * 2, np.arange(npr) * 2 + 1) if inter else (np.arange(npr), np.arange(npr) + npr)
            a, b = xr[..., ia], xr[..., ib]
            ref = xr.copy()
            ref[..., ia], ref[..., ib] = a * cs_[:, None, :] - b * sn[:, None, :], a * sn[:, None, :] + b * cs_[:, None, :]
            return compare_nmse("q", bq.read(), ref.reshape(rows, nh * hd), 1e-7)
        return run
    for kv in ("f32", "f16", "q8_0"):
        for rows, nh, nkv, hd, inter, factor, pos0, pairs in (
                (1, 4, 2, 64, 0, 1.0, 37, None), (3, 8, 2, 128, 1, 1.0, 4000, None), (2, 3, 1, 96, 0, 0.8, 9000, None),
                (2, 4, 4, 128, 0, 1.0, 100, 16), (1, 2, 1, 256, 1, 1.0, 5, None), (1, 1, 1, 512, 0, 1.0, 3, None)):
            what = f" n_pairs={pairs}" if pairs else ""
            cs.append(Case(f"rope_store_{kv} rows={rows} n_heads={nh} n_kv_heads={nkv} head_dim={hd}{what} "
                           f"{'interleaved' if inter else 'neox'} attn_factor={factor} pos0={pos0}",
                           f"rope_store_{kv}", run_case(kv, rows, nh, nkv, hd, inter, factor, pos0, pairs)))
    return cs


def cases_attention():
    import numpy as np
    cs = []

    def compare_part(got, ref, hd):
        empty = ~np.isfinite(ref[..., hd])
        if empty.any():
            ge = got[empty]
            ok = (ge[:, hd] == -np.inf) & (ge[:, hd + 1] == 0) & np.all(ge[:, :hd] == 0, axis=1)
            if not ok.all():
                idx = np.argwhere(empty)[~ok][:4]
                bad = "; ".join(f"[r={a},h={b},s={s_}] m={got[a, b, s_, hd]!r} l={got[a, b, s_, hd + 1]!r} "
                                f"acc[0]={got[a, b, s_, 0]!r}" for a, b, s_ in idx)
                raise CaseFail(f"part: empty slices must be m=-inf, l=0, acc=0; bad [row, head, split]: {bad}")
        if empty.all():
            return "all slices empty"
        # indices below are [row, head, split, dim]; empty slices (checked above) count as 0
        z = lambda a: np.where(empty[..., None], 0.0, a)
        s1 = compare_nmse("part.acc", z(got[..., :hd]), z(ref[..., :hd]), 5e-4)
        z1 = lambda a: np.where(empty, 0.0, a)
        s2 = compare_nmse("part.m", z1(got[..., hd]), z1(ref[..., hd]), 5e-4)
        s3 = compare_nmse("part.l", z1(got[..., hd + 1]), z1(ref[..., hd + 1]), 5e-4)
        return f"{s1} m_{s2.split(' ')[1]} l_{s3.split(' ')[1]} ({int(empty.sum())} empty slices)"

    def attn(rows, start, nh, nkv, hd, window, split_len, splits, softcap, mode, kv="f32"):
        def run(c, rng):
            cap = start + rows
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            v = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            # The caches as stored; the reference attends over the values they hold.
            k, v = kv_encode(kv, k), kv_encode(kv, v)
            kd, vd = kv_decode(kv, k, nkv * hd), kv_decode(kv, v, nkv * hd)
            scale = 1.0 / math.sqrt(hd)
            ref = attn_ref_partial(q, kd, vd, start, nh, nkv, hd, scale, window, split_len, splits, softcap)
            if mode == "combine":
                bp, bo = c.buf(ref.astype(np.float32)), c.out((rows, nh * hd), np.float32)
                c.launch("attn_combine_f32", (rows * nh,), (hd,), bp, bo, splits, hd)
                want = attn_ref_combine(ref.astype(np.float32).astype(np.float64), hd).reshape(rows, nh * hd)
                return compare_nmse("out", bo.read(), want, 5e-4)
            bq, bk, bv = c.buf(q), c.buf(k), c.buf(v)
            bp = c.out((rows, nh, splits, hd + 2), np.float32)
            c.launch(f"attn_partial_{kv}", (rows * nh, splits), (128,), bq, bk, bv, bp, start, nh, nkv, hd,
                     np.float32(scale), np.float32(softcap), window, split_len)
            got = bp.read()
            s = compare_part(got.astype(np.float64), ref, hd)
            if mode == "partial":
                return s
            bo = c.out((rows, nh * hd), np.float32)
            c.launch("attn_combine_f32", (rows * nh,), (hd,), bp, bo, splits, hd)
            want = attn_ref_combine(ref, hd).reshape(rows, nh * hd)
            return compare_nmse("out", bo.read(), want, 5e-4) + " (partial+combine)"
        return run

    shapes = [
        # rows, start_pos, n_heads, n_kv_heads, head_dim, window, split_len, splits[, softcap]
        (1, 37, 4, 2, 64, 0, 38, 1),      # decode, one split
        (1, 37, 4, 2, 64, 0, 16, 3),      # decode, split_len not dividing 38
        (5, 0, 4, 2, 128, 0, 3, 2),       # prefill from 0, empty slices for early rows
        (7, 20, 4, 2, 64, 8, 7, 4),       # prefill at start_pos > 0 with a sliding window
        (2, 100, 4, 4, 128, 50, 23, 5),   # MHA, window, 5 splits
        (8, 3, 4, 1, 64, 0, 5, 3),        # MQA, 8 rows
        (3, 9, 4, 2, 64, 0, 5, 8),        # more splits than needed: trailing empty slices
        (1, 300, 4, 2, 128, 0, 64, 5),    # longer decode
        (2, 10, 2, 1, 256, 4, 6, 2),      # head_dim 256, window
        (3, 2, 4, 2, 64, 16, 4, 2),       # window wider than the context
        (1, 700, 4, 2, 128, 0, 256, 3),   # launch.rs-style split (multiple of 64, >= 256 keys)
        (2, 500, 4, 2, 64, 0, 192, 3),    # prefill with a launch.rs-style split
        # softcapped scores (Gemma 2): caps small enough to reshape a N(0, 1) score
        (1, 37, 4, 2, 64, 0, 16, 3, 1.0),      # decode, split
        (5, 0, 4, 2, 128, 0, 3, 2, 0.5),       # prefill from 0, empty slices
        (7, 20, 4, 2, 64, 8, 7, 4, 2.0),       # sliding window
        (2, 10, 2, 1, 256, 0, 6, 2, 50.0),     # head_dim 256, Gemma 2's attention cap
        (3, 9, 4, 2, 64, 0, 5, 2, -1.5),       # a negative cap equals its absolute value
    ]
    # partial -> combine end to end (the kernels' own partials) on a few of them
    e2e = {1, 2, 6, 10, 12, 14}
    def described(shp):
        """A shape's launch arguments (softcap 0 when not given) and its case description."""
        rows, start, nh, nkv, hd, window, sl, sp = shp[:8]
        softcap = shp[8] if len(shp) > 8 else 0.0
        desc = (f"rows={rows} start_pos={start} n_heads={nh} n_kv={nkv} head_dim={hd} window={window} "
                f"split_len={sl} splits={sp}" + (f" softcap={softcap}" if softcap else ""))
        return (rows, start, nh, nkv, hd, window, sl, sp, softcap), desc

    for si, shp in enumerate(shapes):
        args, desc = described(shp)
        cs.append(Case(f"attn_partial_f32 {desc}", "attn_partial_f32", attn(*args, "partial")))
        cs.append(Case(f"attn_combine_f32 {desc}", "attn_combine_f32", attn(*args, "combine")))
        if si in e2e:
            cs.append(Case(f"attn_partial+combine {desc}", "attn_partial_f32", attn(*args, "both")))
    # Caches stored as f16 and q8_0 (head_dim 80 and 96: heads that straddle q8_0 blocks;
    # 40 with one KV head and 27 with three: rows that end in a partial block, odd rows).
    kv_shapes = shapes[:3] + [shapes[6], shapes[8], (2, 40, 4, 2, 80, 0, 16, 3), (3, 9, 6, 3, 96, 8, 5, 2, 1.0),
                              (2, 30, 2, 1, 40, 0, 16, 2), (1, 12, 3, 3, 27, 0, 13, 1)]
    for kv in ("f16", "q8_0"):
        for shp in kv_shapes:
            args, desc = described(shp)
            cs.append(Case(f"attn_partial_{kv} {desc}", f"attn_partial_{kv}", attn(*args, "partial", kv)))

    def attn_sinks(rows, start, nh, nkv, hd, window, split_len, splits, mode):
        """attn_combine_sinks_f32 over reference partials (`combine`) or after
        attn_partial_f32 (`both`), against the written-out softmax with sinks."""
        def run(c, rng):
            cap = start + rows
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            v = rng.standard_normal((cap, nkv * hd)).astype(np.float32)
            # Sinks near the scores, one far above them (most of the weight: small outputs)
            # and one at -inf (no sink).
            sinks = (rng.standard_normal(nh) * 2).astype(np.float32)
            sinks[0] = 6.0
            if nh > 2:
                sinks[-1] = -np.inf
            scale = 1.0 / math.sqrt(hd)
            ref = attn_ref_partial(q, k, v, start, nh, nkv, hd, scale, window, split_len, splits)
            written = attn_ref_sinks(q, k, v, start, nh, nkv, hd, scale, window, sinks)
            want = attn_ref_combine(ref, hd, sinks).reshape(rows, nh * hd)
            if not np.allclose(want, written, rtol=1e-9, atol=1e-12):
                raise CaseFail("harness: the split reference with sinks differs from the written-out one")
            bs, bo = c.buf(sinks), c.out((rows, nh * hd), np.float32)
            if mode == "combine":
                bp = c.buf(ref.astype(np.float32))
                want = attn_ref_combine(ref.astype(np.float32).astype(np.float64), hd, sinks).reshape(rows, nh * hd)
            else:
                bq, bk, bv = c.buf(q), c.buf(k), c.buf(v)
                bp = c.out((rows, nh, splits, hd + 2), np.float32)
                c.launch("attn_partial_f32", (rows * nh, splits), (128,), bq, bk, bv, bp, start, nh, nkv, hd,
                         np.float32(scale), np.float32(0.0), window, split_len)
            c.launch("attn_combine_sinks_f32", (rows * nh,), (hd,), bp, bs, bo, splits, nh, hd)
            plain = attn_ref_combine(ref, hd).reshape(rows, nh * hd)
            if np.allclose(want, plain, rtol=1e-3):
                raise CaseFail("harness: the sinks do not change the reference")
            return compare_nmse("out", bo.read(), want, 5e-4) + (" (partial+combine)" if mode == "both" else "")
        return run
    sink_shapes = [
        # rows, start_pos, n_heads, n_kv_heads, head_dim, window, split_len, splits
        (1, 37, 4, 2, 64, 0, 38, 1),      # decode, one split
        (1, 37, 4, 2, 64, 0, 16, 3),      # decode, split partials (one empty slice per row)
        (5, 0, 4, 2, 128, 0, 3, 2),       # prefill from 0: rows whose second split is empty
        (7, 20, 4, 2, 64, 8, 7, 4),       # sliding window (gpt-oss's even layers), split
        (1, 300, 8, 2, 64, 128, 64, 5),   # decode with a window and 5 splits, some empty
        (2, 10, 2, 1, 256, 0, 6, 2),      # head_dim 256, two heads (no -inf sink)
    ]
    for shp in sink_shapes:
        rows, start, nh, nkv, hd, window, sl, sp = shp
        desc = (f"rows={rows} start_pos={start} n_heads={nh} n_kv={nkv} head_dim={hd} window={window} "
                f"split_len={sl} splits={sp}")
        cs.append(Case(f"attn_combine_sinks_f32 {desc}", "attn_combine_sinks_f32", attn_sinks(*shp, "combine")))
        cs.append(Case(f"attn_partial+combine_sinks {desc}", "attn_combine_sinks_f32", attn_sinks(*shp, "both")))

    def attn_group(rows, start, nh, nkv, hd, window, split_len, splits, softcap, kv, sinks):
        """attn_group_KV against the reference partials (NMSE) and attn_partial_KV's bits;
        with `sinks`, then attn_combine_sinks_f32 over its partials against the written-out
        softmax with sinks."""
        def run(c, rng):
            cap = start + rows
            q = rng.standard_normal((rows, nh * hd)).astype(np.float32)
            k = kv_encode(kv, rng.standard_normal((cap, nkv * hd)).astype(np.float32))
            v = kv_encode(kv, rng.standard_normal((cap, nkv * hd)).astype(np.float32))
            kd, vd = kv_decode(kv, k, nkv * hd), kv_decode(kv, v, nkv * hd)
            scale = 1.0 / math.sqrt(hd)
            ref = attn_ref_partial(q, kd, vd, start, nh, nkv, hd, scale, window, split_len, splits, softcap)
            bq, bk, bv = c.buf(q), c.buf(k), c.buf(v)
            args = (start, nh, nkv, hd, np.float32(scale), np.float32(softcap), window, split_len)
            bg = c.out((rows, nh, splits, hd + 2), np.float32)
            c.launch(f"attn_group_{kv}", (rows * nkv, splits), (128,), bq, bk, bv, bg, *args)
            bh = c.out((rows, nh, splits, hd + 2), np.float32)
            c.launch(f"attn_partial_{kv}", (rows * nh, splits), (128,), bq, bk, bv, bh, *args)
            got, old = bg.read(), bh.read()
            s = compare_part(got.astype(np.float64), ref, hd)
            same = (got == old) | (np.isnan(got) & np.isnan(old))
            if not same.all():
                i = tuple(np.argwhere(~same)[0])
                raise CaseFail(f"part differs from attn_partial_{kv}'s at [row, head, split, slot] {i}: "
                               f"{got[i]!r} vs {old[i]!r} ({int((~same).sum())} values)")
            s += f"; bit for bit attn_partial_{kv}"
            if not sinks:
                return s
            sk = (rng.standard_normal(nh) * 2).astype(np.float32)
            sk[0] = 6.0
            bs, bo = c.buf(sk), c.out((rows, nh * hd), np.float32)
            c.launch("attn_combine_sinks_f32", (rows * nh,), (hd,), bg, bs, bo, splits, nh, hd)
            want = attn_ref_combine(ref, hd, sk).reshape(rows, nh * hd)
            return s + "; sinks " + compare_nmse("out", bo.read(), want, 5e-4)
        return run
    group_shapes = [
        # rows, start_pos, n_heads, n_kv_heads, head_dim, window, split_len, splits, softcap, sinks
        (1, 36, 8, 2, 64, 0, 37, 1, 0.0, False),      # decode, group 4, one split, 37 keys
        (1, 300, 32, 8, 128, 0, 64, 5, 0.0, False),   # Llama-3-8B's heads, split decode
        (1, 200, 16, 2, 128, 0, 64, 4, 0.0, False),   # group 8 (a whole pass)
        (1, 77, 16, 1, 64, 0, 26, 3, 0.0, False),     # group 16: two passes over the keys
        (1, 45, 4, 4, 128, 0, 16, 3, 0.0, False),     # MHA (group 1)
        (1, 130, 8, 4, 256, 0, 64, 3, 0.0, False),    # head_dim 256, group 2
        (1, 61, 8, 1, 256, 0, 32, 2, 50.0, False),    # head_dim 256, group 8 (two passes), softcap
        (1, 140, 8, 2, 64, 64, 64, 3, 0.0, False),    # sliding window: an empty first split
        (1, 99, 12, 3, 64, 16, 25, 4, 1.0, False),    # window and softcap, group 4
        (1, 80, 8, 2, 64, 0, 64, 2, 0.0, True),       # gpt-oss-style sinks, group 4
        (1, 150, 16, 2, 64, 128, 64, 3, 0.0, True),   # sinks with a window, group 8
        (4, 21, 8, 2, 128, 0, 9, 3, 0.0, False),      # a verifying sequence's 4 rows
        (5, 0, 8, 4, 64, 8, 3, 2, 0.0, False),        # prefill from 0, window: empty slices
        (2, 40, 8, 2, 80, 0, 16, 3, 0.0, False),      # head_dim 80 (heads straddle q8_0 blocks)
        (3, 9, 6, 3, 96, 8, 5, 2, 1.0, False),        # head_dim 96, window, softcap
        (2, 30, 4, 1, 40, 0, 16, 2, 0.0, False),      # head_dim 40: a partial q8_0 block
        (1, 12, 6, 3, 27, 0, 13, 1, 0.0, False),      # head_dim 27: odd f16 rows, unaligned slices
    ]
    for kv in ("f32", "f16", "q8_0"):
        for rows, start, nh, nkv, hd, window, sl, sp, cap_, snk in group_shapes:
            desc = (f"rows={rows} start_pos={start} n_heads={nh} n_kv={nkv} head_dim={hd} window={window} "
                    f"split_len={sl} splits={sp}" + (f" softcap={cap_}" if cap_ else "") + (" sinks" if snk else ""))
            cs.append(Case(f"attn_group_{kv} {desc}", f"attn_group_{kv}",
                           attn_group(rows, start, nh, nkv, hd, window, sl, sp, cap_, kv, snk)))
    return cs + cases_kv_store() + cases_rope_store()
