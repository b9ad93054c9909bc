"""Print the shape of bsa_cli in the numbers docs/design.md and the design issue track.

    python scripts/code_shape.py [--top N] [--repo DIR]

- code lines: lines holding a token that is neither a comment nor part of the docstring of a module, class
  or function (blank lines, comments and those docstrings do not count);
- op-name branches: comparisons of a value with an op's name (`op == "forward"`, `op in PAIR_OPS`) and
  standard branches (`standard == "allclose"`), read from the syntax tree;
- the longest functions, in code lines;
- the modules of bsa_cli that loading a spec file imports (`bsa_cli.specs.load_specs` on cases/smoke.yaml,
  in a fresh interpreter).
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

OP_NAMES = {"forward", "backward", "chain", "autograd"}
OP_GROUPS = {"PAIR_OPS", "FORWARD_OPS", "OPS", "DEFAULT_OPS"}
STANDARD_NAMES = {"double-benchmark", "single", "allclose", "fa-ratio", "mixed-tolerance"}
SKIPPED = {"token", "tokenize"}  # token kinds that are not code


def docstring_lines(tree: ast.AST) -> set[int]:
    """Return the line numbers of the docstrings of modules, classes and functions (their first statement).

    A string statement anywhere else (an "attribute docstring" after an assignment) counts as code, as the
    design issue counted it (20,100 lines at 184e5ca).
    """
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(source: str) -> set[int]:
    """Return the line numbers holding code (not blank, not only a comment, not a docstring)."""
    quiet = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in quiet:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstring_lines(ast.parse(source))


def _names(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def branches(tree: ast.AST, names: set[str], groups: set[str] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """Return the lines of comparisons (==, !=, in, not in) of something with one of `names` or `groups`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names(side) & (names | groups) for side in sides if not isinstance(side, ast.Call)):
                if any(isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for o in node.ops):
                    found.append(node.lineno)
    return found


def functions(tree: ast.AST, code: set[int], module: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            out.append((len(span & code), f"{module}:{node.name}"))
    return out


def spec_loading_imports(repo: Path) -> list[str]:
    program = (
        "import sys; from bsa_cli.specs import load_specs; load_specs(['cases/smoke.yaml']); "
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('bsa_cli'))))"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    total = 0
    op_branches: list[str] = []
    standard_branches: list[str] = []
    longest: list[tuple[int, str]] = []
    modules = sorted((args.repo / "bsa_cli").rglob("*.py"))
    for path in modules:
        source = path.read_text()
        tree = ast.parse(source)
        code = code_lines(source)
        total += len(code)
        module = str(path.relative_to(args.repo))
        op_branches += [f"{module}:{line}" for line in branches(tree, OP_NAMES, OP_GROUPS)]
        standard_branches += [f"{module}:{line}" for line in branches(tree, STANDARD_NAMES)]
        longest += functions(tree, code, module)
    print(f"modules: {len(modules)}")
    print(f"code lines: {total}")
    print(f"op-name branches: {len(op_branches)} in {len({b.rsplit(':', 1)[0] for b in op_branches})} modules")
    for where in op_branches:
        print(f"  {where}")
    print(f"standard branches: {len(standard_branches)}")
    for where in standard_branches:
        print(f"  {where}")
    print(f"longest functions (code lines), the {args.top} longest:")
    for lines, name in sorted(longest, reverse=True)[: args.top]:
        print(f"  {lines:4d}  {name}")
    print(f"functions over 80 code lines: {sum(1 for lines, _ in longest if lines > 80)}")
    imported = spec_loading_imports(args.repo)
    print(f"modules of bsa_cli imported by loading a spec: {len(imported)}")
    print("  " + " ".join(imported))


if __name__ == "__main__":
    main()
