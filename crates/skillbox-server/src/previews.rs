//! Slide previews of a stored deck (`GET /v1/objects/{sha256}/slides[/{number}]`): each
//! slide as a PNG when LibreOffice and pdftoppm are installed, else the text of each
//! slide as the verifier reads it.
//!
//! The deck came from code skillbox ran for someone, so rendering it is a door: the
//! deck must verify first (bounded unzip, [`skillbox_pptx::verify`]), and LibreOffice
//! and pdftoppm then run in a native sandbox of their own, with every layer a run has
//! (no network, the host's files not there but the system directories, Landlock,
//! seccomp, memory, pids, disk and time bounds). A deck's links to the server's files
//! (`file:///…` images) find nothing, and an exploit of LibreOffice is in that sandbox.
//! The PNGs come out through the sandbox's file view, bounded; one render runs at a
//! time. Results are cached under `<data>/previews/<sha256>/` by the deck's SHA-256 and
//! removed when retention removes the deck.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::header;
use axum::response::Response;
use axum::{Extension, Json};
use skillbox_env::{Backend, ExecRequest, ExecutionEnv, FileKind, FileRead, Limits, SandboxSpec};
use skillbox_protocol::{ErrorCode, PreviewFormat, SlidePreview, SlidePreviews};
use skillbox_registry::{BackendRegistry, NativeEtc};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

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
/// All the PNGs of a deck together.
const MAX_PNG_BYTES: u64 = 64 << 20;
/// How every PNG file starts.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Where the deck, its PDF and its pages are in the render's sandbox: relative, so in
/// its workspace, which is every file operation's and the tools' working directory.
const DECK: &str = "deck.pptx";
const PDF: &str = "deck.pdf";
const PAGES: &str = "pages";

/// The render's sandbox: a run's layers, with room for LibreOffice, and the host's font
/// cache read-only.
fn render_spec() -> SandboxSpec {
    let mut spec = SandboxSpec {
        workspace: None,
        limits: render_limits(),
        ..SandboxSpec::default()
    };
    if Path::new(FONT_CACHE).is_dir() {
        spec.policy.read_only_mounts.push(skillbox_env::Mount {
            host: FONT_CACHE.into(),
            sandbox: FONT_CACHE.into(),
        });
    }
    spec
}

