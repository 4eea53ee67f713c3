"""Offline sm90 SASS of every fp8 Triton K-loop kernel the fp8 paths launch, captured through
a stubbed launcher on CPU tensors (Triton's ptxas and nvdisasm). Per backward-branch loop it
reports the ``LDG`` destinations read later in the same iteration: a wait for an L2 round
trip inside the step. README here has the table. Run from a tree's root:

    python3 loopcheck.py        (ONLY=text restricts the kernels; the SASS goes to /tmp/sass)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.getcwd())
SASS_DIR = "/tmp/sass"
OP = re.compile(r"/\*[0-9a-f]{4}\*/")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH = re.compile(r"BRA\s+`\((\.L_x_\d+)\)")
LOAD = re.compile(r"\bLDG\.E(?:\.\w+)*\s+(R\d+)")


def capture() -> list[tuple[str, object, tuple, int, int | None]]:
    """``(label, kernel, args, num_warps, num_stages)`` of every launch of the fp8 calls
    below, with ``FastLauncher`` stubbed (nothing runs)."""
    from moerun._triton import launch
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig
    from moerun.backends.triton.fp8 import run_experts_fp8
    from moerun.quant import QuantizedRows

    got: list = []
    label = [""]

    def fake_call(self, grid, *args, num_warps=4, num_stages=None):
        if self._pdl:
            args = (*args, True)
        got.append((label[0], self._kernel, args, num_warps, num_stages))

    launch.FastLauncher.__call__ = fake_call

    def codes(*size):
        return torch.zeros(*size, dtype=torch.uint8).view(torch.float8_e4m3fn)

    def cfg(bm, gn, dn, combine, kernel=None, paired=False, stages=3):
        kw = {} if kernel is None else {"kernel": kernel}
        return ExpertsConfig(
            block_m=bm, combine=combine,
            gate_up=GateUpConfig(block_n=gn, block_k=128, paired=paired, num_stages=stages),
            down=DownConfig(block_n=dn, block_k=128, num_stages=stages), **kw)

    s, h, i, k = 128, 2048, 768, 8  # qwen3-30b's local shape
    w13, s13 = codes(s, 2 * i, h), torch.ones(s, 2 * i // 128, h // 128)
    w2, s2 = codes(s, h, i), torch.ones(s, h // 128, i // 128)
    for name, m, c, quantized in [
        ("direct-atomic", 1, cfg(16, 32, 64, "atomic", "direct", stages=4), True),
        ("direct-atomic-float", 1, cfg(16, 32, 64, "atomic", "direct", stages=4), False),
        ("direct-reduce", 1, cfg(16, 32, 64, "reduce", "direct", stages=4), True),
        ("grouped-bm16", 16, cfg(16, 64, 128, "atomic"), True),
        ("grouped-gu256-dn256", 16, cfg(16, 256, 256, "reduce"), False),
        ("prefill-bm64", 256, cfg(64, 128, 128, "reduce"), True),
        ("paired", 256, cfg(64, 128, 128, "reduce", paired=True), True),
    ]:
        x = torch.zeros(m, h, dtype=torch.bfloat16)
        if quantized:
            x = QuantizedRows(data=codes(m, h), scale=torch.ones(m, h // 128), group=128)
        label[0] = name
        run_experts_fp8(x, w13, w2, s13, s2, torch.ones(m, k),
                        torch.zeros(m, k, dtype=torch.int32), c, torch.bfloat16)
    return got


def same_step_uses(lines: list[str], start: int, end: int) -> list[tuple[str, str]]:
    """In the loop body ``lines[start:end + 1]``: each LDG destination's first later reader
    in the same iteration, unless the register is overwritten first."""
    body, waits = lines[start:end + 1], []
    for n, line in enumerate(body):
        load = LOAD.search(line)
        if not load:
            continue
        reg = load.group(1)
        for later in body[n + 1:]:
            operands = re.sub(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?\S+\s+", "",
                              later.split(";")[0])
            parts = [p.strip() for p in operands.split(",")]
            reads = parts[1:] if len(parts) > 1 else parts
            if any(re.search(rf"\b{reg}\b", p) for p in reads):
                waits.append((reg, later.strip()[:70]))
                break
            if re.fullmatch(rf"{reg}(\.\w+)?", parts[0]):
                break  # overwritten before any read
    return waits


def main() -> None:
    import triton.backends.nvidia as nv

    from tests.sm90 import compile_sm90

    os.makedirs(SASS_DIR, exist_ok=True)
    nvdisasm = re.sub(r"ptxas$", "nvdisasm", nv.compiler.get_ptxas(90).path)
    only = os.environ.get("ONLY", "")
    for label, kernel, args, warps, stages in capture():
        name = kernel.fn.__name__
        if not any(t in name for t in ("fp8", "down_direct", "paired")) or \
                only not in label + name:
            continue
        built = compile_sm90(kernel, args, num_warps=warps, num_stages=stages)
        cubin = os.path.join(SASS_DIR, "t.cubin")
        with open(cubin, "wb") as f:
            f.write(built.asm["cubin"])
        sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
        with open(os.path.join(SASS_DIR, f"{label}-{name}.sass"), "w") as f:
            f.write(sass)
        lines = [ln for ln in sass.splitlines() if OP.search(ln) or LABEL.match(ln)]
        labels = {m.group(1): n for n, ln in enumerate(lines) if (m := LABEL.match(ln))}
        loops = []
        for n, line in enumerate(lines):
            branch = BRANCH.search(line)
            if branch and labels.get(branch.group(1), n) < n:  # a backward branch
                start = labels[branch.group(1)]
                waits = same_step_uses(lines, start, n)
                loads = sum("LDG" in ln for ln in lines[start:n + 1])
                loops.append((n - start + 1, loads, waits))
        print(f"{label:22s} {name:32s} loops (size, LDGs, same-step uses):",
              [(size, loads, len(w)) for size, loads, w in loops])
        for _, _, waits in loops:
            for reg, ins in waits:
                print(f"      same-step use of {reg} -> {ins}")


if __name__ == "__main__":
    main()
