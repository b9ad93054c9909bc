"""What a diagnosis finds, the same for every op: causes and the hypotheses tried, ranked one way.

Every step of a diagnosis (a pattern, a recomputed hypothesis, a fit) returns `Findings` rather than
filling lists: the backward's and the forward's diagnoses add them up in their order and rank them with
`Findings.ranked`. `Search` holds the state of the recomputed hypotheses' search that both share: the
mask readings seen, the hypothesis that ended it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..results import Cause, DiagnosisKind, Hypothesis

if TYPE_CHECKING:
    from .hypotheses import Reading, Variant

#: A cause's kind (`results.DIAGNOSIS_KINDS` as a type).
Kind = DiagnosisKind


#: Causes scoring less are not listed in the diagnosis (`--explain` still shows them).
MIN_SCORE = 0.2
#: Causes listed in a diagnosis, best first.
MAX_CAUSES = 3


@dataclass(frozen=True)
class Diagnosis:
    """The causes (best first, at most `MAX_CAUSES`, none below `MIN_SCORE`) and every hypothesis tried."""

    causes: tuple[Cause, ...]
    hypotheses: tuple[Hypothesis, ...]


@dataclass(frozen=True)
class Findings:
    """Causes named and hypotheses tried, in the order found (ties rank in that order)."""

    causes: tuple[Cause, ...] = ()
    tried: tuple[Hypothesis, ...] = ()

    def __add__(self, other: Findings) -> Findings:
        return Findings(self.causes + other.causes, self.tried + other.tried)

    def follows(self, kind: Kind, source: str, cap: float, exact: bool = False) -> Findings:
        """The causes of `kind` ranked as a symptom of `source`: scored at most `cap` (`exact`: `cap`), their
        evidence saying "(follows from: source)"."""
        note = f" (follows from: {source})"
        causes = tuple(
            replace(c, score=cap if exact else min(c.score, cap), evidence=c.evidence + note)
            if c.kind == kind and note not in c.evidence
            else c
            for c in self.causes
        )
        return Findings(causes, self.tried)

    def ranked(self) -> Diagnosis:
        """The best cause of each kind, best first (at most `MAX_CAUSES`, none below `MIN_SCORE`), and every
        hypothesis, best first; scores rounded to 4 digits."""
        best: dict[str, Cause] = {}
        for cause in self.causes:
            if cause.kind not in best or cause.score > best[cause.kind].score:
                best[cause.kind] = cause
        ranked = sorted(best.values(), key=lambda c: -c.score)
        kept = tuple(replace(c, score=round(c.score, 4)) for c in ranked if c.score >= MIN_SCORE)[:MAX_CAUSES]
        tried = sorted(self.tried, key=lambda h: -h.score)
        return Diagnosis(kept, tuple(replace(h, score=round(h.score, 4)) for h in tried))


def named(
    kind: Kind,
    supposes: str,
    score: float,
    text: str,
    tensors: Sequence[str],
    where: Sequence[str] = (),
    verb: str = "explains",
) -> Findings:
    """A cause named by its evidence `text`, and its hypothesis ("explains: text"). How it reads (`verb`): a
    recomputed value explains, a pattern fits (and either may say how much: "explains 90% of the bias")."""
    cause = Cause(kind, score, text, tuple(tensors), tuple(where))
    return Findings((cause,), (Hypothesis(kind, supposes, score, f"{verb}: {text}"),))


def tried(kind: str, supposes: str, score: float, outcome: str) -> Findings:
    """A hypothesis tried that names no cause (ruled out, not tried)."""
    return Findings((), (Hypothesis(kind, supposes, score, outcome),))


def not_tried(hypotheses: Iterable[tuple[str, str]], reason: str) -> Findings:
    """(kind, supposes) hypotheses not tried, for `reason`."""
    return Findings((), tuple(Hypothesis(kind, supposes, 0.0, reason) for kind, supposes in hypotheses))


def scored(
    kind: str,
    supposes: str,
    share: float,
    text: str,
    tensors: Sequence[str],
    where: Sequence[str],
    evidence: str | None = None,
) -> Findings:
    """A recomputed (or fitted) hypothesis scored by the share of the excess error it explains: from half a
    cause (its evidence "supposes: text" unless given), else ruled out."""
    if share < 0.5:
        return tried(kind, supposes, share, f"ruled out: explains {share:.0%}: {text}")
    cause = Cause(kind, share, f"{supposes}: {text}" if evidence is None else evidence, tuple(tensors), tuple(where))
    return Findings((cause,), (Hypothesis(kind, supposes, share, f"explains {share:.0%} of the excess error: {text}"),))


def screened_out(kind: str, supposes: str, part: float, rows: int) -> Findings:
    """A hypothesis ruled out on a few rows of the worst failing block."""
    why = f"ruled out: explains {part:.0%} of the error of {rows} rows of the worst failing block"
    return tried(kind, supposes, part, why)


@dataclass(frozen=True)
class Trial:
    """What came of recomputing one hypothesis: the findings, the share it explains, and whether the earlier
    causes of the search's symptom kind follow from it."""

    found: Findings
    share: float = 0.0
    symptom: bool = False


@dataclass
class Search:
    """The recomputed hypotheses' search, the same for every op: each hypothesis is not tried (the op's
    reasons, asked in order), or tested (`Trial`); the first to explain `done_at` of the error ends it, and
    the causes of kind `symptom` found before follow from those that say so."""

    symptom: Kind
    done_at: float
    done: Hypothesis | None = None
    best: float = 0.0  # the largest share a hypothesis tested explains
    seen: dict[bytes, str] = field(default_factory=dict)  # mask readings tried: what each supposes

    def run(
        self,
        found: Findings,
        variants: Iterable[Variant],
        why_not: Callable[[Variant], str | None],
        test: Callable[[Variant], Trial],
    ) -> Findings:
        """`found` with the hypotheses tried in order, the symptoms' causes ranked below those they follow from."""
        symptoms: list[tuple[str, float]] = []
        for v in variants:
            why = why_not(v)
            if why is not None:
                found += tried(v.kind, v.supposes, 0.0, why)
                continue
            trial = test(v)
            found += trial.found
            self.best = max(self.best, trial.share)
            if trial.symptom:
                symptoms.append((v.supposes, trial.share))
            if trial.share >= self.done_at and self.done is None:
                self.done = trial.found.tried[-1]
        for supposes, share in symptoms:
            found = found.follows(self.symptom, supposes, 0.9 * share)
        return found

    def same_mask(self, ctx: Reading, v: Variant) -> str | None:
        """Why a mask reading is not tried: an earlier one reads the same here (else it is recorded)."""
        if not v.mask:
            return None
        read = b"".join(ctx.mask(v.mask, b).tobytes() for b in sorted(ctx.spans))
        if read in self.seen:
            return f"not told apart from '{self.seen[read]}' in this case: the mask reads the same"
        self.seen[read] = v.supposes
        return None

    def ended(self) -> str | None:
        """Why no more hypotheses are tried: one already explains the error."""
        if self.done is None:
            return None
        return f"not tried: '{self.done.supposes}' already explains {self.done.score:.0%} of the error"

    @staticmethod
    def first(reasons: Iterable[Callable[[], str | None]]) -> str | None:
        """The first reason (asked in order, lazily) a hypothesis is not tried, or None."""
        return next((why for why in (reason() for reason in reasons) if why is not None), None)
