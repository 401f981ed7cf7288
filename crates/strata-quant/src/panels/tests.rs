use std::sync::Arc;

use super::*;
use crate::testutil::Rng;
use crate::{ReadF32, blocks_as_bytes, zeroed_blocks};
use strata_tensor::tensor::{AlignedBytes, HostTensor};

const FORMATS: [DType; 6] = [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K];

/// A row length of about `k` values in whole blocks of `dtype`.
fn whole(dtype: DType, k: usize) -> usize {
    k.next_multiple_of(dtype.block_size())
}

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap()
}

fn weight(pool: &rayon::ThreadPool, rng: &mut Rng, dtype: DType, m: usize, k: usize) -> HostTensor {
    crate::testing::random_weight(pool, rng, dtype, m, k)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn rows_come_back_as_stored() {
    let (pool, mut rng) = (pool(), Rng::new(1));
    let m = 48;
    // MXFP4's panels (AVX-512 only) repack and read back as the others do.
    for dtype in FORMATS.into_iter().chain([DType::Mxfp4]) {
        let k = whole(dtype, 96);
        let w = weight(&pool, &mut rng, dtype, m, k);
        let mut panels = vec![0u8; w.byte_len()];
        repack(dtype, w.bytes(), m, k, &mut panels);
        assert_ne!(panels, w.bytes(), "{dtype:?}: the layout moved");
        let mut in_place = w.bytes().to_vec();
        repack_in_place(dtype, &mut in_place, m, k);
        assert_eq!(in_place, panels, "{dtype:?}: repacked in place");
        let row_bytes = w.byte_len() / m;
        let mut row_out = vec![0u8; row_bytes];
        for r in 0..m {
            row(dtype, &panels, k, r, &mut row_out);
            assert_eq!(row_out, &w.bytes()[r * row_bytes..(r + 1) * row_bytes], "{dtype:?}: row {r}");
        }
        // A panel tensor reads its values as the stored one does, across rows too.
        let Some(p) = to_panels(&w) else { continue };
        assert!(p.is_panels() && p.rows(8, 16).is_none() && p.rows(16, 8).is_none(), "{dtype:?}: a cut panel");
        // Whole panels split as views that are the panels of those rows; the stored
        // rows come back whole.
        let tail = p.rows(16, 32).expect("whole panels split");
        let want = to_panels(&w.rows(16, 32).unwrap()).unwrap();
        assert!(tail.is_panels() && tail.shape == vec![32, k]);
        assert_eq!(tail.bytes(), want.bytes(), "{dtype:?}: rows 16..48 of the panels");
        let back = row_major(&p);
        assert!(!back.is_panels());
        assert_eq!(back.bytes(), w.bytes(), "{dtype:?}: row-major again");
        let (mut a, mut b) = (vec![0f32; 3 * k], vec![0f32; 3 * k]);
        let at = 5 * k + dtype.block_size();
        w.read_f32(at, &mut a);
        p.read_f32(at, &mut b);
        assert_eq!(bits(&a), bits(&b), "{dtype:?}");
    }
}

/// Spread over threads, in tasks of many panels, the repack moves every byte as the
/// serial one does, in place too (the bytes need not be valid blocks: a repack only
/// moves them).
#[test]
fn repacking_on_threads_gives_the_same_bytes() {
    let pool = pool();
    for dtype in FORMATS {
        let k = whole(dtype, 512);
        let row_bytes = dtype.bytes_for(k).unwrap();
        // More panels than one task takes, and a last task shorter than the others.
        let m = ROWS * ((3 << 20) / (ROWS * row_bytes) + 7);
        let src: Vec<u8> = (0..m * row_bytes).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let (mut serial, mut threaded) = (vec![0u8; src.len()], vec![0u8; src.len()]);
        repack(dtype, &src, m, k, &mut serial);
        pool.install(|| repack_par(dtype, &src, m, k, &mut threaded));
        assert!(serial == threaded, "{dtype:?}: {m} rows");
        // In place, on the team of a forward pass (as the streamer repacks a layer).
        let mut in_place = src.clone();
        team::lead(&pool, || repack_in_place(dtype, &mut in_place, m, k));
        assert!(serial == in_place, "{dtype:?}: {m} rows in place");
    }
}

/// How fast a layer-sized weight (2048 × 5632) is repacked in place on one thread, in
/// GB/s, against a plain copy of it (docs/benchmarks.md):
/// `cargo test --release -p strata-quant --lib repack_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn repack_speed() {
    for dtype in FORMATS {
        let (m, k) = (2048, whole(dtype, 5632));
        let mut bytes: Vec<u8> = (0..m * dtype.bytes_for(k).unwrap()).map(|i| ((i * 31) >> 7) as u8).collect();
        let mut copy = vec![0u8; bytes.len()];
        let best = |f: &mut dyn FnMut()| {
            (0..7)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let n = bytes.len() as f64;
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let repack = best(&mut || one.install(|| repack_in_place(dtype, &mut bytes, m, k)));
        let plain = best(&mut || copy.copy_from_slice(&bytes));
        eprintln!("{dtype:?}: repack in place {:.1} GB/s, a copy {:.1} GB/s", n / repack / 1e9, n / plain / 1e9);
    }
}

/// Q6_K's line order is a permutation, and the AVX-512 tile's reads of a block (per
/// half: its two scale lines, then each 4-value step's two `ql` lines and its `qh`
/// line) run forward through it.
#[test]
fn q6_k_lines_sit_in_reading_order() {
    let mut seen = [false; 52];
    K6_LINE.iter().for_each(|&l| seen[l] = true);
    assert!(seen.iter().all(|&s| s), "{K6_LINE:?}");
    let mut reads = Vec::new();
    for n in 0..2 {
        for h in 0..2 {
            if h == 0 {
                reads.extend([48 + 2 * n, 49 + 2 * n]);
            }
            for s in 4 * h..4 * h + 4 {
                reads.extend([16 * n + s, 16 * n + 8 + s, 32 + 8 * n + s]);
            }
        }
    }
    let lines: Vec<usize> = reads.iter().map(|&t| K6_LINE[t]).collect();
    assert_eq!(lines, (0..52).collect::<Vec<_>>());
    assert_eq!((k6_at(192), k6_at(193), k6_at(208), k6_at(209)), (0, 1, 208, 209));
}

#[test]
fn only_panel_formats_of_whole_panels_repack() {
    assert!(!eligible(DType::Q4_0, &[40, 64]));
    assert!(!eligible(DType::Q5_0, &[32, 256]));
    assert!(!eligible(DType::Q4_K, &[32, 128]));
    assert!(!eligible(DType::Q8_0, &[64]));
    // Every format where the VBMI kernels run, or where AVX2 is the best there is.
    let best = crate::QuantKernel::best();
    for dtype in FORMATS {
        let want = best.decode_fn(DType::Q4_0).is_some() || best == crate::QuantKernel::Avx2;
        assert_eq!(eligible(dtype, &[32, whole(dtype, 64)]), want, "{dtype:?}");
    }
}

/// Each output against the exact (f64) sum of llama.cpp's products per block
/// (`d·da·Σ (q − 8)·y` for Q4_0, `d·da·Σ q·y` for Q8_0, `d·da·Σ q·y + m·s` for Q4_1),
/// within f32 rounding of the terms' magnitudes; four panels side by side give 2
/// rows and 1 the same bits.
#[test]
fn the_kernels_match_the_exact_sum() {
    let (pool, mut rng) = (pool(), Rng::new(2));
    let (m, k) = (64, 320);
    let nb = k / QK;
    for dtype in &FORMATS[..3] {
        let dtype = *dtype;
        let Some(all) = kernels(dtype) else { continue };
        let fns = all.rows;
        let Some(Layout::Block32 { bytes: bb, heads, .. }) = layout(dtype) else { unreachable!() };
        let w = weight(&pool, &mut rng, dtype, m, k);
        let mut panels = vec![0u8; w.byte_len()];
        repack(dtype, w.bytes(), m, k, &mut panels);
        for (n, f) in [8, 4, 2, 1].into_iter().zip(fns) {
            // Each activation row's blocks, and (scale, levels, s) per block.
            let mut acts = vec![0u8; n * nb * ACT_BLOCK];
            let mut xs: Vec<Vec<(f64, [i8; QK], f64)>> = Vec::new();
            for dst in acts.chunks_exact_mut(nb * ACT_BLOCK) {
                let x = rng.vec(k, 1.0);
                if dtype == DType::Q4_1 {
                    let mut b = zeroed_blocks::<BlockQ8_1>(nb);
                    crate::q8_1::quantize(&x, &mut b);
                    pack_act(dtype, blocks_as_bytes(&b), dst);
                    xs.push(b.iter().map(|b| (b.d.to_f32() as f64, b.qs, b.s.to_f32() as f64)).collect());
                } else {
                    let mut b = zeroed_blocks::<BlockQ8_0>(nb);
                    crate::q8_0::quantize(&x, &mut b);
                    pack_act(dtype, blocks_as_bytes(&b), dst);
                    xs.push(b.iter().map(|b| (b.d.to_f32() as f64, b.qs, 0.0)).collect());
                }
            }
            let mut out = vec![0f32; n * m];
            for p in 0..m / ROWS {
                // SAFETY: a whole panel, `n` packed rows, `n` rows of `m` outputs.
                unsafe {
                    f(
                        panels[p * ROWS * nb * bb..].as_ptr(),
                        nb,
                        acts.as_ptr(),
                        nb * ACT_BLOCK,
                        out.as_mut_ptr().add(p * ROWS),
                        m,
                    )
                };
            }
            if let Some(i) = [2, 1].iter().position(|&s| s == n) {
                let side = apply_side(all.side_by_side[i], &panels, nb, &acts, nb * ACT_BLOCK, n, m);
                assert_eq!(bits(&side), bits(&out), "{dtype:?}: {n} rows side by side");
            }
            let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32() as f64;
            for (r, x) in xs.iter().enumerate() {
                for o in 0..m {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for (b, &(da, y, s)) in x.iter().enumerate() {
                        let blk = &w.bytes()[(o * nb + b) * bb..][..bb];
                        let q = &blk[2 * heads..];
                        let level = |t: usize| match dtype {
                            DType::Q8_0 => q[t] as i8 as i64,
                            DType::Q4_0 => ((q[t % 16] >> (4 * (t / 16))) & 15) as i64 - 8,
                            _ => ((q[t % 16] >> (4 * (t / 16))) & 15) as i64,
                        };
                        let i: i64 = (0..QK).map(|t| level(t) * y[t] as i64).sum();
                        let mut term = f16(blk) * da * i as f64;
                        if heads == 2 {
                            term += f16(&blk[2..]) * s;
                        }
                        (exact, mag) = (exact + term, mag + term.abs());
                    }
                    let got = out[r * m + o] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-6 * mag,
                        "{dtype:?}, {n} rows: row {r}, output {o}: {got} against {exact}"
                    );
                }
            }
        }
    }
}

