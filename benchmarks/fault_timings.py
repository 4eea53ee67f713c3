"""How long surviving ranks take to fail in the fault matrix of ``tests/test_faults.py``
(3 gloo ranks, the tests' worker pool and 1 s budget): per (mode, phase) the min and max, over
every case and surviving rank, of the time to the error, of ``close()`` and of the refused
forward that follows. A CPU probe of the issue 14 bars, not a GPU performance claim.
Usage, from the repository root (about 2 minutes on 2 cores):

    python benchmarks/fault_timings.py
"""

from __future__ import annotations

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import fault_tasks  # noqa: E402
from tests.mp_pool import close_pools, get_pool  # noqa: E402
from tests.test_faults import BUDGET_S, MATRIX  # noqa: E402


def main() -> None:
    pool = get_pool(3)
    stats: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    try:
        for case in MATRIX:
            results = pool.run(fault_tasks.fault_task, budget_s=BUDGET_S, allow_errors=True,
                               respawn_after=case["mode"] == "exit", timeout=60, **case)
            for rank, res in enumerate(results):
                if rank == case["faulty_rank"]:
                    continue
                stats[(case["mode"], case["phase"])].append(res["elapsed"])
                stats[(case["mode"], "close()")].append(res["close_s"])
                stats[(case["mode"], "refused forward")].append(res["refuse_s"])
    finally:
        close_pools()
    print(f"budget {BUDGET_S} s; {len(MATRIX)} cases")
    for (mode, what), values in sorted(stats.items()):
        print(f"{mode:6s} {what:16s} n={len(values):2d} min {min(values):.3f} s "
              f"max {max(values):.3f} s")


if __name__ == "__main__":
    main()
