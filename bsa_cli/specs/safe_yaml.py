"""Bounded reading of an untrusted spec file: one YAML document, within a size, a count of values and a depth.

`read_yaml` reads a regular file of at most MAX_SPEC_BYTES, refuses duplicate keys, reads `1e-3` as the
number users mean (YAML 1.1 would read a string), and refuses a node graph that nests deeper than
MAX_YAML_DEPTH, refers to itself, or expands (aliases counted each time they are used) beyond
MAX_YAML_VALUES values, before anything expands it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import DataError, SpecError, show
from ..core.untrusted import read_regular

#: Largest spec file read (4 MiB): specs are a few KiB; large explicit masks belong in .npy files.
MAX_SPEC_BYTES = 4 << 20

#: Most values (scalars, lists, mappings) a spec may hold once its YAML aliases are expanded.
MAX_YAML_VALUES = 500_000

#: Deepest nesting of lists and mappings in a spec.
MAX_YAML_DEPTH = 32


class _SpecLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML's safe loader, refusing duplicate keys, and reading `1e-3` as the number users mean.

    It stops composing once a document holds more than MAX_YAML_VALUES values (untagged ones are counted
    as they are read; the file size bounds the rest).
    """

    values = 0

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        self.values += 1
        if self.values > MAX_YAML_VALUES:
            raise yaml.YAMLError(f"more than {MAX_YAML_VALUES} values in one spec")
        return super().resolve(kind, value, implicit)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {show(key)} (first on line {first + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)  # type: ignore[no-any-return]


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml(path: Path) -> Any:
    """Read one YAML document of a spec file, within MAX_SPEC_BYTES, MAX_YAML_VALUES and MAX_YAML_DEPTH.

    Aliases are counted as often as they are used, so an alias bomb is refused before anything expands it.

    Raises:
        SpecError: the file cannot be read, is too large, is not YAML, has a duplicate key, or nests or
            expands beyond the limits.
    """
    file = str(path)
    try:
        data = read_regular(path, MAX_SPEC_BYTES)
    except DataError as exc:
        if "more than" in exc.message:
            raise SpecError(
                file,
                f"{exc.message}: a spec holds at most {MAX_SPEC_BYTES >> 20} MiB "
                "(put large explicit masks in .npy files)",
            ) from None
        raise SpecError(file, f"cannot be read: {exc.message}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(file, f"cannot be read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(file, node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        text = " ".join(str(exc).replace('"<unicode string>"', repr(file)).split())
        raise SpecError(file, "not valid YAML: " + show(text, 300).strip("'")) from None
    except RecursionError:
        raise SpecError(file, f"nested deeper than the {MAX_YAML_DEPTH} levels a spec may use") from None
    except (ValueError, OverflowError) as exc:  # a value YAML's types cannot hold (a date, a huge integer)
        raise SpecError(file, f"not valid YAML: {show(str(exc), 120)}") from None
    finally:
        loader.dispose()


def _check_nodes(file: str, root: yaml.Node) -> None:
    """Refuse a YAML node graph that nests more than MAX_YAML_DEPTH levels, refers to itself, or expands
    (aliases counted each time they are used) to more than MAX_YAML_VALUES values.

    Each distinct collection is visited once, without recursion, so the check costs no more than reading.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id -> (values once expanded, nesting height)
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = (1, 1)
            continue
        pairs = isinstance(node, yaml.MappingNode)  # else a sequence: scalars are done above
        children = [part for pair in node.value for part in pair] if pairs else list(node.value)
        if done:
            open_nodes.discard(key)
            size, height = 1, 1
            for child in children:
                child_size, child_height = (1, 1) if isinstance(child, yaml.ScalarNode) else sizes[id(child)]
                size += child_size
                height = max(height, child_height + 1)
            sizes[key] = (size, height)
            if size > MAX_YAML_VALUES:
                raise SpecError(
                    file,
                    f"its YAML expands to more than {MAX_YAML_VALUES} values (aliases "
                    "counted each time they are used): an alias bomb?",
                )
            if height > MAX_YAML_DEPTH:
                raise SpecError(file, f"nested deeper than the {MAX_YAML_DEPTH} levels a spec may use")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            line = node.start_mark.line + 1 if node.start_mark else "?"
            raise SpecError(file, f"a YAML alias refers to a value that contains it (line {line})")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend(
            (child, False) for child in children if not isinstance(child, yaml.ScalarNode) and id(child) not in sizes
        )
