"""What ``moerun tune`` will time and what it writes: the pruned candidate space per point
(bf16/fp16 kernels: :func:`candidates`; the fp8 block-scaled kernels: :func:`fp8_candidates`),
the plan (points, incumbents, target files); the merge of winners into a config file is
``tune_files.py`` (re-exported here).

Prefill points of 2-byte dtypes also time the persistent TMA kernels as whole calls
(:func:`persistent_candidates`), fp8 points with ``FP8_WS_MIN_TPE`` rows per hit expert or
more the warp-specialized Gluon kernels (:func:`fp8_ws_candidates`), and decode points of a
few tokens the two-launch direct path (:func:`direct_candidates`, ``tune_direct.py``,
re-exported here); sets of 16/32-row tiles also time their ``swap_ab`` forms
(:attr:`CandidateSet.swap_size`). Pure host code (no triton, no GPU): ``moerun tune --plan``
prints a plan on any machine, and the tests check the space and the file round trip on a
CPU. Legend: ``S`` local slots (the bench shape's
``num_experts``), ``K`` top-k, ``H`` hidden, ``I`` intermediate, ``T`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from moerun.backends.triton.configs import (FP8_GROUP, FP8_PREQUANT_BLOCK_M, SMEM_LIMIT,
                                            DownConfig, ExpertsConfig, GateUpConfig,
                                            bucket_of, config_file_name, default_config,
                                            fp8_default_config, fp8_intermediate,
                                            fp8_tile_fits)
from moerun.backends.triton.tune_direct import (DIRECT_MAX_TOKENS, SWAP_MIN_ROWS,
                                                 direct_candidates, fp8_direct_candidates,
                                                 swap_eligible, swapped)
from moerun.backends.triton.tune_files import TunedEntry, merge_entries, read_config_data
from moerun.bench.shapes import BenchShape

__all__ = ["MAX_CONFIGS", "FP8_MAX_CONFIGS", "NUM_SMS", "FP8", "DownChoice", "CandidateSet",
           "TunePoint", "TunedEntry", "candidates", "persistent_candidates", "direct_candidates",
           "fp8_candidates", "fp8_direct_candidates", "fp8_ws_candidates", "DIRECT_MAX_TOKENS",
           "SWAP_MIN_ROWS", "swap_eligible", "swapped",
           "PERSISTENT_MIN_TPE",
           "FP8_WS_MIN_TPE",
           "check_fp8_shape",
           "plan_points", "point_mode", "read_config_data", "merge_entries", "compile_configs"]

#: Configs timed per point at most (the incumbent included; the direct candidates of a
#: decode point and the swap_ab forms of 16/32-row sets come on top).
MAX_CONFIGS = 24
#: Rows per hit expert above which a point is prefill: its grouped space leads with 128-row
#: tiles and it times the persistent kernels too (also the bound of
#: TritonExperts.workspace_bytes for the persistent kernels' scratch).
PERSISTENT_MIN_TPE = 160
#: The same bound for the fp8 kernels: the space of the 2026-12-01 fp8 sweep (at most 30
#: candidates per point) with the paired gate/up tiles added (at most 40), plus the
#: incumbent, so nothing of it is pruned; 4 more for the ``group_m=16`` variants.
FP8_MAX_CONFIGS = 45
#: Rows per hit expert from which the fp8 space adds ``group_m=16`` variants of its best
#: prefill tiles (4 more configs: the T=8192 points).
FP8_WIDE_GROUP_TPE = 256
#: The dtype of the fp8 block-scaled kernels' config files (``moerun tune --dtype fp8``).
FP8 = torch.float8_e4m3fn
#: Streaming multiprocessors the pruning assumes (H100/H200 SXM).
NUM_SMS = 132


@dataclass(frozen=True, kw_only=True)
class DownChoice:
    """A down-GEMM tile with the combine it runs under (``"atomic"`` / ``"reduce"``)."""

    down: DownConfig
    combine: str


@dataclass(frozen=True, kw_only=True)
class CandidateSet:
    """The candidates of one ``block_m``: gate/up tiles (timed alone first) and down tiles
    (timed as whole calls with the best gate/up tile).

    ``fp8_intermediate`` (fp8 sets only): every gate/up tile of the set writes the
    intermediate in fp8 (``configs.fp8_intermediate``), so the down tiles are timed on the
    form they will read; the fp8 space splits a prefill ``block_m`` into one set per form,
    since the gate/up tile alone cannot say which form makes the whole call faster."""

    block_m: int
    gate_ups: tuple[GateUpConfig, ...]
    downs: tuple[DownChoice, ...]
    fp8_intermediate: bool = False

    @property
    def size(self) -> int:
        return len(self.gate_ups) + len(self.downs)

    @property
    def swap_gate_ups(self) -> tuple[GateUpConfig, ...]:
        """The gate/up tiles a ``swap_ab`` copy may use (:func:`swap_eligible`)."""
        return tuple(g for g in self.gate_ups if swap_eligible(self.block_m, g.block_n,
                                                                 g.paired))

    @property
    def swap_downs(self) -> tuple[DownChoice, ...]:
        """The down tiles timed again with ``swap_ab`` (with the best of
        :attr:`swap_gate_ups`), none where no gate/up tile qualifies."""
        if not self.swap_gate_ups:
            return ()
        return tuple(d for d in self.downs if swap_eligible(self.block_m, d.down.block_n))

    @property
    def swap_size(self) -> int:
        """Timings of the ``swap_ab`` forms: each qualifying gate/up tile alone and each
        qualifying down tile as a whole call (0 where either list is empty)."""
        return len(self.swap_gate_ups) + len(self.swap_downs) if self.swap_downs else 0

    @property
    def label(self) -> str:
        """``block_m``, with ``f8`` appended for a set with an fp8 intermediate."""
        return f"{self.block_m}f8" if self.fp8_intermediate else str(self.block_m)


@dataclass(frozen=True, kw_only=True)
class TunePoint:
    """One ``(shape, T)`` to tune.

    Fields: ``shape``; ``tokens`` T; ``bucket`` (the entry it writes); ``mode`` ``"graph"``
    or ``"eager"`` (the bench's serving regime for the cell); ``incumbent`` (the file's entry
    for the bucket, else the heuristic) and ``incumbent_source`` (``"tuned (<file>)"`` /
    ``"heuristic"``); ``candidate_sets``; ``file_name`` (the config file it merges into,
    keyed by the local shape).
    """

    shape: BenchShape
    tokens: int
    bucket: int
    mode: str
    incumbent: ExpertsConfig
    incumbent_source: str
    candidate_sets: tuple[CandidateSet, ...]
    file_name: str
    #: whole configs timed as they are (the persistent TMA kernels; for fp8 the ws Gluon
    #: kernels: their gate/up kernel is not the grouped one the sets time alone), after the
    #: sets
    persistent: tuple[ExpertsConfig, ...] = ()
    #: whole configs of the direct decode path (``kernel="direct"``), timed likewise
    direct: tuple[ExpertsConfig, ...] = ()

    @property
    def swap_configs(self) -> int:
        """Timings of the grouped sets' ``swap_ab`` forms (:attr:`CandidateSet.swap_size`);
        like the direct configs, they come on top of :data:`MAX_CONFIGS`."""
        return sum(c.swap_size for c in self.candidate_sets)

    @property
    def num_configs(self) -> int:
        """Configs timed for this point: every candidate plus the incumbent."""
        return (sum(c.size for c in self.candidate_sets) + self.swap_configs
                + len(self.persistent) + len(self.direct) + 1)


def candidates(num_slots: int, top_k: int, hidden: int, inter: int, tokens: int,
               elt: int = 2, cap: int = MAX_CONFIGS) -> list[CandidateSet]:
    """Pruned search space for one point, at most ``cap - 1`` configs in all (the plan
    leaves room for the point's :func:`persistent_candidates`).

    Decode-like points (<= 32 rows per hit expert) get narrow, deep-pipelined tiles and
    split-K/atomic down candidates; prefill points get 64/128-row wgmma-sized tiles and both
    combines. Tiles over the shared-memory limit for ``elt``-byte elements are dropped.

    Pure; host only.
    """
    G, D = GateUpConfig, DownConfig
    big_i, big_h = inter, hidden
    pairs = tokens * top_k
    hit = min(num_slots, pairs)
    tpe = pairs / hit
    if tpe <= 12:
        bms = [16]
    elif tpe <= 24:
        bms = [16, 32]
    elif tpe <= 48:
        bms = [32, 64]
    elif tpe <= PERSISTENT_MIN_TPE:
        bms = [64, 128]
    else:
        bms = [128, 64]
    out: list[tuple[int, list, list]] = []
    for bm in bms:
        blocks = max(1, round(hit * max(1.0, tpe / bm)))
        if bm <= 32:  # memory-bound: weights streamed once; tiles differ little (call 1)
            # (the 3-stage n128k128 / n64k256 tiles exceed the 200 KiB the lookup allows:
            # listed with the stage count that actually runs)
            gus = [G(block_n=64, block_k=128, num_stages=4), G(block_n=64, block_k=128, num_stages=5),
                   G(block_n=64, block_k=256, num_stages=2),
                   G(block_n=128, block_k=128, num_warps=8, num_stages=2),
                   G(block_n=32, block_k=256, num_stages=3), G(block_n=32, block_k=128, num_stages=4)]
            if blocks * big_i // 64 < 2 * NUM_SMS:  # too few programs: narrower tiles first
                gus = [G(block_n=16, block_k=256, num_stages=4), G(block_n=32, block_k=256, num_stages=3),
                       G(block_n=32, block_k=128, num_stages=5), G(block_n=16, block_k=128, num_stages=6),
                       G(block_n=64, block_k=128, num_stages=4)]
            dns = [(D(block_n=64, block_k=256, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=128), "atomic"), (D(block_n=64, block_k=128), "atomic"),
                   (D(block_n=32, block_k=256), "atomic"),
                   (D(block_n=64, block_k=256, num_stages=3), "reduce")]
            for split in (2, 4):
                bk = 256 if big_i % (256 * split) == 0 else 128
                if blocks * (big_h // 64) * split <= 4 * NUM_SMS and big_i % (bk * split) == 0:
                    dns.append((D(block_n=64, block_k=bk, split_k=split, num_stages=3), "atomic"))
            dns = dns[:7]
        elif bm == 64:
            gus = [G(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=3),
                   G(block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=3),
                   G(block_n=128, block_k=64, group_m=4, num_warps=8, num_stages=3),
                   G(block_n=64, block_k=64, group_m=4, num_warps=4, num_stages=4),
                   G(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)]
            dns = [(D(block_n=64, block_k=256, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=64, group_m=4), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=64, group_m=4), "atomic")]
        else:  # 128-row wgmma tiles (T = 8192: n128k64 w8 s3 was best by 10-30 % in call 1)
            gus = [G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3),
                   G(block_n=128, block_k=64, group_m=4, num_warps=8, num_stages=3),
                   G(block_n=128, block_k=32, group_m=8, num_warps=8, num_stages=5),
                   G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4),
                   G(block_n=128, block_k=64, group_m=16, num_warps=8, num_stages=3)]
            dns = [(D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4), "reduce"),
                   (D(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "atomic")]
        gus = [g for g in gus if g.smem_bytes(bm, elt) <= SMEM_LIMIT]
        dns = [(d, c) for d, c in dns if d.smem_bytes(bm, elt) <= SMEM_LIMIT]
        out.append((bm, gus, dns))
    return _within(out, cap)


def persistent_candidates(num_slots: int, top_k: int, tokens: int, elt: int = 2
                          ) -> list[ExpertsConfig]:
    """The persistent TMA configs (``kernel="persistent"``, ``persistent.py``) a point times
    as whole calls: prefill points only (more than ``PERSISTENT_MIN_TPE`` = 160 rows per hit
    expert, where the grouped space is 128-row tiles too), 2-byte dtypes only (none for
    fp32). The space of
    ``benchmarks/persistent_probe.py`` that won on the H200 (2026-12-01; every shipped
    persistent entry is its first or second config) plus its stage and down-tile variants,
    and the 3- and 4-stage pairs with the down tile loop flattened (``flatten``: Triton
    pipelines the next tile's first loads into this tile's tail; 3-7 % faster at the short
    down K of qwen3-235b, qwen3-30b and the EP-local T=2048/8192 cells, 1-2 % slower at
    mixtral's long K, same run on the H200, 2026-12-05: docs/DECISIONS.md), and three of them
    with the tail split (``tail_split``: mixtral T=1024's last round of down tiles is about a
    third full; docs/DECISIONS.md, "The persistent kernels' tail split").
    Pure; host only."""
    pairs = tokens * top_k
    hit = min(num_slots, max(1, pairs))
    if elt != 2 or pairs / hit <= PERSISTENT_MIN_TPE:
        return []
    G, D = GateUpConfig, DownConfig
    gu = G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    dn256 = D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    dn128 = D(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    gu_tma = G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3, a_tma=True)
    gu4 = G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)
    dn4 = D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4)
    dn256f = D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3, flatten=True)
    dn4f = D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4, flatten=True)
    return [ExpertsConfig(block_m=128, gate_up=g, down=d, combine="reduce", kernel="persistent",
                          tail_split=t)
            for g, d, t in ((gu, dn256, False), (gu_tma, dn256, False), (gu, dn128, False),
                            (gu4, dn4, False), (gu, dn256f, False), (gu4, dn4f, False),
                            (gu, dn256, True), (gu_tma, dn256, True), (gu4, dn4f, True))]


#: Rows per hit expert from which an fp8 point also times the warp-specialized Gluon kernels
#: (``kernel="ws"``, 128-row blocks): at 64 (qwen3 T=1024) they won once a consumer of 64
#: padding rows skipped its wgmma; at 32 (deepseek-v3 T=1024) they lost (RESULTS 2026-12-02
#: from 16:43 UTC).
FP8_WS_MIN_TPE = 64


def fp8_ws_candidates(num_slots: int, top_k: int, tokens: int,
                      hidden: int) -> list[ExpertsConfig]:
    """The ``kernel="ws"`` configs (``fp8_ws.py``) an fp8 point times as whole calls, at
    :data:`FP8_WS_MIN_TPE` rows per hit expert and more: the carried 128-column gate/up tile
    (256 weight rows, quantized in the epilogue) with the carried 256-column down tile (3 or
    4 stages, ``group_m`` 8 or 16, 3 gate/up stages) and with the promoted 128-column down
    tile, and the promoted 64-column gate/up tile (the intermediate quantized after) with
    either down, all with the padding halves computed (``skip_padding=False``); and the
    first and the first carried gate/up with the 128-column down again with them skipped;
    10 configs (the 256-column downs become 128 where ``hidden % 256``, then duplicates go).
    The winners of the same-run A/B of 2026-12-05 are among them. Off sm90 they time the
    grouped kernels with the same tiles (the fallback). Pure; host only."""
    pairs = tokens * top_k
    hit = min(num_slots, max(1, pairs))
    if pairs / hit < FP8_WS_MIN_TPE:
        return []
    G, D = GateUpConfig, DownConfig
    out: list[ExpertsConfig] = []
    for cols, gu_st, dn_cols, dn_st, gm in ((128, 4, 256, 3, 8), (128, 4, 256, 4, 8),
                                            (128, 3, 256, 3, 8), (128, 4, 256, 3, 16),
                                            (128, 4, 128, 4, 8), (128, 3, 128, 4, 8),
                                            (64, 4, 128, 4, 8), (64, 4, 256, 3, 8)):
        if hidden % dn_cols:
            dn_cols, dn_st = 128, 4
        cfg = ExpertsConfig(
            block_m=128, gate_up=G(block_n=cols, block_k=128, group_m=gm, num_warps=4,
                                   num_stages=gu_st),
            down=D(block_n=dn_cols, block_k=128, group_m=gm, num_warps=4, num_stages=dn_st),
            combine="reduce", kernel="ws")
        if cfg not in out:
            out.append(cfg)
    # the padding halves skipped, for the two forms the 64-rows-per-expert points shipped
    # with (where an expert's rows fit one block, a skipped half drifts no partner); one
    # form where an odd H made them the same
    down128 = next(c for c in out if (c.gate_up.block_n, c.down.block_n) == (128, 128))
    return out + [replace(c, skip_padding=True) for c in dict.fromkeys((out[0], down128))]


def _within(out: list[tuple], cap: int) -> list[CandidateSet]:
    """``[(block_m, gate_ups, [(down, combine)], *fp8_intermediate)]`` as candidate sets,
    the longest list trimmed from its end until the total fits ``cap - 1`` (one slot is the
    incumbent's); sets left without a gate/up or a down tile are dropped."""
    out = [list(o) for o in out]
    while sum(len(o[1]) + len(o[2]) for o in out) > cap - 1:
        o = max(out, key=lambda o: len(o[1]) + len(o[2]))
        if len(o[1]) >= len(o[2]):
            o[1] = o[1][:-1]
        else:
            o[2] = o[2][:-1]
    return [CandidateSet(block_m=o[0], gate_ups=tuple(o[1]),
                         downs=tuple(DownChoice(down=d, combine=c) for d, c in o[2]),
                         fp8_intermediate=bool(o[3]) if len(o) > 3 else False)
            for o in out if o[1] and o[2]]


def check_fp8_shape(shape: BenchShape) -> None:
    """ValueError unless ``shape``'s H and I are multiples of the fp8 scale group (128).

    Pure; host only."""
    if shape.hidden % FP8_GROUP or shape.intermediate % FP8_GROUP:
        raise ValueError(f"--shapes {shape.name}: H={shape.hidden} and I={shape.intermediate} "
                         f"must be multiples of {FP8_GROUP} for the fp8 kernels (--dtype fp8)")


def fp8_candidates(num_slots: int, top_k: int, hidden: int, inter: int,
                   tokens: int) -> list[CandidateSet]:
    """The fp8 search space of one point: what the H200 sweeps of 2026-12-01 searched
    (``benchmarks/fp8-sweep-h200-2026-12-01-run4.json``; their script was replaced by
    ``moerun tune --dtype fp8``), at most ``FP8_MAX_CONFIGS - 1`` configs.

    * ``block_m`` by rows per hit expert ``tpe``: 16 (``tpe <= 12``), 32 and 64 (``<= 40``),
      else 64 and 128;
    * every K tile is the scale group (128); every tile obeys the register rule
      :func:`~moerun.backends.triton.configs.fp8_tile_fits` (two accumulators for gate/up,
      one for down);
    * decode ``block_m`` (<= 32): gate/up 32/64/128 columns x 3/4 stages, 4 warps; down
      64/128 columns x split-K 1/2/4 (those dividing ``I/128``), 4 warps, 3 stages, atomic
      combine;
    * prefill ``block_m`` (>= ``FP8_PREQUANT_BLOCK_M``): gate/up 32/64/128 columns x 4/8
      warps of at least 64 x 64 outputs (64 rows only) and ``paired`` tiles of 128/256
      columns x 4/8 warps x 3/4 stages, down 64/128/256 columns x 4/8 warps of at least
      64 x 128, 2/3 stages, all ``group_m`` 8, reduce combine; the gate/up tiles after which
      the down GEMM reads fp8 (``configs.fp8_intermediate``: 128 columns, or paired) form
      their own set; at ``tpe >= FP8_WIDE_GROUP_TPE`` (the T=8192 cells) the paired tiles
      256 x 8 warps x 3 stages and 128 x 4 x 4, and the downs 256 x 8 and 128 x 4, also with
      ``group_m`` 16.

    Pure; host only.
    """
    G, D = GateUpConfig, DownConfig
    pairs = tokens * top_k
    hit = min(num_slots, pairs)
    tpe = pairs / hit
    bms = [16] if tpe <= 12 else ([32, 64] if tpe <= 40 else [64, 128])
    groups = inter // FP8_GROUP
    splits = [s for s in (1, 2, 4) if groups % s == 0]
    out: list[tuple] = []
    for bm in bms:
        if bm < FP8_PREQUANT_BLOCK_M:
            gus = [G(block_n=bn, block_k=FP8_GROUP, num_warps=4, num_stages=st)
                   for bn in (32, 64, 128) for st in (3, 4) if fp8_tile_fits(bm, bn, 4, 2)]
            dns = [(D(block_n=bn, block_k=FP8_GROUP, split_k=sk, num_warps=4, num_stages=3),
                    "atomic") for bn in (64, 128) for sk in splits if fp8_tile_fits(bm, bn, 4, 1)]
            out.append((bm, gus, dns, False))
            continue
        # two-accumulator tiles at 64 rows only: at 128 rows they lost every prefill cell
        # of the 2026-12-01 sweeps (run 4: mixtral T=8192 16.0 vs 10.5 ms)
        gus = [G(block_n=bn, block_k=FP8_GROUP, group_m=8, num_warps=w, num_stages=st)
               for bn in (32, 64, 128) for w in (4, 8)
               if bm < 128 and fp8_tile_fits(bm, bn, w, 2) and bm * bn >= 64 * 64
               for st in (2, 3)]
        gus += [G(block_n=bn, block_k=FP8_GROUP, group_m=8, num_warps=w, num_stages=st,
                  paired=True)
                for bn in (128, 256) for w in (4, 8)
                if fp8_tile_fits(bm, bn, w, 1) and bm * bn >= 64 * 128 for st in (3, 4)]
        dns = [(D(block_n=bn, block_k=FP8_GROUP, group_m=8, num_warps=w, num_stages=st),
                "reduce") for bn in (64, 128, 256) for w in (4, 8)
               if fp8_tile_fits(bm, bn, w, 1) and bm * bn >= 64 * 128 for st in (2, 3)]
        if tpe >= FP8_WIDE_GROUP_TPE:  # long prefill: a wider L2 group of the best tiles
            gus += [G(block_n=bn, block_k=FP8_GROUP, group_m=16, num_warps=w, num_stages=st,
                      paired=True) for bn, w, st in ((256, 8, 3), (128, 4, 4))
                    if fp8_tile_fits(bm, bn, w, 1) and bm * bn >= 64 * 128]
            dns += [(D(block_n=bn, block_k=FP8_GROUP, group_m=16, num_warps=w, num_stages=3),
                     "reduce") for bn, w in ((256, 8), (128, 4))
                    if fp8_tile_fits(bm, bn, w, 1) and bm * bn >= 64 * 128]
        for f8 in (True, False):  # one set per intermediate form (fp8_intermediate)
            mine = [g for g in gus if fp8_intermediate(bm, g) == f8]
            if mine:
                out.append((bm, mine, dns, f8))
    return _within(out, FP8_MAX_CONFIGS)


def point_mode(shape: BenchShape, tokens: int, graph_max_tokens: int) -> str:
    """The serving regime ``moerun bench`` times the cell in: ``"graph"`` for
    ``T <= graph_max_tokens`` unless the shape is eager-only, else ``"eager"``. Pure; host only."""
    return "eager" if shape.eager_only or tokens > graph_max_tokens else "graph"


def plan_points(shapes: list[BenchShape], tokens: list[int] | None, dtype: torch.dtype,
                device_name: str, config_dir: Path, graph_max_tokens: int = 1024
                ) -> list[TunePoint]:
    """Every point to tune, in order: each shape's own T list unless ``tokens`` is given.
    ``dtype`` :data:`FP8` plans the fp8 block-scaled kernels (:func:`fp8_candidates`, the
    fp8 heuristic as the default incumbent, ``..._float8_e4m3fn_<device>.json`` files; a
    shape whose H or I is not a multiple of 128 is a ValueError). Incumbents come from
    ``config_dir``'s file of the local shape (read only).

    Host only; reads the config files of ``config_dir``."""
    fp8 = dtype == FP8
    elt = torch.empty((), dtype=dtype).element_size()
    heuristic = fp8_default_config if fp8 else default_config
    points = []
    for shape in shapes:
        if fp8:
            check_fp8_shape(shape)
        name = config_file_name(shape.num_experts, shape.intermediate, shape.hidden, dtype,
                                device_name)
        entries = read_config_data(Path(config_dir) / name)["entries"]
        for t in (list(shape.tokens) if tokens is None else tokens):
            b = bucket_of(t)
            if str(b) in entries:
                inc = ExpertsConfig.from_json(entries[str(b)]["config"])
                source = f"tuned ({name})"
            else:
                inc = heuristic(shape.num_experts, shape.intermediate, shape.hidden, b,
                                shape.top_k)
                source = "heuristic"
            if fp8:
                sets = fp8_candidates(shape.num_experts, shape.top_k, shape.hidden,
                                      shape.intermediate, t)
                persistent = tuple(fp8_ws_candidates(shape.num_experts, shape.top_k, t,
                                                     shape.hidden))
            else:
                persistent = tuple(persistent_candidates(shape.num_experts, shape.top_k, t,
                                                         elt))
                sets = candidates(shape.num_experts, shape.top_k, shape.hidden,
                                  shape.intermediate, t, elt,
                                  cap=MAX_CONFIGS - len(persistent))
            direct = tuple(fp8_direct_candidates(t) if fp8 else direct_candidates(t))
            points.append(TunePoint(shape=shape, tokens=t, bucket=b,
                                    mode=point_mode(shape, t, graph_max_tokens), incumbent=inc,
                                    incumbent_source=source, candidate_sets=tuple(sets),
                                    file_name=name, persistent=persistent, direct=direct))
    return points


def compile_configs(point: TunePoint) -> list[ExpertsConfig]:
    """Every whole config a point may launch: the incumbent, each gate/up tile with the set's
    first down tile, each down tile with the first gate/up tile (the timed winner combines a
    timed gate/up and down tile; both were compiled through these), and the persistent
    and direct configs. Pure; host only."""
    out = [point.incumbent, *point.persistent, *point.direct]
    for cs in point.candidate_sets:
        first = cs.downs[0]
        out += [ExpertsConfig(block_m=cs.block_m, gate_up=g, down=first.down,
                              combine=first.combine) for g in cs.gate_ups]
        out += [ExpertsConfig(block_m=cs.block_m, gate_up=cs.gate_ups[0], down=d.down,
                              combine=d.combine) for d in cs.downs]
        if cs.swap_downs:  # the swap_ab kernels: each tile in its swapped form
            sg, sd = cs.swap_gate_ups, cs.swap_downs
            out += [ExpertsConfig(block_m=cs.block_m, gate_up=g, down=sd[0].down,
                                  combine=sd[0].combine, swap_ab=True) for g in sg]
            out += [ExpertsConfig(block_m=cs.block_m, gate_up=sg[0], down=d.down,
                                  combine=d.combine, swap_ab=True) for d in sd]
    return out
