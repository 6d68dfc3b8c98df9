"""A real headless browser for the live page's test: Debian's chromium, run as the
project's test set-up installs it (`make test` does where it can: root and apt)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.paths import REPO

ARTIFACTS = REPO / "test-artifacts"
"""Screenshots the tests keep (ignored by git): open them to see what the page showed."""

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")
"""Without the background-networking flags chromium tries to reach Google's hosts, which a
closed machine refuses many times a second; /dev/shm is small in containers (CI's among them)."""


def browser() -> str | None:
    return next((path for name in ("chromium", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name)) is not None), None)


def render(url: str, *, screenshot: Path, wait_ms: int = 8000) -> str:
    """The page's DOM after `wait_ms` of the page's own time (its fetches and timers run),
    and a screenshot of it saved to `screenshot`."""
    executable = browser()
    assert executable is not None
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    common = [*FLAGS, f"--virtual-time-budget={wait_ms}", "--window-size=1280,900"]
    with tempfile.TemporaryDirectory() as profile:  # one start of the browser: the DOM and the picture
        shown = subprocess.run([executable, *common, f"--user-data-dir={profile}", f"--screenshot={screenshot}",
                                "--dump-dom", url], capture_output=True, text=True, timeout=90)
    assert shown.returncode == 0 and screenshot.is_file(), shown.stderr[-2000:]
    return shown.stdout
