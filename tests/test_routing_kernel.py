"""The fused routing kernel against its torch twin, under the Triton interpreter (CPU).

The interpreter must be chosen before triton is imported, so every kernel check runs in ONE
subprocess started with ``TRITON_INTERPRET=1`` (this file, run as a script, is that worker;
it prints one JSON line per case) and the tests read its report. fp32 and fp16 logits only:
bf16 is wrong under the interpreter.

What a case checks, per row (ties are allowed, so ids are never compared with the twin's):
  * ids are distinct and in ``[0, E)``; rows past ``valid_rows`` are all ``-1`` with weight 0;
  * grouped methods: the ids fall in at most ``topk_group`` groups;
  * the sorted *selection* values (score + bias) of the kernel's ids equal those of the
    twin's ids (a different id among exact ties has the same value);
  * the kernel's weights equal the weights recomputed in fp64 from its own ids (score of each
    id, renormalised, scaled): weights belong to the ids they sit next to;
  * the sorted weights equal the twin's sorted weights.
Smallest cases first: T=0, T=1, then odd T, T larger than one program's rows, top_k == E.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.interp_worker import run_worker

ROOT = Path(__file__).resolve().parents[1]
# name, method, E, K, groups, topk_group, renormalize, scale
METHODS = [
    ("softmax", "softmax_topk", 24, 4, 1, 1, False, 1.0),
    ("softmax_renorm", "softmax_topk", 24, 4, 1, 1, True, 1.0),
    ("topk_softmax", "topk_softmax", 8, 2, 1, 1, True, 1.0),
    ("greedy_grouped", "group_limited_greedy", 32, 6, 4, 2, False, 2.5),
    ("noaux_tc", "noaux_tc", 64, 8, 8, 4, True, 2.5),
    ("noaux_tc_ungrouped", "noaux_tc", 16, 4, 1, 1, False, 1.0),
    ("llama4", "llama4", 16, 1, 1, 1, False, 1.0),
    ("sigmoid", "sigmoid_topk", 24, 3, 1, 1, False, 1.5),
    ("sigmoid_renorm", "sigmoid_topk", 24, 3, 1, 1, True, 1.0),
    ("sigmoid_bias", "sigmoid_bias_topk", 24, 3, 1, 1, True, 1.0),
    ("all_experts_softmax", "softmax_topk", 8, 8, 1, 1, True, 1.0),
    ("all_experts_sigmoid", "sigmoid_topk", 8, 8, 1, 1, False, 1.0),
]
TOKENS = [0, 1, 7, 37]


# ---------------------------------------------------------------- the worker (subprocess)
def _worker() -> None:  # pragma: no cover -- runs in the subprocess
    import torch

    from moerun.routing.kernel import block_rows, fused_route, kernel_spec
    from tests.routing_check import make_routing_case, routing_problems

    def emit(**kw):
        print(json.dumps(kw), flush=True)

    def case(name, method, e, k, groups, topk_group, renorm, scale, t, *, dtype, ties,
             valid, strided, seed, bf16_values=False):
        cfg, logits, bias = make_routing_case(method, e, groups, topk_group, renorm, scale, t,
                                              dtype=dtype, ties=ties, strided=strided,
                                              seed=seed, bf16_values=bf16_values)
        got = fused_route(logits, k, kernel_spec(cfg), correction_bias=bias, valid_rows=valid)
        problems = routing_problems(got, logits, bias, cfg, k, valid)
        emit(name=name, ok=not problems, problems=problems[:4], rows_per_program=block_rows(e))

    for i, (name, method, e, k, groups, topk_group, renorm, scale) in enumerate(METHODS):
        for t in TOKENS:
            for ties in (False, True):
                case(f"{name}/T{t}/{'ties' if ties else 'random'}", method, e, k, groups,
                     topk_group, renorm, scale, t, dtype=torch.float32, ties=ties, valid=t,
                     strided=False, seed=10 * i + t)
        # DP padding (valid rows < T), a strided row slice, fp16 logits
        case(f"{name}/padded", method, e, k, groups, topk_group, renorm, scale, 21,
             dtype=torch.float32, ties=False, valid=13, strided=True, seed=500 + i)
        case(f"{name}/fp16", method, e, k, groups, topk_group, renorm, scale, 9,
             dtype=torch.float16, ties=False, valid=9, strided=False, seed=700 + i)
        # bf16-rounded values (stored fp32): natural ties among experts and whole groups
        case(f"{name}/bf16_values", method, e, k, groups, topk_group, renorm, scale, 300,
             dtype=torch.float32, ties=False, valid=300, strided=False, seed=900 + i,
             bf16_values=True)
    # a DeepSeek-V3-sized case: E=256 in 8 groups, top-8 of 4 groups, more rows than a program
    case("deepseek_v3/T19", "noaux_tc", 256, 8, 8, 4, True, 2.5, 19, dtype=torch.float32,
         ties=False, valid=19, strided=False, seed=999)


# ---------------------------------------------------------------- the tests (pytest side)
@pytest.fixture(scope="module")
def report() -> dict:
    return {rec["name"]: rec for rec in run_worker(__file__, timeout=600)}


def _names() -> list[str]:
    names = [f"{m[0]}/T{t}/{kind}" for m in METHODS for t in TOKENS
             for kind in ("random", "ties")]
    names += [f"{m[0]}/{v}" for m in METHODS for v in ("padded", "fp16", "bf16_values")]
    return names + ["deepseek_v3/T19"]


@pytest.mark.parametrize("name", _names())
def test_kernel_matches_twin(report, name):
    rec = report[name]
    assert rec["ok"], rec["problems"]


def test_cases_cover_more_rows_than_one_program(report):
    # T=37 exceeds the rows one program owns for every E in the table (<= 16 rows each)
    assert all(report[f"{m[0]}/T37/random"]["rows_per_program"] < 37 for m in METHODS)


if __name__ == "__main__":  # pragma: no cover
    _worker()


# ---------------------------------------------------------------- the checker itself
def _routed(ids, weights):
    import torch

    from moerun.routing import Routed

    return Routed(topk_weights=torch.tensor(weights, dtype=torch.float32),
                  topk_ids=torch.tensor(ids, dtype=torch.int32))


def test_checker_accepts_any_valid_pick_under_tied_groups_and_nothing_else():
    # E=4 in G=2 groups of 2, keep 1 group, top-2: both groups score the same, so picking
    # group 1 (experts 2, 3) is as valid as the twin's group 0
    import torch

    from moerun.config import RoutingConfig
    from tests.routing_check import routing_problems

    cfg = RoutingConfig(method="group_limited_greedy", renormalize=False, num_expert_group=2,
                        topk_group=1, routed_scaling_factor=1.0)
    logits = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    p = logits.softmax(-1)[0].tolist()
    assert routing_problems(_routed([[2, 3]], [[p[2], p[3]]]), logits, None, cfg, 2, 1) == []
    assert routing_problems(_routed([[0, 1]], [[p[0], p[1]]]), logits, None, cfg, 2, 1) == []
    mixed = routing_problems(_routed([[0, 2]], [[p[0], p[2]]]), logits, None, cfg, 2, 1)
    assert any("groups" in m for m in mixed)
    wrong_w = routing_problems(_routed([[2, 3]], [[p[3], p[2]]]), logits, None, cfg, 2, 1)
    assert any("own ids" in m for m in wrong_w)
    # an unpicked expert above a pick inside the chosen group is never valid
    logits = torch.tensor([[1.0, 0.5, 1.0, 0.5, 0.9, 0.0]])
    cfg = RoutingConfig(method="group_limited_greedy", renormalize=False, num_expert_group=3,
                        topk_group=2, routed_scaling_factor=1.0)
    p = logits.softmax(-1)[0].tolist()
    bad = routing_problems(_routed([[0, 2, 5]], [[p[0], p[2], p[5]]]), logits, None, cfg, 3, 1)
    assert bad