/// MXFP4 panels (AVX-512 only; elsewhere MXFP4 stays row-major): each output against
/// the exact (f64) sum `Σ_b 2^(e−128)·da·Σ kvalue·y`, exponents 0 to 254 included, for 8,
/// 4, 2 and 1 rows; four panels side by side give 2 rows and 1 the same bits.
#[test]
fn mxfp4_panels_match_the_exact_sum() {
    let Some(all) = kernels(DType::Mxfp4) else { return };
    let (mut rng, (m, k)) = (Rng::new(5), (64, 320));
    let nb = k / QK;
    // Random levels; exponents around 120, with the extremes in the first blocks.
    let mut w = vec![0u8; m * nb * 17];
    for (i, blk) in w.chunks_exact_mut(17).enumerate() {
        blk[0] = match i % 40 {
            0 => 0,
            1 => 1,
            2 => 2,
            3 => 140,
            _ => 116 + (rng.next_u64() % 8) as u8,
        };
        for q in &mut blk[1..] {
            *q = (rng.next_u64() & 0xFF) as u8;
        }
    }
    let mut panels = vec![0u8; w.len()];
    repack(DType::Mxfp4, &w, m, k, &mut panels);
    for (n, f) in [8, 4, 2, 1].into_iter().zip(all.rows) {
        let mut acts = vec![0u8; n * nb * ACT_BLOCK];
        let mut xs: Vec<Vec<(f64, [i8; QK])>> = Vec::new();
        for dst in acts.chunks_exact_mut(nb * ACT_BLOCK) {
            let mut b = zeroed_blocks::<BlockQ8_0>(nb);
            crate::q8_0::quantize(&rng.vec(k, 1.0), &mut b);
            pack_act(DType::Mxfp4, blocks_as_bytes(&b), dst);
            xs.push(b.iter().map(|b| (b.d.to_f32() as f64, b.qs)).collect());
        }
        let mut out = vec![0f32; n * m];
        for p in 0..m / ROWS {
            // SAFETY: a whole panel, `n` packed rows, `n` rows of `m` outputs.
            unsafe {
                f(
                    panels[p * ROWS * nb * 17..].as_ptr(),
                    nb,
                    acts.as_ptr(),
                    nb * ACT_BLOCK,
                    out.as_mut_ptr().add(p * ROWS),
                    m,
                )
            };
        }
        if let Some(i) = [2, 1].iter().position(|&s| s == n) {
            let side = apply_side(all.side_by_side[i], &panels, nb, &acts, nb * ACT_BLOCK, n, m);
            assert_eq!(bits(&side), bits(&out), "MXFP4: {n} rows side by side");
        }
        for (r, x) in xs.iter().enumerate() {
            for o in 0..m {
                let (mut exact, mut mag) = (0f64, 0f64);
                for (b, &(da, y)) in x.iter().enumerate() {
                    let blk = &w[(o * nb + b) * 17..][..17];
                    let level = |t: usize| crate::mxfp4::KVALUES[((blk[1 + t % 16] >> (4 * (t / 16))) & 15) as usize];
                    let i: i64 = (0..QK).map(|t| level(t) as i64 * y[t] as i64).sum();
                    let term = crate::mxfp4::e8m0_half(blk[0]) as f64 * da * i as f64;
                    (exact, mag) = (exact + term, mag + term.abs());
                }
                let got = out[r * m + o] as f64;
                assert!(
                    (got - exact).abs() <= 1e-6 * mag,
                    "MXFP4, {n} rows: row {r}, output {o}: {got} against {exact}"
                );
            }
        }
    }
}

