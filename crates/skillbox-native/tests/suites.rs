//! The shared conformance and adversarial suites, run against the native sandbox.

use skillbox_env::SandboxSpec;
use skillbox_env::testkit::Made;
use skillbox_native::NativeBackend;

/// Each test gets its own data dir, removed with the env's cleanup.
async fn make_env(spec: SandboxSpec) -> Made {
    let report = skillbox_native::probe();
    if !report.available {
        return Err(format!(
            "native sandbox unavailable here: {}",
            report.reason.unwrap_or_default()
        ));
    }
    let data = tempfile::tempdir().map_err(|e| e.to_string())?.keep();
    let sandbox = NativeBackend::new(&data)
        .create(spec)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Box::new(sandbox))
}

skillbox_env::conformance_suite!(make_env);
skillbox_env::adversarial_suite!(make_env);
