"""A real headless Chromium for the tests: found, or installed from Debian's packages.

:func:`ensure_chromium` returns the browser's path, installing ``chromium`` with apt when it is
missing (``apt-get install`` first, so a machine with a fresh package list and the .deb files in
apt's cache installs offline and fast; ``apt-get update`` only when that fails). It returns None
with the reason when no browser can be had, and the caller skips with that reason.

:func:`png_stats` has the browser count a screenshot's pixels (a canvas reads it back), so the
tests can check the picture is not blank, and shows the stage colours, without an image library.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

from tracer.report.png import chromium_command, find_chromium

APT_TIMEOUT = 1500  # s: a first install downloads ~100 MB of packages
_LOCK = Path(tempfile.gettempdir()) / "rmqtrace-apt.lock"


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=600", *args], capture_output=True, text=True,
                          timeout=APT_TIMEOUT, env=env, check=False)


def ensure_chromium() -> tuple[str | None, str]:
    """(path, "") when a browser is there or could be installed, else (None, why not)."""
    found = find_chromium()
    if found:
        return found, ""
    if shutil.which("apt-get") is None:
        return None, ("no Chromium on this machine and no apt-get to install it "
                      "(install chromium, or set RMQTRACE_CHROMIUM)")
    if os.geteuid() != 0:
        return None, "no Chromium on this machine, and installing it with apt-get needs root"
    with _LOCK.open("w") as lock:  # one installer at a time across test processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = find_chromium()
        if found:
            return found, ""
        try:
            proc = _apt("install", "-y", "-q", "--no-install-recommends", "chromium")
            if proc.returncode != 0:
                update = _apt("update", "-q")
                if update.returncode != 0:
                    return None, f"apt-get update failed: {update.stderr.strip()[-400:]}"
                proc = _apt("install", "-y", "-q", "--no-install-recommends", "chromium")
        except subprocess.TimeoutExpired:
            return None, f"apt-get install chromium took longer than {APT_TIMEOUT} s"
        if proc.returncode != 0:
            return None, f"apt-get install chromium failed: {proc.stderr.strip()[-400:]}"
    found = find_chromium()
    return (found, "") if found else (None, "apt-get installed chromium but no browser binary was found")


def dump_dom(browser: str, url: str, profile: Path, *, width: int = 1600, timeout: float = 120) -> str:
    """The DOM after load, serialised by the browser (``--dump-dom``)."""
    cmd = chromium_command(browser, profile, f"--window-size={width},1200", "--dump-dom", url)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"chromium --dump-dom exited {proc.returncode}: {proc.stderr[-1500:]}")
    return proc.stdout


# -- layout at a width ---------------------------------------------------------------------------
# Appended to a scratch copy only (the report has no script): what the browser laid out at one width.
_OVERFLOW_PROBE = """<pre id="overflow-probe"></pre><script>
window.addEventListener("load", () => {
  const doc = document.documentElement;
  const name = (e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
    (e.className && typeof e.className === "string" ? "." + e.className.split(" ").join(".") : "") +
    " «" + (e.textContent || "").trim().slice(0, 40) + "»";
  const clipped = [], overflowing = [];
  for (const e of document.body.querySelectorAll("*")) {
    if (e.id === "overflow-probe" || e.closest("svg")) continue;
    const st = getComputedStyle(e);
    const over = e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0;
    if (!over) continue;
    if (["hidden", "clip", "auto", "scroll"].includes(st.overflowX) || st.textOverflow === "ellipsis")
      clipped.push(name(e));
    else if (st.display !== "inline")
      overflowing.push(name(e));
  }
  const right = doc.clientWidth;
  const pastEdge = [...document.body.querySelectorAll("*")].filter(e => {
    const b = e.getBoundingClientRect(); return b.width > 0 && b.right > right + 1; }).map(name).slice(0, 20);
  document.getElementById("overflow-probe").textContent = JSON.stringify({
    scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, clipped, overflowing, pastEdge});
});
</script>"""


def layout_at(browser: str, html: Path, width: int, workdir: Path) -> dict[str, object]:
    """Horizontal overflow of ``html`` in a ``width``-px window: the document's scroll and client
    widths, elements whose content is cut off (overflow hidden/auto or an ellipsis), block elements
    whose content runs past their box, and elements reaching past the window's right edge."""
    import json
    import re

    page = html.read_text(encoding="utf-8")
    cut = page.rfind("</body>")
    probe = workdir / f"overflow-{width}.html"
    probe.write_text(page[:cut] + _OVERFLOW_PROBE + page[cut:], encoding="utf-8")
    dom = dump_dom(browser, probe.as_uri(), workdir / f"profile-{width}", width=width)
    m = re.search(r'<pre id="overflow-probe">(.*?)</pre>', dom, re.S)
    if not m or not m.group(1).strip():
        raise AssertionError(f"the browser did not measure {html} at {width} px: {dom[-500:]}")
    return dict(json.loads(m.group(1)))


# -- PNG ---------------------------------------------------------------------------------------
def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header."""
    data = path.read_bytes()[:24]
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


_STATS_PAGE = """<!doctype html><html><body><img id="shot" src="data:image/png;base64,{b64}">
<pre id="stats"></pre><script>
window.addEventListener("load", () => {{
  const img = document.getElementById("shot");
  const c = document.createElement("canvas");
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const px = ctx.getImageData(0, 0, c.width, c.height).data;
  const want = {colors};
  const counts = {{}}; for (const k of Object.keys(want)) counts[k] = 0;
  let nonWhite = 0;
  for (let i = 0; i < px.length; i += 4) {{
    const r = px[i], g = px[i + 1], b = px[i + 2];
    if (r < 245 || g < 245 || b < 245) nonWhite++;
    for (const [k, [wr, wg, wb]] of Object.entries(want))
      if (Math.abs(r - wr) <= 2 && Math.abs(g - wg) <= 2 && Math.abs(b - wb) <= 2) counts[k]++;
  }}
  document.getElementById("stats").textContent = JSON.stringify(
    {{width: c.width, height: c.height, pixels: c.width * c.height, nonWhite, counts}});
}});
</script></body></html>"""


def png_stats(browser: str, png: Path, colors: dict[str, str], workdir: Path) -> dict[str, object]:
    """Pixel statistics of a PNG, counted by the browser itself (canvas): non-white pixels, and how
    many pixels have each of ``colors`` (``#rrggbb``)."""
    import base64
    import json
    import re

    rgb = {k: [int(v[i:i + 2], 16) for i in (1, 3, 5)] for k, v in colors.items()}
    page = workdir / "png-stats.html"
    page.write_text(_STATS_PAGE.format(b64=base64.b64encode(png.read_bytes()).decode(), colors=json.dumps(rgb)))
    dom = dump_dom(browser, page.as_uri(), workdir / "profile-stats")
    m = re.search(r'<pre id="stats">(.*?)</pre>', dom, re.S)
    if not m or not m.group(1).strip():
        raise AssertionError(f"the browser did not measure {png}: {dom[-500:]}")
    return dict(json.loads(m.group(1)))
