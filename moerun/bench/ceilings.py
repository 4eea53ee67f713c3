"""Ceilings measured in the same run, and the floor of one benchmark cell: the one floor
definition of moerun (``moerun bench``, ``moerun tune``, the GPU tests; issue 11).

Floor (METHOD: "two numbers first") of one expert-compute call with ``T`` tokens, top-k ``K``:

* compute: ``2 * T * K * 3 * H * I`` FLOP (gate, up and down GEMMs) over the matmul rate;
* memory: ``hit * 3 * H * I * elt + 2 * T * H * elt`` bytes (each hit expert's weights read
  once, ``x`` read and ``out`` written once) over the bandwidth ceiling ``BW``;

``floor = max(compute, memory)``; the larger term names the cell ``"compute"``- or
``"memory"``-bound. ``elt`` is the element size of the benchmark dtype (2 for bf16).

``BW = max(read_bw, copy_bw)`` with ``copy_bw`` counted as **bytes read plus bytes written**
per second of a device-to-device copy. Why this byte term: the memory term above counts every
byte that crosses the memory interface, reads and writes alike (``out`` is a write), so the
ceiling must be a rate of the same bytes; a copy of N bytes moves 2N, and ``copy/2`` (the
older ``_bench.py`` definition, still used by the peer file's own ``floor_us``) would count
only half of the traffic it moved. Of the two access patterns measured, the larger rate is
taken because a floor is a lower bound on time: it must use the best rate the device was
seen to sustain, or a kernel could run "below its floor". On an H200 the copy (r+w) is ~3 %
above the read-only rate, so this floor is ~3 % below the peer file's ``floor_us`` for
memory-bound cells; peer times are scaled with this same ``BW`` on both sides (``peers.py``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from moerun.bench.shapes import BenchShape
from moerun.bench.timing import time_samples

__all__ = ["Ceilings", "Floor", "floor_for", "measure_ceilings", "measure_run_ceilings",
           "parse_ceilings"]

_GIB = 2 ** 30


@dataclass(frozen=True, kw_only=True)
class Ceilings:
    """What the device sustains, measured once per run.

    Fields:
        read_bw: B/s of a read-only reduction (``sum``) over ``read_bytes``.
        copy_bw: (bytes read + bytes written) / time of a device-to-device copy.
        flops: FLOP/s of a square ``matmul_size`` matmul on random ``matmul_dtype`` data.
        read_bytes / matmul_size / matmul_dtype: how they were measured (0 / "given" when
            passed with ``--ceilings``).
    """

    read_bw: float
    copy_bw: float
    flops: float
    read_bytes: int = 0
    matmul_size: int = 0
    matmul_dtype: str = "given"

    @property
    def bandwidth(self) -> float:
        """The bandwidth ceiling ``BW = max(read_bw, copy_bw)`` (module docstring: why)."""
        return max(self.read_bw, self.copy_bw)

    def describe(self) -> str:
        """One line of the three ceilings, the bandwidth used, and how they were measured.

        Pure; host only."""
        how = (f" (read over {self.read_bytes / 2**30:.3g} GiB; matmul {self.matmul_dtype} "
               f"{self.matmul_size}^3)" if self.read_bytes else " (given)")
        return (f"read {self.read_bw / 1e12:.3f} TB/s, copy r+w {self.copy_bw / 1e12:.3f} TB/s "
                f"-> BW {self.bandwidth / 1e12:.3f} TB/s; matmul {self.flops / 1e12:.1f} "
                f"TFLOP/s{how}")


@dataclass(frozen=True, kw_only=True)
class Floor:
    """The floor of one cell: ``flops`` and ``bytes`` counted, their times in µs."""

    flops: float
    bytes: float
    compute_us: float
    memory_us: float

    @property
    def us(self) -> float:
        return max(self.compute_us, self.memory_us)

    @property
    def bound(self) -> str:
        """``"memory"`` when the memory term is the larger (ties count as memory)."""
        return "memory" if self.memory_us >= self.compute_us else "compute"


def floor_for(shape: BenchShape, tokens: int, experts_hit: float, elt: int,
              ceilings: Ceilings) -> Floor:
    """Floor of ``tokens`` tokens of ``shape`` with ``experts_hit`` distinct experts routed
    (a mean over routings may be fractional), ``elt``-byte elements. Pure arithmetic."""
    h, i, k = shape.hidden, shape.intermediate, shape.top_k
    flops = 2.0 * tokens * k * 3 * h * i
    nbytes = experts_hit * 3 * h * i * elt + 2.0 * tokens * h * elt
    return Floor(flops=flops, bytes=nbytes, compute_us=flops / ceilings.flops * 1e6,
                 memory_us=nbytes / ceilings.bandwidth * 1e6)


def parse_ceilings(text: str) -> Ceilings:
    """``"READ_BW,COPY_BW,FLOPS"`` (B/s, B/s, FLOP/s; floats such as ``4.1e12``) -> Ceilings.

    Pure; host only."""
    try:
        read_bw, copy_bw, flops = (float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--ceilings {text!r}: expected READ_BW,COPY_BW,FLOPS (three numbers, "
                         "B/s, B/s, FLOP/s)") from None
    if min(read_bw, copy_bw, flops) <= 0:
        raise ValueError(f"--ceilings {text!r}: every value must be > 0")
    return Ceilings(read_bw=read_bw, copy_bw=copy_bw, flops=flops)


def measure_ceilings(device: torch.device, *, read_bytes: int, matmul_size: int,
                     matmul_dtype: torch.dtype, repeats: int = 10, seed: int = 0) -> Ceilings:
    """Measure the three ceilings on ``device`` (medians of ``repeats`` timed runs after a
    warm-up; device events on CUDA, a host clock on CPU). Data is random, never zeros.

    Allocates ``read_bytes`` (fp32 elements) plus half of it for the copy's destination, and
    three ``matmul_size``-square matrices; all freed before returning. Host syncs: yes.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    n = read_bytes // 4
    buf = torch.randn(n, generator=g, device=device, dtype=torch.float32)
    read_s = statistics.median(time_samples(lambda _: buf.sum(), device, repeats, warmup=2))
    half = buf[: n // 2]
    dst = torch.empty_like(half)
    copy_s = statistics.median(time_samples(lambda _: dst.copy_(half), device, repeats,
                                            warmup=2))
    copy_bytes = 2 * half.numel() * 4
    del buf, half, dst
    a = torch.randn(matmul_size, matmul_size, generator=g, device=device).to(matmul_dtype)
    b = torch.randn(matmul_size, matmul_size, generator=g, device=device).to(matmul_dtype)
    c = torch.empty(matmul_size, matmul_size, device=device, dtype=matmul_dtype)
    mm_s = statistics.median(time_samples(lambda _: torch.mm(a, b, out=c), device, repeats,
                                          warmup=3))
    del a, b, c
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Ceilings(read_bw=n * 4 / read_s, copy_bw=copy_bytes / copy_s,
                    flops=2.0 * matmul_size ** 3 / mm_s, read_bytes=n * 4,
                    matmul_size=matmul_size, matmul_dtype=str(matmul_dtype).replace("torch.", ""))


def measure_run_ceilings(device: torch.device, dtype: torch.dtype, *,
                         read_bytes: int | None = None, matmul_size: int | None = None,
                         seed: int = 0) -> Ceilings:
    """:func:`measure_ceilings` with the run defaults of ``moerun bench`` and ``moerun tune``:
    a 2 GiB read buffer and an 8192-square ``dtype`` matmul on CUDA (64 MiB / 512 on CPU).

    Allocates and times work on ``device``; host syncs (timers): not capturable."""
    cuda = device.type == "cuda"
    return measure_ceilings(device, read_bytes=read_bytes or (2 * _GIB if cuda else 64 * 2 ** 20),
                            matmul_size=matmul_size or (8192 if cuda else 512),
                            matmul_dtype=dtype, seed=seed)
