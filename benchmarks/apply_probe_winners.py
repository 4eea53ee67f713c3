"""Copy the shipped bf16 config files into ``OUT_DIR`` and merge into them the winners of a
``persistent_probe.py`` JSON that beat the shipped config by more than ``--min-gain``
(device script, issue 11; then ``MOERUN_TRITON_CONFIG_DIR=OUT_DIR moerun bench`` times them).

    python3 benchmarks/apply_probe_winners.py PROBE_JSON OUT_DIR [--min-gain 0.02]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "moerun" / "backends" / "triton" / "configs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe")
    ap.add_argument("out_dir")
    ap.add_argument("--min-gain", type=float, default=0.02)
    a = ap.parse_args()
    report = json.loads(Path(a.probe).read_text())
    out = Path(a.out_dir)
    shutil.copytree(SHIPPED, out, dirs_exist_ok=True)
    speedups = {(c["shape"], c["T"]): c.get("speedup") for c in report["cells"]}
    for w in report["winners"]:
        gain = speedups.get((w["shape"], w["T"]))
        if w["kind"] != "persistent" or gain is None or gain <= 1 + a.min_gain:
            print(f"keep {w['shape']} T={w['T']} (speedup {gain})")
            continue
        device = report["device"].replace(" ", "_")
        path = out / f"S{w['S']}_N{w['N']}_K{w['K']}_bfloat16_{device}.json"
        data = json.loads(path.read_text())
        entry = dict(w["tuned_entry"], T=w["T"], date=report["date"][:10],
                     source="benchmarks/persistent_probe.py (one H200)")
        data["entries"][str(w["bucket"])] = entry
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path.name} bucket {w['bucket']}: speedup {gain:.3f}")


if __name__ == "__main__":
    main()
