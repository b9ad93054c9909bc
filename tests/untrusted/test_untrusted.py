"""Specs, case folders and binaries are untrusted: the defects of issue 10, each reproduced, item by item.

The table in test_hostile.py tries the whole class of inputs; these tests pin each reproduced defect
down with the exact behaviour that fixes it.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from bsa_cli import devices, specs, store
from bsa_cli.core.errors import DataError, SpecError
from bsa_cli.devices import process, record, run
from bsa_cli.gen import generate, schedule
from tests.helpers import BASE, digest, invoke


def write_spec(folder: Path, *cases: dict, **top: object) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump({**top, "cases": [{**BASE, **c} for c in cases]}, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two generated and run cases: `a` and `b`."""
    root = tmp_path_factory.mktemp("untrusted")
    path = write_spec(root, {"name": "a"}, {"name": "b", "seed": 2})
    assert invoke("check", path, "-o", root / "out").exit_code == 0
    return root / "out"


@pytest.fixture
def out(suite: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(suite, tmp_path / "out", symlinks=True))


def edit_manifest(case_dir: Path, change: object) -> None:
    path = case_dir / "case.json"
    manifest = json.loads(path.read_text())
    change(manifest)  # type: ignore[operator]
    path.write_text(json.dumps(manifest))


def victim(tmp_path: Path) -> Path:
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "precious.txt").write_text("precious")
    return folder


