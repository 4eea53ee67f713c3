"""Old against new per cell from the A/B's ``moerun bench --dtype fp8 --out`` JSON files
(``{old,new}-{group}-{round}.json``): the median over rounds of each tree's fp8 time, their
ratio, and the bf16 column's ratio (unchanged kernels: the drift between the processes).

    python3 summarize.py DIR
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
import sys


def main(folder: str) -> int:
    runs: dict[tuple[str, str], dict[str, list[float]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*-*-*.json"))):
        m = re.match(r"(old|new)-(\w+)-(\d+)\.json", os.path.basename(path))
        if not m:
            continue
        for c in json.load(open(path))["cells"]:
            key = (f"{c['shape']} T={c['tokens']} {c['method']}", m.group(1))
            slot = runs.setdefault(key, {"fp8": [], "bf16": [], "floor": []})
            slot["fp8"].append(c["fp8_us"])
            slot["bf16"].append(c["bf16_us"] or float("nan"))
            slot["floor"].append(c["floor_fp8_us"])
    cells = sorted({k for k, _ in runs}, key=lambda s: (s.split()[0], int(s.split()[1][2:])))
    print(f"{'cell':36s} {'old fp8':>9s} {'new fp8':>9s} {'new/old':>8s} {'bf16 n/o':>9s} "
          f"{'floor/time old':>15s} {'new':>6s}  rounds")
    logs = []
    for cell in cells:
        o, n = runs.get((cell, "old")), runs.get((cell, "new"))
        if not o or not n:
            continue
        fo, fn = statistics.median(o["fp8"]), statistics.median(n["fp8"])
        bo, bn = statistics.median(o["bf16"]), statistics.median(n["bf16"])
        fl = statistics.median(o["floor"] + n["floor"])
        logs.append(fn / fo)
        print(f"{cell:36s} {fo:9.1f} {fn:9.1f} {fn / fo:8.3f} {bn / bo:9.3f} {fl / fo:15.3f} "
              f"{fl / fn:6.3f}  {len(o['fp8'])}/{len(n['fp8'])}")
        print(f"    old {['%.1f' % v for v in o['fp8']]}  new {['%.1f' % v for v in n['fp8']]}")
    if logs:
        geo = statistics.geometric_mean(logs)
        print(f"geomean new/old over {len(logs)} cells: {geo:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
