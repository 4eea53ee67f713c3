"""After ``prefetch_probe.py``: a copy of the shipped config files in which each probed
cell's T bucket holds the A/B's fastest prefetching config, where it beat the fastest
non-prefetching one of the same rounds (else the entry is left as shipped). Prints one line
per cell; ``moerun bench`` then runs against the copy (``MOERUN_TRITON_CONFIG_DIR``) and the
shipped files in the same call.

    python3 write_winner.py --probe probe.json --out-dir /tmp/cfg-pf
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from moerun.backends.triton.configs import bucket_of, config_file_name
from moerun.bench.shapes import parse_shapes

SHIPPED = Path(__file__).resolve().parents[3] / "moerun" / "backends" / "triton" / "configs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in SHIPPED.glob("*.json"):
        shutil.copy(f, out / f.name)
    probe = json.loads(Path(args.probe).read_text())
    device = probe["device"]
    for rec in probe["cells"]:
        on = {k: v for k, v in rec["ab"].items() if v["config"]["gate_up"].get("prefetch")}
        off = {k: v for k, v in rec["ab"].items() if k not in on}
        best_on = min(on, key=lambda k: on[k]["us"], default=None)
        best_off = min(off, key=lambda k: off[k]["us"])
        shape = parse_shapes(rec["name"])[0]
        dtype = torch.bfloat16 if rec["dtype"] == "bf16" else torch.float8_e4m3fn
        path = out / config_file_name(shape.num_experts, shape.intermediate, shape.hidden,
                                      dtype, device)
        if best_on is None or on[best_on]["us"] >= off[best_off]["us"] or not path.exists():
            print(rec["cell"], rec["dtype"], "kept as shipped:", best_off, off[best_off]["us"],
                  "| best prefetching:", best_on, best_on and on[best_on]["us"])
            continue
        data = json.loads(path.read_text())
        entry = data["entries"][str(bucket_of(rec["T"]))]
        entry["config"] = on[best_on]["config"]
        entry["us"] = on[best_on]["us"]
        entry.pop("floor_over_time", None)
        entry["note"] = f"decode-prefetch probe {probe['started']} (not a tune entry)"
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(rec["cell"], rec["dtype"], "wrote", best_on, on[best_on]["us"], "against",
              best_off, off[best_off]["us"])


if __name__ == "__main__":
    main()
