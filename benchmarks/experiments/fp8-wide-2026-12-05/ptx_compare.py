"""Offline check (CPU machine) that a refactor of the ws kernels leaves their device code
alone: compiles the five kernel forms (promoted gate/up and down, carried gate/up, carried
down with the split and the full store) for sm90 and writes each PTX with comments, line
info, debug labels and debug sections removed, plus its md5, to ``OUTDIR``. Run it on both
trees and ``diff -r`` the folders.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-wide-2026-12-05/ptx_compare.py OUTDIR
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _code_only(ptx: str) -> str:
    for marker in (".section\t.debug", ".section .debug"):
        if marker in ptx:
            ptx = ptx[:ptx.index(marker)]
    ptx = re.sub(r"^\s*\.loc.*$|^\s*\.file.*$|//.*$", "", ptx, flags=re.M)
    return "\n".join(ln for ln in ptx.split("\n")
                     if ln.strip() and "$L__tmp" not in ln and "$L__func" not in ln)


def main() -> None:
    from compile_wide import _compile

    from moerun.backends.triton import fp8_ws as ws
    from moerun.backends.triton import fp8_ws_carry as cw
    from moerun.backends.triton.fp8_ws_parts import tma_desc as d

    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    f8 = torch.float8_e4m3fn
    s, h, inter, r, p = 8, 1024, 512, 1024, 512
    a = torch.empty(r, h, dtype=torch.uint8).view(f8)
    w13 = torch.empty(s * 2 * inter, h, dtype=torch.uint8).view(f8)
    w2 = torch.empty(s * h, inter, dtype=torch.uint8).view(f8)
    qa = torch.empty(r, inter, dtype=torch.uint8).view(f8)
    a_s, qa_s = torch.empty(r, h // 128), torch.empty(r, inter // 128)
    s13, s2 = torch.empty(s, 2 * inter // 128, h // 128), torch.empty(s, h // 128, inter // 128)
    ids = torch.empty(r, dtype=torch.int32)
    ya, act = torch.empty(r, h, dtype=torch.bfloat16), torch.empty(r, inter, dtype=torch.bfloat16)
    w = torch.empty(p)
    gu = (a_s, s13)
    cases = [
        ("promoted_gate_up", ws._gate_up_kernel,
         (d(a, [64, 128]), d(w13, [64, 128]), d(act, [64, 64]), *gu, ids, ids, ids, p, inter, h,
          a_s.stride(0), s13.stride(0), s13.stride(1), 64, 4, 8)),
        ("promoted_down", ws._down_kernel,
         (d(qa, [64, 128]), d(w2, [128, 128]), d(ya, [64, 128]), w, ids, qa_s, s2, ids, ids, h,
          inter, qa_s.stride(0), s2.stride(0), s2.stride(1), p, 128, 4, 8)),
        ("carried_gate_up", cw.gate_up_carry_kernel,
         (d(a, [64, 128]), d(w13, [128, 128]), d(qa, [64, 128]), *gu, qa_s, ids, ids, ids, p,
          inter, h, a_s.stride(0), s13.stride(0), s13.stride(1), qa_s.stride(0), 4, 8, 2)),
        ("carried_down_split", cw.down_carry_kernel,
         (d(qa, [64, 128]), d(w2, [256, 128]), d(ya, [64, 128]), w, ids, qa_s, s2, ids, ids, h,
          inter, qa_s.stride(0), s2.stride(0), s2.stride(1), p, 4, 8, True)),
        ("carried_down_full", cw.down_carry_kernel,
         (d(qa, [64, 128]), d(w2, [256, 128]), d(ya, [64, 256]), w, ids, qa_s, s2, ids, ids, h,
          inter, qa_s.stride(0), s2.stride(0), s2.stride(1), p, 3, 8, False)),
    ]
    for name, fn, args in cases:
        code = _code_only(_compile(fn, args).asm["ptx"])
        with open(os.path.join(out, f"{name}.ptx"), "w") as fh:
            fh.write(code)
        print(name, hashlib.md5(code.encode()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
