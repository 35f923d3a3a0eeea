//! Killing what runs in a sandbox container: after an exec (whatever it left running)
//! and for a timeout or cancel (everything). Under runc skillbox lists the processes
//! with `docker top` and signals its init; under runsc a killer runs inside. A kill
//! that cannot be confirmed within a bound removes the container: nothing outlives its
//! exec.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::KillContainerOptions;
use skillbox_env::{BackendKind, EnvError, EnvResult, ErrorCode};

use crate::container::Container;
use crate::daemon::{LINE_BYTES, collect_exec, op_error, unavailable};
use crate::runtime::{NR_PRCTL, Runtime};

/// Kills every process in the container but pid 1, itself and skillbox's egress bridge
/// (the pid given, spared only while its uid is 0), in passes (stopping them first, so
/// a fork bomb cannot outrun it), until only zombies are left; prints how many live
/// ones remain. Used under runsc, where a kill through init's signal can hit an exec
/// while it starts, which runsc does not survive. A process names itself (comm, which
/// `/proc` shows inside `stat`'s parentheses and on `status`'s first line, newlines and
/// all), so the state is read after `stat`'s last `)` and the uid from `status`'s last
/// `Uid:` line; and only the bridge's pid is ever spared: the sandbox's code never has
/// uid 0 (a non-root user, no capabilities, no new privileges), so a pid the bridge
/// left and the sandbox took is killed.
const KILL_PL: &str = r#"syscall($ARGV[0], 4, 0, 0, 0, 0) == 0 or exit 3;
my $spare = $ARGV[1];
my $left = 0;
for my $pass (1 .. 200) {
    opendir(my $d, '/proc') or exit 1;
    my @p;
    for my $pid (grep { /^\d+$/ && $_ != 1 && $_ != $$ } readdir($d)) {
        open(my $f, '<', "/proc/$pid/stat") or next;
        local $/;
        my $st = <$f> // '';
        my $close = rindex($st, ')');
        next if $close >= 0 && substr($st, $close + 2, 1) eq 'Z';
        if ($pid == $spare && open(my $s, '<', "/proc/$pid/status")) {
            my @uid = map { /^Uid:\s+(\d+)/ ? ($1) : () } split(/\n/, <$s> // '');
            next if @uid && $uid[-1] == 0;
        }
        push @p, $pid;
    }
    closedir($d);
    $left = scalar @p;
    last unless $left;
    kill('STOP', @p);
    kill('KILL', @p);
    select(undef, undef, undef, 0.005);
}
print "left $left\n";
exit($left ? 1 : 0);"#;
/// How long a kill of the container's processes may take before the sandbox is
/// given up (removed) instead.
const KILL_BOUND: Duration = Duration::from_secs(10);
/// How long a kill waits for running file operations to finish before it goes ahead
/// (a file operation stuck on something the sandbox made is killed with the rest).
const FS_DRAIN_BOUND: Duration = Duration::from_secs(2);

/// The pid of the container's init, from `top` (a host pid: runc only).
pub(crate) async fn init_pid(docker: &Docker, id: &str) -> EnvResult<String> {
    let rows = top(docker, id).await?;
    match rows.as_slice() {
        [(pid, _)] => Ok(pid.clone()),
        other => Err(unavailable(format!(
            "the sandbox container started with {} processes instead of its init",
            other.len()
        ))),
    }
}

/// The container's processes as (pid, command line), seen from the host (runc only:
/// under runsc `docker top` does not list the sandbox's processes).
async fn top(docker: &Docker, id: &str) -> EnvResult<Vec<(String, String)>> {
    let top = docker
        .top_processes(id, None::<bollard::query_parameters::TopOptions>)
        .await
        .map_err(|e| op_error(BackendKind::Docker, "list the sandbox's processes", &e))?;
    let titles = top.titles.unwrap_or_default();
    let pid_at = titles.iter().position(|t| t == "PID");
    let cmd_at = titles.iter().position(|t| t == "CMD" || t == "COMMAND");
    let (Some(pid_at), Some(cmd_at)) = (pid_at, cmd_at) else {
        return Err(EnvError::new(
            ErrorCode::Unknown,
            format!("unexpected process list columns {titles:?}"),
        ));
    };
    let rows = top
        .processes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|row| Some((row.get(pid_at)?.clone(), row.get(cmd_at)?.clone())))
        .collect();
    Ok(rows)
}

/// How many kills init has done (from its command line, `skillbox-init N`), and whether
/// anything but init runs (runc only).
async fn kill_state(container: &Container) -> EnvResult<(Option<u64>, bool)> {
    let rows = top(&container.docker, &container.id).await?;
    let mut kills = None;
    let mut others = false;
    for (pid, cmd) in rows {
        if pid == container.init_pid {
            kills = cmd
                .strip_prefix("skillbox-init ")
                .and_then(|n| n.trim().parse().ok());
        } else {
            others = true;
        }
    }
    Ok((kills, others))
}

