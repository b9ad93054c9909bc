"""Hostile specs, case folders and device binaries, as a table: every one ends with a documented exit code
and one line that names the problem, never a traceback; nothing outside the folders bsa was given is
written or removed (a victim folder's digest stays the same, and no file appears next to the given
folders); memory stays under 1 GiB and each trial under 20 s.

Trials run in this process through CliRunner (a device binary is a subprocess, as always).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from tests.helpers import BASE, digest

MEMORY_LIMIT = 1 << 30
TIME_LIMIT_S = 20.0


@dataclass
class Sandbox:
    """A trial's folder: `victim/` must stay as it is; `out/` is the folder given to bsa."""

    root: Path
    generated: Path

    @property
    def victim(self) -> Path:
        return self.root / "victim"

    @property
    def out(self) -> Path:
        return self.root / "out"

    def spec(self, case: Any = None, text: str | None = None, **fields: Any) -> str:
        """Write specs/spec.yaml: one case (BASE updated by `fields`, or `case`), or the given text."""
        path = self.root / "specs" / "spec.yaml"
        path.parent.mkdir(exist_ok=True)
        if text is None:
            text = yaml.safe_dump({"cases": [case if case is not None else {**BASE, **fields}]}, sort_keys=False)
        path.write_text(text)
        return str(path)

    def cases(self, *names: str) -> Path:
        """Copy generated cases ('p' positive, 'n' negative) into out/ and return out/."""
        self.out.mkdir(exist_ok=True)
        for name in names or ("p",):
            shutil.copytree(self.generated / name, self.out / name, symlinks=True)
        return self.out

    def manifest(self, name: str = "p") -> tuple[Path, dict]:
        path = self.cases(name) / name / "case.json"
        return path, json.loads(path.read_text())

    def edit(self, change: Callable[[dict], None], name: str = "p") -> Path:
        """Copy case `name` into out/ and change its manifest; return out/."""
        path, manifest = self.manifest(name)
        change(manifest)
        path.write_text(json.dumps(manifest))
        return self.out

    def binary(self, body: str) -> str:
        """Write an executable Python device binary; `body` sees `manifest`, `out` (its output dir) and os."""
        path = self.root / "bin" / "device.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(
            f"#!{sys.executable}\nimport json, os, sys\n"
            "manifest = json.load(open(sys.argv[1])); out = sys.argv[2]\n"
            "def put(name, data):\n    open(os.path.join(out, name), 'wb').write(data)\n"
            "def grads():\n"
            "    case = os.path.dirname(sys.argv[1])\n"
            "    for g in ('dq', 'dk', 'dv'):\n"
            "        data = open(os.path.join(case, manifest['benchmark'][g]['file']), 'rb').read()\n"
            "        put(manifest['outputs'][g]['file'], data)\n" + body + "\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    def npy(self, name: str, data: bytes) -> None:
        """Write a file next to the spec (in specs/)."""
        path = self.root / "specs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """Return the bytes of a .npy header (version 1.0) promising `shape` of `descr`, without data."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


