"""Cases of elementwise.cu, rows.cu, norm.cu and rope.cu against numpy references."""

from __future__ import annotations

import math

from harness import Case, CaseFail, Ctx, cdiv, compare_exact, compare_nmse


def cases_elementwise():
    import numpy as np
    cs = []

    def add(n, grid=None):
        def run(c: Ctx, rng):
            x = rng.standard_normal(n).astype(np.float32)
            y = rng.standard_normal(n).astype(np.float32)
            bx, by = c.buf(x, True), c.buf(y)
            c.launch("add_f32", (grid or cdiv(n, 256),), (256,), bx, by, n)
            return compare_nmse("x", bx.read(), x.astype(np.float64) + y, 1e-7)
        return run
    for n in (1, 255, 256, 1000, 4097):
        cs.append(Case(f"add_f32 n={n}", "add_f32", add(n)))
    cs.append(Case("add_f32 n=4097 capped grid 3", "add_f32", add(4097, 3)))

    def bias(rows, width):
        def run(c, rng):
            x = rng.standard_normal((rows, width)).astype(np.float32)
            b = rng.standard_normal(width).astype(np.float32)
            bx, bb = c.buf(x, True), c.buf(b)
            c.launch("add_bias_f32", (cdiv(rows * width, 256),), (256,), bx, bb, rows, width)
            return compare_nmse("x", bx.read(), x.astype(np.float64) + b[None, :], 1e-7)
        return run
    for rows, width in ((1, 7), (3, 300), (5, 1000), (8, 512)):
        cs.append(Case(f"add_bias_f32 rows={rows} width={width}", "add_bias_f32", bias(rows, width)))

    def silu(n):
        def run(c, rng):
            g = (rng.standard_normal(n) * 4).astype(np.float32)
            if n >= 16:  # extremes (e^100 overflows f32): only where they don't dominate the NMSE
                g[:4] = np.array([-100.0, 100.0, 0.0, -20.0], dtype=np.float32)
            u = rng.standard_normal(n).astype(np.float32)
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("silu_mul_f32", (cdiv(n, 256),), (256,), bg, bu, n)
            gd = g.astype(np.float64)
            return compare_nmse("g", bg.read(), gd / (1 + np.exp(-gd)) * u, 1e-7)
        return run
    for n in (1, 1000, 4097):
        cs.append(Case(f"silu_mul_f32 n={n}", "silu_mul_f32", silu(n)))

    def sigmoid_gate(n):
        def run(c, rng):
            g = (rng.standard_normal(n) * 4).astype(np.float32)
            if n >= 16:  # saturated gates and zero
                g[:4] = np.array([-100.0, 100.0, 0.0, -20.0], dtype=np.float32)
            u = rng.standard_normal(n).astype(np.float32)
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("sigmoid_mul_f32", (cdiv(n, 256),), (256,), bg, bu, n)
            gd = g.astype(np.float64)
            return compare_nmse("g", bg.read(), u / (1 + np.exp(-gd)), 1e-7)
        return run
    for n in (1, 1000, 4097):
        cs.append(Case(f"sigmoid_mul_f32 n={n}", "sigmoid_mul_f32", sigmoid_gate(n)))

    def swiglu_oai(n, alpha, limit, grid=None):
        def run(c, rng):
            a32, l32 = np.float32(alpha), np.float32(limit)
            g = (rng.standard_normal(n) * 2 * limit).astype(np.float32)
            u = (rng.standard_normal(n) * 2 * limit).astype(np.float32)
            if n >= 16:  # both clamps, exactly at the limits, saturated gates, zero
                g[:8] = np.array([limit + 1, limit, -100.0, 100.0, 0.0, -limit - 3, 1e30, -1e30], np.float32)
                u[:8] = np.array([-limit - 1, limit + 2, -limit, limit, 0.0, 1e30, -1e30, -1.0], np.float32)
                if not ((g > l32).any() and (u > l32).any() and (u < -l32).any()):
                    raise CaseFail("inputs do not reach both clamps")
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("swiglu_oai_f32", (grid or cdiv(n, 256),), (256,), bg, bu, n, a32, l32)
            x = np.minimum(g.astype(np.float64), float(l32))
            y = np.clip(u.astype(np.float64), -float(l32), float(l32))
            with np.errstate(over="ignore"):
                want = x / (1 + np.exp(-float(a32) * x)) * (y + 1)
            return compare_nmse("g", bg.read(), want, 1e-7)
        return run
    # gpt-oss's alpha 1.702 and limit 7; a tighter limit; a capped grid.
    for n, alpha, limit in ((1, 1.702, 7.0), (1000, 1.702, 7.0), (4097, 1.702, 7.0), (300, 0.5, 1.5)):
        cs.append(Case(f"swiglu_oai_f32 n={n} alpha={alpha} limit={limit}", "swiglu_oai_f32",
                       swiglu_oai(n, alpha, limit)))
    cs.append(Case("swiglu_oai_f32 n=4097 alpha=1.702 limit=7.0 capped grid 3", "swiglu_oai_f32",
                   swiglu_oai(4097, 1.702, 7.0, 3)))

    def gelu(n, grid=None):
        def run(c, rng):
            g = (rng.standard_normal(n) * 3).astype(np.float32)
            if n >= 16:  # saturated tails and zero
                g[:5] = np.array([-100.0, 100.0, 0.0, -8.0, 12.0], dtype=np.float32)
            u = rng.standard_normal(n).astype(np.float32)
            bg, bu = c.buf(g, True), c.buf(u)
            c.launch("gelu_mul_f32", (grid or cdiv(n, 256),), (256,), bg, bu, n)
            gd = g.astype(np.float64)
            ref = 0.5 * gd * (1 + np.tanh(math.sqrt(2 / math.pi) * (gd + 0.044715 * gd ** 3))) * u
            return compare_nmse("g", bg.read(), ref, 1e-7)
        return run
    for n in (1, 1000, 4097):
        cs.append(Case(f"gelu_mul_f32 n={n}", "gelu_mul_f32", gelu(n)))
    cs.append(Case("gelu_mul_f32 n=4097 capped grid 3", "gelu_mul_f32", gelu(4097, 3)))

    def scale(n, factor, grid=None):
        def run(c, rng):
            x = (rng.standard_normal(n) * 10).astype(np.float32)
            bx = c.buf(x, True)
            c.launch("scale_f32", (grid or cdiv(n, 256),), (256,), bx, n, np.float32(factor))
            return compare_nmse("x", bx.read(), x.astype(np.float64) * np.float32(factor), 1e-7)
        return run
    for n, factor in ((1, 0.125), (1000, -3.5), (4097, 48.0)):
        cs.append(Case(f"scale_f32 n={n} factor={factor}", "scale_f32", scale(n, factor)))
    cs.append(Case("scale_f32 n=4097 factor=0.5 capped grid 3", "scale_f32", scale(4097, 0.5, 3)))

    def softcap(n, cap, grid=None):
        def run(c, rng):
            x = (rng.standard_normal(n) * 2 * abs(cap)).astype(np.float32)
            if n >= 16:  # saturation, zero, infinities
                x[:6] = np.array([0.0, -0.0, 1e30, -1e30, np.inf, -np.inf], dtype=np.float32)
            bx = c.buf(x, True)
            c.launch("softcap_f32", (grid or cdiv(n, 256),), (256,), bx, n, np.float32(cap))
            capd = float(np.float32(cap))
            return compare_nmse("x", bx.read(), capd * np.tanh(x.astype(np.float64) / capd), 1e-7)
        return run
    for n, cap in ((1, 30.0), (1000, 50.0), (4097, 0.75), (300, -5.0)):
        cs.append(Case(f"softcap_f32 n={n} cap={cap}", "softcap_f32", softcap(n, cap)))
    cs.append(Case("softcap_f32 n=4097 cap=30.0 capped grid 3", "softcap_f32", softcap(4097, 30.0, 3)))

    def to_f16(n, grid=None):
        def run(c, rng):
            x = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 12, n))).astype(np.float32)
            special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, -65520.0,
                                1e-8, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1.0 + 2.0 ** -11,
                                1.0 + 3 * 2.0 ** -11, 6.097555e-05, 6.1035156e-05, -3.0517578e-05,
                                1e30, -1e-30], dtype=np.float32)
            x[: min(n, special.size)] = special[: min(n, special.size)]
            bx, by = c.buf(x), c.out((n,), np.uint16)
            c.launch("f32_to_f16", (grid or cdiv(n, 256),), (256,), bx, by, n)
            got = by.read()
            want = x.astype(np.float16).view(np.uint16)
            isnan = np.isnan(x)
            gnan = ((got & 0x7C00) == 0x7C00) & ((got & 0x3FF) != 0)
            if not gnan[isnan].all():
                raise CaseFail(f"y: NaN inputs at {np.flatnonzero(isnan & ~gnan)[:5].tolist()} did not give NaN")
            got = np.where(isnan, want, got)
            return compare_exact("y (f16 bits)", got, want)
        return run
    for n in (1, 20, 1000, 70001):
        cs.append(Case(f"f32_to_f16 n={n}", "f32_to_f16", to_f16(n)))
    cs.append(Case("f32_to_f16 n=70001 capped grid 7", "f32_to_f16", to_f16(70001, 7)))
    return cs