fn render_limits() -> Limits {
    Limits {
        memory_bytes: Some(2 << 30),
        pids: Some(256),
        cpu_seconds: Some(2 * RENDER_TIMEOUT.as_secs()),
        file_size_bytes: Some(256 << 20),
        timeout_ms: u64::try_from(RENDER_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
        output_bytes: 64 << 10,
        disk_bytes: Some(1 << 30),
        ..Limits::default()
    }
}

/// The two programs a PNG preview needs.
#[derive(Debug, Clone)]
pub struct Renderer {
    pub soffice: PathBuf,
    pub pdftoppm: PathBuf,
}

impl Renderer {
    /// Finds `soffice` and `pdftoppm` on PATH, or says which is missing and how to get
    /// it. Each must be where a native sandbox shows it (in the system directories,
    /// as a distribution's package puts it): that is where it runs.
    pub fn find() -> Result<Renderer, String> {
        let soffice = on_path("soffice").ok_or(
            "no soffice (LibreOffice) on PATH: slide previews are text outlines; \
             apt-get install libreoffice-impress for PNG previews",
        )?;
        let pdftoppm = on_path("pdftoppm").ok_or(
            "no pdftoppm on PATH: slide previews are text outlines; \
             apt-get install poppler-utils for PNG previews",
        )?;
        for program in [&soffice, &pdftoppm] {
            let real = std::fs::canonicalize(program).unwrap_or_else(|_| program.clone());
            if !skillbox_registry::native_shows(&real) {
                return Err(format!(
                    "{} is {}, outside the system directories a native sandbox shows \
                     (/usr, /bin, /lib…), where previews render: slide previews are text \
                     outlines; install LibreOffice and poppler-utils from the distribution's \
                     packages for PNG previews",
                    program.display(),
                    real.display()
                ));
            }
        }
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

/// The preview cache, the one render slot, and the native backend the renders' sandboxes
/// come from (the registry's [`BackendRegistry::native_with_etc`]).
#[derive(Debug)]
pub(crate) struct Previews {
    dir: PathBuf,
    renderer: Result<Renderer, String>,
    renders: Semaphore,
    /// The tenants with a render waiting for the slot or running: one each.
    rendering: Arc<Mutex<HashSet<Arc<str>>>>,
    native: Arc<dyn Backend>,
}

/// A tenant's one render, waiting or running, until dropped.
struct TenantRender {
    rendering: Arc<Mutex<HashSet<Arc<str>>>>,
    tenant: Arc<str>,
}

impl Drop for TenantRender {
    fn drop(&mut self) {
        if let Ok(mut rendering) = self.rendering.lock() {
            rendering.remove(&self.tenant);
        }
    }
}

/// What fontconfig reads from `/etc`: shown in the renders' sandboxes only.
const RENDER_ETC: &[&str] = &["/etc/fonts"];
/// LibreOffice's configuration. A render's sandbox sees, there, a copy of what a render
/// reads of the host's (`libreoffice_etc`), never the host's own: an admin may keep an
/// LDAP password in an `.xcd` of its registry. Never in a run's sandbox.
const LIBREOFFICE_ETC: &str = "/etc/libreoffice";
/// The registry modules of LibreOffice's own that a render reads: the core and Impress
/// (a deck renders with these and a language pack; measured with Debian's 7.4 by
/// rendering with each left out), Draw and the graphic filters for the shapes and
/// pictures of a slide.
const RENDER_MODULES: &[&str] = &["main.xcd", "impress.xcd", "draw.xcd", "graphicfilter.xcd"];
/// The most bytes of one registry file copied.
const MAX_REGISTRY_FILE: u64 = 32 << 20;

/// Whether `registry/<relative>` is one a render reads: a module of [`RENDER_MODULES`],
/// or a language pack LibreOffice ships (`Langpack-<lang>.xcd`, and under `res/`
/// `fcfg_langpack_<lang>.xcd` and `registry_<lang>.xcd`). Nothing else an admin may
/// have added (`oo-ldap.xcd`, another name) is.
fn admitted(relative: &Path) -> bool {
    let lang = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let names: Vec<&str> = relative.iter().filter_map(|c| c.to_str()).collect();
    match names[..] {
        [name] => {
            RENDER_MODULES.contains(&name)
                || name
                    .strip_prefix("Langpack-")
                    .and_then(|n| n.strip_suffix(".xcd"))
                    .is_some_and(lang)
        }
        ["res", name] => ["fcfg_langpack_", "registry_"].iter().any(|prefix| {
            name.strip_prefix(prefix)
                .and_then(|n| n.strip_suffix(".xcd"))
                .is_some_and(lang)
        }),
        _ => false,
    }
}

/// A copy under `under` of what a render reads of `source` (the host's
/// `/etc/libreoffice`): of its `registry/`, the [`admitted`] files that are regular
/// files (a link is not followed), each at most [`MAX_REGISTRY_FILE`]; nothing else.
/// Named by a hash of what it holds, made once (files 0644, directories 0755); its
/// path, or `None` when `source` has no `registry/`.
fn libreoffice_etc(source: &Path, under: &Path) -> std::io::Result<Option<PathBuf>> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let registry = source.join("registry");
    if !registry.is_dir() {
        return Ok(None);
    }
    let mut files = Vec::new();
    for sub in [Path::new(""), Path::new("res")] {
        let Ok(entries) = std::fs::read_dir(registry.join(sub)) else {
            continue;
        };
        for entry in entries {
            let entry = entry?;
            let relative = sub.join(entry.file_name());
            let meta = entry.metadata()?;
            if !admitted(&relative) || !meta.file_type().is_file() {
                continue;
            }
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(entry.path())?;
            let mut bytes = Vec::new();
            (&mut file)
                .take(MAX_REGISTRY_FILE + 1)
                .read_to_end(&mut bytes)?;
            if bytes.len() as u64 > MAX_REGISTRY_FILE || !file.metadata()?.is_file() {
                return Err(std::io::Error::other(format!(
                    "{}: not a regular file of at most {MAX_REGISTRY_FILE} bytes",
                    entry.path().display()
                )));
            }
            files.push((relative, bytes));
        }
    }
    files.sort();
    let mut hash = Sha256::new();
    for (relative, bytes) in &files {
        hash.update(relative.as_os_str().as_encoded_bytes());
        hash.update([0]);
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    }
    let digest: String = hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = under.join(format!("libreoffice-{digest}"));
    if dir.is_dir() {
        return Ok(Some(dir));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(under)?;
    let staging = under.join(format!(".staging-{}-{digest}", std::process::id()));
    let build = || -> std::io::Result<()> {
        let _ = std::fs::remove_dir_all(&staging);
        // Readable by the render's user, whatever the umask (skillbox's own is 077):
        // a mode given at creation is masked by it, one set after is not.
        let open = std::fs::Permissions::from_mode(0o755);
        for dir in [
            staging.clone(),
            staging.join("registry"),
            staging.join("registry/res"),
        ] {
            std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
            std::fs::set_permissions(&dir, open.clone())?;
        }
        for (relative, bytes) in &files {
            let target = staging.join("registry").join(relative);
            std::fs::write(&target, bytes)?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644))?;
        }
        Ok(())
    };
    let built = build().and_then(|()| std::fs::rename(&staging, &dir));
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&staging);
        // Another server on this data dir may have made it first.
        if !dir.is_dir() {
            return Err(e);
        }
    }
    Ok(Some(dir))
}
/// fontconfig's cache of the host's fonts, shown read-only so a render does not build
/// its own (where it is).
const FONT_CACHE: &str = "/var/cache/fontconfig";

