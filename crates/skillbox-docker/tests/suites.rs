//! The shared conformance and adversarial suites, run against the docker backend (runc)
//! and the gvisor backend (runsc), on the runtime image `skillbox image build` makes.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use skillbox_docker::{DockerBackend, Runtime, image_tag};
use skillbox_env::SandboxSpec;
use skillbox_env::testkit::Made;

fn image() -> String {
    image_tag(&skillbox_run::NodeRuntime::new(std::path::Path::new("/")).id())
}

async fn make(runtime: Runtime, spec: SandboxSpec) -> Made {
    let backend = DockerBackend::connect(runtime, image())
        .await
        .map_err(|e| e.to_string())?;
    let sandbox = backend.create(spec).await.map_err(|e| e.to_string())?;
    Ok(Box::new(sandbox))
}

mod connect;

mod docker {
    use super::*;

    async fn make_env(spec: SandboxSpec) -> Made {
        make(Runtime::Runc, spec).await
    }

    skillbox_env::conformance_suite!(make_env);
    skillbox_env::adversarial_suite!(make_env);
}

mod gvisor {
    use super::*;

    async fn make_env(spec: SandboxSpec) -> Made {
        make(Runtime::Runsc, spec).await
    }

    skillbox_env::conformance_suite!(make_env);
    skillbox_env::adversarial_suite!(make_env);
}
