//! Skills that ship with skillbox: a SKILL.md (the system prompt) and, for the demo and
//! the tests, a loopback transcript that replays a real model's session.

/// A skill: what the model is told, and its scripted session.
#[derive(Debug, Clone, Copy)]
pub struct Skill {
    pub name: &'static str,
    /// SKILL.md: the system prompt.
    pub instructions: &'static str,
    /// The loopback transcript (JSON), if the skill ships one.
    pub transcript: Option<&'static str>,
    /// A successful run must leave at least one file with this extension (verified).
    pub requires: Option<&'static str>,
}

/// The names of the built-in skills.
pub const SKILL_NAMES: &[&str] = &["pptx"];

/// A built-in skill by name.
pub fn builtin_skill(name: &str) -> Option<Skill> {
    match name {
        "pptx" => Some(Skill {
            name: "pptx",
            instructions: include_str!("../../../skills/pptx/SKILL.md"),
            transcript: Some(include_str!("../../../skills/pptx/loopback.json")),
            requires: Some(".pptx"),
        }),
        _ => None,
    }
}
