"""The cost model's configuration: a TOML file (``tomllib``) of [model], [parallel], [hardware], [overlap],
[compute]. Every resolved value keeps where it came from: trace | config | preset | default."""
from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ninefold.store.errors import NinefoldError

from .hardware import FIELDS as HW_FIELDS, Hardware, hardware

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero-bubble", "dualpipe")
RECOMPUTE = ("none", "selective", "full")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
AXES = ("dp", "tp", "pp", "ep", "cp")


class ConfigError(NinefoldError):
    """A configuration file that cannot be used; the message names the file, the key and the problem."""

    def __init__(self, path, where, reason):
        self.path, self.where, self.reason = str(path), where, reason
        super().__init__(f"{self.path}{f' at {where}' if where else ''}: {reason}")


# key -> (type, default); None default = required (or derived, see resolve()).
SPEC: dict[str, tuple[type, object]] = {
    "model.parameters": (float, None),      # derived from shapes when absent
    "model.layers": (int, None),
    "model.hidden": (int, None),
    "model.heads": (int, None),
    "model.kv_heads": (int, None),          # = heads
    "model.ffn_hidden": (int, None),        # = 4 * hidden
    "model.seq_len": (int, None),
    "model.vocab": (int, 32000),
    "model.experts": (int, 1),
    "model.top_k": (int, 1),
    "model.moe_layers": (int, None),        # = layers when experts > 1, else 0
    "model.expert_ffn_hidden": (int, None),  # = ffn_hidden
    "model.expert_imbalance": (float, 1.0),  # busiest EP rank's tokens / mean tokens
    "model.mlp": (str, "swiglu"),           # swiglu (3 matrices) | gelu (2 matrices)
    "model.dtype": (str, "bf16"),
    "parallel.dp": (int, None),             # = world / (tp * pp * cp) when the trace gives a world size, else 1
    "parallel.tp": (int, 1),
    "parallel.pp": (int, 1),
    "parallel.schedule": (str, "1f1b"),
    "parallel.v": (int, 1),
    "parallel.micro_batches": (int, 1),
    "parallel.micro_batch_size": (int, 1),
    "parallel.ep": (int, 1),
    "parallel.cp": (int, 1),
    "parallel.zero_stage": (int, 0),
    "parallel.fsdp_prefetch": (int, 1),     # ZeRO-3: layers whose parameters are gathered ahead of the one computing
    "parallel.recompute": (str, "none"),
    "parallel.recompute_layers": (int, None),  # layers checkpointed under full recompute; = all
    "parallel.sequence_parallel": (bool, False),
    "hardware.preset": (str, "H100"),
    "overlap.dp": (float, 0.0),
    "overlap.tp": (float, 0.0),
    "overlap.pp": (float, 0.0),
    "overlap.ep": (float, 0.0),
    "overlap.cp": (float, 0.0),
    "compute.mfu": (float, 0.5),            # achieved / peak FLOP/s while compute kernels run
    "compute.bwd_fwd_ratio": (float, 2.0),  # backward FLOPs / forward FLOPs
    "compute.weight_grad_share": (float, 0.5),  # share of the backward that is the weight gradient (W)
    "compute.optimizer_bytes_per_param": (float, 28.0),  # Adam step HBM traffic per (sharded) parameter
}


@dataclass
class Value:
    value: object
    source: str             # trace | config | preset | default
    note: str = ""


@dataclass
class Config:
    path: str
    values: dict[str, Value] = field(default_factory=dict)
    hw_overrides: dict = field(default_factory=dict)
    sha: str = ""

    def __getitem__(self, key):
        return self.values[key].value

    def get(self, key, default=None):
        v = self.values.get(key)
        return default if v is None or v.value is None else v.value

    def set(self, key, value, source, note=""):
        old = self.values.get(key)
        if (old is not None and old.source == "config" and source == "trace"
                and str(old.value).lower() != str(value).lower()):
            note = (note + "; " if note else "") + f"config said {old.value}"
        self.values[key] = Value(value, source, note)

    def hardware(self) -> Hardware:
        return hardware(self["hardware.preset"], self.hw_overrides)

    def rows(self):
        """(key, value, source, note) for display, in SPEC order then extras."""
        keys = list(SPEC) + sorted(k for k in self.values if k not in SPEC)
        return [(k, self.values[k].value, self.values[k].source, self.values[k].note) for k in keys
                if k in self.values]