def _bomb(levels: int = 7) -> str:
    lines = ['    description: [&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        lines.append(f"      , &a{level} [" + ",".join([f"*a{level - 1}"] * 9) + "]")
    return "cases:\n  - name: x\n    num_heads: 1\n    q_seq_len: 16\n" + "\n".join(lines) + "]\n"


@dataclass(frozen=True)
class Trial:
    """One hostile input: `setup(sandbox)` returns bsa's arguments; bsa must exit `code` saying `text`."""

    id: str
    setup: Callable[[Sandbox], list[str]]
    code: int
    text: str


def _spec(command: str = "gen", **fields: Any) -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        path = box.spec(**fields)
        return [command, path, "-o", str(box.out)] if command == "gen" else [command, path]

    return setup


def _text(text: str, command: str = "validate") -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        return [command, box.spec(text=text)] + (["-o", str(box.out)] if command == "gen" else [])

    return setup


def _mask(value: Any, file: tuple[str, bytes] | None = None) -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        if file is not None:
            box.npy(*file)
        mask = value(box) if callable(value) else value
        return ["gen", box.spec(**{"sparsity": {"pattern": "explicit", "mask": mask}}), "-o", str(box.out)]

    return setup


def _fifo_mask(box: Sandbox) -> str:
    (box.root / "specs").mkdir(exist_ok=True)
    os.mkfifo(box.root / "specs" / "fifo.npy")
    return "fifo.npy"


def _link_mask(box: Sandbox) -> str:
    np.save(box.victim / "m.npy", np.ones((2, 2), dtype=np.uint8))
    (box.root / "specs").mkdir(exist_ok=True)
    (box.root / "specs" / "link.npy").symlink_to(box.victim / "m.npy")
    return "link.npy"


def _manifest(change: Callable[[dict, Sandbox], None], command: str = "run", name: str = "p") -> Callable:
    def setup(box: Sandbox) -> list[str]:
        out = box.edit(lambda m: change(m, box), name)
        if command == "emulate":
            return ["emulate", str(out / name / "case.json"), str(box.out / "emulated")]
        return [command, str(out)]

    return setup


def _set(path: str, value: Any) -> Callable[[dict, Sandbox], None]:
    """Return a change that sets manifest key `a.b.c` to `value` (a callable gets the sandbox)."""

    def change(manifest: dict, box: Sandbox) -> None:
        *parents, leaf = path.split(".")
        node = manifest
        for part in parents:
            node = node[part]
        node[leaf] = value(box) if callable(value) else value

    return change


def _outputs_link(command: str, *extra: str) -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        out = box.cases("p")
        outputs = out / "p" / "outputs"
        shutil.rmtree(outputs)
        (box.victim / "outs").mkdir()
        for name in ("dq.bin", "status.txt", "run.json", "stdout.log", "keep.txt"):
            (box.victim / "outs" / name).write_text("precious")
        (box.victim / "outs" / ".run-1").mkdir()
        (box.victim / "outs" / ".run-1" / "x").write_text("precious")
        outputs.symlink_to(box.victim / "outs")
        return [command, str(out), *[e.replace("{bin}", box.binary("grads(); put('status.txt', b'0')")) for e in extra]]

    return setup


def _outputs_folder_entry(box: Sandbox) -> list[str]:
    def change(manifest: dict, _box: Sandbox) -> None:
        manifest["outputs"]["dq"]["file"] = "sub"

    out = box.edit(lambda m: change(m, box))
    (out / "p" / "outputs" / "sub").mkdir(parents=True)
    (out / "p" / "outputs" / "sub" / "keep.txt").write_text("keep")
    return ["run", str(out)]


def _case_file(change: Callable[[Path, Sandbox], None], command: str = "run") -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        out = box.cases("p")
        change(out / "p", box)
        return [command, str(out)]

    return setup


def _replace_with_link(relative: str, target: str = "precious.txt") -> Callable[[Path, Sandbox], None]:
    def change(case_dir: Path, box: Sandbox) -> None:
        path = case_dir / relative
        shutil.copy(path, box.victim / f"copy-{path.name}")
        path.unlink()
        path.symlink_to(box.victim / (target if target != "copy" else f"copy-{path.name}"))

    return change


def _fifo_manifest(case_dir: Path, _box: Sandbox) -> None:
    (case_dir / "case.json").unlink()
    os.mkfifo(case_dir / "case.json")


def _deep_json(case_dir: Path, _box: Sandbox) -> None:
    (case_dir / "case.json").write_text("[" * 100_000 + "]" * 100_000)


def _run_folder_record(case_dir: Path, _box: Sandbox) -> None:
    (case_dir / "outputs" / "run.json").mkdir(parents=True)
    (case_dir / "outputs" / "run.json" / "keep").write_text("keep")


def _staging_link(case_dir: Path, box: Sandbox) -> None:
    (box.victim / "staging").mkdir()
    (box.victim / "staging" / "precious").write_text("x")
    (case_dir / "outputs").mkdir(exist_ok=True)
    (case_dir / "outputs" / ".run-1").symlink_to(box.victim / "staging")


def _binary(body: str, *extra: str, name: str = "p") -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        return ["run", str(box.cases(name)), "--binary", box.binary(body.replace("{victim}", str(box.victim))), *extra]

    return setup


def _hidden_only(box: Sandbox) -> list[str]:
    box.out.mkdir()
    shutil.copytree(box.generated / "p", box.out / ".p.partial-1-abc")
    (box.out / "linked").symlink_to(box.generated / "p")
    return ["run", str(box.out)]


def _emulate_into_link(box: Sandbox) -> list[str]:
    out = box.cases("p")
    (box.root / "emulated").symlink_to(box.victim)
    return ["emulate", str(out / "p" / "case.json"), str(box.root / "emulated")]


def _record_link(case_dir: Path, box: Sandbox) -> None:
    (case_dir / "outputs").mkdir(exist_ok=True)
    for name in ("run.json", "status.txt", "stdout.log", "dq.bin"):
        (case_dir / "outputs" / name).symlink_to(box.victim / "precious.txt")


def _outputs_root_link(command: str) -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        out = box.cases("p")
        (box.root / "roots").mkdir()
        (box.root / "roots" / "p").symlink_to(box.victim)
        return [command, str(out), "--outputs-root", str(box.root / "roots")]

    return setup


def _report(document: Any) -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        path = box.root / "report.json"
        path.write_text(document if isinstance(document, str) else json.dumps(document))
        return ["compare", "--merge", str(path)]

    return setup


def _spec_folder_link(box: Sandbox) -> list[str]:
    (box.root / "specs").mkdir()
    (box.victim / "v.yaml").write_text(yaml.safe_dump({"cases": [BASE]}))
    (box.root / "specs" / "v.yaml").symlink_to(box.victim / "v.yaml")
    return ["validate", str(box.root / "specs")]


def _many_cases(box: Sandbox) -> list[str]:
    cases = [{"name": f"c{i}"} for i in range(10_001)]
    return ["validate", box.spec(text=yaml.safe_dump({"defaults": BASE, "cases": cases}))]


GOOD_BINARY = "grads(); put('status.txt', b'0\\n')"

TRIALS = [
    # ---- case names (item 1) ----
    Trial("name-dot", _spec(name="."), 2, "cannot name a case folder"),
    Trial("name-dotdot", _spec(name=".."), 2, "cannot name a case folder"),
    Trial(
        "name-dotdot-check", lambda b: ["check", b.spec(name=".."), "-o", str(b.out)], 2, "cannot name a case folder"
    ),
    Trial("name-hidden", _spec(name=".c"), 2, "cannot name a case folder"),
    Trial("name-too-long", _spec(name="n" * 300), 2, "at most 200 characters"),
    Trial("name-long-by-matrix", _spec(matrix={"seed": [int("9" * 200)]}), 2, "cannot name a case folder"),
    Trial("name-slash", _spec(name="a/b"), 2, "may hold only letters"),
    # ---- YAML and matrix bombs (item 4) ----
    Trial("alias-bomb", _text(_bomb()), 2, "alias bomb"),
    Trial("alias-bomb-in-dtype", _text(_bomb().replace("    description: [", "    dtype: [")), 2, "alias bomb"),
    Trial(
        "alias-recursive",
        _text("cases:\n  - &c {name: x, q_seq_len: 16, num_heads: 1, description: *c}\n"),
        2,
        "refers to a value that contains it",
    ),
    Trial(
        "matrix-bomb",
        _spec(
            "validate",
            matrix={
                k: list(range(1, 11))
                for k in (
                    "seed",
                    "head_dim",
                    "num_heads",
                    "q_seq_len",
                    "kv_seq_len",
                    "batch",
                    "sparsity.window",
                    "sparsity.stride",
                    "num_kv_heads",
                )
            },
        ),
        2,
        "--max-cases",
    ),
    Trial(
        "matrix-bomb-dotted",
        _spec(
            "validate",
            matrix={f"init.{k}": [float(i) for i in range(10)] for k in ("mean", "std", "low", "high")}
            | {f"sparsity.{k}": list(range(1, 11)) for k in ("window", "stride")}
            | {"seed": list(range(10)), "head_dim": list(range(1, 11)), "scale": [0.1] * 10},
        ),
        2,
        "--max-cases",
    ),
    Trial("too-many-cases", _many_cases, 2, "more than the limit of 10000 cases"),
    Trial("deep-flow", _text("cases:\n  - name: x\n    description: " + "[" * 3000 + "]" * 3000 + "\n"), 2, "YAML"),
    Trial(
        "deep-block",
        _text(
            "cases:\n  - name: x\n    description:\n"
            + "".join("  " * (i + 3) + "k:\n" for i in range(40))
            + "  " * 43
            + "1\n"
        ),
        2,
        "nested deeper",
    ),
    Trial(
        "duplicate-key",
        _text("cases:\n  - name: x\n    num_heads: 1\n    q_seq_len: 16\n    q_seq_len: 32\n"),
        2,
        "duplicate key 'q_seq_len'",
    ),
    Trial("python-tag", _text("cases:\n  - !!python/object:os.system {name: x}\n"), 2, "not valid YAML"),
    Trial("huge-integer", _text("cases:\n  - name: x\n    num_heads: " + "9" * 5000 + "\n"), 2, "not valid YAML"),
    Trial("bad-date", _text("cases:\n  - name: x\n    seed: 2001-13-45\n"), 2, "not valid YAML"),
    Trial(
        "not-utf8",
        lambda b: (
            b.root.joinpath("s.yaml").write_bytes(b"cases:\n  - name: \xff\xfe\n"),
            ["validate", str(b.root / "s.yaml")],
        )[1],
        2,
        "not UTF-8",
    ),
    Trial(
        "spec-too-large", _text("cases:\n  - name: x\n    description: '" + "x" * (5 << 20) + "'\n"), 2, "at most 4 MiB"
    ),
    Trial(
        "spec-fifo",
        lambda b: (os.mkfifo(b.root / "s.yaml"), ["validate", str(b.root / "s.yaml")])[1],
        2,
        "not a regular file",
    ),
    Trial("matrix-key-not-string", _spec("validate", matrix={1: [1]}), 2, "matrix key 1"),
    # ---- values that used to crash (item 5) ----
    Trial("dtype-list", _spec("validate", dtype=["fp16"]), 2, "key 'dtype': ['fp16'] is not allowed"),
    Trial("dtype-mapping", _spec("validate", dtype={"a": 1}), 2, "key 'dtype'"),
    Trial(
        "layout-injection",
        _spec("validate", kv_layout="BNSD\nexpect_status 0", expect=161002),
        2,
        "not a layout string",
    ),
    Trial("batch-1e12", _spec("list", batch=10**12), 2, "above the maximum 2147483647"),
    Trial("q-seq-2-70", _spec("list", q_seq_len=2**70), 2, "above the maximum"),
    Trial(
        "elements-beyond-limit",
        _spec("list", batch=2**20, num_heads=2**20, q_seq_len=2**10),
        2,
        "more than bsa's limit",
    ),
    Trial("seed-negative", _spec("validate", seed=-1), 2, "below the minimum 0"),
    Trial("pre-tokens-huge", _spec("validate", pre_tokens=2**70, expect=161002), 2, "above the maximum"),
    Trial("block-shape-huge-negative-case", _spec("validate", block_shape=[2**70, 1], expect=161002), 2, "block_shape"),
    Trial("head-dim-float", _spec("validate", head_dim=1e400), 2, "not an integer"),
    Trial("density-text", _spec("validate", sparsity={"pattern": "random", "density": "lots"}), 2, "not a number"),
    Trial(
        "empty-rows-nan", _spec("validate", sparsity={"pattern": "dense", "empty_rows": float("nan")}), 2, "empty_rows"
    ),
    Trial("compare-standard-list", _spec("validate", compare={"standard": ["x"]}), 2, "compare"),
    Trial("init-mapping-list", _spec("validate", init=[1]), 2, "key 'init'"),
    # ---- explicit masks (items 5, 6) ----
    Trial("mask-fifo", _mask(_fifo_mask), 2, "not a regular file"),
    Trial("mask-npz", _mask("m.npz", ("m.npz", b"PK\x03\x04" + b"\0" * 60)), 2, "not a .npy array file"),
    Trial("mask-empty-npy", _mask("m.npy", ("m.npy", b"")), 2, "not a .npy array file"),
    Trial(
        "mask-huge-header",
        _mask("m.npy", ("m.npy", _npy_header("|u1", (10**5, 10**5, 10**5)))),
        2,
        "header promises shape",
    ),
    Trial("mask-absolute", _mask(lambda b: str(b.victim / "m.npy")), 2, "absolute path"),
    Trial("mask-dotdot", _mask("../victim/m.npy"), 2, "'..'"),
    Trial(
        "mask-inside-subfolder-ok",
        _mask("sub/m.npy", ("sub/m.npy", _npy_bytes(np.ones((2, 2))))),
        0,
        "generated 1 case in",
    ),
    Trial("mask-link-out", _mask(_link_mask), 2, "leads out of"),
    Trial("mask-half", _mask([[0.5, 1.0], [1.0, 1.0]]), 2, "holds 0.5"),
    Trial("mask-nan", _mask("m.npy", ("m.npy", _npy_bytes(np.array([[np.nan, 1.0], [1.0, 1.0]])))), 2, "holds nan"),
    Trial("mask-complex", _mask("m.npy", ("m.npy", _npy_bytes(np.ones((2, 2), dtype=complex)))), 2, "complex"),
    Trial("mask-two", _mask([[2, 0], [0, 1]]), 2, "holds 2"),
    Trial("mask-object-npy", _mask("m.npy", ("m.npy", _npy_header("|O", (2, 2)) + b"\0" * 32)), 2, "holds object"),
    # ---- silent wrong results (item 6) ----
    Trial("scale-1e300", _spec(scale=1e300), 2, "overflows float32"),
    Trial("init-std-1e300", _spec(init={"std": 1e300}), 2, "cannot be finite"),
    Trial("init-mean-fp16-overflow", _spec(init={"mean": 1e5}), 2, "float16's largest number"),
    Trial("scale-nan", _spec(scale="nan"), 2, "finite number"),
    Trial("tnd-no-lengths", _spec(layout="TND", actual_seq_lengths=[], q_seq_len=None), 2, "is empty"),
    Trial(
        "tnd-zero-lengths",
        lambda b: [
            "gen",
            b.spec(
                case={
                    **{k: v for k, v in BASE.items() if k != "q_seq_len"},
                    "layout": "TND",
                    "actual_seq_lengths": [0, 0],
                }
            ),
            "-o",
            str(b.out),
        ],
        2,
        "nothing to compute",
    ),
    # ---- manifests that point outside their case (item 2) ----
    Trial(
        "outputs-absolute",
        _manifest(_set("outputs.dq.file", lambda b: str(b.victim / "precious.txt"))),
        3,
        "is an absolute path",
    ),
    Trial("outputs-dotdot", _manifest(_set("outputs.dq.file", "../../../victim/precious.txt")), 3, "'..'"),
    Trial(
        "outputs-dotdot-emulate", _manifest(_set("outputs.dq.file", "../../victim/new/dq.bin"), "emulate"), 2, "'..'"
    ),
    Trial(
        "outputs-dotdot-negative",
        _manifest(_set("outputs.dq.file", "../../../victim/precious.txt"), name="n"),
        3,
        "'..'",
    ),
    Trial(
        "inputs-absolute",
        _manifest(_set("inputs.query.file", lambda b: str(b.victim / "precious.txt"))),
        3,
        "absolute path",
    ),
    Trial(
        "golden-dotdot-compare", _manifest(_set("golden.dq.file", "../../victim/precious.txt"), "compare"), 3, "'..'"
    ),
    Trial("outputs-itself", _manifest(_set("outputs.dq.file", ".")), 3, "names the folder itself"),
    Trial("outputs-reserved", _manifest(_set("outputs.dq.file", "run.json")), 3, "keeps for itself"),
    Trial(
        "tiles-absolute-compare",
        _manifest(_set("benchmark_summary.tiles.dq.file", "/etc/passwd"), "compare"),
        3,
        "absolute path",
    ),
    Trial("input-link-out", _case_file(_replace_with_link("inputs/query.bin", "copy")), 3, "leads out of"),
    Trial("manifest-link-out", _case_file(_replace_with_link("case.json", "copy"), "compare"), 3, "leads out of"),
    Trial(
        "manifest-fifo",
        lambda b: (
            _fifo_manifest(b.cases("p") / "p", b),
            ["emulate", str(b.out / "p" / "case.json"), str(b.out / "emulated")],
        )[1],
        2,
        "not a regular file",
    ),
    Trial("manifest-fifo-not-a-case", _case_file(_fifo_manifest), 2, "no case directories"),
    Trial("manifest-deep-json", _case_file(_deep_json, "compare"), 3, "not valid JSON"),
    # ---- links and folders in the output folder (item 3) ----
    Trial("outputs-link-run", _outputs_link("run"), 3, "is a symbolic link"),
    Trial("outputs-link-run-binary", _outputs_link("run", "--binary", "{bin}"), 3, "is a symbolic link"),
    Trial("outputs-link-compare", _outputs_link("compare"), 3, "is a symbolic link"),
    Trial("emulate-into-link", _emulate_into_link, 2, "is a symbolic link"),
    Trial("outputs-entry-folder", _outputs_folder_entry, 3, "is a folder where bsa writes a result file"),
    Trial("record-is-folder", _case_file(_run_folder_record), 3, "is a folder where bsa writes"),
    Trial("results-are-links", _case_file(_record_link), 0, "1 ok"),
    Trial("results-are-links-compare", _case_file(_record_link, "compare"), 3, "leads out of"),
    Trial("outputs-root-link-run", _outputs_root_link("run"), 3, "is a symbolic link"),
    Trial("outputs-root-link-compare", _outputs_root_link("compare"), 3, "is a symbolic link"),
    Trial("spec-folder-link-out", _spec_folder_link, 2, "leads out of"),
    Trial("merge-name-list", _report({"schema": "bsa-compare/1", "cases": [{"name": ["x"]}]}), 2, "malformed report"),
    Trial("merge-deep-json", _report("[" * 100_000 + "]" * 100_000), 2, "not valid JSON"),
    Trial("merge-cases-number", _report({"schema": "bsa-compare/1", "cases": 7}), 2, "malformed report"),
    Trial("staging-link", _case_file(_staging_link), 0, "1 ok"),
    Trial("hidden-and-linked-cases", _hidden_only, 2, "no case directories"),
    # ---- malformed manifests (item 5) ----
    Trial("inputs-string", _manifest(_set("inputs", "query")), 3, "inputs: 'query' is not a mapping"),
    Trial("outputs-list", _manifest(_set("outputs", ["dq"])), 3, "outputs: ['dq'] is not a mapping"),
    Trial("entry-without-file", _manifest(lambda m, b: m["outputs"]["dq"].pop("file")), 3, "has no 'file'"),
    Trial("dtype-float128", _manifest(_set("outputs.dq.dtype", "float128")), 3, "'float128' is not one of"),
    Trial("shape-negative", _manifest(_set("inputs.query.shape", [-1, 2])), 3, "non-negative integers"),
    Trial("shape-huge", _manifest(_set("golden.dq.shape", [2**40, 2**40]), "compare"), 3, "more than bsa's limit"),
    Trial("params-batch-huge", _manifest(_set("params.batch", 10**15), "compare"), 3, "params.batch"),
    Trial("params-strings", _manifest(_set("params.head_dim", "16"), "emulate"), 2, "params.head_dim"),
    Trial(
        "params-lengths-string",
        _manifest(_set("params.actual_seq_lengths", "abc"), "compare"),
        3,
        "params.actual_seq_lengths",
    ),
    Trial("name-not-string", _manifest(_set("name", {"x": 1})), 3, "name {'x': 1} is not a non-empty string"),
    Trial(
        "name-climbs-export",
        lambda b: (
            b.edit(lambda m: m.update(name="../../victim/x")),
            ["export", str(b.out), "--format", "atk", "-o", str(b.out / "ex")],
        )[1],
        2,
        "cannot name a case",
    ),
    Trial(
        "record-hostile-compare",
        _case_file(
            lambda c, b: (
                (c / "outputs").mkdir(exist_ok=True)
                or (c / "outputs" / "run.json").write_text(
                    json.dumps({"case": "p", "outcome": "crashed", "problems": 7, "repeat": []})
                )
            ),
            "compare",
        ),
        3,
        "not a run record",
    ),
    # ---- binaries (items 5, 7) ----
    Trial("binary-folder-run-json", _binary(GOOD_BINARY + "; os.mkdir(os.path.join(out, 'run.json'))"), 0, "1 ok"),
    Trial("binary-folder-stderr-log", _binary(GOOD_BINARY + "; os.mkdir(os.path.join(out, 'stderr.log'))"), 0, "1 ok"),
    Trial(
        "binary-status-fifo", _binary("grads(); os.mkfifo(os.path.join(out, 'status.txt'))"), 3, "not a regular file"
    ),
    Trial("binary-status-huge", _binary("grads(); put('status.txt', b'0\\n' + b'x' * (20 << 20))"), 0, "1 ok"),
    Trial(
        "binary-status-long-number", _binary("grads(); put('status.txt', b'9' * 5000)"), 3, "not a decimal aclnn status"
    ),
    Trial(
        "binary-dq-link",
        _binary(
            "grads(); os.remove(os.path.join(out, 'dq.bin')); "
            "os.symlink('{victim}/precious.txt', os.path.join(out, 'dq.bin')); "
            "put('status.txt', b'0')"
        ),
        3,
        "dq.bin",
    ),
    Trial(
        "binary-chatty",
        _binary(GOOD_BINARY + "; sys.stdout.write('x' * (6 << 20)); sys.stderr.write('y' * (3 << 20))"),
        0,
        "1 ok",
    ),
    Trial("binary-exits-1", _binary("sys.exit(1)"), 3, "exited with code 1"),
    Trial("binary-killed", _binary("os.kill(os.getpid(), 9)"), 3, "killed by SIGKILL"),
]


@pytest.fixture(scope="module")
def generated(generated_spec: Callable[..., Path]) -> Path:
    """Cases 'p' (positive) and 'n' (negative), generated once; read-only (a `Sandbox` copies them)."""
    return generated_spec(
        {"cases": [{**BASE, "name": "p"}, {**BASE, "name": "n", "dtype": "float32", "expect": 161002}]}
    )


def test_the_table_is_large_and_its_ids_unique() -> None:
    assert len(TRIALS) >= 60
    assert len({t.id for t in TRIALS}) == len(TRIALS)


@pytest.mark.parametrize("trial", TRIALS, ids=[t.id for t in TRIALS])
def test_hostile_input_ends_cleanly(trial: Trial, generated: Path, tmp_path: Path) -> None:
    try_trial(trial, generated, tmp_path)


def try_trial(trial: Trial, generated: Path, tmp_path: Path) -> None:
    """Run one trial: the documented exit code and message, no traceback, the victim untouched, nothing new
    next to the given folders, bounded memory and time."""
    box = Sandbox(tmp_path, generated)
    box.victim.mkdir()
    (box.victim / "precious.txt").write_text("precious")
    (box.victim / "dq.bin").write_bytes(b"\0" * 64)
    args = trial.setup(box)
    victim_before = digest(box.victim)
    listing_before = set(os.listdir(tmp_path))

    tracemalloc.start()
    started = time.monotonic()
    try:
        result = CliRunner().invoke(main, args)
    finally:
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    everything = result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in everything
    assert result.exit_code == trial.code, everything
    assert trial.text in everything, everything
    if trial.code == 2:
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and trial.text in errors[0], result.stderr
    assert digest(box.victim) == victim_before
    assert set(os.listdir(tmp_path)) <= listing_before | {"out", "emulated", "specs", "roots"}
    assert peak < MEMORY_LIMIT
    assert elapsed < TIME_LIMIT_S


# ---- round 2 (issue 18): report targets, case.txt, signals, kill -9, JSON, links, names, garbage ----------


def _invoke(args: list[str]) -> Any:
    result = CliRunner().invoke(main, args)
    everything = result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in everything
    return result


def _special(path: Path, kind: str) -> None:
    """Make a FIFO, or a character device with the numbers of /dev/null (1, 3) or /dev/full (1, 7), at `path`
    (a private copy in a temporary folder: the real /dev files are never a test's target)."""
    if kind == "fifo":
        os.mkfifo(path)
        return
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, {"null": 3, "full": 7}[kind]))


