"""Case folders, device outputs and reports follow the umask, as any Unix tool's files do (issue 32 item 3)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import REPO

SPEC = {
    "cases": [
        {
            "name": "modes",
            "layout": "BNSD",
            "dtype": "fp16",
            "batch": 1,
            "num_heads": 1,
            "q_seq_len": 128,
            "head_dim": 64,
            "block_shape": [128, 128],
            "sparsity": {"pattern": "dense"},
            "ops": ["forward", "backward"],
        }
    ]
}


def _modes(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode) for path in root.rglob("*")}


def test_what_bsa_writes_follows_the_umask(tmp_path: Path) -> None:
    """A real shell's `umask 022` (others read) and `umask 027` (the group reads, others nothing): case
    folders, case.json, inputs, golden and device outputs, run.json and the reports all follow it."""
    spec = tmp_path / "modes.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    bsa = f"{sys.executable} -m bsa_cli check {spec}"
    opened = f"umask 022 && {bsa} -o {tmp_path}/open --json {tmp_path}/open/r.json"
    script = f"{opened} && umask 027 && {bsa} -o {tmp_path}/closed"

    done = subprocess.run(["sh", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for folder, dir_mode, file_mode in (("open", 0o755, 0o644), ("closed", 0o750, 0o640)):
        modes = _modes(tmp_path / folder)
        for name in ("modes", "modes/case.json", "modes/outputs/dq.bin", "modes@forward/outputs/out.bin"):
            assert name in modes, sorted(modes)
        wrong = {
            name: oct(mode)
            for name, mode in modes.items()
            if mode != (dir_mode if (tmp_path / folder / name).is_dir() else file_mode)
        }
        assert not wrong, (folder, wrong)
