"""``TritonExperts``: the expert path as fused Triton kernels (DESIGN 6).

Legend: ``M`` rows (tokens after dispatch), ``H`` hidden, ``I`` intermediate, ``S`` local
slots, ``K`` top-k, ``BM`` rows per expert block.

One call launches **4 kernels** (3 for fp32 inputs with the atomic combine), plus one small
``torch.zeros`` memset (a graph memset node) when there are more than 1024 (token, j) pairs:

1. ``align.moe_align`` -- token -> expert alignment on the device (one aligning program for
   decode sizes, a grid of <= #SMs programs with a spin barrier above 1024 pairs -- the
   memset zeroes its counters; in the ``"atomic"`` combine the launch's extra programs zero
   the fp32 accumulator);
2. ``gate_up.gate_up`` -- gathered-rows grouped GEMM, ``silu(gate) * up`` in the epilogue;
3. ``down.down`` -- grouped GEMM over contiguous aligned rows, routing weight in the epilogue,
   either atomically summed into the fp32 ``[M, H]`` accumulator (optionally split-K) or
   written as per-pair rows ``[M*K, H]``;
4. ``combine.moe_sum`` (``"reduce"``) or the fp32 -> x.dtype cast (``"atomic"``; none for
   fp32 inputs).

Kernels per T regime (picked per T bucket from tuned JSON, ``configs.py``; H200 choices):

* decode / memory-bound (few rows per hit expert: T <= 128, and dsv3 at 1024): ``block_m``
  just large enough that each hit expert is ONE block (16; 64 for mixtral T=128 and dsv3
  T=1024), so every weight byte is streamed once; N tiles of 32-128 with 2-5 stages give
  hundreds of programs even when only K experts are hit (T=1: 8 experts x I/BN tiles), and the
  down GEMM adds split-K where blocks x tiles alone would leave SMs idle (mixtral T=1: 2
  experts, split 2); atomic combine (no [M*K, H] round trip). Measured 4.2-4.5 TB/s.
* prefill / compute-bound (>= ~64 rows per expert): 128-row wgmma tiles (gate_up 128 columns
  of gate + 128 of up, 8 warps, 3-4 stages; down 256 columns), GROUP_M 4-16 program order so
  the blocks of one expert share weight tiles through L2, and the reduce combine (the fp32
  atomics on M*K*H elements measured 2-13 % slower at T=8192).

A bucket whose tuned entry says ``kernel="persistent"`` runs steps 2-3 as the persistent TMA
kernels of ``persistent.py`` instead (same buffers, same combine; grouped kernels when the call
has the fused shared expert or strides TMA cannot take). The heuristic never picks them.

A bucket whose tuned entry says ``kernel="direct"`` (decode, a few tokens) runs **2 launches**
and no alignment: ``gate_up.gate_up_direct`` (one tile per (token, j) pair, its slot read from
``topk_ids``, the routing weight applied in the epilogue) and ``down.down_direct`` (each
token's K pairs summed in one loop, ``combine="reduce"``; or one program per pair whose K-th
arrival per (token, N tile) sums the partials, ``combine="atomic"``), written in x.dtype.
The fused shared expert takes the grouped kernels with the same tiles. The heuristic never
picks it. An fp8 file's direct entry runs the same two-launch form with block-scaled dots
(``fp8_direct.py``; the routing weight then enters the down kernel's step scales).

Capture-safe: buffers are sized by static bounds, no device->host sync anywhere in
``run_experts``; it runs on the current stream. Triton is imported lazily (first call), so
``import moerun`` works without it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from moerun._triton.program import ProgramCache, layout_key
from moerun.backends.base import Backend
from moerun.capability import Deployment, Eligibility, Problem, RejectReason
from moerun.config import Activation
from moerun.env import Env, get_env
from moerun.quant import QuantizedRows

__all__ = ["TritonExperts", "LAUNCHES_PER_CALL"]

#: Kernel launches per ``run_experts`` call (fp32 with the atomic combine: 3; a
#: ``kernel="direct"`` config: 2).
LAUNCHES_PER_CALL = 4

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INTERPRETER_DTYPES = (torch.float32, torch.float16)


class TritonExperts(Backend):
    """Fused grouped-GEMM experts in Triton (CUDA sm80+, or CPU under ``TRITON_INTERPRET=1``).

    Args:
        configs: a :class:`~moerun.backends.triton.configs.ConfigTable`; default: the tuned
            JSON files for this device (``moerun tune`` writes them), else the heuristic.
    """

    name: ClassVar[str] = "triton"
    supports_non_divisible_ep: ClassVar[bool] = True  # it only ever sees local slots
    supports_fused_shared: ClassVar[bool] = True
    supports_fp8_block: ClassVar[bool] = True  # fp8.py; CUDA sm89+ or the interpreter
    # False: the layer quantizes the rows with quantize_rows (one launch) also on one rank.
    # Handing the kernels activation-dtype rows (quantized in the decode kernels' registers)
    # was 1.11-1.19x slower at T=1 and up to 1.19x at T=16/128 on the H200 (docs/DECISIONS.md,
    # "Who quantizes x"); run_experts still takes such rows.
    fuses_activation_quant: ClassVar[bool] = False

    def __init__(self, configs=None):
        self._configs = configs
        self._programs = ProgramCache()  # call shape -> launch program (host cost, issue 8)

    @classmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Eligible for SwiGLU where triton runs on the problem's device (the reasons
        below). Host only, pure given ``env``."""
        if problem.activation != Activation.SILU_GLU:
            return Eligibility.no(RejectReason.ACTIVATION, f"{problem.activation} unsupported")
        if env.triton_version is None:
            return Eligibility.no(RejectReason.PACKAGE_MISSING,
                                  "triton is not importable; pip install 'moerun[gpu]'")
        if problem.dtype not in _DTYPES:
            return Eligibility.no(RejectReason.DTYPE, f"{problem.dtype} unsupported "
                                  "(fp32, fp16, bf16)")
        quant = getattr(problem, "quant", None)
        if quant is not None and (quant.weight_block != (128, 128) or quant.act_group != 128):
            return Eligibility.no(RejectReason.QUANT,
                                  f"fp8 kernels use 128x128 weight blocks and 128-column "
                                  f"activation groups, not {quant.weight_block}/"
                                  f"{quant.act_group}")
        if problem.device_type == "cpu":
            if not env.triton_interpret:
                return Eligibility.no(RejectReason.INTERPRETER,
                                      "CPU needs TRITON_INTERPRET=1 set before triton is "
                                      "imported")
            if problem.dtype not in _INTERPRETER_DTYPES:
                return Eligibility.no(RejectReason.INTERPRETER,
                                      f"{problem.dtype} under the Triton interpreter returns "
                                      "wrong results; use fp32 or fp16")
            return Eligibility.yes()
        if problem.device_type != "cuda":
            return Eligibility.no(RejectReason.DEVICE, f"device {problem.device_type!r}")
        if env.triton_interpret:
            return Eligibility.no(RejectReason.INTERPRETER,
                                  "TRITON_INTERPRET=1 would run the kernels on the CPU; unset it")
        if not env.cuda_available or env.device_capability is None or \
                env.device_capability < (8, 0):
            return Eligibility.no(RejectReason.DEVICE,
                                  f"needs a CUDA GPU of sm80 or newer, have {env.device_name} "
                                  f"{env.device_capability}")
        if quant is not None and env.device_capability < (8, 9):
            return Eligibility.no(RejectReason.DEVICE,
                                  f"fp8 tensor-core dots need sm89 or newer, have "
                                  f"{env.device_name} {env.device_capability}")
        return Eligibility.yes()

    def _table(self):
        if self._configs is None:
            from moerun.backends.triton.configs import ConfigTable

            self._configs = ConfigTable(device_name=get_env().device_name)
        return self._configs

    def config_for(self, num_slots: int, inter: int, hidden: int, num_tokens: int,
                   top_k: int, dtype: torch.dtype):
        """The :class:`ExpertsConfig` a call with these sizes uses (host-only lookup keyed by
        the local slot count ``num_slots``; :meth:`kernel_config` says where it came from)."""
        return self._table().lookup(num_slots, inter, hidden, num_tokens, top_k, dtype).config

    def kernel_config(self, *, num_slots: int, hidden: int, intermediate: int, num_tokens: int,
                      top_k: int, dtype: torch.dtype) -> str:
        """``"tuned (<file>)"``, ``"heuristic"`` or ``"override"`` for a call of this shape.
        Host only (reads the config files once per shape)."""
        return self._table().lookup(num_slots, intermediate, hidden, num_tokens, top_k,
                                    dtype).source

    @classmethod
    def config_report(cls, problem: Problem, deployment: Deployment, env: Env
                      ) -> tuple[str, ...]:
        """Per T bucket: the config source for this rank's local shape (the default table of
        ``env``'s device; a layer given a ``TritonExperts(configs=...)`` instance uses its
        own table instead). Host only: reads the shipped JSON files once per shape."""
        from moerun.backends.triton.configs import ConfigTable

        dtype = torch.float8_e4m3fn if getattr(problem, "quant", None) is not None \
            else problem.dtype
        return ConfigTable(device_name=env.device_name).report_lines(
            deployment.num_local_slots, problem.intermediate_size, problem.hidden_size,
            problem.top_k, dtype)

    def quantize_rows(self, x, config):
        """One Triton launch (``fp8.quantize_rows_fp8``) for 128-column groups; the torch
        function otherwise. Same numbers either way; no host sync."""
        if config.act_group == 128 and x.dim() == 2 and x.shape[1] % 128 == 0 and \
                x.stride(1) == 1:
            from moerun.backends.triton.fp8 import quantize_rows_fp8

            return quantize_rows_fp8(x)
        return super().quantize_rows(x, config)

    def shared_mlp_add(self, shared_expert, x, routed):
        """An ungated shared expert: up to
        :data:`~moerun.backends.triton.dense.MAX_DENSE_ROWS` rows two launches of
        ``dense.shared_mlp_add`` (decode: the torch form's six ops cost more host time than
        the GPU spends; a launch program on CUDA from the third call of a shape), above it
        ``dense.shared_mlp_add_gemm`` (cuBLAS GEMMs around one ``silu_mul`` launch). A gated
        one: the torch form."""
        from moerun.backends.triton import dense

        if shared_expert.gate is not None or x.dtype not in _DTYPES or \
                routed.dtype != x.dtype or x.stride(1) != 1:
            return super().shared_mlp_add(shared_expert, x, routed)
        w13, w2 = shared_expert.w13, shared_expert.w2
        if x.shape[0] > dense.MAX_DENSE_ROWS:
            return dense.shared_mlp_add_gemm(x, w13, w2, routed)
        if not x.is_cuda:
            return dense.shared_mlp_add(x, w13, w2, routed)
        tensors = (x, w13, w2, routed)
        key = ("shared", layout_key(tensors))
        return self._programs.call(key, tensors,
                                   lambda: dense.shared_mlp_add(x, w13, w2, routed))

    def fp8_config_for(self, num_slots: int, inter: int, hidden: int, num_tokens: int,
                       top_k: int):
        """The fp8 :class:`ExpertsConfig` a call with these sizes uses (host-only lookup:
        the tuned ``S{S}_N{I}_K{H}_float8_e4m3fn_{device}.json``, else the fp8 heuristic)."""
        return self._table().lookup(num_slots, inter, hidden, num_tokens, top_k,
                                    torch.float8_e4m3fn).config

    def fp8_config_source(self, num_slots: int, inter: int, hidden: int, num_tokens: int,
                          top_k: int) -> str:
        """Where :meth:`fp8_config_for`'s config comes from (``"tuned (<file>)"`` or
        ``"heuristic"``). Host only (reads the config files once per shape)."""
        return self._table().lookup(num_slots, inter, hidden, num_tokens, top_k,
                                    torch.float8_e4m3fn).source

    def _run_fp8(self, x, w13, w2, topk_weights, topk_ids, shared, quant, cfg=None):
        """The fp8 call, plainly; ``cfg`` the config a caller already looked up for it."""
        from moerun.backends.triton.fp8 import run_experts_fp8

        if shared is not None:
            raise ValueError("the FUSED shared-expert order does not combine with fp8 "
                             "experts (the shared expert is not quantized); use another order")
        xd = x.data if isinstance(x, QuantizedRows) else x  # float rows: quantized in-kernel
        m, h = xd.shape
        s, two_i, _ = w13.shape
        k = topk_ids.shape[1]
        if m == 0 or k == 0 or s == 0:
            return torch.zeros(m, h, dtype=quant.out_dtype, device=xd.device)
        ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
        if not ids.is_contiguous():
            ids = ids.contiguous()
        weights = topk_weights
        if weights.dtype != torch.float32:
            weights = weights.to(torch.float32)
        if not weights.is_contiguous():
            weights = weights.contiguous()
        if cfg is None:
            cfg = self.fp8_config_for(s, two_i // 2, h, m, k)
        return run_experts_fp8(x, w13, w2, quant.w13_scale, quant.w2_scale, weights, ids, cfg,
                               quant.out_dtype)

    def run_experts(self, x, w13, w2, topk_weights, topk_ids, shared=None, *, quant=None):
        """See :meth:`Backend.run_experts`. 4 launches (2 with a ``kernel="direct"``
        config; module docstring); no host sync.

        With ``quant`` (``x`` a :class:`~moerun.quant.QuantizedRows`, as the layer hands it;
        activation-dtype rows are taken too, though ``fuses_activation_quant`` is False
        because that is slower): the fp8 block-scaled kernels of ``fp8.py`` (4 launches, 2
        with a direct entry; float rows are quantized in the gate/up kernel at decode sizes
        and by one more launch at prefill sizes; the intermediate travels in fp8 at prefill
        sizes).

        With ``shared`` (the ``FUSED`` order) the alignment covers ``S + n`` slots and the two
        GEMMs read the shared slots from the shared expert's own tensors; the tile config is
        the routed shape's (its ``K``), so tuned files keep applying.

        On CUDA, a call without ``shared`` (with ``quant``: on quantized rows) replays a
        launch program (``moerun._triton.program``) from the third call of its shape on
        (recorded at the second): the same allocations and launches with the argument checks
        and size arithmetic done once. Not for a ``kernel="persistent"`` or ``"ws"`` config
        (their TMA descriptors are built per launch), which take the plain path."""
        if shared is None:
            if quant is None:
                if x.is_cuda:
                    out = self._replay(x, w13, w2, topk_weights, topk_ids)
                    if out is not None:
                        return out
            elif isinstance(x, QuantizedRows) and x.data.is_cuda:
                return self._call_fp8(x, w13, w2, topk_weights, topk_ids, quant)
        return self._run_plain(x, w13, w2, topk_weights, topk_ids, shared, quant)

    def _replay(self, x, w13, w2, topk_weights, topk_ids):
        """The call through its launch program (recorded at the second call of the key), or
        None for the plain path. The key holds every input's shape, stride, dtype, device and
        16-byte pointer alignment, and the tile config the call looks up."""
        if x.dim() != 2 or w13.dim() != 3 or topk_ids.dim() != 2:
            return None
        s, two_i, h = w13.shape
        cfg = self.config_for(s, two_i // 2, h, x.shape[0], topk_ids.shape[1], x.dtype)
        if cfg.kernel == "persistent":
            return None  # per-launch descriptor scratch: not replayed
        tensors = (x, w13, w2, topk_weights, topk_ids)
        key = (cfg, layout_key(tensors))
        return self._programs.call(key, tensors, lambda: self._run_plain(
            x, w13, w2, topk_weights, topk_ids, None, None))

    def _call_fp8(self, x, w13, w2, topk_weights, topk_ids, quant):
        """The fp8 call of quantized rows ``x`` on CUDA: through its launch program as
        :meth:`_replay` (the key adding the output dtype and the rows' group; the scales are
        inputs like the weights), plainly for a ``persistent`` or ``ws`` config (per-launch
        TMA descriptors), with one config lookup either way."""
        if x.data.dim() != 2 or w13.dim() != 3 or topk_ids.dim() != 2:
            return self._run_fp8(x, w13, w2, topk_weights, topk_ids, None, quant)
        s, two_i, h = w13.shape
        cfg = self.fp8_config_for(s, two_i // 2, h, x.data.shape[0], topk_ids.shape[1])
        if cfg.kernel in ("persistent", "ws"):
            return self._run_fp8(x, w13, w2, topk_weights, topk_ids, None, quant, cfg)
        tensors = (x.data, x.scale, w13, w2, quant.w13_scale, quant.w2_scale, topk_weights,
                   topk_ids)
        key = ("fp8", cfg, quant.out_dtype, x.group, layout_key(tensors))
        return self._programs.call(key, tensors, lambda: self._run_fp8(
            x, w13, w2, topk_weights, topk_ids, None, quant, cfg))

    def _run_plain(self, x, w13, w2, topk_weights, topk_ids, shared, quant):
        from moerun.backends.triton.align import moe_align
        from moerun.backends.triton.combine import moe_sum
        from moerun.backends.triton.down import down
        from moerun.backends.triton.gate_up import gate_up

        if quant is not None:
            return self._run_fp8(x, w13, w2, topk_weights, topk_ids, shared, quant)
        m, h = x.shape
        s, two_i, _ = w13.shape
        inter = two_i // 2
        if x.dtype not in _DTYPES:
            raise ValueError(f"x.dtype={x.dtype}: TritonExperts runs fp32, fp16 and bf16")
        if w13.shape != (s, two_i, h) or w2.shape != (s, h, inter) or two_i % 2:
            raise ValueError(f"w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} do not match "
                             f"x [M, {h}]: expected [S, 2I, {h}] and [S, {h}, I]")
        if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or \
                topk_ids.shape[0] != m:
            raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights "
                             f"{tuple(topk_weights.shape)} must both be [{m}, K]")
        k = topk_ids.shape[1]
        if m == 0 or k == 0 or s == 0:
            return torch.zeros(m, h, dtype=x.dtype, device=x.device)
        if x.stride(1) != 1:
            x = x.contiguous()
        ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
        if not ids.is_contiguous():
            ids = ids.contiguous()
        weights = topk_weights  # NOTE: no-op .to()/.contiguous() still cost ~2 µs of host time
        if weights.dtype != torch.float32:
            weights = weights.to(torch.float32)
        if not weights.is_contiguous():
            weights = weights.contiguous()

        n_shared = 0 if shared is None else shared.num_slots
        cfg = self.config_for(s, inter, h, m, k - n_shared, x.dtype)
        if cfg.kernel == "direct" and shared is None:
            from moerun.backends.triton.down import down_direct
            from moerun.backends.triton.gate_up import gate_up_direct

            from moerun._triton.launch import cdiv

            cnt = None
            if cfg.combine == "atomic":  # the per-pair down: arrival counters
                cnt = torch.empty(m * cdiv(h, cfg.down.block_n), dtype=torch.int32,
                                  device=x.device)
            act = gate_up_direct(x, w13, ids, weights, cfg.gate_up, zero=cnt,
                                 swap_ab=cfg.swap_ab)  # launch 1
            return down_direct(act, w2, ids, cfg.down, counters=cnt,
                               swap_ab=cfg.swap_ab)  # launch 2
        if cfg.kernel == "persistent":
            from moerun.backends.triton.persistent import run_persistent

            out = run_persistent(x, w13, w2, weights, ids, cfg, shared=shared)
            if out is not None:
                return out  # else: logged once, the grouped kernels below
        atomic = cfg.combine == "atomic"
        acc = torch.empty(m, h, dtype=torch.float32, device=x.device) if atomic else None
        align = moe_align(ids, s + n_shared, cfg.block_m, zero=acc)  # launch 1
        act = gate_up(x, w13, align, k, cfg.gate_up, shared=shared,
                      swap_ab=cfg.swap_ab)  # launch 2
        if atomic:
            down(act, w2, align, weights, k, cfg.down, atomic_out=acc, shared=shared,
                 swap_ab=cfg.swap_ab)  # launch 3
            return acc if x.dtype == torch.float32 else acc.to(x.dtype)  # launch 4
        y = down(act, w2, align, weights, k, cfg.down, shared=shared,
                 swap_ab=cfg.swap_ab)  # launch 3
        return moe_sum(y, ids, s + n_shared)  # launch 4

    def workspace_bytes(self, problem: Problem, rows: int) -> int:
        """Aligned ``act`` rows + per-pair rows (or the fp32 sum; at most
        ``DIRECT_MAX_TOKENS`` rows, where ``moerun tune`` offers the direct path, its fp32
        per-pair partials and arrival counters) + index buffers, plus the rows gathered into
        aligned order for the persistent kernels' TMA loads (``a_tma`` configs) and their
        tail split's partials (``tail_split`` configs); an upper
        bound over every config a T bucket may pick. Pure; host only."""
        from moerun.backends.triton.tune_plan import DIRECT_MAX_TOKENS, PERSISTENT_MIN_TPE

        elt = torch.empty((), dtype=problem.dtype).element_size()
        k, h, i, s = (problem.top_k, problem.hidden_size, problem.intermediate_size,
                      problem.num_slots)
        pairs = rows * k
        bm = 128  # the largest block any config uses: the bound on padded rows
        aligned = pairs + min(s, pairs) * (bm - 1)
        per_pair = max(pairs * h * elt, rows * h * 4)
        if rows <= DIRECT_MAX_TOKENS:  # direct, per pair: fp32 partials + 16-column counters
            per_pair = max(per_pair, pairs * h * 4 + rows * -(-h // 16) * 4)
        gathered = aligned * h * elt  # persistent a_tma: x rows copied into aligned order
        # persistent tail split: one fp32 128 x 256 partial per program (bound: 256 programs),
        # where the tuner offers persistent configs
        tail = 256 * 128 * 256 * 4 if pairs > PERSISTENT_MIN_TPE * min(s, pairs) else 0
        return aligned * (i * elt + 4) + per_pair + rows * h * elt + gathered + tail
