"""The report in a real browser: headless Chromium loads it with no console error, every section is in
the DOM, the trials table sorts on a header click, every figure has plotted data inside its axes and no
legend over it (measured on the laid-out page), the page fits the window at 1400 and 1920 px and fills the
wider one, and a screenshot (``report.png`` beside the report, the CI artifact) is a real picture.

Needs only ``/usr/bin/chromium`` and the standard library. Without Chromium the tests are skipped,
except under ``CI=true``, where a missing browser is a failure (CI installs it). Set
``REPORT_ARTIFACT_DIR`` to also copy ``report.html`` and ``report.png`` there.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from reports import build_report
from study_fixture import make_study
from test_report import SECTION_IDS
from test_report_gpu import add_gpu_trace

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WINDOW = (1400, 4000)
WIDE = (1920, 4000)

if not CHROMIUM.exists():
    if os.environ.get("CI") == "true":
        pytest.fail(f"{CHROMIUM} is missing: CI must install chromium (apt-get install -y chromium)",
                    pytrace=False)
    pytest.skip(f"{CHROMIUM} not installed", allow_module_level=True)


def _chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args, url],
                          capture_output=True, text=True, timeout=180)


def _console(stderr: str) -> list[str]:
    """Page console output and uncaught errors from Chromium's log (--enable-logging=stderr)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def _load(url: str, profile: Path) -> tuple[str, list[str]]:
    r = _chromium(url, profile, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, _console(r.stderr)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    fx = make_study(tmp_path_factory.mktemp("browser"))
    add_gpu_trace(fx.dir, fx.best)  # the winner's CUDA trace: the GPU time section and the top ops have content
    return build_report(fx.dir, fx.storage_url, fx.name)


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and raw scanlines (filter bytes included) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color = header[:4]
    assert depth == 8 and color in (2, 6), (depth, color)
    return width, height, zlib.decompress(idat)


@pytest.mark.parametrize("window", [WINDOW, WIDE], ids=lambda w: f"{w[0]}px")
def test_screenshot(report, tmp_path, window):
    png = report.with_name("report.png" if window == WINDOW else f"report-{window[0]}.png")
    r = _chromium(report.as_uri(), tmp_path / "profile", "--hide-scrollbars",
                  f"--screenshot={png}", f"--window-size={window[0]},{window[1]}")
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]
    data = png.read_bytes()
    width, height, raw = _png_pixels(data)
    assert (width, height) == window
    # Not blank: a rendered report has text and figures, so its scanlines compress far worse than an
    # empty page's (a white 1400x4000 page deflates to ~20 KB; this one is several hundred KB).
    assert len(data) > 150_000, len(data)
    assert len(set(raw[::97])) > 40  # many distinct byte values: colours, not a flat fill
    if os.environ.get("REPORT_ARTIFACT_DIR"):
        out = Path(os.environ["REPORT_ARTIFACT_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, out / png.name)
        shutil.copy(report, out / "report.html")


def test_loads_without_console_errors(report, tmp_path):
    dom, console = _load(report.as_uri(), tmp_path / "profile")
    assert console == [], console
    ids = set(re.findall(r'<section id="([^"]+)"', dom))
    assert set(SECTION_IDS) <= ids
    assert 'data-sort-ready="1"' in dom  # the inline script ran to its end
    assert dom.count("<svg") >= 10


def test_header_click_sorts_trials(report, tmp_path):
    """Click 'tokens/s/GPU' (ascending), then read the trial order back from the DOM; a deliberate error
    at the end checks that the console check above can fail at all."""
    probe = """<script>
    var th = Array.prototype.find.call(document.querySelectorAll('#trials-table th'),
                                       function (h) { return h.textContent === 'tokens/s/GPU'; });
    th.click();
    var col = Array.prototype.indexOf.call(th.parentNode.cells, th);
    var vals = Array.prototype.map.call(document.querySelectorAll('#trials-table tbody tr'),
                                        function (r) { return r.cells[col].getAttribute('data-v'); });
    document.body.setAttribute('data-probe', vals.join(' ') + '|' + th.getAttribute('aria-sort'));
    notDefinedOnPurpose();
    </script></body>"""
    page = tmp_path / "probe.html"
    page.write_text(report.read_text().replace("</body>", probe))
    dom, console = _load(page.as_uri(), tmp_path / "profile")
    vals, order = re.search(r'data-probe="([^"]*)"', dom).group(1).split("|")
    assert order == "ascending"
    nums = [float(v) for v in vals.split(" ") if v]
    assert nums == sorted(nums) and len(nums) >= 20
    assert vals.split(" ")[-1] == "", "blank values (running trial) sort last"
    assert any("Uncaught ReferenceError: notDefinedOnPurpose" in line for line in console), console


# --------------------------------------------------------------------------- what the browser lays out

# Appended to the test's copy of the page only: measures, on the page as Chromium lays it out, each figure's
# axes (the background patch, id ...-ax<i>-bg), the data artists drawn in them (...-ax<i>-data<k>: every
# rendered path, marker or image inside, outside <defs>, as [left, top, right, bottom, kind]) and the legends,
# plus the page's and the trials table's widths; writes it all as JSON into <pre id="figcheck">.
# reports/render/figures.py sets the ids.
FIGCHECK = r"""<script>
(function () {
  function box(el) { var r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  var LEAF = 'path, use, rect, image, polygon, polyline, line, circle, ellipse';
  var figures = [];
  document.querySelectorAll('svg[data-figure]').forEach(function (svg) {
    var fig = {n: svg.getAttribute('data-figure'), title: svg.getAttribute('data-title'), axes: {},
               legends: [], colorbars: 0};
    svg.querySelectorAll('[id]').forEach(function (el) {
      var m = /^f\d+-(ax|cb)(\d+)-(bg|data\d+|legend)$/.exec(el.id) || /^f\d+-fig-(legend)\d+$/.exec(el.id);
      if (!m) { return; }
      if (m[1] === 'legend') { fig.legends.push(box(el)); return; }
      if (m[1] === 'cb') { fig.colorbars += m[3] === 'bg' ? 1 : 0; return; }
      var ax = fig.axes[m[2]] = fig.axes[m[2]] || {bg: null, data: []};
      if (m[3] === 'bg') { ax.bg = box(el.querySelector('path') || el); }
      else if (m[3] === 'legend') { fig.legends.push(box(el)); }
      else {
        el.querySelectorAll(LEAF).forEach(function (leaf) {
          if (leaf.closest('defs')) { return; }
          // a marker, a filled shape (bar, band, box), or a stroked line (whose box says little of where it runs)
          var kind = leaf.tagName === 'use' ? 'marker' :
                     (getComputedStyle(leaf).fill === 'none' ? 'line' : 'area');
          ax.data.push(box(leaf).concat([kind]));
        });
      }
    });
    figures.push(fig);
  });
  var scroll = document.querySelector('#trials .scroll');
  var table = document.getElementById('trials-table');
  var heads = table ? table.tHead.rows[0].cells : [];
  var main = document.querySelector('main');
  // every table's nearest box that scrolls sideways (null: none), and the trials table's row heights
  var tables = Array.prototype.map.call(document.querySelectorAll('main table'), function (t) {
    var el = t.parentElement;
    while (el && el !== main && ['auto', 'scroll'].indexOf(getComputedStyle(el).overflowX) < 0) {
      el = el.parentElement;
    }
    return {section: t.closest('section').id, table: box(t),
            scroller: el && el !== main ? box(el) : null};
  });
  var rows = table ? Array.prototype.map.call(table.tBodies[0].rows, function (r) {
    return {cls: r.className, height: r.getBoundingClientRect().height};
  }) : [];
  var details = document.querySelector('#summary details.config');
  var gpu = document.getElementById('gpu');
  var seen = function (el) { return el ? {box: box(el), visible: el.checkVisibility()} : null; };
  var out = {
    tables: tables, rows: rows,
    reference: seen(document.querySelector('#summary p.reference')),
    minutes: seen(document.getElementById('gpu-minutes')),
    gpu: gpu ? {box: box(gpu), visible: gpu.checkVisibility(), figures: gpu.querySelectorAll('svg').length,
                tables: Array.prototype.map.call(gpu.querySelectorAll('table'), box),
                clipped: Array.prototype.map.call(gpu.querySelectorAll('div.clip'), function (d) {
                  return {box: box(d), full: d.scrollWidth > d.clientWidth}; })} : null,
    config: details ? {open: details.open, summary: box(details.querySelector('summary')), box: box(details),
                       pre_visible: details.querySelector('pre').checkVisibility()} : null,
    figures: figures,
    page: {inner: window.innerWidth, scroll: document.documentElement.scrollWidth, main: box(main)},
    trials: scroll && table ? {box: box(scroll), scroll_width: scroll.scrollWidth, client_width: scroll.clientWidth,
                               overflow_x: getComputedStyle(scroll).overflowX, table: box(table),
                               last_head: heads.length ? box(heads[heads.length - 1]) : null} : null
  };
  var pre = document.createElement('pre');
  pre.id = 'figcheck';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script></body>"""


def _area(a, b=None) -> float:
    """Area of box ``a`` ([left, top, right, bottom, ...]), or of its intersection with ``b``."""
    if b is not None:
        a = [max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])]
    return max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])


