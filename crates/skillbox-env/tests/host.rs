//! The conformance suite against `HostEnv`, the unsandboxed env.

#![cfg(feature = "testkit")]

use skillbox_env::{HostEnv, SandboxSpec, testkit};

/// A host env over a fresh directory (`workspace/` is its cwd unless the spec names one,
/// `tmp/` its temp root) that its `cleanup` removes.
async fn make_env(spec: SandboxSpec) -> testkit::Made {
    let root = tempfile::Builder::new()
        .prefix("skillbox-host-")
        .tempdir()
        .map_err(|e| format!("cannot make a temp dir: {e}"))?
        .keep();
    let workspace = match spec.workspace {
        Some(workspace) => workspace,
        None => {
            let workspace = root.join("workspace");
            std::fs::create_dir(&workspace)
                .map_err(|e| format!("cannot make {workspace:?}: {e}"))?;
            workspace
        }
    };
    let env = HostEnv::new(workspace, root.join("tmp"))
        .with_limits(spec.limits)
        .owning(root);
    Ok(Box::new(env))
}

skillbox_env::conformance_suite!(make_env);
