"""Feasibility spike (CPU, offline sm90 build; no GPU): can the carried fp8 gate/up kernel
(``moerun/backends/triton/fp8_ws_carry.py``) run THREE consumer warp groups, a 192-row block
by 256 weight rows, within the register file and shared memory?

Why ask: a 192 x 256 CTA tile reads 56 KB from L2 per 128-K step for 12.6 MFLOP, 36.5 B per
tensor-cycle at the fp8 rate against the 128 x 256 tile's 47 (22 % fewer L2 bytes per FLOP),
and the 2026-12-05 counters put the ws kernels' L2 at 74-88 % of its peak (README here).
The kernel below is the shipped carried gate/up with the block cut in three 64-row thirds:
the loader copies three A parts per stage, consumer ``W`` (0-2) owns rows ``64 W ..``, and
``empty`` counts three releases. It is built, not run: it answers how many registers each
consumer needs against the ``65536 / 416``-thread budget (13 warps), whether anything
spills, and how many stages fit.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-192rows-2026-12-05/spike.py

(from the project root: it imports ``tests.sm90`` and ``tests/test_fp8_ws_compile.py``).
"""

from __future__ import annotations

import re
import sys
import tempfile

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moerun.backends.triton.fp8_ws_carry import EPS, QMAX, _round_to
from moerun.backends.triton.fp8_ws_parts import skip_steps, tile_of, tma_desc

HALFC = gl.constexpr(64)
PARTS = gl.constexpr(3)
BMC = gl.constexpr(192)


@gluon.jit
def ring3(a_desc, b_desc, STAGES: gl.constexpr, B_ROWS: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [PARTS * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, B_ROWS, 128], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=PARTS)
    return a_bufs, b_bufs, ready, empty


@gluon.jit
def loader3(a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr, expert_ids_ptr,
            num_post_ptr, num_pairs, grid_n, k_tiles, n_rows_per_expert, up_offset,
            BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    A_BYTES: gl.constexpr = a_desc.block_type.nbytes
    B_BYTES: gl.constexpr = 2 * b_desc.block_type.nbytes
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_of(t, grid_m, grid_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m)
        off_m = pid_m * BMC
        second = gl.load(sorted_ids_ptr + off_m + HALFC)
        third = gl.load(sorted_ids_ptr + off_m + 2 * HALFC)
        live1 = second < num_pairs  # rows fill from row 0: live2 implies live1
        live2 = third < num_pairs
        one = second >= num_pairs
        two = live1 & (third >= num_pairs)
        off_w = expert * n_rows_per_expert + pid_n * BN
        for i in range(k_tiles):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, A_BYTES + B_BYTES, pred=one)
            mbarrier.expect(bar, 2 * A_BYTES + B_BYTES, pred=two)
            mbarrier.expect(bar, 3 * A_BYTES + B_BYTES, pred=live2)
            tma.async_copy_global_to_shared(a_desc, [off_m, i * 128], bar,
                                            a_bufs.index(PARTS * s))
            tma.async_copy_global_to_shared(a_desc, [off_m + HALFC, i * 128], bar,
                                            a_bufs.index(PARTS * s + 1), pred=live1)
            tma.async_copy_global_to_shared(a_desc, [off_m + 2 * HALFC, i * 128], bar,
                                            a_bufs.index(PARTS * s + 2), pred=live2)
            tma.async_copy_global_to_shared(b_desc, [off_w, i * 128], bar,
                                            b_bufs.index(s).slice(0, BN))
            tma.async_copy_global_to_shared(b_desc, [off_w + up_offset, i * 128], bar,
                                            b_bufs.index(s).slice(BN, BN))
            c += 1


