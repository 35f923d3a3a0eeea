//! The one error type of this crate: every way a .pptx can fail verification.
//!
//! Messages are read by the model that wrote the deck, so each says what is
//! wrong and what to change, in terms of the script rather than of the zip.

use std::io;
use std::path::PathBuf;

/// Why a .pptx did not verify.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PptxError {
    /// [`crate::verify_file`] could not read the file at all.
    #[error("could not read `{path}`: {source}; check that the script wrote the deck to this path")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "the file is empty (0 bytes): the deck was never written into it; make sure the script \
         awaits the write, e.g. `await pptx.writeFile({{ fileName }})`, before it exits"
    )]
    Empty,

    #[error(
        "the file is not a zip archive ({detail}), and a .pptx is always one; write the deck \
         with the library's own save call, e.g. `await pptx.writeFile({{ fileName }})`, instead \
         of writing text, JSON or base64 to the file"
    )]
    NotZip { detail: String },

    #[error(
        "the file starts like a zip but its end is missing or damaged ({detail}), so it was \
         probably cut short; make sure the script awaits the write, e.g. \
         `await pptx.writeFile({{ fileName }})`, before it exits, and that nothing else writes \
         to the file"
    )]
    TruncatedZip { detail: String },

    #[error(
        "zip entry `{entry}` is corrupt ({detail}); regenerate the deck instead of editing or \
         patching its bytes"
    )]
    CorruptEntry { entry: String, detail: String },

    #[error(
        "the deck unpacks to more than {limit} bytes, past what is accepted; use fewer or \
         smaller images and media"
    )]
    TooLarge { limit: u64 },

    #[error(
        "`{part}` unpacks to more than {limit} bytes, past what is accepted for one XML part; \
         put less content on each slide"
    )]
    PartTooLarge { part: String, limit: u64 },

    #[error(
        "`[Content_Types].xml` is missing from the zip, so no program can tell what its parts \
         are; generate the deck with a presentation library (e.g. pptxgenjs) instead of zipping \
         files by hand"
    )]
    MissingContentTypes,

    #[error(
        "`[Content_Types].xml` does not declare `/ppt/presentation.xml` as `{}`, so PowerPoint \
         will not open the file as a presentation; generate the deck with a presentation \
         library (e.g. pptxgenjs) instead of writing this part by hand",
        crate::presentation::MAIN_CONTENT_TYPE
    )]
    MissingMainContentType,

    #[error(
        "`ppt/presentation.xml` is missing from the zip, so this is not a presentation; \
         generate the deck with a presentation library (e.g. pptxgenjs)"
    )]
    MissingPresentation,

    #[error(
        "`ppt/_rels/presentation.xml.rels` is missing from the zip, so the slides listed in \
         `ppt/presentation.xml` cannot be found; generate the deck with a presentation library \
         (e.g. pptxgenjs) instead of assembling its parts by hand"
    )]
    MissingPresentationRels,

    /// `[Content_Types].xml`, `ppt/presentation.xml` or its rels is not XML.
    #[error(
        "`{part}` is not well-formed XML ({detail}); regenerate the deck instead of editing this part"
    )]
    InvalidXml { part: String, detail: String },

    #[error(
        "the slide list in `ppt/presentation.xml` is broken: {detail}; regenerate the deck \
         instead of editing its parts"
    )]
    BrokenSlideList { detail: String },

    #[error(
        "slide {number} is listed in `ppt/presentation.xml` (relationship `{rel_id}`) but its \
         part `{part}` is not in the zip; regenerate the deck instead of removing files from it"
    )]
    MissingSlide {
        number: usize,
        rel_id: String,
        part: String,
    },

    #[error(
        "slide {number} (`{part}`) is not well-formed XML ({detail}); if the script writes raw \
         XML for this slide, escape `&`, `<` and `>` in its text, otherwise regenerate the deck"
    )]
    InvalidSlideXml {
        number: usize,
        part: String,
        detail: String,
    },

    #[error(
        "the deck has no slides; add at least one, e.g. `pptx.addSlide()`, before writing the file"
    )]
    NoSlides,
}

impl PptxError {
    /// A stable kebab-case code for this kind of failure, for wire formats and
    /// metrics; the message may be reworded, the code is not.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Read { .. } => "read-failed",
            Self::Empty => "empty-file",
            Self::NotZip { .. } => "not-zip",
            Self::TruncatedZip { .. } => "truncated-zip",
            Self::CorruptEntry { .. } => "corrupt-entry",
            Self::TooLarge { .. } => "too-large",
            Self::PartTooLarge { .. } => "part-too-large",
            Self::MissingContentTypes => "missing-content-types",
            Self::MissingMainContentType => "missing-main-content-type",
            Self::MissingPresentation => "missing-presentation",
            Self::MissingPresentationRels => "missing-presentation-rels",
            Self::InvalidXml { .. } => "invalid-xml",
            Self::BrokenSlideList { .. } => "broken-slide-list",
            Self::MissingSlide { .. } => "missing-slide",
            Self::InvalidSlideXml { .. } => "invalid-slide-xml",
            Self::NoSlides => "no-slides",
        }
    }
}
