//! One skill: a folder with `SKILL.md` (YAML front matter, then markdown) and any other
//! files. Read straight from the host: listing skills needs no sandbox.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// The file that makes a folder a skill.
pub const SKILL_FILE: &str = "SKILL.md";
/// Largest SKILL.md read (published ones are a few KiB; a description at most 1024
/// characters).
pub const MAX_SKILL_MD: u64 = 1024 * 1024;

/// A SKILL.md that is not one: the file, the line when one is known, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkillError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for SkillError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for SkillError {}

/// What a skill's front matter says about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkillMeta {
    pub name: String,
    /// What it does and when to use it (what a model reads to choose it).
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// `allowed-tools`: a list, or one string of names separated by commas or spaces.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_tools: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, Value>,
    /// Keys the format does not define, kept as written.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Value>,
}

/// A parsed SKILL.md: its front matter and the markdown after it.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillDoc {
    pub meta: SkillMeta,
    pub body: String,
}

fn error(file: &Path, line: Option<usize>, message: impl Into<String>) -> SkillError {
    SkillError {
        file: file.to_path_buf(),
        line,
        message: message.into(),
    }
}

/// A valid skill name: what its folder may be called in a sandbox path too.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn string_field(
    file: &Path,
    line: usize,
    map: &serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<String>, SkillError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // A YAML scalar that is not a string (a version number as a license, say).
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(other) => Err(error(
            file,
            Some(line),
            format!("{key}: give a string, not {}", kind_of(other)),
        )),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The line (1-based, in the file) where `key:` starts in the front matter, if found.
fn key_line(front: &str, first: usize, key: &str) -> usize {
    front
        .lines()
        .position(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))
        .map_or(first, |i| first + i)
}

/// Parses `text`, the content of `file`.
pub fn parse(file: &Path, text: &str) -> Result<SkillDoc, SkillError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let opening = lines.next().unwrap_or("");
    if opening.trim_end() != "---" {
        return Err(error(
            file,
            Some(1),
            "SKILL.md starts with a `---` line, then YAML front matter (name, description), then `---`",
        ));
    }
    let mut front = String::new();
    let mut closed_at = None;
    let mut consumed = opening.len();
    for (i, line) in lines.enumerate() {
        consumed += line.len();
        let bare = line.trim_end();
        if bare == "---" || bare == "..." {
            closed_at = Some(i + 2);
            break;
        }
        front.push_str(line);
    }
    let Some(closed_at) = closed_at else {
        return Err(error(
            file,
            Some(1),
            "the front matter opened on line 1 is never closed with a `---` line",
        ));
    };
    let body = text[consumed..].to_string();
    // The front matter's first line is line 2 of the file.
    let first = 2;
    let value: Value = if front.trim().is_empty() {
        Value::Null
    } else {
        yaml_serde::from_str(&front).map_err(|e| {
            let line = e.location().map(|l| l.line() + first - 1);
            let message = e.to_string();
            let message = match message.rsplit_once(" at line ") {
                Some((head, _)) => head.to_string(),
                None => message,
            };
            error(file, line, format!("front matter: {message}"))
        })?
    };
    let Value::Object(map) = value else {
        return Err(error(
            file,
            Some(first),
            format!(
                "the front matter is {}; give a mapping with name and description",
                kind_of(&value)
            ),
        ));
    };
    let line = |key: &str| key_line(&front, first, key);
    let name = string_field(file, line("name"), &map, "name")?.ok_or_else(|| {
        error(
            file,
            Some(closed_at),
            "no name in the front matter (name: my-skill)",
        )
    })?;
    if !valid_name(&name) {
        return Err(error(
            file,
            Some(line("name")),
            format!(
                "name {name:?}: use letters, digits, -, _ and ., at most 64, not starting with . or -"
            ),
        ));
    }
    let description = string_field(file, line("description"), &map, "description")?
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            error(
                file,
                Some(closed_at),
                "no description in the front matter: say what the skill does and when to use it",
            )
        })?;
    let license = string_field(file, line("license"), &map, "license")?;
    let allowed_tools = match map.get("allowed-tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => s
            .split([',', ' '])
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(error(
                    file,
                    Some(line("allowed-tools")),
                    format!(
                        "allowed-tools: each item is a string, not {}",
                        kind_of(other)
                    ),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(error(
                file,
                Some(line("allowed-tools")),
                format!(
                    "allowed-tools: give a list or a string, not {}",
                    kind_of(other)
                ),
            ));
        }
    };
    let metadata = match map.get("metadata") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(m)) => m.clone().into_iter().collect(),
        Some(other) => {
            return Err(error(
                file,
                Some(line("metadata")),
                format!("metadata: give a mapping, not {}", kind_of(other)),
            ));
        }
    };
    let known = [
        "name",
        "description",
        "license",
        "allowed-tools",
        "metadata",
    ];
    let extra = map
        .into_iter()
        .filter(|(k, _)| !known.contains(&k.as_str()))
        .collect();
    Ok(SkillDoc {
        meta: SkillMeta {
            name,
            description,
            license,
            allowed_tools,
            metadata,
            extra,
        },
        body,
    })
}

