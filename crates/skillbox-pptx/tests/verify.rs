//! Verifies real pptxgenjs decks (committed under `tests/fixtures/`, made by
//! `make_deck.js`) and broken variants of them built here with the zip writer.

use skillbox_pptx::{Limits, PptxError, verify, verify_file, verify_with_limits};
use zip::CompressionMethod;

use helpers::{flip_byte_in, rebuild, rejected, rewrite, texts, unpacked_sizes, without};

/// `pptx.stream({ compression: true })`: every XML entry deflated.
const DEFLATED: &[u8] = include_bytes!("fixtures/workspacex-3-slides.pptx");
/// `pptx.writeFile(...)`, exactly what a model's script does: every entry stored.
const STORED: &[u8] = include_bytes!("fixtures/workspacex-3-slides-stored.pptx");
/// `new PptxGenJS()` written without adding a slide.
const NO_SLIDES: &[u8] = include_bytes!("fixtures/no-slides.pptx");

const SLIDE_1: &[&str] = &["WorkspaceX", "The shared office that runs itself"];
const SLIDE_2: &[&str] = &[
    "Why WorkspaceX",
    "Book a desk in ten seconds",
    "Pay only for the days you use",
    "Meeting rooms in every city",
];
const SLIDE_3: &[&str] = &[
    "Contact us",
    "hello@workspacex.example",
    "+1 555 0100",
    "12 Market Street, Springfield",
];

/// Builders of broken variants; a failure in one is a failure of its test.
#[expect(
    clippy::unwrap_used,
    reason = "test helpers: panicking is how they fail the test"
)]
mod helpers {
    use std::collections::BTreeMap;
    use std::io::{Cursor, Read, Write};

    use skillbox_pptx::{Deck, PptxError, verify};
    use zip::write::SimpleFileOptions;
    use zip::{CompressionMethod, ZipArchive, ZipWriter};

    /// Rewrites the zip in `bytes`, entry by entry in the original order,
    /// through `edit`: it gets each entry's name and data and returns the new
    /// data, or `None` to leave the entry out.
    pub(super) fn rebuild(
        bytes: &[u8],
        mut edit: impl FnMut(&str, Vec<u8>) -> Option<Vec<u8>>,
    ) -> Vec<u8> {
        let mut archive = ZipArchive::new(Cursor::new(bytes)).unwrap();
        let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
        let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
        for index in 0..archive.len() {
            let mut entry = archive.by_index(index).unwrap();
            let name = entry.name().unwrap().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            if entry.is_dir() {
                writer.add_directory(name, options).unwrap();
                continue;
            }
            if let Some(data) = edit(&name, data) {
                writer.start_file(name, options).unwrap();
                writer.write_all(&data).unwrap();
            }
        }
        writer.finish().unwrap().into_inner()
    }

    /// Replaces the one occurrence of `from` in the text entry `name`, so a test
    /// whose edit no longer applies to the fixture fails instead of passing.
    pub(super) fn rewrite(bytes: &[u8], name: &str, from: &str, to: &str) -> Vec<u8> {
        let mut edited = false;
        let out = rebuild(bytes, |entry, data| {
            if entry != name {
                return Some(data);
            }
            let text = String::from_utf8(data).unwrap();
            assert_eq!(text.matches(from).count(), 1, "{from:?} in {name}");
            edited = true;
            Some(text.replacen(from, to, 1).into_bytes())
        });
        assert!(edited, "{name} is not in the fixture");
        out
    }

    pub(super) fn without(bytes: &[u8], name: &str) -> Vec<u8> {
        let mut dropped = false;
        let out = rebuild(bytes, |entry, data| {
            if entry == name {
                dropped = true;
                None
            } else {
                Some(data)
            }
        });
        assert!(dropped, "{name} is not in the fixture");
        out
    }

    /// Each entry's unpacked size, by name.
    pub(super) fn unpacked_sizes(bytes: &[u8]) -> BTreeMap<String, u64> {
        let mut archive = ZipArchive::new(Cursor::new(bytes)).unwrap();
        (0..archive.len())
            .map(|index| {
                let entry = archive.by_index(index).unwrap();
                (entry.name().unwrap().into_owned(), entry.size())
            })
            .collect()
    }

