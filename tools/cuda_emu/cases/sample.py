"""Cases of sample.cu: argmax and top-k with their logsumexps, against numpy."""

from __future__ import annotations

from harness import Case, compare_exact, compare_nmse


def distinct_logits(rng, rows, vocab):
    """Logits without ties: a random permutation of evenly spaced values in about [-8, 8)
    plus jitter smaller than the spacing."""
    import numpy as np
    step = 16.0 / vocab
    x = np.stack([(rng.permutation(vocab) - vocab / 2) * step for _ in range(rows)])
    x = (x + rng.uniform(0, 0.25 * step, size=x.shape)).astype(np.float32)
    assert all(np.unique(r).size == vocab for r in x)
    return x


def lse_ref(x):
    import numpy as np
    xd = x.astype(np.float64)
    m = xd.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(xd - m).sum(axis=1, keepdims=True))).ravel()


def topk_ref(x, k):
    import numpy as np
    # descending value, ties to the lower index
    order = np.lexsort((np.arange(x.shape[1])[None, :].repeat(x.shape[0], 0), -x.astype(np.float64)), axis=1)
    return order[:, :k]


def cases_sample():
    import numpy as np
    cs = []

    def argmax(rows, vocab, variant):
        def run(c, rng):
            x = distinct_logits(rng, rows, vocab)
            if variant == "last" and vocab > 1:
                x[0, -1] = x[0].max() + 1
            if variant == "first":
                x[0, 0] = x[0].max() + 1
            if variant == "masked" and vocab > 3:
                x[:, ::3] = -np.inf
            if variant == "ties" and vocab > 10:  # tie across threads' slices
                top = x.max() + 1
                x[:, vocab // 3] = top
                x[:, vocab - 2] = top
            if variant == "same-thread ties":  # tie inside one thread's strided slice
                top = x.max() + 1
                x[:, [5 + 2048, 5, 5 + 1024]] = top
            bl = c.buf(x)
            bi, bv, bs = c.out((rows,), np.uint32), c.out((rows,), np.float32), c.out((rows,), np.float32)
            c.launch("argmax_f32", (rows,), (1024,), bl, vocab, bi, bv, bs)
            want = topk_ref(x, 1)[:, 0].astype(np.uint32)
            r1 = compare_exact("idx", bi.read(), want)
            compare_exact("val", bv.read(), x[np.arange(rows), want])
            r3 = compare_nmse("lse", bs.read(), lse_ref(x), 1e-7)
            return f"{r1}, val exact, {r3}"
        return run
    for rows, vocab, variant in ((1, 1, ""), (2, 5, ""), (3, 1000, ""), (1, 3001, "last"), (2, 3001, "first"),
                                 (4, 32000, ""), (2, 2000, "masked"), (2, 2000, "ties"),
                                 (1, 3000, "same-thread ties")):
        cs.append(Case(f"argmax_f32 rows={rows} vocab={vocab}{' ' + variant if variant else ''}", "argmax_f32",
                       argmax(rows, vocab, variant)))

    def topk(rows, vocab, k, variant):
        def run(c, rng):
            x = distinct_logits(rng, rows, vocab)
            if variant == "ties":
                top = np.sort(x[0])[-3]
                x[:, [vocab // 5, vocab // 2, vocab - 1]] = top + 1  # three-way tie at the top
                x[:, [7, 3]] = top + 0.5  # a tie further down
            if variant == "masked":
                x[:, 1::2] = -np.inf
            if variant == "tie at the cut":  # k-th and (k+1)-th best tie: lower index wins
                top = x.max() + 1
                x[:, [vocab - 1, 900, 17, 2000, 1400]] = top
            if variant == "same-thread top":  # 10 of the top 12 in one thread's slice
                top = x.max() + 1
                x[:, [7 + 1024 * j for j in range(10)]] = top + np.arange(10, dtype=np.float32)[::-1]
                x[:, 3] = top + 0.5
            if variant == "same-thread ties":
                top = x.max() + 1
                x[:, [9 + 1024 * j for j in range(4)]] = top
            bl = c.buf(x)
            bi, bv, bs = c.out((rows, k), np.uint32), c.out((rows, k), np.float32), c.out((rows,), np.float32)
            c.launch("topk_f32", (rows,), (1024,), bl, vocab, k, bi, bv, bs)
            want = topk_ref(x, k).astype(np.uint32)
            r1 = compare_exact("idx", bi.read(), want)
            compare_exact("val", bv.read(), np.take_along_axis(x, want.astype(np.int64), axis=1))
            r3 = compare_nmse("lse", bs.read(), lse_ref(x), 1e-7)
            return f"{r1}, val exact, {r3}"
        return run
    for rows, vocab, k, variant in ((1, 10, 1, ""), (2, 300, 5, ""), (1, 3001, 40, ""), (1, 32000, 256, ""),
                                    (1, 1000, 256, ""), (1, 256, 256, ""), (1, 2000, 10, "ties"),
                                    (1, 600, 50, "masked"), (1, 3000, 3, "tie at the cut"),
                                    (1, 10300, 12, "same-thread top"), (1, 5000, 6, "same-thread ties")):
        cs.append(Case(f"topk_f32 rows={rows} vocab={vocab} k={k}{' ' + variant if variant else ''}", "topk_f32",
                       topk(rows, vocab, k, variant)))
    return cs
