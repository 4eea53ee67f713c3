"""Shared by the routing-kernel tests (interpreter on CPU, compiled on GPU): seeded routing
cases and the tie-tolerant comparison of a routing result with the torch twin.

What :func:`routing_problems` checks, per row (ties are allowed, so ids are never compared
with the twin's):
  * ids are distinct and in ``[0, E)``; rows past ``valid_rows`` are all ``-1`` with weight 0;
  * grouped methods: the ids fall in at most ``topk_group`` groups;
  * the sorted *selection* values (score + bias) of the result's ids equal those of the
    twin's ids (a different id among exact ties has the same value);
  * the weights equal the weights recomputed in fp64 from the result's own ids (score of
    each id, renormalised, scaled): weights belong to the ids they sit next to;
  * the sorted weights equal the twin's sorted weights.
"""

from __future__ import annotations

import torch

from moerun.config import RoutingConfig, RoutingMethod
from moerun.routing import route
from moerun.routing.methods import _RENORM_EPS

TOL_VALUE = 1e-6  # absolute, fp32 selection values in [0, 2]: summation order only
TOL_WEIGHT = 1e-5  # relative, fp32 softmax/renormalisation rounding

_SOFTMAX = ("softmax_topk", "topk_softmax", "group_limited_greedy")


def make_routing_case(method: str, e: int, groups: int, topk_group: int, renorm: bool,
                      scale: float, t: int, *, dtype: torch.dtype, ties: bool, strided: bool,
                      seed: int, device: str = "cpu", bf16_values: bool = False):
    """``(RoutingConfig, logits [t, e] dtype, bias [e] fp32 or None)`` from ``seed``.

    ``ties``: logits on a 0.5 grid (many exact ties among experts) with distinct per-group
    offsets (selection bias, or a logit shift of ``g * 0.5 / G`` under softmax scoring: exact
    in bf16 too, and never a multiple of the grid), so the choice of groups stays unique and
    the selected values comparable. ``strided``: a row slice of a
    wider tensor (row stride != E). ``bf16_values``: values rounded to bf16 (then stored as
    ``dtype``): random bf16 logits tie often, groups included."""
    g = torch.Generator().manual_seed(seed)
    cfg = RoutingConfig(method=RoutingMethod(method), renormalize=renorm,
                        num_expert_group=groups, topk_group=topk_group,
                        routed_scaling_factor=scale)
    logits = torch.randn(t, e + 3 if strided else e, generator=g)[:, :e]
    bias = torch.randn(e, generator=g) * 0.1 if cfg.uses_correction_bias else None
    if ties:
        logits = (logits * 2).round() / 2
        gid = torch.arange(e) // (e // groups)
        if bias is not None:
            bias = gid.float() * 1e-3
        elif groups > 1:
            logits = logits + gid.float() * (0.5 / groups)
    if bf16_values:
        logits = logits.to(torch.bfloat16)
    logits = logits.to(dtype).to(device)
    return cfg, logits, None if bias is None else bias.to(device)


def _group_choice_unique(gscore: torch.Tensor, topk_group: int) -> bool:
    """The ``topk_group`` best groups of a row are one set (no tie at the boundary)."""
    top = gscore.sort(descending=True).values
    return topk_group == len(top) or bool(top[topk_group - 1] > top[topk_group])


