"""Does a forward's host time depend on how long the host thread just waited? (issue 8)

A device-run probe, not a benchmark claim. For each layer shape and T it times one
``ConfigurableMoE.forward`` on the host in four ways, median of ``--forwards``:

* ``after sync``: ``torch.cuda.synchronize()`` then the timed forward (``moerun bench
  --layer``'s host figure; at large T the sync waits milliseconds for the previous forward);
* ``after sync + spin``: the same, with 300 µs of pure-Python work between the sync and the
  timed forward (the thread is running again when the forward starts);
* ``back to back``: after a sync, 8 forwards issued without a sync, total / 8;
* ``Python loop``: a fixed pure-Python loop timed right after the sync, as the forward would
  be (does the same Python run slower after a long wait?);
* ``A/B``: interleaved forward by forward, the layer with its whole-forward launch program,
  without it (the router's and backend's own programs), and the program alone.

``--steps`` times each step inside one forward (validation, key, program run...) after a
sync, after a warmed entry, back to back and after a 1 ms sleep, and one C-launcher launch on
an idle and a busy device; ``--record-cost`` a fresh layer's first three forwards (plain,
recording, replay).

    python benchmarks/host_state_probe.py [--forwards 100] [--tokens 1,1024] [--shapes ...]
    python benchmarks/host_state_probe.py --steps | --record-cost
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _loop() -> int:
    t = 0
    for i in range(2000):
        t += i & 7
    return t


def _timed(fn, n: int, *, spin_us: float = 0.0, batch: int = 1) -> float:
    out = []
    for _ in range(n):
        torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
        if spin_us:
            _spin(spin_us)
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        out.append((time.perf_counter() - t0) / batch * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def _setup(name: str, tokens: int):
    """The bench's own layer pieces (``moerun.bench.layer``): the shape, bf16 CUDA settings,
    random weights, and fresh ``x`` / logits of ``tokens`` rows."""
    from moerun.bench.layer import LAYER_SHAPES, LayerSettings, make_weights

    shape = LAYER_SHAPES[name]
    settings = LayerSettings(device=torch.device("cuda"), dtype=torch.bfloat16)
    weights = make_weights(shape, settings, seed=tokens)
    x = torch.randn(tokens, shape.hidden, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(tokens, shape.experts, device="cuda")
    return shape, settings, weights, x, logits


def probe(name: str, tokens: int, n: int) -> None:
    from moerun.bench.layer import build_layer

    shape, settings, weights, x, logits = _setup(name, tokens)
    with torch.no_grad(), build_layer(shape, settings, weights) as layer:
        del weights
        fwd = lambda: layer(x, logits)  # noqa: E731
        for _ in range(10):
            fwd()
        rows = {
            "forward, after sync": _timed(fwd, n),
            "forward, after sync + 300 us spin": _timed(fwd, n, spin_us=300),
            "forward, back to back (8, per forward)": _timed(fwd, max(n // 4, 5), batch=8),
            "forward, after sync (again)": _timed(fwd, n),
        }
        # the same Python loop after the wait for one forward's device work
        loop_rows = {}
        for label, spin in (("after sync", 0.0), ("after sync + 300 us spin", 300.0)):
            out = []
            for _ in range(n):
                fwd()
                torch.cuda.synchronize()
                if spin:
                    _spin(spin)
                t0 = time.perf_counter()
                _loop()
                out.append((time.perf_counter() - t0) * 1e6)
            loop_rows[f"Python loop, {label} (a forward's wait)"] = statistics.median(out)
        out = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _loop()
            out.append((time.perf_counter() - t0) * 1e6)
        loop_rows["Python loop, after an idle sync"] = statistics.median(out)
        # A/B in one process, interleaved sample by sample: the layer's whole-forward program
        # against the same path issued through the router's and backend's own programs
        from schedulers import one_rank

        straight = one_rank.applies(layer, tokens)
        (program,) = [p for p in layer.programs._entries.values() if p]
        params = one_rank._parameters(layer)
        whole = layer.programs

        class _Plain:  # the layer without its whole-forward program: per-call programs
            def call(self, key, inputs, fn, **kw):
                return fn()

        def per_call():
            layer.programs = _Plain()
            try:
                return layer(x, logits)
            finally:
                layer.programs = whole

        variants = {
            "A/B: layer(x) (whole-forward program)": fwd,
            "A/B: layer(x), per-call programs (before)": per_call,
            "A/B: one_rank.issue (per-call programs)":
                lambda: one_rank.issue(layer, x, logits, straight, None),
            "A/B: the program alone": lambda: program(x, logits, *params),
        }
        ab = {k: [] for k in variants}
        for _ in range(n):
            for k, f in variants.items():
                torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
                t0 = time.perf_counter()
                f()
                ab[k].append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        rows.update({k: statistics.median(v) for k, v in ab.items()})
        print(f"\n== {name} T={tokens} (host µs, median of {n})")
        for k, v in {**rows, **loop_rows}.items():
            print(f"  {k:52s} {v:8.1f}")


def steps(name: str, tokens: int, n: int) -> None:
    """Host µs of each step of one layer forward, timed inside the same call (perf_counter
    between the steps of ``ConfigurableMoE.forward``'s one-rank path), median of ``n``."""
    from moerun.bench.layer import build_layer

    shape, settings, weights, x, logits = _setup(name, tokens)
    with torch.no_grad(), build_layer(shape, settings, weights) as layer:
        del weights
        for _ in range(5):
            layer(x, logits)
        sched = layer.scheduler
        names = ("is_compiling", "agree_counts", "applies", "parameters", "key", "cache get",
                 "program checks", "program run", "counters")
        for mode in ("after sync", "after sync, entry run once untimed",
                     "after an untimed forward, no sync", "after sync + 1 ms sleep"):
            _steps(layer, sched, x, logits, names, n, mode, f"{name} T={tokens}")


def _steps(layer, sched, x, logits, names, n, mode, title) -> None:
    from moerun._triton import launch as _launch
    from moerun._triton.program import layout_key
    from moerun.comm import CollectiveCursor
    from schedulers import one_rank

    samples = {k: [] for k in names}
    total = []
    pc = time.perf_counter
    for _ in range(n):
        torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
        if mode == "after sync, entry run once untimed":
            c = sched.agree_counts(layer, x, logits, None, CollectiveCursor(step=layer.step))
            one_rank.applies(layer, c[0])
            p = one_rank._parameters(layer)
            layer.programs._entries.get((None, layout_key((x, logits)),
                                         tuple(q.data_ptr() for q in p)))
        elif mode == "after an untimed forward, no sync":
            layer(x, logits)
        elif mode == "after sync + 1 ms sleep":
            time.sleep(0.001)
        t = [pc()]
        torch.compiler.is_compiling()
        t.append(pc())
        counts = sched.agree_counts(layer, x, logits, None, CollectiveCursor(step=layer.step))
        t.append(pc())
        straight = one_rank.applies(layer, counts[0])
        t.append(pc())
        params = one_rank._parameters(layer)
        t.append(pc())
        key = (straight, layout_key((x, logits)), tuple(p.data_ptr() for p in params))
        t.append(pc())
        program = layer.programs._entries.get(key)
        t.append(pc())
        run = program._run
        _launch._hooks_installed(program._runtime)
        torch._C._cuda_getDevice()
        t.append(pc())
        run(x, logits, *params)
        t.append(pc())
        layer._counters.advance(layer.repeat_count)
        t.append(pc())
        for k, a, b in zip(names, t[:-1], t[1:], strict=True):
            samples[k].append((b - a) * 1e6)
        total.append((t[-1] - t[0]) * 1e6)
    torch.cuda.synchronize()
    print(f"\n== steps {title}, {mode} (host µs, median of {n}, in one call)")
    for k in names:
        print(f"  {k:52s} {statistics.median(samples[k]):8.1f}")
    print(f"  {'total':52s} {statistics.median(total):8.1f}")


def record_cost(name: str, tokens: int) -> None:
    """Host µs of a fresh layer's first three forwards of a shape (kernels already compiled
    by another layer): plain (the key is marked), recording, replay; then the median replay."""
    from moerun.bench.layer import build_layer

    shape, settings, weights, x, logits = _setup(name, tokens)
    times = []
    with torch.no_grad():
        for _ in range(2):  # the first layer compiles the kernels
            with build_layer(shape, settings, weights) as layer:
                times = []
                for _ in range(23):
                    torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
                    t0 = time.perf_counter()
                    layer(x, logits)
                    times.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
    print(f"\n== first forwards of a fresh layer, {name} T={tokens} (host µs)")
    print(f"  1st (plain, key marked) {times[0]:8.1f}   2nd (recording) {times[1]:8.1f}   "
          f"3rd (replay) {times[2]:8.1f}   median of 20 replays {statistics.median(times[3:]):8.1f}")


def busy_launches(n: int) -> None:
    """10 launches of a tiny kernel through its C launcher: idle device, behind a 2 ms sleep
    kernel, behind a 2 GB device copy (memory traffic)."""
    from moerun.config import RoutingConfig
    from moerun.routing.kernel import _LAUNCH, block_rows, kernel_spec

    logits = torch.randn(1, 128, device="cuda")
    w = torch.empty(1, 8, device="cuda")
    ids = torch.empty(1, 8, dtype=torch.int32, device="cuda")
    spec = kernel_spec(RoutingConfig(method="softmax_topk"))
    args = (logits, w, w, ids, 1, 1, logits.stride(0), 1.0, 128, 128, 8, 8, block_rows(128),
            spec.sigmoid, spec.has_bias, spec.group_score, 1, 1, 1, spec.renormalize, spec.eps)
    _LAUNCH((1,), *args, num_warps=4)
    compiled, direct, coop, pdl, _ = next(iter(_LAUNCH._cache.values()))
    _, largs = _LAUNCH._prep(args)
    stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
    fn, meta = compiled.function, compiled.packed_metadata
    src = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def ten():
        for _ in range(10):
            direct(1, 1, 1, stream, fn, coop, pdl, None, None, meta, None, None, None, *largs)

    rows = {}
    for label, before in (("idle device", None),
                          ("behind a 2 ms sleep kernel", lambda: torch.cuda._sleep(2_000_000)),
                          ("behind a 1 GiB copy", lambda: dst.copy_(src))):
        out = []
        for _ in range(n):
            torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
            if before is not None:
                before()
            t0 = time.perf_counter()
            ten()
            out.append((time.perf_counter() - t0) / 10 * 1e6)
        torch.cuda.synchronize()
        rows[label] = statistics.median(out)
    print("\n== one C-launcher launch (µs, median of 10-launch bursts)")
    for k, v in rows.items():
        print(f"  {k:52s} {v:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=100)
    parser.add_argument("--tokens", default="1,1024")
    parser.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v3")
    parser.add_argument("--steps", action="store_true",
                        help="time each step of the forward inside one call, and one launch "
                             "on an idle and a busy device, instead")
    parser.add_argument("--record-cost", action="store_true",
                        help="time a fresh layer's first forwards (plain, recording, replay)")
    args = parser.parse_args()
    import os

    print(f"cpu affinity: {sorted(os.sched_getaffinity(0))}")
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from host_probe import _python_speed_us

    print(f"python calibration loop: {_python_speed_us():.0f} us")
    if args.record_cost:
        for t in (int(v) for v in args.tokens.split(",")):
            for name in args.shapes.split(","):
                record_cost(name, t)
        return
    if args.steps:
        busy_launches(args.forwards)
        for t in (int(v) for v in args.tokens.split(",")):
            for name in args.shapes.split(","):
                steps(name, t, args.forwards)
        return
    for t in (int(v) for v in args.tokens.split(",")):
        for name in args.shapes.split(","):
            probe(name, t, args.forwards)


if __name__ == "__main__":
    main()