@pytest.mark.parametrize("option", ["--json", "--junit", "--html", "--csv"])
def test_a_report_into_a_character_device_is_written_into_it(option: str, generated: Path, tmp_path: Path) -> None:
    """`--junit /dev/null` writes into the device, as every Unix tool does, and never replaces it with a file;
    a device that refuses the write (/dev/full) is one `Error:` line naming it."""
    for kind, code in (("null", 3), ("full", 2)):  # 3: case p has no outputs, so it is not judged
        target = tmp_path / kind / "target"
        target.parent.mkdir()
        _special(target, kind)
        before = os.lstat(target)
        result = _invoke(["compare", str(generated / "p"), option, str(target)])
        assert result.exit_code == code, result.output + result.stderr
        if kind == "full":
            errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
            assert len(errors) == 1 and "No space left on device" in errors[0] and str(target) in errors[0]
        after = os.lstat(target)
        assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
        assert os.listdir(target.parent) == ["target"]


@pytest.mark.parametrize("kind", ["fifo"])
@pytest.mark.parametrize("option", ["--json", "--junit", "--html", "--csv"])
def test_report_target_that_is_not_a_regular_file_is_refused(
    option: str, kind: str, generated: Path, tmp_path: Path
) -> None:
    target = tmp_path / "dev" / "target"
    target.parent.mkdir()
    _special(target, kind)
    before = os.lstat(target)
    result = _invoke(["compare", str(generated / "p"), option, str(target)])
    assert result.exit_code == 2, result.output + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "not a regular file" in errors[0] and str(target) in errors[0], result.stderr
    after = os.lstat(target)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert os.listdir(target.parent) == ["target"]