/// Kills every process in the container but its pid 1, and waits until they are gone.
/// If that cannot be confirmed the container is removed: nothing may outlive its exec.
pub(crate) async fn kill_all(container: &Container) -> EnvResult<()> {
    if container.is_removed() {
        return Ok(());
    }
    let _gate = tokio::time::timeout(FS_DRAIN_BOUND, container.fs_gate.clone().write_owned())
        .await
        .ok();
    let outcome = async {
        if container.runtime == Runtime::Runsc {
            return kill_from_inside(container).await;
        }
        let (before, _) = kill_state(container).await?;
        let before = before.ok_or_else(|| unavailable("the sandbox's init is gone"))?;
        container
            .docker
            .kill_container(
                &container.id,
                Some(KillContainerOptions {
                    signal: "SIGUSR1".into(),
                }),
            )
            .await
            .map_err(|e| {
                op_error(
                    container.runtime.backend(),
                    "kill the sandbox's processes",
                    &e,
                )
            })?;
        let deadline = Instant::now() + KILL_BOUND;
        let mut pause = Duration::from_millis(2);
        let mut resend = Instant::now() + Duration::from_secs(1);
        loop {
            let (kills, others) = kill_state(container).await?;
            if kills.is_some_and(|k| k > before) && !others {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(unavailable("the sandbox's processes did not die"));
            }
            // Init has killed (its count moved) but something is still there, say a
            // child forked just then: ask again.
            if Instant::now() > resend && kills.is_some_and(|k| k > before) {
                resend = Instant::now() + Duration::from_secs(1);
                let _ = container
                    .docker
                    .kill_container(
                        &container.id,
                        Some(KillContainerOptions {
                            signal: "SIGUSR1".into(),
                        }),
                    )
                    .await;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
    .await;
    if let Err(e) = &outcome {
        // A container that stopped by itself died (gVisor after a memory bomb).
        if !container.is_running().await {
            if container.oom_killed().await {
                container.ooms.fetch_add(1, Ordering::SeqCst);
            }
            container.died.cancel();
        }
        // Fail closed: a container whose processes cannot be confirmed dead goes.
        tracing::warn!(container = %container.id, error = %e, "docker: removing a sandbox that could not be reset");
        container.remove().await;
    }
    outcome
}

/// The runsc way of [`kill_all`]: a killer process inside the container.
async fn kill_from_inside(container: &Container) -> EnvResult<()> {
    let argv = vec![
        container.runtime.perl().to_string(),
        "-e".into(),
        KILL_PL.into(),
        NR_PRCTL.to_string(),
        container.bridge_pid.load(Ordering::SeqCst).to_string(),
    ];
    // runsc now and then fails to start an exec at all (`OCI runtime exec failed`,
    // status 126: the killer never ran): that is tried again, twice, before the sandbox
    // is given up.
    let mut tries = 0;
    loop {
        tries += 1;
        let out = bounded(collect_exec(
            &container.docker,
            &container.id,
            container.runtime.backend(),
            "reset the sandbox",
            argv.clone(),
            None,
            LINE_BYTES,
        ))
        .await?;
        let said = String::from_utf8_lossy(&out.stdout);
        let said = said.trim();
        // The exit status is the authority: the sandbox's code cannot forge it (it
        // could write into the killer's output pipe).
        match (out.exit_code, said) {
            (Some(0), "left 0") => return Ok(()),
            (Some(126), said) if said.contains("OCI runtime exec failed") && tries < 3 => {
                tracing::debug!(container = %container.id, said, "docker: the killer did not start; again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (code, said) => {
                return Err(unavailable(format!(
                    "the sandbox's processes did not die (killer exit {code:?}, {said:?})"
                )));
            }
        }
    }
}

/// Bounds one of skillbox's own commands in the container: one that hangs (a runtime
/// that lost it) counts as a failed reset, and the sandbox is given up.
async fn bounded<T>(work: impl std::future::Future<Output = EnvResult<T>>) -> EnvResult<T> {
    tokio::time::timeout(KILL_BOUND, work)
        .await
        .map_err(|_| unavailable("the container did not answer in time"))?
}

/// Kills what an exec left running, if anything.
pub(crate) async fn settle(container: &Container) -> EnvResult<()> {
    if container.is_removed() {
        return Ok(());
    }
    // Under runsc the only view of the processes is from inside, where what is left of
    // the code could fake it: the killer runs every time (it is quick when there is
    // nothing to kill, and its exit status cannot be faked).
    if container.runtime == Runtime::Runsc {
        return kill_all(container).await;
    }
    match kill_state(container).await {
        Ok((_, false)) => Ok(()),
        _ => kill_all(container).await,
    }
}
