"""bsa gen's case folders per op: one per (case, op), inputs drawn once, each golden computed once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bsa_cli import golden, store
from bsa_cli.core.case import Case, Expect
from bsa_cli.core.errors import DataError
from bsa_cli.gen import generate
from bsa_cli.gen.generate import fingerprint, generate_case, generate_case_ops, generate_suite
from bsa_cli.gen.settings import GenSettings
from tests.helpers import make_case

ALL_OPS = ("forward", "backward", "chain", "autograd")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the golden functions' calls."""
    counted = {"backward": 0, "forward": 0, "chain": 0}

    def counting(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return function(*args, **kwargs)

        return call

    for name, attr in (
        ("backward", "golden_and_benchmark"),
        ("forward", "forward_golden_and_benchmark"),
        ("chain", "chain_golden_and_benchmark"),
    ):
        monkeypatch.setattr(golden, attr, counting(name, getattr(golden, attr)))
    return counted


def manifest_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "case.json").read_text())


def test_every_op_gets_its_folder_in_ops_order_from_one_draw_and_one_golden_each(
    tmp_path: Path, calls: dict[str, int]
) -> None:
    case = make_case("c", ops=ALL_OPS)
    folders = generate_case_ops(case, tmp_path)
    assert [f.name for f in folders] == ["c@forward", "c", "c@chain", "c@autograd"]
    assert calls == {"backward": 1, "forward": 1, "chain": 1}
    loaded = {f.name: store.load_manifest(f) for f in folders}
    assert [m.op for m in loaded.values()] == list(ALL_OPS)
    assert {m.case_name for m in loaded.values()} == {"c"}
    digests = {name: {k: e["sha256"] for k, e in m.entries("inputs")} for name, m in loaded.items()}
    for name in ("c@forward", "c@chain", "c@autograd"):
        for tensor in ("query", "key", "value"):
            assert digests[name][tensor] == digests["c"][tensor]  # the same bytes in every folder
    assert digests["c@chain"]["dout"] == digests["c"]["dout"]
    assert list(digests["c@forward"]) == ["query", "key", "value", "block_sparse_mask"]
    assert list(digests["c@chain"]) == ["query", "key", "value", "dout", "block_sparse_mask"]
    chain, autograd = loaded["c@chain"], loaded["c@autograd"]
    assert {k: e["sha256"] for k, e in chain.entries("golden")} == {
        k: e["sha256"] for k, e in autograd.entries("golden")
    }


def test_the_forward_folder_holds_what_the_contract_says(tmp_path: Path, calls: dict[str, int]) -> None:
    case = make_case("c", ops=("forward", "backward"), inner_precise=1, softmax_lse_flag=0)
    generate_case_ops(case, tmp_path)
    forward, backward = manifest_of(tmp_path / "c@forward"), manifest_of(tmp_path / "c")
    assert forward["op"] == "forward" and forward["name"] == "c@forward" and "op" not in backward
    assert (forward["params"]["inner_precise"], forward["params"]["softmax_lse_flag"]) == (1, 0)
    assert "inner_precise" not in backward["params"]
    mask = forward["inputs"]["block_sparse_mask"]
    assert mask["dtype"] == "int8" and backward["inputs"]["block_sparse_mask"]["dtype"] == "uint8"
    assert (tmp_path / "c@forward" / mask["file"]).read_bytes() == (
        tmp_path / "c/inputs/block_sparse_mask.bin"
    ).read_bytes()
    lse_shape = list(case.lse_shape_dims)
    assert {k: (e["dtype"], e["shape"]) for k, e in forward["golden"].items()} == {
        "out": ("float32", list(case.q_shape)),
        "lse": ("float32", lse_shape),
    }
    assert {k: e["dtype"] for k, e in forward["benchmark"].items()} == {"out": "float16", "lse": "float32"}
    assert forward["outputs"] == {
        "out": {"file": "out.bin", "dtype": "float16", "shape": list(case.q_shape)},
        "lse": {"file": "lse.bin", "dtype": "float32", "shape": lse_shape},
    }
    assert forward["expect"] == {"status": 0, "name": "ACLNN_SUCCESS"}
    assert set(forward["benchmark_summary"]["stats"]) == {"out"}  # over the written rows; lse is measured when judged
    assert set(forward["benchmark_summary"]["tiles"]) == {"out"}
    assert set(backward["benchmark_summary"]["stats"]) == {"dq", "dk", "dv"}
    assert forward["stats"] == backward["stats"]
    lines = (tmp_path / "c@forward" / "case.txt").read_text().splitlines()
    assert lines[:3] == ["format bsa-case/1", "name c@forward", "op forward"]
    assert "inner_precise 1" in lines and "softmax_lse_flag 0" in lines
    assert not any(line.startswith("op ") for line in (tmp_path / "c" / "case.txt").read_text().splitlines())
    assert store.load_manifest(tmp_path / "c@forward").forward_params == {"inner_precise": 1, "softmax_lse_flag": 0}
    rebuilt = store.load_manifest(tmp_path / "c@forward").case
    assert (rebuilt.ops, rebuilt.inner_precise, rebuilt.softmax_lse_flag) == (("forward",), 1, 0)


