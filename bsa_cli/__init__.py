"""bsa: test data and verdicts for aclnnBlockSparseAttentionGrad.

The Python API (docs/api.md) is importable from here: `load_case`, `judge`, `judge_status`,
`assert_passed` and their helpers. Each name is imported on first use, so `import bsa_cli` (and the
pytest plugin, which every pytest run in this environment loads) costs no NumPy, and never torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

__all__ = [
    "BsaError",
    "CaseResult",
    "Check",
    "DataError",
    "LoadedCase",
    "RunSettings",
    "SuiteResult",
    "__version__",
    "aclnn_status",
    "assert_passed",
    "case_dirs",
    "failure_message",
    "judge",
    "judge_status",
    "load_case",
    "to_numpy",
    "to_torch",
]

# The public names bsa_cli.api does not define, by their module; the others come from bsa_cli.api.
_DEFINED_OUTSIDE_API = {
    "compare": ("CaseResult", "Check", "RunSettings", "SuiteResult"),
    "core.errors": ("BsaError", "DataError"),
}
#: Public name -> the module (under bsa_cli) that defines it.
_PUBLIC = {name: "api" for name in __all__ if name != "__version__"} | {
    name: module for module, names in _DEFINED_OUTSIDE_API.items() for name in names
}

if TYPE_CHECKING:
    from .api import (
        LoadedCase,
        aclnn_status,
        assert_passed,
        case_dirs,
        failure_message,
        judge,
        judge_status,
        load_case,
        to_numpy,
        to_torch,
    )
    from .compare import CaseResult, Check, RunSettings, SuiteResult
    from .core.errors import BsaError, DataError


def __getattr__(name: str) -> Any:
    """Return a public name from its module, importing the module on first use.

    Not cached here: the name always comes from the module as `sys.modules` holds it now, so it agrees
    with what the pytest plugin imports even after a test runner has dropped and reloaded bsa's modules.
    """
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
