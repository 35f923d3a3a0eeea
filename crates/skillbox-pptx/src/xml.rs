//! A namespace-resolving walk over one XML part that rejects what is not
//! well-formed, so callers only see elements, their end, and text.
//!
//! quick-xml is a pull parser that leaves some well-formedness to its caller
//! (unclosed elements at the end, several roots, unknown entities, attribute
//! syntax); this module is the one place that checks all of it.

use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::reader::NsReader;

/// An element or attribute name with its namespace resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Name {
    pub(crate) namespace: Option<String>,
    pub(crate) local: String,
}

impl Name {
    /// True if the local name is `local` and the namespace one of `namespaces`.
    pub(crate) fn is(&self, namespaces: &[&str], local: &str) -> bool {
        self.local == local
            && self
                .namespace
                .as_deref()
                .is_some_and(|ns| namespaces.contains(&ns))
    }
}

#[derive(Debug)]
pub(crate) struct Attribute {
    pub(crate) name: Name,
    pub(crate) value: String,
}

#[derive(Debug)]
pub(crate) struct Element {
    pub(crate) name: Name,
    pub(crate) attributes: Vec<Attribute>,
}

impl Element {
    /// The value of the attribute `local` in no namespace.
    pub(crate) fn attr(&self, local: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|a| a.name.namespace.is_none() && a.name.local == local)
            .map(|a| a.value.as_str())
    }

    /// The value of the attribute `local` in one of `namespaces`.
    pub(crate) fn attr_ns(&self, namespaces: &[&str], local: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|a| a.name.is(namespaces, local))
            .map(|a| a.value.as_str())
    }
}

