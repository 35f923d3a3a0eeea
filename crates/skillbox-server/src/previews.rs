//! Slide previews of a stored deck (`GET /v1/objects/{sha256}/slides[/{number}]`): each
//! slide as a PNG when LibreOffice and pdftoppm are installed, else the text of each
//! slide as the verifier reads it.
//!
//! The deck came from code skillbox ran for someone, so rendering it is a door: the
//! deck must verify first (bounded unzip, [`skillbox_pptx::verify`]), LibreOffice runs
//! with a wall-clock bound in its own process group (killed whole when it is done or
//! late), with a fresh HOME and profile in a temp dir that is removed afterwards, an
//! empty environment but PATH, no core files and a bound on the size of any file it
//! writes; one render runs at a time. Results are cached under `<data>/previews/<sha256>/`
//! by the deck's SHA-256 and removed when retention removes the deck.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::header;
use axum::response::Response;
use axum::{Extension, Json};
use skillbox_protocol::{ErrorCode, PreviewFormat, SlidePreview, SlidePreviews};
use tokio::sync::Semaphore;

use crate::auth::Tenant;
use crate::error::Failure;
use crate::state::AppState;

/// The content type a `.pptx` artifact is stored with.
pub const PPTX_TYPE: &str =
    "application/vnd.openxmlformats-officedocument.presentationml.presentation";

/// The largest deck previewed (the most one agent attempt may make).
const MAX_DECK_BYTES: u64 = 64 << 20;
/// Slides rendered at most; past it the preview is an outline.
const MAX_SLIDES: usize = 100;
/// One render (LibreOffice, then pdftoppm) ends by then, or is killed.
const RENDER_TIMEOUT: Duration = Duration::from_secs(60);
/// A render's work dir this old was left by a render that never cleaned up.
const STALE_RENDER: Duration = Duration::from_secs(10 * 60);
/// The largest file either tool may write (RLIMIT_FSIZE), and all the PNGs together.
const MAX_OUTPUT_BYTES: u64 = 256 << 20;
const MAX_PNG_BYTES: u64 = 64 << 20;

/// The two programs a PNG preview needs.
#[derive(Debug, Clone)]
pub struct Renderer {
    pub soffice: PathBuf,
    pub pdftoppm: PathBuf,
}

impl Renderer {
    /// Finds `soffice` and `pdftoppm` on PATH, or says which is missing and how to get it.
    pub fn find() -> Result<Renderer, String> {
        let soffice = on_path("soffice").ok_or(
            "no soffice (LibreOffice) on PATH: slide previews are text outlines; \
             apt-get install libreoffice-impress for PNG previews",
        )?;
        let pdftoppm = on_path("pdftoppm").ok_or(
            "no pdftoppm on PATH: slide previews are text outlines; \
             apt-get install poppler-utils for PNG previews",
        )?;
        Ok(Renderer { soffice, pdftoppm })
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
}

/// The preview cache and the one render slot.
#[derive(Debug)]
pub(crate) struct Previews {
    dir: PathBuf,
    renderer: Result<Renderer, String>,
    renders: Semaphore,
}

impl Previews {
    pub(crate) fn new(data_dir: &Path, png: bool) -> Previews {
        let previews = Previews {
            dir: data_dir.join("previews"),
            renderer: if png {
                Renderer::find()
            } else {
                Err("PNG previews are off on this server".into())
            },
            renders: Semaphore::new(1),
        };
        previews.sweep(STALE_RENDER);
        previews
    }

    /// Removes the work dirs of renders that ended without cleaning up (a server that
    /// was killed mid-render). Only those older than `stale`: another server on the
    /// same data dir may be rendering now, and no render lasts past its 60 s.
    fn sweep(&self, stale: Duration) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > stale);
            if old
                && entry.file_name().to_string_lossy().starts_with(".render-")
                && let Err(e) = std::fs::remove_dir_all(entry.path())
            {
                tracing::warn!(dir = %entry.path().display(), error = %e, "previews: cannot remove a stale render");
            }
        }
    }

    /// Forgets the previews of decks retention removed.
    pub(crate) fn forget(&self, removed: &[String]) {
        for sha256 in removed {
            let dir = self.dir.join(sha256);
            if dir.exists()
                && let Err(e) = std::fs::remove_dir_all(&dir)
            {
                tracing::warn!(dir = %dir.display(), error = %e, "previews: cannot remove");
            }
        }
    }

    fn ensure_dir(&self) -> Result<(), Failure> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| {
                Failure::new(
                    ErrorCode::Unknown,
                    format!("previews: cannot create {}: {e}", self.dir.display()),
                )
            })
    }
}

