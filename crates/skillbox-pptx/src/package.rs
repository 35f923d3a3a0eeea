//! The zip layer: opening the archive, checking every entry unpacks to its
//! recorded CRC, and reading parts by OPC part name.

use std::collections::HashMap;
use std::io::{Cursor, Read};

use zip::ZipArchive;
use zip::result::ZipError;

use crate::{Limits, PptxError};

/// Every zip written by a normal tool starts with a local file header.
const LOCAL_HEADER_SIGNATURE: &[u8] = b"PK\x03\x04";

/// An opened archive whose entries have all been read once and checked.
pub(crate) struct Package<'b> {
    archive: ZipArchive<Cursor<&'b [u8]>>,
    /// OPC part names compare ASCII case-insensitively, so lookups go
    /// through the lower-cased entry name.
    by_name: HashMap<String, usize>,
    limits: Limits,
}

impl<'b> Package<'b> {
    /// Opens `bytes` as a zip and reads every entry to its end, which is
    /// where the zip crate compares the CRC.
    pub(crate) fn open(bytes: &'b [u8], limits: Limits) -> Result<Self, PptxError> {
        if bytes.is_empty() {
            return Err(PptxError::Empty);
        }
        let mut archive = ZipArchive::new(Cursor::new(bytes)).map_err(|err| {
            let detail = err.to_string();
            if bytes.starts_with(LOCAL_HEADER_SIGNATURE) {
                PptxError::TruncatedZip { detail }
            } else {
                PptxError::NotZip { detail }
            }
        })?;

        let mut by_name = HashMap::with_capacity(archive.len());
        let mut budget = limits.max_unpacked_bytes;
        let mut chunk = vec![0u8; 64 * 1024];
        for index in 0..archive.len() {
            let raw_name = archive
                .name_for_index(index)
                .and_then(Result::ok)
                .map_or_else(|| format!("entry #{index}"), |name| name.into_owned());
            let corrupt = |detail: String| PptxError::CorruptEntry {
                entry: raw_name.clone(),
                detail,
            };
            let mut entry = archive
                .by_index(index)
                .map_err(|err| corrupt(describe(&err)))?;
            let name = entry.name().map_err(|err| corrupt(describe(&err)))?;
            by_name.insert(name.to_ascii_lowercase(), index);
            loop {
                let n = entry
                    .read(&mut chunk)
                    .map_err(|err| corrupt(describe_io(&err)))?;
                if n == 0 {
                    break;
                }
                budget = budget.checked_sub(n as u64).ok_or(PptxError::TooLarge {
                    limit: limits.max_unpacked_bytes,
                })?;
            }
        }
        Ok(Self {
            archive,
            by_name,
            limits,
        })
    }

    /// The bytes of part `name` (a zip path like `ppt/slides/slide1.xml`),
    /// or `None` if the zip has no such entry.
    pub(crate) fn read_part(&mut self, name: &str) -> Result<Option<Vec<u8>>, PptxError> {
        let Some(&index) = self.by_name.get(&name.to_ascii_lowercase()) else {
            return Ok(None);
        };
        let limit = self.limits.max_part_bytes;
        let corrupt = |detail: String| PptxError::CorruptEntry {
            entry: name.to_owned(),
            detail,
        };
        let entry = self
            .archive
            .by_index(index)
            .map_err(|err| corrupt(describe(&err)))?;
        let mut bytes = Vec::new();
        // One byte past the limit tells "too large" from "exactly the limit".
        entry
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|err| corrupt(describe_io(&err)))?;
        if bytes.len() as u64 > limit {
            return Err(PptxError::PartTooLarge {
                part: name.to_owned(),
                limit,
            });
        }
        Ok(Some(bytes))
    }
}

fn describe(err: &ZipError) -> String {
    match err {
        ZipError::CompressionMethodNotSupported(method) => format!(
            "it uses compression method {method}, which is not stored (0) or deflate (8), the \
             only ones a .pptx may use"
        ),
        other => other.to_string(),
    }
}

fn describe_io(err: &std::io::Error) -> String {
    // The zip crate reports a CRC mismatch only through this message.
    if err.to_string() == "Invalid checksum" {
        "CRC-32 mismatch: the unpacked data is not what the zip recorded".to_owned()
    } else {
        err.to_string()
    }
}