def test_the_chain_folder_has_five_goldens_and_the_backward_mask_dtype(tmp_path: Path, calls: dict[str, int]) -> None:
    case = make_case("c", ops=("chain",))
    (folder,) = generate_case_ops(case, tmp_path)
    chain = manifest_of(folder)
    names = ["out", "lse", "dq", "dk", "dv"]
    assert list(chain["golden"]) == names and list(chain["benchmark"]) == names and list(chain["outputs"]) == names
    assert chain["inputs"]["block_sparse_mask"]["dtype"] == "uint8"
    assert chain["benchmark"]["lse"]["dtype"] == "float32" and chain["benchmark"]["dq"]["dtype"] == "float16"
    assert "kernel_path" in chain and calls == {"backward": 0, "forward": 0, "chain": 1}
    assert set(chain["benchmark_summary"]["stats"]) == {"out", "dq", "dk", "dv"}
    assert not (tmp_path / "c").exists()  # a case without the backward has no NAME folder
    assert generate_case(case, tmp_path / "again") == tmp_path / "again" / "c@chain"


def test_a_backward_folder_is_the_case_of_old_whatever_ops_the_case_lists(
    tmp_path: Path, calls: dict[str, int]
) -> None:
    plain = make_case("c")
    generate_case(plain, tmp_path / "plain")
    generate_case_ops(make_case("c", ops=ALL_OPS, inner_precise=1), tmp_path / "ops")
    for file in sorted(
        p.relative_to(tmp_path / "plain" / "c") for p in (tmp_path / "plain" / "c").rglob("*") if p.is_file()
    ):
        assert (tmp_path / "ops" / "c" / file).read_bytes() == (tmp_path / "plain" / "c" / file).read_bytes(), file
    assert fingerprint(plain, "float32") != fingerprint(plain, "float32", "forward")


def test_a_skipped_op_gets_a_folder_that_says_why_and_holds_nothing(tmp_path: Path, calls: dict[str, int]) -> None:
    why = "the A2/A3 forward refuses block_shape [32, 16]: Y % 128 != 0 (tiling, 561002); the backward accepts it"
    case = make_case("c", ops=("forward", "backward"), skipped_ops=(("forward", why),))
    generate_case_ops(case, tmp_path)
    skipped = store.load_manifest(tmp_path / "c@forward")
    assert skipped.skip == why and calls["forward"] == 0
    assert all(not skipped.section(s) for s in ("inputs", "golden", "benchmark", "outputs"))
    assert "benchmark_summary" not in skipped and not any((tmp_path / "c@forward").glob("*/*.bin"))
    assert fingerprint(case, "float32", "forward") != fingerprint(
        make_case("c", ops=("forward", "backward")), "float32", "forward"
    )


def test_a_negative_op_has_no_golden_while_the_op_that_accepts_the_case_has_one(
    tmp_path: Path, calls: dict[str, int]
) -> None:
    refused = Expect(561002, "ACLNN_ERR_INNER_TILING_ERROR")
    case = make_case("c", ops=("forward", "backward"), expect=refused, op_expect=(("backward", Expect()),))
    generate_case_ops(case, tmp_path)
    forward, backward = store.load_manifest(tmp_path / "c@forward"), store.load_manifest(tmp_path / "c")
    assert forward.is_negative and not forward.has_golden and forward.expect_status == 561002
    assert set(forward.inputs) == {"query", "key", "value", "block_sparse_mask"}
    assert list(forward.outputs) == ["out", "lse"]
    assert not backward.is_negative and backward.has_golden
    assert calls == {"backward": 1, "forward": 0, "chain": 0}


