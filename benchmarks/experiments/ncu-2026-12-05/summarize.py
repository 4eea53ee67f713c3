"""Summarize ``run.sh``'s ``all.csv``: per profiled kernel of at least 50 µs, the duration,
the SM clock and the throughputs that say what bounds it (README here).

    python3 summarize.py all.csv
"""

from __future__ import annotations

import csv
import io
import re
import sys

WANT = [
    ("clk MHz", r"^(sm|gpc|smsp)__cycles_elapsed\.avg\.per_second$", 1e-6),
    ("SM %", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
    ("L2 %", r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
    ("L2 TB/s", r"^lts__t_bytes\.sum\.per_second$", 1e-12),
    ("L2 hit %", r"^lts__t_sector_hit_rate\.pct$", 1),
    ("DRAM %", r"^(gpu__)?dram__throughput\.avg\.pct_of_peak_sustained_elapsed$", 1),
    ("L1/smem %", r"^l1tex__throughput\.avg\.pct_of_peak_sustained_active$", 1),
    ("regs", r"^launch__registers_per_thread$", 1),
    ("smem KB", r"^launch__shared_mem_per_block$", 1 / 1024),
]
PIPE = re.compile(r"^.*pipe.*(tensor|gmma|hmma|qmma|imma).*$")
STALL = re.compile(r"^smsp__average_warp(s)?_issue_stalled_(.*)_per_issue_active\.ratio$")


def blocks(text: str):
    name, lines = None, []
    for line in text.splitlines():
        if line.startswith("#TARGET "):
            if name is not None:
                yield name, lines
            name, lines = line[8:].strip(), []
        elif not line.startswith("==") and line.strip():
            lines.append(line)
    if name is not None:
        yield name, lines


def num(v: str) -> float | None:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def main(path: str) -> None:
    for target, lines in blocks(open(path).read()):
        print(f"### {target}")
        if len(lines) < 3:
            print("   (no rows)")
            continue
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
        head, units, data = rows[0], rows[1], rows[2:]
        col = {h: i for i, h in enumerate(head)}
        dur_i = col.get("gpu__time_duration.sum")
        for r in data:
            if dur_i is None or len(r) != len(head):
                continue
            dur = num(r[dur_i]) or 0.0
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                     "msecond": 1e3}.get(units[dur_i], 1.0)
            us = dur * scale
            if us < 50:
                continue
            kname = r[col.get("Kernel Name", 0)][:60]
            parts = [f"{us:9.1f} us  {kname}"]
            for label, pat, mul in WANT:
                for h, i in col.items():
                    if re.match(pat, h) and num(r[i]) is not None:
                        parts.append(f"{label} {num(r[i]) * mul:.1f}")
                        break
            pipes = [(h, num(r[i])) for h, i in col.items() if PIPE.match(h)]
            pipes = [(h, v) for h, v in pipes if v]
            stalls = [(STALL.match(h).group(2), num(r[i])) for h, i in col.items()
                      if STALL.match(h) and num(r[i])]
            stalls.sort(key=lambda hv: -hv[1])
            print("  " + " | ".join(parts))
            for h, v in pipes:
                print(f"      {h} = {v:.1f}")
            print("      stalls/issue: " + ", ".join(f"{n} {v:.2f}" for n, v in stalls[:6]))


if __name__ == "__main__":
    main(sys.argv[1])
