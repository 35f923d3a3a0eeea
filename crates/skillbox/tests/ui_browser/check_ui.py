"""skillbox's web UI in a real browser (Debian's chromium, driven by Playwright).

Run by crates/skillbox/tests/ui.rs against a `skillbox serve` it started:

    check_ui.py URL API_KEY CHROMIUM SCREENSHOTS_DIR DOWNLOAD_DIR png|outline KEYLESS_URL

It signs in (a wrong key is refused first), starts the demo prompt with the loopback
model, sees the two attempts (the ShapeType error sent back to the model, then the
verified deck), sees three slide previews (PNG or text outlines, as the server can),
downloads the deck and opens it as a zip of three slides, finds the run in the list
(and a plain POST /v1/run beside it, its file downloaded),
checks the page fits a phone's width and that nothing broke the Content-Security-Policy,
and writes a screenshot of each page. Then, on a loopback server without keys whose demo
holds its second script for 3 s, it needs no sign-in and sees the first attempt while
the run is still running. Prints `ok` after its last check.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
import zipfile
from pathlib import Path

from playwright.sync_api import ConsoleMessage, Page, expect, sync_playwright

TIMEOUT_MS = 60_000
# `expect` keeps its own default (5 s) apart from the context's; the slide previews are
# rendered by LibreOffice after the run, which takes longer than that on a busy 2-core machine.
expect.set_options(timeout=TIMEOUT_MS)


def shot(page: Page, directory: Path, name: str) -> None:
    page.screenshot(path=str(directory / f"{name}.png"), full_page=True)


def deck_slides(path: Path) -> int:
    """The slides of a .pptx, counted in its presentation part (and present as parts)."""
    with zipfile.ZipFile(path) as deck:
        assert deck.testzip() is None, "a corrupt entry in the deck"
        presentation = deck.read("ppt/presentation.xml").decode()
        ids = re.findall(r"<p:sldId\b", presentation)
        parts = [n for n in deck.namelist() if re.fullmatch(r"ppt/slides/slide\d+\.xml", n)]
        assert len(ids) == len(parts), (ids, parts)
        return len(ids)


def main() -> None:
    url, key, chromium, shots_dir, download_dir, expected, keyless = sys.argv[1:8]
    shots = Path(shots_dir)
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"{message.text} ({message.location.get('url', '')})")

    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=chromium, args=args)
        context = browser.new_context(viewport={"width": 1200, "height": 900}, accept_downloads=True)
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        page.on("console", console)
        page.on("pageerror", lambda error: problems.append(str(error)))

        # No key in this tab yet: the login form.
        page.goto(url)
        expect(page.locator("#view-login")).to_be_visible()
        expect(page.get_by_label("API key")).to_be_focused()
        shot(page, shots, "login")

        page.get_by_label("API key").fill("sbx_" + "0" * 64)
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#login-error")).to_contain_text("not known")
        # A 401 is expected here, and logged by the browser as a failed load.
        problems.clear()

        # Typed and sent with Enter: the keyboard is enough.
        page.get_by_label("API key").fill(key)
        page.get_by_label("API key").press("Enter")
        expect(page.locator("#view-runs")).to_be_visible()
        expect(page.locator("#runs-empty")).to_be_visible()

        page.get_by_role("navigation").get_by_role("link", name="New run").click()
        expect(page.locator("#view-new")).to_be_visible()
        expect(page.locator("#model-name")).to_have_text("loopback")
        expect(page.locator("#model-note")).to_contain_text("loopback demo")
        expect(page.get_by_label("Skill")).to_have_value("pptx")
        expect(page.get_by_label("Prompt")).to_have_value("Make a 3-slide pitch deck for WorkspaceX.")
        shot(page, shots, "new-run")

        page.get_by_role("button", name="Start run").click()
        expect(page).to_have_url(re.compile(r"#/runs/[0-9a-f]+$"))
        run_id = page.url.rsplit("/", 1)[1]

        attempts = page.locator("li.attempt")
        expect(attempts).to_have_count(2)
        first, second = attempts.nth(0), attempts.nth(1)
        expect(first).to_have_attribute("data-succeeded", "false")
        expect(first.locator("pre.script")).to_contain_text("pres.ShapeType")
        expect(first.locator("pre.stderr")).to_contain_text("Missing/Invalid shape parameter")
        expect(first.locator("h4", has_text="sent back to the model")).to_be_visible()
        expect(first).to_contain_text("exit 1")
        expect(second).to_have_attribute("data-succeeded", "true")
        expect(second).to_contain_text("exit 0")
        expect(second.locator(".verification")).to_contain_text("workspacex.pptx: 3 slides, verified")
        # The script is highlighted: keywords and strings in spans of their own.
        expect(second.locator("pre.script .tok-k").first).to_be_visible()
        expect(second.locator("pre.script .tok-s").first).to_be_visible()
        expect(page.locator("#run-status")).to_have_text("succeeded")

        slides = page.locator("#slides figure.slide")
        expect(slides).to_have_count(3)
        expect(page.locator("#slides")).to_have_attribute("data-format", expected)
        if expected == "png":
            images = page.locator("#slides img")
            expect(images).to_have_count(3)
            for i in range(3):
                image = images.nth(i)
                expect(image).to_have_attribute("src", re.compile(r"^blob:"))
                page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=image.element_handle())
                width = image.evaluate("(img) => img.naturalWidth")
                assert width >= 300, f"slide {i + 1} is {width} px wide"
            expect(images.nth(0)).to_have_attribute("alt", re.compile("Slide 1: WorkspaceX"))
        else:
            expect(slides.nth(0)).to_contain_text("WorkspaceX")
        expect(slides.nth(2)).to_contain_text(
            "hello@workspacex.example" if expected == "outline" else "Slide 3"
        )
        shot(page, shots, "run")

        with page.expect_download() as download:
            page.get_by_role("button", name="Download workspacex.pptx").click()
        saved = Path(download_dir) / download.value.suggested_filename
        download.value.save_as(saved)
        assert saved.name == "workspacex.pptx", saved
        assert deck_slides(saved) == 3

        # A phone's width: one column, nothing wider than the screen.
        page.set_viewport_size({"width": 390, "height": 844})
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the run page is {overflow} px wider than a narrow screen"
        shot(page, shots, "run-narrow")
        page.set_viewport_size({"width": 1200, "height": 900})

        # A plain run, sent to the API directly, is listed beside the agent runs.
        request = urllib.request.Request(
            url + "/v1/run",
            data=json.dumps({"script": "echo hi > hi.txt", "language": "sh"}).encode(),
            headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert json.load(answer)["exitCode"] == 0

        # The lists, newest first, reached and left with the keyboard.
        page.get_by_role("navigation").get_by_role("link", name="Runs").click()
        expect(page.locator("#view-runs")).to_be_visible()
        listed = page.locator("#runs-list a[data-run]")
        expect(listed).to_have_count(1)
        expect(listed.first).to_have_attribute("data-run", run_id)
        expect(listed.first).to_contain_text("succeeded")
        expect(listed.first).to_contain_text("2 attempts")
        expect(listed.first).to_contain_text("workspacex.pptx")
        # One page holds every run: no button for older ones.
        expect(page.locator("#runs-more")).to_be_hidden()
        plain = page.locator("#plain-list [data-plain-run]")
        expect(plain).to_have_count(1)
        expect(plain.first).to_contain_text("echo hi > hi.txt")
        expect(plain.first).to_contain_text("exit 0")
        with page.expect_download() as download:
            plain.first.get_by_role("button", name="Download hi.txt").click()
        hi = Path(download_dir) / "hi.txt"
        download.value.save_as(hi)
        assert hi.read_text() == "hi\n", hi.read_text()
        shot(page, shots, "runs")
        listed.first.focus()
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(f"#/runs/{run_id}$"))
        expect(page.locator("li.attempt")).to_have_count(2)

        # Signing out forgets the key: the API is not reachable from this tab any more.
        page.get_by_role("button", name="Sign out").click()
        expect(page.locator("#view-login")).to_be_visible()
        assert page.evaluate("sessionStorage.length") == 0

        # A loopback server without keys: no sign-in, and the timeline is live.
        page.goto(keyless)
        expect(page.locator("#view-runs")).to_be_visible()
        expect(page.locator("#runs-empty")).to_be_visible()
        expect(page.locator("#plain-empty")).to_be_visible()
        page.get_by_role("navigation").get_by_role("link", name="New run").click()
        page.get_by_role("button", name="Start run").click()
        attempts = page.locator("li.attempt")
        expect(attempts).to_have_count(1)
        expect(page.locator("#run-status")).to_have_text("running")
        expect(page.locator("#status")).to_contain_text("Running: attempt 2")
        expect(attempts.nth(0).locator("pre.stderr")).to_contain_text("Missing/Invalid shape parameter")
        expect(attempts).to_have_count(2)
        expect(page.locator("#run-status")).to_have_text("succeeded")
        expect(page.locator("#slides figure.slide")).to_have_count(3)

        csp = [m for m in problems if "Content Security Policy" in m]
        assert not csp, csp
        assert not problems, problems
        browser.close()
    print("ok")


if __name__ == "__main__":
    main()