# ---- 1. case names name a child folder ------------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "..", ".hidden", "x" * 201])
def test_a_case_name_that_is_not_a_child_folder_is_refused_and_out_survives(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    for command in ("gen", "check"):
        result = invoke(command, write_spec(tmp_path / "specs", {"name": name}), "-o", out)
        assert result.exit_code == 2 and "cannot name a case folder" in result.stderr
    assert sorted(os.listdir(out)) == ["keep.txt"]
    assert sorted(os.listdir(tmp_path)) == ["out", "specs"]  # no '....old-*' next to it


@pytest.mark.parametrize("name", ["..", ".x", "y" * 256])
def test_case_writer_refuses_names_that_are_not_one_visible_child(tmp_path: Path, name: str) -> None:
    with pytest.raises(DataError, match="one visible folder"):
        store.CaseWriter(tmp_path / "out" / name)


@pytest.mark.parametrize("name", [".", "..", "a/b", "../up"])
def test_generate_case_writes_only_a_child_of_out(tmp_path: Path, name: str) -> None:
    case = specs.load_specs([write_spec(tmp_path / "specs", {"name": "x"})])[0]
    with pytest.raises(DataError, match="one visible folder"):
        generate.generate_case(dataclasses.replace(case, name=name), tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["specs"] + (["out"] if (tmp_path / "out").exists() else [])


# ---- 2. every manifest path stays inside its folder --------------------------------------------------------


@pytest.mark.parametrize(
    "section, name", [("inputs", "query"), ("golden", "dq"), ("benchmark", "dk"), ("outputs", "dv")]
)
@pytest.mark.parametrize(
    "bad, problem",
    [("/tmp/x.bin", "absolute path"), ("../../x.bin", "'..'"), ("inputs/../../x.bin", "'..'"), (".", "folder itself")],
)
def test_a_manifest_file_outside_its_folder_is_an_error_naming_the_entry(
    out: Path, section: str, name: str, bad: str, problem: str
) -> None:
    edit_manifest(out / "a", lambda m: m[section][name].update(file=bad))
    with pytest.raises(DataError, match=f"{section}.{name}.file: .*{problem}"):
        store.load_manifest(out / "a")
    result = invoke("compare", out)
    assert result.exit_code == 3 and f"{section}.{name}.file" in result.stdout + result.stderr


def test_a_symlink_leading_out_of_the_case_is_refused(out: Path, tmp_path: Path) -> None:
    target = victim(tmp_path) / "golden-dq.bin"
    shutil.copy(out / "a" / "golden" / "dq.bin", target)
    (out / "a" / "golden" / "dq.bin").unlink()
    (out / "a" / "golden" / "dq.bin").symlink_to(target)
    manifest = store.load_manifest(out / "a")
    with pytest.raises(DataError, match="leads out of"):
        store.read_array(out / "a", manifest["golden"]["dq"])
    result = invoke("compare", out)
    assert result.exit_code == 3 and "leads out of" in result.stdout


@pytest.mark.parametrize("negative", [False, True])
def test_the_reference_device_never_writes_or_deletes_outside_the_output_folder(tmp_path: Path, negative: bool) -> None:
    folder = victim(tmp_path)
    fields = {"name": "n", "dtype": "float32", "expect": 161002} if negative else {"name": "n"}
    assert invoke("gen", write_spec(tmp_path / "specs", fields), "-o", tmp_path / "out").exit_code == 0
    edit_manifest(tmp_path / "out" / "n", lambda m: m["outputs"]["dq"].update(file="../../../victim/precious.txt"))
    before = digest(folder)
    result = invoke("run", tmp_path / "out")
    assert result.exit_code == 3 and "outputs.dq.file" in result.stderr and "'..'" in result.stderr
    assert digest(folder) == before


# ---- 3. cleaning an output folder never follows a link nor removes folders it did not create -------------


@pytest.mark.parametrize("with_binary", [False, True])
def test_an_outputs_link_is_never_followed(out: Path, tmp_path: Path, with_binary: bool) -> None:
    folder = victim(tmp_path)
    for name in ("dq.bin", "status.txt", "run.json", "stdout.log"):
        (folder / name).write_text("precious")
    shutil.rmtree(out / "a" / "outputs")
    (out / "a" / "outputs").symlink_to(folder)
    before = digest(folder)
    device = tmp_path / "device.sh"
    device.write_text("#!/bin/sh\nprintf '161002\\n' > \"$2/status.txt\"\n")
    device.chmod(0o755)
    result = invoke("run", out, "--all", *(["--binary", device] if with_binary else []))
    assert result.exit_code == 3
    assert "outputs: is a symbolic link" in result.stderr
    assert "1 ok" in result.stdout  # the other case ran
    assert digest(folder) == before


def test_output_entries_that_name_folders_are_never_removed(out: Path) -> None:
    edit_manifest(out / "a", lambda m: m["outputs"]["dq"].update(file="keep"))
    (out / "a" / "outputs" / "keep").mkdir()
    (out / "a" / "outputs" / "keep" / "data.txt").write_text("mine")
    result = invoke("run", out)
    assert result.exit_code == 3 and "is a folder where bsa writes a result file" in result.stderr
    assert (out / "a" / "outputs" / "keep" / "data.txt").read_text() == "mine"


def test_a_staging_link_is_removed_as_a_link(out: Path, tmp_path: Path) -> None:
    folder = victim(tmp_path)
    (out / "a" / "outputs" / ".run-1").symlink_to(folder)
    assert invoke("run", out).exit_code == 0
    assert (folder / "precious.txt").read_text() == "precious"


# ---- 4. YAML and matrix bombs ------------------------------------------------------------------------------


def bomb(levels: int) -> str:
    anchors = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    anchors += [f"&a{n} [" + ",".join([f"*a{n - 1}"] * 9) + "]" for n in range(1, levels)]
    return f"cases:\n  - {{name: x, num_heads: 1, q_seq_len: 16, dtype: [{', '.join(anchors)}]}}\n"


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(bomb(9))  # 9^9 strings once expanded
    tracemalloc.start()
    try:
        with pytest.raises(SpecError, match="alias bomb"):
            specs.load_specs([tmp_path / "bomb.yaml"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_a_small_alias_is_still_fine_and_an_error_prints_its_value_short(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text(bomb(3))  # 729 strings: within the budget
    with pytest.raises(SpecError) as caught:
        specs.load_specs([tmp_path / "small.yaml"])
    assert "key 'dtype'" in str(caught.value) and len(str(caught.value)) < 300 and "\n" not in str(caught.value)


def test_a_matrix_bomb_is_refused_and_max_cases_raises_the_limit(tmp_path: Path) -> None:
    keys = (
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
    bomb_path = write_spec(tmp_path / "bomb", {"matrix": {k: list(range(1, 11)) for k in keys}})
    tracemalloc.start()
    try:
        result = invoke("validate", bomb_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 2 and "expands to 1000000000 cases" in result.stderr and "--max-cases" in result.stderr
    assert peak < 16 << 20
    small = write_spec(tmp_path / "small", {"matrix": {"seed": list(range(6)), "scale": [0.1, 0.2]}})
    assert "more than the limit of 10" in invoke("validate", small, "--max-cases", "10").stderr
    validated = invoke("validate", small, "--max-cases", "12").stdout.splitlines()
    assert validated[0] == "12 cases OK (0 negative) in 1 spec path"


# ---- 5. tracebacks that became errors ---------------------------------------------------------------------


def test_a_bad_case_is_recorded_and_the_run_goes_on(out: Path) -> None:
    edit_manifest(out / "a", lambda m: m["outputs"]["dq"].update(dtype="float128"))
    result = invoke("run", out)
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert "outputs.dq.dtype: 'float128' is not one of" in result.stderr
    assert json.loads((out / "b" / "outputs" / "run.json").read_text())["outcome"] == "ok"


def test_an_unforeseen_exception_in_one_case_does_not_stop_the_run(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = run._CaseRun.run

    def flaky(self: run._CaseRun) -> devices.RunResult:
        if self.case_dir.name == "a":
            raise ZeroDivisionError("boom")
        return real(self)

    monkeypatch.setattr(run._CaseRun, "run", flaky)
    summary = devices.run_cases(store.select_cases([out]), devices.RunOptions())
    assert [(r.name, r.outcome) for r in summary.results] == [("a", "error"), ("b", "ok")]
    assert "ZeroDivisionError: boom" in summary.results[0].problems[0]


def enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_during_gen_is_one_error_line_and_leaves_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "write_array", enospc)
    out = tmp_path / "out"
    result = invoke("gen", write_spec(tmp_path / "specs", {"name": "a"}), "-o", out)
    assert result.exit_code == 2
    assert result.stderr.endswith("out/a: cannot be written: No space left on device\n")
    assert os.listdir(out) == []


def test_a_full_disk_during_run_is_recorded_per_case(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bsa_cli.devices import reference_ops

    monkeypatch.setattr(reference_ops, "write_atomic", enospc)  # where the reference device writes its outputs
    result = invoke("run", out, "--all")  # the cases have complete results of an earlier run
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert "could not write its outputs: No space left on device" in result.stderr
    assert json.loads((out / "a" / "outputs" / "run.json").read_text())["outcome"] == "error"

    monkeypatch.setattr(run, "write_json_atomic", enospc)
    result = invoke("run", out)
    assert result.exit_code == 3 and "cannot write" in result.stderr and "No space left on device" in result.stderr


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return found


def interrupt_group(pid: int) -> None:
    """SIGINT the process group of `pid`, as Ctrl-C does; a group that has already ended (the command was
    quicker than the delay: its exit code is then checked as a finished run's) is no error."""
    try:
        os.killpg(pid, signal.SIGINT)
    except ProcessLookupError:
        pass


def test_ctrl_c_while_compare_workers_start_leaves_no_traceback(suite: Path) -> None:
    for delay in (0.0, 0.002, 0.02, 0.4):
        proc = subprocess.Popen(
            [sys.executable, "-m", "bsa_cli", "compare", str(suite), "-j", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not children(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # until the worker is spawned (bsa itself has started)
        time.sleep(delay)
        interrupt_group(proc.pid)  # as a terminal does: the whole foreground group
        _, stderr = proc.communicate(timeout=60)
        assert b"Traceback" not in stderr, stderr.decode()
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, proc.returncode, stderr.decode())


def test_ctrl_c_while_gen_workers_start_or_run_leaves_no_traceback(tmp_path: Path) -> None:
    path = write_spec(tmp_path / "specs", {"name": "a", "q_seq_len": 2048, "head_dim": 64}, {"name": "b", "seed": 1})
    for delay in (0.0, 0.002, 0.02, 0.5):
        out = tmp_path / f"out-{delay}"  # a fresh folder each time: gen skips cases already current
        proc = subprocess.Popen(
            [sys.executable, "-m", "bsa_cli", "gen", path, "-o", str(out), "-j", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while len(children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(delay)
        interrupt_group(proc.pid)
        _, stderr = proc.communicate(timeout=120)
        assert b"Traceback" not in stderr, stderr.decode()
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, proc.returncode, stderr.decode())


def test_a_folder_named_like_a_log_or_record_made_by_a_binary_is_no_crash(out: Path, tmp_path: Path) -> None:
    binary = tmp_path / "device.sh"
    binary.write_text(
        '#!/bin/sh\nmkdir "$2/run.json" "$2/stderr.log" "$2/stdout.log"\nprintf \'161002\\n\' > "$2/status.txt"\n'
    )
    binary.chmod(0o755)
    result = invoke("run", out, "--binary", binary)
    assert result.exit_code == 0, result.output
    for case in ("a", "b"):
        assert json.loads((out / case / "outputs" / "run.json").read_text())["status"] == 161002
        assert (out / case / "outputs" / "stderr.log").is_file()


# ---- 6. silent wrong results --------------------------------------------------------------------------------


def test_exponent_numbers_read_as_numbers(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("cases:\n  - {name: x, num_heads: 1, q_seq_len: 16, scale: 1e-3, init: {std: 2E+1}}\n")
    case = specs.load_specs([path])[0]
    assert case.scale == 0.001 and case.init.query.std == 20.0


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("cases:\n  - name: x\n    num_heads: 1\n    q_seq_len: 16\n    scale: 0.1\n    scale: 0.2\n")
    with pytest.raises(SpecError, match="duplicate key 'scale' \\(first on line 5\\)"):
        specs.load_specs([path])


@pytest.mark.parametrize("values", [[[0.5, 1]], [[float("nan"), 1]], [[2, 0]], [[-1, 1]]])
def test_explicit_masks_hold_only_zeros_and_ones(tmp_path: Path, values: list) -> None:
    path = write_spec(tmp_path, {"sparsity": {"pattern": "explicit", "mask": values}})
    with pytest.raises(SpecError, match="a mask holds only 0 and 1"):
        specs.load_specs([path])


def test_a_tnd_case_with_no_batch_is_refused(tmp_path: Path) -> None:
    path = write_spec(tmp_path, {"layout": "TND", "q_seq_len": None, "actual_seq_lengths": []})
    with pytest.raises(SpecError, match="actual_seq_lengths': is empty"):
        specs.load_specs([path])


@pytest.mark.parametrize(
    "fields, key",
    [
        ({"scale": 1e300}, "scale"),
        ({"init": {"std": 1e300}}, "init.query"),
        ({"dtype": "bf16", "init": {"std": 1e19}}, "init"),
    ],
)
def test_values_whose_golden_cannot_be_finite_are_refused(tmp_path: Path, fields: dict, key: str) -> None:
    with pytest.raises(SpecError, match=f"key '{key}'.*cannot be finite"):
        specs.load_specs([write_spec(tmp_path, fields)])


def test_gen_says_so_when_a_golden_is_not_finite_anyway(tmp_path: Path) -> None:
    case = specs.load_specs([write_spec(tmp_path, {"name": "x"})])[0]
    case = dataclasses.replace(case, scale=1e36)  # past the spec's checks: scores overflow float32
    with pytest.raises(DataError, match="golden dq has .* non-finite values"):
        generate.generate_case(case, tmp_path / "out")
    assert os.listdir(tmp_path / "out") == [] if (tmp_path / "out").exists() else True


# ---- 7. limits that protect the machine ---------------------------------------------------------------------


def test_a_binary_log_keeps_its_head_and_tail_and_says_how_much_was_cut(out: Path, tmp_path: Path) -> None:
    binary = tmp_path / "chatty.py"
    binary.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write('h' * 100 + 'x' * (5 << 20) + 't' * 100)\n"
        "open(sys.argv[2] + '/status.txt', 'w').write('161002')\n"
    )
    binary.chmod(0o755)
    assert invoke("run", out / "a", "--binary", binary).exit_code == 0
    log = (out / "a" / "outputs" / "stdout.log").read_bytes()
    cut = 100 + (5 << 20) + 100 - process.LOG_HEAD_BYTES - process.LOG_TAIL_BYTES
    assert log.startswith(b"h" * 100) and log.endswith(b"x" * 1000 + b"t" * 100)
    assert f"[bsa: {cut} bytes cut here".encode() in log
    assert len(log) < process.LOG_HEAD_BYTES + process.LOG_TAIL_BYTES + 200


def test_status_txt_is_read_up_to_a_bound(out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "status.py"
    binary.write_text(
        f"#!{sys.executable}\nimport sys\nopen(sys.argv[2] + '/status.txt', 'w').write('161002\\n' + 'm' * 100000)\n"
    )
    binary.chmod(0o755)
    monkeypatch.setattr(record, "STATUS_MAX_BYTES", 1000)
    result = devices.run_case(out / "a", devices.RunOptions(device=devices.create(binary=binary)))
    assert result.status == 161002
    assert len(result.record["status_message"]) == 1000 - len("161002\n")


def test_leftovers_of_a_killed_gen_are_removed_by_the_next_gen(tmp_path: Path) -> None:
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for name in (f".a.partial-{dead.stdout.strip()}-x1y2", ".a.partial-abc123", ".b.old-zz9"):
        (out / name / "inputs").mkdir(parents=True)
    alive = out / f".c.partial-{os.getppid()}-q"  # another gen still writing into this folder
    alive.mkdir()
    (out / ".d.partial-link").symlink_to(tmp_path)
    assert invoke("gen", write_spec(tmp_path / "specs", {"name": "a"}), "-o", out).exit_code == 0
    assert sorted(os.listdir(out)) == [f".c.partial-{os.getppid()}-q", ".d.partial-link", "a"]


def test_hidden_folders_and_links_are_never_taken_as_cases(out: Path, tmp_path: Path) -> None:
    shutil.copytree(out / "a", out / ".a.partial-1-x")
    (out / "elsewhere").symlink_to(out / "b")
    assert [p.name for p in store.find_cases(out)] == ["a", "b"]


EXTREME = {
    # name: (spec, measured seconds and peak RSS in MiB of `bsa gen -j 1` on the 2-core development machine,
    # 2026-11-30, with the golden of issue 11; user + sys time, equal to the wall time when the machine
    # was quiet)
    "heads-1e6-d1": ({"num_heads": 10**6, "head_dim": 1, "q_seq_len": 16}, 185.4, 5968.0),
    "heads-1e5-d1": ({"num_heads": 10**5, "head_dim": 1, "q_seq_len": 16}, 19.2, 640.0),
    "tnd-200k-batches": ({"layout": "TND", "q_seq_len": None, "actual_seq_lengths": [16] * 200_000}, 56.2, 3174.0),
    "tnd-20k-batches": ({"layout": "TND", "q_seq_len": None, "actual_seq_lengths": [16] * 20_000}, 5.7, 361.0),
    "block-1x1-random": (
        {"q_seq_len": 2048, "block_shape": [1, 1], "sparsity": {"pattern": "random", "density": 0.1}},
        0.93,
        86.0,
    ),
    "block-1x1-causal": ({"q_seq_len": 4096, "block_shape": [1, 1], "sparsity": {"pattern": "causal"}}, 2.1, 151.0),
    "block-1-rows": ({"q_seq_len": 65536, "kv_seq_len": 16, "block_shape": [1, 16]}, 7.7, 81.0),
}


@pytest.mark.parametrize("name", list(EXTREME))
def test_estimates_of_extreme_shapes_are_within_3x_of_measured(tmp_path: Path, name: str) -> None:
    fields, seconds, mib = EXTREME[name]
    case = specs.load_specs([write_spec(tmp_path, {"name": name, **fields})])[0]
    estimate = schedule.estimate(case)
    assert seconds / 3 <= estimate.seconds <= seconds * 3, estimate
    assert mib / 3 <= estimate.peak_memory / 2**20 <= mib * 3, estimate


def test_gen_and_compare_walk_the_batch_entries_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work grows with the batch, not with its square (1000 BNSD entries took 25 s to judge)."""
    from bsa_cli import compare
    from bsa_cli.core import case as case_module

    calls = {"spans": 0, "q_lengths": 0}
    spans, q_lengths = case_module.Case.spans, case_module.Case.q_lengths

    def counted_spans(self: case_module.Case) -> list:
        calls["spans"] += 1
        return spans(self)

    def counted_q_lengths(self: case_module.Case) -> tuple:
        calls["q_lengths"] += 1
        return q_lengths(self)

    tnd = {"name": "tnd", "layout": "TND", "q_seq_len": None, "actual_seq_lengths": [16, 0, 5] * 20}
    path = write_spec(tmp_path / "specs", {"name": "bnsd", "batch": 64, "q_seq_len": 16}, tnd)
    assert invoke("check", path, "-o", tmp_path / "out").exit_code == 0
    monkeypatch.setattr(case_module.Case, "spans", counted_spans)
    monkeypatch.setattr(case_module.Case, "q_lengths", counted_q_lengths)
    for name in ("bnsd", "tnd"):
        calls.update(spans=0, q_lengths=0)
        compare.compare_case(tmp_path / "out" / name, workers=1)
        case = specs.load_specs([path])[0 if name == "bnsd" else 1]
        generate.compute_case(case)
        assert calls["spans"] < 30 and calls["q_lengths"] < 60, (name, calls)


def test_estimating_a_huge_mask_does_not_draw_it(tmp_path: Path) -> None:
    case = specs.load_specs([write_spec(tmp_path, {"q_seq_len": 1 << 20, "block_shape": [1, 1]})])[0]
    tracemalloc.start()
    try:
        estimate = schedule.estimate(case)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert estimate.flops == 14 * (1 << 40) * 16 and peak < 1 << 20


def test_max_cases_names_the_limit_given_and_the_cases_of_earlier_files(tmp_path: Path) -> None:
    first = write_spec(tmp_path / "a", {"matrix": {"seed": list(range(6))}})
    second = write_spec(tmp_path / "b", {"matrix": {"seed": list(range(6))}, "name": "other"})
    result = invoke("validate", first, second, "--max-cases", "10")
    assert result.exit_code == 2
    assert "more than the limit of 10 cases (6 in earlier files); raise it with --max-cases" in result.stderr
    one = write_spec(tmp_path / "c", {"name": "one"})
    assert invoke("validate", one).stdout.splitlines()[0] == "1 case OK (0 negative) in 1 spec path"
    assert invoke("validate", one, first).stdout.splitlines()[0] == "7 cases OK (0 negative) in 2 spec paths"