fn check_sha(sha256: &str) -> Result<(), Failure> {
    if skillbox_store::is_sha256_hex(sha256) {
        Ok(())
    } else {
        Err(Failure::new(
            ErrorCode::Invalid,
            format!("sha256: {sha256:?} is not a sha256 (64 lowercase hex digits)"),
        ))
    }
}

/// The deck's owner check, exactly as a download's: another tenant's deck is 404.
fn owned_deck(
    state: &AppState,
    tenant: &Tenant,
    sha256: &str,
) -> Result<skillbox_store::OwnedObject, Failure> {
    check_sha(sha256)?;
    state
        .owners
        .get(tenant.as_str(), sha256)?
        .ok_or_else(|| Failure::new(ErrorCode::NotFound, format!("no artifact {sha256}")))
}

/// A stored deck's slides: PNGs when this server can render them, else outlines.
#[utoipa::path(
    get,
    path = "/v1/objects/{sha256}/slides",
    params(("sha256" = String, Path, description = "a .pptx artifact's sha256")),
    responses(
        (status = 200, description = "The slides", body = SlidePreviews),
        (status = 400, description = "Not a sha256, or not a deck", body = skillbox_protocol::ApiError),
        (status = 404, description = "No such artifact of this tenant", body = skillbox_protocol::ApiError),
    )
)]
pub(crate) async fn slides(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath(sha256): UrlPath<String>,
) -> Result<Json<SlidePreviews>, Failure> {
    let owned = owned_deck(&state, &tenant, &sha256)?;
    if owned.content_type != PPTX_TYPE {
        return Err(Failure::new(
            ErrorCode::Invalid,
            format!(
                "sha256: {sha256} is not a .pptx deck (stored as {}); only decks have slides",
                owned.content_type
            ),
        ));
    }
    if owned.size > MAX_DECK_BYTES {
        return Err(Failure::new(
            ErrorCode::Invalid,
            format!(
                "sha256: {sha256} is {} bytes, over the {MAX_DECK_BYTES} a preview reads; download it",
                owned.size
            ),
        ));
    }
    let previews = state.previews.clone();
    let cached = previews.dir.join(&sha256).join("slides.json");
    if let Ok(text) = tokio::fs::read_to_string(&cached).await
        && let Ok(preview) = serde_json::from_str::<SlidePreviews>(&text)
    {
        return Ok(Json(preview));
    }
    let bytes = state.runner.store().get(&sha256).await?;
    let deck = tokio::task::spawn_blocking(move || skillbox_pptx::verify(&bytes))
        .await
        .map_err(|e| Failure::new(ErrorCode::Unknown, format!("verify: {e}")))?
        .map_err(|e| {
            Failure::new(
                ErrorCode::Invalid,
                format!("sha256: {sha256} is not a deck skillbox can read: {e}"),
            )
        })?;
    let outline: Vec<SlidePreview> = deck
        .slides
        .iter()
        .map(|slide| SlidePreview {
            number: slide.number,
            texts: slide
                .texts
                .iter()
                .map(|t| t.trim())
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
            image: None,
        })
        .collect();
    let outline_with = |note: String| SlidePreviews {
        sha256: sha256.clone(),
        format: PreviewFormat::Outline,
        slides: outline.clone(),
        note: Some(note),
    };
    let renderer = match &previews.renderer {
        Ok(renderer) => renderer.clone(),
        // Cheap to make again: not cached, so installing LibreOffice takes effect.
        Err(why) => return Ok(Json(outline_with(why.clone()))),
    };
    if outline.len() > MAX_SLIDES {
        return Ok(Json(outline_with(format!(
            "{} slides: previews render at most {MAX_SLIDES}",
            outline.len()
        ))));
    }
    previews.ensure_dir()?;
    let _slot = previews
        .renders
        .acquire()
        .await
        .map_err(|e| Failure::new(ErrorCode::Unknown, e.to_string()))?;
    // Another request may have rendered it while this one waited.
    if let Ok(text) = tokio::fs::read_to_string(&cached).await
        && let Ok(preview) = serde_json::from_str::<SlidePreviews>(&text)
    {
        return Ok(Json(preview));
    }
    let bytes = state.runner.store().get(&sha256).await?;
    let preview = match render(&renderer, &previews.dir, &bytes, outline.len()).await {
        Ok(rendered) => {
            let preview = SlidePreviews {
                sha256: sha256.clone(),
                format: PreviewFormat::Png,
                slides: outline
                    .iter()
                    .map(|slide| SlidePreview {
                        image: Some(format!("/v1/objects/{sha256}/slides/{}", slide.number)),
                        ..slide.clone()
                    })
                    .collect(),
                note: None,
            };
            publish(&rendered.out, &previews.dir.join(&sha256), &preview)?;
            preview
        }
        Err(why) => {
            tracing::warn!(%sha256, error = %why, "previews: render failed; answering the outline");
            // Cached too: a deck that cannot render is not rendered again at every look.
            let preview = outline_with(format!("the render failed: {why}"));
            let staged = tempfile::Builder::new()
                .prefix(".render-")
                .tempdir_in(&previews.dir)
                .map_err(|e| Failure::new(ErrorCode::Unknown, format!("previews: {e}")))?;
            publish(staged.path(), &previews.dir.join(&sha256), &preview)?;
            preview
        }
    };
    Ok(Json(preview))
}

