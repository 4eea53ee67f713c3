"""Device probe: the block-scaled fp8 GEMM of ``fp8_mc_gemm.cu`` with and without A multicast,
against cuBLAS's block-scaled GEMM and the Gluon ws probe, same run, same data (issue 12).

    nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC \
         -o /tmp/fp8_mc_gemm.so benchmarks/experiments/cuda-fp8-mc-2026-12-05/fp8_mc_gemm.cu
    PYTHONPATH=. python3 benchmarks/experiments/cuda-fp8-mc-2026-12-05/probe.py --check --mc 1
    PYTHONPATH=. python3 benchmarks/experiments/cuda-fp8-mc-2026-12-05/probe.py --mc 1,2,4 --out x.json

``--check``: small shapes only, each output against the fp32 reference of the dequantized
operands, with the positions of wrong elements folded onto the tile (row % 64, column % 128)
so that a wrong fragment map or descriptor shows its pattern; prints ``ok mc=<n>`` when every
shape passes. Otherwise: per shape, cuBLAS (``torch._scaled_mm`` with block scales), the Gluon
ws probe (``../gluon-2026-12-02/ws_gemm.py``, its best form) and the CUDA kernel for each
``--mc`` (cluster size: 1, 2, 4; sharing A, or B as ``cuda_mc<n>_b``), ``--stages`` and epilogue (direct stores, or staged in
shared memory and TMA-stored), each checked against the reference, then
timed (median of ``--samples`` event-timed calls after 3 warm-ups); one JSON line per row as
it finishes.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import json
import os
import sys
import time

import torch

G = 128
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gluon-2026-12-02"))
import ws_gemm  # noqa: E402 - the Gluon probe: timed in the same run; its timer and codes
from ws_gemm import _codes, _time  # noqa: E402


def _lib(path: str):
    lib = ctypes.CDLL(path)
    lib.fp8_mc_gemm.restype = ctypes.c_int
    lib.fp8_mc_gemm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [
        ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return lib


def arm_watchdog(lib) -> None:
    """A check build's (``-DMC_WATCHDOG``) mbarrier watchdog: arm its host-mapped record and,
    at exit, print it if a wait timed out. The fault itself only says "illegal instruction";
    the record names the block, thread, barrier offset and parity. A timing build has no
    watchdog: nothing to do."""
    if not hasattr(lib, "mc_watchdog_arm"):
        return
    torch.cuda.init()
    slot = ctypes.POINTER(ctypes.c_uint32)()
    rc = lib.mc_watchdog_arm(ctypes.byref(slot))
    if rc:
        print(f"watchdog not armed: CUDA error {rc}", flush=True)
        return

    def report():
        if slot[3]:
            print(f"WATCHDOG: block {slot[0]} thread {slot[1]} barrier smem+{slot[2]} "
                  f"parity {slot[3] - 1} open for 10 s", flush=True)

    atexit.register(report)


class Recorder:
    """A probe run's rows: each printed as a JSON line as it comes (so a call cut short still
    returns them), all kept with the device, torch version and UTC date for :meth:`save`."""

    def __init__(self):
        self.rec = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "rows": []}

    def __call__(self, row: dict) -> None:
        self.rec["rows"].append(row)
        print(json.dumps(row), flush=True)

    def save(self, path: str | None) -> None:
        """Write every row and the header to ``path`` as JSON (nothing when None)."""
        if path:
            with open(path, "w") as f:
                json.dump(self.rec, f, indent=1)


def cuda_gemm(lib, a8, b8, sa_t, sb, c, *, mc: int, stages: int, epi: int, along_m: int = 0,
              ctas: int = 0) -> int:
    """``c = (a8, sa) @ (b8, sb)^T`` through the CUDA kernel: clusters of ``mc`` CTAs
    sharing A (``along_m`` 0) or B (1); ``epi`` 1: the TMA-store epilogue, 0: direct
    stores. Returns the grid launched.
    Raises RuntimeError with the library's step code on a failed launch."""
    m, k = a8.shape
    n = b8.shape[0]
    used = ctypes.c_int(0)
    rc = lib.fp8_mc_gemm(a8.data_ptr(), b8.data_ptr(), sa_t.data_ptr(), sb.data_ptr(),
                         c.data_ptr(), m, n, k, mc, along_m, stages, epi, ctas,
                         torch.cuda.current_stream().cuda_stream, ctypes.byref(used))
    if rc != 0:
        raise RuntimeError(f"fp8_mc_gemm returned {rc} (mc={mc}, along_m={along_m}, "
                           f"stages={stages}, epi={epi}, "
                           f"{m}x{n}x{k})")
    return used.value