def _coerce(path, key, typ, raw):
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        raise ConfigError(path, key, f"expected true/false, got {raw!r}")
    if typ is str:
        if isinstance(raw, str):
            return raw.lower()
        raise ConfigError(path, key, f"expected a string, got {raw!r}")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ConfigError(path, key, f"expected a number, got {raw!r}")
    if typ is int:
        if float(raw) != int(raw):
            raise ConfigError(path, key, f"expected an integer, got {raw!r}")
        return int(raw)
    return float(raw)


def load_config(path) -> Config:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(path, None, f"cannot read: {e.strerror or e}") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(path, None, f"not valid TOML: {e}") from None
    cfg = Config(str(path), sha=hashlib.sha256(data).hexdigest())
    known_sections = {k.split(".")[0] for k in SPEC}
    for sec, body in raw.items():
        if sec not in known_sections:
            raise ConfigError(path, f"[{sec}]", f"unknown section (known: {', '.join(sorted(known_sections))})")
        if not isinstance(body, dict):
            raise ConfigError(path, sec, "expected a table")
        for k, v in body.items():
            key = f"{sec}.{k}"
            if sec == "hardware" and k != "preset":
                if k not in HW_FIELDS:
                    raise ConfigError(path, key, f"unknown hardware field (known: {', '.join(sorted(HW_FIELDS))})")
                cfg.hw_overrides[k] = v if k == "name" else _coerce(path, key, float, v)
                continue
            if key not in SPEC:
                raise ConfigError(path, key, "unknown key")
            cfg.set(key, _coerce(path, key, SPEC[key][0], v), "config")
    for key, (_t, default) in SPEC.items():
        if key not in cfg.values and default is not None:
            cfg.set(key, default, "default")
    _validate(cfg)
    return cfg


def _validate(cfg: Config):
    p = cfg.path
    if cfg.get("parallel.schedule") not in SCHEDULES:
        raise ConfigError(p, "parallel.schedule", f"{cfg['parallel.schedule']!r} is not one of {', '.join(SCHEDULES)}")
    if cfg.get("parallel.recompute") not in RECOMPUTE:
        raise ConfigError(p, "parallel.recompute", f"{cfg['parallel.recompute']!r} is not one of {', '.join(RECOMPUTE)}")
    if cfg.get("model.dtype") not in DTYPE_BYTES:
        raise ConfigError(p, "model.dtype", f"{cfg['model.dtype']!r} is not one of {', '.join(DTYPE_BYTES)}")
    if cfg.get("model.mlp") not in ("swiglu", "gelu"):
        raise ConfigError(p, "model.mlp", "must be swiglu or gelu")
    if not 0 <= cfg["parallel.zero_stage"] <= 3:
        raise ConfigError(p, "parallel.zero_stage", "must be 0, 1, 2 or 3")
    for ax in AXES:
        f = cfg[f"overlap.{ax}"]
        if not 0.0 <= f <= 1.0:
            raise ConfigError(p, f"overlap.{ax}", f"a fraction in [0, 1], got {f}")
    for key in ("parallel.tp", "parallel.pp", "parallel.ep", "parallel.cp", "parallel.v",
                "parallel.micro_batches", "parallel.micro_batch_size", "model.experts", "model.top_k",
                "parallel.fsdp_prefetch"):
        if cfg[key] < 1:
            raise ConfigError(p, key, f"must be >= 1, got {cfg[key]}")
    if cfg.get("parallel.dp") is not None and cfg["parallel.dp"] < 1:
        raise ConfigError(p, "parallel.dp", "must be >= 1")
    if not 0 < cfg["compute.mfu"] <= 1:
        raise ConfigError(p, "compute.mfu", "a fraction in (0, 1]")
    if cfg["model.top_k"] > cfg["model.experts"]:
        raise ConfigError(p, "model.top_k", "larger than model.experts")
    if cfg["parallel.schedule"] == "dualpipe" and cfg["parallel.pp"] % 2 and cfg["parallel.pp"] != 1:
        raise ConfigError(p, "parallel.pp", "DualPipe needs an even number of stages (or pp = 1: one rank's chunk "
                          "pairs)")
    m_ = cfg["parallel.micro_batches"]
    if cfg["parallel.schedule"] == "dualpipe" and cfg["parallel.pp"] > 1 and (m_ % 2 or m_ < 2 * cfg["parallel.pp"]):
        raise ConfigError(p, "parallel.micro_batches", "DualPipe feeds half the micro-batches from each end: "
                          f"needs an even number, at least 2 * pp = {2 * cfg['parallel.pp']}, got {m_}")
    try:
        cfg.hardware()
    except KeyError as e:
        raise ConfigError(p, "hardware", e.args[0]) from None


