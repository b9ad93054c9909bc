"""The README's screenshot script works: a failing GQA report photographed in headless Chromium.

Slow (Chromium starts in seconds) and skipped where no Chromium is installed (`apt-get install chromium`).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest

from tests.helpers import REPO

BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


@pytest.mark.slow
@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed")
def test_screenshot_script_photographs_a_failing_report(tmp_path):
    png = tmp_path / "r.png"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "screenshot_report.py"),
            "--out",
            str(png),
            "--keep",
            str(tmp_path / "work"),
            "--width",
            "1000",
            "--height",
            "700",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (1000, 700)
    assert len(data) < 300_000
    page = (tmp_path / "work" / "report.html").read_text()
    assert "planted fault &#x27;tile-noise&#x27;" in page and "edge-gqa-8to2-bf16" in page
