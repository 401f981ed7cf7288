"""Cases of tools/cuda_emu/selftest.cu: the emulator's own semantics (reductions,
shuffles, barriers, partial warps) and the broken kernels it must report."""

from __future__ import annotations

from harness import Case, compare_exact, compare_nmse


def cases_selftest():
    import numpy as np
    cs = []

    def block_sum(c, rng):
        n = 1000
        x = rng.standard_normal(n).astype(np.float32)
        bx, bo = c.buf(x), c.out((4,), np.float32)
        c.launch("st_block_sum", (4,), (256,), bx, bo, n)
        ref = np.array([x[i * 256:(i + 1) * 256].astype(np.float64).sum() for i in range(4)])
        return compare_nmse("out", bo.read(), ref, 1e-12)

    def shuffles(c, rng):
        x = rng.standard_normal(64).astype(np.float32)
        bx, bo = c.buf(x), c.out((6, 64), np.float32)
        c.launch("st_shuffles", (1,), (64,), bx, bo)
        got = bo.read()
        xd = x.astype(np.float64).reshape(2, 32)
        ref = np.zeros((6, 2, 32))
        ref[0] = xd.sum(1, keepdims=True)
        for w in range(2):  # shfl_down tree: lane l sums a lane-dependent set; simulate
            b = xd[w].copy()
            for o in (16, 8, 4, 2, 1):
                b = b + np.array([b[l + o] if l + o < 32 else b[l] for l in range(32)])
            ref[1, w] = b
        ref[2] = xd[:, 7:8]
        ref[3] = np.cumsum(xd, axis=1)
        ref[4] = xd.reshape(2, 4, 8).sum(2, keepdims=True).repeat(8, 2).reshape(2, 32)
        ball = [sum(1 << l for l in range(32) if x[w * 32 + l] > 0) for w in range(2)]
        ref5 = np.array([ball[w] for w in range(2) for _ in range(32)], dtype=np.uint32)
        compare_exact("ballot", got[5].view(np.uint32), ref5)
        return compare_nmse("shuffles", got[:5], ref[:5].reshape(5, 64), 1e-12) + ", ballot exact"

    def rotate(c, rng):
        x = rng.standard_normal(3 * 128).astype(np.float32)
        bx, bo = c.buf(x), c.out((3 * 128,), np.float32)
        c.launch("st_rotate", (3,), (16, 8), bx, bo, 37)
        ref = np.concatenate([np.roll(x[i * 128:(i + 1) * 128], -37) for i in range(3)])
        return compare_exact("out", bo.read(), ref)

    def maxsum(c, rng):
        rows, n = 3, 5000
        x = rng.standard_normal((rows, n)).astype(np.float32)
        bx, bo = c.buf(x), c.out((2 * rows,), np.float32)
        c.launch("st_block_maxsum", (rows,), (1024,), bx, bo, n)
        ref = np.concatenate([x.max(1), x.astype(np.float64).sum(1)])
        return compare_nmse("out", bo.read(), ref, 1e-10)

    def partial(c, rng):
        x = rng.standard_normal(40).astype(np.float32)
        bx, bo = c.buf(x), c.out((40,), np.float32)
        c.launch("st_partial_warp", (1,), (40,), bx, bo)
        got = bo.read()
        ref = np.concatenate([x[16:32], x[16:32], x[40 - 8:40] * np.nan])
        ref[16:32] = x[16:32]  # lanes 16..31 of warp 0: delta past the warp, own value
        ref[32:40] = np.nan  # warp 1 lanes 0..7 read non-existent lanes 16..23
        return compare_exact("out", got, ref)

    def neg(name, block, extra=()):
        def run(c, rng):
            n = 64 if not extra else extra[0]
            x = rng.standard_normal(256).astype(np.float32)
            bx, bo = c.buf(x), c.out((n,), np.float32)
            if name == "bad_missing_lane_deadlock":
                c.lib.lib.emu_set_timeout(1.0)
            try:
                c.launch(name, (1,), (block,), bx, bo, *extra)
            finally:
                c.lib.lib.emu_set_timeout(20.0)
            return "no error reported"
        return run

    cs += [Case("selftest shared-memory tree reduction", "st_block_sum", block_sum),
           Case("selftest warp shuffles xor/down/idx/up/width/ballot", "st_shuffles", shuffles),
           Case("selftest __syncthreads ordering, 2-D block", "st_rotate", rotate),
           Case("selftest block max+sum (shuffles + shared), block 1024", "st_block_maxsum", maxsum),
           Case("selftest partial last warp reads poison", "st_partial_warp", partial),
           Case("selftest detects early return before __syncthreads", "bad_early_return",
                neg("bad_early_return", 64, (40,)), expect_error="every thread must reach every __syncthreads"),
           Case("selftest detects a lane missing from a shuffle (exited)", "bad_missing_lane",
                neg("bad_missing_lane", 64), expect_error="all named lanes must execute the intrinsic"),
           Case("selftest detects a lane missing from a shuffle (deadlock, 1 s timeout)", "bad_missing_lane_deadlock",
                neg("bad_missing_lane_deadlock", 64), expect_error="deadlock"),
           Case("selftest detects divergent __syncthreads", "bad_divergent_sync",
                neg("bad_divergent_sync", 64), expect_error="different __syncthreads"),
           Case("selftest ASan catches an out-of-bounds write", "bad_oob_write",
                neg("bad_oob_write", 128, (64,)), expect_error="AddressSanitizer", modes=("asan",)),
           Case("selftest UBSan catches a misaligned load", "bad_misaligned",
                neg("bad_misaligned", 32), expect_error="misaligned address", modes=("asan",)),
           Case("selftest TSan catches a missing __syncthreads", "bad_race",
                neg("bad_race", 64), expect_error="ThreadSanitizer: data race", modes=("tsan",))]
    return cs
