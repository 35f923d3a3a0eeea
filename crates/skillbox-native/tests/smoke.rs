use skillbox_env::{CancellationToken, ExecRequest, FileSystem, SandboxSpec, Shell};
use skillbox_native::NativeBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() {
    let data = tempfile::tempdir().unwrap();
    let sandbox = NativeBackend::new(data.path())
        .create(SandboxSpec::default())
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let out = sandbox
        .exec(ExecRequest::shell("id; echo hi > /workspace/x; cat /etc/shadow; ls /; cat /proc/self/status | grep -E 'NoNewPrivs|Seccomp|CapEff'"), &cancel)
        .await
        .unwrap();
    println!(
        "{}\n---\n{}\n{:?}",
        out.stdout_text(),
        out.stderr_text(),
        out
    );
    let x = sandbox
        .read_text(std::path::Path::new("x"), &cancel)
        .await
        .unwrap();
    assert_eq!(x, "hi\n");
    sandbox.cleanup().await.unwrap();
}
