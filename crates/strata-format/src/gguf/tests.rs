use super::*;
use strata_quant::ReadF32;
use strata_tensor::tensor::AlignedBytes;

/// Builds GGUF bytes for tests.
#[derive(Default)]
struct Builder {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
    version: u32,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl Builder {
    fn new() -> Self {
        Builder { version: 3, ..Default::default() }
    }

    /// A key with raw value bytes of type `ty`.
    fn kv(mut self, key: &str, ty: u32, value: &[u8]) -> Self {
        string(&mut self.kv, key);
        self.kv.extend_from_slice(&ty.to_le_bytes());
        self.kv.extend_from_slice(value);
        self.n_kv += 1;
        self
    }

    fn kv_str(self, key: &str, v: &str) -> Self {
        let mut b = Vec::new();
        string(&mut b, v);
        self.kv(key, 8, &b)
    }

    /// An f32 tensor with GGML dims `ne`, placed at the next 32-byte boundary.
    fn tensor(mut self, name: &str, ne: &[u64], ty: u32, data: &[u8]) -> Self {
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        string(&mut self.infos, name);
        self.infos.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in ne {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&ty.to_le_bytes());
        self.infos.extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        self.data.extend_from_slice(data);
        self.n_tensors += 1;
        self
    }

    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        out.extend_from_slice(&self.infos);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend_from_slice(&self.data);
        out
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn valid() -> Builder {
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&2u64.to_le_bytes());
    string(&mut arr, "a");
    string(&mut arr, "bc");
    // array of arrays of i32: [[1, -2]]
    let mut nested = 9u32.to_le_bytes().to_vec();
    nested.extend_from_slice(&1u64.to_le_bytes());
    nested.extend_from_slice(&5u32.to_le_bytes());
    nested.extend_from_slice(&2u64.to_le_bytes());
    nested.extend_from_slice(&1i32.to_le_bytes());
    nested.extend_from_slice(&(-2i32).to_le_bytes());
    Builder::new()
        .kv_str("general.architecture", "llama")
        .kv("u8", 0, &[7])
        .kv("i8", 1, &[0xff])
        .kv("u16", 2, &513u16.to_le_bytes())
        .kv("i16", 3, &(-3i16).to_le_bytes())
        .kv("u32", 4, &70000u32.to_le_bytes())
        .kv("i32", 5, &(-70000i32).to_le_bytes())
        .kv("f32", 6, &1.5f32.to_le_bytes())
        .kv("bool", 7, &[1])
        .kv("arr", 9, &arr)
        .kv("nested", 9, &nested)
        .kv("u64", 10, &(1u64 << 40).to_le_bytes())
        .kv("i64", 11, &(-1i64 << 40).to_le_bytes())
        .kv("f64", 12, &0.25f64.to_le_bytes())
        .tensor("w", &[3, 2], 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
        .tensor("q", &[32], 8, &[0x11; 34])
        .tensor("b", &[4], 1, &[0, 0x3c, 0, 0x40, 0, 0, 0, 0xc0])
}

fn parse_bytes(b: &[u8]) -> Result<GgufFile, FormatError> {
    GgufFile::parse(Arc::new(AlignedBytes::from_slice(b)), Path::new("t.gguf"))
}

fn err_of(b: &[u8]) -> String {
    match parse_bytes(b) {
        Ok(_) => panic!("parsed"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn parses_every_value_type_and_tensor() {
    let f = parse_bytes(&valid().build()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.get_str("general.architecture"), Some("llama"));
    assert_eq!(f.get("u8"), Some(&GgufValue::U8(7)));
    assert_eq!(f.get("i8"), Some(&GgufValue::I8(-1)));
    assert_eq!(f.get_u64("u16"), Some(513));
    assert_eq!(f.get_i64("i16"), Some(-3));
    assert_eq!(f.get_u64("i16"), None);
    assert_eq!(f.get_u64("u32"), Some(70000));
    assert_eq!(f.get_i64("i32"), Some(-70000));
    assert_eq!(f.get_f32("f32"), Some(1.5));
    assert_eq!(f.get_bool("bool"), Some(true));
    let arr = f.get_array("arr").unwrap();
    assert_eq!(arr.iter().map(|v| v.as_str().unwrap()).collect::<Vec<_>>(), ["a", "bc"]);
    assert_eq!(
        f.get("nested"),
        Some(&GgufValue::Array(vec![GgufValue::Array(vec![GgufValue::I32(1), GgufValue::I32(-2)])]))
    );
    assert_eq!(f.get_u64("u64"), Some(1 << 40));
    assert_eq!(f.get_i64("i64"), Some(-1 << 40));
    assert_eq!(f.get_f32("f64"), Some(0.25));
    let w = f.tensor("w").unwrap();
    assert_eq!((w.dtype, w.shape.clone()), (DType::F32, vec![2, 3]));
    assert_eq!(w.as_f32(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let q = f.tensor("q").unwrap();
    assert_eq!((q.dtype, q.shape.clone(), q.bytes().len()), (DType::Q8_0, vec![32], 34));
    assert_eq!(f.tensor("b").unwrap().to_f32_vec(), [1.0, 2.0, 0.0, -2.0]);
    assert_eq!(f.infos.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["w", "q", "b"]);
    assert!(f.data_start.is_multiple_of(32));
}

#[test]
fn version_2_and_custom_alignment() {
    let mut b = valid().kv("general.alignment", 4, &64u32.to_le_bytes());
    b.version = 2;
    // Re-lay the data at 64-byte offsets: one tensor at offset 0 is enough.
    b.infos.clear();
    b.data.clear();
    b.n_tensors = 0;
    let b = b.tensor("w", &[2], 0, &f32_bytes(&[1.0, 2.0]));
    let mut bytes = b.build();
    // The header must be padded to 64, not 32.
    let hdr_end = bytes.len() - 8;
    let pad = hdr_end.next_multiple_of(64) - hdr_end;
    bytes.splice(hdr_end..hdr_end, std::iter::repeat_n(0u8, pad));
    let f = parse_bytes(&bytes).unwrap();
    assert_eq!((f.version, f.alignment), (2, 64));
    assert_eq!(f.tensor("w").unwrap().as_f32(), &[1.0, 2.0]);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid().build();
    for n in 0..bytes.len() {
        let err = err_of(&bytes[..n]);
        assert!(err.contains("t.gguf") && err.contains("at byte"), "prefix {n}: {err}");
    }
}

#[test]
fn rejects_hostile_headers() {
    let good = valid().build();
    let patch = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    assert!(err_of(&patch(0, b"GGUG")).contains("magic"));
    assert!(err_of(&patch(4, &1u32.to_le_bytes())).contains("version 1"));
    assert!(err_of(&patch(4, &3u32.to_be_bytes())).contains("big-endian"));
    assert!(err_of(&patch(4, &9u32.to_le_bytes())).contains("version 9"));
    let e = err_of(&patch(8, &u64::MAX.to_le_bytes()));
    assert!(e.contains("tensor count") && e.contains("at byte 8"), "{e}");
    assert!(err_of(&patch(16, &(1u64 << 40).to_le_bytes())).contains("metadata count"));
    // First key's length.
    let e = err_of(&patch(24, &(u64::MAX - 3).to_le_bytes()));
    assert!(e.contains("length") && e.contains("at byte 24"), "{e}");

    let arr = |elem: u32, len: u64| {
        let mut v = elem.to_le_bytes().to_vec();
        v.extend_from_slice(&len.to_le_bytes());
        Builder::new().kv("a", 9, &v).build()
    };
    assert!(err_of(&arr(4, 1 << 61)).contains("array length"));
    assert!(err_of(&arr(8, u64::MAX)).contains("array length"));
    assert!(err_of(&arr(77, 1)).contains("unknown array element type 77"));
    // Arrays nested deeper than the cap.
    let mut deep = Vec::new();
    for _ in 0..20 {
        deep.extend_from_slice(&9u32.to_le_bytes());
        deep.extend_from_slice(&1u64.to_le_bytes());
    }
    deep.extend_from_slice(&0u32.to_le_bytes());
    deep.extend_from_slice(&0u64.to_le_bytes());
    let e = err_of(&Builder::new().kv("deep", 9, &deep).build());
    assert!(e.contains("nested"), "{e}");
    assert!(err_of(&Builder::new().kv("x", 13, &[0; 8]).build()).contains("unknown value type 13"));
    assert!(err_of(&Builder::new().kv("b", 7, &[2]).build()).contains("bool"));
    assert!(err_of(&Builder::new().kv("s", 8, &[1, 0, 0, 0, 0, 0, 0, 0, 0xff]).build()).contains("UTF-8"));
    let dup = Builder::new().kv("k", 0, &[1]).kv("k", 0, &[2]).build();
    assert!(err_of(&dup).contains("twice"));
    let align = Builder::new().kv("general.alignment", 4, &3u32.to_le_bytes()).build();
    assert!(err_of(&align).contains("alignment"));
}

#[test]
fn rejects_bad_tensors() {
    let one = |ne: &[u64], ty: u32, data: &[u8]| Builder::new().tensor("t", ne, ty, data).build();
    let e = err_of(&one(&[4], 0, &[0; 8]));
    assert!(e.contains("past the end") && e.contains("`t`"), "{e}");
    let e = err_of(&one(&[4], 5, &[0; 16]));
    assert!(e.contains("`t`") && e.contains("GGML type 5"), "{e}");
    assert!(err_of(&one(&[4], 99, &[0; 16])).contains("type 99"));
    assert!(err_of(&one(&[u64::MAX, 4], 0, &[0; 16])).contains("larger than the file"));
    assert!(err_of(&one(&[1 << 40, 1 << 40], 0, &[0; 16])).contains("larger than the file"));
    assert!(err_of(&one(&[], 0, &[])).contains("dimensions"));
    assert!(err_of(&one(&[1, 1, 1, 1, 1], 0, &[0; 4])).contains("dimensions"));
    assert!(err_of(&one(&[16], 8, &[0; 34])).contains("whole number"));
    // Offset past the end, and a misaligned offset.
    let mut b = Builder::new().tensor("t", &[2], 0, &[0; 8]);
    let off_at = b.infos.len() - 8;
    b.infos[off_at..].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(err_of(&b.build()).contains("past the end"));
    b.infos[off_at..].copy_from_slice(&4u64.to_le_bytes());
    assert!(err_of(&b.build()).contains("not a multiple of the alignment"));
    b.infos[off_at..].copy_from_slice(&u64::MAX.to_le_bytes().map(|x| x & 0xe0));
    let e = err_of(&b.build());
    assert!(e.contains("overflows") || e.contains("past the end"), "{e}");
    let dup = Builder::new().tensor("t", &[2], 0, &[0; 8]).tensor("t", &[2], 0, &[0; 8]).build();
    assert!(err_of(&dup).contains("twice"));
}

/// Counts that claim more table entries than a file of that size may allocate parsed
/// are refused at the count, naming the table and its offset (the files are small:
/// the bound is a multiple of their size).
#[test]
fn tables_may_not_take_many_times_the_file() {
    // 2000 tensor infos claimed, and the bytes they need present (zeros).
    let mut b = Builder::new().build();
    b[8..16].copy_from_slice(&2000u64.to_le_bytes());
    b.resize(b.len() + 2000 * 33, 0);
    let e = err_of(&b);
    assert!(e.contains("at byte 8: the tensor table: 2000 entries would take"), "{e}");
    assert!(e.contains(&format!("this {}-byte file may allocate", b.len())), "{e}");
    // An array of 20000 u8 values: 20 kB in the file, 32 bytes each parsed.
    let mut arr = 0u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&20000u64.to_le_bytes());
    arr.resize(arr.len() + 20000, 1);
    let e = err_of(&Builder::new().kv("tokenizer.ggml.token_type", 9, &arr).build());
    assert!(e.contains("at byte 65: metadata `tokenizer.ggml.token_type`: an array: 20000 entries"), "{e}");
    // A real vocabulary beside its weights stays far below the bound.
    assert!(parse_bytes(&valid().build()).is_ok());
}

#[test]
fn random_mutations_never_panic() {
    let good = valid().build();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut parsed = 0;
    for _ in 0..2000 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % b.len() as u64) as usize;
            b[at] ^= 1 << (next() % 8);
        }
        if let Ok(f) = parse_bytes(&b) {
            parsed += 1;
            for t in f.tensors.values() {
                assert_eq!(Some(t.bytes().len()), t.dtype.bytes_for(t.numel()));
            }
        }
    }
    // Flips in tensor data and metadata values still parse; header flips do not.
    assert!(parsed > 0 && parsed < 2000, "{parsed}");
}
