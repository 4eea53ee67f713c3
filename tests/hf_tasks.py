"""Tiny random transformers 5.x causal LMs, one per family moerun patches, and the rank-side
task bodies of the multi-rank ``patch_model`` tests (module-level so the pool can pickle them).

Models: 2 decoder layers (both MoE), hidden 32, 4 heads of 8 (2 KV heads), vocab 96, 8 experts
of intermediate 16, top-2 (Llama 4: top-1). Weights are seeded and scaled so routing and the
next-token argmax are decisive: every >= 2-D parameter ~ N(0, 1/fan_in), norms ~ 1 + 0.1 N,
the DeepSeek-V3 / MiniMax-M2 correction biases ~ 0.1 N (the HF init leaves them at zero, which
would not exercise the bias path). Buffers such as rotary frequencies keep their values.
"""

from __future__ import annotations

import functools
import importlib

import torch

VOCAB = 96
HIDDEN = 32
EXPERTS = 8
_COMMON = dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, vocab_size=VOCAB, max_position_embeddings=64,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
               experts_implementation="eager")
_MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=8, first_k_dense_replace=0, num_key_value_heads=4)
# family -> (config class, causal-LM class, config kwargs)
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=EXPERTS, num_experts_per_tok=2, intermediate_size=16)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=16,
                       intermediate_size=24, shared_expert_intermediate_size=24,
                       norm_topk_prob=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=16,
                       intermediate_size=24, norm_topk_prob=True)),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                    dict(n_routed_experts=EXPERTS, num_experts_per_tok=2,
                         moe_intermediate_size=16, intermediate_size=24, n_shared_experts=1,
                         topk_method="group_limited_greedy", n_group=4, topk_group=2,
                         routed_scaling_factor=1.5, **_MLA)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(n_routed_experts=EXPERTS, num_experts_per_tok=2,
                         moe_intermediate_size=16, intermediate_size=24, n_shared_experts=1,
                         n_group=4, topk_group=2, norm_topk_prob=True,
                         routed_scaling_factor=2.5, **_MLA)),
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM",
               dict(num_local_experts=EXPERTS, num_experts_per_tok=1, intermediate_size=16,
                    intermediate_size_mlp=24, interleave_moe_layer_step=1)),
    "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM",
                   dict(num_local_experts=EXPERTS, num_experts_per_tok=2, intermediate_size=16)),
}
#: Decoder-layer attribute holding the MoE block, per family.
MOE_ATTR = {"llama4": "feed_forward"}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def config(family: str, **changes):
    import transformers

    config_cls, _, kwargs = FAMILIES[family]
    return getattr(transformers, config_cls)(**dict(_COMMON, **kwargs, **changes))


def tiny_model(family: str, seed: int = 0, **config_changes) -> torch.nn.Module:
    """A fresh fp32, eval-mode tiny model of ``family`` (identical for equal arguments)."""
    import transformers

    model_cls = getattr(transformers, FAMILIES[family][1])
    torch.manual_seed(seed)
    model = model_cls(config(family, **config_changes)).float().eval()
    _randomize(model, seed + 1000)
    return model


def prompt(length: int, seed: int, batch: int = 1) -> torch.Tensor:
    """``[batch, length]`` token ids in ``[3, VOCAB)`` (no pad / bos / eos)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def greedy(model, ids: torch.Tensor, new_tokens: int = 10) -> list[list[int]]:
    """Exactly ``new_tokens`` greedy tokens (EOS cannot stop it early: every rank must run
    the same number of forwards under expert parallelism)."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """DESIGN 2 relative error, in fp64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


@functools.lru_cache(maxsize=None)
def transformers_has(family: str) -> bool:
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        return False
    return all(hasattr(transformers, n) for n in FAMILIES[family][:2])


# -- multi-rank tasks (``ctx=None``: one rank, no process group) ----------------------------
def _mapping(ctx):
    return None if ctx is None else ctx.mapping()


def _rank(ctx) -> int:
    return 0 if ctx is None else ctx.rank


