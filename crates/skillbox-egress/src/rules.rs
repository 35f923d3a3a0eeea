//! A run's network policy: which hosts and ports its code may reach through the proxy.

pub use skillbox_protocol::NetworkPolicy;

/// One entry, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    host: HostPattern,
    port: Ports,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ports {
    One(u16),
    /// 80 and 443: an allow entry without a port.
    Web,
    /// Every port: a deny entry without one.
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// Exactly this name (lower case, no trailing dot).
    Exact(String),
    /// Any name below this domain (`*.example.com`: `a.example.com`,
    /// `a.b.example.com`; not `example.com` itself).
    Below(String),
}

/// A bad entry, named by its field and index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network.{field}[{index}]: {entry:?}: {why}")]
pub struct RuleError {
    pub field: &'static str,
    pub index: usize,
    pub entry: String,
    pub why: String,
}

/// Ports a rule without one allows.
const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// Most entries a policy holds, allow and deny together.
pub const MAX_RULES: usize = 256;

impl Rule {
    /// Parses one allow entry (no port: 80 and 443).
    pub fn parse(entry: &str) -> Result<Rule, String> {
        Rule::parse_with(entry, Ports::Web)
    }

    /// Parses one of a secret's hosts (no port: 443, where its TLS is).
    pub fn parse_secret_host(entry: &str) -> Result<Rule, String> {
        let rule = Rule::parse_with(entry, Ports::One(443))?;
        Ok(rule)
    }

    /// Parses one deny entry (no port: every port).
    pub fn parse_deny(entry: &str) -> Result<Rule, String> {
        Rule::parse_with(entry, Ports::Any)
    }

    fn parse_with(entry: &str, no_port: Ports) -> Result<Rule, String> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err("empty; write a host name such as files.example.org".into());
        }
        if entry.contains("://") || entry.contains('/') {
            return Err(
                "a host, not a URL: write files.example.org or files.example.org:443".into(),
            );
        }
        // An IPv6 literal in brackets, `[::1]` or `[::1]:443`: its canonical form.
        if let Some(bracketed) = entry.strip_prefix('[') {
            let (address, after) = bracketed
                .split_once(']')
                .ok_or("an IPv6 address in brackets: [2001:db8::1] or [2001:db8::1]:443")?;
            let address: std::net::Ipv6Addr = address
                .parse()
                .map_err(|_| format!("{address:?} is not an IPv6 address"))?;
            let port = match after.strip_prefix(':') {
                Some(port) => Ports::One(
                    port.parse()
                        .ok()
                        .filter(|&p| p != 0)
                        .ok_or_else(|| format!("port {port:?} is not a number from 1 to 65535"))?,
                ),
                None if after.is_empty() => no_port,
                None => return Err("an IPv6 address in brackets: [2001:db8::1]:443".into()),
            };
            return Ok(Rule {
                host: HostPattern::Exact(address.to_string()),
                port,
            });
        }
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| format!("port {port:?} is not a number from 1 to 65535"))?;
                (host, Ports::One(port))
            }
            None => (entry, no_port),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let pattern = match host.strip_prefix("*.") {
            Some(domain) => {
                check_name(domain)?;
                HostPattern::Below(domain.to_string())
            }
            None => {
                if host.contains('*') {
                    return Err(
                        "a wildcard is only allowed as the first label: *.example.com".into(),
                    );
                }
                check_name(&host)?;
                HostPattern::Exact(host)
            }
        };
        Ok(Rule {
            host: pattern,
            port,
        })
    }

    /// Whether this rule covers `host` (lower case, no trailing dot) on `port`.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Ports::One(p) => p == port,
            Ports::Web => DEFAULT_PORTS.contains(&port),
            Ports::Any => true,
        };
        port_ok
            && match &self.host {
                // An address literal is compared in its canonical form (`0:0::1` is
                // `::1`).
                HostPattern::Exact(name) => {
                    name == host
                        || host
                            .parse::<std::net::IpAddr>()
                            .is_ok_and(|ip| ip.to_string() == *name)
                }
                HostPattern::Below(domain) => host
                    .strip_suffix(domain.as_str())
                    .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            }
    }
}

/// A host name or an IP literal: labels of letters, digits, `-` and `_`, 253
/// characters at most.
fn check_name(host: &str) -> Result<(), String> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if host.is_empty() || host.len() > 253 {
        return Err("not a host name (1 to 253 characters)".into());
    }
    for label in host.split('.') {
        let fine = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !fine {
            return Err(format!(
                "{label:?} is not a host name label (letters, digits, '-' and '_'; 1 to 63 characters)"
            ));
        }
    }
    Ok(())
}

/// A policy checked once: what the proxy consults for every connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
}

