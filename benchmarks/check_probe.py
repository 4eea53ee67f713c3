"""Where does ``check_inputs=True`` spend its host time on one CUDA rank? (issue 8)

A device-run probe, not a benchmark claim. For each layer shape and T it times, on the host,
one call of each variant below right after ``torch.cuda.synchronize()`` (as ``moerun bench
--layer`` does), the variants interleaved call by call so lease drift hits them alike;
median of ``--forwards`` per variant, in µs. Each variant is timed in two host states:

* ``cold``: an untimed unchecked forward is issued before the sync, so the sync waits for a
  forward's device work (the state every sample of ``moerun bench --layer``'s host figures
  starts in: the previous sample was a forward);
* ``hot``: nothing is issued before the sync (the previous call was a short one).

Variants: ``fwd`` (``check_inputs=False``), ``fwd+chk`` (``check_inputs=True``), ``scan``
(``bool(torch.isfinite(logits).all())`` alone), ``scan>fwd`` (that scan, then the unchecked
forward), ``isfinite`` (one op), ``py-loop`` (a fixed pure-Python loop). The layer's config
is swapped outside the timed region.

    python benchmarks/check_probe.py [--forwards 200] [--tokens 1,1024] [--shapes ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def probe(name: str, tokens: int, n: int) -> None:
    from host_state_probe import _loop, _setup  # that probe's layer pieces and Python loop

    from moerun.bench.layer import build_layer

    shape, settings, weights, x, logits = _setup(name, tokens)
    with torch.no_grad(), build_layer(shape, settings, weights) as layer:
        del weights
        off = layer.config
        on = off.replace(check_inputs=True)

        def fwd():
            layer(x, logits)

        def scan():
            bool(torch.isfinite(logits).all())

        def scan_fwd():
            scan()
            fwd()

        variants = {  # name: (config, call)
            "fwd": (off, fwd), "fwd+chk": (on, fwd), "scan": (off, scan),
            "scan>fwd": (off, scan_fwd), "isfinite": (off, lambda: torch.isfinite(logits)),
            "py-loop": (off, _loop),
        }
        for cfg, fn in variants.values():  # warm: compile, record, replay
            layer.config = cfg
            for _ in range(4):
                fn()
        times: dict[str, list[float]] = {f"{k}/{s}": [] for s in ("cold", "hot")
                                         for k in variants}
        for _ in range(n):
            for state in ("cold", "hot"):
                for k, (cfg, fn) in variants.items():
                    layer.config = off
                    if state == "cold":
                        fwd()
                    layer.config = cfg
                    torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
                    t0 = time.perf_counter()
                    fn()
                    times[f"{k}/{state}"].append((time.perf_counter() - t0) * 1e6)
        layer.config = off
        torch.cuda.synchronize()
        med = {k: statistics.median(v) for k, v in times.items()}
        for state in ("cold", "hot"):
            m = {k.split("/")[0]: v for k, v in med.items() if k.endswith(state)}
            print(f"{name:14s} T={tokens:<5d} {state:4s} "
                  + " ".join(f"{k} {v:7.1f}" for k, v in m.items())
                  + f" | fwd+chk-fwd {m['fwd+chk'] - m['fwd']:7.1f} scan>fwd-fwd "
                  f"{m['scan>fwd'] - m['fwd']:7.1f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forwards", type=int, default=200)
    p.add_argument("--tokens", default="1,1024")
    p.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v3")
    a = p.parse_args()
    for name in a.shapes.split(","):
        for t in (int(v) for v in a.tokens.split(",")):
            probe(name, t, a.forwards)


if __name__ == "__main__":
    main()