    /// Flips one byte in the middle of entry `name`'s data as stored in the zip.
    pub(super) fn flip_byte_in(bytes: &[u8], name: &str) -> (Vec<u8>, CompressionMethod) {
        let mut archive = ZipArchive::new(Cursor::new(bytes)).unwrap();
        let entry = archive.by_name(name).unwrap();
        let start = usize::try_from(entry.data_start().unwrap()).unwrap();
        let len = usize::try_from(entry.compressed_size()).unwrap();
        let method = entry.compression();
        assert!(len > 16, "{name} is too small to corrupt in the middle");
        let mut out = bytes.to_vec();
        out[start + len / 2] ^= 0x5a;
        (out, method)
    }

    pub(super) fn texts(deck: &Deck, number: usize) -> Vec<&str> {
        deck.slide(number)
            .unwrap()
            .texts
            .iter()
            .map(String::as_str)
            .collect()
    }

    pub(super) fn rejected(bytes: &[u8]) -> PptxError {
        match verify(bytes) {
            Ok(deck) => panic!("accepted a broken deck: {deck:?}"),
            Err(err) => {
                let message = err.to_string();
                assert!(message.len() > 40, "message too thin to act on: {message}");
                err
            }
        }
    }
}

#[test]
fn the_pptxgenjs_deck_verifies_with_each_slides_text_on_its_slide() {
    let deck = verify(DEFLATED).unwrap();
    assert_eq!(deck.slide_count(), 3);
    assert_eq!(texts(&deck, 1), SLIDE_1);
    assert_eq!(texts(&deck, 2), SLIDE_2);
    assert_eq!(texts(&deck, 3), SLIDE_3);
    for (number, slide) in deck.slides.iter().enumerate() {
        assert_eq!(slide.number, number + 1);
        assert_eq!(slide.part, format!("ppt/slides/slide{}.xml", number + 1));
    }

    assert_eq!(
        deck.text_of(1),
        "WorkspaceX\nThe shared office that runs itself"
    );
    assert!(deck.contains(1, "WorkspaceX"));
    assert!(deck.contains(2, "Pay only for the days you use"));
    assert!(deck.contains(3, "hello@workspacex.example"));
    assert!(!deck.contains(1, "hello@workspacex.example"));
    assert!(!deck.contains(3, "Book a desk"));
    assert!(!deck.contains(0, "WorkspaceX"));
    assert!(!deck.contains(4, "WorkspaceX"));
    assert_eq!(deck.text_of(4), "");
}

#[test]
fn what_pptxgenjs_write_file_produces_verifies_to_the_same_deck() {
    let stored = verify(STORED).unwrap();
    let deflated = verify(DEFLATED).unwrap();
    assert_eq!(stored, deflated);
}

#[test]
fn contains_matches_text_split_across_runs() {
    let split = rewrite(
        DEFLATED,
        "ppt/slides/slide1.xml",
        "<a:t>WorkspaceX</a:t>",
        "<a:t>Work</a:t></a:r><a:r><a:t>spaceX</a:t>",
    );
    let deck = verify(&split).unwrap();
    assert_eq!(deck.slide(1).unwrap().texts[..2], ["Work", "spaceX"]);
    assert!(deck.contains(1, "WorkspaceX"));
    assert!(deck.contains(1, "spaceX\nThe shared"));
}

