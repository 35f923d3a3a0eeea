//! Which of a run's files are handed back (`outputs` in `POST /v1/run`, `--outputs` on the
//! CLI). By default: every file with no path component that starts with `.`, so a script
//! cannot hand back `.git/config`, `.envrc` or `.bashrc` to be written into a checkout or
//! a home directory unless the caller asked for exactly that. With globs: the files they
//! match, where a wildcard never matches a leading `.` (as in a shell) and `**` never
//! enters a hidden directory, so a hidden file is selected only by a pattern that spells
//! its dot.
//!
//! Pattern syntax, per `/`-separated component: `*` (any characters), `?` (one
//! character), `**` as a whole component (any number of components), anything else
//! literal.

use std::fmt;

/// Most globs a request may carry.
pub const MAX_OUTPUT_GLOBS: usize = 64;
/// Longest glob, in bytes.
pub const MAX_GLOB_LEN: usize = 1024;

/// A glob that is not one; says which and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidGlob {
    pub glob: String,
    pub reason: &'static str,
}

impl fmt::Display for InvalidGlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.glob, self.reason)
    }
}

impl std::error::Error for InvalidGlob {}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// `**`: zero or more components, none hidden.
    AnyDepth,
    /// One component, with `*` and `?`.
    Component(Vec<char>),
}

/// The selection a run's files are filtered through, on the way into the store and again
/// on the way out to a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputSelection {
    globs: Vec<(String, Vec<Part>)>,
}

impl OutputSelection {
    /// Every file with no hidden component.
    pub fn visible() -> Self {
        OutputSelection::default()
    }

    /// The files `globs` match; none given is [`visible`](Self::visible).
    pub fn new<S: AsRef<str>>(globs: &[S]) -> Result<Self, InvalidGlob> {
        if globs.len() > MAX_OUTPUT_GLOBS {
            return Err(InvalidGlob {
                glob: format!("{} globs", globs.len()),
                reason: "too many; give at most 64",
            });
        }
        let globs = globs
            .iter()
            .map(|glob| {
                let glob = glob.as_ref();
                Ok((glob.to_string(), parse(glob)?))
            })
            .collect::<Result<_, InvalidGlob>>()?;
        Ok(OutputSelection { globs })
    }

    /// The globs as given.
    pub fn globs(&self) -> impl Iterator<Item = &str> {
        self.globs.iter().map(|(glob, _)| glob.as_str())
    }

    /// Whether the file at `path` (relative, `/`-separated) is handed back.
    pub fn selects(&self, path: &str) -> bool {
        let components: Vec<&str> = path.split('/').collect();
        if self.globs.is_empty() {
            return !components.iter().any(|c| c.starts_with('.'));
        }
        self.globs
            .iter()
            .any(|(_, parts)| matches_parts(parts, &components))
    }
}

fn parse(glob: &str) -> Result<Vec<Part>, InvalidGlob> {
    let invalid = |reason| InvalidGlob {
        glob: glob.to_string(),
        reason,
    };
    if glob.is_empty() {
        return Err(invalid("empty; give a path or a pattern such as *.pptx"));
    }
    if glob.len() > MAX_GLOB_LEN {
        return Err(invalid("longer than 1024 bytes"));
    }
    if glob.starts_with('/') {
        return Err(invalid(
            "absolute; give a pattern relative to /workspace, such as out/*.pptx",
        ));
    }
    if glob.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    glob.split('/')
        .map(|component| match component {
            "" => Err(invalid("has an empty component (//, or a trailing /)")),
            "." | ".." => Err(invalid("has a . or .. component")),
            "**" => Ok(Part::AnyDepth),
            c if c.contains("**") => Err(invalid("** must be a whole component, as in out/**")),
            c => Ok(Part::Component(c.chars().collect())),
        })
        .collect()
}

fn matches_parts(parts: &[Part], components: &[&str]) -> bool {
    match parts.split_first() {
        None => components.is_empty(),
        Some((Part::AnyDepth, rest)) => {
            // Zero components, or one more visible one and try again.
            matches_parts(rest, components)
                || components.split_first().is_some_and(|(first, tail)| {
                    !first.starts_with('.') && matches_parts(parts, tail)
                })
        }
        Some((Part::Component(pattern), rest)) => {
            components.split_first().is_some_and(|(first, tail)| {
                matches_component(pattern, first) && matches_parts(rest, tail)
            })
        }
    }
}

