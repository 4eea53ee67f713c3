"""Print the per-kernel lines of ``run2.sh``'s or ``run3.sh``'s Nsight Compute CSV (each
target's ``--page raw`` rows behind a ``#TARGET`` line; ``summarize.blocks`` splits them).

    python3 ncu_table.py variants ncu2.csv    # duration, DRAM, L2 hit, tensor, L2, clock
    python3 ncu_table.py breakdown ncu3.csv   # the largest % metrics (lts__throughput inputs)
"""

from __future__ import annotations

import csv
import io
import sys

from summarize import blocks, num


def main(mode: str, path: str) -> None:
    for name, lines in blocks(open(path).read()):
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
        if len(rows) < 3:
            print(name, "no rows")
            continue
        head = rows[0]
        col = {k: i for i, k in enumerate(head)}
        for r in rows[2:]:
            if len(r) != len(head):
                continue
            kernel = r[col["Kernel Name"]][:28]
            if mode == "breakdown":
                pct = sorted(((num(r[i]), k) for k, i in col.items()
                              if "pct" in k and num(r[i]) is not None), reverse=True)
                print(name, kernel, " | ".join(f"{k.split('.')[0]} {v:.0f}" for v, k in pct[:7]))
                continue

            def f(k, r=r, col=col):
                return num(r[col[k]])

            tensor = f("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed")

            print(f"{name:32s} {kernel:28s} {f('gpu__time_duration.sum') / 1e3:9.1f} us "
                  f"DRAM {f('dram__bytes.sum') / 1e9:6.2f} GB "
                  f"L2hit {f('lts__t_sector_hit_rate.pct'):5.1f} "
                  f"tensor {tensor:5.1f} "
                  f"L2 {f('lts__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} "
                  f"clk {f('gpc__cycles_elapsed.avg.per_second') / 1e6:6.0f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
