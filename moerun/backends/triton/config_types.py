"""The configuration dataclasses of :class:`TritonExperts`' kernels: one GEMM tile each
(:class:`GateUpConfig`, :class:`DownConfig`) and one T bucket's whole choice
(:class:`ExpertsConfig`: rows per block, both tiles, combine, kernel family), with their
validation and their JSON form. ``configs.py`` holds the buckets, the heuristic and the
tuned-file lookup that produce them. Pure host data: no torch, no triton.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["GateUpConfig", "DownConfig", "ExpertsConfig", "WS_MAX_STAGES"]

#: ``kernel="ws"``: shared-memory stages at most, by weight rows per stage. A 256-row stage
#: (gate/up 128 columns, down 256) is 48 KB, so 4 stages and the epilogue buffers take
#: 208-224 KB of the 227 KB and a fifth does not fit. A 128-row stage is 32 KB: 6 would fit
#: (213 / 230 KB for the promoted gate/up / down, sm90 compile, tests/test_fp8_ws_compile.py);
#: 5 is the most any tuned or timed ws config has used.
WS_MAX_STAGES = {128: 5, 256: 4}


@dataclass(frozen=True, kw_only=True)
class GateUpConfig:
    """Tile of the gate/up grouped GEMM: ``BLOCK_N`` output columns of gate *and* of up
    (with ``paired``: ``BLOCK_N`` columns of gate and up together)."""

    block_n: int
    block_k: int
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 4
    #: fp8 kernels only (``fp8.py``): gate and up rows interleaved in ONE dot of ``block_n``
    #: weight rows (``block_n / 2`` gate columns and the matching up columns), so a tile
    #: writes ``block_n / 2`` intermediate columns, in the activation dtype, and one launch
    #: quantizes them before the down GEMM. One accumulator instead of two: the 128-row
    #: tiles fit the registers (:func:`fp8_tile_fits` with one accumulator).
    paired: bool = False
    #: persistent kernel only (``ExpertsConfig.kernel == "persistent"``): ``tl.range`` knobs
    #: of the tile loop (``warp_specialize=True`` is refused, see ``ExpertsConfig``), and
    #: ``a_tma`` -- gather ``x`` into aligned order first so the A operand goes through TMA
    #: too (else A rows are gathered by pointer)
    flatten: bool = False
    warp_specialize: bool = False
    a_tma: bool = False

    def smem_bytes(self, block_m: int, elt: int) -> int:
        """Shared memory of the gate/up pipeline's stages at ``elt`` bytes per element.
        Pure."""
        b_rows = self.block_n if self.paired else 2 * self.block_n
        return self.num_stages * (block_m * self.block_k + b_rows * self.block_k) * elt


@dataclass(frozen=True, kw_only=True)
class DownConfig:
    """Tile of the down grouped GEMM; ``split_k > 1`` splits the ``I`` reduction (atomic)."""

    block_n: int
    block_k: int
    group_m: int = 1
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    #: persistent kernel only: ``tl.range`` knobs of the tile loop (``warp_specialize=True``
    #: is refused, see ``ExpertsConfig``)
    flatten: bool = False
    warp_specialize: bool = False

    def smem_bytes(self, block_m: int, elt: int) -> int:
        """Shared memory of the down pipeline's stages at ``elt`` bytes per element. Pure."""
        return self.num_stages * (block_m * self.block_k + self.block_n * self.block_k) * elt


