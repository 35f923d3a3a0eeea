//! The PresentationML layer: content types, the slide list in
//! `ppt/presentation.xml` resolved through its relationships, and the text
//! runs of each slide.
//!
//! Both the Transitional namespaces (what PowerPoint and pptxgenjs write) and
//! the Strict ones are accepted.

use std::collections::HashMap;

use crate::xml::{self, Node};
use crate::{PptxError, Slide};

pub(crate) const MAIN_CONTENT_TYPE: &str =
    "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml";

pub(crate) const CONTENT_TYPES_PART: &str = "[Content_Types].xml";
pub(crate) const PRESENTATION_PART: &str = "ppt/presentation.xml";
pub(crate) const PRESENTATION_RELS_PART: &str = "ppt/_rels/presentation.xml.rels";
/// Relationship targets in `ppt/presentation.xml.rels` are relative to this.
const PRESENTATION_DIR: &str = "ppt";

const PRESENTATIONML: &[&str] = &[
    "http://schemas.openxmlformats.org/presentationml/2006/main",
    "http://purl.oclc.org/ooxml/presentationml/main",
];
const DRAWINGML: &[&str] = &[
    "http://schemas.openxmlformats.org/drawingml/2006/main",
    "http://purl.oclc.org/ooxml/drawingml/main",
];
const RELATIONSHIPS: &[&str] = &[
    "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
    "http://purl.oclc.org/ooxml/officeDocument/relationships",
];
const SLIDE_RELATIONSHIP_TYPES: &[&str] = &[
    "http://schemas.openxmlformats.org/officeDocument/2006/relationships/slide",
    "http://purl.oclc.org/ooxml/officeDocument/relationships/slide",
];

fn invalid(part: &str) -> impl FnOnce(String) -> PptxError {
    move |detail| PptxError::InvalidXml {
        part: part.to_owned(),
        detail,
    }
}

/// Fails unless `[Content_Types].xml` maps `/ppt/presentation.xml` to the
/// presentation main content type.
pub(crate) fn check_content_types(bytes: &[u8]) -> Result<(), PptxError> {
    let mut declared = false;
    let mut root = None;
    xml::walk(bytes, |node| {
        if let Node::Open(e) = node {
            if root.is_none() {
                root = Some(e.name.local.clone());
            } else if e.name.local == "Override"
                && e.attr("PartName")
                    .is_some_and(|p| p.eq_ignore_ascii_case("/ppt/presentation.xml"))
                && e.attr("ContentType") == Some(MAIN_CONTENT_TYPE)
            {
                declared = true;
            }
        }
    })
    .map_err(invalid(CONTENT_TYPES_PART))?;
    if root.as_deref() != Some("Types") {
        return Err(invalid(CONTENT_TYPES_PART)(format!(
            "its root element is <{}>, not <Types>",
            root.unwrap_or_default()
        )));
    }
    if declared {
        Ok(())
    } else {
        Err(PptxError::MissingMainContentType)
    }
}

/// The `r:id` of each `p:sldId` in `p:sldIdLst`, in deck order.
pub(crate) fn slide_rel_ids(bytes: &[u8]) -> Result<Vec<String>, PptxError> {
    let mut root = None;
    let mut depth = 0usize;
    let mut list_depth = None;
    let mut ids = Vec::new();
    let mut missing_id = false;
    xml::walk(bytes, |node| match node {
        Node::Open(e) => {
            depth += 1;
            if root.is_none() {
                root = Some(e.name.clone());
            }
            // Only a list directly under the root counts, so an extension
            // part that happens to reuse the name cannot add slides.
            if depth == 2 && e.name.is(PRESENTATIONML, "sldIdLst") {
                list_depth = Some(depth);
            } else if list_depth.is_some_and(|d| depth == d + 1)
                && e.name.is(PRESENTATIONML, "sldId")
            {
                match e.attr_ns(RELATIONSHIPS, "id") {
                    Some(id) => ids.push(id.to_owned()),
                    None => missing_id = true,
                }
            }
        }
        Node::Close(_) => {
            if list_depth == Some(depth) {
                list_depth = None;
            }
            depth -= 1;
        }
        Node::Text(_) => {}
    })
    .map_err(invalid(PRESENTATION_PART))?;
    match root {
        Some(name) if name.is(PRESENTATIONML, "presentation") => {}
        other => {
            return Err(invalid(PRESENTATION_PART)(format!(
                "its root element is <{}>, not <p:presentation> in the PresentationML namespace",
                other.map(|n| n.local).unwrap_or_default()
            )));
        }
    }
    if missing_id {
        return Err(PptxError::BrokenSlideList {
            detail: "a <p:sldId> in <p:sldIdLst> has no r:id attribute".to_owned(),
        });
    }
    Ok(ids)
}