/// Q4_K and Q5_K: each output against the exact (f64) sum of llama.cpp's products
/// per block, `d·da·Σ_j sc_j·Σ q·y − dmin·da·Σ_j m_j·Σ y` (Q5_K's q with its high bit
/// from `qh`), within f32 rounding of the terms' magnitudes, for 8, 4, 2 and 1 rows and
/// four panels side by side for 2 rows and 1.
#[test]
fn the_q4_k_and_q5_k_kernels_match_the_exact_sum() {
    use crate::q4_k::get_scale_min_k4;
    use crate::q8_k::{BlockQ8K, quantize};
    for (dtype, saturated) in [DType::Q4_K, DType::Q5_K].into_iter().flat_map(|d| [(d, false), (d, true)]) {
        let Some(fns) = kernels(dtype) else { return };
        let (pool, mut rng) = (pool(), Rng::new(4));
        let (m, k) = (64, 768);
        let nb = k / QK_K;
        let (bb, qs) = if dtype == DType::Q5_K { (176, 48) } else { (144, 16) };
        let w = weight(&pool, &mut rng, dtype, m, k);
        let w = if saturated { saturate(&w, bb, 4..bb, 0xFF) } else { w };
        let mut panels = vec![0u8; w.byte_len()];
        repack(dtype, w.bytes(), m, k, &mut panels);
        let exact = |o: usize, x: &[BlockQ8K]| {
            let (mut sum, mut mag) = (0f64, 0f64);
            for (b, y) in x.iter().enumerate() {
                let blk = &w.bytes()[(o * nb + b) * bb..][..bb];
                let f16 = |at: usize| half::f16::from_le_bytes([blk[at], blk[at + 1]]).to_f32() as f64;
                let (d, dmin, da) = (f16(0), f16(2), y.d as f64);
                let scales: &[u8; 12] = blk[4..16].try_into().unwrap();
                for j in 0..8 {
                    let (sc, mn) = get_scale_min_k4(j, scales);
                    let (mut qy, mut sy) = (0i64, 0i64);
                    for t in 0..32 {
                        let v = 32 * j + t;
                        let mut q = (blk[qs + 32 * (v / 64) + v % 32] >> (4 * (v % 64 / 32))) & 15;
                        if dtype == DType::Q5_K {
                            q |= ((blk[16 + v % 32] >> (v / 32)) & 1) << 4;
                        }
                        (qy, sy) = (qy + q as i64 * y.qs[v] as i64, sy + y.qs[v] as i64);
                    }
                    let (a, b) = (d * da * (sc as i64 * qy) as f64, dmin * da * (mn as i64 * sy) as f64);
                    (sum, mag) = (sum + a - b, mag + a.abs() + b.abs());
                }
            }
            (sum, mag)
        };
        let check = |what: &str, out: &[f32], xs: &[Vec<BlockQ8K>]| {
            for (r, x) in xs.iter().enumerate() {
                for o in 0..m {
                    let ((want, mag), got) = (exact(o, x), out[r * m + o] as f64);
                    assert!((got - want).abs() <= 1e-6 * mag, "{what}: row {r}, output {o}: {got} against {want}");
                }
            }
        };
        let pack = |rng: &mut Rng, n: usize| {
            let (mut acts, mut xs) = (vec![0u8; n * nb * ACT_K], Vec::new());
            for dst in acts.chunks_exact_mut(nb * ACT_K) {
                let mut b = zeroed_blocks::<BlockQ8K>(nb);
                quantize(&if saturated { vec![1.0; k] } else { rng.vec(k, 1.0) }, &mut b);
                pack_act(dtype, blocks_as_bytes(&b), dst);
                xs.push(b);
            }
            (acts, xs)
        };
        for (n, f) in [8, 4, 2, 1].into_iter().zip(fns.rows) {
            let (acts, xs) = pack(&mut rng, n);
            let out = apply(f, &panels, nb, &acts, nb * ACT_K, n, m);
            check(&format!("{dtype:?} (saturated: {saturated}), {n} rows"), &out, &xs);
        }
        for (n, f) in [2, 1].into_iter().zip(fns.side_by_side) {
            let (acts, xs) = pack(&mut rng, n);
            let out = apply_side(f, &panels, nb, &acts, nb * ACT_K, n, m);
            check(&format!("{dtype:?} (saturated: {saturated}) side by side, {n} rows"), &out, &xs);
        }
    }
}

