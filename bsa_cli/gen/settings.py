"""`GenSettings`: what travels with every case of a `bsa gen` run, as one value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.case import DEFAULT_PRECISION, Case, Precision
from ..ops import Op


@dataclass(frozen=True)
class GenSettings:
    """How gen makes a case's folders.

    Attributes:
        precision: the golden's precision.
        jobs: processes across cases, or threads within a single case (1: this thread only).
        ops: which of a case's ops to make (None: every op it lists).
        on_progress: hears (case, fraction of its arithmetic done) as each case advances (None: nobody).
    """

    precision: Precision = DEFAULT_PRECISION
    jobs: int = 1
    ops: tuple[Op, ...] | None = None
    on_progress: Callable[[Case, float], None] | None = None

    def listener(self, case: Case) -> Callable[[float], None] | None:
        """Return the progress listener of one case (fraction done), or None."""
        on_progress = self.on_progress
        return None if on_progress is None else lambda fraction: on_progress(case, fraction)
