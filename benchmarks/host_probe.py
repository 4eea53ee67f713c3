"""Where the host time of one layer forward goes (a device-run probe, not a benchmark claim).

Prints, on the current CUDA device: the host cost of a small torch op, of ``torch.empty``, of
one moerun NVTX range, of a Triton launch through ``kernel[grid]`` and through moerun's
``FastLauncher``; then a cProfile of ``ConfigurableMoE.forward`` at T=1 for the two
``moerun bench --layer`` shapes (top functions by own time). Usage (GPU):

    python benchmarks/host_probe.py [--forwards 300] [--tokens 1,1024] [--shared-orders fused]
    python benchmarks/host_probe.py --breakdown [--tokens 1,1024]

``--breakdown`` times, in one process, each step of the one-rank forward on its own (router,
align, gate/up, down, sum, shared expert, each shared torch op, cuBLAS vs cuBLASLt) next to
the whole forward, plus a pure-Python calibration loop (leases of the device machine differ
in host speed by up to 2x; the loop says how fast this one is).
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
    compiled, direct, coop, pdl, _ = next(iter(_LAUNCH._cache.values()))
    if direct is not None:  # what a launch program's replay calls: the C launcher, args ready
        _, largs = _LAUNCH._prep(args)
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        fn, meta = compiled.function, compiled.packed_metadata
        print(f"C launcher, prepared args:  "
              f"{_per_call_us(lambda: direct(1, 1, 1, stream, fn, coop, pdl, None, None, meta, None, None, None, *largs)):7.2f} us")
    a2, b2 = torch.randn(16, 2048, device="cuda"), torch.randn(2048, 768, device="cuda")
    mm = torch.ops.aten.mm.default
    print(f"aten.mm.default (16x2048x768): {_per_call_us(lambda: mm(a2, b2)):7.2f} us")
    print(f"torch.mm (same):            {_per_call_us(lambda: torch.mm(a2, b2)):7.2f} us")
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


def _host_med(fn, n: int) -> float:
    """Median host µs of ``fn()`` issued with an idle device queue (sync before each)."""
    from moerun.bench.timing import host_issue_samples

    dev = torch.device("cuda")
    return statistics.median(host_issue_samples(lambda i: fn(), dev, n, warmup=10)) * 1e6


def _python_speed_us() -> float:
    """Median µs of 20 runs of the lease's calibration loop (:mod:`moerun.bench.host_core`)."""
    from moerun.bench.host_core import loop_samples

    return statistics.median(loop_samples(20))