/// Writes `slides.json` into `staged` and moves it to `dest` in one rename, so a
/// reader sees a whole preview or none.
fn publish(staged: &Path, dest: &Path, preview: &SlidePreviews) -> Result<(), Failure> {
    let text = serde_json::to_string(preview)
        .map_err(|e| Failure::new(ErrorCode::Unknown, e.to_string()))?;
    std::fs::write(staged.join("slides.json"), text)
        .map_err(|e| Failure::new(ErrorCode::Unknown, format!("previews: {e}")))?;
    match std::fs::rename(staged, dest) {
        Ok(()) => Ok(()),
        // Published by another render meanwhile: that one stands.
        Err(_) if dest.join("slides.json").exists() => Ok(()),
        Err(e) => Err(Failure::new(
            ErrorCode::Unknown,
            format!("previews: cannot publish {}: {e}", dest.display()),
        )),
    }
}

/// Renders `deck` to `slide-N.png` files, `slides` of them, in a work dir under `dir`
/// whose `out` the caller publishes.
async fn render(
    renderer: &Renderer,
    dir: &Path,
    deck: &[u8],
    slides: usize,
) -> Result<Rendered, String> {
    let work = tempfile::Builder::new()
        .prefix(".render-")
        .tempdir_in(dir)
        .map_err(|e| format!("a temp dir in {}: {e}", dir.display()))?;
    let (home, tmp, out) = (
        work.path().join("home"),
        work.path().join("tmp"),
        work.path().join("out"),
    );
    for d in [&home, &tmp, &out] {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(d)
            .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let input = work.path().join("deck.pptx");
    std::fs::write(&input, deck).map_err(|e| format!("{}: {e}", input.display()))?;
    let deadline = tokio::time::Instant::now() + RENDER_TIMEOUT;
    let profile = format!(
        "-env:UserInstallation=file://{}",
        url_path(&home.join("profile"))
    );
    bounded(
        tokio::process::Command::new(&renderer.soffice)
            .args([
                profile.as_str(),
                "--headless",
                "--invisible",
                "--nodefault",
                "--nolockcheck",
                "--nologo",
                "--norestore",
                "--convert-to",
                "pdf",
                "--outdir",
            ])
            .arg(work.path())
            .arg(&input),
        &home,
        &tmp,
        deadline,
        "soffice",
    )
    .await?;
    let pdf = work.path().join("deck.pdf");
    if !pdf.is_file() {
        return Err("soffice made no PDF".into());
    }
    bounded(
        tokio::process::Command::new(&renderer.pdftoppm)
            .args(["-png", "-r", "50", "-l", &MAX_SLIDES.to_string()])
            .arg(&pdf)
            .arg(out.join("page")),
        &home,
        &tmp,
        deadline,
        "pdftoppm",
    )
    .await?;
    // pdftoppm pads page numbers to the width of the last one (page-01.png): name
    // each slide-N.png.
    let mut pages = Vec::new();
    let mut total = 0u64;
    for entry in std::fs::read_dir(&out).map_err(|e| format!("{}: {e}", out.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let number = name
            .to_str()
            .and_then(|n| n.strip_prefix("page-"))
            .and_then(|n| n.strip_suffix(".png"))
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| format!("pdftoppm made an unexpected file {name:?}"))?;
        total += entry.metadata().map_err(|e| e.to_string())?.len();
        pages.push((number, entry.path()));
    }
    if total > MAX_PNG_BYTES {
        return Err(format!(
            "the PNGs came to {total} bytes, over {MAX_PNG_BYTES}"
        ));
    }
    if pages.len() != slides {
        return Err(format!(
            "LibreOffice made {} pages of a deck of {slides} slides",
            pages.len()
        ));
    }
    for (number, path) in pages {
        std::fs::rename(&path, out.join(format!("slide-{number}.png")))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(Rendered { _work: work, out })
}

/// The PNGs in `out`, inside a work dir that goes (profile, PDF, deck and all, and
/// `out` unless it was published) when this drops.
struct Rendered {
    _work: tempfile::TempDir,
    out: PathBuf,
}

/// A path as the path part of a `file://` URL.
fn url_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Kills a process group when dropped: whatever the tool left running goes with it.
struct GroupKill(Option<u32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok())
            && let Some(pid) = rustix::process::Pid::from_raw(pid)
        {
            // ESRCH (all gone already) is the usual answer.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Runs `command` in its own process group and network namespace (no interfaces up),
/// with a private HOME and TMPDIR, PATH its only other variable, no core files and no
/// file over [`MAX_OUTPUT_BYTES`], until `deadline`; then the whole group is killed,
/// whatever happened.
async fn bounded(
    command: &mut tokio::process::Command,
    home: &Path,
    tmp: &Path,
    deadline: tokio::time::Instant,
    what: &str,
) -> Result<(), String> {
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("TMPDIR", tmp)
        .env("LANG", "C.UTF-8")
        .env("SAL_USE_VCLPLUGIN", "svp")
        .current_dir(tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // A network namespace of its own with nothing in it: a deck can link to remote
    // content, and the render must not fetch it. Root can make one directly; another
    // user makes a user namespace first (its uid is then unmapped, which is enough to
    // read and write the temp dir, owned by the same user outside).
    let net_flags = if rustix::process::geteuid().is_root() {
        libc::CLONE_NEWNET
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNET
    };
    // SAFETY: the closure runs in the child between fork and exec, where the child is
    // single-threaded (so unshare(CLONE_NEWUSER) is allowed), and only calls unshare(2)
    // and setrlimit(2), which are async-signal-safe and allocate nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::unshare(net_flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            use rustix::process::{Resource, Rlimit, setrlimit};
            setrlimit(
                Resource::Fsize,
                Rlimit {
                    current: Some(MAX_OUTPUT_BYTES),
                    maximum: Some(MAX_OUTPUT_BYTES),
                },
            )?;
            setrlimit(
                Resource::Core,
                Rlimit {
                    current: Some(0),
                    maximum: Some(0),
                },
            )?;
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    let _group = GroupKill(child.id());
    match tokio::time::timeout_at(deadline, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "{what} did not finish within {} s (killed)",
            RENDER_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Ok(Ok(output)) if output.status.success() => Ok(()),
        Ok(Ok(output)) => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: String = stderr.chars().take(500).collect();
            Err(format!(
                "{what} failed ({}): {}",
                output.status,
                tail.trim()
            ))
        }
    }
}

/// One rendered slide of a stored deck, as `image/png`.
#[utoipa::path(
    get,
    path = "/v1/objects/{sha256}/slides/{number}",
    params(
        ("sha256" = String, Path, description = "a .pptx artifact's sha256"),
        ("number" = usize, Path, description = "the slide, from 1"),
    ),
    responses(
        (status = 200, description = "The slide as a PNG", content_type = "image/png"),
        (status = 400, description = "Not a sha256, or not a slide number", body = skillbox_protocol::ApiError),
        (status = 404, description = "No such artifact of this tenant, or no rendered slide", body = skillbox_protocol::ApiError),
    )
)]
pub(crate) async fn slide(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath((sha256, number)): UrlPath<(String, String)>,
) -> Result<Response, Failure> {
    owned_deck(&state, &tenant, &sha256)?;
    let number = number
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_SLIDES).contains(n))
        .ok_or_else(|| {
            Failure::new(
                ErrorCode::Invalid,
                format!("number: {number:?} is not a slide number in 1..={MAX_SLIDES}"),
            )
        })?;
    let path = state
        .previews
        .dir
        .join(&sha256)
        .join(format!("slide-{number}.png"));
    let bytes = tokio::fs::read(&path).await.map_err(|_| {
        Failure::new(
            ErrorCode::NotFound,
            format!(
                "no rendered slide {number} of {sha256}; GET /v1/objects/{sha256}/slides renders \
                 them when this server has LibreOffice"
            ),
        )
    })?;
    Response::builder()
        .header(header::CONTENT_TYPE, "image/png")
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::CACHE_CONTROL, "private, max-age=3600")
        .body(Body::from(bytes))
        .map_err(|e| Failure::new(ErrorCode::Unknown, e.to_string()))
}

