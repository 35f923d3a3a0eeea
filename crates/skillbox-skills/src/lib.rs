//! Skills: folders with a `SKILL.md` (YAML front matter, then markdown) and any files,
//! living on the host and run inside the sandbox.
//!
//! - [`skill`]: one SKILL.md, parsed; every error names the file and the line.
//! - [`SkillSet`]: the skills of a workspace, the staged marketplace ones and the
//!   user's, read straight from the host (no sandbox, no backend).
//! - [`stage`]: a marketplace archive (tar, zip, a local git repository) written to
//!   `<workspace>/.skills-cache/<source>/`, only what changed, checked and bounded first.
//! - [`projection`]: the workspace's skill roots placed in a sandbox as one tree, and
//!   not again while nothing changed.

pub mod projection;
pub mod skill;

mod catalog;
mod stage;

pub use catalog::{SKILLS_CACHE, Skill, SkillSet, Source, Sources, USER_SOURCE, WORKSPACE_SKILLS};
pub use projection::{
    Applied, DEFAULT_ROOTS, HashCache, Projection, ProjectionConfig, apply, fingerprint_in, plan,
    plan_skills,
};
pub use skill::{SKILL_FILE, SkillDoc, SkillError, SkillMeta};
pub use stage::{Archive, StageError, StageLimits, StageReport, stage};
