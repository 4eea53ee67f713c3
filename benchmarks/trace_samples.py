"""Sample traces of every shared-expert order on one GPU (issue 9; ``traces/samples/``).

For each order (and a 16-SM partition of the aux stream) a DeepSeek-V3-like layer (E=32: the
experts one rank holds under EP8, top-8, H=7168, I=2048, one shared expert of 2048) runs
T=1024 tokens: two warm-up forwards, then one forward captured with ``traces.capture`` and
written as ``trace-<order>.json``, ``report-<order>.txt``/``.json`` (the resolution report
and ``traces.overlap``'s figures) and ``timeline-<order>.png`` into ``--out``; the overlap
figures are printed. Usage (GPU): ``python benchmarks/trace_samples.py --out DIR``.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    from moerun.bench.layer import LayerSettings, build_layer, make_weights
    from moerun.bench.shared_command import shared_shapes
    from moerun.cli_run import write_trace_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    shape = shared_shapes(True)[0]
    settings = LayerSettings(device=torch.device("cuda"), dtype=torch.bfloat16)
    weights = make_weights(shape, settings, 0)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(args.tokens, shape.hidden, generator=g, device="cuda",
                    dtype=torch.bfloat16)
    logits = torch.randn(args.tokens, shape.experts, generator=g, device="cuda")
    # NOTE: no SM-partition sample: the profiler's CUDA activity aborted the process on a
    # green-context stream (torch 2.11, H200, 2026-12-01)
    for order, sms in (("sequential", None), ("aux_stream", None), ("during_combine", None),
                       ("fused", None)):
        tag = order if sms is None else f"{order}-{sms}sms"
        layer = build_layer(shape, settings, weights, shared_expert_order=order,
                            shared_partition_sms=sms)

        def forward():
            with torch.no_grad():
                out = layer(x, logits)
            torch.cuda.synchronize()
            return out

        forward()
        forward()
        files = write_trace_bundle(forward, layer, args.out, tag=tag,
                                   title=f"H200, {shape.name}, T={args.tokens}, shared {tag}")
        pct = files["hidden_shared_pct"]
        print(f"{tag:22s} hidden shared {'-' if pct is None else f'{pct:5.1f} %'}  "
              f"files {files['trace']}")
        layer.close()


if __name__ == "__main__":
    main()