/// Whether this host renders previews as PNG, in words (for `skillbox doctor`).
pub fn preview_report() -> (bool, String) {
    match Renderer::find() {
        Ok(r) => (
            true,
            format!("PNG ({} and {})", r.soffice.display(), r.pdftoppm.display()),
        ),
        Err(why) => (false, why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `script` under [`bounded`] in a fresh work dir; its stdout is `out`.
    async fn run_bounded(script: &str, limit: Duration) -> (Result<(), String>, String) {
        let work = tempfile::tempdir().expect("tempdir");
        let (home, tmp) = (work.path().join("home"), work.path().join("tmp"));
        std::fs::create_dir(&home).expect("home");
        std::fs::create_dir(&tmp).expect("tmp");
        let result = bounded(
            tokio::process::Command::new("/bin/sh").args(["-c", script]),
            &home,
            &tmp,
            tokio::time::Instant::now() + limit,
            "sh",
        )
        .await;
        let out = std::fs::read_to_string(tmp.join("out")).unwrap_or_default();
        (result, out)
    }

    #[tokio::test]
    async fn a_render_has_no_network_no_inherited_env_and_bounded_files() {
        let (result, out) = run_bounded(
            "{ cat /proc/net/dev; env; echo \"fsize $(ulimit -f) core $(ulimit -c)\"; } > out",
            Duration::from_secs(30),
        )
        .await;
        result.expect("sh ran");
        // Only `lo` in /proc/net/dev (two header lines, then one per interface).
        let interfaces: Vec<&str> = out
            .lines()
            .skip(2)
            .take_while(|line| line.contains(':') && !line.contains('='))
            .map(|line| line.split(':').next().unwrap_or("").trim())
            .collect();
        assert_eq!(interfaces, ["lo"], "{out}");
        let vars: Vec<&str> = out
            .lines()
            .filter_map(|line| line.split_once('=').map(|(name, _)| name))
            .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .collect();
        for var in &vars {
            assert!(
                [
                    "PATH",
                    "HOME",
                    "TMPDIR",
                    "LANG",
                    "SAL_USE_VCLPLUGIN",
                    "PWD",
                    "SHLVL",
                    "_"
                ]
                .contains(var),
                "{var} leaked into the render: {out}"
            );
        }
        // ulimit -f counts 512-byte blocks.
        assert!(
            out.contains(&format!("fsize {} core 0", MAX_OUTPUT_BYTES / 512)),
            "{out}"
        );
    }

    #[tokio::test]
    async fn a_render_past_its_deadline_is_killed_with_all_it_started() {
        let marker = 930_000_000 + std::process::id();
        let script = format!("sleep {marker} & sleep {marker}; echo never > out");
        let started = std::time::Instant::now();
        let (result, out) = run_bounded(&script, Duration::from_millis(500)).await;
        let error = result.expect_err("past its deadline");
        assert!(error.contains("did not finish"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(20));
        assert!(out.is_empty());
        // The background sleep was in the group too: nothing of it is left.
        let needle = format!("sleep {marker}");
        for _ in 0..100 {
            let left = std::fs::read_dir("/proc")
                .expect("/proc")
                .flatten()
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .any(|cmdline| {
                    String::from_utf8_lossy(&cmdline)
                        .replace('\0', " ")
                        .contains(&needle)
                });
            if !left {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("a process of the killed render is still running");
    }

    #[tokio::test]
    async fn a_failed_tool_says_how_it_ended() {
        let (result, _) =
            run_bounded("echo broken deck >&2; exit 3", Duration::from_secs(30)).await;
        let error = result.expect_err("exit 3");
        assert!(
            error.contains("sh failed") && error.contains("broken deck"),
            "{error}"
        );
    }

    #[test]
    fn a_render_left_behind_is_swept_and_one_going_on_is_not() {
        let data = tempfile::tempdir().expect("tempdir");
        let previews = data.path().join("previews");
        for name in [".render-old", ".render-now", "kept"] {
            std::fs::create_dir_all(previews.join(name).join("home")).expect("mkdir");
        }
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        for name in [".render-old", "kept"] {
            std::fs::File::open(previews.join(name))
                .and_then(|dir| dir.set_modified(hour_ago))
                .expect("age it");
        }
        let _ = Previews::new(data.path(), false);
        let mut left: Vec<String> = std::fs::read_dir(&previews)
            .expect("read")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        // The cached previews stay; so does a render that may still be going.
        assert_eq!(left, [".render-now", "kept"]);
    }

    #[test]
    fn profile_paths_are_escaped_for_a_file_url() {
        assert_eq!(url_path(Path::new("/data/a b/p%")), "/data/a%20b/p%25");
        assert_eq!(url_path(Path::new("/x/.render-AbC_1")), "/x/.render-AbC_1");
    }
}
