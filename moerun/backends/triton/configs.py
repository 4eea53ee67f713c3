"""Kernel configurations for :class:`TritonExperts`: the T buckets, the heuristic, the lookup.
The dataclasses themselves live in ``config_types.py`` and are re-exported here.

A configuration is chosen by the shape the kernels **run** -- ``S`` the local slot count
(``w13.shape[0]``: all experts on one rank, ``S / ep_size`` under expert parallelism), ``N``
the intermediate size ``I``, ``K`` the hidden size ``H`` (the names tuned-MoE configs use
elsewhere), the dtype and the device -- and per **T bucket** (the next power of two at or
above the row count ``T``). Tuned entries are JSON files in ``configs/`` named
``S{S}_N{N}_K{K}_{dtype}_{device}.json``, written by ``moerun tune`` (``tune.py``); every file
states the command, date and device that wrote it. A key with no file gets
:func:`default_config`, a heuristic by tokens per expert. There is no fallback between keys
(another device's or dtype's file, the global expert count): a file applies only to the
shape it was tuned on, and every lookup says which source it used (:class:`ConfigChoice`:
``"tuned (<file>)"`` or ``"heuristic"``); the first heuristic choice of a key is logged.

The lookup is pure host arithmetic on ``T = x.shape[0]`` (host-known): no device sync, so it
is safe under CUDA-graph capture. Nothing here imports triton.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from moerun.backends.triton.config_types import DownConfig, ExpertsConfig, GateUpConfig

__all__ = [
    "GateUpConfig",
    "DownConfig",
    "ExpertsConfig",
    "ConfigChoice",
    "CONFIG_DIR",
    "T_BUCKETS",
    "NUM_SMS_DEFAULT",
    "bucket_of",
    "config_file_name",
    "default_config",
    "fit_to_dtype",
    "fp8_default_config",
    "fp8_tile_fits",
    "fp8_intermediate",
    "FP8_GROUP",
    "FP8_PREQUANT_BLOCK_M",
    "ConfigTable",
    "ConfigFile",
    "load_config_file",
    "dtype_name",
]

log = logging.getLogger("moerun")

CONFIG_DIR = Path(__file__).with_name("configs")
#: Power-of-two token buckets; T above the last one uses the last one's entry.
T_BUCKETS = tuple(1 << i for i in range(0, 15))  # 1 .. 16384
#: Streaming multiprocessors assumed by the heuristics (H100/H200 SXM have 132).
NUM_SMS_DEFAULT = 132
#: Shared memory one program may use (bytes), with headroom under Hopper's 227 KiB.
SMEM_LIMIT = 200 * 1024


def bucket_of(num_tokens: int) -> int:
    """The T bucket of ``num_tokens`` (host int): next power of two, capped at the last.

    Pure; host only."""
    b = 1 << max(0, int(num_tokens) - 1).bit_length()
    return min(b, T_BUCKETS[-1])


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` -> ``"bfloat16"``. Pure; host only."""
    return dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")


def config_file_name(num_slots: int, inter: int, hidden: int, dtype: torch.dtype | str,
                     device_name: str) -> str:
    """``S{S}_N{I}_K{H}_{dtype}_{device}.json`` (letters, digits and ``_`` only): ``S`` the
    local slot count the kernels run, ``dtype`` e.g. ``bfloat16``. Pure; host only."""
    dev = "".join(c if c.isalnum() else "_" for c in device_name)
    return f"S{num_slots}_N{inter}_K{hidden}_{dtype_name(dtype)}_{dev}.json"