def breakdown(name: str, tokens: int, n: int) -> None:
    """Host µs of each step of the one-rank forward on its own, next to the whole forward."""
    import torch.nn.functional as F

    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.down import down
    from moerun.backends.triton.gate_up import gate_up
    from moerun.bench.layer import LAYER_SHAPES
    from moerun.config import MoEConfig
    from moerun.layer import ConfigurableMoE

    s = LAYER_SHAPES[name]
    cfg = MoEConfig(num_experts=s.experts, top_k=s.top_k, hidden_size=s.hidden,
                    intermediate_size=s.intermediate, routing=s.routing, dtype=torch.bfloat16,
                    shared_intermediate_size=s.shared, check_inputs=False)
    bf = torch.bfloat16
    with torch.no_grad(), ConfigurableMoE(cfg, device="cuda", layer_idx=0) as layer:
        e, h, i = s.experts, s.hidden, s.intermediate
        w13 = torch.randn(e, 2 * i, h, device="cuda", dtype=bf) * h ** -0.5
        w2 = torch.randn(e, h, i, device="cuda", dtype=bf) * i ** -0.5
        shared = None
        if s.shared:
            shared = {"w13": torch.randn(2 * s.shared, h, device="cuda", dtype=bf) * h ** -0.5,
                      "w2": torch.randn(h, s.shared, device="cuda", dtype=bf) * s.shared ** -0.5}
        bias = torch.randn(e, device="cuda") if s.routing.uses_correction_bias else None
        layer.load_weights(w13, w2, shared, e_score_correction_bias=bias)
        del w13, w2
        x = torch.randn(tokens, h, device="cuda", dtype=bf)
        logits = torch.randn(tokens, e, device="cuda")
        be = layer.backend
        r = layer.router(logits, valid_rows=tokens)
        wts, ids = r.topk_weights, r.topk_ids.to(torch.int32)
        ec = be.config_for(e, i, h, tokens, s.top_k, bf)
        rows = {}
        rows["forward (whole)"] = _host_med(lambda: layer(x, logits), n)
        sched = layer.scheduler
        from schedulers import one_rank
        from moerun.comm.communicator import CollectiveCursor

        def entry():
            c = sched.agree_counts(layer, x, logits, None, CollectiveCursor(step=0))
            one_rank.applies(layer, c[0])

        rows["entry: agree_counts + applies"] = _host_med(entry, n)
        rows["router"] = _host_med(lambda: layer.router(logits, valid_rows=tokens), n)
        rows["run_experts"] = _host_med(lambda: be.run_experts(x, layer.w13, layer.w2, wts,
                                                               ids), n)
        rows["  config_for"] = _host_med(lambda: be.config_for(e, i, h, tokens, s.top_k, bf), n)
        print(f"  [{name} T={tokens}] config kernel={ec.kernel} combine={ec.combine} "
              f"block_m={ec.block_m}")
        if ec.kernel != "persistent":
            al = moe_align(ids, e, ec.block_m)
            act = gate_up(x, layer.w13, al, s.top_k, ec.gate_up)
            y = down(act, layer.w2, al, wts, s.top_k, ec.down) if ec.combine != "atomic" \
                else None
            rows["  moe_align"] = _host_med(lambda: moe_align(ids, e, ec.block_m), n)
            rows["  gate_up"] = _host_med(lambda: gate_up(x, layer.w13, al, s.top_k,
                                                          ec.gate_up), n)
            if y is not None:
                rows["  down"] = _host_med(lambda: down(act, layer.w2, al, wts, s.top_k,
                                                        ec.down), n)
                rows["  moe_sum"] = _host_med(lambda: moe_sum(y, ids, e), n)
        out = be.run_experts(x, layer.w13, layer.w2, wts, ids)
        if s.shared:
            se = layer.shared_expert
            rows["shared_mlp_add"] = _host_med(lambda: be.shared_mlp_add(se, x, out), n)
            g = F.linear(x, se.w13)
            a = F.silu(g[:, :s.shared]) * g[:, s.shared:]
            rows["  linear w13"] = _host_med(lambda: F.linear(x, se.w13), n)
            rows["  linear w2"] = _host_med(lambda: F.linear(a, se.w2), n)
            rows["  mm w2 (x @ w.t())"] = _host_med(lambda: torch.mm(a, se.w2.t()), n)
            buf = torch.empty(tokens, h, device="cuda", dtype=bf)
            rows["  mm w2 out="] = _host_med(lambda: torch.mm(a, se.w2.t(), out=buf), n)
            rows["  chunk"] = _host_med(lambda: g.chunk(2, dim=-1), n)
            rows["  silu"] = _host_med(lambda: F.silu(g[:, :s.shared]), n)
            rows["  add_"] = _host_med(lambda: buf.add_(out), n)
            for lib in ("cublas", "cublaslt"):
                try:
                    old = torch.backends.cuda.preferred_blas_library()
                    torch.backends.cuda.preferred_blas_library(lib)
                    rows[f"  linear w13 [{lib}]"] = _host_med(lambda: F.linear(x, se.w13), n)
                    rows[f"  shared_mlp_add [{lib}]"] = _host_med(
                        lambda: be.shared_mlp_add(se, x, out), n)
                    torch.backends.cuda.preferred_blas_library(old)
                except Exception as ex:  # noqa: BLE001 -- a probe: report and go on
                    rows[f"  [{lib}] failed: {ex!r:.60}"] = float("nan")
        # the same steps issued while the device is busy (a 2 ms sleep kernel queued first):
        # does a launch cost more host time when the queue is not idle?
        def busy(fn):
            return lambda: (torch.cuda._sleep(2_000_000), fn())

        rows["(sleep kernel alone)"] = _host_med(lambda: torch.cuda._sleep(2_000_000), n)
        rows["busy: forward (whole)"] = _host_med(busy(lambda: layer(x, logits)), n)
        rows["busy: run_experts"] = _host_med(
            busy(lambda: be.run_experts(x, layer.w13, layer.w2, wts, ids)), n)
        if s.shared:
            rows["busy: shared_mlp_add"] = _host_med(
                busy(lambda: be.shared_mlp_add(layer.shared_expert, x, out)), n)
        rows["forward (whole), again"] = _host_med(lambda: layer(x, logits), n)
        rows["torch.empty [T,H]"] = _host_med(lambda: torch.empty(tokens, h, device="cuda",
                                                                  dtype=bf), n)
        rows["torch.zeros (counters)"] = _host_med(
            lambda: torch.zeros(4 * 257, dtype=torch.int32, device="cuda"), n)
        print(f"\n== breakdown {name} T={tokens} (host µs, median of {n}, idle queue)")
        for k, v in rows.items():
            print(f"  {k:40s} {v:8.1f}")
        # what each launch program replays (its generated code: allocations and launches)
        for owner, cache in (("layer", layer.programs), ("router", layer.router._programs),
                             ("backend", be._programs)):
            for key, prog in list(cache._entries.items()):
                if prog:
                    print(f"  -- {owner} program ({prog.num_launches} launches):")
                    print("     " + prog.source.replace("\n", "\n     "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=300)
    parser.add_argument("--tokens", default="1", help="comma list of T (default 1)")
    parser.add_argument("--shared-orders", default="",
                        help="comma list of shared-expert orders to profile for deepseek-v3 "
                             "as well as its resolved one (default: none)")
    parser.add_argument("--top", type=int, default=45, help="profile rows printed (default 45)")
    parser.add_argument("--breakdown", action="store_true",
                        help="time each one-rank step alone instead of the cProfile")
    args = parser.parse_args()
    print(f"python calibration loop: {_python_speed_us():.0f} us")
    primitives()
    if args.breakdown:
        for t in (int(v) for v in args.tokens.split(",")):
            for name in ("qwen3-30b-a3b", "deepseek-v3"):
                breakdown(name, t, args.forwards)
        return
    for t in (int(v) for v in args.tokens.split(",")):
        for name in ("qwen3-30b-a3b", "deepseek-v3"):
            profile_forward(name, args.forwards, t, top=args.top)
        for order in filter(None, args.shared_orders.split(",")):
            profile_forward("deepseek-v3", args.forwards, t, order, top=args.top)


if __name__ == "__main__":
    main()