#[derive(Debug)]
pub(crate) struct Relationship {
    pub(crate) kind: String,
    pub(crate) target: String,
    pub(crate) external: bool,
}

/// The relationships of `ppt/presentation.xml`, by Id.
pub(crate) fn presentation_relationships(
    bytes: &[u8],
) -> Result<HashMap<String, Relationship>, PptxError> {
    let mut rels = HashMap::new();
    let mut incomplete = None;
    xml::walk(bytes, |node| {
        if let Node::Open(e) = node
            && e.name.local == "Relationship"
        {
            match (e.attr("Id"), e.attr("Type"), e.attr("Target")) {
                (Some(id), Some(kind), Some(target)) => {
                    rels.insert(
                        id.to_owned(),
                        Relationship {
                            kind: kind.to_owned(),
                            target: target.to_owned(),
                            external: e.attr("TargetMode") == Some("External"),
                        },
                    );
                }
                (id, _, _) => incomplete = Some(id.unwrap_or("?").to_owned()),
            }
        }
    })
    .map_err(invalid(PRESENTATION_RELS_PART))?;
    if let Some(id) = incomplete {
        return Err(invalid(PRESENTATION_RELS_PART)(format!(
            "relationship `{id}` lacks one of the Id, Type and Target attributes"
        )));
    }
    Ok(rels)
}

/// The zip path of the slide part that relationship `rel_id` names.
pub(crate) fn slide_part(
    rels: &HashMap<String, Relationship>,
    number: usize,
    rel_id: &str,
) -> Result<String, PptxError> {
    let broken = |detail: String| PptxError::BrokenSlideList { detail };
    let rel = rels.get(rel_id).ok_or_else(|| {
        broken(format!(
            "slide {number} has r:id `{rel_id}`, but `{PRESENTATION_RELS_PART}` has no \
             relationship with that Id"
        ))
    })?;
    if !SLIDE_RELATIONSHIP_TYPES.contains(&rel.kind.as_str()) {
        return Err(broken(format!(
            "slide {number} has r:id `{rel_id}`, but that relationship is of type `{}`, not a slide",
            rel.kind
        )));
    }
    if rel.external {
        return Err(broken(format!(
            "slide {number} (r:id `{rel_id}`) points outside the file, to `{}`",
            rel.target
        )));
    }
    resolve_target(PRESENTATION_DIR, &rel.target).ok_or_else(|| {
        broken(format!(
            "slide {number} (r:id `{rel_id}`) has target `{}`, which leaves the package",
            rel.target
        ))
    })
}

/// Resolves a relationship target against the folder of its source part,
/// giving a zip path, or `None` if `..` climbs above the package root.
fn resolve_target(base_dir: &str, target: &str) -> Option<String> {
    let (start, rest) = match target.strip_prefix('/') {
        Some(absolute) => ("", absolute),
        None => (base_dir, target),
    };
    let mut segments: Vec<&str> = start.split('/').filter(|s| !s.is_empty()).collect();
    for segment in rest.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop()?;
            }
            other => segments.push(other),
        }
    }
    Some(segments.join("/"))
}