@pytest.mark.parametrize("kind", ["fifo"])  # a character device is written into (as a compare report)
def test_trend_html_target_that_is_not_a_regular_file_is_refused(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "target"
    _special(target, kind)
    result = _invoke(["trend", str(tmp_path / "missing.json"), "--html", str(target)])
    assert result.exit_code == 2
    assert "not a regular file" in result.stderr
    assert not stat.S_ISREG(os.lstat(target).st_mode)


def test_report_written_through_a_link_keeps_the_link(generated: Path, tmp_path: Path) -> None:
    (tmp_path / "real.xml").write_text("old")
    (tmp_path / "link.xml").symlink_to(tmp_path / "real.xml")
    result = _invoke(["compare", str(generated / "p"), "--junit", str(tmp_path / "link.xml")])
    assert result.exit_code == 3
    assert (tmp_path / "link.xml").is_symlink()
    assert "<testsuite" in (tmp_path / "real.xml").read_text()


def test_a_full_disk_while_writing_a_report_is_an_error(
    generated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from bsa_cli.report import files

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    (tmp_path / "r.json").write_text("old")
    result = _invoke(["compare", str(generated / "p"), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "No space left on device" in result.stderr and "r.json" in result.stderr
    assert (tmp_path / "r.json").read_text() == "old"
    assert os.listdir(tmp_path) == ["r.json"]


def _manifest_text(change: Callable[[str], str], command: str = "run") -> Callable[[Sandbox], list[str]]:
    """Copy case 'p' into out/ and change its manifest's text (not its parsed JSON)."""

    def setup(box: Sandbox) -> list[str]:
        path = box.cases("p") / "p" / "case.json"
        path.write_text(change(path.read_text()))
        return [command, str(box.out)]

    return setup


def _after_run(change: Callable[[Path, Sandbox], None], command: str = "compare") -> Callable[[Sandbox], list[str]]:
    """Run case 'p' on the reference device, then change its case folder; return `command` over out/."""

    def setup(box: Sandbox) -> list[str]:
        out = box.cases("p")
        result = CliRunner().invoke(main, ["run", str(out)])
        assert result.exit_code == 0, result.output
        change(out / "p", box)
        return [command, str(out)]

    return setup


def _duplicate_in_record(case_dir: Path, _box: Sandbox) -> None:
    path = case_dir / "outputs" / "run.json"
    path.write_text(path.read_text().replace('"outcome": "ok"', '"outcome": "ok", "outcome": "error"', 1))


def _status_line(text: str) -> Callable[[Path, Sandbox], None]:
    def change(case_dir: Path, _box: Sandbox) -> None:
        (case_dir / "outputs" / "status.txt").write_text(text)

    return change


def _baseline(text: str) -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        (box.root / "old.json").write_text(text)
        return ["compare", str(box.cases("p")), "--baseline", str(box.root / "old.json")]

    return setup


_DUPLICATE_OUTPUTS = '"outputs": {"dq": {"file": "../../victim/dq.bin", "dtype": "float16", "shape": [1]}, '

ROUND2 = [
    # ---- item 5: duplicate keys in every JSON bsa reads ----
    Trial(
        "manifest-duplicate-key",
        _manifest_text(lambda t: t.replace('"outputs": {', _DUPLICATE_OUTPUTS, 1)),
        3,
        "duplicate key 'dq'",
    ),
    Trial(
        "manifest-duplicate-key-compare",
        _manifest_text(lambda t: t.replace("{", '{"name": "q", ', 1), "compare"),
        3,
        "duplicate key 'name'",
    ),
    Trial("record-duplicate-key", _after_run(_duplicate_in_record), 3, "duplicate key 'outcome'"),
    Trial(
        "merge-duplicate-key",
        _report('{"schema": "bsa-compare/1", "cases": [], "cases": []}'),
        2,
        "duplicate key 'cases'",
    ),
    Trial(
        "baseline-duplicate-key",
        _baseline('{"schema": "bsa-compare/1", "schema": "x", "cases": []}'),
        2,
        "duplicate key 'schema'",
    ),
    # ---- item 9: what a report may cost to read ----
    Trial("merge-empty-objects", _report("[" + "{}, " * (4 << 20) + "{}]"), 2, "objects and arrays in"),
    Trial("baseline-empty-objects", _baseline("[" + "{}, " * (4 << 20) + "{}]"), 2, "objects and arrays in"),
    # ---- item 12: a status line is a decimal integer in ASCII digits ----
    Trial("binary-status-underscore", _binary("grads(); put('status.txt', b'0_0')"), 3, "not a decimal aclnn status"),
    Trial(
        "binary-status-arabic-indic",
        _binary("grads(); put('status.txt', '\\u0660'.encode())"),
        3,
        "not a decimal aclnn status",
    ),
    Trial(
        "binary-status-fullwidth",
        _binary("grads(); put('status.txt', '\\uff10'.encode())"),
        3,
        "not a decimal aclnn status",
    ),
    Trial("binary-status-plus", _binary("grads(); put('status.txt', b'+0')"), 3, "not a decimal aclnn status"),
    Trial("status-underscore-compare", _after_run(_status_line("0_0\n")), 3, "not a decimal aclnn status"),
    Trial("status-fullwidth-compare", _after_run(_status_line("\uff10\n")), 3, "not a decimal aclnn status"),
]


def test_round_two_ids_are_unique() -> None:
    ids = [t.id for t in [*TRIALS, *ROUND2, *ROUND2_NAMES]]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("trial", ROUND2, ids=[t.id for t in ROUND2])
def test_hostile_input_of_round_two_ends_cleanly(trial: Trial, generated: Path, tmp_path: Path) -> None:
    try_trial(trial, generated, tmp_path)


def _judged_report(edit: Callable[[dict], None], use: str = "merge") -> Callable[[Sandbox], list[str]]:
    """Run and judge case 'p', change its JSON report, then merge it (or use it as --baseline)."""

    def setup(box: Sandbox) -> list[str]:
        out = box.cases("p")
        assert CliRunner().invoke(main, ["run", str(out)]).exit_code == 0
        path = box.root / "report.json"
        assert CliRunner().invoke(main, ["compare", str(out), "--json", str(path)]).exit_code == 0
        document = json.loads(path.read_text())
        edit(document)
        path.write_text(json.dumps(document))
        return ["compare", "--merge", str(path)] if use == "merge" else ["compare", str(out), "--baseline", str(path)]

    return setup


def _verdict(value: str) -> Callable[[dict], None]:
    def edit(document: dict) -> None:
        document["cases"][0]["verdict"] = value

    return edit


def _twin_folders(box: Sandbox) -> list[str]:
    out = box.cases("p")
    shutil.copytree(out / "p", out / "q")
    return ["compare", str(out)]


ROUND2_NAMES = [
    # ---- item 8: reports are checked against their schema ----
    Trial(
        "merge-verdict-lol",
        _judged_report(_verdict("lol")),
        2,
        "verdict: expected one of PASS, FAIL, ERROR, SKIP, got 'lol'",
    ),
    Trial(
        "merge-verdict-lowercase",
        _judged_report(_verdict("pass")),
        2,
        "verdict: expected one of PASS, FAIL, ERROR, SKIP, got 'pass'",
    ),
    Trial(
        "merge-verdict-empty",
        _judged_report(_verdict("")),
        2,
        "verdict: expected one of PASS, FAIL, ERROR, SKIP, got ''",
    ),
    Trial(
        "baseline-verdict-lol",
        _judged_report(_verdict("lol"), "baseline"),
        2,
        "verdict: expected one of PASS, FAIL, ERROR, SKIP, got 'lol'",
    ),
    Trial(
        "merge-output-bytes-text",
        _judged_report(lambda d: d["cases"][0].update(output_bytes="12")),
        2,
        "expected an integer",
    ),
    Trial("merge-errors-string", _judged_report(lambda d: d["cases"][0].update(errors="oops")), 2, "expected a list"),
    # ---- item 10: a .npy header with negative dimensions ----
    Trial(
        "mask-negative-dims",
        _mask("m.npy", ("m.npy", _npy_header("|u1", (-2, -3)) + b"\0" * 6)),
        2,
        "a dimension is negative",
    ),
    # ---- item 11: names ----
    Trial("name-final-newline", _spec("validate", name="abc\n"), 2, "may hold only letters"),
    Trial("name-final-newline-gen", _spec(name="abc\n"), 2, "may hold only letters"),
    Trial("layout-final-newline", _spec("validate", layout="BNSD\n", expect=161002), 2, "not a layout string"),
    Trial(
        "names-differ-in-case",
        _text(yaml.safe_dump({"defaults": BASE, "cases": [{"name": "Case"}, {"name": "case"}]})),
        2,
        "only in upper and lower case",
    ),
    Trial(
        "matrix-dtype-case", _spec("validate", matrix={"dtype": ["fp16", "FP16"]}), 2, "only in upper and lower case"
    ),
    Trial("manifest-name-newline", _manifest(_set("name", "p\n")), 3, "cannot name a case"),
    Trial("manifest-name-newline-compare", _manifest(_set("name", "p\n"), "compare"), 3, "cannot name a case"),
    Trial("two-folders-one-name", _twin_folders, 2, "names the case 'p', as the manifest of"),
    Trial("merge-name-twice", _judged_report(lambda d: d["cases"].append(d["cases"][0])), 2, "appears 2 times"),
    Trial(
        "baseline-name-twice",
        _judged_report(lambda d: d["cases"].append(d["cases"][0]), "baseline"),
        2,
        "appears 2 times",
    ),
    # ---- item 12: empty_rows within the case's query blocks ----
    Trial(
        "empty-rows-beyond",
        _spec("validate", sparsity={"pattern": "dense", "empty_rows": [0, 2]}),
        2,
        "index 2 is beyond the case's 2 query-block rows",
    ),
    Trial(
        "empty-rows-huge",
        _spec("validate", sparsity={"pattern": "dense", "empty_rows": [10**30]}),
        2,
        "is beyond the case's 2 query-block rows",
    ),
    Trial("empty-rows-last-ok", _spec(sparsity={"pattern": "dense", "empty_rows": [1]}), 0, "generated 1 case in"),
]


@pytest.mark.parametrize("trial", ROUND2_NAMES, ids=[t.id for t in ROUND2_NAMES])
def test_hostile_report_name_or_value_ends_cleanly(trial: Trial, generated: Path, tmp_path: Path) -> None:
    try_trial(trial, generated, tmp_path)


def _bsa(*args: str, limit: int | None = None, code: str | None = None) -> Any:
    """Run `bsa ARGS` as a fresh process (its imports included), under an address-space limit if given."""
    import subprocess

    def preexec() -> None:
        import resource

        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))

    program = code or "import sys; from bsa_cli.__main__ import run; sys.argv[0] = 'bsa'; run()"
    return subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=120, preexec_fn=preexec
    )


def test_an_address_space_limit_too_small_for_the_libraries_is_one_error_line() -> None:
    result = _bsa("validate", "cases/smoke.yaml", limit=200 << 20)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: the address-space limit (ulimit -v) is 200 MiB")
    assert "Traceback" not in result.stderr


def test_a_library_that_cannot_load_is_one_error_line() -> None:
    fail = (
        "import sys\nclass Fail:\n    def find_spec(self, name, *a):\n"
        "        if name == 'numpy': raise MemoryError()\nsys.meta_path.insert(0, Fail())\n"
        "from bsa_cli.__main__ import run; sys.argv[0] = 'bsa'; run()\n"
    )
    result = _bsa("validate", "cases/smoke.yaml", code=fail)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: out of memory while loading bsa's libraries")
    assert "Traceback" not in result.stderr


def test_bsa_starts_under_an_address_space_limit_it_can_work_in() -> None:
    result = _bsa("validate", "cases/smoke.yaml", limit=1 << 30)
    assert result.returncode == 0, result.stderr


# ---- item 3 and the Ctrl-C item: signals; no process outlives bsa, nothing half-written ----------------

MEDIUM = {
    "layout": "TND",
    "num_heads": 8,
    "num_kv_heads": 2,
    "head_dim": 64,
    "block_shape": [64, 64],
    "dtype": "fp16",
    "sparsity": {"pattern": "dense"},
}


def _proc_state(pid: int) -> tuple[str, int] | None:
    """Return (state, parent pid) of a process, or None when it is gone (a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, parent = text.rpartition(")")[2].split()[:2]
    return None if state in ("Z", "X") else (state, int(parent))


def _descendants(pid: int) -> set[int]:
    """Return the live processes below `pid` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            state = _proc_state(int(entry))
            if state is not None:
                parents[int(entry)] = state[1]
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _gone(pids: set[int], timeout: float = 5.0) -> set[int]:
    """Wait up to `timeout` s for `pids` to end; return those still alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_proc_state(p) for p in pids):
        time.sleep(0.05)
    return {p for p in pids if _proc_state(p)}


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


def _start_bsa(*args: str) -> Any:
    import subprocess

    def default_interrupt() -> None:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job of a shell ignores SIGINT

    program = "import sys; from bsa_cli.__main__ import run; sys.argv[0] = 'bsa'; run()"
    return subprocess.Popen(
        [sys.executable, "-c", program, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_interrupt,
    )


def _gen_medium(root: Path, names: list[str], length: int) -> Path:
    spec = root / "medium.yaml"
    cases = [
        {**MEDIUM, "name": name, "actual_seq_lengths": [length, length], "seed": i} for i, name in enumerate(names)
    ]
    spec.write_text(yaml.safe_dump({"cases": cases}))
    result = CliRunner().invoke(main, ["gen", str(spec), "-o", str(root / "out"), "-j", "2"])
    assert result.exit_code == 0, result.output
    return root / "out"


@pytest.fixture(scope="module")
def medium(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four cases of about a second each to judge, with outputs from a binary that copies the benchmark."""
    root = tmp_path_factory.mktemp("hostile-medium")
    out = _gen_medium(root, ["m1", "m2", "m3", "m4"], 512)
    box = Sandbox(root, out)
    result = CliRunner().invoke(main, ["run", str(out), "--binary", box.binary(GOOD_BINARY)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("signum", [2, 15], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_reference_device_within_a_case(signum: int, tmp_path: Path) -> None:
    """One Ctrl-C (or SIGTERM) stops `bsa run` on the reference device promptly, inside a long case: the
    case is recorded as interrupted, the finished case keeps its complete result."""
    out = _gen_medium(tmp_path, ["a-short", "b-long"], 128)
    spec = tmp_path / "long.yaml"
    spec.write_text(yaml.safe_dump({"cases": [{**MEDIUM, "name": "b-long", "actual_seq_lengths": [3072, 3072]}]}))
    assert CliRunner().invoke(main, ["gen", str(spec), "-o", str(out)]).exit_code == 0
    proc = _start_bsa("run", str(out))
    try:
        _wait_for(lambda: (out / "b-long" / "outputs" / ".run-1").is_dir(), 60, "the long case to start")
        time.sleep(0.5)
        proc.send_signal(signum)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum if signum != 2 else proc.returncode == 130, err
    assert took < 3.0, f"{took:.1f} s after the signal"
    assert "Traceback" not in err
    record = json.loads((out / "b-long" / "outputs" / "run.json").read_text())
    assert record["outcome"] == "interrupted"
    assert not (out / "b-long" / "outputs" / "dq.bin").exists()
    done = json.loads((out / "a-short" / "outputs" / "run.json").read_text())
    assert done["outcome"] == "ok" and (out / "a-short" / "outputs" / "dq.bin").is_file()


def test_sigterm_to_run_ends_the_binary_and_its_children(generated: Path, tmp_path: Path) -> None:
    box = Sandbox(tmp_path, generated)
    box.victim.mkdir()
    pids = box.victim / "pids"
    binary = box.binary(
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)"
    )
    proc = _start_bsa("run", str(box.cases("p")), "--binary", binary)
    started: set[int] = set()
    try:
        _wait_for(lambda: pids.exists() and pids.read_text(), 30, "the binary to start its child")
        started = {int(p) for p in pids.read_text().split()}
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err
        assert "Traceback" not in err
        assert not _gone(started), "the binary or its child outlived bsa"
        record = json.loads((box.out / "p" / "outputs" / "run.json").read_text())
        assert record["outcome"] == "interrupted"
    finally:
        proc.kill()
        _kill_all(started)


def test_sigterm_to_gen_ends_its_workers_and_leaves_no_case_half_done(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    names = [f"g{i}" for i in range(4)]
    cases = [{**MEDIUM, "name": n, "actual_seq_lengths": [1024, 1024], "seed": i} for i, n in enumerate(names)]
    spec.write_text(yaml.safe_dump({"cases": cases}))
    out = tmp_path / "out"
    proc = _start_bsa("gen", str(spec), "-o", str(out), "-j", "2")
    workers: set[int] = set()
    try:
        workers = _wait_for(
            lambda: {p for p in _descendants(proc.pid)} if len(_descendants(proc.pid)) >= 2 else None,
            60,
            "the workers to start",
        )
        _wait_for(
            lambda: out.is_dir() and any(p.name.startswith(".") for p in out.iterdir()), 60, "a case to be under way"
        )
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err
        assert "Traceback" not in err
        assert not _gone(workers), "a worker outlived bsa gen"
        listing = sorted(p.name for p in out.iterdir())
        time.sleep(1.0)
        assert sorted(p.name for p in out.iterdir()) == listing, "cases appeared after bsa gen ended"
        assert all(not name.startswith(".") for name in listing), listing
        for name in listing:
            assert (out / name / "case.json").is_file()
    finally:
        proc.kill()
        _kill_all(workers)


@pytest.mark.parametrize("signum", [9, 15], ids=["SIGKILL", "SIGTERM"])
def test_compare_workers_and_resource_tracker_end_with_compare(signum: int, medium: Path) -> None:
    proc = _start_bsa("compare", str(medium), "-j", "2")
    helpers: set[int] = set()
    try:
        helpers = _wait_for(
            lambda: _descendants(proc.pid) if len(_descendants(proc.pid)) >= 2 else None,
            60,
            "the worker and the resource tracker to start",
        )
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == (-9 if signum == 9 else 143), err
        assert "Traceback" not in err
        assert not _gone(helpers), "a worker or multiprocessing's resource tracker outlived bsa compare"
    finally:
        proc.kill()
        _kill_all(helpers)


# ---- item 6: links a binary leaves behind; item 7: outputs changed after the run; item 9: cheap checks first ----


def _fake_outputs(box: Sandbox) -> Path:
    """victim/fake: a complete, passing output folder of case 'p' that bsa must neither read nor change."""
    fake = box.victim / "fake"
    fake.mkdir()
    for grad in ("dq", "dk", "dv"):
        shutil.copy(box.generated / "p" / "benchmark" / f"{grad}.bin", fake / f"{grad}.bin")
    (fake / "status.txt").write_text("0\n")
    return fake


def _binary_swaps(which: str) -> Callable[[Sandbox], list[str]]:
    """A binary that writes its outputs, then replaces its run folder (or the case's outputs folder) with a
    link to victim/fake before it exits."""

    def setup(box: Sandbox) -> list[str]:
        box.victim.mkdir(exist_ok=True)
        fake = _fake_outputs(box)
        folder = "out" if which == "run" else "os.path.dirname(out)"
        body = GOOD_BINARY + f"\nimport shutil\nshutil.rmtree({folder})\nos.symlink({str(fake)!r}, {folder})"
        return ["run", str(box.cases("p")), "--binary", box.binary(body)]

    return setup


def _rewrite_dq(case_dir: Path, _box: Sandbox) -> None:
    path = case_dir / "outputs" / "dq.bin"
    path.write_bytes(b"\0" * path.stat().st_size)


ROUND2_LINKS = [
    Trial("binary-swaps-run-folder", _binary_swaps("run"), 3, "(run folder) is a symbolic link after the binary ran"),
    Trial("binary-swaps-outputs", _binary_swaps("outputs"), 3, "(output folder) is a symbolic link after the binary"),
    Trial("outputs-changed-after-run", _after_run(_rewrite_dq), 3, "changed after the run"),
]


@pytest.mark.parametrize("trial", ROUND2_LINKS, ids=[t.id for t in ROUND2_LINKS])
def test_hostile_binary_leftovers_end_cleanly(trial: Trial, generated: Path, tmp_path: Path) -> None:
    try_trial(trial, generated, tmp_path)


def test_binary_swapping_its_folder_leaves_no_record_through_the_link(generated: Path, tmp_path: Path) -> None:
    box = Sandbox(tmp_path, generated)
    args = _binary_swaps("outputs")(box)
    result = _invoke(args)
    assert result.exit_code == 3
    assert sorted(os.listdir(box.victim / "fake")) == ["dk.bin", "dq.bin", "dv.bin", "status.txt"]
    assert "1 ok" not in result.output


def test_a_shape_that_contradicts_params_is_refused_before_any_hashing(generated: Path, tmp_path: Path) -> None:
    """A manifest promising an 8 GiB golden dq (a sparse file of that size) for a small case: refused at
    once, by its shape, without reading the file."""
    box = Sandbox(tmp_path, generated)
    out = box.cases("p")
    assert CliRunner().invoke(main, ["run", str(out)]).exit_code == 0
    path = out / "p" / "case.json"
    manifest = json.loads(path.read_text())
    manifest["golden"]["dq"]["shape"] = [1 << 15, 1 << 15, 2]
    path.write_text(json.dumps(manifest))
    with open(out / "p" / manifest["golden"]["dq"]["file"], "r+b") as golden:
        golden.truncate(8 << 30)
    started = time.monotonic()
    result = _invoke(["compare", str(out)])
    took = time.monotonic() - started
    assert result.exit_code == 3
    assert "golden.dq.shape [32768, 32768, 2] differs from the case's" in result.output
    assert took < 5.0, f"{took:.1f} s"


# ---- item 4: kill -9 while a regenerated case replaces the old one ----------------------------------------

_KILLED_GEN = """
import os, sys
from pathlib import Path
import bsa_cli.store as store
from bsa_cli.cli import main
where = sys.argv[1]
if where == "between-renames":  # a file system without RENAME_EXCHANGE: two renames, killed between them
    store._exchange = lambda first, second: False
    real = os.replace
    def replace(source, target):
        real(source, target)
        if Path(source).name == "p" and ".old-" in str(target):
            os._exit(137)
    store.os.replace = replace
else:  # killed while removing the old case it swapped out
    real = store.shutil.rmtree
    def rmtree(path, *args, **kwargs):
        if ".p.partial-" in str(path):
            os._exit(137)
        real(path, *args, **kwargs)
    store.shutil.rmtree = rmtree
main(["gen", sys.argv[2], "-o", sys.argv[3]])
"""


def _kill_gen_while_replacing(tmp_path: Path, where: str) -> tuple[Path, Path]:
    import subprocess

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"cases": [{**BASE, "name": "p"}, {**BASE, "name": "q"}]}))
    out = tmp_path / "out"
    assert CliRunner().invoke(main, ["gen", str(spec), "-o", str(out)]).exit_code == 0
    spec.write_text(yaml.safe_dump({"cases": [{**BASE, "name": "p", "seed": 7}]}))  # p is generated again
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_GEN, where, str(spec), str(out)], capture_output=True, text=True, timeout=120
    )
    assert killed.returncode == 137, killed.stderr
    return spec, out


