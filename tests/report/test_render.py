"""index.html rendered by a real browser: every image loads; a screenshot is saved.

Needs a headless Chromium (Debian's ``chromium`` package); without one the test skips and says why.
"""

import re
import shutil
import subprocess

import pytest

from softmaxkit.report import build_report

from . import fakes

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium on this machine (Debian: apt-get install chromium)")

# After load, write how many images there are and how many failed to decode into the body.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).length;
  document.body.setAttribute("data-probe", images.length + "/" + broken);
});
</script>"""


def _chromium(*args, timeout=90):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=5000", *args], check=False, capture_output=True, text=True,
                          timeout=timeout)


def _probe(html_path):
    probed = html_path.with_name("probed.html")
    probed.write_text(html_path.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _chromium("--dump-dom", probed.as_uri()).stdout
    found = re.search(r'data-probe="(\d+)/(\d+)"', dom)
    assert found, "the page did not finish loading"
    return int(found.group(1)), int(found.group(2))


def test_every_image_loads_and_a_screenshot_is_saved(tmp_path, monkeypatch):
    suites, tasks = fakes.install(monkeypatch)
    index = build_report(tmp_path / "out", quick=True, suites=suites, tasks=tasks, show_progress=False, gpu=False)
    images, broken = _probe(index)
    assert images == 4 and broken == 0
    shot = tmp_path / "top.png"
    _chromium("--window-size=1280,1200", f"--screenshot={shot}", index.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    # the probe does see a broken image
    spoiled = index.with_name("spoiled.html")
    spoiled.write_text(index.read_text().replace("data:image/png;base64,", "data:image/png;base64,AAAA", 1))
    assert _probe(spoiled) == (4, 1)