def rows_grid(n_rows, row_len):
    """README.md's launch of the row kernels: grid (n_rows, ceil(row_len / 256))."""
    return (n_rows, cdiv(row_len, 256))


def cases_rows():
    import numpy as np
    cs = []

    def gather(src_rows, n_rows, row_len, grid=None):
        def run(c: Ctx, rng):
            src = rng.standard_normal((src_rows, row_len)).astype(np.float32)
            rows = rng.integers(0, src_rows, size=n_rows).astype(np.uint32)
            rows[0] = src_rows - 1  # the last row: an off-by-one reads past the buffer
            if n_rows > 2:
                rows[1] = rows[2] = 0  # a repeated row, and row 0
            bs, bi, bd = c.buf(src), c.buf(rows), c.out((n_rows, row_len), np.float32)
            c.launch("gather_rows_f32", grid or rows_grid(n_rows, row_len), (256,), bs, bi, bd, row_len, n_rows)
            return compare_exact("dst", bd.read(), src[rows])
        return run
    for src_rows, n_rows, row_len in ((1, 1, 1), (3, 1, 4097), (4, 8, 1), (7, 5, 300), (9, 7, 4097),
                                      (2, 40, 33)):
        cs.append(Case(f"gather_rows_f32 src_rows={src_rows} n_rows={n_rows} row_len={row_len}",
                       "gather_rows_f32", gather(src_rows, n_rows, row_len)))
    cs.append(Case("gather_rows_f32 src_rows=5 n_rows=9 row_len=1000 capped grid (2, 3)", "gather_rows_f32",
                   gather(5, 9, 1000, (2, 3))))

    def add(x_rows, n_rows, row_len, listed, weighted, grid=None):
        def run(c: Ctx, rng):
            x = rng.standard_normal((x_rows, row_len)).astype(np.float32)
            y = rng.standard_normal((n_rows, row_len)).astype(np.float32)
            if listed:  # distinct rows in a scrambled order, the last row among them
                rows = rng.permutation(x_rows)[:n_rows].astype(np.uint32)
                if x_rows - 1 not in rows:
                    rows[0] = x_rows - 1
            else:
                rows = np.arange(n_rows, dtype=np.uint32)
            w = rng.uniform(-2, 2, n_rows).astype(np.float32) if weighted else np.ones(n_rows, np.float32)
            bx, by = c.buf(x, True), c.buf(y)
            bi = c.buf(rows) if listed else None
            bw = c.buf(w) if weighted else None
            c.launch("add_rows_f32", grid or rows_grid(n_rows, row_len), (256,), bx, by, bi, bw, row_len, n_rows)
            ref = x.astype(np.float64)
            ref[rows] += w.astype(np.float64)[:, None] * y
            got = bx.read()
            untouched = np.setdiff1d(np.arange(x_rows), rows)
            if not np.array_equal(got[untouched], x[untouched]):
                raise CaseFail(f"x: rows not listed changed (rows {untouched[:5].tolist()}...)")
            return compare_nmse("x", got, ref, 1e-7)
        return run
    shapes = ((1, 1, 1), (3, 1, 4097), (9, 8, 1), (12, 5, 300), (10, 6, 4097))
    for listed in (True, False):
        for weighted in (True, False):
            what = f"rows={'list' if listed else 'null'} w={'set' if weighted else 'null'}"
            for x_rows, n_rows, row_len in shapes:
                if not listed:
                    x_rows = n_rows  # x points at the first row of the range
                cs.append(Case(f"add_rows_f32 {what} x_rows={x_rows} n_rows={n_rows} row_len={row_len}",
                               "add_rows_f32", add(x_rows, n_rows, row_len, listed, weighted)))
    cs.append(Case("add_rows_f32 rows=list w=set x_rows=20 n_rows=9 row_len=1000 capped grid (2, 3)",
                   "add_rows_f32", add(20, 9, 1000, True, True, (2, 3))))

    def copy_cols(n_rows, src_stride, src_col, dst_stride, dst_col, width, grid=None):
        # One head's columns of a row of heads into (or out of) a narrower buffer; the
        # pointers the host passes are already offset to the first column, and both
        # buffers end exactly at the last element the copy touches.
        def run(c: Ctx, rng):
            src = rng.standard_normal(src_col + (n_rows - 1) * src_stride + width).astype(np.float32)
            dst0 = rng.standard_normal(dst_col + (n_rows - 1) * dst_stride + width).astype(np.float32)
            bs, bd = c.buf(src[src_col:].copy()), c.buf(dst0[dst_col:].copy(), True)
            c.launch("copy_cols_f32", grid or rows_grid(n_rows, width), (256,), bs, src_stride, bd, dst_stride,
                     width, n_rows)
            ref = dst0[dst_col:].copy()
            for r in range(n_rows):
                ref[r * dst_stride:r * dst_stride + width] = src[src_col + r * src_stride:][:width]
            return compare_exact("dst", bd.read(), ref)
        return run
    for n_rows, ss, sc, ds, dc, w in ((1, 1, 0, 1, 0, 1), (3, 576, 512, 64, 0, 64), (4, 8, 0, 24, 16, 8),
                                     (5, 4097, 0, 4097, 0, 4097), (7, 300, 3, 1000, 700, 297),
                                     (40, 33, 1, 2, 0, 2)):
        cs.append(Case(f"copy_cols_f32 n_rows={n_rows} src {ss}@{sc} dst {ds}@{dc} width={w}", "copy_cols_f32",
                       copy_cols(n_rows, ss, sc, ds, dc, w)))
    cs.append(Case("copy_cols_f32 n_rows=9 src 1200@100 dst 1000@0 width=1000 capped grid (2, 3)",
                   "copy_cols_f32", copy_cols(9, 1200, 100, 1000, 0, 1000, (2, 3))))

    # pack_blocks_u8 (a streamed weight repacked in its slot) against the packed layout the
    # packed matvecs' cases read (cases/quant.py pack_weights), for every packed format.
    def pack(fmt, rows, cols, grid):
        def run(c: Ctx, rng):
            from harness import BLOCK, PACKED_QUANTS
            from cases.quant import pack_weights
            bs, ts = BLOCK[fmt]
            nblk = rows * (cols // bs)
            raw = rng.integers(0, 256, size=nblk * ts, dtype=np.uint8)
            qs, d = pack_weights(fmt, raw, rows, cols)
            q0, q1 = PACKED_QUANTS[fmt]
            bsrc, bdst = c.buf(raw), c.out((nblk * ts,), np.uint8)
            c.launch("pack_blocks_u8", (grid,), (256,), bsrc, bdst, nblk, ts, q0, q1 - q0)
            return compare_exact("dst", bdst.read(), np.concatenate([qs, d]))
        return run
    for fmt, rows, cols, grid in (("q4_0", 3, 64, 1), ("q8_0", 300, 96, 2), ("q4_k", 5, 512, 1),
                                  ("q5_k", 2, 256, 1), ("q6_k", 257, 256, 1), ("q4_1", 7, 96, 1),
                                  ("q5_0", 300, 64, 2), ("q5_1", 3, 160, 1), ("mxfp4", 301, 96, 2),
                                  ("i8", 5, 224, 1), ("affine_q4", 257, 384, 2)):
        cs.append(Case(f"pack_blocks_u8 {fmt} rows={rows} cols={cols} grid={grid}", "pack_blocks_u8",
                       pack(fmt, rows, cols, grid)))
    return cs


def cases_norm():
    import numpy as np
    cs = []

    def rms(rows, dim, eps):
        def run(c, rng):
            x = (rng.standard_normal((rows, dim)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
            w = rng.standard_normal(dim).astype(np.float32)
            bx, bw, bo = c.buf(x), c.buf(w), c.out((rows, dim), np.float32)
            c.launch("rms_norm_f32", (rows,), (256,), bx, bw, bo, dim, eps)
            xd = x.astype(np.float64)
            ref = w * xd / np.sqrt(np.mean(xd * xd, axis=1, keepdims=True) + np.float32(eps))
            return compare_nmse("out", bo.read(), ref, 1e-7)
        return run
    for rows, dim, eps in ((1, 512, 1e-5), (3, 1000, 1e-6), (2, 100, 1e-5), (8, 4096, 1e-5), (1, 7, 1e-6)):
        cs.append(Case(f"rms_norm_f32 rows={rows} dim={dim} eps={eps}", "rms_norm_f32", rms(rows, dim, eps)))
    return cs


def cases_rope():
    import numpy as np
    cs = []

    def rope(rows, n_heads, hd, inter, factor, maxpos, pairs=None):
        # `pairs` < hd/2: partial RoPE (only the first 2·pairs dims rotate); > hd/2: the
        # kernel must clamp to hd/2 (kernels/ABI_NOTES.md).
        def run(c, rng):
            n_arg = hd // 2 if pairs is None else pairs
            npr = min(n_arg, hd // 2)  # pairs that rotate
            x = rng.standard_normal((rows, n_heads * hd)).astype(np.float32)
            pos = rng.integers(1, maxpos, size=rows).astype(np.uint32)
            pos[0] = maxpos - 1
            if rows > 2:
                pos[-1] = 0
            inv = (10000.0 ** (-np.arange(n_arg, dtype=np.float64) * 2 / (2 * npr))).astype(np.float32)
            bx, bp, bi = c.buf(x, True), c.buf(pos), c.buf(inv)
            c.launch("rope_f32", (rows, n_heads), (n_arg,), bx, bp, bi, n_heads, hd, n_arg, np.float32(factor),
                     inter)
            ang = (pos[:, None].astype(np.float32) * inv[None, :npr]).astype(np.float64)  # f32 angle, as the kernel
            cs_, sn = np.cos(ang) * factor, np.sin(ang) * factor
            xr = x.astype(np.float64).reshape(rows, n_heads, hd)
            if inter:
                ia, ib = np.arange(npr) * 2, np.arange(npr) * 2 + 1
            else:
                ia, ib = np.arange(npr), np.arange(npr) + npr
            a, b = xr[..., ia], xr[..., ib]
            c_, s_ = cs_[:, None, :], sn[:, None, :]
            ref = xr.copy()  # dims past 2·npr pass through
            ref[..., ia], ref[..., ib] = a * c_ - b * s_, a * s_ + b * c_
            return compare_nmse("x", bx.read(), ref.reshape(rows, n_heads * hd), 1e-7)
        return run
    for rows, nh, hd, inter, factor, maxpos in (
            (1, 4, 64, 0, 1.0, 50), (3, 4, 128, 0, 1.0, 4000), (3, 4, 128, 1, 1.0, 4000),
            (2, 2, 64, 1, 0.8, 300), (5, 1, 128, 0, 1.2, 9000), (2, 3, 96, 0, 1.0, 100), (2, 3, 96, 1, 1.0, 100)):
        cs.append(Case(f"rope_f32 rows={rows} n_heads={nh} head_dim={hd} {'interleaved' if inter else 'neox'} "
                       f"attn_factor={factor} pos<{maxpos}", "rope_f32", rope(rows, nh, hd, inter, factor, maxpos)))
    # partial RoPE: head_dim 128 at 1/4 (StableLM), 80 with 16 pairs (Phi-2), 64 with 1 pair
    for rows, nh, hd, inter, factor, maxpos, pairs in (
            (3, 4, 128, 0, 1.0, 4000, 16), (3, 4, 128, 1, 1.0, 4000, 16), (2, 3, 80, 0, 1.0, 2000, 16),
            (2, 3, 80, 1, 0.9, 2000, 16), (2, 2, 64, 0, 1.0, 100, 1), (2, 2, 64, 0, 1.0, 100, 35)):
        what = "clamped" if pairs > hd // 2 else "partial"
        cs.append(Case(f"rope_f32 {what} rows={rows} n_heads={nh} head_dim={hd} n_pairs={pairs} "
                       f"{'interleaved' if inter else 'neox'} attn_factor={factor} pos<{maxpos}", "rope_f32",
                       rope(rows, nh, hd, inter, factor, maxpos, pairs)))
    return cs
