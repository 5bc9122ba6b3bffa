"""``--png``: a static picture of the HTML report, taken by headless Chromium.

Why Chromium and not Pillow: the PNG is then exactly the page a person opens — same SVG, same
fonts, same layout — with no second drawing code to keep in step, and no image library added to
rmqtrace's dependencies. Chromium comes from the OS (Debian: ``apt-get install chromium``);
when none is found the error says so and the HTML report is still written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..environ import environment

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
HEADLESS_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
                  "--mute-audio", "--no-default-browser-check")


MAX_HEIGHT = 16_000  # Chromium's screenshot surface has limits; a longer page is cut here


class PngError(Exception):
    """No browser to draw with, or it failed; the message says what to do."""


def find_chromium() -> str | None:
    """``$RMQTRACE_CHROMIUM``, else the first Chromium or Chrome on PATH, else /usr/bin/chromium."""
    env = environment().get("RMQTRACE_CHROMIUM")
    if env:
        return env if Path(env).exists() or shutil.which(env) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def no_chromium_message() -> str:
    return ("--png needs Chromium or Chrome, and none was found (Debian/Ubuntu: `apt-get install chromium`; "
            "or set RMQTRACE_CHROMIUM to the browser's path). The HTML report does not need it.")


def chromium_command(browser: str, user_data_dir: str | Path, *extra: str) -> list[str]:
    return [browser, *HEADLESS_FLAGS, f"--user-data-dir={user_data_dir}", *extra]


def _run(cmd: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise PngError(f"{cmd[0]} took longer than {timeout:g} s to {what}") from exc
    except OSError as exc:
        raise PngError(f"cannot run {cmd[0]}: {exc}") from exc


_MEASURE = ("<script>document.title = 'rmqtrace-height:' + Math.ceil(document.documentElement"
            ".getBoundingClientRect().height);</script>")
_HEIGHT = re.compile(r"rmqtrace-height:(\d+)")


def page_height(browser: str, html_path: Path, width: int, timeout: float) -> int | None:
    """The page's laid-out height at ``width``, measured on a scratch copy with one line of script
    appended (the report itself has no script); None when it cannot be measured."""
    text = html_path.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="rmqtrace-chromium-") as tmp:
        probe = Path(tmp) / "measure.html"
        cut = text.rfind("</body>")
        probe.write_text(text[:cut] + _MEASURE + text[cut:] if cut >= 0 else text + _MEASURE, encoding="utf-8")
        proc = _run(chromium_command(browser, Path(tmp) / "profile", f"--window-size={width},1000", "--dump-dom",
                                     probe.as_uri()), timeout, f"lay out {html_path}")
    m = _HEIGHT.search(proc.stdout or "")
    return int(m.group(1)) if m else None


def screenshot(html_path: str | Path, png_path: str | Path, *, width: int = 1600, height: int | None = None,
               browser: str | None = None, timeout: float = 120.0) -> Path:
    """Open ``html_path`` in headless Chromium and save a screenshot ``width`` px wide.

    ``height=None`` measures the page first, so the picture holds all of it.
    """
    browser = browser or find_chromium()
    if not browser:
        raise PngError(no_chromium_message())
    src = Path(html_path).resolve()
    out = Path(png_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    if height is None:
        height = min(MAX_HEIGHT, (page_height(browser, src, width, timeout) or 3000) + 8)
    with tempfile.TemporaryDirectory(prefix="rmqtrace-chromium-") as profile:
        proc = _run(chromium_command(browser, profile, f"--window-size={width},{height}", f"--screenshot={out}",
                                     src.as_uri()), timeout, f"draw {src}")
    if proc.returncode != 0 or not out.exists() or out.stat().st_size == 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-8:])
        raise PngError(f"{browser} exited {proc.returncode} without a screenshot of {src}:\n{tail}")
    return out


__all__ = ["PngError", "chromium_command", "find_chromium", "no_chromium_message", "page_height", "screenshot"]
