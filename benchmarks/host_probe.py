"""Where the host time of one layer forward goes (a device-run probe, not a benchmark claim).

Prints, on the current CUDA device: the host cost of a small torch op, of ``torch.empty``, of
one moerun NVTX range, of a Triton launch through ``kernel[grid]`` and through moerun's
``FastLauncher``; then a cProfile of ``ConfigurableMoE.forward`` at T=1 for the two
``moerun bench --layer`` shapes (top functions by own time). Usage (GPU):

    python benchmarks/host_probe.py [--forwards 300] [--tokens 1,1024] [--shared-orders fused]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch


def _per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def primitives() -> None:
    from moerun.config import RoutingConfig
    from moerun.routing.kernel import _LAUNCH, _route_kernel, block_rows, kernel_spec
    from traces import Tracer

    a = torch.randn(8, 8, device="cuda")
    print(f"torch add (8x8):            {_per_call_us(lambda: a + a):7.2f} us")
    print(f"torch.empty:                {_per_call_us(lambda: torch.empty(64, device='cuda')):7.2f} us")
    tr = Tracer(layer_idx=0)

    def rng():
        with tr.phase("route"):
            pass

    print(f"moerun range (nvtx backend): {_per_call_us(rng):7.2f} us")
    logits = torch.randn(1, 128, device="cuda")
    w = torch.empty(1, 8, device="cuda")
    ids = torch.empty(1, 8, dtype=torch.int32, device="cuda")
    spec = kernel_spec(RoutingConfig(method="softmax_topk"))
    args = (logits, w, w, ids, 1, 1, logits.stride(0), 1.0, 128, 128, 8, 8, block_rows(128),
            spec.sigmoid, spec.has_bias, spec.group_score, 1, 1, 1, spec.renormalize, spec.eps)
    print(f"triton kernel[grid] launch:  "
          f"{_per_call_us(lambda: _route_kernel[(1,)](*args, num_warps=4)):7.2f} us")
    print(f"moerun FastLauncher launch: "
          f"{_per_call_us(lambda: _LAUNCH((1,), *args, num_warps=4)):7.2f} us")
    lg = torch.randn(1, 256, device="cuda")
    print(f"NaN scan + host sync (check_inputs): "
          f"{_per_call_us(lambda: bool(torch.isfinite(lg).all()), n=500):7.2f} us")


def profile_forward(name: str, forwards: int, tokens: int = 1, order: str | None = None,
                    top: int = 45) -> None:
    from moerun.bench.layer import LAYER_SHAPES
    from moerun.config import MoEConfig
    from moerun.layer import ConfigurableMoE

    s = LAYER_SHAPES[name]
    cfg = MoEConfig(num_experts=s.experts, top_k=s.top_k, hidden_size=s.hidden,
                    intermediate_size=s.intermediate, routing=s.routing, dtype=torch.bfloat16,
                    shared_intermediate_size=s.shared, check_inputs=False)
    kw = {} if order is None or not s.shared else {"shared_expert_order": order}
    with torch.no_grad(), ConfigurableMoE(cfg, device="cuda", layer_idx=0, **kw) as layer:
        e, h, i = s.experts, s.hidden, s.intermediate
        w13 = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * h ** -0.5
        w2 = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5
        shared = None
        if s.shared:
            shared = {"w13": torch.randn(2 * s.shared, h, device="cuda", dtype=torch.bfloat16),
                      "w2": torch.randn(h, s.shared, device="cuda", dtype=torch.bfloat16)}
        bias = torch.randn(e, device="cuda") if s.routing.uses_correction_bias else None
        layer.load_weights(w13, w2, shared, e_score_correction_bias=bias)
        del w13, w2
        x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(tokens, e, device="cuda")
        print(f"\n== {name} T={tokens}: {layer.report.backend} / router {layer.report.router}"
              f" / shared {layer.report.shared_schedule}")
        for _ in range(20):
            layer(x, logits)
        torch.cuda.synchronize()
        host = []
        for _ in range(forwards):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            layer(x, logits)
            host.append((time.perf_counter() - t0) * 1e6)
        print(f"host us per forward (T={tokens}, median of {forwards}): "
              f"{statistics.median(host):.1f}")
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(forwards):
            layer(x, logits)
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        print(buf.getvalue())
        _launch_paths()


def _launch_paths() -> None:
    """Which cached launches call Triton's C launcher directly (no scratch) or its wrapper."""
    import moerun.backends.triton.align as al
    import moerun.backends.triton.down as dn
    import moerun.backends.triton.gate_up as gu
    import moerun.routing.kernel as rk

    for name, launcher in (("route", rk._LAUNCH), ("align.single", al._LAUNCH_SINGLE),
                           ("align.grid", al._LAUNCH_GRID), ("gate_up", gu._LAUNCH),
                           ("down", dn._LAUNCH)):
        for (compiled, direct, _, _) in launcher._cache.values():
            run = compiled.run
            print(f"  launch {name}: direct={direct is not None} global_scratch="
                  f"{getattr(run, 'global_scratch_size', '?')} profile_scratch="
                  f"{getattr(run, 'profile_scratch_size', '?')}")
            break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=300)
    parser.add_argument("--tokens", default="1", help="comma list of T (default 1)")
    parser.add_argument("--shared-orders", default="",
                        help="comma list of shared-expert orders to profile for deepseek-v3 "
                             "as well as its resolved one (default: none)")
    parser.add_argument("--top", type=int, default=45, help="profile rows printed (default 45)")
    args = parser.parse_args()
    primitives()
    for t in (int(v) for v in args.tokens.split(",")):
        for name in ("qwen3-30b-a3b", "deepseek-v3"):
            profile_forward(name, args.forwards, t, top=args.top)
        for order in filter(None, args.shared_orders.split(",")):
            profile_forward("deepseek-v3", args.forwards, t, order, top=args.top)


if __name__ == "__main__":
    main()
