//! XXH3-64 checksums, as the `.cawsf` `checksum_index` and the flat manifest record them:
//! lowercase hex of the 64-bit hash (16 digits).

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// The XXH3-64 of `bytes` (seed 0) as 16 lowercase hex digits.
pub fn hex(bytes: &[u8]) -> String {
    format!("{:016x}", xxh3_64(bytes))
}

/// A streaming XXH3-64, for data written or read in pieces.
#[derive(Default, Clone)]
pub struct Hasher(Xxh3);

impl Hasher {
    pub fn new() -> Self {
        Hasher(Xxh3::new())
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    /// The hash so far as 16 lowercase hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0.digest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_equals_one_shot_and_matches_the_reference_value() {
        // XXH3-64 of the empty input with seed 0 (the xxHash reference value).
        assert_eq!(hex(b""), "2d06800538d394c2");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut h = Hasher::new();
        for chunk in data.chunks(333) {
            h.update(chunk);
        }
        assert_eq!(h.hex(), hex(&data));
    }
}
