//! Parsing of the CLI's durations (`500ms`, `30s`, `2m`) and sizes (`256M`, `1G`).

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

/// A limit the user may also lift with `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound(pub Option<u64>);

/// A size, or `none` for no limit.
pub fn parse_size_bound(text: &str) -> Result<Bound, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(Bound(None));
    }
    parse_size(text).map(|n| Bound(Some(n)))
}

/// A count of at least 1, or `none` for no limit.
pub fn parse_count_bound(text: &str) -> Result<Bound, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(Bound(None));
    }
    match text.trim().parse::<u64>() {
        Ok(n) if n >= 1 && n <= u64::from(u32::MAX) => Ok(Bound(Some(n))),
        _ => Err(format!(
            "{text:?}: give a whole number of at least 1, or none"
        )),
    }
}

/// `--backend NAME`: one of the backend kinds, listed in `--help` with what isolates each.
pub fn backend_parser() -> impl clap::builder::TypedValueParser<Value = skillbox_env::BackendKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let kinds = skillbox_env::BackendKind::ALL
        .map(|kind| PossibleValue::new(kind.as_str()).help(kind.boundary().describe()));
    PossibleValuesParser::new(kinds).try_map(|name| name.parse::<skillbox_env::BackendKind>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3 days").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_size_bound("none"), Ok(Bound(None)));
        assert_eq!(parse_size_bound("2G"), Ok(Bound(Some(2 << 30))));
        assert_eq!(parse_count_bound("64"), Ok(Bound(Some(64))));
        assert_eq!(parse_count_bound("none"), Ok(Bound(None)));
        assert!(parse_count_bound("0").is_err());
        assert!(parse_count_bound("-3").is_err());
    }
}