/// Q6_K: each output against the exact (f64) sum of llama.cpp's products per block,
/// `d·da·Σ_g sc_g·Σ (q − 32)·y`, within f32 rounding of the terms' magnitudes, for 8,
/// 4, 2 and 1 rows and four panels side by side for 2 rows and 1.
#[test]
fn the_q6_k_kernels_match_the_exact_sum() {
    use crate::q6_k::{BlockQ6K, unpack};
    use crate::q8_k::{BlockQ8K, quantize};
    let Some(fns) = kernels(DType::Q6_K) else { return };
    for saturated in [false, true] {
        let (pool, mut rng) = (pool(), Rng::new(5));
        let (m, k) = (64, 768);
        let nb = k / QK_K;
        let w = weight(&pool, &mut rng, DType::Q6_K, m, k);
        let w = if saturated { saturate(&w, 210, 0..208, 0xFF) } else { w };
        let mut panels = vec![0u8; w.byte_len()];
        repack(DType::Q6_K, w.bytes(), m, k, &mut panels);
        let blocks = cast_blocks::<BlockQ6K>(w.bytes()).unwrap();
        let exact = |o: usize, x: &[BlockQ8K]| {
            let (mut sum, mut mag) = (0f64, 0f64);
            for (b, y) in x.iter().enumerate() {
                let blk = &blocks[o * nb + b];
                let q = unpack(blk);
                for g in 0..16 {
                    let qy: i64 = (16 * g..16 * g + 16).map(|v| q[v] as i64 * y.qs[v] as i64).sum();
                    let term = blk.d.to_f32() as f64 * y.d as f64 * (blk.scales[g] as i64 * qy) as f64;
                    (sum, mag) = (sum + term, mag + term.abs());
                }
            }
            (sum, mag)
        };
        let check = |what: &str, out: &[f32], xs: &[Vec<BlockQ8K>]| {
            for (r, x) in xs.iter().enumerate() {
                for o in 0..m {
                    let ((want, mag), got) = (exact(o, x), out[r * m + o] as f64);
                    assert!((got - want).abs() <= 1e-6 * mag, "{what}: row {r}, output {o}: {got} against {want}");
                }
            }
        };
        let pack = |rng: &mut Rng, n: usize| {
            let (mut acts, mut xs) = (vec![0u8; n * nb * ACT_K6], Vec::new());
            for dst in acts.chunks_exact_mut(nb * ACT_K6) {
                let mut b = zeroed_blocks::<BlockQ8K>(nb);
                quantize(&if saturated { vec![1.0; k] } else { rng.vec(k, 1.0) }, &mut b);
                pack_act(DType::Q6_K, blocks_as_bytes(&b), dst);
                xs.push(b);
            }
            (acts, xs)
        };
        for (n, f) in [8, 4, 2, 1].into_iter().zip(fns.rows) {
            let (acts, xs) = pack(&mut rng, n);
            let out = apply(f, &panels, nb, &acts, nb * ACT_K6, n, m);
            check(&format!("(saturated: {saturated}) {n} rows"), &out, &xs);
        }
        for (n, f) in [2, 1].into_iter().zip(fns.side_by_side) {
            let (acts, xs) = pack(&mut rng, n);
            let out = apply_side(f, &panels, nb, &acts, nb * ACT_K6, n, m);
            check(&format!("(saturated: {saturated}) side by side, {n} rows"), &out, &xs);
        }
    }
}

