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

    /// Whether globs were given: the caller named what it wants, rather than taking
    /// every visible file.
    pub fn is_declared(&self) -> bool {
        !self.globs.is_empty()
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

/// Whether `parts` match `components` exactly. Dynamic programming over the parts, one
/// row of "the parts so far can end just before component `j`" at a time: time
/// O(parts × components) however many `**` a glob has, where trying every way to share the
/// components among the `**` parts took exponential time (`**/` × 12 + `x` against a deep
/// tree held a core for minutes).
fn matches_parts(parts: &[Part], components: &[&str]) -> bool {
    // `reach[j]`: the parts taken so far match `components[..j]`.
    let mut reach = vec![false; components.len() + 1];
    reach[0] = true;
    for part in parts {
        let mut next = vec![false; components.len() + 1];
        match part {
            Part::AnyDepth => {
                // Zero components, or one more visible one after a match.
                next[0] = reach[0];
                for (j, component) in components.iter().enumerate() {
                    next[j + 1] = reach[j + 1] || (next[j] && !component.starts_with('.'));
                }
            }
            Part::Component(pattern) => {
                for (j, component) in components.iter().enumerate() {
                    next[j + 1] = reach[j] && matches_component(pattern, component);
                }
            }
        }
        if !next.contains(&true) {
            return false;
        }
        reach = next;
    }
    reach[components.len()]
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

    /// The matcher as it was before it was made polynomial: every way of sharing the
    /// components among the `**` parts, tried in turn. Exponential, so only for small
    /// cases; it states the semantics the fast matcher must keep.
    fn matches_by_backtracking(parts: &[Part], components: &[&str]) -> bool {
        match parts.split_first() {
            None => components.is_empty(),
            Some((Part::AnyDepth, rest)) => {
                matches_by_backtracking(rest, components)
                    || components.split_first().is_some_and(|(first, tail)| {
                        !first.starts_with('.') && matches_by_backtracking(parts, tail)
                    })
            }
            Some((Part::Component(pattern), rest)) => {
                components.split_first().is_some_and(|(first, tail)| {
                    matches_component(pattern, first) && matches_by_backtracking(rest, tail)
                })
            }
        }
    }

    #[test]
    fn double_stars_at_start_middle_and_end_match_as_before() {
        for (glob, path, expected) in [
            ("**", "a", true),
            ("**", ".a", false),
            ("**/x", "x", true),
            ("**/x", "a/b/x", true),
            ("**/x", "a/.b/x", false),
            ("**/x", "a/b/x/y", false),
            ("a/**/x", "a/x", true),
            ("a/**/x", "a/b/c/x", true),
            ("a/**/x", "b/c/x", false),
            ("a/**", "a", true),
            ("a/**", "a/b/c", true),
            ("a/**", "a/.b", false),
            ("**/**", "a/b", true),
            ("**/**/x", "x", true),
            ("**/**/x", "a/b/c/x", true),
            ("**/*/**/x", "x", false),
            ("**/*/**/x", "a/x", true),
            ("**/*/**/x", "a/b/c/x", true),
            ("**/.b/**", "a/.b/c", true),
            ("**/.b/**", "a/.c/.b/c", false),
            ("**/r*-??.md", "a/b/report-01.md", true),
            ("**/r*-??.md", "a/b/report-1.md", false),
            ("**/*.txt", "a/b/.x.txt", false),
            ("x/**/y/**/z", "x/1/y/2/3/z", true),
            ("x/**/y/**/z", "x/1/2/3/z", false),
        ] {
            let parts = parse(glob).unwrap();
            let components: Vec<&str> = path.split('/').collect();
            assert_eq!(
                matches_parts(&parts, &components),
                expected,
                "{glob} {path}"
            );
            assert_eq!(
                matches_by_backtracking(&parts, &components),
                expected,
                "{glob} {path}"
            );
            assert_eq!(select(&[glob]).selects(path), expected, "{glob} {path}");
        }
    }

    #[test]
    fn every_small_glob_matches_every_small_path_as_backtracking_did() {
        let pieces = ["**", "*", "a", ".a", "?", ".*"];
        let names = ["a", "b", ".a", "ab"];
        let mut globs: Vec<Vec<&str>> = vec![vec![]];
        let mut paths: Vec<Vec<&str>> = vec![vec![]];
        for _ in 0..4 {
            let longer = |all: &[Vec<&'static str>], with: &[&'static str]| {
                all.iter()
                    .filter(|v| v.len() == all.last().map_or(0, Vec::len))
                    .flat_map(|v| {
                        with.iter().map(move |w| {
                            let mut v = v.clone();
                            v.push(*w);
                            v
                        })
                    })
                    .collect::<Vec<_>>()
            };
            globs.extend(longer(&globs, &pieces));
            paths.extend(longer(&paths, &names));
        }
        for glob in globs.iter().filter(|g| !g.is_empty()) {
            let parts = parse(&glob.join("/")).unwrap();
            for components in &paths {
                assert_eq!(
                    matches_parts(&parts, components),
                    matches_by_backtracking(&parts, components),
                    "{glob:?} {components:?}"
                );
            }
        }
    }

    /// With backtracking this took hours; the answers are what the semantics say.
    #[test]
    fn twenty_double_stars_against_sixty_components_give_the_right_answer() {
        let glob = "**/".repeat(20) + "x";
        let s = select(&[glob.as_str()]);
        let deep: Vec<String> = (0..59).map(|i| format!("d{i}")).collect();
        let deep = deep.join("/");
        assert!(s.selects(&format!("{deep}/x")));
        assert!(!s.selects(&format!("{deep}/y")));
        assert!(!s.selects(&format!("{deep}/x/y")));
        assert!(!s.selects(&format!(".{deep}/x")), "** enters no hidden dir");
        let glob = "**/".repeat(20) + "a/" + &"**/".repeat(20) + "x";
        assert!(select(&[glob.as_str()]).selects(&format!("{deep}/a/{deep}/x")));
        assert!(!select(&[glob.as_str()]).selects(&format!("{deep}/{deep}/x")));
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
