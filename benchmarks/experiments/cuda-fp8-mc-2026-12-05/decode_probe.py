"""Device probe: the decode call of ``fp8_decode.cu`` (two CUDA launches) against the shipped
call at the T <= 4 cells, graph replay, same run, same inputs: fp8 (issue 12) or, with
``--dtype bf16``, the bf16 pair against the shipped bf16 call (issue 11).

    nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
         -o /tmp/fp8_decode.so benchmarks/experiments/cuda-fp8-mc-2026-12-05/fp8_decode.cu
    PYTHONPATH=. python3 benchmarks/experiments/cuda-fp8-mc-2026-12-05/decode_probe.py --check
    PYTHONPATH=. python3 benchmarks/experiments/cuda-fp8-mc-2026-12-05/decode_probe.py --out d.json
    PYTHONPATH=. python3 benchmarks/experiments/cuda-fp8-mc-2026-12-05/decode_probe.py --dtype bf16

Inputs as ``moe_probe.py`` draws them (``moerun bench --dtype fp8``'s codes, scales and uniform
routing). Each form is checked against DESIGN 11a's reference (``reference_fp8_moe``, bar 3e-2),
a token with an excluded pair (id -1) included in ``--check``; its distance from the shipped
call is recorded, not a bar (``moe_probe._verdict``). bf16: weights ``randn * H^-0.5`` /
``I^-0.5`` as ``moerun bench`` draws them, checked against an fp32 loop over the pairs (bar
1e-2, DESIGN 2).
Timing (``benchmarks/decode_breakdown.py``'s graph timer): ``--calls`` calls captured in one
CUDA graph, 3 warm-up replays, the median of
``--replays`` event-timed replays divided by the calls; the shipped call the same way
(``moerun bench`` times these cells by graph replay too). Forms: ``ks`` (warps sharing H in
gate/up), ``kw`` (warps sharing the pairs' I in down), ``pdl`` (the down launch waits in-kernel
for the gate/up grid, its first weights prefetched into L2 before the wait).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", ".."))
from decode_breakdown import _graph_us  # noqa: E402 - graph replay timer (2 warm-ups)
from moe_probe import _reference, _rel, _setup, _shipped, _verdict  # noqa: E402
from probe import Recorder  # noqa: E402

CELLS = ["qwen3-30b-a3b:1", "qwen3-235b-a22b:1", "deepseek-v3:1", "mixtral8x7b:1",
         "qwen3-30b-a3b:4"]
FORMS = [(ks, kw, pdl) for pdl in (0, 1) for ks in (2, 4, 8) for kw in (4, 8)]


def _lib(path: str):
    lib = ctypes.CDLL(path)
    lib.fp8_decode.restype = ctypes.c_int
    lib.fp8_decode.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    lib.bf16_decode.restype = ctypes.c_int
    lib.bf16_decode.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    return lib


def decode_call(lib, x, w13, w2, s13, s2, w, ids, act, out, *, ks, kw, pdl):
    """``out [T, H]`` bf16 = the expert call through the two CUDA launches (``act [T*K, I]``
    bf16 workspace). Current stream; no host sync; capturable."""
    t, h = x.shape
    s, two_i, _ = w13.shape
    rc = lib.fp8_decode(x.data_ptr(), w13.data_ptr(), s13.data_ptr(), w2.data_ptr(),
                        s2.data_ptr(), ids.data_ptr(), w.data_ptr(), act.data_ptr(),
                        out.data_ptr(), t, ids.shape[1], h, two_i // 2, s, ks, kw, pdl,
                        torch.cuda.current_stream().cuda_stream)
    if rc != 0:
        raise RuntimeError(f"fp8_decode returned {rc} (ks={ks}, kw={kw}, pdl={pdl})")
    return out


def bf16_call(lib, x, w13, w2, w, ids, act, out, *, ks, kw, pdl):
    """As :func:`decode_call` with bf16 weights (no scales)."""
    t, h = x.shape
    s, two_i, _ = w13.shape
    rc = lib.bf16_decode(x.data_ptr(), w13.data_ptr(), w2.data_ptr(), ids.data_ptr(),
                         w.data_ptr(), act.data_ptr(), out.data_ptr(), t, ids.shape[1], h,
                         two_i // 2, s, ks, kw, pdl, torch.cuda.current_stream().cuda_stream)
    if rc != 0:
        raise RuntimeError(f"bf16_decode returned {rc} (ks={ks}, kw={kw}, pdl={pdl})")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", default="/tmp/fp8_decode.so")
    p.add_argument("--check", action="store_true")
    p.add_argument("--cells", default=",".join(CELLS))
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--dtype", choices=("fp8", "bf16"), default="fp8")
    p.add_argument("--out")
    args = p.parse_args()
    bf16 = args.dtype == "bf16"
    from moerun.backends.triton.experts import TritonExperts

    torch.backends.cuda.matmul.allow_tf32 = False
    lib = _lib(args.lib)
    be = TritonExperts()
    dev = torch.device("cuda")
    emit = Recorder()

    cells = ["qwen3-30b-a3b:1", "qwen3-30b-a3b:3", "mixtral8x7b:2", "deepseek-v3:1"] \
        if args.check else args.cells.split(",")
    good = True
    for cell in cells:
        name, t = cell.split(":")
        shape, x, w13, w2, s13, s2, w, ids = _setup(name, int(t), dev, args.dtype)
        if args.check and int(t) > 1:
            ids[0, -1] = -1  # an excluded pair
        ref = _reference(x, w13, w2, s13, s2, w, ids)  # bf16 weights: s13 = s2 = None
        shipped = _shipped(be, shape, x, w13, w2, s13, s2, w, ids)
        ship_out = shipped()
        act = torch.empty(ids.numel(), shape.intermediate, device=dev, dtype=torch.bfloat16)
        out = torch.empty(int(t), shape.hidden, device=dev, dtype=torch.bfloat16)
        if not args.check:
            emit({"cell": cell, "dtype": args.dtype, "impl": "shipped", "us": round(
                _graph_us(shipped, args.calls, args.replays), 2),
                "rel_ref": _rel(ship_out, ref)})
        for ks, kw, pdl in FORMS if not args.check else [(2, 4, 0), (8, 8, 1)]:
            row = {"cell": cell, "dtype": args.dtype, "impl": "cuda", "ks": ks, "kw": kw,
                   "pdl": pdl}
            try:
                def fn(ks=ks, kw=kw, pdl=pdl):
                    if bf16:
                        return bf16_call(lib, x, w13, w2, w, ids, act, out, ks=ks, kw=kw,
                                         pdl=pdl)
                    return decode_call(lib, x, w13, w2, s13, s2, w, ids, act, out, ks=ks,
                                       kw=kw, pdl=pdl)
                # NaN first: a column set a form skips must not read the previous form's
                # result from the shared buffers (excluded pairs' act rows are never read)
                act.fill_(float("nan"))
                out.fill_(float("nan"))
                res = fn().clone()
                torch.cuda.synchronize()
                row.update(_verdict(res, ref, ship_out, 1e-2 if bf16 else 3e-2))
                good &= row["ok"]
                if not args.check:
                    row["us"] = round(_graph_us(fn, args.calls, args.replays), 2)
            except Exception as e:  # noqa: BLE001 - the probe records what fails
                row["error"] = repr(e)[:300]
                good = False
            emit(row)
    if args.check:
        print(f"{'ok' if good else 'FAILED'} decode {args.dtype}", flush=True)
    emit.save(args.out)


if __name__ == "__main__":
    main()