def default_config(num_slots: int, inter: int, hidden: int, num_tokens: int, top_k: int,
                   num_sms: int = NUM_SMS_DEFAULT) -> ExpertsConfig:
    """Heuristic config for a shape no file covers (also the tuner's starting point).

    Regimes by average tokens per hit expert ``tpe = T*K / min(E, T*K)`` (numbers from the
    H200 runs in ``benchmarks/triton_notes.md``): memory-bound (``tpe <= 48``): the smallest
    ``block_m`` that holds a typical expert's rows in ONE block (a second block re-streams the
    expert's weights), narrow N tiles, deep pipelines, split-K on the down GEMM when too few
    programs would stream weights; compute-bound: 128-row wgmma tiles with grouped ordering
    so the blocks of one expert share weight tiles through L2.
    """
    pairs = max(1, num_tokens * top_k)
    hit = min(num_slots, pairs)
    tpe = pairs / hit
    if tpe <= 48:  # memory-bound: one block per hit expert (mean + 2 sigma of its load)
        need = tpe + 2 * math.sqrt(tpe)
        block_m = 16 if need <= 16 else (32 if need <= 32 else 64)
    else:
        block_m = 128
    if block_m <= 32:
        gu_bn = 64 if hit * (inter // 64) >= 2 * num_sms else 32
        if hit * (inter // 32) < 2 * num_sms:
            gu_bn = 16
        gate_up = GateUpConfig(block_n=gu_bn, block_k=128, group_m=1, num_warps=4, num_stages=4)
        dn_bn = 64
        programs = hit * max(1, hidden // dn_bn)
        split = 1
        while programs * split < 2 * num_sms and split < 8 and inter % (256 * split * 2) == 0:
            split *= 2
        down = DownConfig(block_n=dn_bn, block_k=256, group_m=1, split_k=split,
                          num_warps=4, num_stages=3)
        return ExpertsConfig(block_m=block_m, gate_up=gate_up, down=down, combine="atomic")
    if block_m == 64:
        gate_up = GateUpConfig(block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=3)
        down = DownConfig(block_n=64, block_k=256, group_m=1, num_warps=4, num_stages=3)
        return ExpertsConfig(block_m=64, gate_up=gate_up, down=down, combine="atomic")
    gate_up = GateUpConfig(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    down = DownConfig(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    return ExpertsConfig(block_m=128, gate_up=gate_up, down=down, combine="reduce")


#: The K tile of the fp8 kernels: one 128-column scale group per step (``fp8.py``).
FP8_GROUP = 128
#: From this ``block_m`` on (the compute-bound buckets) the fp8 path quantizes the
#: activations by one kernel before the gate/up GEMM instead of in registers per N tile, and
#: the gate/up epilogue writes the intermediate in fp8 when its tile is one group wide
#: (:func:`fp8_intermediate`). Measured on the H200 (the fp8 config sweep of 2026-12-01,
#: ``benchmarks/fp8-sweep-h200-2026-12-01-run*.json``): re-quantizing the same rows in every
#: N tile cost up to 30 % at T = 8192. ``fp8.run_experts_fp8`` and ``moerun tune --dtype
#: fp8`` both read it here.
FP8_PREQUANT_BLOCK_M = 64


def fp8_tile_fits(block_m: int, block_n: int, num_warps: int, accumulators: int) -> bool:
    """The register rule of the fp8 tiles: a scaled fp8 K step keeps each fp32 accumulator
    *and* the step's dot result live, so ``accumulators * 2 * BM * BN / threads`` must stay
    within 128 registers per thread (``threads = 32 * num_warps``; gate/up has two
    accumulators, down and the ``paired`` gate/up one). The 128 x 128 two-accumulator gate/up
    tile broke it, spilled and ran 5-10x slow (sweep run 1 of 2026-12-01). Pure arithmetic."""
    return accumulators * 2 * block_m * block_n / (32 * num_warps) <= 128


def fp8_intermediate(block_m: int, gate_up: GateUpConfig) -> bool:
    """Whether the fp8 down GEMM after the gate/up tile ``gate_up`` on ``block_m`` rows reads
    the intermediate as e4m3 + scales (and quantizes nothing): from
    :data:`FP8_PREQUANT_BLOCK_M` rows on, when the gate/up epilogue writes it so
    (``gate_up.block_n == FP8_GROUP``: one tile is exactly one scale group of each row) or a
    ``paired`` tile's intermediate is quantized by its own launch. Otherwise the intermediate
    is in the activation dtype and the down kernel quantizes it in registers. Pure; host only."""
    return block_m >= FP8_PREQUANT_BLOCK_M and (gate_up.paired or gate_up.block_n == FP8_GROUP)


def fp8_default_config(num_slots: int, inter: int, hidden: int, num_tokens: int,
                       top_k: int, num_sms: int = NUM_SMS_DEFAULT) -> ExpertsConfig:
    """Heuristic fp8 config for a shape no tuned fp8 file covers (pure host arithmetic).

    From the H200 sweeps of 2026-12-01 (raw in
    ``benchmarks/fp8-sweep-h200-2026-12-01-run*.json``; the script that ran them was replaced
    by ``moerun tune --dtype fp8``): tiles obey the register rule :func:`fp8_tile_fits`.

    * memory-bound (<= 12 rows per hit expert): ``block_m`` 16, gate/up 64 or 128 columns,
      down 128 columns with split-K until the programs cover the SMs twice, atomic combine;
    * otherwise ``block_m`` 64, gate/up 128 columns x 8 warps (its epilogue writes the
      intermediate in fp8), down 128 columns x 4 warps, reduce combine.
    """
    pairs = max(1, num_tokens * top_k)
    hit = min(num_slots, pairs)
    if pairs / hit <= 12:
        gu_bn = 128 if hit * (inter // 128) >= num_sms else 64
        split = 1
        while hit * (hidden // 128) * split < 2 * num_sms and split < 4 and \
                (inter // FP8_GROUP) % (2 * split) == 0:
            split *= 2
        return ExpertsConfig(
            block_m=16,
            gate_up=GateUpConfig(block_n=gu_bn, block_k=FP8_GROUP, num_warps=4, num_stages=4),
            down=DownConfig(block_n=128, block_k=FP8_GROUP, split_k=split, num_warps=4,
                            num_stages=3),
            combine="atomic")
    return ExpertsConfig(
        block_m=64,
        gate_up=GateUpConfig(block_n=128, block_k=FP8_GROUP, group_m=8, num_warps=8, num_stages=3),
        down=DownConfig(block_n=128, block_k=FP8_GROUP, group_m=8, num_warps=4, num_stages=3),
        combine="reduce")


def fit_to_dtype(cfg: ExpertsConfig, dtype: torch.dtype) -> ExpertsConfig:
    """Shrink a (bf16-tuned) config until its pipelines fit shared memory for ``dtype``.

    fp32 tiles take twice the bytes: lower ``num_stages`` (to 2), then ``block_k`` (to 32).

    Pure; host only.
    """
    if dtype == torch.float8_e4m3fn:  # fp8 tiles are sized by registers (fp8_default_config)
        return cfg
    elt = torch.empty((), dtype=dtype).element_size()
    gu, dn = cfg.gate_up, cfg.down
    while gu.smem_bytes(cfg.block_m, elt) > SMEM_LIMIT:
        if gu.num_stages > 2:
            gu = dataclasses.replace(gu, num_stages=gu.num_stages - 1)
        elif gu.block_k > 32:
            gu = dataclasses.replace(gu, block_k=gu.block_k // 2)
        else:
            gu = dataclasses.replace(gu, block_n=max(16, gu.block_n // 2))
    while dn.smem_bytes(cfg.block_m, elt) > SMEM_LIMIT:
        if dn.num_stages > 2:
            dn = dataclasses.replace(dn, num_stages=dn.num_stages - 1)
        elif dn.block_k > 32:
            dn = dataclasses.replace(dn, block_k=dn.block_k // 2)
        else:
            dn = dataclasses.replace(dn, block_n=max(16, dn.block_n // 2))
    if gu is cfg.gate_up and dn is cfg.down:
        return cfg
    return dataclasses.replace(cfg, gate_up=gu, down=dn)


@dataclass(frozen=True, kw_only=True)
class ConfigFile:
    """One config file's contents: ``meta`` (how it was tuned) and ``entries``
    (``{T bucket: config}``)."""

    meta: dict
    entries: dict[int, ExpertsConfig]


def load_config_file(path: Path) -> ConfigFile:
    """The meta and ``{T bucket: config}`` entries of one JSON file (format: see
    ``tune.py``). Host only; reads ``path``."""
    data = json.loads(Path(path).read_text())
    entries = {int(t): ExpertsConfig.from_json(e["config"]) for t, e in data["entries"].items()}
    return ConfigFile(meta=data.get("meta", {}), entries=entries)


@dataclass(frozen=True, kw_only=True)
class ConfigChoice:
    """The result of one lookup.

    Fields:
        config: the configuration to launch (already fitted to the dtype's shared memory).
        source: ``"tuned (<file name>)"``, ``"heuristic"`` or ``"override"``.
        bucket: the T bucket looked up.
        entry_bucket: the file entry used (the nearest tuned bucket in log space); None
            unless tuned.
        detail: why (for a heuristic: the file that was looked for and where).
    """

    config: ExpertsConfig
    source: str
    bucket: int
    entry_bucket: int | None = None
    detail: str = ""

    @property
    def tuned(self) -> bool:
        return self.source.startswith("tuned")

    def describe(self) -> str:
        """``source`` plus the entry or the reason, e.g. ``tuned (f.json), entry T=16``.

        Pure; host only."""
        if self.entry_bucket is not None:
            return f"{self.source}, entry T={self.entry_bucket}"
        return f"{self.source} ({self.detail})" if self.detail else self.source


@dataclass(frozen=True)
class _FileTable:
    name: str
    entries: dict  # bucket -> (entry bucket, ExpertsConfig)


@functools.lru_cache(maxsize=64)
def _file_table(num_slots: int, inter: int, hidden: int, dtype: str, device_name: str,
                config_dir: str) -> _FileTable | None:
    name = config_file_name(num_slots, inter, hidden, dtype, device_name)
    path = Path(config_dir) / name
    if not path.is_file():
        return None
    entries = load_config_file(path).entries
    if not entries:
        return None
    keys = sorted(entries)
    table = {}
    for b in T_BUCKETS:  # nearest tuned T in log space, ties to the larger
        near = min(keys, key=lambda t: (abs(math.log2(t) - math.log2(b)), -t))
        table[b] = (near, entries[near])
    return _FileTable(name=name, entries=table)


def _runs(choices: list[ConfigChoice]) -> list[tuple[int, int, ConfigChoice]]:
    """Consecutive buckets with the same description merged: ``[(first, last, choice)]``."""
    out: list[tuple[int, int, ConfigChoice]] = []
    for c in choices:
        if out and out[-1][2].describe() == c.describe():
            out[-1] = (out[-1][0], c.bucket, out[-1][2])
        else:
            out.append((c.bucket, c.bucket, c))
    return out


class ConfigTable:
    """Per-bucket config lookup for one device.

    ``lookup(...)`` costs a dict lookup after the first call for a key (the file is read and
    expanded to every bucket once, then cached). ``overrides`` ({T bucket: config}) wins
    over files -- used by the tuner and the benchmark to time candidates.
    """

    def __init__(self, device_name: str = "", config_dir: Path | str | None = None,
                 overrides: dict[int, ExpertsConfig] | None = None):
        self.device_name = device_name
        # an empty MOERUN_TRITON_CONFIG_DIR counts as unset (``VAR= cmd`` in a shell script
        # meant "the shipped files", and read as the current directory it found none)
        self.config_dir = str(config_dir or os.environ.get("MOERUN_TRITON_CONFIG_DIR")
                              or CONFIG_DIR)
        self.overrides = dict(overrides or {})
        self._cache: dict[tuple, ConfigChoice] = {}
        self._logged: set[tuple] = set()

    def lookup(self, num_slots: int, inter: int, hidden: int, num_tokens: int, top_k: int,
               dtype: torch.dtype) -> ConfigChoice:
        """The configuration for a call with ``num_tokens`` rows on ``num_slots`` local slots
        (``w13 [num_slots, 2*inter, hidden]``), ``top_k`` ids per row, ``dtype`` inputs
        (``torch.float8_e4m3fn``: the fp8 block-scaled kernels, whose heuristic is
        :func:`fp8_default_config`).

        Keyed by ``(num_slots, inter, hidden, dtype, device)``: the file
        ``config_file_name(...)`` of exactly that key, else the heuristic (logged once per key
        and table). Host only, no device sync (safe under graph capture)."""
        b = bucket_of(num_tokens)
        key = (num_slots, inter, hidden, b, top_k, dtype)
        choice = self._cache.get(key)
        if choice is not None:
            return choice
        if b in self.overrides:
            choice = ConfigChoice(config=fit_to_dtype(self.overrides[b], dtype),
                                  source="override", bucket=b)
        else:
            table = _file_table(num_slots, inter, hidden, dtype_name(dtype), self.device_name,
                                self.config_dir)
            if table is not None:
                near, cfg = table.entries[b]
                choice = ConfigChoice(config=fit_to_dtype(cfg, dtype),
                                      source=f"tuned ({table.name})", bucket=b,
                                      entry_bucket=near)
            else:
                name = config_file_name(num_slots, inter, hidden, dtype, self.device_name)
                where = ("the shipped configs" if Path(self.config_dir) == CONFIG_DIR
                         else self.config_dir)
                heuristic = fp8_default_config if dtype == torch.float8_e4m3fn \
                    else default_config
                choice = ConfigChoice(
                    config=fit_to_dtype(heuristic(num_slots, inter, hidden, b, top_k), dtype),
                    source="heuristic", bucket=b,
                    detail=f"no {name} in {where}; `moerun tune` writes it")
                once = (num_slots, inter, hidden, dtype)
                if once not in self._logged:
                    self._logged.add(once)
                    log.info("moerun: TritonExperts runs heuristic kernel configs for S=%d "
                             "N=%d K=%d %s on %s (%s)", num_slots, inter, hidden,
                             dtype_name(dtype), self.device_name or "?", choice.detail)
        self._cache[key] = choice
        return choice

    def report_lines(self, num_slots: int, inter: int, hidden: int, top_k: int,
                     dtype: torch.dtype) -> tuple[str, ...]:
        """The choice of every T bucket for one local shape, consecutive buckets with the
        same source merged: a head line naming the key, then ``T a-b: <source>`` lines.

        Host only, no device sync: :meth:`lookup` per bucket (may read and cache the shape's
        config file, logs a heuristic fallback once)."""
        choices = [self.lookup(num_slots, inter, hidden, b, top_k, dtype) for b in T_BUCKETS]
        head = (f"S_local={num_slots} N=I={inter} K=H={hidden} {dtype_name(dtype)} on "
                f"{self.device_name or '?'}:")
        body = [f"T {lo}-{hi}: {c.describe()}" if lo != hi else f"T {lo}: {c.describe()}"
                for lo, hi, c in _runs(choices)]
        return (head, *body)