/// The `/etc` renders' native sandboxes show: fontconfig's dir, and at
/// `/etc/libreoffice` a copy under `copies` of what a render reads of `libreoffice`
/// (the host's; taken when the server starts), none when there is none or it cannot
/// be copied (then LibreOffice fails to start and previews are outlines saying so).
fn render_etc(libreoffice: Option<&Path>, copies: &Path) -> NativeEtc {
    let mut etc = NativeEtc {
        host: RENDER_ETC,
        made: Vec::new(),
    };
    let Some(source) = libreoffice else {
        return etc;
    };
    match libreoffice_etc(source, copies) {
        Ok(Some(copy)) => etc.made.push((LIBREOFFICE_ETC, copy)),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "previews: cannot copy LibreOffice's configuration; renders go without it");
        }
    }
    etc
}

impl Previews {
    pub(crate) fn new(data_dir: &Path, backends: &BackendRegistry, png: bool) -> Previews {
        let renderer = if png {
            Renderer::find()
        } else {
            Err("PNG previews are off on this server".into())
        };
        let dir = data_dir.join("previews");
        let previews = Previews {
            // Its own backend, not the runs' registry's: no pool of sandboxes made ahead
            // for runs is taken from or reshaped by a render, and only its sandboxes show
            // LibreOffice's configuration.
            native: backends.native_with_etc(render_etc(
                renderer.is_ok().then_some(Path::new(LIBREOFFICE_ETC)),
                &dir.join("etc"),
            )),
            dir,
            renderer,
            renders: Semaphore::new(1),
            rendering: Arc::default(),
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

    /// `tenant`'s one render, if it has none waiting or running.
    fn hold_render(&self, tenant: &Tenant) -> Option<TenantRender> {
        let mut rendering = self.rendering.lock().ok()?;
        rendering.insert(tenant.0.clone()).then(|| TenantRender {
            rendering: self.rendering.clone(),
            tenant: tenant.0.clone(),
        })
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
async fn owned_deck(
    state: &AppState,
    tenant: &Tenant,
    sha256: &str,
) -> Result<skillbox_store::OwnedObject, Failure> {
    check_sha(sha256)?;
    state
        .owners
        .get(tenant.as_str(), sha256)
        .await?
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
    let owned = owned_deck(&state, &tenant, &sha256).await?;
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
    // One render a tenant at once: a tenant's decks wait behind no one else's queue of
    // them, only behind the render going.
    let _mine = previews.hold_render(&tenant).ok_or_else(|| {
        Failure::overloaded(
            "a slide render of yours is already waiting or running; ask again once it has answered",
            5,
        )
    })?;
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
    let env = match previews.native.create(render_spec()).await {
        Ok(env) => env,
        // This host's doing, not the deck's: not cached, so the next look tries again.
        Err(e) => {
            tracing::warn!(%sha256, error = %e.message, "previews: no native sandbox to render in");
            return Ok(Json(outline_with(format!(
                "no native sandbox to render in here: {}",
                e.message
            ))));
        }
    };
    let deadline = tokio::time::Instant::now() + RENDER_TIMEOUT;
    // A server shutting down ends the render with the runs.
    let cancel = state.runs_cancel().child_token();
    let rendered = render(
        env.as_ref(),
        &renderer,
        bytes.into(),
        outline.len(),
        deadline,
        &cancel,
    )
    .await;
    if let Err(e) = env.cleanup().await {
        tracing::warn!(%sha256, error = %e.message, "previews: cannot remove the render's sandbox");
    }
    if cancel.is_cancelled() {
        // Ended by the shutdown, not by the deck: nothing cached.
        return Err(Failure::new(
            ErrorCode::Unavailable,
            "the server is shutting down; ask for the slides again once it is back",
        ));
    }
    let staged = tempfile::Builder::new()
        .prefix(".render-")
        .tempdir_in(&previews.dir)
        .map_err(|e| Failure::new(ErrorCode::Unknown, format!("previews: {e}")))?;
    let preview = match rendered {
        Ok(pages) => {
            for (number, png) in &pages {
                let path = staged.path().join(format!("slide-{number}.png"));
                std::fs::write(&path, png).map_err(|e| {
                    Failure::new(
                        ErrorCode::Unknown,
                        format!("previews: cannot write {}: {e}", path.display()),
                    )
                })?;
            }
            SlidePreviews {
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
            }
        }
        Err(why) => {
            tracing::warn!(%sha256, error = %why, "previews: render failed; answering the outline");
            // Cached too: a deck that cannot render is not rendered again at every look.
            outline_with(format!("the render failed: {why}"))
        }
    };
    publish(staged.path(), &previews.dir.join(&sha256), &preview)?;
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

/// Renders `deck` in `env` (a native sandbox of its own) to one PNG a slide, `slides`
/// of them, numbered from 1, before `deadline`.
async fn render(
    env: &dyn ExecutionEnv,
    renderer: &Renderer,
    deck: Vec<u8>,
    slides: usize,
    deadline: tokio::time::Instant,
    cancel: &CancellationToken,
) -> Result<Vec<(usize, Vec<u8>)>, String> {
    let soffice = tool(
        &renderer.soffice,
        &[
            "-env:UserInstallation=file:///tmp/profile",
            "--headless",
            "--invisible",
            "--nodefault",
            "--nolockcheck",
            "--nologo",
            "--norestore",
            "--convert-to",
            // Hidden slides too: one page a slide.
            r#"pdf:impress_pdf_Export:{"ExportHiddenSlides":{"type":"boolean","value":"true"}}"#,
            "--outdir",
            ".",
            DECK,
        ],
        deadline,
    )?;
    let ran = env
        .write_and_exec(vec![(PathBuf::from(DECK), deck)], soffice, cancel)
        .await
        .map_err(|e| format!("soffice: {}", e.message))?;
    ended("soffice", &ran)?;
    let made = env.file_info(Path::new(PDF), cancel).await;
    if !made.is_ok_and(|info| info.kind == FileKind::File) {
        return Err("soffice made no PDF".into());
    }
    env.create_dir(Path::new(PAGES), false, cancel)
        .await
        .map_err(|e| format!("{PAGES}: {}", e.message))?;
    let last = MAX_SLIDES.to_string();
    let page = format!("{PAGES}/page");
    let pdftoppm = tool(
        &renderer.pdftoppm,
        &["-png", "-r", "50", "-l", &last, PDF, &page],
        deadline,
    )?;
    let ran = env
        .exec(pdftoppm, cancel)
        .await
        .map_err(|e| format!("pdftoppm: {}", e.message))?;
    ended("pdftoppm", &ran)?;
    let listed = env
        .list_dir(Path::new(PAGES), cancel)
        .await
        .map_err(|e| format!("{PAGES}: {}", e.message))?;
    let pages = listed_pages(&listed, slides)?;
    let paths: Vec<PathBuf> = pages.iter().map(|(_, path)| path.clone()).collect();
    let read = env
        .read_files(&paths, MAX_PNG_BYTES, cancel)
        .await
        .map_err(|e| format!("{PAGES}: {}", e.message))?;
    let mut total = 0u64;
    let mut pngs = Vec::with_capacity(pages.len());
    for ((number, path), read) in pages.into_iter().zip(read) {
        let FileRead::Content(bytes) = read else {
            return Err(format!("{} changed while it was read", path.display()));
        };
        if !bytes.starts_with(PNG_SIGNATURE) {
            return Err(format!("{} is not a PNG", path.display()));
        }
        total = total.saturating_add(bytes.len() as u64);
        if total > MAX_PNG_BYTES {
            return Err(format!("the PNGs came to over {MAX_PNG_BYTES} bytes"));
        }
        pngs.push((number, bytes));
    }
    Ok(pngs)
}

/// The pages in `listed` (pdftoppm's output directory), one a slide, as (slide number,
/// path in the sandbox): pdftoppm names them page-N.png, N padded to the width of the
/// last one (page-01.png), and there must be exactly those, regular files, and nothing
/// else, of at most [`MAX_PNG_BYTES`] together.
fn listed_pages(
    listed: &[skillbox_env::DirEntry],
    slides: usize,
) -> Result<Vec<(usize, PathBuf)>, String> {
    let width = slides.to_string().len();
    let expected: Vec<String> = (1..=slides)
        .map(|n| format!("page-{n:0width$}.png"))
        .collect();
    let mut total = 0u64;
    for entry in listed {
        if entry.kind != FileKind::File || !expected.contains(&entry.name) {
            return Err(format!(
                "pdftoppm made an unexpected entry {:?}",
                entry.name
            ));
        }
        total = total.saturating_add(entry.size.unwrap_or(0));
    }
    if total > MAX_PNG_BYTES {
        return Err(format!(
            "the PNGs came to {total} bytes, over {MAX_PNG_BYTES}"
        ));
    }
    if listed.len() != slides {
        return Err(format!(
            "LibreOffice made {} pages of a deck of {slides} slides",
            listed.len()
        ));
    }
    Ok(expected
        .iter()
        .enumerate()
        .map(|(i, name)| (i + 1, PathBuf::from(PAGES).join(name)))
        .collect())
}

/// One of the render's programs, run in the sandbox's workspace with a HOME of its own on the
/// sandbox's `/tmp`, until `deadline`.
fn tool(
    program: &Path,
    args: &[&str],
    deadline: tokio::time::Instant,
) -> Result<ExecRequest, String> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if left.is_zero() {
        return Err(format!(
            "the render did not finish within {} s",
            RENDER_TIMEOUT.as_secs()
        ));
    }
    let mut argv = vec![program.display().to_string()];
    argv.extend(args.iter().map(|a| (*a).to_string()));
    let mut request = ExecRequest::argv(argv);
    request.timeout = Some(left);
    request.env = [
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("SAL_USE_VCLPLUGIN", "svp"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Ok(request)
}

/// Whether a tool ended well; if not, how it ended, with the tail of what it said.
fn ended(what: &str, output: &skillbox_protocol::ExecOutput) -> Result<(), String> {
    if output.success() {
        return Ok(());
    }
    let how = if output.timed_out {
        format!(
            "did not finish within {} s (killed)",
            RENDER_TIMEOUT.as_secs()
        )
    } else if let Some(limit) = output
        .limit_hit
        .filter(|limit| *limit != skillbox_protocol::LimitKind::Output)
    {
        format!("hit its {} limit", limit.as_str())
    } else if let Some(signal) = output.signal {
        format!("was killed by signal {signal}")
    } else {
        format!("failed (exit {})", output.exit_code.unwrap_or(-1))
    };
    let stderr = output.stderr_text();
    let tail: String = stderr.trim().chars().take(500).collect();
    Err(if tail.is_empty() {
        format!("{what} {how}")
    } else {
        format!("{what} {how}: {tail}")
    })
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
    owned_deck(&state, &tenant, &sha256).await?;
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
    let renderer = match Renderer::find() {
        Ok(renderer) => renderer,
        Err(why) => return (false, why),
    };
    let native = skillbox_registry::native_probe();
    if !native.available {
        return (
            false,
            format!(
                "slide previews render in a native sandbox, unavailable here ({}): they are text outlines",
                native.reason.unwrap_or_default()
            ),
        );
    }
    (
        true,
        format!(
            "PNG ({} and {}, in a native sandbox)",
            renderer.soffice.display(),
            renderer.pdftoppm.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry of a server on `data_dir`.
    fn registry(data_dir: &Path) -> BackendRegistry {
        BackendRegistry::new(skillbox_registry::RegistryConfig::new(data_dir, "unused"))
    }

    /// The backend renders run in on a server on `data_dir` (see [`render_etc`]).
    fn render_backend(
        data_dir: &Path,
        libreoffice: Option<&Path>,
        copies: &Path,
    ) -> Arc<dyn Backend> {
        registry(data_dir).native_with_etc(render_etc(libreoffice, copies))
    }

    /// The copy a render reads is readable by the render's user under skillbox's own
    /// umask (077, set by the binary): the render runs as another uid, and a 0700
    /// `registry/` left LibreOffice without its configuration (it hung, then the
    /// previews were outlines).
    #[test]
    fn the_libreoffice_copy_is_readable_under_a_private_umask() {
        use std::os::unix::fs::PermissionsExt;
        let host = tempfile::tempdir().expect("tempdir");
        let source = host.path().join("libreoffice");
        std::fs::create_dir_all(source.join("registry/res")).expect("mkdir");
        std::fs::write(source.join("registry/main.xcd"), "<oor:data/>").expect("write");
        std::fs::write(
            source.join("registry/res/fcfg_langpack_en-US.xcd"),
            "<oor:data/>",
        )
        .expect("write");
        let data = tempfile::tempdir().expect("tempdir");
        // SAFETY: umask has no preconditions; it is set back at once (each test is a
        // process of its own under nextest).
        let before = unsafe { libc::umask(skillbox_env::PRIVATE_UMASK) };
        let made = libreoffice_etc(&source, &data.path().join("etc"));
        // SAFETY: as above.
        unsafe { libc::umask(before) };
        let dir = made.expect("copied").expect("a copy");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        for d in [dir.clone(), dir.join("registry"), dir.join("registry/res")] {
            assert_eq!(mode(&d), 0o755, "{}", d.display());
        }
        for f in ["registry/main.xcd", "registry/res/fcfg_langpack_en-US.xcd"] {
            assert_eq!(mode(&dir.join(f)), 0o644, "{f}");
        }
    }

    /// A render with `soffice` standing in for LibreOffice, in a native sandbox of its
    /// own, until `limit`; `None` where the native sandbox does not run.
    async fn render_with(soffice: &str, limit: Duration) -> Option<Result<(), String>> {
        let available = skillbox_registry::native_probe().available;
        assert!(
            available || !skillbox_env::testkit::require_all(),
            "native sandbox unavailable"
        );
        if !available {
            return None;
        }
        let data = tempfile::tempdir().expect("tempdir");
        let env = render_backend(data.path(), Some(Path::new(LIBREOFFICE_ETC)), data.path())
            .create(render_spec())
            .await
            .expect("a render's sandbox");
        let renderer = Renderer {
            soffice: PathBuf::from(soffice),
            pdftoppm: PathBuf::from("/bin/true"),
        };
        let deadline = tokio::time::Instant::now() + limit;
        let cancel = CancellationToken::new();
        let rendered = render(
            env.as_ref(),
            &renderer,
            b"deck".to_vec(),
            1,
            deadline,
            &cancel,
        )
        .await;
        env.cleanup().await.expect("cleanup");
        Some(rendered.map(drop))
    }

    #[test]
    fn only_the_registry_files_a_render_reads_are_admitted() {
        for name in [
            "main.xcd",
            "impress.xcd",
            "draw.xcd",
            "graphicfilter.xcd",
            "Langpack-en-US.xcd",
            "res/fcfg_langpack_en-US.xcd",
            "res/registry_pt-BR.xcd",
        ] {
            assert!(admitted(Path::new(name)), "{name}");
        }
        for name in [
            "oo-ldap.xcd",
            "oo-ad-ldap.xcd.sample",
            "company.xcd",
            "main.xcd.bak",
            "Langpack-.xcd",
            "Langpack-../x.xcd",
            "res/main.xcd",
            "res/sub/registry_en.xcd",
            "writer.xcd",
            "../main.xcd",
        ] {
            assert!(!admitted(Path::new(name)), "{name}");
        }
    }

    /// Runs `script` with `sh` in a render's sandbox of `native`: its stdout.
    async fn in_a_render_sandbox(native: &Arc<dyn Backend>, script: &str) -> String {
        let env = native
            .create(render_spec())
            .await
            .expect("a render's sandbox");
        let out = env
            .exec(
                ExecRequest::argv(["sh", "-c", script]),
                &CancellationToken::new(),
            )
            .await
            .expect("exec");
        env.cleanup().await.expect("cleanup");
        assert_eq!(out.exit_code, Some(0), "{}", out.stderr_text());
        out.stdout_text()
    }

    /// The attack: an admin keeps an LDAP password in LibreOffice's registry (an
    /// `oo-ldap.xcd` beside the modules, another `.xcd`, a link to a file elsewhere, a
    /// file beside the registry), and a deck exploits LibreOffice to read what its
    /// sandbox shows. A render's sandbox shows, at `/etc/libreoffice`, only the modules a
    /// render reads: no byte of the secret anywhere in its `/etc`. (Made from a stand-in
    /// for `/etc/libreoffice`: the host's is not changed.) On this host's own, the
    /// render's sandbox shows the admitted files only (before, the whole directory,
    /// its `sofficerc`, `psprint.conf` and `.sample` links with it).
    #[tokio::test]
    async fn a_secret_in_libreoffice_s_config_is_not_in_a_render_s_sandbox() {
        if !skillbox_registry::native_probe().available {
            assert!(
                !skillbox_env::testkit::require_all(),
                "native sandbox unavailable"
            );
            return;
        }
        const SECRET: &str = "ldap-password-7f3a91";
        let host = tempfile::tempdir().expect("tempdir");
        let source = host.path().join("libreoffice");
        std::fs::create_dir_all(source.join("registry/res")).expect("mkdir");
        let write = |name: &str, body: &str| {
            std::fs::write(source.join(name), body).expect("write");
        };
        write("registry/main.xcd", "<oor:data/>");
        write("registry/impress.xcd", "<oor:data/>");
        write("registry/Langpack-en-US.xcd", "<oor:data/>");
        write("registry/res/fcfg_langpack_en-US.xcd", "<oor:data/>");
        let ldap = format!(
            "<oor:data><oor:component-data oor:package=\"org.openoffice\" oor:name=\"LDAP\">\
             <prop oor:name=\"SearchPassword\"><value>{SECRET}</value></prop></oor:component-data></oor:data>"
        );
        write("registry/oo-ldap.xcd", &ldap);
        write("registry/company.xcd", &ldap);
        write("registry/res/registry_en-US.xcd.orig", &ldap);
        write("psprint.conf", SECRET);
        std::fs::write(host.path().join("elsewhere.xcd"), &ldap).expect("write");
        std::os::unix::fs::symlink(
            host.path().join("elsewhere.xcd"),
            source.join("registry/draw.xcd"),
        )
        .expect("symlink");
        let data = tempfile::tempdir().expect("tempdir");
        let native = render_backend(data.path(), Some(&source), &data.path().join("etc"));
        let shown = in_a_render_sandbox(
            &native,
            &format!("cd /etc/libreoffice && find . | sort; grep -rl {SECRET} /etc || true"),
        )
        .await;
        assert_eq!(
            shown,
            ".\n./registry\n./registry/Langpack-en-US.xcd\n./registry/impress.xcd\n\
             ./registry/main.xcd\n./registry/res\n./registry/res/fcfg_langpack_en-US.xcd\n"
        );

        // This host's own configuration, as a render's sandbox sees it.
        let host_etc = Path::new(LIBREOFFICE_ETC);
        if !host_etc.join("registry").is_dir() {
            return;
        }
        let native = render_backend(data.path(), Some(host_etc), &data.path().join("etc"));
        let shown =
            in_a_render_sandbox(&native, "cd /etc/libreoffice && find . -type f -o -type l").await;
        let files: Vec<&str> = shown.lines().collect();
        assert!(files.contains(&"./registry/main.xcd"), "{shown}");
        for file in &files {
            let relative = Path::new(file.trim_start_matches("./registry/"));
            assert!(
                file.starts_with("./registry/") && admitted(relative),
                "{file} is shown: {shown}"
            );
        }
    }

    #[tokio::test]
    async fn a_failed_tool_says_how_it_ended() {
        let Some(rendered) = render_with("/bin/false", Duration::from_secs(30)).await else {
            return;
        };
        let error = rendered.expect_err("exit 1");
        assert_eq!(error, "soffice failed (exit 1)");
        // A tool that says nothing of a PDF made none.
        let Some(rendered) = render_with("/bin/true", Duration::from_secs(30)).await else {
            return;
        };
        assert_eq!(rendered.expect_err("no PDF"), "soffice made no PDF");
    }

    #[tokio::test]
    async fn a_render_past_its_deadline_is_killed() {
        let soffice = match Renderer::find() {
            Ok(renderer) => renderer.soffice,
            Err(why) => return skillbox_env::testkit::skip("a render past its deadline", &why),
        };
        let started = std::time::Instant::now();
        // LibreOffice takes longer than that to start.
        let Some(rendered) =
            render_with(&soffice.display().to_string(), Duration::from_millis(200)).await
        else {
            return;
        };
        let error = rendered.expect_err("past its deadline");
        assert!(error.starts_with("soffice did not finish"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(20));
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
        let _ = Previews::new(data.path(), &registry(data.path()), false);
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
    fn the_pages_are_one_a_slide_named_as_pdftoppm_names_them_and_nothing_else() {
        let file = |name: &str, size: u64| skillbox_env::DirEntry {
            name: name.into(),
            kind: FileKind::File,
            size: Some(size),
        };
        let three = [
            file("page-2.png", 9),
            file("page-1.png", 9),
            file("page-3.png", 9),
        ];
        let pages = listed_pages(&three, 3).expect("three pages");
        assert_eq!(pages[0], (1, PathBuf::from("pages/page-1.png")));
        assert_eq!(pages[2], (3, PathBuf::from("pages/page-3.png")));
        // Padded to the width of the last: page-01.png of twelve.
        let twelve: Vec<_> = (1..=12)
            .map(|n| file(&format!("page-{n:02}.png"), 9))
            .collect();
        assert_eq!(listed_pages(&twelve, 12).expect("twelve").len(), 12);
        for (listed, slides, why) in [
            (
                vec![file("page-1.png", 9), file("page-01.png", 9)],
                2,
                "unexpected",
            ),
            (vec![file("page-+1.png", 9)], 1, "unexpected"),
            (
                vec![file("page-1.png", 9), file("page-3.png", 9)],
                2,
                "unexpected",
            ),
            (
                vec![file("page-1.png", 9)],
                2,
                "made 1 pages of a deck of 2",
            ),
            (vec![file("page-1.png", MAX_PNG_BYTES + 1)], 1, "over"),
            (
                vec![skillbox_env::DirEntry {
                    name: "page-1.png".into(),
                    kind: FileKind::Symlink,
                    size: None,
                }],
                1,
                "unexpected",
            ),
        ] {
            let error = listed_pages(&listed, slides).expect_err(why);
            assert!(error.contains(why), "{error}");
        }
    }

    #[test]
    fn a_tenant_has_one_render_at_once() {
        let data = tempfile::tempdir().expect("tempdir");
        let previews = Previews::new(data.path(), &registry(data.path()), false);
        let (a, b) = (Tenant("a".into()), Tenant("b".into()));
        let held = previews.hold_render(&a).expect("a's first");
        assert!(previews.hold_render(&a).is_none(), "a's second");
        let other = previews.hold_render(&b).expect("b is not a");
        drop(held);
        assert!(
            previews.hold_render(&a).is_some(),
            "a's, once the first is done"
        );
        drop(other);
    }

    #[test]
    fn a_renderer_outside_what_a_sandbox_shows_is_refused() {
        assert!(skillbox_registry::native_shows(Path::new(
            "/usr/bin/soffice"
        )));
        assert!(!skillbox_registry::native_shows(Path::new(
            "/opt/libreoffice/program/soffice"
        )));
        assert!(!skillbox_registry::native_shows(Path::new("/usr")));
        assert!(!skillbox_registry::native_shows(Path::new(
            "/usrx/bin/soffice"
        )));
    }
}
