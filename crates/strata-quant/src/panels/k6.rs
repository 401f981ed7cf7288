//! The line order of a Q6_K panel block, which the panel kernels and the GEMM's panel
//! unpackers both read.

/// Where a Q6_K panel block keeps each of its 52 lines (stored word `t` of the 16 rows:
/// `ql` 0..32, `qh` 32..48, the scales 48..52): in the order the kernels read them, so
/// that a block is one forward stream. Per half `n` of the block: scale words `48 + 2n`
/// and `49 + 2n`, then for `s` in 0..8 the lines `16n + s`, `16n + 8 + s` and
/// `32 + 8n + s`. (In stored order the kernels' reads jumped between four regions of
/// each 3,360-byte block, and an AMD EPYC read Q6_K panels from memory at 0.55–0.65 of
/// its rows' rate.) `d` stays after the 52 lines.
pub const K6_LINE: [usize; 52] = {
    let mut place = [0usize; 52];
    let mut p = 0;
    let mut n = 0;
    while n < 2 {
        place[48 + 2 * n] = p;
        place[49 + 2 * n] = p + 1;
        p += 2;
        let mut s = 0;
        while s < 8 {
            place[16 * n + s] = p;
            place[16 * n + 8 + s] = p + 1;
            place[32 + 8 * n + s] = p + 2;
            p += 3;
            s += 1;
        }
        n += 1;
    }
    place
};

/// Byte `x` of a stored Q6_K block at its place in the block's line order ([`K6_LINE`]),
/// per row: bytes of word `t` move with it; `d` (208, 209) stays.
pub const fn k6_at(x: usize) -> usize {
    if x >= 208 { x } else { 4 * K6_LINE[x / 4] + x % 4 }
}
