//! Verifies that a .pptx an agent produced is a deck PowerPoint can open, and
//! reads back the text of each slide so a caller can check what it says.
//!
//! The checks, in order, each with its own [`PptxError`] variant:
//! the bytes are a zip and every entry unpacks to its recorded CRC;
//! `[Content_Types].xml` exists, parses, and declares the presentation main
//! part; `ppt/presentation.xml` and its relationships exist and parse; the
//! slides are the `p:sldIdLst` entries resolved through those relationships,
//! in that order (not the order of file names); each slide part exists and
//! parses; and there is at least one slide.
//!
//! ```no_run
//! let deck = skillbox_pptx::verify_file("out/deck.pptx")?;
//! assert!(deck.contains(1, "WorkspaceX"));
//! # Ok::<(), skillbox_pptx::PptxError>(())
//! ```

mod error;
mod package;
mod presentation;
mod xml;

use std::path::Path;

pub use error::PptxError;

use package::Package;
use presentation::{CONTENT_TYPES_PART, PRESENTATION_PART, PRESENTATION_RELS_PART};

/// A deck that verified: its slides in presentation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deck {
    pub slides: Vec<Slide>,
}

/// One slide of a verified deck.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slide {
    /// 1-based position in the deck.
    pub number: usize,
    /// The zip path of the slide's XML, e.g. `ppt/slides/slide1.xml`.
    pub part: String,
    /// The text of every `a:t` run, in document order, empty runs included.
    pub texts: Vec<String>,
}

impl Slide {
    /// The run texts joined with `'\n'`.
    pub fn text(&self) -> String {
        self.texts.join("\n")
    }
}

impl Deck {
    pub fn slide_count(&self) -> usize {
        self.slides.len()
    }

    /// Slide `number`, counting from 1.
    pub fn slide(&self, number: usize) -> Option<&Slide> {
        number
            .checked_sub(1)
            .and_then(|index| self.slides.get(index))
    }

    /// The run texts of slide `number` (from 1) joined with `'\n'`; empty if
    /// there is no such slide.
    pub fn text_of(&self, number: usize) -> String {
        self.slide(number).map(Slide::text).unwrap_or_default()
    }

    /// Whether slide `number` (from 1) shows `needle`. The needle may span
    /// runs: a word styled in two halves is two runs but one piece of text.
    pub fn contains(&self, number: usize, needle: &str) -> bool {
        self.slide(number)
            .is_some_and(|s| s.text().contains(needle) || s.texts.concat().contains(needle))
    }
}

/// Bounds on the work one verification may do, since the deck comes from
/// untrusted code and a zip can unpack to far more than its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Total unpacked bytes over all entries, media included.
    pub max_unpacked_bytes: u64,
    /// Unpacked bytes of one XML part held in memory to parse it.
    pub max_part_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_unpacked_bytes: 1 << 30,
            max_part_bytes: 64 << 20,
        }
    }
}

/// Verifies `bytes` as a .pptx with the default [`Limits`].
pub fn verify(bytes: &[u8]) -> Result<Deck, PptxError> {
    verify_with_limits(bytes, Limits::default())
}

/// Reads and verifies the .pptx at `path` with the default [`Limits`].
pub fn verify_file(path: impl AsRef<Path>) -> Result<Deck, PptxError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| PptxError::Read {
        path: path.to_owned(),
        source,
    })?;
    verify(&bytes)
}

/// Verifies `bytes` as a .pptx, stopping at the first failed check.
pub fn verify_with_limits(bytes: &[u8], limits: Limits) -> Result<Deck, PptxError> {
    let mut package = Package::open(bytes, limits)?;

    let content_types = package
        .read_part(CONTENT_TYPES_PART)?
        .ok_or(PptxError::MissingContentTypes)?;
    presentation::check_content_types(&content_types)?;

    let main = package
        .read_part(PRESENTATION_PART)?
        .ok_or(PptxError::MissingPresentation)?;
    let rel_ids = presentation::slide_rel_ids(&main)?;
    if rel_ids.is_empty() {
        return Err(PptxError::NoSlides);
    }
    let rels = package
        .read_part(PRESENTATION_RELS_PART)?
        .ok_or(PptxError::MissingPresentationRels)?;
    let rels = presentation::presentation_relationships(&rels)?;

    let mut slides = Vec::with_capacity(rel_ids.len());
    for (index, rel_id) in rel_ids.iter().enumerate() {
        let number = index + 1;
        let part = presentation::slide_part(&rels, number, rel_id)?;
        let Some(xml) = package.read_part(&part)? else {
            return Err(PptxError::MissingSlide {
                number,
                rel_id: rel_id.clone(),
                part,
            });
        };
        slides.push(presentation::read_slide(number, part, &xml)?);
    }
    Ok(Deck { slides })
}