def patched_generation_task(ctx, *, family: str, lengths: list[int], dtype: str = "float32",
                            new_tokens: int = 10, comm: str = "auto",
                            impl: str = "eager") -> dict:
    """Each rank: its own prompt (``lengths[rank]`` tokens); the unpatched model's logits and
    greedy tokens (experts implementation ``impl``) as the reference; then
    ``patch_model(mapping=ctx.mapping())`` and the same again.

    Also teacher-forced, on the reference's whole sequence (prompt + its greedy tokens), for
    each generated position: the reference's and the patched model's argmax (``forced_ref``,
    ``forced``) and the reference's top-2 logit gap over the row's rms logit
    (``forced_margin``), so a bf16 test can tell a near tie from a wrong token."""
    import moerun

    model = tiny_model(family, experts_implementation=impl).to(getattr(torch, dtype))
    ids = prompt(lengths[_rank(ctx)], seed=100 + _rank(ctx))
    with torch.no_grad():
        ref_logits = model(ids).logits
    ref_tokens = greedy(model, ids, new_tokens)
    seq = torch.cat([ids, torch.tensor(ref_tokens, dtype=ids.dtype)], dim=1)
    steps = slice(ids.shape[1] - 1, seq.shape[1] - 1)  # the positions that chose each token
    with torch.no_grad():
        ref_steps = model(seq).logits[0, steps].double()
    replaced = moerun.patch_model(model, mapping=_mapping(ctx), comm=comm)
    with torch.no_grad():
        logits = model(ids).logits
        pat_steps = model(seq).logits[0, steps].double()
    tokens = greedy(model, ids, new_tokens)
    top2 = ref_steps.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]) / ref_steps.pow(2).mean(-1).sqrt()
    layers = [m.moe for m in model.modules() if isinstance(m, moerun.HFMoEBlock)]
    local = [layer.slot_end - layer.slot_start for layer in layers]
    for layer in layers:
        layer.close()
    return {"replaced": replaced, "err": rel(logits, ref_logits), "tokens": tokens,
            "ref_tokens": ref_tokens, "local_slots": local,
            "forced_ref": ref_steps.argmax(-1).tolist(), "forced": pat_steps.argmax(-1).tolist(),
            "forced_margin": margin.tolist()}


def checkpoint_task(ctx, *, family: str, path: str, lengths: list[int]) -> dict:
    """Each rank loads the ``save_pretrained`` checkpoint at ``path``, patches, poisons every
    local expert weight, then reloads the experts from the checkpoint expert by expert."""
    import transformers

    import moerun

    model_cls = getattr(transformers, FAMILIES[family][1])
    model = model_cls.from_pretrained(path).float().eval()
    ids = prompt(lengths[_rank(ctx)], seed=200 + _rank(ctx))
    with torch.no_grad():
        ref = model(ids).logits
    moerun.patch_model(model, mapping=_mapping(ctx))
    layers = [m.moe for m in model.modules() if isinstance(m, moerun.HFMoEBlock)]
    with torch.no_grad():
        for layer in layers:
            layer.w13.fill_(float("nan"))
            layer.w2.fill_(float("nan"))
    copied = moerun.load_expert_checkpoint(model, path)
    with torch.no_grad():
        out = model(ids).logits
    local = sum(len(set(layer.balancer.local_experts(layer.slot_start, layer.slot_end)))
                for layer in layers)
    for layer in layers:
        layer.close()
    return {"err": rel(out, ref), "copied": copied, "local_experts": local}


def lazy_load_task(ctx, *, counts=(5, 2, 7), seed: int = 3) -> dict:
    """E=8 experts over the group with ``load_expert_weights`` from lazy items that log their
    reads; the forward of this rank's tokens against the unsharded reference."""
    from moerun import ConfigurableMoE, MoEConfig
    from tests.moe_cases import make_case, reference_output, rel_err

    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=16, intermediate_size=8)
    case = make_case(cfg, sum(counts), seed)
    read: list[int] = []

    def items():
        for e in range(cfg.num_experts):
            for name, t in (("gate_proj", case.w13[e, :8]), ("up_proj", case.w13[e, 8:]),
                            ("down_proj", case.w2[e])):
                yield e, name, (lambda e=e, t=t: read.append(e) or t)

    lo = sum(counts[:ctx.rank])
    hi = lo + counts[ctx.rank]
    with ConfigurableMoE(cfg, ctx.mapping(), layer_idx=0) as layer:
        copied = layer.load_expert_weights(items())
        out = layer(case.x[lo:hi], case.logits[lo:hi], all_rank_num_tokens=list(counts))
        err = rel_err(out, reference_output(cfg, case)[lo:hi])
    return {"read": sorted(set(read)), "copied": copied, "err": err}


def readme_acceptance_task(ctx, *, family: str, length: int, new_tokens: int = 10,
                           zero_experts: bool = False) -> dict:
    """The acceptance script of issue 13, using only the README's public API: a tiny model
    as transformers builds it (its own initialisation, ``initializer_range=0.2`` so that the
    experts move the tokens), one ``moerun.patch_model`` call (``Mapping.from_group`` under
    EP), greedy tokens before and after. ``zero_experts``: the negative control (zero the
    patched experts; the tokens must then change)."""
    import transformers

    import moerun

    config_cls, model_cls, kwargs = FAMILIES[family]
    torch.manual_seed(7)
    config = getattr(transformers, config_cls)(**dict(_COMMON, **kwargs),
                                               initializer_range=0.2)
    model = getattr(transformers, model_cls)(config).eval()
    ids = prompt(length, seed=300 + _rank(ctx))
    greedy_kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                     pad_token_id=0)
    before = model.generate(ids, **greedy_kw)
    mapping = None if ctx is None else moerun.Mapping.from_group(ctx.group)
    replaced = moerun.patch_model(model, mapping=mapping)
    if zero_experts:
        with torch.no_grad():
            for block in model.modules():
                if isinstance(block, moerun.HFMoEBlock):
                    block.moe.w2.zero_()
    after = model.generate(ids, **greedy_kw)
    return {"replaced": replaced, "before": before.tolist(), "after": after.tolist()}
