"""Hostile specs, case folders and device binaries, as a table: every one ends with a documented exit code
and one line that names the problem, never a traceback; nothing outside the folders bsa was given is
written or removed (a victim folder's digest stays the same, and no file appears next to the given
folders); memory stays under 1 GiB and each trial under 20 s.

Trials run in this process through CliRunner (a device binary is a subprocess, as always).
"""

from __future__ import annotations

import hashlib
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

MEMORY_LIMIT = 1 << 30
TIME_LIMIT_S = 20.0

BASE = {"name": "c", "num_heads": 1, "head_dim": 16, "q_seq_len": 32, "block_shape": [16, 16], "dtype": "fp16"}


def digest(folder: Path) -> str:
    """Return a digest of a folder tree: every path, its kind, its bytes or link target."""
    hasher = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = Path(dirpath) / name
            hasher.update(str(path.relative_to(folder)).encode())
            if path.is_symlink():
                hasher.update(b"link:" + os.readlink(path).encode())
            elif path.is_file():
                hasher.update(b"file:" + path.read_bytes())
            else:
                hasher.update(b"dir")
    return hasher.hexdigest()


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
            "        put(manifest['outputs'][g]['file'], data)\n"
            + body
            + "\n"
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
    Trial("name-dotdot-check", lambda b: ["check", b.spec(name=".."), "-o", str(b.out)], 2,
          "cannot name a case folder"),
    Trial("name-hidden", _spec(name=".c"), 2, "cannot name a case folder"),
    Trial("name-too-long", _spec(name="n" * 300), 2, "at most 200 characters"),
    Trial("name-long-by-matrix", _spec(matrix={"seed": [int("9" * 200)]}), 2, "cannot name a case folder"),
    Trial("name-slash", _spec(name="a/b"), 2, "may hold only letters"),
    # ---- YAML and matrix bombs (item 4) ----
    Trial("alias-bomb", _text(_bomb()), 2, "alias bomb"),
    Trial("alias-bomb-in-dtype", _text(_bomb().replace("    description: [", "    dtype: [")), 2, "alias bomb"),
    Trial("alias-recursive", _text("cases:\n  - &c {name: x, q_seq_len: 16, num_heads: 1, description: *c}\n"), 2,
          "refers to a value that contains it"),
    Trial("matrix-bomb", _spec("validate", matrix={k: list(range(1, 11)) for k in (
        "seed", "head_dim", "num_heads", "q_seq_len", "kv_seq_len", "batch", "sparsity.window", "sparsity.stride",
        "num_kv_heads")}), 2, "--max-cases"),
    Trial("matrix-bomb-dotted", _spec("validate", matrix={f"init.{k}": [float(i) for i in range(10)] for k in (
        "mean", "std", "low", "high")} | {f"sparsity.{k}": list(range(1, 11)) for k in ("window", "stride")}
        | {"seed": list(range(10)), "head_dim": list(range(1, 11)), "scale": [0.1] * 10}), 2, "--max-cases"),
    Trial("too-many-cases", _many_cases, 2, "more than the limit of 10000 cases"),
    Trial("deep-flow", _text("cases:\n  - name: x\n    description: " + "[" * 3000 + "]" * 3000 + "\n"), 2, "YAML"),
    Trial("deep-block", _text("cases:\n  - name: x\n    description:\n" + "".join(
        "  " * (i + 3) + "k:\n" for i in range(40)) + "  " * 43 + "1\n"), 2, "nested deeper"),
    Trial("duplicate-key", _text("cases:\n  - name: x\n    num_heads: 1\n    q_seq_len: 16\n    q_seq_len: 32\n"), 2,
          "duplicate key 'q_seq_len'"),
    Trial("python-tag", _text("cases:\n  - !!python/object:os.system {name: x}\n"), 2, "not valid YAML"),
    Trial("huge-integer", _text("cases:\n  - name: x\n    num_heads: " + "9" * 5000 + "\n"), 2, "not valid YAML"),
    Trial("bad-date", _text("cases:\n  - name: x\n    seed: 2001-13-45\n"), 2, "not valid YAML"),
    Trial("not-utf8", lambda b: (b.root.joinpath("s.yaml").write_bytes(b"cases:\n  - name: \xff\xfe\n"),
                                 ["validate", str(b.root / "s.yaml")])[1], 2, "not UTF-8"),
    Trial("spec-too-large", _text("cases:\n  - name: x\n    description: '" + "x" * (5 << 20) + "'\n"), 2,
          "at most 4 MiB"),
    Trial("spec-fifo", lambda b: (os.mkfifo(b.root / "s.yaml"), ["validate", str(b.root / "s.yaml")])[1], 2,
          "not a regular file"),
    Trial("matrix-key-not-string", _spec("validate", matrix={1: [1]}), 2, "matrix key 1"),
    # ---- values that used to crash (item 5) ----
    Trial("dtype-list", _spec("validate", dtype=["fp16"]), 2, "key 'dtype': ['fp16'] is not allowed"),
    Trial("dtype-mapping", _spec("validate", dtype={"a": 1}), 2, "key 'dtype'"),
    Trial("layout-injection", _spec("validate", kv_layout="BNSD\nexpect_status 0", expect=161002), 2,
          "not a layout string"),
    Trial("batch-1e12", _spec("list", batch=10**12), 2, "above the maximum 2147483647"),
    Trial("q-seq-2-70", _spec("list", q_seq_len=2**70), 2, "above the maximum"),
    Trial("elements-beyond-limit", _spec("list", batch=2**20, num_heads=2**20, q_seq_len=2**10), 2,
          "more than bsa's limit"),
    Trial("seed-negative", _spec("validate", seed=-1), 2, "below the minimum 0"),
    Trial("pre-tokens-huge", _spec("validate", pre_tokens=2**70, expect=161002), 2, "above the maximum"),
    Trial("block-shape-huge-negative-case", _spec("validate", block_shape=[2**70, 1], expect=161002), 2,
          "block_shape"),
    Trial("head-dim-float", _spec("validate", head_dim=1e400), 2, "not an integer"),
    Trial("density-text", _spec("validate", sparsity={"pattern": "random", "density": "lots"}), 2, "not a number"),
    Trial("empty-rows-nan", _spec("validate", sparsity={"pattern": "dense", "empty_rows": float("nan")}), 2,
          "empty_rows"),
    Trial("compare-standard-list", _spec("validate", compare={"standard": ["x"]}), 2, "compare"),
    Trial("init-mapping-list", _spec("validate", init=[1]), 2, "key 'init'"),
    # ---- explicit masks (items 5, 6) ----
    Trial("mask-fifo", _mask(_fifo_mask), 2, "not a regular file"),
    Trial("mask-npz", _mask("m.npz", ("m.npz", b"PK\x03\x04" + b"\0" * 60)), 2, "not a .npy array file"),
    Trial("mask-empty-npy", _mask("m.npy", ("m.npy", b"")), 2, "not a .npy array file"),
    Trial("mask-huge-header", _mask("m.npy", ("m.npy", _npy_header("|u1", (10**5, 10**5, 10**5)))), 2,
          "header promises shape"),
    Trial("mask-absolute", _mask(lambda b: str(b.victim / "m.npy")), 2, "absolute path"),
    Trial("mask-dotdot", _mask("../victim/m.npy"), 2, "'..'"),
    Trial("mask-inside-subfolder-ok", _mask("sub/m.npy", ("sub/m.npy", _npy_bytes(np.ones((2, 2))))), 0,
          "generated 1 case in"),
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
    Trial("tnd-zero-lengths", lambda b: ["gen", b.spec(case={**{k: v for k, v in BASE.items() if k != "q_seq_len"},
                                                             "layout": "TND", "actual_seq_lengths": [0, 0]}),
                                         "-o", str(b.out)], 2, "nothing to compute"),
    # ---- manifests that point outside their case (item 2) ----
    Trial("outputs-absolute", _manifest(_set("outputs.dq.file", lambda b: str(b.victim / "precious.txt"))), 3,
          "is an absolute path"),
    Trial("outputs-dotdot", _manifest(_set("outputs.dq.file", "../../../victim/precious.txt")), 3, "'..'"),
    Trial("outputs-dotdot-emulate", _manifest(_set("outputs.dq.file", "../../victim/new/dq.bin"), "emulate"), 2,
          "'..'"),
    Trial("outputs-dotdot-negative", _manifest(_set("outputs.dq.file", "../../../victim/precious.txt"), name="n"), 3,
          "'..'"),
    Trial("inputs-absolute", _manifest(_set("inputs.query.file", lambda b: str(b.victim / "precious.txt"))), 3,
          "absolute path"),
    Trial("golden-dotdot-compare", _manifest(_set("golden.dq.file", "../../victim/precious.txt"), "compare"), 3,
          "'..'"),
    Trial("outputs-itself", _manifest(_set("outputs.dq.file", ".")), 3, "names the folder itself"),
    Trial("outputs-reserved", _manifest(_set("outputs.dq.file", "run.json")), 3, "keeps for itself"),
    Trial("tiles-absolute-compare", _manifest(_set("benchmark_summary.tiles.dq.file", "/etc/passwd"), "compare"), 3,
          "absolute path"),
    Trial("input-link-out", _case_file(_replace_with_link("inputs/query.bin", "copy")), 3, "leads out of"),
    Trial("manifest-link-out", _case_file(_replace_with_link("case.json", "copy"), "compare"), 3, "leads out of"),
    Trial("manifest-fifo", lambda b: (_fifo_manifest(b.cases("p") / "p", b), [
        "emulate", str(b.out / "p" / "case.json"), str(b.out / "emulated")])[1], 2, "not a regular file"),
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
    Trial("params-lengths-string", _manifest(_set("params.actual_seq_lengths", "abc"), "compare"), 3,
          "params.actual_seq_lengths"),
    Trial("name-not-string", _manifest(_set("name", {"x": 1})), 3, "name {'x': 1} is not a non-empty string"),
    Trial("name-climbs-export", lambda b: (b.edit(lambda m: m.update(name="../../victim/x")),
                                           ["export", str(b.out), "--format", "atk", "-o", str(b.out / "ex")])[1],
          2, "cannot name a case"),
    Trial("record-hostile-compare", _case_file(lambda c, b: (c / "outputs").mkdir(exist_ok=True) or (
        c / "outputs" / "run.json").write_text(json.dumps({"case": "p", "outcome": "crashed", "problems": 7,
                                                           "repeat": []})), "compare"), 3, "not a run record"),
    # ---- binaries (items 5, 7) ----
    Trial("binary-folder-run-json", _binary(GOOD_BINARY + "; os.mkdir(os.path.join(out, 'run.json'))"), 0, "1 ok"),
    Trial("binary-folder-stderr-log", _binary(GOOD_BINARY + "; os.mkdir(os.path.join(out, 'stderr.log'))"), 0, "1 ok"),
    Trial("binary-status-fifo", _binary("grads(); os.mkfifo(os.path.join(out, 'status.txt'))"), 3,
          "not a regular file"),
    Trial("binary-status-huge", _binary("grads(); put('status.txt', b'0\\n' + b'x' * (20 << 20))"), 0, "1 ok"),
    Trial("binary-status-long-number", _binary("grads(); put('status.txt', b'9' * 5000)"), 3,
          "not a decimal aclnn status"),
    Trial("binary-dq-link", _binary("grads(); os.remove(os.path.join(out, 'dq.bin')); "
                                    "os.symlink('{victim}/precious.txt', os.path.join(out, 'dq.bin')); "
                                    "put('status.txt', b'0')"), 3, "dq.bin"),
    Trial("binary-chatty", _binary(GOOD_BINARY + "; sys.stdout.write('x' * (6 << 20)); "
                                   "sys.stderr.write('y' * (3 << 20))"),
          0, "1 ok"),
    Trial("binary-exits-1", _binary("sys.exit(1)"), 3, "exited with code 1"),
    Trial("binary-killed", _binary("os.kill(os.getpid(), 9)"), 3, "killed by SIGKILL"),
]  # fmt: skip


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-gen")
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump({"cases": [{**BASE, "name": "p"}, {**BASE, "name": "n", "dtype": "float32",
                                                                           "expect": 161002}]}))  # fmt: skip
    result = CliRunner().invoke(main, ["gen", str(spec), "-o", str(root / "out")])
    assert result.exit_code == 0, result.output
    return root / "out"


def test_the_table_is_large_and_its_ids_unique() -> None:
    assert len(TRIALS) >= 60
    assert len({t.id for t in TRIALS}) == len(TRIALS)


@pytest.mark.parametrize("trial", TRIALS, ids=[t.id for t in TRIALS])
def test_hostile_input_ends_cleanly(trial: Trial, generated: Path, tmp_path: Path) -> None:
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