def _data(m, n, k, gen):
    a8 = _codes(m, k, gen=gen)
    b8 = _codes(n, k, gen=gen)
    sa = torch.rand(m, k // G, device="cuda", generator=gen) * 0.01 + 1e-3
    sb = torch.rand(n // G, k // G, device="cuda", generator=gen) * 0.01 + 1e-3
    af = a8.float() * sa.repeat_interleave(G, 1)
    bf = b8.float() * sb.repeat_interleave(G, 0).repeat_interleave(G, 1)
    ref = af @ bf.t()
    return a8, b8, sa, sb, ref


def _errors(c, ref):
    diff = (c.float() - ref).abs()
    rel = (diff.norm() / ref.norm()).item()
    worst = (diff.amax(1) / ref.abs().amax(1)).max().item()
    return rel, worst, diff


def check(lib, mcs, stages_list, small: bool = False) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    # N a multiple of 512: every cluster size tiles it; M too, except the first
    shapes = [(128, 512, 128), (512, 512, 256), (512, 1024, 1024), (1024, 1024, 512),
              (1536, 1536, 2048)][:2 if small else None]
    for mc in mcs:
        good = True
        forms = [(st, epi, am) for st in stages_list for epi in (0, 1)
                 for am in ((0, 1) if mc > 1 else (0,))]
        for st, epi, am in forms:
            for (m, n, k) in shapes:
                if m % (128 * (mc if am else 1)):
                    continue  # the cluster's row blocks do not tile M
                a8, b8, sa, sb, ref = _data(m, n, k, gen)
                c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                t0 = time.time()
                grid = cuda_gemm(lib, a8, b8, sa.t().contiguous(), sb, c, mc=mc, stages=st,
                                 epi=epi, along_m=am)
                torch.cuda.synchronize()
                rel, worst, diff = _errors(c, ref)
                bad = (diff > 2e-2 * ref.abs().amax(1, keepdim=True)) | torch.isnan(c.float())
                nb = int(bad.sum())
                row = {"check": f"{m}x{n}x{k}", "mc": mc, "along_m": am, "stages": st,
                       "epi": epi,
                       "grid": grid,
                       "rel_err": rel, "worst_row": worst, "bad": nb,
                       "s": round(time.time() - t0, 3)}
                if nb:
                    good = False
                    idx = bad.nonzero()
                    row["bad_rows_mod64"] = sorted(set((idx[:, 0] % 64).tolist()))[:16]
                    row["bad_cols_mod128"] = sorted(set((idx[:, 1] % 128).tolist()))[:16]
                    row["bad_tiles"] = sorted(set(((idx[:, 0] // 128) * 1000
                                                   + idx[:, 1] // 128).tolist()))[:16]
                print(json.dumps(row), flush=True)
        print(f"{'ok' if good else 'FAILED'} mc={mc}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", default="/tmp/fp8_mc_gemm.so")
    p.add_argument("--mc", default="1,2,4")
    p.add_argument("--stages", default="4,6")
    p.add_argument("--check", action="store_true")
    p.add_argument("--small", action="store_true", help="--check on the two smallest shapes")
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--shapes", default="8192x8192x4096,8192x7168x2048,2048x28672x4096")
    p.add_argument("--out")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    lib = _lib(args.lib)
    arm_watchdog(lib)
    mcs = [int(x) for x in args.mc.split(",") if x]
    stages_list = [int(x) for x in args.stages.split(",")]
    if args.check:
        check(lib, mcs, stages_list, args.small)
        return
    emit = Recorder()

    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        flop = 2.0 * m * n * k
        a8, b8, sa, sb, ref = _data(m, n, k, gen)
        sa_t = sa.t().contiguous()
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def row(impl, fn, timed=None, **extra):
            """``fn`` writes ``c`` (checked); ``timed`` (default ``fn``) is what is timed."""
            try:
                c.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                rel, worst, _ = _errors(c, ref)
                t = _time(timed or fn, args.samples)
                emit({"shape": shape, "impl": impl, **extra, "us": round(t * 1e6, 1),
                      "tflops": round(flop / t / 1e12, 1), "rel_err": rel,
                      "worst_row": worst})
            except Exception as e:  # noqa: BLE001 - the probe records what fails
                emit({"shape": shape, "impl": impl, **extra, "error": repr(e)[:300]})

        xs, wsc = sa.t().contiguous().t(), sb.t()
        row("cublas_blockwise",
            lambda: c.copy_(torch._scaled_mm(a8, b8.t(), xs, wsc, out_dtype=torch.bfloat16)),
            timed=lambda: torch._scaled_mm(a8, b8.t(), xs, wsc, out_dtype=torch.bfloat16))
        gk = dict(mode=4, bm=128, bn=128, bk=128, stages=4, mma_regs=232, load_regs=40)
        row("gluon_ws", lambda: ws_gemm.ws_gemm(a8, b8, sa_t, sb, c, **gk), cfg=gk)
        for mc in mcs:
            for st in stages_list:
                for epi, am in [(e, a) for e in (0, 1) for a in ((0, 1) if mc > 1 else (0,))]:
                    grid = {}

                    def run(mc=mc, st=st, epi=epi, am=am, grid=grid):
                        grid["ctas"] = cuda_gemm(lib, a8, b8, sa_t, sb, c, mc=mc, stages=st,
                                                 epi=epi, along_m=am)
                    row(f"cuda_mc{mc}{'_b' if am else ''}", run, stages=st, epi=epi,
                        grid=grid)
    emit.save(args.out)


if __name__ == "__main__":
    main()