/// One component against one pattern component: a wildcard never takes a leading `.`.
fn matches_component(pattern: &[char], name: &str) -> bool {
    let name: Vec<char> = name.chars().collect();
    if name.first() == Some(&'.') && pattern.first() != Some(&'.') {
        return false;
    }
    wildcard(pattern, &name)
}

/// `*` and `?` matching, iterative with one backtrack point (linear in practice, never
/// exponential however many stars).
fn wildcard(pattern: &[char], name: &[char]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some('?') => {
                p += 1;
                n += 1;
            }
            Some(c) if *c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select(globs: &[&str]) -> OutputSelection {
        OutputSelection::new(globs).unwrap()
    }

    #[test]
    fn by_default_a_hidden_component_anywhere_is_left_out() {
        let all = OutputSelection::visible();
        for path in ["deck.pptx", "out/deck.pptx", "a/b/c.txt", "x.y.z"] {
            assert!(all.selects(path), "{path}");
        }
        for path in [
            ".git/config",
            ".envrc",
            "a/.bashrc",
            "a/.hidden/b.txt",
            ".x",
        ] {
            assert!(!all.selects(path), "{path}");
        }
    }

    #[test]
    fn a_wildcard_never_takes_a_leading_dot() {
        let s = select(&["*", "*/*", "**/*.txt"]);
        assert!(s.selects("deck.pptx"));
        assert!(s.selects("a/b"));
        assert!(s.selects("a/b/c/d.txt"));
        for path in [
            ".envrc",
            ".git/config",
            "a/.b",
            "a/.git/x.txt",
            ".git/hooks/x.txt",
        ] {
            assert!(!s.selects(path), "{path}");
        }
        let s = select(&["?envrc"]);
        assert!(!s.selects(".envrc"));
    }

    #[test]
    fn a_hidden_file_is_selected_by_a_pattern_that_spells_its_dot() {
        let s = select(&[".envrc", "out/.cache/*", ".config/**/*.json"]);
        assert!(s.selects(".envrc"));
        assert!(s.selects("out/.cache/a"));
        assert!(s.selects(".config/x/y/z.json"));
        assert!(s.selects(".config/z.json"));
        assert!(!s.selects(".config/.x/z.json"), "** enters no hidden dir");
        assert!(!s.selects("out/.cache/.b"));
        assert!(!s.selects("deck.pptx"), "globs given: only what they match");
    }

    #[test]
    fn stars_and_question_marks_match_within_one_component() {
        let s = select(&["*.pptx", "report-??.md", "out/*/final*"]);
        assert!(s.selects("deck.pptx"));
        assert!(!s.selects("out/deck.pptx"), "* does not cross /");
        assert!(s.selects("report-01.md"));
        assert!(!s.selects("report-1.md"));
        assert!(s.selects("out/a/final-v2.pdf"));
        assert!(!s.selects("out/a/b/final"));
        assert!(select(&["**"]).selects("a/b/c"));
        assert!(select(&["a/**"]).selects("a/b/c"));
        assert!(!select(&["a/**"]).selects("b/c"));
        assert!(select(&["**/c"]).selects("c"));
        assert!(select(&["*a*b*c*"]).selects("xxaxxbxxcxx"));
        assert!(!select(&["*a*b*c*"]).selects("xxaxxcxxbxx"));
        let many_stars = "*a".repeat(50) + "b";
        assert!(!select(&[many_stars.as_str()]).selects(&"a".repeat(200)));
    }

    #[test]
    fn a_glob_that_is_not_one_is_refused_with_the_reason() {
        for (glob, words) in [
            ("", "empty"),
            ("/etc/*", "absolute"),
            ("a//b", "empty component"),
            ("a/", "empty component"),
            ("../x", ".."),
            ("./x", ".."),
            ("a**", "whole component"),
        ] {
            let err = OutputSelection::new(&[glob]).unwrap_err();
            assert!(err.reason.contains(words), "{glob}: {err}");
            assert_eq!(err.glob, glob);
        }
        let many: Vec<String> = (0..65).map(|i| format!("{i}")).collect();
        assert!(OutputSelection::new(&many).is_err());
        assert!(OutputSelection::new(&["x".repeat(1025)]).is_err());
    }
}