def _valid_grouped_pick(choice_e: torch.Tensor, gscore: torch.Tensor, row: torch.Tensor,
                        per_group: int, topk_group: int) -> str:
    """Why ``row`` (the picked ids) is not one of the valid picks of a grouped router whose
    group choice is tied; '' when it is. Valid: the groups used can be completed to a
    best-``topk_group`` set K, and the picks are a top-k of the experts of K."""
    top = gscore.sort(descending=True).values
    cut = top[topk_group - 1]
    above = set((gscore > cut).nonzero().flatten().tolist())
    tied = set((gscore == cut).nonzero().flatten().tolist())
    used = set((row // per_group).tolist())
    if not used <= above | tied:
        return f"uses a group outside the best {topk_group}"
    fill = topk_group - len(above) - len(used & tied)
    if fill < 0:
        return "uses more tied groups than there are places"
    k_min = choice_e[row].min()
    groups = sorted(above | (used & tied))
    for g in groups:  # inside K: nothing unpicked beats the weakest pick
        rest = [e for e in range(g * per_group, (g + 1) * per_group) if e not in row.tolist()]
        if rest and bool(choice_e[rest].max() > k_min):
            return f"group {g} has an unpicked expert above the weakest pick"
    spare = [g for g in tied - used
             if bool(choice_e[g * per_group:(g + 1) * per_group].max() <= k_min)]
    if len(spare) < fill:
        return "no completion of the group set leaves the picks on top"
    return ""


def routing_problems(got, logits: torch.Tensor, bias: torch.Tensor | None, cfg: RoutingConfig,
                     k: int, valid: int) -> list[str]:
    """Everything wrong with ``got`` (a ``Routed``) for these logits; [] when right."""
    method = cfg.method.value
    e = logits.shape[1]
    groups, topk_group = cfg.num_expert_group, cfg.topk_group
    renorm, scale = cfg.renormalize, cfg.routed_scaling_factor
    ids, w = got.topk_ids.cpu(), got.topk_weights.cpu()
    lf = logits.double().cpu()
    b = None if bias is None else bias.double().cpu()
    ref = route(logits.float().cpu(), top_k=k, config=cfg,
                correction_bias=None if b is None else b.float())
    problems = []
    t = logits.shape[0]
    if ids.shape != (t, k) or w.shape != (t, k) or ids.dtype != torch.int32 \
            or w.dtype != torch.float32 or not got.topk_ids.is_contiguous():
        problems.append(f"shapes/dtypes {tuple(ids.shape)} {ids.dtype} {w.dtype}")
        return problems
    scores = lf.softmax(-1) if method in _SOFTMAX else lf.sigmoid()
    choice = scores + (b if b is not None else 0.0)
    for r in range(t):
        if r >= valid:
            if not (bool((ids[r] == -1).all()) and bool((w[r] == 0).all())):
                problems.append(f"padded row {r}: {ids[r].tolist()} {w[r].tolist()}")
            continue
        row = ids[r].long()
        if len(set(row.tolist())) != k or int(row.min()) < 0 or int(row.max()) >= e:
            problems.append(f"row {r} ids {row.tolist()}")
            continue
        unique = True
        if groups > 1 and topk_group < groups:
            per_group = e // groups
            used = set((row // per_group).tolist())
            if len(used) > topk_group:
                problems.append(f"row {r} uses groups {sorted(used)} > {topk_group}")
            cg = choice[r].view(groups, per_group)
            gscore = (cg.topk(2, dim=-1).values.sum(-1) if method == "noaux_tc"
                      else cg.max(-1).values)
            unique = _group_choice_unique(gscore, topk_group)
            if not unique:  # tied group scores: any valid pick, not the twin's, is right
                why = _valid_grouped_pick(choice[r], gscore, row, per_group, topk_group)
                if why:
                    problems.append(f"row {r} (tied groups): {why}")
        mine = choice[r, row].sort().values
        theirs = choice[r, ref.topk_ids[r].long()].sort().values
        if unique and not torch.allclose(mine, theirs, rtol=0, atol=TOL_VALUE):
            problems.append(f"row {r} selection {mine.tolist()} vs {theirs.tolist()}")
        sel = scores[r, row]
        if renorm or method == "topk_softmax":
            eps = 0.0 if method in ("softmax_topk", "topk_softmax") else _RENORM_EPS
            sel = sel / (sel.sum() + eps)
        expect = sel * scale
        if not torch.allclose(w[r].double(), expect, rtol=TOL_WEIGHT, atol=1e-7):
            problems.append(f"row {r} weights {w[r].tolist()} vs own ids {expect.tolist()}")
        if unique and not torch.allclose(w[r].sort().values, ref.topk_weights[r].sort().values,
                                         rtol=TOL_WEIGHT, atol=1e-7):
            problems.append(f"row {r} weights differ from the twin's")
    return problems
