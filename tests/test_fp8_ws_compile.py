"""The Gluon fp8 ws kernels (``fp8_ws.py``, ``fp8_ws_carry.py``) compiled for sm90 on the CPU
with Triton's own ptxas: every form a config can select builds, fits an H100/H200 block's
shared memory, spills no register and issues the wgmma shape its tile needs. One stage past
``config_types.WS_MAX_STAGES`` of the 256-row tiles (and the carried down's full store at 4
stages, which the run function splits) does not fit; the 128-row cap leaves one stage of
room. So a kernel edit made where no GPU is at hand is checked this far on every CI run;
``test_fp8_ws.py``'s GPU tests run the kernels. The compile goes through Triton 3.6's
compiler entry points (the dev extra pins that version); ``fp8_ws_parts.tma_desc``'s
descriptors are checked against Triton's own constructors at the end."""

from __future__ import annotations

import re

import pytest
import torch

gluon = pytest.importorskip("triton.experimental.gluon")

from tests.sm90 import compile_sm90, ptxas_report  # noqa: E402

#: ``cudaDevAttrMaxSharedMemoryPerBlockOptin`` of an H100 / H200 (227 KB).
HOPPER_SMEM = 232448

F8 = torch.float8_e4m3fn
S, H, INTER, R, P = 8, 1024, 512, 1024, 512  # sizes only shape the descriptors


def _codes(*size):
    return torch.empty(*size, dtype=torch.uint8).view(F8)