/// Where the AVX-512 panel kernels run, the AVX2 ones give every format's rows their
/// bits exactly: 8, 4, 2 and 1 rows, and four panels side by side for 2 rows and 1, on random and on
/// saturated weights (the largest integer sums the narrow AVX2 sums must hold).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx2_kernels_give_the_avx512_bits() {
    use crate::{q8_0, q8_1, q8_k};
    if crate::QuantKernel::best().decode_fn(DType::Q4_0).is_none() {
        return; // no AVX-512 kernels to compare with here
    }
    let (pool, mut rng) = (pool(), Rng::new(6));
    let m = 64;
    for dtype in FORMATS.into_iter().chain([DType::Mxfp4]) {
        let (wide, narrow) = (
            kernels(dtype).unwrap(),
            match dtype {
                DType::Q4_0 => avx2::kernels::<{ imp::Q4_0 }>(),
                DType::Q4_1 => avx2::kernels::<{ imp::Q4_1 }>(),
                DType::Q8_0 => avx2::kernels::<{ imp::Q8_0 }>(),
                DType::Q4_K => avx2::kernels::<{ imp::Q4_K }>(),
                DType::Q5_K => avx2::kernels::<{ imp::Q5_K }>(),
                DType::Mxfp4 => avx2::kernels::<{ imp::MXFP4 }>(),
                _ => avx2::kernels::<{ imp::Q6_K }>(),
            },
        );
        let k = whole(dtype, 768);
        let (nb, row_bytes) = (k / dtype.block_size(), dtype.bytes_for(k).unwrap());
        let ab = act_bytes(dtype);
        for saturated in [false, true] {
            let w = weight(&pool, &mut rng, dtype, m, k);
            let bb = row_bytes / nb;
            // Every byte but the scales `d` (and Q4_1's `m`, the K-quants' `dmin`).
            let levels = match dtype {
                DType::Q6_K => 0..208,
                DType::Q4_1 | DType::Q4_K | DType::Q5_K => 4..bb,
                DType::Mxfp4 => 1..bb,
                _ => 2..bb,
            };
            // MXFP4's largest level is nibble 7 (12, stored as 24).
            let fill = if dtype == DType::Mxfp4 { 0x77 } else { 0xFF };
            let w = if saturated { saturate(&w, bb, levels, fill) } else { w };
            let mut panels = vec![0u8; w.byte_len()];
            repack(dtype, w.bytes(), m, k, &mut panels);
            let mut acts = vec![0u8; 8 * nb * ab];
            for dst in acts.chunks_exact_mut(nb * ab) {
                let x = if saturated { vec![1.0; k] } else { rng.vec(k, 1.0) };
                match dtype {
                    DType::Q4_1 => {
                        let mut b = zeroed_blocks::<q8_1::BlockQ8_1>(nb);
                        q8_1::quantize(&x, &mut b);
                        pack_act(dtype, blocks_as_bytes(&b), dst);
                    }
                    DType::Q4_K | DType::Q5_K | DType::Q6_K => {
                        let mut b = zeroed_blocks::<q8_k::BlockQ8K>(nb);
                        q8_k::quantize(&x, &mut b);
                        pack_act(dtype, blocks_as_bytes(&b), dst);
                    }
                    _ => {
                        let mut b = zeroed_blocks::<q8_0::BlockQ8_0>(nb);
                        q8_0::quantize(&x, &mut b);
                        pack_act(dtype, blocks_as_bytes(&b), dst);
                    }
                }
            }
            let run = |k: &Kernels| {
                let rows = [8, 4, 2, 1].into_iter().zip(k.rows);
                let mut outs: Vec<_> = rows.map(|(n, f)| bits(&apply(f, &panels, nb, &acts, nb * ab, n, m))).collect();
                let side = [2, 1].into_iter().zip(k.side_by_side);
                outs.extend(side.map(|(n, f)| bits(&apply_side(f, &panels, nb, &acts, nb * ab, n, m))));
                outs
            };
            assert_eq!(run(&narrow), run(&wide), "{dtype:?}, saturated: {saturated}");
        }
    }
}

