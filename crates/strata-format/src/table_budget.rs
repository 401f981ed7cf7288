//! What parsing a file's tables (tensor infos, metadata arrays, token strings) may
//! allocate: [`BYTES_PER_FILE_BYTE`] bytes per byte of the file, plus [`FLOOR`].
//!
//! A table entry takes more memory parsed than in the file (a one-byte array element
//! becomes a 32-byte value; a tensor info of a few dozen bytes becomes an info and a view
//! of a few hundred), so without a bound a small file whose counts claim many entries
//! makes a parse, an `inspect` or a load take many times its size. Parsers charge each
//! table before allocating it, the claimed count times what one entry takes, and refuse
//! past the bound with an error naming the table and its offset. Real models stay far
//! below it: their tables are a small part of a file that is mostly weights.

/// Table bytes a parse may allocate per byte of the file.
pub const BYTES_PER_FILE_BYTE: u64 = 8;
/// Table bytes any file may take, however small (a file of headers alone).
pub const FLOOR: u64 = 64 << 10;
/// What a B-tree map adds per entry beyond the key and value (nodes of up to 11 entries,
/// two thirds full on average, with their parent links).
pub const MAP_ENTRY_OVERHEAD: u64 = 48;

/// The allocation left to one file's parse.
#[derive(Clone, Debug)]
pub struct TableBudget {
    file_len: u64,
    limit: u64,
    used: u64,
}

impl TableBudget {
    pub fn for_file(file_len: u64) -> Self {
        TableBudget { file_len, limit: file_len.saturating_mul(BYTES_PER_FILE_BYTE).saturating_add(FLOOR), used: 0 }
    }

    /// Takes `n` entries of `each` bytes of `table`, or says why not (the caller names the
    /// offset).
    pub fn take(&mut self, table: &str, n: u64, each: u64) -> Result<(), String> {
        let bytes = n.saturating_mul(each);
        if bytes > self.limit - self.used {
            return Err(format!(
                "{table}: {n} entries would take {bytes} bytes in memory, past the {} bytes that parsing this \
                 {}-byte file may allocate for its tables ({BYTES_PER_FILE_BYTE} per byte of the file plus {FLOOR}; \
                 {} already taken)",
                self.limit, self.file_len, self.used
            ));
        }
        self.used += bytes;
        Ok(())
    }

    /// Bytes taken so far.
    pub fn used(&self) -> u64 {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_up_to_a_multiple_of_the_file_and_names_the_table() {
        let mut b = TableBudget::for_file(1000);
        assert!(b.take("tokens", 10, 100).is_ok());
        assert_eq!(b.used(), 1000);
        let e = b.take("the tensor table", u64::MAX, 2).unwrap_err();
        assert!(e.starts_with("the tensor table: 18446744073709551615 entries") && e.contains("1000-byte file"), "{e}");
        assert!(b.take("rest", 1, BYTES_PER_FILE_BYTE * 1000 + FLOOR - 1000).is_ok());
        assert!(b.take("one more", 1, 1).is_err());
    }
}