def test_kill_between_the_renames_keeps_a_complete_copy_and_compare_notices(tmp_path: Path) -> None:
    spec, out = _kill_gen_while_replacing(tmp_path, "between-renames")
    assert not (out / "p").exists()  # the moment the issue found: p under neither name
    copies = [
        p
        for p in out.iterdir()
        if p.name.startswith(".p.") and ((p / "case" / "case.json").is_file() or (p / "case.json").is_file())
    ]
    assert copies, sorted(os.listdir(out))
    compared = _invoke(["compare", str(out)])
    assert compared.exit_code == 3, compared.output
    assert "out/p: the case is missing, only .p." in compared.output
    assert "restores the complete copy" in compared.output
    again = _invoke(["gen", str(spec), "-o", str(out)])
    assert again.exit_code == 0, again.output
    assert (out / "p" / "case.json").is_file() and (out / "q" / "case.json").is_file()
    assert not [p for p in os.listdir(out) if p.startswith(".")]


def test_a_case_swapped_in_one_step_is_never_missing(tmp_path: Path) -> None:
    _, out = _kill_gen_while_replacing(tmp_path, "while-removing-the-old")
    manifest = json.loads((out / "p" / "case.json").read_text())
    assert manifest["generator"]["seed"] == 7  # the new case, complete
    leftovers = [p for p in os.listdir(out) if p.startswith(".")]
    assert leftovers  # the old copy, being removed when the kill came
    compared = _invoke(["compare", str(out)])
    assert "the case is missing" not in compared.output


