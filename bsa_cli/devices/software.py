"""What the device side runs: the `device_software` object of run.json (docs/run.md).

* the reference device: `{"kind": "reference", "bsa": <bsa's version>}`;
* the torch_npu device: the child prints one line, `bsa-device-software: {json}`, with `torch.__version__`,
  `torch_npu.__version__` and the CANN version, which torch_npu reports
  (`torch_npu.npu.utils.get_cann_version(module="CANN")`, documented in op-plugin's
  docs/zh/custom_APIs/torch_npu-utils/torch_npu-utils-get_cann_version.md, `torch_npu.utils.get_cann_version`
  in its older form; empty before CANN 8.1.RC1) or, when it reports none, the toolkit's version file;
  `bsa run` reads that line back from the child's stdout log;
* a binary (`--binary`, `--cmd`): bsa reads the toolkit's version file itself, from the environment it
  passes the binary.

The toolkit's version file is `<toolkit>/<arch>-linux/ascend_toolkit_install.info`, lines of `key=value`
(`package_name=Ascend-cann-toolkit`, `version=8.3.RC1`, `arch=aarch64`, `path=...`), as ops-transformer's
install guide has it (libochao-huawei/ops-transformer 5778144, docs/zh/install/quick_install.md: `cat
/usr/local/Ascend/cann/${arch}-linux/ascend_toolkit_install.info`). `<toolkit>` is the first of
ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME (both the toolkit's folder once `set_env.sh` is sourced) and the
folder above ASCEND_OPP_PATH (`<toolkit>/opp`) that holds such a file; `<arch>` is this machine's, then
aarch64 and x86_64.

Everything read here is untrusted: a regular file only (no FIFO, device or folder), its first
INFO_MAX_BYTES, one line per value, printable ASCII of at most VALUE_MAX_CHARS; anything else is null.
Nothing here raises: a value that cannot be read is null, never guessed, and never fails a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._version import __version__

#: How the torch_npu child's stdout line that carries what it runs begins.
MARKER = "bsa-device-software: "

#: Variables naming the CANN toolkit, in the order they are tried (ASCEND_OPP_PATH names `<toolkit>/opp`).
TOOLKIT_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")

INFO_NAME = "ascend_toolkit_install.info"
#: Bytes of the toolkit's version file read (it holds a few short lines).
INFO_MAX_BYTES = 4096
#: Bytes of the torch_npu child's stdout log searched for its line (it prints it before the call).
LOG_MAX_BYTES = 64 << 10
#: Longest `bsa-device-software:` line read.
LINE_MAX_CHARS = 2048
#: Longest value kept (a version string); a longer one is null.
VALUE_MAX_CHARS = 64
PATH_MAX_CHARS = 4096

#: What the torch_npu child reports (each a string or null).
TORCH_NPU_KEYS = ("torch", "torch_npu", "cann", "cann_source")

_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


def clean(value: Any, limit: int = VALUE_MAX_CHARS) -> str | None:
    """Return `value` if it is one line of printable ASCII of at most `limit` characters (stripped), else None."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value if len(value) <= limit and _VALUE.fullmatch(value) else None


def read_head(path: Path, limit: int) -> str | None:
    """Return the first `limit` bytes of `path` as text if it is a regular file (never blocks on a FIFO), else
    None."""
    try:  # no device, FIFO or socket is ever opened (opening one can block or act); checked again once open
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def info_version(path: Path) -> str | None:
    """Return the `version=` value of a toolkit version file, or None."""
    for line in (read_head(path, INFO_MAX_BYTES) or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "version":
            return clean(value)
    return None


def toolkit_cann(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """Return (the CANN version, the file it was read from) from the toolkit the environment names."""
    for variable in TOOLKIT_VARIABLES:
        value = env.get(variable, "")
        if not value.strip() or len(value) > PATH_MAX_CHARS or "\0" in value:
            continue
        root = Path(value.strip())
        if variable == "ASCEND_OPP_PATH":
            root = root.parent
        for arch in dict.fromkeys(a for a in (platform.machine(), "aarch64", "x86_64") if a):
            path = root / f"{arch}-linux" / INFO_NAME
            version = info_version(path)
            if version is not None:
                return version, clean(str(path), PATH_MAX_CHARS)
    return None, None


def reference() -> dict[str, Any]:
    """The reference device runs bsa itself."""
    return {"kind": "reference", "bsa": __version__}


def binary(env: Mapping[str, str]) -> dict[str, Any]:
    """What bsa can tell of a binary's software: the CANN toolkit of the environment it passes."""
    try:
        cann, source = toolkit_cann(env)
    except Exception:  # never fail a run for this record
        cann, source = None, None
    return {"kind": "binary", "cann": cann, "cann_source": source}


# ---- the torch_npu child ----------------------------------------------------------------------------


def _torch_npu_cann(torch: Any, torch_npu: Any) -> tuple[str | None, str | None]:
    """Return the CANN version torch_npu reports, and where it came from."""
    getters = (
        ("torch_npu.npu.utils.get_cann_version", lambda: torch_npu.npu.utils.get_cann_version(module="CANN")),
        ("torch_npu.utils.get_cann_version", lambda: torch_npu.utils.get_cann_version(module="CANN")),
        ("torch.version.cann", lambda: torch.version.cann),
    )
    for where, get in getters:
        try:
            version = clean(get())
        except Exception:  # an older torch_npu without it, or one whose lookup fails
            continue
        if version:
            return version, where
    return None, None


def torch_npu_software(torch: Any, torch_npu: Any, env: Mapping[str, str]) -> dict[str, str | None]:
    """What the torch_npu child runs (in the child: torch and torch_npu are imported)."""
    found: dict[str, str | None] = dict.fromkeys(TORCH_NPU_KEYS)
    with contextlib.suppress(Exception):
        found["torch"] = clean(getattr(torch, "__version__", None))
        found["torch_npu"] = clean(getattr(torch_npu, "__version__", None))
        found["cann"], found["cann_source"] = _torch_npu_cann(torch, torch_npu)
        if found["cann"] is None:
            found["cann"], found["cann_source"] = toolkit_cann(env)
    return found


def torch_npu_line(found: Mapping[str, str | None]) -> str:
    """The stdout line that carries `found` to `bsa run`."""
    return MARKER + json.dumps({key: found.get(key) for key in TORCH_NPU_KEYS}, ensure_ascii=True)


def from_torch_npu_log(log: Path | None) -> dict[str, Any]:
    """Read the torch_npu child's line back from its stdout log (the last one in its first 64 KiB)."""
    record: dict[str, Any] = {"kind": "torch_npu", **dict.fromkeys(TORCH_NPU_KEYS)}
    if log is None:
        return record
    with contextlib.suppress(Exception):  # a malformed line: the values stay null
        lines = [line for line in (read_head(log, LOG_MAX_BYTES) or "").splitlines() if line.startswith(MARKER)]
        if not lines or len(lines[-1]) > LINE_MAX_CHARS:
            return record
        found = json.loads(lines[-1][len(MARKER) :])
        if isinstance(found, dict):
            for key in TORCH_NPU_KEYS:
                record[key] = clean(found.get(key), PATH_MAX_CHARS if key == "cann_source" else VALUE_MAX_CHARS)
    return record
