"""The HTML report in a real headless Chromium (Debian's package): the sections are there, they are
laid out with real size, and a screenshot shows them.

The screenshot is kept in the test's tmp dir and copied to ``.cache/report-screenshot.png`` for a
human to look at.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from browser import dump_dom, ensure_chromium, layout_at, png_size, png_stats
from conftest import REPO, unavailable

from tracer.report.html import STAGE_COLOR
from tracer.report.png import screenshot
from tracer.tools.cli import main

pytestmark = pytest.mark.integration

SECTIONS = ("job-view", "stages", "waterfall", "heatmap", "occupancy", "slowest")
GROUPS = ("demo-round_robin", "demo-aggressive")
POLICIES3 = ("round_robin", "aggressive", "cost_aware")  # the default demo: three groups side by side
WIDTHS = (1280, 1400, 1920)

# Appended to a scratch copy only: the report itself has no script. It measures what the browser
# laid out and writes it where --dump-dom can read it.
PROBE = """<pre id="probe"></pre><script>
const out = {};
for (const id of %s) {
  const el = document.getElementById(id);
  if (!el) { out[id] = null; continue; }
  const box = el.getBoundingClientRect();
  const shown = (sel) => [...el.querySelectorAll(sel)].filter(e => {
    const b = e.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length;
  out[id] = {width: box.width, height: box.height, svgs: shown("svg"), rects: shown("svg rect"),
             paths: shown("svg path"), cards: el.querySelectorAll(".card").length,
             groups: [...el.querySelectorAll(".card h3")].map(h => h.textContent)};
}
document.getElementById("probe").textContent = JSON.stringify(out);
</script>"""


@pytest.fixture(scope="module")
def browser() -> str:
    path, why = ensure_chromium()
    if path is None:
        unavailable(f"headless Chromium not available: {why}")
    assert path is not None
    return path


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (small) demo run, two policies side by side, as `rmqtrace demo` writes it."""
    out = tmp_path_factory.mktemp("demo")
    code = main(["demo", "--groups", "80", "--workers", "4", "--case-ms", "2", "--policies", ",".join(
        g.removeprefix("demo-") for g in GROUPS), "--out", str(out)])
    assert code == 0
    return out / "report.html"


@pytest.fixture(scope="module")
def demo_report3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default demo's three policies (the widest page), on a small job."""
    out = tmp_path_factory.mktemp("demo3")
    assert main(["demo", "--groups", "60", "--workers", "4", "--case-ms", "1", "--policies", ",".join(POLICIES3),
                 "--out", str(out)]) == 0
    return out / "report.html"


@pytest.mark.parametrize("width", WIDTHS)
def test_no_horizontal_overflow_or_clipped_text(browser: str, demo_report3: Path, tmp_path: Path, width: int) -> None:
    layout = layout_at(browser, demo_report3, width, tmp_path)
    assert layout["scrollWidth"] <= layout["clientWidth"], layout  # no horizontal scrolling
    assert layout["clipped"] == [], layout  # nothing cut off behind overflow hidden/auto or an ellipsis
    assert layout["overflowing"] == [], layout  # no table running past its card
    assert layout["pastEdge"] == [], layout
    png = screenshot(demo_report3, tmp_path / f"report-{width}.png", width=width, browser=browser)
    assert png_size(png)[0] == width
    keep = REPO / ".cache" / f"report-{width}.png"  # for a human to look at
    keep.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, keep)


def test_sections_are_present_in_the_browsers_dom(browser: str, demo_report: Path, tmp_path: Path) -> None:
    dom = dump_dom(browser, demo_report.as_uri(), tmp_path / "profile")
    for section in SECTIONS:
        assert f'id="{section}"' in dom, section

    def part(section: str) -> str:
        return dom.split(f'id="{section}"')[1].split("</section>")[0]

    assert part("waterfall").count("<rect") > 80 * 2  # a segment or more per message and group
    assert part("heatmap").count("<rect") >= 2 * 2 * 40  # ≥ two wait rows × 40 time buckets × 2 groups
    assert part("occupancy").count("<path") == 2
    assert 'class="crit"' in part("waterfall")
    for g in GROUPS:
        assert f'data-group="{g}"' in part("job-view")
        assert "lower bound" in part("job-view")


def test_sections_are_laid_out_with_real_size(browser: str, demo_report: Path, tmp_path: Path) -> None:
    page = demo_report.read_text()
    probe = tmp_path / "probe.html"
    cut = page.rfind("</body>")
    probe.write_text(page[:cut] + PROBE % json.dumps(list(SECTIONS)) + page[cut:])
    dom = dump_dom(browser, probe.as_uri(), tmp_path / "profile")
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, dom[-1000:]
    layout = json.loads(m.group(1))
    for section in SECTIONS:
        box = layout[section]
        assert box is not None and box["width"] > 800 and box["height"] > 100, (section, box)
    for section in ("waterfall", "heatmap", "occupancy"):
        assert layout[section]["groups"][:2] == list(GROUPS), section  # side by side, in run order
        assert layout[section]["svgs"] >= 2
    assert layout["waterfall"]["rects"] > 160
    assert layout["heatmap"]["rects"] >= 160
    assert layout["occupancy"]["paths"] == 2
    assert layout["job-view"]["svgs"] >= 3  # the comparison and one split bar per group
    # side by side: the first two cards of a section share a row
    assert layout["waterfall"]["width"] > 1000


def test_screenshot(browser: str, demo_report: Path, tmp_path: Path) -> None:
    png = screenshot(demo_report, tmp_path / "report.png", browser=browser)
    width, height = png_size(png)
    assert width == 1600 and height > 2000  # the whole page, measured first
    stats = png_stats(browser, png, {k: STAGE_COLOR[k] for k in ("broker_wait", "client_buffer", "handler")},
                      tmp_path)
    assert stats["width"] == width and stats["height"] == height
    assert int(stats["nonWhite"]) > 0.15 * int(stats["pixels"])  # type: ignore[call-overload]
    counts = stats["counts"]
    assert isinstance(counts, dict)
    for stage, n in counts.items():  # the waterfall's colours are on the picture
        assert n > 500, (stage, counts)
    keep = REPO / ".cache" / "report-screenshot.png"
    keep.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, keep)