def test_compare_reports_a_case_that_a_killed_gen_never_finished(generated: Path, tmp_path: Path) -> None:
    box = Sandbox(tmp_path, generated)
    out = box.cases("p")
    (out / ".r.partial-999999999-abc").mkdir()
    result = _invoke(["compare", str(out)])
    assert result.exit_code == 3
    assert "out/r: the case is missing, only .r.partial-999999999-abc is left: a bsa gen was killed" in result.output
    filtered = _invoke(["compare", str(out), "--filter", "p"])
    assert "the case is missing" not in filtered.output


# ---- item 2: case.txt is derived from case.json and checked before a run ----------------------------------

TXT_BINARY = (
    "case = os.path.dirname(sys.argv[1])\n"
    "table = {}\n"
    "for line in open(os.path.join(case, 'case.txt')):\n"
    "    parts = line.split()\n"
    "    if parts and parts[0] in ('input', 'output'):\n"
    "        table[parts[0], parts[1]] = parts[2]\n"
    "query = open(os.path.join(case, table['input', 'query']), 'rb').read()\n"
    "for g in ('dq', 'dk', 'dv'):\n"
    "    data = open(os.path.join(case, manifest['benchmark'][g]['file']), 'rb').read()\n"
    "    open(os.path.join(out, table['output', g]), 'wb').write(data)\n"
    "put('status.txt', b'0\\n')"
)  # a harness without a JSON parser: it follows case.txt's file table