def resolve(cfg: Config, world: int | None = None) -> Config:
    """Fill the derived values (after trace inference has set what it knows). Raises ConfigError when a
    required shape is missing."""
    for key in ("model.layers", "model.hidden", "model.heads", "model.seq_len"):
        if cfg.get(key) is None:
            raise ConfigError(cfg.path, key, "required (the trace does not tell it)")
    L, h = cfg["model.layers"], cfg["model.hidden"]
    if cfg.get("model.kv_heads") is None:
        cfg.set("model.kv_heads", cfg["model.heads"], "default", "= heads")
    if cfg.get("model.ffn_hidden") is None:
        cfg.set("model.ffn_hidden", 4 * h, "default", "= 4 * hidden")
    if cfg.get("model.expert_ffn_hidden") is None:
        cfg.set("model.expert_ffn_hidden", cfg["model.ffn_hidden"], "default", "= ffn_hidden")
    if cfg.get("model.moe_layers") is None:
        cfg.set("model.moe_layers", L if cfg["model.experts"] > 1 else 0, "default",
                "= layers" if cfg["model.experts"] > 1 else "dense model")
    if cfg.get("model.parameters") is None:
        from .params import param_count
        cfg.set("model.parameters", float(param_count(cfg)["total"]), "default", "from the model shape")
    if cfg.get("parallel.dp") is None:
        mp = cfg["parallel.tp"] * cfg["parallel.pp"] * cfg["parallel.cp"]
        if world:
            if world % mp:
                raise ConfigError(cfg.path, "parallel", f"world size {world} is not a multiple of tp*pp*cp = {mp}")
            cfg.set("parallel.dp", world // mp, "default", f"= world {world} / (tp*pp*cp)")
        else:
            cfg.set("parallel.dp", 1, "default")
    if cfg.get("parallel.recompute_layers") is None:
        n = L if cfg["parallel.recompute"] == "full" else 0
        cfg.set("parallel.recompute_layers", n, "default", "= layers" if n else "")
    if cfg["parallel.ep"] > 1 and cfg["model.experts"] % cfg["parallel.ep"]:
        raise ConfigError(cfg.path, "parallel.ep", f"experts {cfg['model.experts']} not divisible by ep")
    if L % cfg["parallel.pp"]:
        raise ConfigError(cfg.path, "parallel.pp", f"layers {L} not divisible by pp {cfg['parallel.pp']}")
    return cfg


def world_size(cfg: Config) -> int:
    return cfg["parallel.dp"] * cfg["parallel.tp"] * cfg["parallel.pp"] * cfg["parallel.cp"]