def _coverage(boxes: list, bg: list) -> tuple[float, float]:
    """The share of the axes' width and of its height that the data, clipped to the axes, spans."""
    clipped = [[max(b[0], bg[0]), max(b[1], bg[1]), min(b[2], bg[2]), min(b[3], bg[3])] for b in boxes]
    clipped = [c for c in clipped if c[2] >= c[0] and c[3] >= c[1]]
    if not clipped:
        return 0.0, 0.0
    width = max(c[2] for c in clipped) - min(c[0] for c in clipped)
    height = max(c[3] for c in clipped) - min(c[1] for c in clipped)
    return width / (bg[2] - bg[0]), height / (bg[3] - bg[1])


def _figcheck(report: Path, tmp_path: Path, window: tuple[int, int]) -> dict:
    page = tmp_path / f"figcheck-{window[0]}.html"
    page.write_text(report.read_text().replace("</body>", FIGCHECK))
    r = _chromium(page.as_uri(), tmp_path / f"profile-{window[0]}", "--enable-logging=stderr", "--v=0",
                  f"--window-size={window[0]},{window[1]}", "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _console(r.stderr) == [], _console(r.stderr)
    m = re.search(r'<pre id="figcheck">(.*?)</pre>', r.stdout, re.S)
    assert m, "the figure check did not run"
    return json.loads(html.unescape(m.group(1)))


@pytest.fixture(scope="module")
def laid_out(report, tmp_path_factory) -> dict[int, dict]:
    tmp = tmp_path_factory.mktemp("figcheck")
    return {w[0]: _figcheck(report, tmp, w) for w in (WINDOW, WIDE)}


MIN_SPREAD = 0.2
"""The data of each axes must span at least this share of its width and of its height: points crowded
against one axis (a scale set for other numbers) fail."""


def assert_data_inside_axes(figures: list[dict], min_spread: float | None = MIN_SPREAD) -> None:
    """Every axes of every figure has a data element inside it (non-zero area in common) and, with
    ``min_spread``, its data span that share of the axes' width and height."""
    for fig in figures:
        name = f"figure {fig['n']} ({fig['title']})"
        assert fig["axes"], f"{name}: no axes"
        for i, ax in fig["axes"].items():
            bg = ax["bg"]
            assert bg and _area(bg) > 0, f"{name}, axes {i}: no visible axes"
            inside = [d for d in ax["data"] if _area(d, bg) > 0]
            assert inside, f"{name}, axes {i}: none of its {len(ax['data'])} data elements lies inside the axes"
            if min_spread is not None:
                wide, high = _coverage(inside, bg)
                assert wide >= min_spread and high >= min_spread, (
                    f"{name}, axes {i}: the data spans {wide:.0%} of the axes' width and {high:.0%} of its height")


def assert_no_legend_over_data(figures: list[dict]) -> None:
    """No legend covers a marker or a filled shape (a bar, a box); lines are left out, their bounding box
    being most of the axes."""
    for fig in figures:
        data = [d for ax in fig["axes"].values() for d in ax["data"] if d[4] != "line"]
        for legend in fig["legends"]:
            over = [d for d in data if _area(d, legend) > 1.0]  # more than 1 px² of a bar or marker
            assert not over, f"figure {fig['n']} ({fig['title']}): its legend {legend} covers data at {over[:3]}"


def test_every_figure_has_data_inside_its_axes(laid_out):
    figures = laid_out[WINDOW[0]]["figures"]
    titles = [f["title"] for f in figures]
    assert len(figures) >= 10, titles
    for title in ("Loader throughput vs training", "Read latency quantiles", "Padding vs bucket width",
                  "Optimization history (maximize)"):
        assert title in titles, titles
    assert_data_inside_axes(figures)


def test_no_legend_covers_data(laid_out):
    assert_no_legend_over_data(laid_out[WINDOW[0]]["figures"])


def test_knob_plots_have_a_colour_bar(laid_out):
    knobs = [f for f in laid_out[WINDOW[0]]["figures"] if f["title"].startswith("Knobs vs throughput")]
    assert len(knobs) == 1 and knobs[0]["colorbars"] == 1, knobs


@pytest.mark.parametrize("width", [WINDOW[0], WIDE[0]])
def test_page_fits_the_window_and_trials_scroll_in_their_box(laid_out, width):
    page, trials = laid_out[width]["page"], laid_out[width]["trials"]
    assert page["scroll"] <= page["inner"], f"the page scrolls sideways at {width} px: {page}"
    main_width = page["main"][2] - page["main"][0]
    assert main_width >= 0.85 * width, f"the page uses {main_width:.0f} of {width} px"
    # Every column of the trials table is reachable: the table scrolls sideways inside its own box.
    assert trials is not None
    assert trials["box"][2] <= page["inner"]
    if trials["scroll_width"] > trials["client_width"]:
        assert trials["overflow_x"] in ("auto", "scroll"), trials
    table_width = trials["table"][2] - trials["table"][0]
    assert table_width <= trials["scroll_width"] + 1, trials  # the box's scroll area holds the whole table
    assert trials["last_head"][2] <= trials["table"][2] + 1, trials


@pytest.mark.parametrize("width", [WINDOW[0], WIDE[0]])
def test_failed_rows_are_one_line_and_every_table_scrolls_in_its_own_box(laid_out, width):
    """Issue 40: an OOM row was a tall empty band (its failure text wrapped at the far right of the table)."""
    got = laid_out[width]
    rows = got["rows"]
    assert any(r["cls"] == "failed" for r in rows) and any(r["cls"] == "" for r in rows)
    plain = min(r["height"] for r in rows)
    tall = [r for r in rows if r["height"] > 1.5 * plain]
    assert not tall, f"rows taller than one line ({plain:.0f} px) at {width} px: {tall}"
    inner = got["page"]["inner"]
    for t in got["tables"]:
        assert t["scroller"] is not None, f"a table of #{t['section']} has no box of its own to scroll in"
        assert t["scroller"][2] <= inner + 0.5, t


@pytest.mark.parametrize("width", [WINDOW[0], WIDE[0]])
def test_the_exported_config_is_collapsed(laid_out, width):
    config = laid_out[width]["config"]
    assert config is not None and not config["open"], config
    assert not config["pre_visible"], config
    line = config["summary"][3] - config["summary"][1]
    assert line > 0 and config["box"][3] - config["box"][1] < 2 * line, config  # its summary line, nothing more


@pytest.mark.parametrize("width", [WINDOW[0], WIDE[0]])
def test_the_gpu_time_section_is_visible_and_fits(laid_out, width):
    """The GPU time section (the winner's CUDA trace of test_report_gpu) is laid out with its figure and its four
    tables (busy and idle, TFLOP/s, top kernels, where the GPU waits) inside the window; its long kernel names are
    cut to one line, not wrapped."""
    got = laid_out[width]
    gpu, inner = got["gpu"], got["page"]["inner"]
    assert gpu is not None and gpu["visible"] and gpu["box"][3] - gpu["box"][1] > 300, gpu
    assert gpu["figures"] == 1 and len(gpu["tables"]) == 4, gpu
    assert gpu["box"][2] <= inner and all(t[2] <= inner + 0.5 for t in gpu["tables"]), gpu
    names = gpu["clipped"]
    # its 8 kernels (the longest names cut) and the one place the GPU waits at
    assert len(names) == 9 and any(n["full"] for n in names), names
    heights = {round(n["box"][3] - n["box"][1]) for n in names}
    assert max(heights) < 2 * min(heights), heights
    titles = [f["title"] for f in got["figures"]]
    assert "GPU time by kind of work" in titles, titles


@pytest.mark.parametrize("width", [WINDOW[0], WIDE[0]])
def test_against_plain_loops_and_the_gpu_minutes_are_visible_and_fit(laid_out, width):
    """The Summary's line against the plain compiled loop and the Search section's GPU-minutes table are laid out
    inside the window: the line in at most three lines of text, the table beside nothing that covers it."""
    got = laid_out[width]
    inner = got["page"]["inner"]
    ref, minutes = got["reference"], got["minutes"]
    assert ref is not None and ref["visible"] and ref["box"][2] <= inner, ref
    assert 0 < ref["box"][3] - ref["box"][1] < 80, ref
    assert minutes is not None and minutes["visible"] and minutes["box"][2] <= inner + 0.5, minutes
    assert minutes["box"][3] - minutes["box"][1] > 6 * 12, minutes  # its six phases, each a row
