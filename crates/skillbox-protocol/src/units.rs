//! The units people write in flags and manifests: durations (`500ms`, `30s`, `2m`, `1h`)
//! and sizes (`256M`, `1G`).

use std::time::Duration;

/// `500ms`, `30s`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (try 500ms, 30s, 2m)"))?;
    let millis = match unit {
        "ms" => value,
        "" | "s" => value * 1000.0,
        "m" => value * 60_000.0,
        "h" => value * 3_600_000.0,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    if !(millis.is_finite() && millis >= 1.0) {
        return Err(format!("{text:?}: must be at least 1ms"));
    }
    Ok(Duration::from_millis(millis as u64))
}

/// `4096`, `512K`, `256M`, `1G` (powers of 1024; a trailing `B`/`iB` is allowed).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let upper = trimmed.to_ascii_uppercase();
    let upper = upper.trim_end_matches("IB").trim_end_matches('B');
    let split = upper
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(upper.len());
    let (number, unit) = upper.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{trimmed:?} is not a size (try 256M, 1G)"))?;
    let factor: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("{trimmed:?}: unknown unit {unit:?} (use K, M, G)")),
    };
    let bytes = value * factor as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{trimmed:?}: out of range"));
    }
    Ok(bytes as u64)
}
