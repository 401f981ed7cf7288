//! Byte sizes as users write and read them (`16MiB`, `1.5 GiB`): the one parser and
//! formatter that every layer's options use.

/// Bytes from `123`, `16MiB`, `2G`, `1.5 GiB`, `512k`, `0`.
///
/// Units are case-insensitive, with an optional space before them: `B`; `K`/`KB`, `M`/`MB`,
/// `G`/`GB`, `T`/`TB` (powers of 1000); `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024).
/// Decimals are exact (no floating point); a fraction of a byte is dropped.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("a size cannot be empty".to_string());
    }
    if t.starts_with('-') {
        return Err(format!("`{t}`: a size cannot be negative"));
    }
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u128 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        other => {
            return Err(format!("`{t}`: unknown size unit `{other}` (B, K, M, G, T, KiB, MiB, GiB, TiB)"));
        }
    };
    let not_a_size = || format!("`{t}` is not a size (bytes, or a number with K, M, G, KiB, MiB, GiB...)");
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(not_a_size());
    }
    let too_large = || format!("`{t}` is too large (at most {} bytes)", u64::MAX);
    // Twenty digits already exceed u64::MAX; more would overflow the u128 below.
    let int_digits = int.trim_start_matches('0');
    if int_digits.len() > 20 {
        return Err(too_large());
    }
    let int: u128 = if int_digits.is_empty() { 0 } else { int_digits.parse().map_err(|_| not_a_size())? };
    // Digits past the 18th are below a billionth of a byte even at TiB scale.
    let frac = &frac[..frac.len().min(18)];
    let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| not_a_size())? };
    let bytes = int * scale + frac_value * scale / 10u128.pow(frac.len() as u32);
    u64::try_from(bytes).map_err(|_| too_large())
}

/// `1.5 GiB`, `110.4 KiB`, `12 B`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_size_accepts_the_documented_syntax() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("512B").unwrap(), 512);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("16 mib").unwrap(), 16 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("2gb").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("512k").unwrap(), 512_000);
        assert_eq!(parse_size("1T").unwrap(), 1_000_000_000_000);
        assert_eq!(parse_size("1TiB").unwrap(), 1 << 40);
        assert_eq!(parse_size("1.5GiB").unwrap(), 1_610_612_736);
        assert_eq!(parse_size(" 1.5 GiB ").unwrap(), 1_610_612_736);
        assert_eq!(parse_size("0.5K").unwrap(), 500);
        assert_eq!(parse_size(".5K").unwrap(), 500);
        assert_eq!(parse_size("3.").unwrap(), 3);
        // A fraction of a byte is dropped.
        assert_eq!(parse_size("1.9").unwrap(), 1);
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_size("0000000000000000000000001K").unwrap(), 1000);
    }

    #[test]
    fn parse_size_rejects_junk_negatives_and_overflow() {
        for bad in ["", "  ", "lots", "G", ".", "1.2.3", "1..2", "1e3", "+5", "5 G B", "1.5XB", "0x10"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_size("-1").unwrap_err().contains("negative"));
        assert!(parse_size("-1GiB").unwrap_err().contains("negative"));
        assert!(parse_size("18446744073709551616").unwrap_err().contains("too large"));
        assert!(parse_size("17000000TiB").unwrap_err().contains("too large"));
        assert!(parse_size("99999999999999999999999999999999999999999").unwrap_err().contains("too large"));
        assert!(parse_size("5 XB").unwrap_err().contains("unknown size unit"));
    }
}