def test_the_pair_s_verdict_and_cause_reach_its_expect_only_when_set(tmp_path: Path, calls: dict[str, int]) -> None:
    must_fail = Expect(verdict="FAIL", cause="lse-unwritten")
    case = make_case("c", ops=("backward", "chain"), softmax_lse_flag=0, op_expect=(("chain", must_fail),))
    generate_case_ops(case, tmp_path)
    assert manifest_of(tmp_path / "c@chain")["expect"] == {
        "status": 0,
        "name": "ACLNN_SUCCESS",
        "verdict": "FAIL",
        "cause": "lse-unwritten",
    }
    assert manifest_of(tmp_path / "c")["expect"] == {"status": 0, "name": "ACLNN_SUCCESS"}


def test_a_suite_regenerates_only_the_folders_that_are_not_current(tmp_path: Path, calls: dict[str, int]) -> None:
    case = make_case("c", ops=("forward", "backward"))
    folders = generate_suite([case, make_case("d")], tmp_path, skip_current=True)
    assert [f.name for f in folders] == ["c@forward", "c", "d"]
    outcomes: list[tuple[str, str, str]] = []
    generate_suite([case], tmp_path, skip_current=True, on_done=lambda c, o, p: outcomes.append((c.name, o, p.name)))
    assert outcomes == [("c", "current", "c@forward")]
    before = dict(calls)
    store.write_json_atomic(tmp_path / "c@forward" / "case.json", {"format": "other"})  # spoilt
    generate_suite([case], tmp_path, skip_current=True)
    assert calls["forward"] == before["forward"] + 1 and calls["backward"] == before["backward"]  # only the forward
    assert store.load_manifest(tmp_path / "c@forward").op == "forward"


def test_a_non_finite_golden_writes_no_folder_of_the_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    computed = golden.forward_golden_and_benchmark

    def overflowing(*args: Any) -> Any:
        out, lse, bench_out, bench_lse = computed(*args)
        out[0, 0, 0, 0] = np.inf
        return out, lse, bench_out, bench_lse

    monkeypatch.setattr(golden, "forward_golden_and_benchmark", overflowing)
    with pytest.raises(DataError, match=r"c@forward.*the golden out has 1 non-finite values"):
        generate_case_ops(make_case("c", ops=("forward", "backward")), tmp_path)
    assert not any(tmp_path.iterdir())


def test_progress_counts_every_op_s_walks(tmp_path: Path, calls: dict[str, int]) -> None:
    seen: list[float] = []
    generate_case_ops(make_case("c", ops=ALL_OPS), tmp_path, GenSettings(on_progress=lambda _c, f: seen.append(f)))
    assert seen == sorted(seen) and seen and seen[-1] <= 1.0


def test_suites_in_worker_processes_make_only_their_stale_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, tuple[str, ...] | None]] = []

    def fake(case: Case, out_root: Path, settings: GenSettings) -> list[Path]:
        made.append((case.name, settings.ops))
        return [Path(out_root) / case.name]

    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    @contextlib.contextmanager
    def threads(jobs: int, **start: object):  # type: ignore[no-untyped-def]
        with ThreadPoolExecutor(jobs) as pool:
            yield pool

    monkeypatch.setattr(generate, "generate_case_ops", fake)
    monkeypatch.setattr(generate, "worker_pool", threads)
    monkeypatch.setattr(generate, "is_current", lambda case, folder, precision, op="backward": op == "backward")
    cases = [make_case("a", ops=("forward", "backward")), make_case("b", ops=("backward", "chain"))]
    folders = generate_suite(cases, tmp_path, GenSettings(jobs=2), skip_current=True)
    assert sorted(made) == [("a", ("forward",)), ("b", ("chain",))]
    assert [f.name for f in folders] == ["a@forward", "a", "b", "b@chain"]
