//! The launch shapes and kernel choices, as pure functions.

use super::*;

#[test]
fn glu_fuses_packed_pairs_of_one_kind_on_the_matvec() {
    let (shape, other) = ([96usize, 64], [64usize, 96]);
    let q4 = WeightKind { dtype: DType::Q4_0, shape: &shape, packed: true };
    let decode = [1usize, 1, 1];
    assert!(fuses_glu(q4, q4, &decode, true));
    // A verifying sequence's rows (up to MATVEC_MAX_ROWS) stay on the matvec too.
    assert!(fuses_glu(q4, q4, &[1, MATVEC_MAX_ROWS, 1], true));
    // A prompt chunk takes the GEMM, unless there is no GEMM (or rows must not vary).
    assert!(!fuses_glu(q4, q4, &[1, MATVEC_MAX_ROWS + 1], true));
    assert!(fuses_glu(q4, q4, &[1, MATVEC_MAX_ROWS + 1], false));
    // Both packed, of one format and one shape.
    assert!(!fuses_glu(q4, WeightKind { packed: false, ..q4 }, &decode, true));
    assert!(!fuses_glu(WeightKind { packed: false, ..q4 }, q4, &decode, true));
    assert!(!fuses_glu(q4, WeightKind { dtype: DType::Q8_0, ..q4 }, &decode, true));
    assert!(!fuses_glu(q4, WeightKind { shape: &other, ..q4 }, &decode, true));
}

#[test]
fn a_product_adds_into_the_residual_when_packed_and_on_the_matvec() {
    let shape = [96usize, 64];
    let q4 = WeightKind { dtype: DType::Q4_K, shape: &shape, packed: true };
    assert!(fuses_add(q4, &[1, 1, 1], true));
    assert!(fuses_add(q4, &[1, MATVEC_MAX_ROWS, 1], true));
    // A prompt chunk takes the GEMM, unless there is none.
    assert!(!fuses_add(q4, &[1, MATVEC_MAX_ROWS + 1], true));
    assert!(fuses_add(q4, &[MATVEC_MAX_ROWS + 1], false));
    // The stored layout runs the unfused ops; so does a 1-D weight.
    assert!(!fuses_add(WeightKind { packed: false, ..q4 }, &[1], true));
    assert!(!fuses_add(WeightKind { shape: &shape[..1], ..q4 }, &[1], true));
}

#[test]
fn products_of_one_input_share_launches_by_format_and_width() {
    let (q, kv, wide) = ([128usize, 64], [32usize, 64], [64usize, 128]);
    let k = |dtype, shape, packed| WeightKind { dtype, shape, packed };
    let decode = [1usize, 1, MATVEC_MAX_ROWS];
    // A layer's q, k and v: one launch.
    let qkv = [k(DType::Q4_K, &q, true), k(DType::Q4_K, &kv, true), k(DType::Q4_K, &kv, true)];
    assert_eq!(multi_groups(&qkv, &decode, true), vec![vec![0, 1, 2]]);
    // A prompt chunk on the GEMM: each alone (but not without a GEMM).
    assert_eq!(multi_groups(&qkv, &[1, MATVEC_MAX_ROWS + 1], true), vec![vec![0], vec![1], vec![2]]);
    assert_eq!(multi_groups(&qkv, &[MATVEC_MAX_ROWS + 1], false), vec![vec![0, 1, 2]]);
    // Q4_K_M's v in Q6_K: q and k share, v runs alone; so does a stored or 1-D weight.
    let mixed = [k(DType::Q4_K, &q, true), k(DType::Q4_K, &kv, true), k(DType::Q6_K, &kv, true)];
    assert_eq!(multi_groups(&mixed, &decode, true), vec![vec![0, 1], vec![2]]);
    let stored = [k(DType::Q4_K, &q, false), k(DType::Q4_K, &kv, true), k(DType::Q4_K, &kv[..1], true)];
    assert_eq!(multi_groups(&stored, &decode, true), vec![vec![0], vec![1], vec![2]]);
    // Another `in`, and a fourth weight of one kind, start groups of their own.
    let four = [qkv[0], k(DType::Q4_K, &wide, true), qkv[1], qkv[2], qkv[2]];
    assert_eq!(multi_groups(&four, &decode, true), vec![vec![0, 2, 3], vec![1], vec![4]]);
    // The grid: each weight's packed blocks, one after the other.
    assert_eq!(matvec_multi(&[128, 32, 33]).grid.0, 16 + 4 + 5);
    assert_eq!(matvec_multi(&[67]), matvec_packed(67));
}

