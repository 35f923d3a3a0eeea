//! Helpers shared by the native test files.

use std::path::PathBuf;

/// A fresh data dir for one test's backend (kept: the env's cleanup removes what the
/// sandbox made), or why the native sandbox cannot run here.
pub fn data_dir() -> Result<PathBuf, String> {
    let report = skillbox_native::probe();
    if !report.available {
        return Err(format!(
            "native sandbox unavailable here: {}",
            report.reason.unwrap_or_default()
        ));
    }
    Ok(tempfile::tempdir().map_err(|e| e.to_string())?.keep())
}