def _tampered_txt(section: str, name: str, file: Callable[[Sandbox], str]) -> Callable[[Sandbox], list[str]]:
    def setup(box: Sandbox) -> list[str]:
        out = box.cases("p")
        path = out / "p" / "case.txt"
        lines = []
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts[:2] == [section, name]:
                parts[2] = file(box)
            lines.append(" ".join(parts))
        path.write_text("\n".join(lines) + "\n")
        return ["run", str(out), "--binary", box.binary(TXT_BINARY)]

    return setup


def _txt_link(box: Sandbox) -> list[str]:
    out = box.cases("p")
    shutil.copy(out / "p" / "case.txt", box.victim / "case.txt")
    (out / "p" / "case.txt").unlink()
    (out / "p" / "case.txt").symlink_to(box.victim / "case.txt")
    return ["run", str(out), "--binary", box.binary(TXT_BINARY)]


ROUND2_TXT = [
    Trial("case-txt-output-climbs", _tampered_txt("output", "dq", lambda b: "../../../victim/dq.bin"), 0, "1 ok"),
    Trial("case-txt-output-absolute", _tampered_txt("output", "dq", lambda b: str(b.victim / "dq.bin")), 0, "1 ok"),
    Trial("case-txt-input-foreign", _tampered_txt("input", "query", lambda b: "../../victim/precious.txt"), 0, "1 ok"),
    Trial("case-txt-is-a-link", _txt_link, 0, "1 ok"),
    Trial(
        "case-txt-is-a-folder",
        _case_file(lambda c, b: ((c / "case.txt").unlink(), (c / "case.txt").mkdir())),
        3,
        "case.txt from case.json",
    ),
]


@pytest.mark.parametrize("trial", ROUND2_TXT, ids=[t.id for t in ROUND2_TXT])
def test_hostile_case_txt_ends_cleanly(trial: Trial, generated: Path, tmp_path: Path) -> None:
    try_trial(trial, generated, tmp_path)
    from bsa_cli.store.manifest import flat_params

    case = tmp_path / "out" / "p"
    if trial.code == 0:
        assert not (case / "case.txt").is_symlink()
        assert (case / "case.txt").read_text() == flat_params(json.loads((case / "case.json").read_text()))