@gluon.jit
def consumer3(args, W: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
              MID: gl.constexpr):
    (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, qs_ptr, sorted_ids_ptr,
     expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, stride_as, stride_wse,
     stride_wsn, stride_qs, inter_blocks) = args
    BN: gl.constexpr = 128
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 2 * BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_of(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        if gl.load(sorted_ids_ptr + off_m) < num_pairs:
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            rows = (off_m + gl.arange(0, HALFC, rows_l)).to(gl.int64)
            gs_p = ws_ptr + expert * stride_wse + pid_n * stride_wsn
            acc = gl.zeros([HALFC, 2 * BN], gl.float32, mma)
            # the shipped K loop reads A part W of stage s as a_bufs[2 s + W]; with three
            # parts per stage it is 3 s + W (_carried_k_loop3 below)
            acc, c = _carried_k_loop3(a_bufs, b_bufs, ready, empty, acc, c,
                                      as_ptr + rows * stride_as, gs_p,
                                      gs_p + inter_blocks * stride_wsn, k_tiles, BN, W, STAGES)
            g, u = gl.split(gl.permute(gl.reshape(acc, [HALFC, 2, BN]), [0, 2, 1]))
            act = _round_to(g / (1.0 + gl.exp(-g)) * u, MID)
            scale = gl.maximum(gl.max(gl.abs(act), axis=1), EPS) / QMAX
            q = gl.minimum(gl.maximum(act / gl.expand_dims(scale, 1), -QMAX), QMAX)
            tma.store_wait(pendings=0)
            c_bufs.index(W).store(q.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [off_m, pid_n * BN], c_bufs.index(W))
            srows = (off_m + gl.arange(0, HALFC, scale.type.layout)).to(gl.int64)
            gl.store(qs_ptr + srows * stride_qs + pid_n, scale)
        else:
            c = skip_steps(ready, empty, c, k_tiles, STAGES)
    tma.store_wait(pendings=0)


_FLOOR = gl.constexpr(1e-30)


@gluon.jit
def _carried_k_loop3(a_bufs, b_bufs, ready, empty, acc, c, sa_p, s0_p, s1_p, k_tiles,
                     LO: gl.constexpr, W: gl.constexpr, STAGES: gl.constexpr):
    """``fp8_ws_carry._carried_k_loop`` (no routing weight) with three A parts per stage."""
    cols = gl.arange(0, 2 * LO, gl.SliceLayout(0, acc.type.layout))
    lo = gl.expand_dims(cols < LO, 0)
    sa = gl.load(sa_p)
    s0 = gl.load(s0_p)
    s1 = gl.load(s1_p)
    p0 = gl.maximum(sa * s0, _FLOOR)
    p1 = gl.maximum(sa * s1, _FLOOR)
    for i in range(k_tiles):
        s = c % STAGES
        c0 = gl.maximum(sa * s0, _FLOOR)
        c1 = gl.maximum(sa * s1, _FLOOR)
        nxt = gl.minimum(i + 1, k_tiles - 1)
        sa = gl.load(sa_p + nxt)
        s0 = gl.load(s0_p + nxt)
        s1 = gl.load(s1_p + nxt)
        acc = acc * gl.where(lo, gl.expand_dims(p0 / c0, 1), gl.expand_dims(p1 / c1, 1))
        mbarrier.wait(ready.index(s), (c // STAGES) & 1)
        a = a_bufs.index(PARTS * s + W)
        b = b_bufs.index(s).permute((1, 0))
        acc = warpgroup_mma(a, b, acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a, b))
        mbarrier.arrive(empty.index(s), count=1)
        p0 = c0
        p1 = c1
        c += 1
    return acc * gl.where(lo, gl.expand_dims(p0, 1), gl.expand_dims(p1, 1)), c


@gluon.jit
def gate_up_192_kernel(a_desc, b_desc, c_desc, as_ptr, ws_ptr, qs_ptr, sorted_ids_ptr,
                       expert_ids_ptr, num_post_ptr, num_pairs, inter, hidden, stride_as,
                       stride_wse, stride_wsn, stride_qs, STAGES: gl.constexpr,
                       GROUP_M: gl.constexpr, MID: gl.constexpr, MMA_R: gl.constexpr,
                       LOAD_R: gl.constexpr):
    BN: gl.constexpr = 128
    a_bufs, b_bufs, ready, empty = ring3(a_desc, b_desc, STAGES, 2 * BN)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [PARTS, 64, BN], c_desc.layout)
    grid_n = inter // BN
    k_tiles = hidden // 128
    inter_blocks = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    WG2: gl.constexpr = 2
    args = (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, qs_ptr,
            sorted_ids_ptr, expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles,
            stride_as, stride_wse, stride_wsn, stride_qs, inter_blocks)
    gl.warp_specialize([
        (consumer3, (args, WG0, STAGES, GROUP_M, MID)),
        (consumer3, (args, WG1, STAGES, GROUP_M, MID)),
        (consumer3, (args, WG2, STAGES, GROUP_M, MID)),
        (loader3, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                   expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, 2 * inter, inter,
                   BN, STAGES, GROUP_M)),
    ], [4, 4, 1], [MMA_R, MMA_R, LOAD_R])


def build(stages: int, mma_regs: int, load_regs: int, maxnreg: int | None = None):
    from tests.sm90 import compile_sm90

    f8 = torch.float8_e4m3fn
    s, h, inter, r = 8, 1024, 512, 1536

    def codes(*size):
        return torch.empty(*size, dtype=torch.uint8).view(f8)

    a, qa, w13 = codes(r, h), codes(r, inter), codes(s * 2 * inter, h)
    args = (tma_desc(a, [64, 128]), tma_desc(w13, [128, 128]), tma_desc(qa, [64, 128]),
            torch.empty(r, h // 128), torch.empty(s, 2 * inter // 128, h // 128),
            torch.empty(r, inter // 128), torch.empty(r, dtype=torch.int32),
            torch.empty(r // 192, dtype=torch.int32), torch.empty(1, dtype=torch.int32),
            r, inter, h, h // 128, (2 * inter // 128) * (h // 128), h // 128, inter // 128,
            stages, 8, 2, mma_regs, load_regs)
    return compile_sm90(gate_up_192_kernel, args, maxnreg=maxnreg)


def main() -> None:
    sys.path.insert(0, "tests")
    import test_fp8_ws_compile as shipped
    from tests.sm90 import compile_sm90, ptxas_report

    k = compile_sm90(*shipped._build("carried_gate_up", 4))
    print("shipped carried gate/up (2 consumers + loader, 9 warps):",
          re.findall(r"\.maxnreg\s+\d+", k.asm["ptx"]), "launch warps", k.metadata.num_warps)
    for stages, mma_regs, load_regs, maxnreg in ((3, 160, 40, None), (3, 160, 24, None),
                                                 (2, 160, 40, None), (3, 160, 24, 152)):
        form = f"stages={stages} setmaxnreg={mma_regs}/{load_regs} maxnreg={maxnreg}"
        try:
            k = build(stages, mma_regs, load_regs, maxnreg)
        except Exception as e:  # noqa: BLE001 -- a form that does not build is the finding
            fatal = re.search(r"ptxas fatal\s*:\s*(\([^)]*\)[^\n]*)", str(e))
            print(f"{form}: does not build: "
                  f"{fatal.group(1) if fatal else str(e).splitlines()[0][:200]}")
            continue
        ptx = k.asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            regs, spills = ptxas_report(ptx, tmp)
        print(f"{form}: builds; shared {k.metadata.shared} B (limit 232448), ptxas {regs} "
              f"registers, {spills} spill bytes, launch warps {k.metadata.num_warps}")


if __name__ == "__main__":
    main()
