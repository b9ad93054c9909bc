"""The peak FP16/BF16 throughput of the chips bsa can name, so that reports give the share of the peak a timed
kernel reaches (docs/compare.md, "Kernel time"). Data only: a chip is named as the device reports it
(`torch.npu.get_device_name()` on torch_npu, the SoC name); a chip without a vendor-stated figure has none.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChipPeak:
    """A chip's Cube (matrix unit) peak in TFLOP/s for FP16 and BF16, and where the vendor states it."""

    tflops: float
    source: str


#: Peaks by chip name. Ascend910B2: ops-transformer's cross-platform guide gives Atlas A2 (its representative
#: configuration: 24 AI cores at 1.8 GHz, Ascend910B2's 24 Cube cores) "353T/376T @BF16,FP16"; 353T is the
#: Cube units' alone (24 x 1.8 GHz x 16^3 multiply-adds x 2), 376T adds the vector units, which attention's
#: matrix products do not use. Other chips (Ascend910B1/B3/B4, Ascend910_93) have no vendor figure found.
PEAKS: dict[str, ChipPeak] = {
    "Ascend910B2": ChipPeak(
        353.0,
        "libochao-huawei/ops-transformer 285dd1ad, docs/zh/develop/cross_platform_migration_guide.md "
        "(Atlas A2: 24 AI cores, 1.8 GHz, Cube 353T @BF16,FP16)",
    )
}


def peak_tflops(chip: str | None) -> float | None:
    """Return a chip's FP16/BF16 Cube peak in TFLOP/s, or None for a chip bsa has no figure for."""
    peak = PEAKS.get(chip or "")
    return None if peak is None else peak.tflops
