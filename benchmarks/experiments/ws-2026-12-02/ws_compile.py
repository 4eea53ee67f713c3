"""Offline sm90 compile of the persistent kernels: does warp_specialize compile, and what
does the TTGIR show?  python devrun/ws_compile.py [down|gate_up] [ws] [flatten]"""

import os, sys, traceback
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from moerun.backends.triton import persistent as P

which = sys.argv[1]
ws = "ws" in sys.argv[2:]
fl = "flatten" in sys.argv[2:]
atma = "atma" in sys.argv[2:]
tgt = GPUTarget("cuda", 90, 128)
if which == "down":
    fn = P._down_persistent_kernel
    sig = {
        "act_ptr": "*bf16",
        "w2_ptr": "*bf16",
        "out_ptr": "*bf16",
        "topk_weights_ptr": "*fp32",
        "sorted_ids_ptr": "*i32",
        "expert_ids_ptr": "*i32",
        "num_post_ptr": "*i32",
        "num_pairs": "i32",
        "hidden": "i32",
        "inter": "i32",
        "max_rows": "i32",
        "num_slots": "i32",
        "num_programs": "i32",
        "stride_am": "i32",
        "stride_we": "i32",
        "stride_wn": "i32",
        "stride_om": "i32",
    }
    const = dict(
        BLOCK_M=128,
        BLOCK_N=int(os.environ.get("BN", "256")),
        BLOCK_K=int(os.environ.get("BK", "64")),
        GROUP_M=8,
        PRECISION="tf32",
        NUM_STAGES=int(os.environ.get("ST", "3")),
        FLATTEN=fl,
        WARP_SPECIALIZE=ws,
        PDL=True,
    )
else:
    fn = P._gate_up_persistent_kernel
    sig = {
        "x_ptr": "*bf16",
        "w13_ptr": "*bf16",
        "act_ptr": "*bf16",
        "sorted_ids_ptr": "*i32",
        "expert_ids_ptr": "*i32",
        "num_post_ptr": "*i32",
        "num_pairs": "i32",
        "inter": "i32",
        "hidden": "i32",
        "max_rows": "i32",
        "num_slots": "i32",
        "num_programs": "i32",
        "stride_xm": "i32",
        "stride_we": "i32",
        "stride_wn": "i32",
        "stride_am": "i32",
    }
    const = dict(
        TOP_K=8,
        BLOCK_M=128,
        BLOCK_N=int(os.environ.get("BN", "128")),
        BLOCK_K=int(os.environ.get("BK", "64")),
        GROUP_M=8,
        EVEN_K=True,
        PRECISION="tf32",
        NUM_STAGES=int(os.environ.get("ST", "3")),
        FLATTEN=fl,
        WARP_SPECIALIZE=ws,
        A_TMA=atma,
        PDL=True,
    )
for k in const:
    sig[k] = "constexpr"
src = ASTSource(fn, sig, constexprs={(list(sig).index(k),): v for k, v in const.items()})
try:
    k = triton.compile(
        src,
        target=tgt,
        options={
            "num_warps": int(__import__("os").environ.get("NW", "8")),
            "num_stages": int(os.environ.get("ST", "3")),
        },
    )
    ttg = k.asm["ttgir"]
    ptx = k.asm["ptx"]
    print(
        "OK warps",
        k.metadata.num_warps,
        k.n_regs if hasattr(k, "n_regs") else "?",
        "smem",
        k.metadata.shared,
    )
    print(
        "warp_specialize ops:",
        ttg.count("ttg.warp_specialize"),
        "setmaxnreg:",
        ptx.count("setmaxnreg"),
        "wgmma:",
        ptx.count("wgmma.mma_async"),
        "cp.async.bulk.tensor:",
        ptx.count("cp.async.bulk.tensor"),
        "mbarrier.try_wait:",
        ptx.count("mbarrier.try_wait"),
    )
    open(f"/tmp/{which}_{'ws' if ws else 'nows'}.ttgir", "w").write(ttg)
    open(f"/tmp/{which}_{'ws' if ws else 'nows'}.ptx", "w").write(ptx)
except Exception as e:
    traceback.print_exc(limit=2)
    print("FAILED", type(e).__name__, str(e)[:2000])
