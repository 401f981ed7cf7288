"""Cases of the weight-format kernels: embedding.cu, dequant.cu, matvec.cu and matvec_packed.cu (stored and
packed layouts, the fused GLU, add and multi matvecs) against gguf-py's decodes."""

from __future__ import annotations

import math

from harness import (ALIGNED_FMTS, BLOCK, Case, CaseFail, FMTS, GLU_ACTS, PACKED_FMTS, PACKED_QUANTS, cdiv,
                     compare_exact, compare_nmse, fmt_idx, make_weights, nmse_or_exact)


EXACT_DECODE = {"f32", "f16", "bf16", "q4_0", "q5_0", "q8_0", "mxfp4", "i8"}
# The MXFP4 exponents the decode cases put in their first blocks (denormal scales 2^-128
# and 2^-127, the first normal one, the largest finite one: 12 · 2^126), and the ones the
# matvec cases use (the largest would overflow the f32 sums: 2^12 stands in for it).
MXFP4_DECODE_EXPS = (0, 1, 2, 254)
MXFP4_MATVEC_EXPS = (0, 1, 2, 140)


def edge_exps(fmt, rows, cols, exps):
    """The MXFP4 exponents `exps` for make_weights, as many as a [rows, cols] tensor has
    blocks; none for the other formats."""
    return exps[:rows * cols // 32] if fmt == "mxfp4" else ()


def pack_weights(fmt, raw, rows, cols):
    """The packed layout of kernels/README.md from stored blocks: (quants, scales) as two
    byte arrays, block i = o · nblk + b of the [rows, cols] tensor at i · QB and i · MB
    (the scales: the block's bytes outside its quants, in stored order)."""
    import numpy as np
    if fmt in ALIGNED_FMTS:
        return np.ascontiguousarray(raw).ravel(), None  # read as stored; no scales
    bs, ts = BLOCK[fmt]
    blocks = np.ascontiguousarray(raw).reshape(rows * (cols // bs), ts)
    q0, q1 = PACKED_QUANTS[fmt]
    qs = blocks[:, q0:q1]
    d = np.concatenate([blocks[:, :q0], blocks[:, q1:]], axis=1)
    assert qs.shape[1] % 16 == 0 and qs.shape[1] + d.shape[1] == ts
    return np.ascontiguousarray(qs).ravel(), np.ascontiguousarray(d).ravel()


def cases_embedding():
    import numpy as np
    cs = []

    def emb(fmt, vocab, dim, rows):
        def run(c, rng):
            exps = MXFP4_DECODE_EXPS if fmt == "mxfp4" else ()
            raw, ref = make_weights(fmt, vocab, dim, rng, exps)
            ids = rng.integers(0, vocab, size=rows).astype(np.uint32)
            ids[0] = vocab - 1
            if rows > 1:
                ids[1] = 0
            bt, bi, bo = c.buf(raw), c.buf(ids), c.out((rows, dim), np.float32)
            c.launch(f"embed_{fmt}", (rows,), (256,), bt, bi, bo, dim)
            if fmt in EXACT_DECODE:
                return compare_exact("out", bo.read(), ref[ids])
            return nmse_or_exact("out", bo.read(), ref[ids], 1e-7)
        return run
    for fmt in FMTS:
        bs = BLOCK[fmt][0]
        small = {1: 100, 32: 96, 128: 384, 256: 768}[bs]
        for vocab, dim, rows in ((37, 512, 3), (11, small, 8), (5, 2048, 1)):
            cs.append(Case(f"embed_{fmt} vocab={vocab} dim={dim} rows={rows}", f"embed_{fmt}", emb(fmt, vocab, dim, rows)))

    def emb_packed(fmt, vocab, dim, rows):
        def run(c, rng):
            raw, ref = make_weights(fmt, vocab, dim, rng, edge_exps(fmt, vocab, dim, MXFP4_DECODE_EXPS))
            q, d = pack_weights(fmt, raw, vocab, dim)
            ids = rng.integers(0, vocab, size=rows).astype(np.uint32)
            ids[0] = vocab - 1
            if rows > 1:
                ids[1] = 0
            bq, bd, bi, bo = c.buf(q), c.buf(d), c.buf(ids), c.out((rows, dim), np.float32)
            c.launch(f"embed_packed_{fmt}", (rows,), (256,), bq, bd, bi, bo, dim)
            return compare_exact("out", bo.read(), ref[ids])
        return run
    for fmt in PACKED_FMTS:
        small = 96 if BLOCK[fmt][0] == 32 else 256
        for vocab, dim, rows in ((37, 512, 3), (11, small, 8), (5, 2048, 1)):
            cs.append(Case(f"embed_packed_{fmt} vocab={vocab} dim={dim} rows={rows}", f"embed_packed_{fmt}",
                           emb_packed(fmt, vocab, dim, rows)))
    return cs


def cases_dequant():
    import numpy as np
    cs = []

    def deq(fmt, nblocks, grid):
        def run(c, rng):
            bs, _ = BLOCK[fmt]
            n = nblocks * bs
            raw, ref = make_weights(fmt, 1, n, rng, MXFP4_DECODE_EXPS[:nblocks] if fmt == "mxfp4" else ())
            bw, bo = c.buf(raw), c.out((n,), np.uint16)
            g = {"n/256": cdiv(n, 256), "blocks/256": cdiv(nblocks, 256), "1": 1}[grid]
            c.launch(f"dequant_{fmt}_f16", (g,), (256,), bw, bo, n)
            want16 = ref.ravel().astype(np.float16)
            got16 = bo.read().view(np.float16)
            return nmse_or_exact("out (f16)", got16, want16, 1e-7)
        return run
    for fmt in FMTS:
        bs = BLOCK[fmt][0]
        sizes = (5, 37) if bs > 1 else (100, 1001)
        if bs == 32:
            sizes = (5, 37, 3)
        for nb in sizes:
            cs.append(Case(f"dequant_{fmt}_f16 n={nb * bs} grid n/256", f"dequant_{fmt}_f16", deq(fmt, nb, "n/256")))
        nb = 300 if bs > 1 else 3000
        cs.append(Case(f"dequant_{fmt}_f16 n={nb * bs} grid blocks/256", f"dequant_{fmt}_f16",
                       deq(fmt, nb, "blocks/256")))

    def deq_packed(fmt, rows, cols, o0, grid):
        # Rows o0.. of a packed [rows, cols] tensor, as the GEMM's tiles read them.
        def run(c, rng):
            raw, ref = make_weights(fmt, rows, cols, rng, edge_exps(fmt, rows, cols, MXFP4_DECODE_EXPS))
            q, d = pack_weights(fmt, raw, rows, cols)
            nblk = cols // BLOCK[fmt][0]
            qb, mb = q.size // (rows * nblk), d.size // (rows * nblk)
            n = (rows - o0) * cols
            bq, bd = c.buf(q[o0 * nblk * qb:]), c.buf(d[o0 * nblk * mb:])
            bo = c.out((n,), np.uint16)
            c.launch(f"dequant_packed_{fmt}_f16", (grid,), (256,), bq, bd, bo, n)
            return compare_exact("out (f16)", bo.read().view(np.float16), ref[o0:].ravel().astype(np.float16))
        return run
    for fmt in PACKED_FMTS:
        shapes = ((3, 160, 0, 1), (7, 512, 2, 3), (5, 96, 4, 40))
        if BLOCK[fmt][0] > 32:
            shapes = ((3, 256, 0, 1), (7, 512, 2, 3), (5, 768, 4, 40))
        for rows, cols, o0, grid in shapes:
            cs.append(Case(f"dequant_packed_{fmt}_f16 rows={rows} cols={cols} from row {o0} grid {grid}",
                           f"dequant_packed_{fmt}_f16", deq_packed(fmt, rows, cols, o0, grid)))
    return cs


def cases_matvec():
    import numpy as np
    cs = []

    def mv(fmt, rows, out, inn, wide=None):
        def run(c, rng):
            raw, wref = make_weights(fmt, out, inn, rng, MXFP4_MATVEC_EXPS if fmt == "mxfp4" else ())
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            bw, bx, by = c.buf(raw), c.buf(x), c.out((rows, out), np.float32)
            if wide:
                # A block of `wide` threads per output row.
                c.launch(f"matvec_wide_{fmt}", (out,), (wide,), bw, bx, by, rows, out, inn)
            else:
                c.launch(f"matvec_{fmt}", (cdiv(out, 8),), (256,), bw, bx, by, rows, out, inn)
            ref = x.astype(np.float64) @ wref.astype(np.float64).T
            return compare_nmse("y", by.read(), ref, 5e-4)
        return run
    for fmt in FMTS:
        bs = BLOCK[fmt][0]
        odd = {1: 200, 32: 288, 128: 384, 256: 768}[bs]
        for rows, out, inn in ((1, 67, 512), (3, 67, 512), (8, 16, 512), (5, 9, odd), (2, 1, 1024),
                               (8, 67, odd), (1, 9, 4096)):
            cs.append(Case(f"matvec_{fmt} rows={rows} out={out} in={inn}", f"matvec_{fmt}", mv(fmt, rows, out, inn)))
        # The wide kernel at its launch (128 threads), the most warps it takes (256) and
        # one warp; rows shorter than a block, and longer ones with a ragged last pass.
        for rows, out, inn, wide in ((1, 67, 512, 128), (8, 5, odd, 128), (3, 9, 4096, 256), (2, 3, 1024, 32),
                                     (5, 4, 2 * odd, 128)):
            cs.append(Case(f"matvec_wide_{fmt} rows={rows} out={out} in={inn} block={wide}", f"matvec_wide_{fmt}",
                           mv(fmt, rows, out, inn, wide)))

    return cs


def cases_matvec_packed():
    import numpy as np
    cs = []

    def mv_packed(fmt, rows, out, inn, block, twice=False):
        # `twice`: also each activation row alone, which must give the same bits (the
        # order of the additions depends on the shape only).
        def run(c, rng):
            raw, wref = make_weights(fmt, out, inn, rng, edge_exps(fmt, out, inn, MXFP4_MATVEC_EXPS))
            q, d = pack_weights(fmt, raw, out, inn)
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            bq, bd, bx, by = c.buf(q), c.buf(d), c.buf(x), c.out((rows, out), np.float32)
            per_block = 2 * block // 32
            c.launch(f"matvec_packed_{fmt}", (cdiv(out, per_block),), (block,), bq, bd, bx, by, rows, out, inn)
            got = by.read()
            ref = x.astype(np.float64) @ wref.astype(np.float64).T
            if twice:
                for r in range(rows):
                    b1x, b1y = c.buf(np.ascontiguousarray(x[r:r + 1])), c.out((1, out), np.float32)
                    c.launch(f"matvec_packed_{fmt}", (cdiv(out, per_block),), (block,), bq, bd, b1x, b1y, 1, out,
                             inn)
                    if not np.array_equal(b1y.read()[0].view(np.uint32), got[r].view(np.uint32)):
                        raise CaseFail(f"row {r} alone differs from row {r} of {rows} (bits)")
            return compare_nmse("y", got, ref, 5e-4)
        return run
    # Odd `out` (a last warp with one row, a last block with idle warps), `in` of a few
    # blocks, more than one tile (rows=1: 256 blocks = 8192 values; rows=8: 1024 values),
    # a ragged last tile, 1 to 8 rows, blocks of 1, 4 and 8 warps.
    # K-quants (units of 32 or 64 values, 8 or 4 a super-block): a tile at rows=1 is
    # 8192 values, at rows=8 1024; Q6_K's tiles at 5 to 8 rows are fewer than 32 units
    # (1536 and 1024 values), so lanes start mid-tile.
    shapes_32 = ((1, 67, 512, 128, False), (3, 67, 512, 128, True), (8, 16, 512, 128, False),
                 (5, 9, 288, 128, False), (2, 1, 1024, 128, False), (8, 67, 3104, 128, True),
                 (1, 9, 8192 + 1056, 128, False), (4, 21, 2080, 256, True), (7, 5, 4128, 32, False),
                 (6, 3, 32, 128, False))
    shapes_256 = ((1, 67, 512, 128, False), (3, 67, 768, 128, True), (8, 16, 512, 128, False),
                  (5, 9, 2560, 128, True), (2, 1, 1024, 128, False), (8, 67, 3328, 128, True),
                  (1, 9, 8192 + 1280, 128, False), (4, 21, 2304, 256, True), (7, 5, 4352, 32, False),
                  (6, 3, 256, 128, False))
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        for rows, out, inn, block, twice in (shapes_32 if BLOCK[fmt][0] <= 32 else shapes_256):
            cs.append(Case(f"matvec_packed_{fmt} rows={rows} out={out} in={inn} block={block}",
                           f"matvec_packed_{fmt}", mv_packed(fmt, rows, out, inn, block, twice)))

    def mv_glu_packed(fmt, act, rows, out, inn, block):
        # act(x · gateᵀ) ⊙ (x · upᵀ) against float64 numpy, and bit for bit against
        # matvec_packed_FMT of each weight then the GLU kernel (elementwise.cu).
        def run(c, rng):
            code, unfused = GLU_ACTS[act]
            graw, gw = make_weights(fmt, out, inn, rng)
            uraw, uw = make_weights(fmt, out, inn, rng)
            (gq, gd), (uq, ud) = pack_weights(fmt, graw, out, inn), pack_weights(fmt, uraw, out, inn)
            x = rng.standard_normal((rows, inn))
            if act == "swiglu_oai":
                # Rows of zero mean: weights with an offset (K-quants' mins) then give sums
                # of both signs, so both clamps are met.
                x -= x.mean(axis=1, keepdims=True)
            g64 = x @ gw.astype(np.float64).T
            x = (x * 2 / max(float(np.std(g64)), 1e-30)).astype(np.float32)  # gate values of std ~2
            g64, u64 = x.astype(np.float64) @ gw.astype(np.float64).T, x.astype(np.float64) @ uw.astype(np.float64).T
            # SwigluOai: a limit inside the values, so both clamps and the gate's cap are met.
            alpha, limit = np.float32(1.702), np.float32(np.median(np.abs(u64)))
            bgq, bgd, buq, bud, bx = c.buf(gq), c.buf(gd), c.buf(uq), c.buf(ud), c.buf(x)
            by = c.out((rows, out), np.float32)
            grid = (cdiv(out, 2 * block // 32),)
            c.launch(f"matvec_glu_packed_{fmt}", grid, (block,), bgq, bgd, buq, bud, bx, by, rows, out, inn, code,
                     alpha, limit)
            got = by.read()
            bg, bu = c.out((rows, out), np.float32), c.out((rows, out), np.float32)
            c.launch(f"matvec_packed_{fmt}", grid, (block,), bgq, bgd, bx, bg, rows, out, inn)
            c.launch(f"matvec_packed_{fmt}", grid, (block,), buq, bud, bx, bu, rows, out, inn)
            n = rows * out
            if act == "swiglu_oai":
                c.launch(unfused, (cdiv(n, 256),), (256,), bg, bu, n, alpha, limit)
            else:
                c.launch(unfused, (cdiv(n, 256),), (256,), bg, bu, n)
            want_bits = bg.read()
            if not np.array_equal(got.view(np.uint32), want_bits.view(np.uint32)):
                bad = np.flatnonzero(got.view(np.uint32) != want_bits.view(np.uint32))
                raise CaseFail(f"{bad.size} of {n} outputs differ from matvec_packed x2 + {unfused} (bits); "
                               f"first {fmt_idx(bad[0], got.shape)}: {got.flat[bad[0]]!r} vs {want_bits.flat[bad[0]]!r}")
            if act == "swiglu_oai":
                xg = np.minimum(g64, float(limit))
                if not ((g64 > limit).any() and (u64 > limit).any() and (u64 < -limit).any()):
                    raise CaseFail("inputs do not reach both clamps")
                with np.errstate(over="ignore"):
                    ref = xg / (1 + np.exp(-float(alpha) * xg)) * (np.clip(u64, -float(limit), float(limit)) + 1)
            else:
                with np.errstate(over="ignore"):
                    ref = {"silu": lambda: g64 / (1 + np.exp(-g64)) * u64,
                           "gelu_tanh": lambda: 0.5 * g64 * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                                         * (g64 + 0.044715 * g64 ** 3))) * u64,
                           "sigmoid": lambda: u64 / (1 + np.exp(-g64))}[act]()
            return compare_nmse("y", got, ref, 5e-4) + ", = unfused (bits)"
        return run
    def mv_add_packed(fmt, rows, out, inn, block):
        # y += x · wᵀ against float64 numpy, and bit for bit against matvec_packed_FMT
        # into a buffer then add_f32 of it (elementwise.cu).
        def run(c, rng):
            raw, wref = make_weights(fmt, out, inn, rng, edge_exps(fmt, out, inn, MXFP4_MATVEC_EXPS))
            q, d = pack_weights(fmt, raw, out, inn)
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            y0 = rng.standard_normal((rows, out)).astype(np.float32) * 4
            bq, bd, bx = c.buf(q), c.buf(d), c.buf(x)
            by, bs, bw = c.buf(y0, writable=True), c.out((rows, out), np.float32), c.buf(y0, writable=True)
            grid = (cdiv(out, 2 * block // 32),)
            c.launch(f"matvec_add_packed_{fmt}", grid, (block,), bq, bd, bx, by, rows, out, inn)
            got = by.read()
            c.launch(f"matvec_packed_{fmt}", grid, (block,), bq, bd, bx, bs, rows, out, inn)
            c.launch("add_f32", (cdiv(rows * out, 256),), (256,), bw, bs, rows * out)
            want = bw.read()
            if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
                raise CaseFail(f"{bad.size} of {rows * out} outputs differ from matvec_packed + add_f32 (bits); "
                               f"first {fmt_idx(bad[0], got.shape)}: {got.flat[bad[0]]!r} vs {want.flat[bad[0]]!r}")
            ref = y0.astype(np.float64) + x.astype(np.float64) @ wref.astype(np.float64).T
            return compare_nmse("y", got, ref, 5e-4) + ", = matvec_packed + add_f32 (bits)"
        return run
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        shapes = shapes_32 if BLOCK[fmt][0] <= 32 else shapes_256
        for rows, out, inn, block, _ in shapes[:8]:
            cs.append(Case(f"matvec_add_packed_{fmt} rows={rows} out={out} in={inn} block={block}",
                           f"matvec_add_packed_{fmt}", mv_add_packed(fmt, rows, out, inn, block)))

    def mv_multi_packed(fmt, rows, outs, inn, block):
        # Up to 3 weights of one input against float64 numpy, and each output bit for bit
        # against its own matvec_packed_FMT launch; unused weights: null and out 0.
        def run(c, rng):
            x = rng.standard_normal((rows, inn)).astype(np.float32)
            bx, per = c.buf(x), 2 * block // 32
            args, mine, summary = [], [], []
            for out in outs:
                raw, wref = make_weights(fmt, out, inn, rng)
                q, d = pack_weights(fmt, raw, out, inn)
                bq, bd, by = c.buf(q), c.buf(d), c.out((rows, out), np.float32)
                args += [bq, bd, by, out]
                mine.append((bq, bd, by, out, wref))
            args += [None, None, None, 0] * (3 - len(outs))
            grid = (sum(cdiv(o, per) for o in outs),)
            c.launch(f"matvec_multi_packed_{fmt}", grid, (block,), *args, bx, rows, inn)
            for i, (bq, bd, by, out, wref) in enumerate(mine):
                got, alone = by.read(), c.out((rows, out), np.float32)
                c.launch(f"matvec_packed_{fmt}", (cdiv(out, per),), (block,), bq, bd, bx, alone, rows, out, inn)
                if not np.array_equal(got.view(np.uint32), alone.read().view(np.uint32)):
                    raise CaseFail(f"weight {i}: outputs differ from its own matvec_packed launch (bits)")
                ref = x.astype(np.float64) @ wref.astype(np.float64).T
                summary.append(compare_nmse(f"y{i}", got, ref, 5e-4))
            return ", ".join(summary) + ", = separate launches (bits)"
        return run
    # q, k and v of GQA shapes (odd, sharing blocks' edges), two weights, one; 1 to 8
    # rows; blocks of 1, 4 and 8 warps; `in` past one tile.
    multi = ((1, (67, 17, 17), 0, 128), (3, (16, 9, 9), 1, 128), (8, (21, 5, 40), 0, 256), (2, (9, 9), 2, 32),
             (5, (33,), 0, 128), (4, (1, 8, 3), 3, 128))
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        ins = (512, 288, 2080, 8192 + 1056) if BLOCK[fmt][0] <= 32 else (512, 768, 2304, 8192 + 1280)
        for rows, outs, ii, block in multi:
            inn = ins[ii]
            cs.append(Case(f"matvec_multi_packed_{fmt} rows={rows} outs={outs} in={inn} block={block}",
                           f"matvec_multi_packed_{fmt}", mv_multi_packed(fmt, rows, outs, inn, block)))

    # Every activation at one decode row, then 2 to 8 rows (each activation again), odd
    # `out`, `in` of a few blocks and past one tile, blocks of 1, 4 and 8 warps.
    glu_32 = ((1, 67, 512, 128), (2, 9, 288, 128), (3, 21, 2080, 256), (4, 5, 8192 + 1056, 128),
              (5, 7, 4128, 32), (6, 3, 32, 128), (7, 11, 1056, 128), (8, 13, 3104, 128))
    glu_256 = ((1, 67, 512, 128), (2, 9, 768, 128), (3, 21, 2304, 256), (4, 5, 8192 + 1280, 128),
               (5, 7, 4352, 32), (6, 3, 256, 128), (7, 11, 1280, 128), (8, 13, 3328, 128))
    for fmt in PACKED_FMTS + ALIGNED_FMTS:
        shapes = glu_32 if BLOCK[fmt][0] <= 32 else glu_256
        runs = [(act, shapes[0]) for act in GLU_ACTS] + [(list(GLU_ACTS)[i % 4], sh) for i, sh in enumerate(shapes[1:])]
        for act, (rows, out, inn, block) in runs:
            cs.append(Case(f"matvec_glu_packed_{fmt} {act} rows={rows} out={out} in={inn} block={block}",
                           f"matvec_glu_packed_{fmt}", mv_glu_packed(fmt, act, rows, out, inn, block)))
    return cs