/// What a walk reports, in document order. Every `Open` is matched by a
/// `Close`, also for `<empty/>` elements.
#[derive(Debug)]
pub(crate) enum Node<'n> {
    Open(&'n Element),
    Close(&'n Name),
    Text(&'n str),
}

/// Walks `bytes` as one XML document, calling `visit` for each node, and
/// fails with a one-line description (with the line number) of the first
/// well-formedness problem.
pub(crate) fn walk(bytes: &[u8], mut visit: impl FnMut(Node<'_>)) -> Result<(), String> {
    let mut reader = NsReader::from_reader(bytes);
    reader.config_mut().enable_all_checks(true);
    let mut open: Vec<Name> = Vec::new();
    let mut seen_root = false;

    loop {
        // Problems quick-xml finds have an error position; the ones found
        // here are placed at the end of the event just read.
        let at = |reader: &NsReader<&[u8]>, what: &str| {
            let offset = usize::try_from(reader.buffer_position()).unwrap_or(usize::MAX);
            format!("line {}: {what}", line_of(bytes, offset))
        };
        let (namespace, event) = match reader.read_resolved_event() {
            Ok((ns, event)) => (resolved(ns), event),
            Err(err) => {
                let offset = usize::try_from(reader.error_position()).unwrap_or(usize::MAX);
                return Err(format!("line {}: {err}", line_of(bytes, offset)));
            }
        };
        let namespace = match namespace {
            Ok(ns) => ns,
            Err(prefix) => {
                return Err(at(
                    &reader,
                    &format!("namespace prefix `{prefix}` is used but never declared"),
                ));
            }
        };
        match event {
            Event::Start(ref start) | Event::Empty(ref start) => {
                if open.is_empty() && seen_root {
                    return Err(at(
                        &reader,
                        "a second root element after the first one closed",
                    ));
                }
                seen_root = true;
                let element = element(&reader, start, namespace).map_err(|e| at(&reader, &e))?;
                visit(Node::Open(&element));
                if matches!(event, Event::Empty(_)) {
                    visit(Node::Close(&element.name));
                } else {
                    open.push(element.name);
                }
            }
            Event::End(_) => {
                // quick-xml has already checked the end name against the start.
                let Some(name) = open.pop() else {
                    return Err(at(&reader, "an end tag without a matching start tag"));
                };
                visit(Node::Close(&name));
            }
            Event::Text(text) => {
                let content = text.xml10_content();
                if open.is_empty() {
                    if !content.trim().is_empty() {
                        return Err(at(&reader, "text outside the root element"));
                    }
                } else {
                    visit(Node::Text(&content));
                }
            }
            Event::CData(cdata) => {
                if open.is_empty() {
                    return Err(at(&reader, "CDATA outside the root element"));
                }
                visit(Node::Text(&cdata.xml10_content()));
            }
            Event::GeneralRef(reference) => {
                if open.is_empty() {
                    return Err(at(&reader, "an entity reference outside the root element"));
                }
                let ch;
                let text = match reference.resolve_char_ref() {
                    Ok(Some(c)) => {
                        ch = c.to_string();
                        ch.as_str()
                    }
                    Ok(None) => match quick_xml::escape::resolve_predefined_entity(&reference) {
                        Some(text) => text,
                        None => {
                            return Err(at(
                                &reader,
                                &format!(
                                    "undefined entity `&{};` (only &amp; &lt; &gt; &quot; \
                                         &apos; and numeric references are allowed)",
                                    &*reference
                                ),
                            ));
                        }
                    },
                    Err(err) => return Err(at(&reader, &err.to_string())),
                };
                visit(Node::Text(text));
            }
            Event::DocType(_) => {
                return Err(at(
                    &reader,
                    "a <!DOCTYPE> declaration, which Office Open XML parts must not have",
                ));
            }
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            Event::Eof => break,
        }
    }

    if let Some(name) = open.last() {
        return Err(format!(
            "line {}: the document ends before element `{}` is closed",
            line_of(bytes, bytes.len()),
            name.local
        ));
    }
    if !seen_root {
        return Err("there is no root element".to_owned());
    }
    Ok(())
}

/// `Err(prefix)` for a prefix with no namespace declaration in scope.
fn resolved(ns: ResolveResult<'_>) -> Result<Option<String>, String> {
    match ns {
        ResolveResult::Bound(ns) => Ok(Some(ns.0.to_owned())),
        ResolveResult::Unbound => Ok(None),
        ResolveResult::Unknown(prefix) => Err(prefix),
    }
}

fn element(
    reader: &NsReader<&[u8]>,
    start: &BytesStart<'_>,
    namespace: Option<String>,
) -> Result<Element, String> {
    let mut attributes = Vec::new();
    for attribute in start.attributes() {
        let attribute = attribute.map_err(|e| e.to_string())?;
        if attribute.key.as_namespace_binding().is_some() {
            continue;
        }
        let (ns, local) = reader.resolver().resolve_attribute(attribute.key);
        let namespace = resolved(ns)
            .map_err(|prefix| format!("namespace prefix `{prefix}` is used but never declared"))?;
        let name = Name {
            namespace,
            local: local.as_ref().to_owned(),
        };
        let value = attribute
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| format!("attribute `{}`: {e}", attribute.key.as_ref()))?
            .into_owned();
        attributes.push(Attribute { name, value });
    }
    Ok(Element {
        name: Name {
            namespace,
            local: start.local_name().as_ref().to_owned(),
        },
        attributes,
    })
}

/// The 1-based line that byte `offset` falls on.
fn line_of(bytes: &[u8], offset: usize) -> usize {
    let end = offset.min(bytes.len());
    bytes[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(xml: &str) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        walk(xml.as_bytes(), |node| {
            if let Node::Text(t) = node {
                out.push(t.to_owned());
            }
        })?;
        Ok(out)
    }

    #[test]
    fn resolves_entities_and_char_refs_into_text() {
        let got = texts("<r>a &amp; b &#x2022; <![CDATA[<c>]]></r>")
            .unwrap()
            .concat();
        assert_eq!(got, "a & b \u{2022} <c>");
    }

    #[test]
    fn rejects_what_is_not_well_formed() {
        for (xml, why) in [
            ("<a><b></a>", "mismatched end"),
            ("<a>", "unclosed root"),
            ("<a></a><b/>", "two roots"),
            ("", "no root"),
            ("text<a/>", "text before root"),
            ("<a>&nbsp;</a>", "undefined entity"),
            ("<x:a/>", "undeclared prefix"),
            ("<a b='1' b='2'/>", "duplicate attribute"),
            ("<a b=1/>", "unquoted attribute"),
            ("<!DOCTYPE a><a/>", "doctype"),
            ("<a></a></a>", "stray end tag"),
        ] {
            assert!(
                walk(xml.as_bytes(), |_| {}).is_err(),
                "{why}: {xml:?} was accepted"
            );
        }
    }

    #[test]
    fn reports_the_line_of_the_problem() {
        let err = walk(b"<a>\n<b>\n</a>", |_| {}).unwrap_err();
        assert!(err.starts_with("line 3:"), "{err}");
        let err = walk(b"<a>\n\n&nbsp;</a>", |_| {}).unwrap_err();
        assert!(
            err.starts_with("line 3: undefined entity `&nbsp;`"),
            "{err}"
        );
    }

    #[test]
    fn resolves_namespaces_of_elements_and_attributes() {
        let xml = r#"<p:x xmlns:p="urn:p" xmlns:r="urn:r" r:id="7" plain="y"/>"#;
        let mut seen = None;
        walk(xml.as_bytes(), |node| {
            if let Node::Open(e) = node {
                seen = Some((
                    e.name.is(&["urn:p"], "x"),
                    e.attr_ns(&["urn:r"], "id").map(str::to_owned),
                    e.attr("plain").map(str::to_owned),
                    e.attr("id").is_none(),
                ));
            }
        })
        .unwrap();
        assert_eq!(
            seen,
            Some((true, Some("7".to_owned()), Some("y".to_owned()), true))
        );
    }
}