#[test]
fn glu_codes_are_common_cuh_s() {
    assert_eq!(glu_code(Activation::Silu), (0, 0.0, 0.0));
    assert_eq!(glu_code(Activation::GeluTanh).0, 1);
    assert_eq!(glu_code(Activation::Sigmoid).0, 2);
    assert_eq!(glu_code(Activation::SwigluOai { alpha: 1.702, limit: 7.0 }), (3, 1.702, 7.0));
    let common = crate::cuda::kernels::COMMON;
    for (name, code) in [("SILU", 0), ("GELU_TANH", 1), ("SIGMOID", 2), ("SWIGLU_OAI", 3)] {
        assert!(common.contains(&format!("#define STRATA_GLU_{name} {code}u")), "STRATA_GLU_{name}");
    }
}

#[test]
fn one_dimensional_grids_cover_every_element() {
    for n in [1usize, 255, 256, 257, 4096 * 11008] {
        let s = elementwise(n);
        assert!(s.grid.0 as usize * s.block.0 as usize >= n);
        assert!((s.grid.0 as usize - 1) * (s.block.0 as usize) < n);
    }
    // An empty launch still has a valid (non-zero) grid.
    assert_eq!(elementwise(0).grid.0, 1);
}

#[test]
fn row_grids_have_a_row_per_x_and_cover_each_row() {
    assert_eq!(rows(3, 4097), Shape { grid: (3, 17, 1), block: (256, 1, 1) });
    assert_eq!(rows(1, 1).grid, (1, 1, 1));
    assert_eq!(rows(100_000, 256).grid, (100_000, 1, 1));
    // Empty launches still have a valid grid; huge rows cap y (the kernels loop).
    assert_eq!(rows(0, 0).grid, (1, 1, 1));
    assert_eq!(rows(2, 1 << 26).grid.1 as u64, MAX_GRID_Y);
}

#[test]
fn matvec_has_a_warp_per_output_row() {
    let s = matvec(4097);
    assert_eq!(s.block, (256, 1, 1));
    assert_eq!(s.grid.0, 513);
    assert!(s.grid.0 * MATVEC_ROWS_PER_BLOCK >= 4097);
}

#[test]
fn the_wide_matvec_has_a_block_per_output_row() {
    let s = matvec_wide(4097);
    assert_eq!((s.grid, s.block), ((4097, 1, 1), (128, 1, 1)));
    assert_eq!(matvec_wide(0).grid.0, 1);
    assert_eq!(Matvec::Wide.shape(10, false), matvec_wide(10));
    assert_eq!(Matvec::Warp.shape(10, false), matvec(10));
    assert_eq!(Matvec::Wide.kernel("q4_k", false), "matvec_wide_q4_k");
    assert_eq!(Matvec::Warp.kernel("q4_k", false), "matvec_q4_k");
}

#[test]
fn the_packed_matvec_has_two_rows_a_warp_and_falls_back_to_wide() {
    let s = matvec_packed(67);
    assert_eq!((s.grid, s.block), ((9, 1, 1), (128, 1, 1)));
    assert!(s.grid.0 * 2 * (s.block.0 / 32) >= 67);
    assert_eq!(Matvec::Packed.kernel("q4_0", true), "matvec_packed_q4_0");
    assert_eq!(Matvec::Packed.shape(67, true), s);
    // Formats without a packed layout, and streamed units, run the wide kernel.
    assert_eq!(Matvec::Packed.kernel("q4_k", true), "matvec_packed_q4_k");
    assert_eq!(Matvec::Packed.kernel("mxfp4", false), "matvec_wide_mxfp4");
    assert_eq!(Matvec::Packed.kernel("mxfp4", true), "matvec_packed_mxfp4");
    assert_eq!(Matvec::Packed.shape(67, false), matvec_wide(67));
    assert!(Matvec::Packed.packs(DType::Q8_0) && Matvec::Packed.packs(DType::Q4_K));
    assert!(Matvec::Packed.packs(DType::Q6_K) && Matvec::Packed.packs(DType::Q5_K));
    assert!(
        Matvec::Packed.packs(DType::Q4_1) && Matvec::Packed.packs(DType::Q5_0) && Matvec::Packed.packs(DType::Q5_1)
    );
    assert!(Matvec::Packed.packs(DType::Mxfp4) && Matvec::Packed.packs(DType::I8));
    assert!(Matvec::Packed.packs(DType::AffineQ4));
    assert!(!Matvec::Packed.packs(DType::Q8_1) && !Matvec::Packed.packs(DType::F16));
    assert!(!Matvec::Wide.packs(DType::Q4_0));
}

