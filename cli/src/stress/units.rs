//! Byte counts as people write them: `4096`, `64MiB`, `1.5G`, `512kB`.

/// Parses a byte count: a number, optionally fractional, then an optional
/// unit. `K`/`M`/`G`/`T` and `KiB`/`MiB`/`GiB`/`TiB` are powers of 1024;
/// `kB`/`MB`/`GB`/`TB` are powers of 1000; `B` or nothing is bytes. Units
/// ignore case. The message of an error says what was expected.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = unit.trim();
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}` (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"
            ));
        }
    };
    if number.is_empty() {
        return Err(format!("`{text}` is not a byte count (like 4096 or 64MiB)"));
    }
    let bytes = if number.contains('.') {
        let value: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a byte count (like 4096 or 64MiB)"))?;
        let bytes = value * scale as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(format!("`{text}` is too large"));
        }
        bytes.round() as u64
    } else {
        let value: u64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a byte count (like 4096 or 64MiB)"))?;
        value
            .checked_mul(scale)
            .ok_or_else(|| format!("`{text}` is too large"))?
    };
    Ok(bytes)
}

/// A byte count for people: `512 B`, `4.0 KiB`, `63.9 MiB`, `1.50 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_suffixes_are_understood() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("64m"), Ok(64 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("2 kB"), Ok(2000));
        assert_eq!(parse_bytes("7B"), Ok(7));
    }

    #[test]
    fn malformed_counts_are_refused_with_a_message() {
        for bad in ["", "MiB", "12XB", "1.2.3M", "-4", "99999999999999999999T"] {
            let error = parse_bytes(bad).expect_err(bad);
            assert!(!error.is_empty());
        }
    }

    #[test]
    fn counts_print_in_the_largest_fitting_unit() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(64 << 20), "64.0 MiB");
        assert_eq!(format_bytes(300 << 20), "300 MiB");
    }
}
