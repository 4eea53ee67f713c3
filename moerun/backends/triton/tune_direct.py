"""The direct decode path's tune space (``kernel="direct"``: no alignment, two launches; the
bf16/fp16 kernels of ``gate_up.py`` / ``down.py`` and the fp8 ones of ``fp8_direct.py``),
with its ``swap_ab`` copies, and which grouped tiles get a ``swap_ab`` form
(:func:`swap_eligible`). ``tune_plan.py`` adds the direct configs to the decode points of at
most :data:`DIRECT_MAX_TOKENS` rows and re-exports these names. Pure host code (no triton,
no GPU).
"""

from __future__ import annotations

from dataclasses import replace

from moerun.backends.triton.config_types import DownConfig, ExpertsConfig, GateUpConfig
from moerun.backends.triton.configs import FP8_GROUP

__all__ = ["DIRECT_MAX_TOKENS", "SWAP_MAX_BLOCK_M", "SWAP_MIN_ROWS", "direct_candidates",
           "fp8_direct_candidates", "swap_eligible", "swapped"]

#: Largest T whose point also times the direct (no-alignment) configs: every (token, j)
#: pair streams its expert's weights on its own, so past a few tokens the grouped kernels'
#: one block per hit expert reads less.
DIRECT_MAX_TOKENS = 4  # also the bound of TritonExperts.workspace_bytes


def direct_candidates(tokens: int) -> list[ExpertsConfig]:
    """The direct decode configs (``kernel="direct"``: no alignment, two launches) a point
    of at most :data:`DIRECT_MAX_TOKENS` rows times as whole calls: gate/up tiles of 16-128
    columns and 64-256-wide K steps (``K * I / BN`` programs) by the per-token down
    (``combine="reduce"``: tiles of 16-64 columns, ``T * H / BN`` programs each streaming
    its token's K experts) and the per-pair down (``"atomic"``: 64-128 columns,
    ``T * K * H / BN`` programs), 4 warps; 42 configs (6 gate/up x 7 down), and the 8 of
    them whose tiles both have 64 or more weight rows again with ``swap_ab`` (wgmmas, the
    weight rows on M; :func:`swapped`): 50. Pure; host only."""
    if tokens > DIRECT_MAX_TOKENS:
        return []
    G, D = GateUpConfig, DownConfig
    gate_ups = (G(block_n=32, block_k=128, num_stages=4), G(block_n=64, block_k=128, num_stages=4),
                G(block_n=128, block_k=64, num_stages=4),
                # 256-wide K steps: the grouped decode tile n32k256 streamed qwen3-235b's
                # T=16 gate/up at its floor, n32k128 its T=1 at 0.88 (2026-12-02 breakdown)
                G(block_n=32, block_k=256, num_stages=3), G(block_n=32, block_k=256, num_stages=2),
                G(block_n=16, block_k=256, num_stages=4))
    per_token = (D(block_n=16, block_k=256, num_stages=4),
                 D(block_n=32, block_k=128, num_stages=4),
                 D(block_n=32, block_k=256, num_stages=4),
                 D(block_n=64, block_k=128, num_stages=4))
    per_pair = (D(block_n=64, block_k=128, num_stages=4), D(block_n=64, block_k=256, num_stages=3),
                D(block_n=128, block_k=128, num_stages=3))
    return swapped([ExpertsConfig(block_m=16, gate_up=g, down=d, combine=combine,
                                  kernel="direct")
                    for combine, downs in (("reduce", per_token), ("atomic", per_pair))
                    for g in gate_ups for d in downs])


#: Fewest weight rows a direct tile needs for ``swap_ab`` to run wgmmas (M = 64 a warp group).
SWAP_MIN_ROWS = 64


#: Largest token tile (``block_m``) of the grouped kernels' ``swap_ab`` form: from 64 rows on
#: their ``x W^T`` tiles run wgmmas already.
SWAP_MAX_BLOCK_M = 32


def swap_eligible(block_m: int, block_n: int, paired: bool = False) -> bool:
    """Whether a grouped tile of ``block_n`` weight rows at ``block_m`` token rows gains a
    ``swap_ab`` form worth timing: the token tile at most :data:`SWAP_MAX_BLOCK_M`, the
    weight tile at least :data:`SWAP_MIN_ROWS`, not a paired fp8 gate/up tile (one product
    form only). Pure."""
    return block_m <= SWAP_MAX_BLOCK_M and block_n >= SWAP_MIN_ROWS and not paired


def swapped(configs: list[ExpertsConfig]) -> list[ExpertsConfig]:
    """``configs`` followed by the ``swap_ab=True`` copies of those whose gate/up and down
    tiles both qualify (:func:`swap_eligible`: at least :data:`SWAP_MIN_ROWS` weight rows; a
    narrower tile's ``W x^T`` still runs ``mma.sync``, with more conversions than ``x W^T``
    in the sm90 build of the fp8 gate/up:
    ``benchmarks/experiments/fp8-swap-2026-12-06/compile_swap.py``). Pure; host only."""
    return configs + [replace(c, swap_ab=True) for c in configs
                      if swap_eligible(c.block_m, c.gate_up.block_n, c.gate_up.paired)
                      and swap_eligible(c.block_m, c.down.block_n)]


def fp8_direct_candidates(tokens: int) -> list[ExpertsConfig]:
    """The fp8 direct decode configs (``fp8_direct.py``) a point of at most
    :data:`DIRECT_MAX_TOKENS` rows times as whole calls: gate/up tiles of 32-128 columns by
    the per-token down (``"reduce"``: 16-64 columns) and the per-pair down (``"atomic"``:
    64-128 columns); ``block_k`` is the 128-column group; 4 warps; 15 configs, and the 6 of
    them with 64 or more weight rows in both tiles again with ``swap_ab`` (e4m3 wgmmas
    instead of fp16 ``mma.sync`` on converted weights; :func:`swapped`): 21. Pure; host
    only."""
    if tokens > DIRECT_MAX_TOKENS:
        return []
    G, D = GateUpConfig, DownConfig
    gate_ups = (G(block_n=32, block_k=FP8_GROUP, num_stages=4),
                G(block_n=64, block_k=FP8_GROUP, num_stages=4),
                G(block_n=128, block_k=FP8_GROUP, num_stages=3))
    per_token = (D(block_n=16, block_k=FP8_GROUP, num_stages=4),
                 D(block_n=32, block_k=FP8_GROUP, num_stages=4),
                 D(block_n=64, block_k=FP8_GROUP, num_stages=4))
    per_pair = (D(block_n=64, block_k=FP8_GROUP, num_stages=4),
                D(block_n=128, block_k=FP8_GROUP, num_stages=3))
    return swapped([ExpertsConfig(block_m=16, gate_up=g, down=d, combine=combine,
                                  kernel="direct")
                    for combine, downs in (("reduce", per_token), ("atomic", per_pair))
                    for g in gate_ups for d in downs])