/// Parses one slide part and collects the text of its `a:t` runs.
pub(crate) fn read_slide(number: usize, part: String, bytes: &[u8]) -> Result<Slide, PptxError> {
    let mut root = None;
    let mut texts = Vec::new();
    let mut run: Option<String> = None;
    let walked = xml::walk(bytes, |node| match node {
        Node::Open(e) => {
            if root.is_none() {
                root = Some(e.name.clone());
            }
            if e.name.is(DRAWINGML, "t") {
                run = Some(String::new());
            }
        }
        Node::Text(text) => {
            if let Some(run) = run.as_mut() {
                run.push_str(text);
            }
        }
        Node::Close(name) => {
            if name.is(DRAWINGML, "t")
                && let Some(text) = run.take()
            {
                texts.push(text);
            }
        }
    });
    let invalid = |detail: String| PptxError::InvalidSlideXml {
        number,
        part: part.clone(),
        detail,
    };
    walked.map_err(invalid)?;
    match root {
        Some(name) if name.is(PRESENTATIONML, "sld") => {}
        other => {
            return Err(invalid(format!(
                "its root element is <{}>, not <p:sld> in the PresentationML namespace",
                other.map(|n| n.local).unwrap_or_default()
            )));
        }
    }
    Ok(Slide {
        number,
        part,
        texts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_resolve_against_the_ppt_folder() {
        for (target, want) in [
            ("slides/slide1.xml", Some("ppt/slides/slide1.xml")),
            ("./slides/slide1.xml", Some("ppt/slides/slide1.xml")),
            ("/ppt/slides/slide1.xml", Some("ppt/slides/slide1.xml")),
            ("../ppt/slides/slide1.xml", Some("ppt/slides/slide1.xml")),
            ("../../slide1.xml", None),
        ] {
            assert_eq!(
                resolve_target(PRESENTATION_DIR, target).as_deref(),
                want,
                "{target}"
            );
        }
    }

    #[test]
    fn only_the_slide_id_list_under_the_root_counts() {
        let xml = br#"<p:presentation xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">
            <p:sldIdLst><p:sldId id="257" r:id="rId3"/><p:sldId id="256" r:id="rId2"/></p:sldIdLst>
            <p:extLst><p:ext><p:sldIdLst><p:sldId id="9" r:id="rId9"/></p:sldIdLst></p:ext></p:extLst>
        </p:presentation>"#;
        assert_eq!(slide_rel_ids(xml).unwrap(), ["rId3", "rId2"]);
    }

    #[test]
    fn a_slide_id_without_a_relationship_id_breaks_the_list() {
        let xml = br#"<p:presentation xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"><p:sldIdLst><p:sldId id="256" id2="rId2"/></p:sldIdLst></p:presentation>"#;
        let err = slide_rel_ids(xml).unwrap_err();
        assert!(matches!(err, PptxError::BrokenSlideList { .. }), "{err:?}");
    }

    #[test]
    fn run_text_is_collected_in_order_and_other_t_elements_are_not() {
        let xml = r#"<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" xmlns:m="urn:math">
            <a:p><a:r><a:t>Fish &amp; chips</a:t></a:r><a:r><a:t></a:t></a:r></a:p>
            <m:t>not a run</m:t><a:p><a:fld><a:t>7</a:t></a:fld></a:p></p:sld>"#;
        let slide = read_slide(1, "ppt/slides/slide1.xml".to_owned(), xml.as_bytes()).unwrap();
        assert_eq!(slide.texts, ["Fish & chips", "", "7"]);
    }

    #[test]
    fn a_slide_whose_root_is_not_sld_is_invalid() {
        let xml = br#"<p:sldLayout xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"/>"#;
        let err = read_slide(2, "ppt/slides/slide2.xml".to_owned(), xml).unwrap_err();
        assert!(
            matches!(err, PptxError::InvalidSlideXml { number: 2, .. }),
            "{err:?}"
        );
    }
}
