"""Hardware presets (``hardware.toml``, each figure with its datasheet source) and per-level link models."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

PRESET_FILE = Path(__file__).with_name("hardware.toml")
PRESETS_ORDER = ("A100", "H100", "H200", "B200", "MI300X")


@dataclass(frozen=True)
class Link:
    """alpha: per-step latency (s); beta: bandwidth per GPU and direction (bytes/s)."""
    alpha: float
    beta: float


@dataclass(frozen=True)
class Hardware:
    preset: str
    name: str
    peak_bf16: float
    peak_fp8: float
    hbm_bytes: float
    hbm_bw: float
    gpus_per_node: int
    nvlink_alpha: float
    nvlink_beta: float
    ib_alpha: float
    ib_beta: float
    pcie_alpha: float
    pcie_beta: float

    def link(self, level: str) -> Link:
        return Link(getattr(self, f"{level}_alpha"), getattr(self, f"{level}_beta"))

    def peak(self, dtype: str) -> float:
        """Dense tensor-core peak for the math dtype; FP8 falls back to BF16 where the GPU has none."""
        if dtype.lower() in ("fp8", "float8", "e4m3", "e5m2") and self.peak_fp8 > 0:
            return self.peak_fp8
        return self.peak_bf16


FIELDS = {f.name for f in fields(Hardware)} - {"preset"}


def load_presets(path: Path = PRESET_FILE) -> dict[str, Hardware]:
    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    return {k: Hardware(preset=k, **{f: v[f] for f in FIELDS}) for k, v in raw.items()}


def hardware(preset: str, overrides: dict | None = None) -> Hardware:
    presets = load_presets()
    key = next((k for k in presets if k.lower() == str(preset).lower()), None)
    if key is None:
        raise KeyError(f"unknown hardware preset {preset!r} (known: {', '.join(PRESETS_ORDER)})")
    hw = presets[key]
    if overrides:
        bad = sorted(set(overrides) - FIELDS)
        if bad:
            raise KeyError(f"unknown hardware field(s) {', '.join(bad)} (known: {', '.join(sorted(FIELDS))})")
        hw = replace(hw, **{k: (int(v) if k == "gpus_per_node" else (v if k == "name" else float(v)))
                            for k, v in overrides.items()})
    return hw


def preset_for_device(device_name: str | None) -> str | None:
    """The preset a profiler's device name (deviceProperties.name) belongs to, if any."""
    if not device_name:
        return None
    n = device_name.upper()
    for key in ("MI300X", "B200", "H200", "H800", "H100", "A100"):
        if key in n:
            return key
    return None