/// Kernel `f` over every panel of `panels` (`m` rows of `nb` blocks) against the
/// first `n` packed rows of `acts`, `stride` bytes apart: `n` rows of `m` outputs.
fn apply(f: PanelFn, panels: &[u8], nb: usize, acts: &[u8], stride: usize, n: usize, m: usize) -> Vec<f32> {
    let panel_bytes = panels.len() / (m / ROWS);
    assert!(acts.len() >= n * stride);
    let mut out = vec![0f32; n * m];
    for p in 0..m / ROWS {
        // SAFETY: a whole panel, `n` packed rows, `n` rows of `m` outputs.
        unsafe { f(panels[p * panel_bytes..].as_ptr(), nb, acts.as_ptr(), stride, out.as_mut_ptr().add(p * ROWS), m) };
    }
    out
}

/// Side-by-side kernel `f` over the first four panels of `panels` (`m` rows) against
/// the first `n` packed rows of `acts`, `stride` bytes apart: each row's 64 outputs,
/// `m` apart.
fn apply_side(f: SideFn, panels: &[u8], nb: usize, acts: &[u8], stride: usize, n: usize, m: usize) -> Vec<f32> {
    let panel_bytes = panels.len() / (m / ROWS);
    assert!(m >= 4 * ROWS && acts.len() >= n * stride);
    let mut out = vec![0f32; n * m];
    // SAFETY: four whole panels one panel apart, `n` packed rows, their 64 outputs a
    // row `m` apart.
    unsafe { f(panels.as_ptr(), panel_bytes, nb, acts.as_ptr(), stride, out.as_mut_ptr(), ROWS, m) };
    out
}

/// `w` with every byte in `levels` of each `bb`-byte block set (the largest levels,
/// scales and mins the format holds; Q6_K's scales all −1), so that the kernels'
/// narrow integer sums meet their largest magnitudes.
fn saturate(w: &HostTensor, bb: usize, levels: std::ops::Range<usize>, fill: u8) -> HostTensor {
    let mut b = w.bytes().to_vec();
    for blk in b.chunks_exact_mut(bb) {
        blk[levels.clone()].fill(fill);
    }
    HostTensor::new(Arc::new(AlignedBytes::from_slice(&b)), 0, b.len(), w.dtype, w.shape.clone())
}
