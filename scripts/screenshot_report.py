#!/usr/bin/env python3
"""Take a screenshot of a failing HTML report in headless Chromium (for README and for looking at it).

    python scripts/screenshot_report.py                       # docs/report.png
    python scripts/screenshot_report.py --out /tmp/r.png --height 2400 --keep /tmp/work

It generates one GQA case of the edge suite, runs it on the reference device with a planted fault
(`bsa check cases/edge.yaml --fault tile-noise --filter edge-gqa-8to2-bf16 --html ...`), and photographs
the report's top: the header, the summary table and the first failing tensor's pictures. Needs a
Chromium or Chrome binary (`apt-get install chromium`; or --browser PATH). The PNG is written as
Chromium writes it; the window size decides its size (about 200 KB at 1280 x 1100).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = (
    "chromium",
    "chromium-browser",
    "chromium-headless-shell",
    "google-chrome",
    "google-chrome-stable",
    "chrome",
)


def find_browser(given: str | None) -> str:
    """Return the browser to run, or exit with a message saying how to get one."""
    for name in [given] if given else BROWSERS:
        path = shutil.which(name) if name else None
        if path:
            return path
    sys.exit("no Chromium found: install it (apt-get install chromium) or pass --browser PATH")


def make_report(work: Path, case: str, fault: str) -> Path:
    """Generate, run and judge one case with a planted fault; return the HTML report's path."""
    html = work / "report.html"
    command = [
        sys.executable,
        "-m",
        "bsa_cli",
        "check",
        str(ROOT / "cases" / "edge.yaml"),
        "-o",
        "out",
        "--fault",
        fault,
        "--filter",
        case,
        "--html",
        "report.html",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=work)  # the report names the folder "out"
    if done.returncode != 1 or not html.is_file():  # 1: the planted fault made the case fail, as wanted
        sys.exit(f"bsa check exited {done.returncode} (expected 1, a failing case):\n{done.stderr}")
    return html


def screenshot(browser: str, page: Path, png: Path, width: int, height: int) -> None:
    """Photograph `page` into `png` with a headless browser window of width x height CSS pixels."""
    png.parent.mkdir(parents=True, exist_ok=True)
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
        f"--screenshot={png}",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not png.is_file():
        sys.exit(f"{browser} exited {done.returncode}:\n{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png", help="PNG to write")
    parser.add_argument("--case", default="edge-gqa-8to2-bf16", help="edge-suite case (glob) to report on")
    parser.add_argument("--fault", default="tile-noise", help="fault planted in the reference device")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1100)
    parser.add_argument("--browser", help="Chromium or Chrome binary (default: the first found on PATH)")
    parser.add_argument("--keep", type=Path, help="keep the generated case and report in this folder")
    args = parser.parse_args()
    browser = find_browser(args.browser)
    with tempfile.TemporaryDirectory(prefix="bsa-shot-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        page = make_report(work, args.case, args.fault)
        screenshot(browser, page, args.out, args.width, args.height)
    print(f"{args.out}: {args.out.stat().st_size // 1024} KiB, report {page}" if args.keep else f"{args.out}")


if __name__ == "__main__":
    main()
