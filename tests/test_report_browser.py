"""The report in a real browser: headless Chromium loads it with no console error, every section is in
the DOM, the trials table sorts on a header click, and a screenshot (``report.png`` beside the report,
the CI artifact) is a real picture.

Needs only ``/usr/bin/chromium`` and the standard library. Without Chromium the tests are skipped,
except under ``CI=true``, where a missing browser is a failure (CI installs it). Set
``REPORT_ARTIFACT_DIR`` to also copy ``report.html`` and ``report.png`` there.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from reports import build_report
from test_report import SECTION_IDS, make_study

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WINDOW = (1400, 4000)

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


def test_screenshot(report, tmp_path):
    png = report.with_name("report.png")
    r = _chromium(report.as_uri(), tmp_path / "profile", "--hide-scrollbars",
                  f"--screenshot={png}", f"--window-size={WINDOW[0]},{WINDOW[1]}")
    assert r.returncode == 0 and png.exists(), r.stderr[-2000:]
    data = png.read_bytes()
    width, height, raw = _png_pixels(data)
    assert (width, height) == WINDOW
    # Not blank: a rendered report has text and figures, so its scanlines compress far worse than an
    # empty page's (a white 1400x4000 page deflates to ~20 KB; this one is several hundred KB).
    assert len(data) > 150_000, len(data)
    assert len(set(raw[::97])) > 40  # many distinct byte values: colours, not a flat fill
    if os.environ.get("REPORT_ARTIFACT_DIR"):
        out = Path(os.environ["REPORT_ARTIFACT_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, out / "report.png")
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