def test_cli_png(browser: str, demo_report: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQTRACE_CHROMIUM", browser)
    spans = demo_report.parent / "spans.jsonl"
    code = main(["report", str(spans), "--group", GROUPS[0], "--png", str(tmp_path / "one.png")])
    out = capsys.readouterr().out
    assert code == 0 and f"png: {tmp_path / 'one.png'}" in " ".join(out.split())
    width, height = png_size(tmp_path / "one.png")
    assert width == 1600 and height > 1500


# -- what a reader sees at 1280 and 1920 px: unbroken tokens, a heatmap that spreads, fleet axes --------
FIT_WIDTHS = (1280, 1920)
# Appended to a scratch copy: a token broken over two lines has two client rects; one past its card is cut.
TOKENS_PROBE = """<pre id="tokens-probe"></pre><script>
window.addEventListener("load", () => {
  const out = {wrapped: [], outside: [], tokens: 0, heatColumns: {}};
  for (const e of document.querySelectorAll("#slowest .mono, #slowest .stage")) {
    out.tokens++;
    const card = e.closest(".card").getBoundingClientRect(), box = e.getBoundingClientRect();
    if (e.getClientRects().length > 1) out.wrapped.push(e.textContent);
    if (box.right > card.right + 0.5 || box.left < card.left - 0.5) out.outside.push(e.textContent);
  }
  for (const card of document.querySelectorAll("#heatmap .card")) {
    const xs = new Set([...card.querySelectorAll("rect[data-count]")].map(r => r.getAttribute("x")));
    out.heatColumns[card.dataset.group] = xs.size;
  }
  document.getElementById("tokens-probe").textContent = JSON.stringify(out);
});
</script>"""


def _probe(browser: str, html: Path, script: str, marker: str, width: int, workdir: Path) -> dict[str, object]:
    page = html.read_text(encoding="utf-8")
    cut = page.rfind("</body>")
    probe = workdir / f"{marker}-{width}.html"
    probe.write_text((page[:cut] + script + page[cut:]) if cut >= 0 else page + script, encoding="utf-8")
    dom = dump_dom(browser, probe.as_uri(), workdir / f"profile-{marker}-{width}", width=width)
    m = re.search(rf'<pre id="{marker}">(.*?)</pre>', dom, re.S)
    assert m and m.group(1).strip(), dom[-800:]
    return dict(json.loads(m.group(1)))


@pytest.mark.parametrize("width", FIT_WIDTHS)
def test_slowest_messages_keep_ids_and_stage_names_whole(browser: str, demo_report3: Path, tmp_path: Path,
                                                         width: int) -> None:
    seen = _probe(browser, demo_report3, TOKENS_PROBE, "tokens-probe", width, tmp_path)
    assert int(seen["tokens"]) >= 2 * 3 * 10  # type: ignore[call-overload]  # an id and a stage per row
    assert seen["wrapped"] == [], seen["wrapped"]  # e.g. "client_buff" / "er", an id over two lines
    assert seen["outside"] == [], seen["outside"]


@pytest.mark.parametrize("width", FIT_WIDTHS)
def test_the_round_robin_heatmap_spreads_over_the_run(browser: str, demo_report3: Path, tmp_path: Path,
                                                      width: int) -> None:
    columns = _probe(browser, demo_report3, TOKENS_PROBE, "tokens-probe", width, tmp_path)["heatColumns"]
    assert isinstance(columns, dict)
    # a prefetching consumer pulls every message at t=0: counted by pull time it was one column at x=0
    assert columns["demo-round_robin"] >= 8, columns


FLEET_PROBE = """<pre id="fleet-probe"></pre><script>
window.addEventListener("load", () => {
  const doc = document.documentElement;
  const out = {clientWidth: doc.clientWidth, scrollWidth: doc.scrollWidth, svgs: [],
               legend: (document.querySelector(".legend") || {}).textContent || ""};
  for (const svg of document.querySelectorAll("svg")) {
    const ticks = [...svg.querySelectorAll("g.axis text")].filter(t => /^[\\d.]+ s$/.test(t.textContent));
    out.svgs.push({width: svg.getBoundingClientRect().width,
                   ticks: ticks.map(t => t.textContent),
                   tickHeights: ticks.map(t => t.getBoundingClientRect().height),
                   heldScales: [...svg.querySelectorAll("g.held-scale")].map(g => g.querySelectorAll("text").length),
                   instances: svg.querySelectorAll("g.held-scale").length});
  }
  document.getElementById("fleet-probe").textContent = JSON.stringify(out);
});
</script>"""


@pytest.fixture(scope="module")
def fleet_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`rmqtrace demo --consumers 3` writes fleet.html: per mode, one lane group per consumer."""
    out = tmp_path_factory.mktemp("fleet")
    assert main(["demo", "--consumers", "3", "--groups", "60", "--workers", "2", "--case-ms", "1",
                 "--out", str(out)]) == 0
    return out / "fleet.html"


@pytest.mark.parametrize("width", FIT_WIDTHS)
def test_the_fleet_page_has_axes_a_legend_and_follows_the_window(browser: str, fleet_report: Path, tmp_path: Path,
                                                                  width: int) -> None:
    seen = _probe(browser, fleet_report, FLEET_PROBE, "fleet-probe", width, tmp_path)
    assert int(seen["scrollWidth"]) <= int(seen["clientWidth"]), seen  # type: ignore[call-overload]
    assert "held" in str(seen["legend"]) and "handler" in str(seen["legend"]), seen["legend"]
    svgs = seen["svgs"]
    assert isinstance(svgs, list) and len(svgs) == 2  # prefetch and demand_driven
    room = int(seen["clientWidth"]) - 2 * 24  # type: ignore[call-overload]  # body margins
    for svg in svgs:
        assert svg["width"] >= 0.95 * room, (width, svg["width"], room)  # not a fixed ~850 px at 1920
        assert len(svg["ticks"]) >= 4, svg["ticks"]  # labelled ticks, not only 0 and the end
        assert min(svg["tickHeights"]) >= 11, svg["tickHeights"]  # readable, not ~9 px
        assert svg["instances"] == 3 and svg["heldScales"] == [2, 2, 2], svg  # 0 and the peak per held line


CHART_PROBE = """<pre id="chart-probe"></pre><script>
window.addEventListener("load", () => {
  const out = {charts: [], verdicts: []};
  const main = ["svg#compare", "#waterfall svg.waterfall", "#heatmap svg.heat", "#occupancy svg.occupancy"];
  for (const sel of main) {
    for (const svg of document.querySelectorAll(sel)) {
      const box = (svg.closest(".card") || svg.closest("section")), cs = getComputedStyle(box);
      const room = box.getBoundingClientRect().width - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight)
                   - parseFloat(cs.borderLeftWidth) - parseFloat(cs.borderRightWidth);
      out.charts.push({sel, width: svg.getBoundingClientRect().width, room});
    }
  }
  for (const v of document.querySelectorAll(".verdict")) {
    const ok = v.closest(".job").querySelector(".big .ok") !== null;
    out.verdicts.push({ok, accent: getComputedStyle(v).borderLeftColor});
  }
  document.getElementById("chart-probe").textContent = JSON.stringify(out);
});
</script>"""


@pytest.mark.parametrize("width", FIT_WIDTHS)
def test_charts_follow_their_cards_width_and_the_accent_follows_the_verdict(browser: str, demo_report3: Path,
                                                                           tmp_path: Path, width: int) -> None:
    """At 1920 px the charts kept a fixed width (the job view ~55 % of the page, the others ~two
    thirds of their cards) and every verdict had the same red accent, the good ones too (issue 33)."""
    seen = _probe(browser, demo_report3, CHART_PROBE, "chart-probe", width, tmp_path)
    charts = seen["charts"]
    assert isinstance(charts, list) and {c["sel"] for c in charts} == {
        "svg#compare", "#waterfall svg.waterfall", "#heatmap svg.heat", "#occupancy svg.occupancy"}
    narrow = [c for c in charts if c["width"] < c["room"] - 1]
    assert narrow == [], (width, narrow)
    verdicts = seen["verdicts"]
    assert isinstance(verdicts, list) and verdicts
    green = "rgb(30, 122, 52)"  # the page's .ok colour, as its ratio beside the verdict
    assert all((v["accent"] == green) == v["ok"] for v in verdicts), verdicts  # fails before: all #d55e00