#[test]
fn verify_file_reads_the_deck_from_disk() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/workspacex-3-slides.pptx"
    );
    assert_eq!(verify_file(path).unwrap(), verify(DEFLATED).unwrap());

    let missing = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/no-such.pptx");
    let err = verify_file(missing).unwrap_err();
    assert!(matches!(err, PptxError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such.pptx"), "{err}");
}

#[test]
fn a_rebuilt_but_unedited_deck_still_verifies() {
    // The broken variants below are all built this way; this shows that what
    // they break is the edit, not the rebuilding.
    let deck = verify(&rebuild(DEFLATED, |_, data| Some(data))).unwrap();
    assert_eq!(deck, verify(DEFLATED).unwrap());
}

#[test]
fn slide_order_is_the_slide_id_list_not_the_file_names() {
    let reordered = rewrite(
        DEFLATED,
        "ppt/presentation.xml",
        r#"<p:sldId id="256" r:id="rId2"/><p:sldId id="257" r:id="rId3"/><p:sldId id="258" r:id="rId4"/>"#,
        r#"<p:sldId id="258" r:id="rId4"/><p:sldId id="256" r:id="rId2"/><p:sldId id="257" r:id="rId3"/>"#,
    );
    let deck = verify(&reordered).unwrap();
    assert_eq!(texts(&deck, 1), SLIDE_3);
    assert_eq!(texts(&deck, 2), SLIDE_1);
    assert_eq!(texts(&deck, 3), SLIDE_2);
    assert_eq!(deck.slide(1).unwrap().part, "ppt/slides/slide3.xml");
}

#[test]
fn a_truncated_zip_is_reported_as_cut_short() {
    let err = rejected(&DEFLATED[..DEFLATED.len() / 2]);
    assert!(matches!(err, PptxError::TruncatedZip { .. }), "{err:?}");
    assert_eq!(err.code(), "truncated-zip");
    // Losing only the last bytes (the end of the central directory) too.
    let err = rejected(&DEFLATED[..DEFLATED.len() - 10]);
    assert!(matches!(err, PptxError::TruncatedZip { .. }), "{err:?}");
}

#[test]
fn a_flipped_byte_in_a_deflated_entry_is_a_corrupt_entry() {
    let (bytes, method) = flip_byte_in(DEFLATED, "ppt/slides/slide2.xml");
    assert_eq!(method, CompressionMethod::Deflated);
    let err = rejected(&bytes);
    match &err {
        PptxError::CorruptEntry { entry, detail } => {
            assert_eq!(entry, "ppt/slides/slide2.xml");
            // This flip still inflates, to the wrong bytes; others may break
            // the deflate stream itself, which is the same variant.
            assert!(detail.contains("CRC-32 mismatch"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("ppt/slides/slide2.xml"), "{err}");
}

#[test]
fn a_flipped_byte_in_a_stored_entry_fails_its_crc() {
    let (bytes, method) = flip_byte_in(STORED, "ppt/slides/slide2.xml");
    assert_eq!(method, CompressionMethod::Stored);
    let err = rejected(&bytes);
    match &err {
        PptxError::CorruptEntry { entry, detail } => {
            assert_eq!(entry, "ppt/slides/slide2.xml");
            assert!(detail.contains("CRC-32 mismatch"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_corrupt_entry_that_no_check_reads_is_still_caught() {
    // The theme is never parsed; only reading every entry finds this.
    let (bytes, _) = flip_byte_in(STORED, "ppt/theme/theme1.xml");
    let err = rejected(&bytes);
    assert!(
        matches!(err, PptxError::CorruptEntry { ref entry, .. } if entry == "ppt/theme/theme1.xml"),
        "{err:?}"
    );
}

#[test]
fn a_deck_without_content_types_is_rejected() {
    let err = rejected(&without(DEFLATED, "[Content_Types].xml"));
    assert!(matches!(err, PptxError::MissingContentTypes), "{err:?}");
    assert!(err.to_string().contains("[Content_Types].xml"), "{err}");
}

#[test]
fn content_types_without_the_presentation_type_are_rejected() {
    let bytes = rewrite(
        DEFLATED,
        "[Content_Types].xml",
        r#"<Override PartName="/ppt/presentation.xml" ContentType="application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml"/>"#,
        "",
    );
    let err = rejected(&bytes);
    assert!(matches!(err, PptxError::MissingMainContentType), "{err:?}");
    assert!(
        err.to_string()
            .contains("presentationml.presentation.main+xml"),
        "{err}"
    );
}

#[test]
fn content_types_that_are_not_xml_are_rejected() {
    let bytes = rewrite(DEFLATED, "[Content_Types].xml", "</Types>", "</Type>");
    let err = rejected(&bytes);
    assert!(
        matches!(err, PptxError::InvalidXml { ref part, .. } if part == "[Content_Types].xml"),
        "{err:?}"
    );
}

#[test]
fn a_deck_without_presentation_xml_is_rejected() {
    let err = rejected(&without(DEFLATED, "ppt/presentation.xml"));
    assert!(matches!(err, PptxError::MissingPresentation), "{err:?}");
}

#[test]
fn a_presentation_xml_that_is_not_xml_is_rejected() {
    let bytes = rewrite(DEFLATED, "ppt/presentation.xml", "</p:sldIdLst>", "");
    let err = rejected(&bytes);
    assert!(
        matches!(err, PptxError::InvalidXml { ref part, .. } if part == "ppt/presentation.xml"),
        "{err:?}"
    );
}

#[test]
fn a_deck_without_presentation_rels_is_rejected() {
    let err = rejected(&without(DEFLATED, "ppt/_rels/presentation.xml.rels"));
    assert!(matches!(err, PptxError::MissingPresentationRels), "{err:?}");
}

#[test]
fn a_slide_id_with_no_relationship_is_a_broken_slide_list() {
    let bytes = rewrite(
        DEFLATED,
        "ppt/_rels/presentation.xml.rels",
        r#"<Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/slide" Target="slides/slide2.xml"/>"#,
        "",
    );
    let err = rejected(&bytes);
    assert!(matches!(err, PptxError::BrokenSlideList { .. }), "{err:?}");
    assert!(err.to_string().contains("rId3"), "{err}");
}

#[test]
fn a_slide_relationship_to_a_missing_part_is_a_missing_slide() {
    let err = rejected(&without(DEFLATED, "ppt/slides/slide3.xml"));
    match &err {
        PptxError::MissingSlide {
            number,
            rel_id,
            part,
        } => {
            assert_eq!((*number, rel_id.as_str()), (3, "rId4"));
            assert_eq!(part, "ppt/slides/slide3.xml");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("ppt/slides/slide3.xml"), "{err}");
}

#[test]
fn a_slide_that_is_not_xml_is_rejected_with_its_number() {
    let bytes = rewrite(
        DEFLATED,
        "ppt/slides/slide2.xml",
        "<a:t>Pay only for the days you use</a:t>",
        "<a:t>Pay only for the days you use</a:x>",
    );
    let err = rejected(&bytes);
    match &err {
        PptxError::InvalidSlideXml { number, part, .. } => {
            assert_eq!((*number, part.as_str()), (2, "ppt/slides/slide2.xml"));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("slide 2"), "{err}");
}

#[test]
fn an_unescaped_ampersand_in_slide_text_is_rejected() {
    // What a script that writes slide XML by string concatenation produces.
    let bytes = rewrite(
        DEFLATED,
        "ppt/slides/slide3.xml",
        "<a:t>Contact us</a:t>",
        "<a:t>Sales & support</a:t>",
    );
    let err = rejected(&bytes);
    assert!(
        matches!(err, PptxError::InvalidSlideXml { number: 3, .. }),
        "{err:?}"
    );
}

#[test]
fn an_empty_file_is_rejected() {
    let err = rejected(&[]);
    assert!(matches!(err, PptxError::Empty), "{err:?}");
}

#[test]
fn random_bytes_are_not_a_zip() {
    // A fixed xorshift stream: the same "random" bytes on every run.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect();
    assert!(!bytes.starts_with(b"PK"));
    let err = rejected(&bytes);
    assert!(matches!(err, PptxError::NotZip { .. }), "{err:?}");
}

#[test]
fn text_written_instead_of_a_deck_is_not_a_zip() {
    let err = rejected(b"<p:presentation>WorkspaceX</p:presentation>\n");
    assert!(matches!(err, PptxError::NotZip { .. }), "{err:?}");
}

#[test]
fn a_deck_with_no_slides_is_rejected() {
    let err = rejected(NO_SLIDES);
    assert!(matches!(err, PptxError::NoSlides), "{err:?}");
    assert!(err.to_string().contains("addSlide"), "{err}");
}

#[test]
fn limits_bound_the_unpacked_size_and_each_part() {
    let sizes = unpacked_sizes(DEFLATED);
    let total: u64 = sizes.values().sum();
    let at = |max_unpacked_bytes, max_part_bytes| {
        verify_with_limits(
            DEFLATED,
            Limits {
                max_unpacked_bytes,
                max_part_bytes,
            },
        )
    };
    let parts = Limits::default().max_part_bytes;

    assert!(at(total, parts).is_ok());
    let err = at(total - 1, parts).unwrap_err();
    assert!(
        matches!(err, PptxError::TooLarge { limit } if limit == total - 1),
        "{err:?}"
    );

    // The largest part that verification parses, not the largest entry.
    let (largest, size) = sizes
        .iter()
        .filter(|(name, _)| {
            name.ends_with("Content_Types].xml")
                || name.starts_with("ppt/presentation.xml")
                || name.starts_with("ppt/_rels/presentation.xml")
                || name.starts_with("ppt/slides/slide")
        })
        .max_by_key(|(_, size)| **size)
        .unwrap();
    assert!(at(total, *size).is_ok());
    match at(total, size - 1).unwrap_err() {
        PptxError::PartTooLarge { part, limit } => {
            assert_eq!((part.as_str(), limit), (largest.as_str(), size - 1));
        }
        other => panic!("{other:?}"),
    }
}