def _build(form: str, stages: int):
    """(kernel, launch arguments) of one ws form at ``stages``, as run_experts_fp8_ws builds
    them (descriptor boxes included)."""
    from moerun.backends.triton import fp8_ws as ws
    from moerun.backends.triton import fp8_ws_carry as cw
    from moerun.backends.triton.fp8_ws_parts import tma_desc as d

    a, qa = _codes(R, H), _codes(R, INTER)
    w13, w2 = _codes(S * 2 * INTER, H), _codes(S * H, INTER)
    a_s, qa_s = torch.empty(R, H // 128), torch.empty(R, INTER // 128)
    s13 = torch.empty(S, 2 * INTER // 128, H // 128)
    s2 = torch.empty(S, H // 128, INTER // 128)
    ids = torch.empty(R, dtype=torch.int32)
    y = torch.empty(R, H, dtype=torch.bfloat16)
    act = torch.empty(R, INTER, dtype=torch.bfloat16)
    w = torch.empty(P)
    if form == "promoted_gate_up":
        return ws._gate_up_kernel, (
            d(a, [64, 128]), d(w13, [64, 128]), d(act, [64, 64]), a_s, s13, ids, ids, ids, P,
            INTER, H, a_s.stride(0), s13.stride(0), s13.stride(1), 64, stages, 8)
    if form == "promoted_down":
        return ws._down_kernel, (
            d(qa, [64, 128]), d(w2, [128, 128]), d(y, [64, 128]), w, ids, qa_s, s2, ids, ids,
            H, INTER, qa_s.stride(0), s2.stride(0), s2.stride(1), P, 128, stages, 8)
    if form == "carried_gate_up":
        return cw.gate_up_carry_kernel, (
            d(a, [64, 128]), d(w13, [128, 128]), d(qa, [64, 128]), a_s, s13, qa_s, ids, ids, ids,
            P, INTER, H, a_s.stride(0), s13.stride(0), s13.stride(1), qa_s.stride(0), stages,
            8, 2)
    split = form == "carried_down_split"
    return cw.down_carry_kernel, (
        d(qa, [64, 128]), d(w2, [256, 128]), d(y, [64, 128 if split else 256]), w, ids, qa_s,
        s2, ids, ids, H, INTER, qa_s.stride(0), s2.stride(0), s2.stride(1), P, stages, 8, split)


def _max_stages():
    from moerun.backends.triton.config_types import WS_MAX_STAGES

    return {"promoted_gate_up": WS_MAX_STAGES[128], "promoted_down": WS_MAX_STAGES[128],
            "carried_gate_up": WS_MAX_STAGES[256], "carried_down_split": WS_MAX_STAGES[256],
            # the full [64, 256] store buffers: the run function takes them up to 3 stages
            "carried_down_full": 3}


#: The wgmma each consumer issues: N = 2 x 64 gate/up columns or 128 down columns promoted,
#: N = 256 carried (128 gate + 128 up rows, or 256 hidden columns).
WGMMA = {"promoted_gate_up": "m64n128k32.f32.e4m3.e4m3",
         "promoted_down": "m64n128k32.f32.e4m3.e4m3",
         "carried_gate_up": "m64n256k32.f32.e4m3.e4m3",
         "carried_down_split": "m64n256k32.f32.e4m3.e4m3",
         "carried_down_full": "m64n256k32.f32.e4m3.e4m3"}


@pytest.mark.parametrize("form", sorted(WGMMA))
def test_ws_form_builds_for_sm90_at_its_most_stages(form, tmp_path):
    stages = _max_stages()[form]
    kernel = compile_sm90(*_build(form, stages))
    ptx = kernel.asm["ptx"]
    assert kernel.metadata.shared <= HOPPER_SMEM, (form, stages, kernel.metadata.shared)
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+)", ptx))
    assert shapes == {WGMMA[form]}, shapes
    # the loader warp gives registers away, the consumers take them (warp specialization)
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+232;", ptx)
    assert ptxas_report(ptx, tmp_path)[1] == 0


@pytest.mark.parametrize("form", sorted(WGMMA))
def test_ws_form_with_padding_halves_skipped_builds_for_sm90(form, tmp_path):
    """``skip_padding=True`` (the kernels' ``EVERY_HALF=False``, last argument): the branch
    that releases a padding half's stages unread builds too, with the same shared memory and
    no spill, and differs from the default build (whose branch the constant folds away)."""
    kernel, args = _build(form, 3)
    skip = compile_sm90(kernel, (*args, False))
    every = compile_sm90(kernel, args)
    assert skip.metadata.shared == every.metadata.shared <= HOPPER_SMEM
    assert skip.asm["ptx"] != every.asm["ptx"]
    assert ptxas_report(skip.asm["ptx"], tmp_path)[1] == 0


@pytest.mark.parametrize("form", ["carried_gate_up", "carried_down_split", "carried_down_full"])
def test_one_stage_more_does_not_fit_a_256_row_tile(form):
    """The 256-row tiles' cap (and the full store's 3) is the shared-memory limit: one more
    stage is past it."""
    kernel = compile_sm90(*_build(form, _max_stages()[form] + 1))
    assert kernel.metadata.shared > HOPPER_SMEM, (form, kernel.metadata.shared)


@pytest.mark.parametrize("form", ["promoted_gate_up", "promoted_down"])
def test_the_128_row_cap_leaves_one_stage_of_room(form):
    """``WS_MAX_STAGES[128]`` is a choice below the limit (config_types): a sixth 32 KB stage
    fits, a seventh does not."""
    cap = _max_stages()[form]
    assert compile_sm90(*_build(form, cap + 1)).metadata.shared <= HOPPER_SMEM
    assert compile_sm90(*_build(form, cap + 2)).metadata.shared > HOPPER_SMEM


@pytest.mark.parametrize("dtype,block", [(F8, [64, 128]), (F8, [128, 128]), (F8, [256, 128]),
                                         (torch.bfloat16, [64, 64]),
                                         (torch.bfloat16, [64, 128]),
                                         (torch.bfloat16, [64, 256]),
                                         (torch.float16, [64, 128])])
def test_tma_desc_is_tritons_descriptor_with_its_default_layout(dtype, block):
    """``fp8_ws_parts.tma_desc`` caches the shared layout per box and dtype: the descriptor
    must be what Triton's own constructors give for the tensor."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from moerun.backends.triton.fp8_ws_parts import tma_desc

    gdt = {F8: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]
    t = torch.empty(512, 1024, dtype=torch.uint8).view(F8) if dtype == F8 else \
        torch.empty(512, 1024, dtype=dtype)
    for view in (t, t[128:384]):  # a second base pointer and shape through the same cache
        want = TensorDescriptor.from_tensor(
            view, block, gl.NVMMASharedLayout.get_default_for(block, gdt))
        got = tma_desc(view, block)
        assert got.base is view
        assert (list(got.shape), list(got.strides), list(got.block_shape)) == \
            (list(want.shape), list(want.strides), list(want.block_shape))
        assert got.layout == want.layout