#[test]
fn element_weights_are_read_in_place_when_their_rows_are_16_byte_aligned() {
    let p = Matvec::Packed;
    for d in ALIGNED_FORMATS {
        assert!(p.reads_in_place(d, &[300, 4096], 0x7f00_0000_0100), "{d:?}");
        // A row of f16 whose `in` is not whole units starts unaligned; so does a view
        // at an offset of 8 bytes into a slot.
        assert!(!p.reads_in_place(d, &[300, 4100], 0x7f00_0000_0100), "{d:?}");
        assert!(!p.reads_in_place(d, &[300, 4096], 0x7f00_0000_0108), "{d:?}");
        assert!(!p.reads_in_place(d, &[4096], 0x7f00_0000_0100), "{d:?}");
    }
    // Only element formats (the others are repacked or not read by the packed walk),
    // and only under `packed`.
    assert!(!p.reads_in_place(DType::Q4_0, &[300, 4096], 256));
    assert!(!p.reads_in_place(DType::Q5_K, &[300, 4096], 256));
    assert!(!Matvec::Wide.reads_in_place(DType::F16, &[300, 4096], 256));
    assert_eq!(p.kernel("f16", true), "matvec_packed_f16");
    assert!(!p.packs(DType::F16), "element formats are not repacked");
}

#[test]
fn strata_cuda_attn_takes_group_or_head() {
    assert_eq!(Attn::from_env(None), Ok(Attn::Head));
    assert_eq!(Attn::from_env(Some(" group ")), Ok(Attn::Group));
    assert_eq!(Attn::from_env(Some("head")), Ok(Attn::Head));
    let e = Attn::from_env(Some("kv")).unwrap_err();
    assert!(e.contains("`kv`") && e.contains("`group`"), "{e}");
}

#[test]
fn grouped_attention_takes_few_rows_of_shared_kv_heads() {
    let g = |kv, rows, nh, nkv| Attn::Group.kernel(kv, rows, nh, nkv);
    // Llama-3-8B decode: a block per KV head.
    assert_eq!(g(KvType::F16, 1, 32, 8), AttnKernel { name: "attn_group_f16", heads: 8 });
    assert_eq!(g(KvType::F32, 1, 32, 8).name, "attn_group_f32");
    assert_eq!(g(KvType::Q8_0, 1, 64, 1).name, "attn_group_q8_0");
    // A verifying sequence's rows too, a prompt's not.
    assert_eq!(g(KvType::F32, ATTN_GROUP_MAX_ROWS, 32, 8).heads, 8);
    assert_eq!(g(KvType::F32, ATTN_GROUP_MAX_ROWS + 1, 32, 8), AttnKernel { name: "attn_partial_f32", heads: 32 });
    // MHA, uneven groups and no KV heads keep a block per query head.
    assert_eq!(g(KvType::F16, 1, 32, 32), AttnKernel { name: "attn_partial_f16", heads: 32 });
    assert_eq!(g(KvType::F16, 1, 12, 8).name, "attn_partial_f16");
    assert_eq!(g(KvType::F16, 1, 12, 0).name, "attn_partial_f16");
    // `head` is attn_partial_* everywhere.
    assert_eq!(Attn::Head.kernel(KvType::Q8_0, 1, 32, 8), AttnKernel { name: "attn_partial_q8_0", heads: 32 });
    assert_eq!(attn_partial(1, 8, attn_split(1, 8, 8192, 132)).grid.0, 8);
}

#[test]
fn strata_cuda_matvec_takes_warp_or_wide() {
    assert_eq!(Matvec::from_env(None), Ok(Matvec::Wide));
    assert_eq!(Matvec::from_env(Some("warp")), Ok(Matvec::Warp));
    assert_eq!(Matvec::from_env(Some(" wide ")), Ok(Matvec::Wide));
    assert_eq!(Matvec::from_env(Some("packed")), Ok(Matvec::Packed));
    let e = Matvec::from_env(Some("fast")).unwrap_err();
    assert!(e.contains("`fast`") && e.contains("`wide`"), "{e}");
}

#[test]
fn per_row_kernels_have_a_block_per_row() {
    assert_eq!(rms_norm(7).grid, (7, 1, 1));
    assert_eq!(rope(5, 32, 64), Shape { grid: (5, 32, 1), block: (64, 1, 1) });
    // Partial RoPE: a thread per rotated pair only.
    assert_eq!(rope(5, 32, 16).block, (16, 1, 1));
    assert_eq!(embedding(3).grid.0, 3);
    assert_eq!(sample(2), Shape { grid: (2, 1, 1), block: (1024, 1, 1) });
    assert_eq!(attn_combine(3, 8, 64), Shape { grid: (24, 1, 1), block: (64, 1, 1) });
}

#[test]
fn dequant_grid_is_capped_and_covers_small_tensors() {
    let small = dequant(DType::Q4_0, 32 * 100);
    assert_eq!(small.grid.0, 1);
    let huge = dequant(DType::F16, 8192 * 28672);
    assert_eq!(huge.grid.0 as u64, DEQUANT_MAX_BLOCKS);
}

