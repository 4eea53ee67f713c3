"""Write the winners of an ``ab64.py`` run into the package's bf16 config files: per cell,
the fastest variant when its median is at most ``--within`` (0.98) of the shipped entry's
(same run, interleaved), as the entry of the cell's T bucket, with its measured µs, timing
"eager" and a ``source`` naming this A/B; the file's ``meta.history`` gets a record.
Prints what it wrote; copies the changed files to ``--copy-to`` if given.

    PYTHONPATH=. python3 benchmarks/experiments/gateup-n256-2026-12-03/apply64.py ab64.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
from pathlib import Path

SOURCE = "benchmarks/experiments/gateup-n256-2026-12-03/ab64.py (one H200, {date})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ab64_json")
    ap.add_argument("--within", type=float, default=0.98)
    ap.add_argument("--copy-to", default=None)
    args = ap.parse_args()
    from moerun.backends.triton import configs as cm
    from moerun.backends.triton.tune_plan import persistent_candidates
    from moerun.bench.shapes import parse_shapes

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    run = json.loads(Path(args.ab64_json).read_text())
    changed = set()
    for key, cell in run["cells"].items():
        name, t = key.split("/T=")
        t = int(t)
        shape = parse_shapes(name)[0]
        forms = {k: v for k, v in cell["forms"].items() if "median_us" in v}
        if "shipped" not in forms:
            continue
        base = forms["shipped"]["median_us"]
        tag, best = min(((k, v) for k, v in forms.items() if k != "shipped"),
                        key=lambda kv: kv[1]["median_us"], default=(None, None))
        if best is None or best["median_us"] > args.within * base:
            print(f"{key}: shipped kept ({base:.1f} us; best variant "
                  f"{tag} {best and best['median_us']:.1f})")
            continue
        cfg = cm.ExpertsConfig.from_json(best["config"])
        assert cfg in persistent_candidates(shape.num_experts, shape.top_k, t), (key, tag)
        path = cm.CONFIG_DIR / cm.config_file_name(shape.num_experts, shape.intermediate,
                                                   shape.hidden, "bfloat16", run["device"])
        data = json.loads(path.read_text())
        bucket = cm.bucket_of(t)
        data["entries"][str(bucket)] = {
            "config": cfg.to_json(), "us": round(best["median_us"], 2), "timing": "eager",
            "T": t, "date": date, "source": SOURCE.format(date=date),
            "replaced_us": round(base, 2)}
        data["entries"] = dict(sorted(data["entries"].items(), key=lambda kv: int(kv[0])))
        hist = data["meta"].setdefault("history", [])
        hist.append({"command": f"ab64.py + apply64.py (bucket {bucket})", "date": date,
                     "device": run["device"], "T": [t], "torch": run["torch"]})
        path.write_text(json.dumps(data, indent=1) + "\n")
        changed.add(path)
        print(f"{key}: wrote {tag} ({best['median_us']:.1f} us against {base:.1f}, "
              f"{best['median_us'] / base:.3f}) into {path.name} bucket {bucket}")
    if args.copy_to:
        Path(args.copy_to).mkdir(parents=True, exist_ok=True)
        for p in changed:
            shutil.copy(p, Path(args.copy_to) / p.name)


if __name__ == "__main__":
    main()
