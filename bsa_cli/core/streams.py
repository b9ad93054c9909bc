"""bsa's random streams: a PCG64 bit generator per stream, and the transforms of its draws bsa relies on.

NumPy promises to keep a bit generator's raw stream from version to version, not `default_rng`'s choice of
bit generator nor `Generator`'s transforms (numpy.random's compatibility policy: a feature release may
change them). So bsa names PCG64 and SeedSequence itself, writes the uniform transform itself, and holds the
transforms it takes from NumPy (normal values, draws without replacement, permutations) to pinned known
answers: a NumPy that draws other values is refused before anything is written.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from .errors import BsaError


def seeded(entropy: int | list[int]) -> np.random.Generator:
    """Return a generator over PCG64 seeded by `SeedSequence(entropy)` (what `default_rng` gives today)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def uniform01(generator: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """Return float64 values in [0, 1): the top 53 bits of raw 64-bit draws, times 2**-53.

    The same values, from the same raw draws, as `Generator.random` gives today; written here so that
    they stay so whatever a NumPy version does to its transforms.
    """
    count = int(np.prod(shape))
    raw = generator.bit_generator.random_raw(count)
    values = (raw >> np.uint64(11)).astype(np.float64)
    values *= 2.0**-53
    return values.reshape(shape)


def uniform(generator: np.random.Generator, low: float, high: float, shape: int | tuple[int, ...]) -> np.ndarray:
    """Return float64 values uniform in [low, high): low + (high - low) * `uniform01`."""
    values = uniform01(generator, shape)
    values *= high - low
    values += low
    return values


class StreamError(BsaError):
    """The installed NumPy draws other values than bsa's pinned streams: its inputs would differ."""


#: sha256 of `_stream_digest()`'s draws as NumPy 1.24 to 2.4 give them (checked in CI on the oldest).
KNOWN_STREAM_DIGEST = "d028f24b33e3e0788f6affbebc86874ce59b820ad812a54b0f2d4e8fe44de516"


def _stream_digest() -> str:
    """Return the sha256 of draws that cover every `Generator` transform bsa uses (and their slow paths)."""
    digest = hashlib.sha256()
    generator = seeded([20261201, 1])
    digest.update(generator.standard_normal(200_003).astype("<f8").tobytes())  # ziggurat, ~1% through its slow paths
    for population, count in ((10, 3), (1000, 999), (100_000, 37), (100_000, 60_000)):  # both choice paths
        digest.update(generator.choice(population, size=count, replace=False).astype("<i8").tobytes())
    digest.update(generator.permutation(1000).astype("<i8").tobytes())
    digest.update(generator.standard_normal((7, 5)).astype("<f8").tobytes())  # and the stream goes on where it should
    return digest.hexdigest()


@functools.cache
def check_streams() -> None:
    """Raise StreamError if this NumPy's normal, choice or permutation streams are not bsa's pinned ones."""
    found = _stream_digest()
    if found != KNOWN_STREAM_DIGEST:
        raise StreamError(
            f"numpy {np.__version__} draws other normal/choice/permutation values than the streams bsa pins "
            f"(sha256 {found[:16]}..., expected {KNOWN_STREAM_DIGEST[:16]}...): cases generated here would "
            "differ from every other machine's; install a numpy version that pyproject.toml allows"
        )
