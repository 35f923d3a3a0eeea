//! The CLI's value parsers: durations and sizes (from the protocol's units), limits that `none` lifts, and backend kinds.

pub use skillbox_protocol::units::{parse_duration, parse_size};

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

/// `--workspace-root PATH`: where the workspace is in every sandbox.
pub fn parse_root(text: &str) -> Result<skillbox_protocol::WorkspaceRoot, String> {
    skillbox_protocol::WorkspaceRoot::new(text).map_err(|e| e.to_string())
}

/// `--backend NAME` where code needs a boundary: a kind other than `host`, which is
/// refused with the message every door gives.
pub fn sandboxed_parser()
-> impl clap::builder::TypedValueParser<Value = skillbox_protocol::SandboxedKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let kinds = skillbox_protocol::SandboxedKind::ALL
        .map(|kind| PossibleValue::new(kind.as_str()).help(kind.kind().boundary().describe()));
    // `host` is taken by the parser so that its refusal is the doors' own message.
    let kinds = kinds
        .into_iter()
        .chain([PossibleValue::new("host").hide(true)]);
    PossibleValuesParser::new(kinds).try_map(|name| {
        let kind = name
            .parse::<skillbox_env::BackendKind>()
            .map_err(|e| e.to_string())?;
        skillbox_protocol::SandboxedKind::try_from(kind).map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
