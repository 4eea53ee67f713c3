"""The pieces both families of warp-specialized Gluon fp8 kernels share (``fp8_ws.py``, the
128-column tiles promoted per K step; ``fp8_ws_carry.py``, the 256-row weight tiles with a
carried accumulator): the persistent tile order, the TMA loader partition, the padding
consumer's stage release, the register split, and the host-side descriptor and SM count.

Legend as ``fp8_ws.py``. The loader and the consumers meet in a ring of ``STAGES``
shared-memory stages guarded by two mbarriers each (``ready``: the loader's TMA bytes
arrived; ``empty``: both consumers released the stage)."""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["LOAD_REGS", "MMA_REGS", "half_runs", "loader", "skip_steps",
           "stage_ring", "tile_of", "tma_desc"]

#: Registers per consumer thread (setmaxnreg) and per loader thread.
MMA_REGS = gl.constexpr(232)
LOAD_REGS = gl.constexpr(40)


@gluon.jit
def stage_ring(a_desc, b_desc, STAGES: gl.constexpr, B_ROWS: gl.constexpr):
    """The ring the loader and the two consumers share: per stage the block's two 64-row A
    halves and ``B_ROWS`` weight rows (K 128 each), and the ``ready`` (one TMA arrival) and
    ``empty`` (one release per consumer) mbarriers, initialised. Shared memory; returns
    ``(a_bufs, b_bufs, ready, empty)``.

    Device code (inlined into its caller's kernel); side effects: allocates shared memory,
    initialises the mbarriers."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, B_ROWS, 128], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    return a_bufs, b_bufs, ready, empty


@gluon.jit
def tile_of(t, grid_m, grid_n, GROUP_M: gl.constexpr):
    """Persistent tile ``t`` -> ``(pid_m, pid_n)``: ``GROUP_M`` blocks share each run over
    the N tiles, so their programs read the same weight tiles close in time (L2).

    Device code (inlined into its caller's kernel); pure."""
    width = GROUP_M * grid_n
    gid = t // width
    size = gl.minimum(grid_m - gid * GROUP_M, GROUP_M)
    return gid * GROUP_M + (t % size), (t % width) // size


@gluon.jit
def loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr, expert_ids_ptr,
           num_post_ptr, num_pairs, grid_n, k_tiles, n_rows_per_expert, up_offset,
           BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
           GATE_UP: gl.constexpr):
    """TMA producer: per tile one run over K, each K step the block's two A halves (the
    second only when it holds a pair) and the tile's weight rows (gate/up: BN gate rows and
    the BN up rows ``up_offset`` further; down: BN rows). Shared by the 128-column kernels
    here and the 256-column ones of ``fp8_ws_carry.py``.

    Device code (a warp-specialized partition of its caller's kernel); side effects: TMA copies
    into shared memory, mbarrier waits and arrivals."""
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    A_BYTES: gl.constexpr = a_desc.block_type.nbytes
    B_BYTES: gl.constexpr = (2 if GATE_UP else 1) * b_desc.block_type.nbytes
    FULL: gl.constexpr = 2 * A_BYTES + B_BYTES
    HALF_ONLY: gl.constexpr = A_BYTES + B_BYTES
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_of(t, grid_m, grid_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m)
        off_m = pid_m * BMC
        second = gl.load(sorted_ids_ptr + off_m + HALFC)
        live = second < num_pairs  # rows 64..127 hold a pair (they fill from row 0)
        dead = second >= num_pairs
        off_w = expert * n_rows_per_expert + pid_n * BN
        for i in range(k_tiles):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, FULL, pred=live)
            mbarrier.expect(bar, HALF_ONLY, pred=dead)
            tma.async_copy_global_to_shared(a_desc, [off_m, i * 128], bar, a_bufs.index(2 * s))
            tma.async_copy_global_to_shared(a_desc, [off_m + HALFC, i * 128], bar,
                                            a_bufs.index(2 * s + 1), pred=live)
            if GATE_UP:  # one [2 BN, 128] buffer per stage: gate rows, then up rows
                tma.async_copy_global_to_shared(b_desc, [off_w, i * 128], bar,
                                                b_bufs.index(s).slice(0, BN))
                tma.async_copy_global_to_shared(b_desc, [off_w + up_offset, i * 128], bar,
                                                b_bufs.index(s).slice(BN, BN))
            else:
                tma.async_copy_global_to_shared(b_desc, [off_w, i * 128], bar, b_bufs.index(s))
            c += 1


@gluon.jit
def half_runs(sorted_ids_ptr, off_m, num_pairs, EVERY_HALF: gl.constexpr):
    """Whether the consumer of the 64 aligned rows from ``off_m`` runs the tile's K loop:
    always with ``EVERY_HALF`` (``ExpertsConfig.skip_padding=False``: every tile then takes
    the same time, and the stores of an all-padding half land in rows nothing reads), else
    only when its first row holds a pair (rows fill from the block's row 0); a consumer that
    does not run releases the stages through :func:`skip_steps`.

    Device code (inlined into its caller's kernel); one scalar load."""
    return (gl.load(sorted_ids_ptr + off_m) < num_pairs) | EVERY_HALF


@gluon.jit
def skip_steps(ready, empty, c, steps, STAGES: gl.constexpr):
    """A consumer whose 64 rows are all padding, with ``skip_padding``: release ``steps``
    stages unread.

    Device code (inlined into its caller's kernel); side effects: mbarrier waits and arrivals."""
    for _ in range(steps):
        s = c % STAGES
        mbarrier.wait(ready.index(s), (c // STAGES) & 1)
        mbarrier.arrive(empty.index(s), count=1)
        c += 1
    return c


_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16,
              torch.float16: gl.float16}


@functools.cache
def _smem_layout(block: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """Triton's default NVMMA shared layout of a ``block`` box of ``dtype``: a pure function
    of its arguments, cached because computing it is most of a descriptor's host time (a ws
    call builds six descriptors)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])


def tma_desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor of the 2-D ``t`` (e4m3, bf16 or fp16) with box ``block`` and the
    default NVMMA swizzle; host only (the layout cached per box and dtype), passed to the
    kernels by value."""
    return TensorDescriptor.from_tensor(t, block, _smem_layout(tuple(block), t.dtype))

