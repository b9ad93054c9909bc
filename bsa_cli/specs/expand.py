"""A spec's defaults and matrix: `deep_merge` of `defaults:` into each case, `expand_matrix` over its values.

A matrix (top level, or per case) maps case keys, dotted to reach into a mapping (`sparsity.density`), to
lists of values; a case expands to the cartesian product, each variant named with its values appended
(`_label`: [16, 48] -> 16x48, bfloat16 -> bf16).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

from ..core.errors import SpecError, show, suggest
from .fields import CASE_KEYS, _key


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` updated by `override`, merging nested mappings key by key.

    Only the mappings on the way to a merged key are new; other values are shared with `base` and
    `override` (specs are read, never changed, so a large default is not copied into every case).
    """
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _matrix(file: str, case: str | None, matrix: Any) -> dict[str, list[Any]]:
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v for v in matrix.values()):
        raise SpecError(file, "'matrix:' maps keys to non-empty lists of values", case=case, key="matrix")
    for key in matrix:
        if not isinstance(key, str):
            raise SpecError(file, f"matrix key {show(key)} is not a string", case=case, key="matrix")
    return matrix


def expand_matrix(
    file: str, case: str, raw: dict[str, Any], matrix: Mapping[str, list[Any]]
) -> list[tuple[dict[str, Any], str]]:
    """Return one (raw case, name suffix) per combination of matrix values; no matrix gives one."""
    if not matrix:
        return [(raw, "")]
    keys = list(matrix)
    for key in keys:
        top = key.split(".")[0]
        if top not in CASE_KEYS or top == "matrix":
            raise SpecError(
                file, f"matrix key '{_key(key)}' is not a case key{suggest(top, CASE_KEYS)}", case=case, key="matrix"
            )
    variants = []
    for values in itertools.product(*(matrix[k] for k in keys)):
        variant = dict(raw)  # mappings on the way to a matrix key are copied; values are shared
        for key, value in zip(keys, values, strict=True):
            *parents, leaf = key.split(".")
            node = variant
            for parent in parents:
                child = node.get(parent)
                if child is None:
                    child = {}
                elif not isinstance(child, dict):
                    message = f"matrix key '{_key(key)}' reaches into a non-mapping"
                    raise SpecError(file, message, case=case, key="matrix")
                node[parent] = dict(child)
                node = node[parent]
            node[leaf] = value
        variants.append((variant, "." + ".".join(_label(v) for v in values)))
    return variants


def _label(value: Any, budget: int = 256) -> str:
    """Render a matrix value as a readable name part: [16, 48] -> 16x48, bfloat16 -> bf16.

    Stops once the text passes `budget` characters (such a name is refused as too long anyway).
    """
    if isinstance(value, (list, tuple, dict)):
        parts: list[str] = []
        used = 0
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        for key, item in items:
            part = ("" if key is None else _label(key, budget - used)) + _label(item, budget - used)
            parts.append(part)
            used += len(part) + 1
            if used > budget:
                break
        return ("-" if isinstance(value, dict) else "x").join(parts)
    text = str(value)[: budget + 1]
    text = {"float16": "fp16", "bfloat16": "bf16"}.get(text, text)
    return re.sub(r"[^A-Za-z0-9_\-]", "_", text.replace(".", "p"))