impl Rules {
    /// Checks every entry; the first bad one is named.
    pub fn new(policy: &NetworkPolicy) -> Result<Rules, RuleError> {
        let parse = |field: &'static str, entries: &[String]| {
            let no_port = if field == "deny" {
                Ports::Any
            } else {
                Ports::Web
            };
            entries
                .iter()
                .enumerate()
                .map(|(index, entry)| {
                    Rule::parse_with(entry, no_port).map_err(|why| RuleError {
                        field,
                        index,
                        entry: entry.clone(),
                        why,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let total = policy.allow.len() + policy.deny.len();
        if total > MAX_RULES {
            return Err(RuleError {
                field: "allow",
                index: MAX_RULES,
                entry: String::new(),
                why: format!("{total} entries; a policy holds {MAX_RULES} at most"),
            });
        }
        Ok(Rules {
            allow: parse("allow", &policy.allow)?,
            deny: parse("deny", &policy.deny)?,
        })
    }

    /// No allow entry: the run has no network at all.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
    }

    /// `Ok` when `host:port` may be reached, else why not.
    pub fn check(&self, host: &str, port: u16) -> Result<(), String> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if self.deny.iter().any(|r| r.matches(&host, port)) {
            return Err(format!("{host}:{port} is denied by the run's network.deny"));
        }
        if self.allow.iter().any(|r| r.matches(&host, port)) {
            return Ok(());
        }
        Err(format!(
            "{host}:{port} is not on the run's network.allow (add \"{host}\" or \"{host}:{port}\" to reach it)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        Rules::new(&NetworkPolicy {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn exact_names_wildcards_and_ports() {
        let r = rules(
            &["files.example.org", "*.example.com:8443", "Pypi.Org."],
            &[],
        );
        assert!(r.check("files.example.org", 443).is_ok());
        assert!(r.check("FILES.example.org.", 80).is_ok());
        assert!(
            r.check("files.example.org", 22).is_err(),
            "no port: 80 and 443 only"
        );
        assert!(r.check("a.files.example.org", 443).is_err());
        assert!(r.check("a.example.com", 8443).is_ok());
        assert!(r.check("a.b.example.com", 8443).is_ok());
        assert!(
            r.check("example.com", 8443).is_err(),
            "*. is below the domain only"
        );
        assert!(r.check("badexample.com", 8443).is_err());
        assert!(r.check("a.example.com", 443).is_err());
        assert!(r.check("pypi.org", 443).is_ok());
    }

    #[test]
    fn ipv6_literals_in_brackets_match_in_canonical_form() {
        let r = rules(&["[2001:DB8::1]:8443", "[2001:db8::2]"], &[]);
        assert!(r.check("2001:db8::1", 8443).is_ok());
        assert!(r.check("2001:db8:0:0::1", 8443).is_ok());
        assert!(r.check("2001:db8::1", 443).is_err());
        assert!(r.check("2001:db8::2", 443).is_ok());
        assert!(r.check("2001:db8::3", 443).is_err());
        for bad in ["[2001:db8::1", "[not-v6]:443", "[::1]x", "[::1]:0"] {
            assert!(Rule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn deny_wins_and_nothing_is_allowed_by_default() {
        let r = rules(&["*.example.com"], &["secret.example.com"]);
        assert!(r.check("www.example.com", 443).is_ok());
        let refused = r.check("secret.example.com", 443).unwrap_err();
        assert!(refused.contains("network.deny"), "{refused}");
        // A deny entry without a port denies every port; an allow entry's is 80 and 443.
        let r = rules(&["*.example.com:8080"], &["secret.example.com"]);
        assert!(r.check("www.example.com", 8080).is_ok());
        assert!(r.check("secret.example.com", 8080).is_err());
        let r = rules(&["*.example.com:8080"], &["secret.example.com:443"]);
        assert!(r.check("secret.example.com", 8080).is_ok());
        let none = rules(&[], &[]);
        assert!(none.is_empty());
        let refused = none.check("example.com", 443).unwrap_err();
        assert!(
            refused.contains("not on the run's network.allow"),
            "{refused}"
        );
    }

    #[test]
    fn bad_entries_are_named() {
        for (entry, said) in [
            ("https://example.com", "not a URL"),
            ("example.com/path", "not a URL"),
            ("ex*ample.com", "first label"),
            ("*", "first label"),
            ("example.com:0", "port"),
            ("example.com:http", "port"),
            ("exa mple.com", "label"),
            ("", "empty"),
        ] {
            let err = Rules::new(&NetworkPolicy {
                allow: vec!["ok.example".into(), entry.into()],
                deny: vec![],
            })
            .unwrap_err();
            assert_eq!((err.field, err.index), ("allow", 1), "{entry}");
            assert!(err.to_string().contains(said), "{entry}: {err}");
            assert!(err.to_string().starts_with("network.allow[1]"), "{err}");
        }
        let err = Rules::new(&NetworkPolicy {
            allow: vec![],
            deny: vec!["*.*.x".into()],
        })
        .unwrap_err();
        assert_eq!(err.field, "deny");
    }
}