/// Reads and parses `<dir>/SKILL.md`.
pub fn read(dir: &Path) -> Result<SkillDoc, SkillError> {
    use std::io::Read;
    let file = dir.join(SKILL_FILE);
    // Never through a link: a SKILL.md that is one is not read.
    let opened = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&file)
    }
    .map_err(|e| error(&file, None, e.to_string()))?;
    let mut text = String::new();
    opened
        .take(MAX_SKILL_MD + 1)
        .read_to_string(&mut text)
        .map_err(|e| error(&file, None, format!("cannot read it as UTF-8 text: {e}")))?;
    if text.len() as u64 > MAX_SKILL_MD {
        return Err(error(
            &file,
            None,
            format!("larger than {MAX_SKILL_MD} bytes"),
        ));
    }
    parse(&file, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<SkillDoc, SkillError> {
        parse(Path::new("skills/x/SKILL.md"), text)
    }

    #[test]
    fn front_matter_in_the_shapes_published_skills_use() {
        let doc = parsed(
            "---\nname: pdf-tools\ndescription: >\n  Fill, merge and split PDF files.\n  Use when the user hands over a PDF.\nlicense: Apache-2.0\nallowed-tools: Bash, Read Write\nmetadata:\n  version: 1.2\n  author: someone\nhomepage: https://example.invalid\n---\n# PDF tools\n\nbody\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(doc.meta.name, "pdf-tools");
        assert_eq!(
            doc.meta.description,
            "Fill, merge and split PDF files. Use when the user hands over a PDF."
        );
        assert_eq!(doc.meta.license.as_deref(), Some("Apache-2.0"));
        assert_eq!(doc.meta.allowed_tools, ["Bash", "Read", "Write"]);
        assert_eq!(doc.meta.metadata["author"], "someone");
        assert_eq!(doc.meta.extra["homepage"], "https://example.invalid");
        assert_eq!(doc.body, "# PDF tools\n\nbody\n");
        let listed = parsed("\u{feff}---\r\nname: a\r\ndescription: |\r\n  two\r\n  lines\r\nallowed-tools: [Bash]\r\n---\r\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(listed.meta.description, "two\nlines");
        assert_eq!(listed.meta.allowed_tools, ["Bash"]);
    }

    #[test]
    fn each_malformed_shape_names_its_line() {
        let cases = [
            ("# no front matter\n", Some(1), "starts with a `---` line"),
            ("---\nname: a\ndescription: b\n", Some(1), "never closed"),
            ("---\nname: a\n---\n", Some(3), "no description"),
            ("---\ndescription: b\n---\n", Some(3), "no name"),
            (
                "---\nname: ../etc\ndescription: b\n---\n",
                Some(2),
                "name \"../etc\"",
            ),
            (
                "---\nname: a\ndescription: b\n  bad: [\n---\n",
                Some(4),
                "front matter:",
            ),
            ("---\n- a\n- b\n---\n", Some(2), "a list"),
            (
                "---\nname: a\ndescription: b\nmetadata: 3\n---\n",
                Some(4),
                "metadata",
            ),
            (
                "---\nname: [a]\ndescription: b\n---\n",
                Some(2),
                "name: give a string",
            ),
        ];
        for (text, line, words) in cases {
            let e = parsed(text)
                .err()
                .unwrap_or_else(|| panic!("parsed: {text:?}"));
            assert_eq!(e.line, line, "{e} for {text:?}");
            assert!(e.message.contains(words), "{e} for {text:?}");
            assert!(e.to_string().starts_with("skills/x/SKILL.md:"), "{e}");
        }
    }
}