#[test]
fn attention_splits_cover_the_keys_exactly_once() {
    for (rows, heads, kv, sms) in [(1, 32, 4096, 132), (1, 8, 100, 132), (1, 32, 70_000, 132), (512, 32, 512, 132)] {
        let s = attn_split(rows, heads, kv, sms);
        assert!(s.splits >= 1 && s.splits <= 64, "{s:?}");
        assert!(s.splits * s.split_len >= kv, "{s:?} covers {kv}");
        assert!((s.splits - 1) * s.split_len < kv, "{s:?}: the last split is empty");
        if s.splits > 1 {
            assert_eq!(s.split_len % 64, 0);
            assert!(s.split_len >= 256);
        }
    }
    // Fixed splits: the same boundaries whatever the length.
    for kv in [1, 100, 512, 513, 4096, 70_000] {
        let s = attn_split_fixed(kv);
        assert!(s.splits * s.split_len >= kv && (s.splits - 1) * s.split_len < kv, "{s:?} covers {kv}");
        assert!(s.splits == 1 || s.split_len == ATTN_FIXED_SPLIT, "{s:?}");
    }
    // Decode over a long context splits; prefill with many rows does not.
    assert!(attn_split(1, 32, 8192, 132).splits > 1);
    assert_eq!(attn_split(512, 32, 8192, 132).splits, 1);
    let s = attn_split(1, 32, 8192, 132);
    assert_eq!(attn_partial(1, 32, s).grid, (32, s.splits as u32, 1));
    assert_eq!(attn_partial_len(1, 32, 128, s), 32 * s.splits * 130);
}

#[test]
fn gemm_tiles_bound_the_scratch_and_cover_every_row() {
    // An 8B model's FFN fits in one tile; a 128k vocabulary head does not.
    assert_eq!(gemm_tile_rows(14336, 4096), 8192);
    assert_eq!(gemm_tile_rows(4096, 4096), 4096);
    let t = gemm_tile_rows(128_256, 4096);
    assert!(t * 4096 <= GEMM_TILE_VALUES && t.is_multiple_of(128) && t > 0, "{t}");
    assert!(128_256usize.div_ceil(t) * t >= 128_256);
    assert_eq!(gemm_tile_rows(0, 4096), 1);
    assert!(gemm_tile_rows(10, 1 << 26) >= 1);
}

#[test]
fn every_weight_format_has_kernels() {
    let names = kernel_names();
    for d in WEIGHT_FORMATS {
        let f = format_name(d).unwrap();
        for k in [format!("matvec_{f}"), format!("matvec_wide_{f}"), format!("embed_{f}"), format!("dequant_{f}_f16")] {
            assert!(names.iter().any(|(_, n)| *n == k), "{k}");
        }
    }
    assert_eq!(format_name(DType::Q8_K), None);
}

#[test]
fn rope_store_takes_whole_even_heads_and_q8_0_blocks_inside_a_head() {
    let s = rope_store(KvType::F16, 3, 32, 8, 128).unwrap();
    assert_eq!((s.grid, s.block), ((3, 48, 1), (128, 1, 1)));
    assert!(rope_store(KvType::F32, 1, 4, 4, 512).is_some());
    assert!(rope_store(KvType::F32, 1, 4, 4, 514).is_none(), "wider than the shared memory");
    assert!(rope_store(KvType::F32, 1, 4, 4, 63).is_none(), "odd");
    assert!(rope_store(KvType::Q8_0, 1, 4, 4, 96).is_some());
    assert!(rope_store(KvType::Q8_0, 1, 4, 4, 80).is_none(), "a block across two heads");
    assert!(rope_store(KvType::F16, 1, 4, 4, 80).is_some());
    assert_eq!(rope_store_kernel(KvType::Q8_0), "rope_store_q8_0");
}

#[test]
fn kernel_names_are_exactly_what_the_files_declare() {
    use super::super::kernels;
    let listed = kernel_names();
    let mut declared = Vec::new();
    for f in kernels::FILES {
        for name in kernels::functions(f) {
            assert!(listed.contains(&(f.name, name.clone())), "kernels/{}.cu: `{name}` is not listed", f.name);
            declared.push((f.name, name));
        }
    }
    for entry in &listed {
        assert!(declared.contains(entry), "{entry:?} is listed but no kernel file declares it");
    }
    // 4 kernels per weight format (two matvecs, embedding, dequantisation), 6 per
    // packed format (the fused GLU, add and multi matvecs too), 4 per element format
    // read in place (the packed matvecs), 32 others.
    assert_eq!(listed.len(), 4 * WEIGHT_FORMATS.len() + 6 * PACKED_FORMATS.len() + 4 * ALIGNED_FORMATS.len() + 32);
    assert_eq!(declared.len(), listed.len());
}