@dataclass(frozen=True, kw_only=True)
class ExpertsConfig:
    """One bucket's choice.

    Fields:
        block_m: rows per expert block; the alignment pads each expert to a multiple of it.
        gate_up / down: the two GEMM tiles.
        combine: ``"atomic"`` -- the down kernel adds ``w * y`` into a zeroed fp32 ``[M, H]``
            (zeroed inside the alignment launch), then one cast; or ``"reduce"`` -- the down
            kernel writes ``w * y`` as ``[M*K, H]`` rows and a sum kernel adds the K rows.
            ``down.split_k > 1`` forces ``"atomic"``.
        kernel: ``"grouped"`` -- one program per (block, N tile), ``gate_up.py`` / ``down.py``
            (every bucket before issue 11, and the default); ``"persistent"`` -- the
            persistent TMA kernels of ``persistent.py`` for compute-bound buckets (needs
            ``combine="reduce"``, ``split_k == 1``; falls back to ``"grouped"`` for calls TMA
            cannot take, e.g. unaligned strides or the fused shared expert, logged once).
            ``"direct"`` -- the decode path for a few tokens: no alignment, two launches
            (``gate_up.gate_up_direct``: one 16-row tile per (token, j) pair, the routing
            weight in its epilogue; ``down.down_direct``, written in x.dtype: with
            ``combine="reduce"`` one program per (N tile, token) sums the token's K pairs
            in one loop, with ``"atomic"`` one program per (N tile, pair) and the K-th
            arrival sums the partials). Needs ``block_m=16`` and ``down.split_k == 1``;
            the grouped fallback (the fused shared expert) uses the same tiles and
            ``combine``.
            ``"ws"`` -- fp8 files only: the warp-specialized Gluon kernels of ``fp8_ws.py``
            for compute-bound buckets on sm90 (needs ``block_m=128``, ``combine="reduce"``,
            ``gate_up.block_n`` 64 or 128 -- the intermediate columns per tile: 64 promotes
            each K step and quantizes the intermediate after, 128 reads 256 weight rows into
            one carried accumulator (``fp8_ws_carry.py``) and quantizes in the epilogue --,
            ``down.block_n`` 128 or 256 (256: carried, needs ``H % 256 == 0``),
            ``block_k=128``, ``split_k=1``, unpaired, at most 4 stages with a 256-row weight
            tile (5 otherwise); the tiles' ``num_stages`` and ``gate_up.group_m`` are the
            kernels' knobs). Elsewhere (not sm90, fp32 out, weights or scales not contiguous)
            the grouped fp8 kernels run the same tiles.
        programs: persistent programs per launch (0: the device's SM count); only with
            ``kernel="persistent"``.
        tail_split: only with ``kernel="persistent"``: the tiles of each launch's last,
            partly filled round are cut along K over the idle programs (up to 4 parts a
            tile, ``tail_split.py``; decided on the device from the tiles in use), so that
            round takes a fraction of a tile-time instead of a whole one.
        skip_padding: only with ``kernel="ws"``: a consumer warp group whose 64 rows of a
            block are all padding skips the tile's K loop (True), or runs it like a live one
            and writes padding rows nothing reads (False, the default). Running it keeps
            every tile of a launch the same length, so the programs that share a weight tile
            stay in step and read it from L2 (docs/DECISIONS.md, "The ws consumers compute
            padding halves"); skipping pays where an expert's rows fit one block.
        swap_ab: both GEMMs compute ``W x^T`` (a tile's weight rows on the MMA's M side,
            the 16- or 32-row token tile on N), so on sm90 a tile of 64 or 128 weight rows
            runs wgmmas -- for fp8 the e4m3 ones, where the ``x W^T`` form's 16-row tile
            converts every weight to fp16 for ``mma.sync``. With ``kernel="direct"``, or
            ``"grouped"`` at ``block_m`` 16 or 32 with an unpaired gate/up tile (at 64 rows
            and more the grouped tiles run wgmmas already).
    """

    block_m: int
    gate_up: GateUpConfig
    down: DownConfig
    combine: str = "reduce"
    kernel: str = "grouped"
    programs: int = 0
    skip_padding: bool = False
    tail_split: bool = False
    swap_ab: bool = False

    def __post_init__(self):
        if self.block_m not in (16, 32, 64, 128, 256):
            raise ValueError(f"ExpertsConfig.block_m={self.block_m!r}: use 16, 32, 64, 128 or 256")
        if self.combine not in ("atomic", "reduce"):
            raise ValueError(f"ExpertsConfig.combine={self.combine!r}: use 'atomic' or 'reduce'")
        if self.down.split_k > 1 and self.combine != "atomic":
            raise ValueError("ExpertsConfig: down.split_k > 1 needs combine='atomic'")
        if self.kernel not in ("grouped", "persistent", "direct", "ws"):
            raise ValueError(f"ExpertsConfig.kernel={self.kernel!r}: use 'grouped', "
                             "'persistent', 'direct' or 'ws' (fp8 only)")
        if self.kernel == "ws" and (
                self.block_m != 128 or self.combine != "reduce" or self.gate_up.paired
                or self.gate_up.block_n not in (64, 128) or self.gate_up.block_k != 128
                or self.down.block_n not in (128, 256)
                or (self.down.block_k, self.down.split_k) != (128, 1)
                or self.gate_up.num_stages > WS_MAX_STAGES[2 * self.gate_up.block_n]
                or self.down.num_stages > WS_MAX_STAGES[self.down.block_n]):
            raise ValueError("ExpertsConfig: kernel='ws' needs block_m=128, combine='reduce', "
                             "an unpaired gate/up tile of block_n=64 or 128, block_k=128 and a "
                             "down tile of block_n=128 or 256, block_k=128, split_k=1, with "
                             "at most 4 stages for a 256-row weight tile (gate/up 128, down "
                             "256) and 5 otherwise")
        if self.kernel == "direct" and (self.block_m != 16 or self.down.split_k != 1
                                        or self.gate_up.paired):
            raise ValueError("ExpertsConfig: kernel='direct' needs block_m=16, "
                             "down.split_k=1 and an unpaired gate/up tile")
        if self.kernel == "persistent" and self.combine != "reduce":
            raise ValueError("ExpertsConfig: kernel='persistent' needs combine='reduce' (its "
                             "down kernel writes per-pair rows)")
        if self.kernel == "persistent" and self.gate_up.paired:
            raise ValueError("ExpertsConfig: gate_up.paired is a tile of the grouped fp8 "
                             "kernels; kernel='persistent' has no paired form")
        if self.gate_up.warp_specialize or self.down.warp_specialize:
            raise ValueError("ExpertsConfig: warp_specialize=True is refused: Triton 3.6 on "
                             "sm90 gives wrong results for it (docs/DECISIONS.md, 'No warp "
                             "specialization'); leave it False")
        if self.skip_padding and self.kernel != "ws":
            raise ValueError("ExpertsConfig.skip_padding=True is a knob of kernel='ws' (the "
                             "fp8 Gluon kernels); leave it False for other kernels")
        if self.tail_split not in (False, True) or (self.tail_split
                                                    and self.kernel != "persistent"):
            raise ValueError(f"ExpertsConfig.tail_split={self.tail_split!r}: a bool, True only "
                             "with kernel='persistent'")
        if self.swap_ab not in (False, True) or (self.swap_ab and not (
                self.kernel == "direct" or (self.kernel == "grouped" and self.block_m <= 32
                                            and not self.gate_up.paired))):
            raise ValueError(f"ExpertsConfig.swap_ab={self.swap_ab!r}: a bool, True only "
                             "with kernel='direct', or kernel='grouped' at block_m 16 or 32 "
                             "with an unpaired gate/up tile")
        if self.programs < 0 or (self.programs and self.kernel != "persistent"):
            raise ValueError(f"ExpertsConfig.programs={self.programs!r}: >= 0, and only with "
                             "kernel='persistent'")

    def to_json(self) -> dict:
        """A JSON-able dict; the persistent-only and fp8-only fields appear only when not at
        their defaults, so a grouped config writes exactly what files before them held.
        Pure."""
        d = dataclasses.asdict(self)
        for part, cls in (("gate_up", GateUpConfig), ("down", DownConfig)):
            for f in _OPTIONAL_FIELDS:
                if f in d[part] and d[part][f] == _field_default(cls, f):
                    del d[part][f]
        for f in ("kernel", "programs", "skip_padding", "tail_split", "swap_ab"):
            if d[f] == _field_default(ExpertsConfig, f):
                del d[f]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ExpertsConfig":
        """Inverse of :meth:`to_json`; files without ``kernel`` / ``programs`` (every file
        before issue 11 item 1) load as the grouped kernels. Pure (validates, as
        ``__init__`` does)."""
        return cls(block_m=int(d["block_m"]), gate_up=GateUpConfig(**d["gate_up"]),
                   down=DownConfig(**d["down"]), combine=d.get("combine", "reduce"),
                   kernel=d.get("kernel", "grouped"), programs=int(d.get("programs", 0)),
                   skip_padding=bool(d.get("skip_padding", False)),
                   tail_split=bool(d.get("tail_split", False)),
                   swap_ab=bool(d.get("swap_ab", False)))

    def key(self) -> str:
        """A short stable name (for tables and logs). Pure."""
        g, d = self.gate_up, self.down
        key = (f"m{self.block_m}|gu n{g.block_n}k{g.block_k}g{g.group_m}w{g.num_warps}"
               f"s{g.num_stages}{'P' if g.paired else ''}|dn n{d.block_n}k{d.block_k}"
               f"g{d.group_m}x{d.split_k}w{d.num_warps}s{d.num_stages}|{self.combine}")
        if self.swap_ab and self.kernel == "grouped":
            key += "|swap"
        if self.kernel == "persistent":
            def flags(c):
                return "".join(ch for ch, on in (("F", c.flatten),
                                                 ("A", getattr(c, "a_tma", False))) if on)
            key += f"|persistent p{self.programs} gu{flags(g) or '-'} dn{flags(d) or '-'}"
            if self.tail_split:
                key += " tail"
        elif self.kernel in ("direct", "ws"):
            key += f"|{self.kernel}{' skip' if self.skip_padding else ''}"
            key += " swap" if self.swap_ab else ""
        return key


_OPTIONAL_FIELDS = ("flatten", "warp_specialize", "a_tma", "paired")


def _field_default(cls, name: str):
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)
