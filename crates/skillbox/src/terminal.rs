//! Names from a sandbox, a skill, a capability or a server, made safe to print in one of
//! skillbox's own lines on a terminal. A script names its files as it likes: an ESC, a CR
//! or a newline in a name printed raw could erase skillbox's line and write a message of
//! its own in its place, and a bidi override could reorder what the line seems to say.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every control character (C0, DEL, C1) and every bidi embedding, override
/// or isolate (U+202A–U+202E, U+2066–U+2069) written as a visible escape: `\n`, `\r`,
/// `\t`, `\x1b` for the rest of C0 and DEL, `\u{85}` for C1 and the bidi characters.
/// A backslash is written `\\`, so a name holding the text `\x1b` cannot pass for one
/// holding an ESC. Everything else, non-ASCII letters included, is left as it is. For
/// `--json`, print the name itself: JSON escapes it already.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => shown.push_str("\\n"),
            '\r' => shown.push_str("\\r"),
            '\t' => shown.push_str("\\t"),
            '\\' => shown.push_str("\\\\"),
            c if c.is_ascii_control() => {
                let _ = write!(shown, "\\x{:02x}", u32::from(c));
            }
            c if needs_escape(c) => {
                let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
            }
            c => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// A path, as [`escaped`] shows a name.
pub fn escaped_path(path: &std::path::Path) -> String {
    escaped(&path.display().to_string()).into_owned()
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\\' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_and_backslashes_are_escaped_and_nothing_else() {
        for (name, shown) in [
            ("report.txt", "report.txt"),
            ("Überblick-报告 ü.pptx", "Überblick-报告 ü.pptx"),
            ("a b\\c", "a b\\\\c"),
            ("looks\\x1b-escaped", "looks\\\\x1b-escaped"),
            (
                "report\x1b[2K\rskillbox run: ok\x1b[8m.txt",
                "report\\x1b[2K\\rskillbox run: ok\\x1b[8m.txt",
            ),
            ("two\nlines\ttab", "two\\nlines\\ttab"),
            ("nul\0bel\x07del\x7f", "nul\\x00bel\\x07del\\x7f"),
            ("c1\u{85}csi\u{9b}", "c1\\u{85}csi\\u{9b}"),
            ("invoice\u{202e}fdp.exe", "invoice\\u{202e}fdp.exe"),
            ("\u{202a}\u{2066}\u{2069}", "\\u{202a}\\u{2066}\\u{2069}"),
        ] {
            assert_eq!(escaped(name), shown, "{name:?}");
        }
        assert!(matches!(escaped("plain"), Cow::Borrowed(_)));
        assert_eq!(escaped_path(std::path::Path::new("out/a\rb")), "out/a\\rb");
    }
}
