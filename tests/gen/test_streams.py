"""bsa's random streams: pinned values, whatever NumPy version draws them, and a clear refusal where they differ."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from bsa_cli.core import streams


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).astype("<f8").tobytes()).hexdigest()[:16]


def test_uniform_values_are_pinned_known_answers() -> None:
    # Computed once (numpy 2.4.6); bsa's own transform of PCG64's raw stream, which NumPy promises to keep.
    assert digest(streams.uniform01(streams.seeded([7, 11]), 100_003)) == "e47c94937a504581"
    assert digest(streams.uniform(streams.seeded([7, 11]), -2.0, 3.0, (3, 5))) == "3115691ca29530b8"
    values = streams.uniform01(streams.seeded(1), 1_000_000)
    assert values.min() >= 0.0 and values.max() < 1.0 and abs(values.mean() - 0.5) < 1e-3


def test_the_uniform_transform_is_the_top_53_bits_of_raw_draws() -> None:
    raw = np.random.PCG64(np.random.SeedSequence([3, 4])).random_raw(5)
    expected = [int(r) >> 11 for r in raw]
    got = streams.uniform01(streams.seeded([3, 4]), 5) * 2.0**53
    assert got.tolist() == [float(e) for e in expected]


def test_this_numpy_draws_the_pinned_streams() -> None:
    streams.check_streams()  # raises if the installed NumPy changed its normal, choice or permutation
    assert streams._stream_digest() == streams.KNOWN_STREAM_DIGEST


def test_a_numpy_with_other_streams_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "_stream_digest", lambda: "0" * 64)
    streams.check_streams.cache_clear()
    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "cases": [
                    {
                        "name": "tiny",
                        "num_heads": 1,
                        "q_seq_len": 32,
                        "kv_seq_len": 32,
                        "head_dim": 16,
                        "block_shape": [16, 16],
                    }
                ]
            }
        )
    )
    try:
        result = CliRunner().invoke(main, ["gen", str(spec), "-o", str(tmp_path / "out")])
    finally:
        streams.check_streams.cache_clear()
    assert result.exit_code == 2, result.output
    assert f"Error: numpy {np.__version__} draws other normal/choice/permutation values" in result.output
    assert "install a numpy version that pyproject.toml allows" in result.output
    assert not (tmp_path / "out" / "tiny").exists()
