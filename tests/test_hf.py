"""Tests of moerun.hf (``from_hf``, ``router_weight``) and moerun._hf_config
(``MoEConfig.from_hf_config``).

Order: released checkpoints' config.json dicts -> dtype handling -> every config error ->
tiny random transformers blocks against moerun (T in 1, 7, 33) -> the expert-layout helper
(transposed, interleaved) -> every from_hf error.

Block tests build each family's block from its transformers config class (E=8, K=2, H=32,
I=16; Llama 4 K=1), overwrite every parameter and buffer (the DeepSeek-V3 correction bias
included) with seeded ``torch.randn``, and compare in fp32, eval mode.
"""

from __future__ import annotations

import functools
import importlib
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from moerun._hf_config import SUPPORTED_MODEL_TYPES, moe_config_kwargs
from moerun.config import MoEConfig, RoutingConfig, RoutingMethod
from moerun.quant import QuantConfig

M = RoutingMethod
# DESIGN 2: fp32 bound on ||out - ref|| / ||ref|| (fp64 norms). Both sides do the same fp32
# math in a different order (e.g. softmax->topk->renorm vs topk->softmax): a few ulps.
FP32_TOL = 1e-5
# A wrong routing parameter moves whole experts in or out: errors of order 1, far above this.
SENSITIVE = 1e-3

E, K, H, I = 8, 2, 32, 16

# ----------------------------------------------------------------- config.json dicts

# Trimmed config.json files of released checkpoints (MoE-relevant fields as published).
MIXTRAL_8X7B = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8,
    "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02, "torch_dtype": "bfloat16",
}
QWEN15_MOE_A27B = {
    "model_type": "qwen2_moe", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
    "norm_topk_prob": False, "decoder_sparse_step": 1, "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "mlp_only_layers": [],
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "topk_method": "greedy", "n_group": 1,
    "topk_group": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
    "scoring_func": "softmax", "first_k_dense_replace": 1, "torch_dtype": "bfloat16",
}
DEEPSEEK_V2 = {
    "model_type": "deepseek_v2", "hidden_act": "silu", "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "topk_method": "group_limited_greedy",
    "n_group": 8, "topk_group": 3, "norm_topk_prob": False, "routed_scaling_factor": 16.0,
    "scoring_func": "softmax", "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "topk_method": "noaux_tc", "n_group": 8,
    "topk_group": 4, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "ep_size": 1, "moe_layer_freq": 1, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}
LLAMA4_SCOUT = {
    "model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text", "hidden_act": "silu", "hidden_size": 5120,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 16,
        "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "torch_dtype": "bfloat16",
    },
    "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408},
}
MINIMAX_M2 = {
    "model_type": "minimax_m2", "hidden_act": "silu", "hidden_size": 3072,
    "intermediate_size": 1536, "num_local_experts": 256, "num_experts_per_tok": 8,
    "scoring_func": "sigmoid", "use_routing_bias": True, "shared_intermediate_size": 0,
    "torch_dtype": "bfloat16",
}


def _routing(method, *, renormalize=True, groups=1, topk_group=1, scale=1.0):
    return RoutingConfig(method=method, renormalize=renormalize, num_expert_group=groups,
                         topk_group=topk_group, routed_scaling_factor=scale)


BF16 = torch.bfloat16
CONFIG_CASES = {
    "mixtral-8x7b": (MIXTRAL_8X7B, MoEConfig(
        num_experts=8, top_k=2, hidden_size=4096, intermediate_size=14336, dtype=BF16,
        routing=_routing(M.TOPK_SOFTMAX))),
    "qwen1.5-moe-a2.7b": (QWEN15_MOE_A27B, MoEConfig(
        num_experts=60, top_k=4, hidden_size=2048, intermediate_size=1408, dtype=BF16,
        routing=_routing(M.SOFTMAX_TOPK, renormalize=False), shared_intermediate_size=5632,
        shared_expert_gate=True)),
    "qwen3-30b-a3b": (QWEN3_30B_A3B, MoEConfig(
        num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768, dtype=BF16,
        routing=_routing(M.SOFTMAX_TOPK, renormalize=True))),
    "deepseek-v2-lite": (DEEPSEEK_V2_LITE, MoEConfig(
        num_experts=64, top_k=6, hidden_size=2048, intermediate_size=1408, dtype=BF16,
        routing=_routing(M.SOFTMAX_TOPK, renormalize=False, scale=1.0),
        shared_intermediate_size=2 * 1408)),
    "deepseek-v2": (DEEPSEEK_V2, MoEConfig(
        num_experts=160, top_k=6, hidden_size=5120, intermediate_size=1536, dtype=BF16,
        routing=_routing(M.GROUP_LIMITED_GREEDY, renormalize=False, groups=8, topk_group=3,
                         scale=16.0),
        shared_intermediate_size=2 * 1536)),
    "deepseek-v3": (DEEPSEEK_V3, MoEConfig(
        num_experts=256, top_k=8, hidden_size=7168, intermediate_size=2048, dtype=BF16,
        routing=_routing(M.NOAUX_TC, renormalize=True, groups=8, topk_group=4, scale=2.5),
        shared_intermediate_size=2048, quant=QuantConfig())),  # its fp8 128x128 checkpoint
    "llama4-scout": (LLAMA4_SCOUT, MoEConfig(
        num_experts=16, top_k=1, hidden_size=5120, intermediate_size=8192, dtype=BF16,
        routing=_routing(M.LLAMA4), apply_router_weight_on_input=True,
        shared_intermediate_size=8192)),
    "llama4-scout-text": (LLAMA4_SCOUT["text_config"], MoEConfig(
        num_experts=16, top_k=1, hidden_size=5120, intermediate_size=8192, dtype=BF16,
        routing=_routing(M.LLAMA4), apply_router_weight_on_input=True,
        shared_intermediate_size=8192)),
    "minimax-m2": (MINIMAX_M2, MoEConfig(
        num_experts=256, top_k=8, hidden_size=3072, intermediate_size=1536, dtype=BF16,
        routing=_routing(M.SIGMOID_BIAS_TOPK, renormalize=True))),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_from_hf_config_released_checkpoints(name):
    hf, expected = CONFIG_CASES[name]
    assert MoEConfig.from_hf_config(hf) == expected


def test_supported_model_types_listed():
    assert set(SUPPORTED_MODEL_TYPES) == {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                                          "deepseek_v3", "llama4", "llama4_text", "minimax_m2"}


def test_defaults_follow_transformers_config_classes():
    # Absent routing fields take the transformers 5.x class defaults.
    v3 = MoEConfig.from_hf_config({"model_type": "deepseek_v3", "n_routed_experts": 256,
                                   "num_experts_per_tok": 8, "hidden_size": 64,
                                   "moe_intermediate_size": 16})
    assert v3.routing == _routing(M.NOAUX_TC, renormalize=True, groups=8, topk_group=4,
                                  scale=2.5)
    assert v3.shared_intermediate_size == 16  # n_shared_experts = 1
    v2 = MoEConfig.from_hf_config({"model_type": "deepseek_v2", "n_routed_experts": 8,
                                   "num_experts_per_tok": 2, "hidden_size": 64,
                                   "moe_intermediate_size": 16, "n_group": None})
    assert v2.routing == _routing(M.SOFTMAX_TOPK, renormalize=False)
    assert v2.shared_intermediate_size == 32  # n_shared_experts = 2
    q2 = MoEConfig.from_hf_config({"model_type": "qwen2_moe", "num_experts": 8,
                                   "num_experts_per_tok": 2, "hidden_size": 64,
                                   "moe_intermediate_size": 16,
                                   "shared_expert_intermediate_size": 0})
    assert q2.routing.renormalize is False
    assert (q2.shared_intermediate_size, q2.shared_expert_gate) == (0, False)
    l4 = MoEConfig.from_hf_config({"model_type": "llama4_text", "num_local_experts": 4,
                                   "hidden_size": 64, "intermediate_size": 16})
    assert l4.top_k == 1
    mm = MoEConfig.from_hf_config(dict(MINIMAX_M2, use_routing_bias=False))
    assert mm.routing == _routing(M.SIGMOID_TOPK, renormalize=True)


def test_expert_count_aliases():
    base = dict(QWEN3_30B_A3B)
    del base["num_experts"]
    assert MoEConfig.from_hf_config(dict(base, num_local_experts=128)).num_experts == 128
    both = dict(base, num_local_experts=128, num_experts=128)
    assert MoEConfig.from_hf_config(both).num_experts == 128


def test_dtype_sources():
    kw = dict(MIXTRAL_8X7B)
    del kw["torch_dtype"]
    assert moe_config_kwargs(kw)["dtype"] == torch.float32  # none given
    assert moe_config_kwargs(dict(kw, torch_dtype="float16"))["dtype"] == torch.float16
    # transformers 5 writes "dtype"; it wins over a stale "torch_dtype"
    assert moe_config_kwargs(dict(kw, dtype="bfloat16", torch_dtype="float16"))["dtype"] == BF16
    assert moe_config_kwargs(dict(kw, dtype=torch.float16))["dtype"] == torch.float16
    assert moe_config_kwargs(dict(kw, dtype="torch.bfloat16"))["dtype"] == BF16
    assert moe_config_kwargs(MIXTRAL_8X7B, dtype=torch.float32)["dtype"] == torch.float32
    # Llama 4: text_config without a dtype inherits the top-level one
    text = {k: v for k, v in LLAMA4_SCOUT["text_config"].items() if k != "torch_dtype"}
    top = dict(LLAMA4_SCOUT, text_config=text, torch_dtype="float16")
    assert moe_config_kwargs(top)["dtype"] == torch.float16


def test_overrides_pass_through():
    cfg = MoEConfig.from_hf_config(QWEN3_30B_A3B, dtype=torch.float32, max_num_tokens=64)
    assert (cfg.dtype, cfg.max_num_tokens) == (torch.float32, 64)


CONFIG_ERRORS = {
    "unknown model_type": ({"model_type": "gpt_oss"}, r"model_type='gpt_oss' is not supported"),
    "no model_type": ({"hidden_size": 8}, r"model_type=None is not supported; supported: "),
    "gelu": (dict(MIXTRAL_8X7B, hidden_act="gelu"), r"hidden_act='gelu' cannot be mapped"),
    "clamped swiglu": (dict(QWEN3_30B_A3B, swiglu_limit=7.0),
                       r"swiglu_limit=7.0 cannot be mapped: clamped SwiGLU"),
    "v3 topk_method": (dict(DEEPSEEK_V3, topk_method="greedy"),
                       r"deepseek_v3 config field topk_method='greedy' cannot be mapped"),
    "v3 scoring_func": (dict(DEEPSEEK_V3, scoring_func="softmax"),
                        r"scoring_func='softmax' cannot be mapped"),
    "v2 topk_method": (dict(DEEPSEEK_V2, topk_method="noaux_tc"),
                       r"deepseek_v2 config field topk_method='noaux_tc' cannot be mapped"),
    "v2 scoring_func": (dict(DEEPSEEK_V2, scoring_func="sigmoid"),
                        r"deepseek_v2 config field scoring_func='sigmoid'"),
    "v2 norm_topk_prob": (dict(DEEPSEEK_V2, norm_topk_prob=True),
                          r"norm_topk_prob=True cannot be mapped: ambiguous for deepseek_v2"),
    "v2 grouped without n_group": (
        {k: v for k, v in DEEPSEEK_V2.items() if k != "n_group"},
        r"deepseek_v2 config is missing the required field n_group"),
    "mlp_bias": (dict(DEEPSEEK_V2_LITE, mlp_bias=True), r"mlp_bias=True cannot be mapped"),
    "qwen scoring_func": (dict(QWEN3_30B_A3B, scoring_func="sigmoid"),
                          r"qwen3_moe config field scoring_func='sigmoid'"),
    "mixtral scoring_func": (dict(MIXTRAL_8X7B, scoring_func="sigmoid"),
                             r"mixtral config field scoring_func='sigmoid'"),
    "minimax scoring_func": (dict(MINIMAX_M2, scoring_func="softmax"),
                             r"minimax_m2 config field scoring_func='softmax'"),
    "minimax shared": (dict(MINIMAX_M2, shared_intermediate_size=1024),
                       r"shared_intermediate_size=1024 cannot be mapped"),
    "llama4 top-2": (dict(LLAMA4_SCOUT["text_config"], num_experts_per_tok=2),
                     r"num_experts_per_tok=2 cannot be mapped: moerun's llama4 routing is top-1"),
    "llama4 no text_config": ({"model_type": "llama4"}, r"text_config=None cannot be mapped"),
    "llama4 wrong text model_type": (dict(LLAMA4_SCOUT, text_config={"model_type": "mixtral"}),
                                     r"text_config.model_type='mixtral'"),
    "missing size": ({k: v for k, v in MIXTRAL_8X7B.items() if k != "hidden_size"},
                     r"mixtral config is missing the required field hidden_size"),
    "bad size": (dict(MIXTRAL_8X7B, num_local_experts=0),
                 r"num_local_experts=0 cannot be mapped: must be a positive int"),
    "bad flag": (dict(QWEN3_30B_A3B, norm_topk_prob="yes"),
                 r"norm_topk_prob='yes' cannot be mapped: must be true or false"),
    "bad scale": (dict(DEEPSEEK_V3, routed_scaling_factor=0),
                  r"routed_scaling_factor=0 cannot be mapped: must be a number > 0"),
    "bad shared count": (dict(DEEPSEEK_V3, n_shared_experts=-1),
                         r"n_shared_experts=-1 cannot be mapped: must be an int >= 0"),
    "conflicting aliases": (dict(QWEN3_30B_A3B, num_local_experts=64),
                            r"conflicting values for one field: num_experts=128, "
                            r"num_local_experts=64"),
    "bad dtype": (dict(MIXTRAL_8X7B, torch_dtype="float8_e4m3fn"),
                  r"config field torch_dtype='float8_e4m3fn' is not supported"),
}


@pytest.mark.parametrize("name", sorted(CONFIG_ERRORS))
def test_from_hf_config_errors(name):
    hf, match = CONFIG_ERRORS[name]
    with pytest.raises(ValueError, match=match):
        MoEConfig.from_hf_config(hf)


def test_from_hf_config_sources(tmp_path):
    # a dict, a config.json path (str and Path), a model directory, a PretrainedConfig
    transformers = pytest.importorskip("transformers")
    expected = CONFIG_CASES["qwen3-30b-a3b"][1]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_30B_A3B))
    assert MoEConfig.from_hf_config(str(path)) == expected
    assert MoEConfig.from_hf_config(path) == expected
    assert MoEConfig.from_hf_config(tmp_path) == expected
    pretrained = transformers.Qwen3MoeConfig(**{k: v for k, v in QWEN3_30B_A3B.items()
                                                if k != "model_type"})
    assert MoEConfig.from_hf_config(pretrained) == expected
    saved = tmp_path / "saved"
    pretrained.save_pretrained(saved)  # what a checkpoint directory holds
    assert MoEConfig.from_hf_config(saved) == expected
    # Llama 4's composite config: to_dict() nests the text_config
    l4 = transformers.Llama4Config(text_config=LLAMA4_SCOUT["text_config"])
    assert MoEConfig.from_hf_config(l4, dtype=BF16) == CONFIG_CASES["llama4-scout"][1]


def test_from_hf_config_source_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"from_hf_config: '.*missing.json' does not "
                                                r"exist; pass a config.json file or a model "
                                                r"directory holding one"):
        MoEConfig.from_hf_config(tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match=r"'.*config.json' does not exist"):
        MoEConfig.from_hf_config(tmp_path)  # a directory without config.json
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"from_hf_config: '.*bad.json' is not valid JSON"):
        MoEConfig.from_hf_config(bad)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"holds a JSON list; expected an object"):
        MoEConfig.from_hf_config(listed)
    with pytest.raises(TypeError, match=r"from_hf_config: hf must be a dict, a path to a "
                                        r"config.json or a model directory, or a "
                                        r"PretrainedConfig; got int"):
        MoEConfig.from_hf_config(3)


def test_dtype_argument_error():
    with pytest.raises(ValueError, match=r"dtype=torch.float64 is not supported"):
        moe_config_kwargs(MIXTRAL_8X7B, dtype=torch.float64)


def test_not_a_mapping():
    with pytest.raises(TypeError, match=r"hf must be a mapping .* got list"):
        moe_config_kwargs([("model_type", "mixtral")])


# ----------------------------------------------------------------- transformers blocks

_TM = "transformers.models."
_BASE = dict(hidden_size=H, num_experts_per_tok=K, experts_implementation="eager")
# family -> (modeling module, block class, config class, config kwargs)
BLOCKS = {
    "mixtral": (_TM + "mixtral.modeling_mixtral", "MixtralSparseMoeBlock", "MixtralConfig",
                dict(num_local_experts=E, intermediate_size=I, **_BASE)),
    "qwen2_moe": (_TM + "qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock",
                  "Qwen2MoeConfig", dict(num_experts=E, moe_intermediate_size=I,
                                         shared_expert_intermediate_size=24,
                                         norm_topk_prob=False, **_BASE)),
    "qwen2_moe-norm": (_TM + "qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock",
                       "Qwen2MoeConfig", dict(num_experts=E, moe_intermediate_size=I,
                                              shared_expert_intermediate_size=24,
                                              norm_topk_prob=True, **_BASE)),
    "qwen3_moe": (_TM + "qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock",
                  "Qwen3MoeConfig", dict(num_experts=E, moe_intermediate_size=I,
                                         norm_topk_prob=True, **_BASE)),
    "qwen3_moe-nonorm": (_TM + "qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock",
                         "Qwen3MoeConfig", dict(num_experts=E, moe_intermediate_size=I,
                                                norm_topk_prob=False, **_BASE)),
    "deepseek_v2-greedy": (_TM + "deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe",
                           "DeepseekV2Config",
                           dict(n_routed_experts=E, moe_intermediate_size=I, n_shared_experts=2,
                                topk_method="greedy", routed_scaling_factor=1.5, **_BASE)),
    "deepseek_v2-grouped": (_TM + "deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe",
                            "DeepseekV2Config",
                            dict(n_routed_experts=E, moe_intermediate_size=I, n_shared_experts=1,
                                 topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                 routed_scaling_factor=2.0, **_BASE)),
    # DeepseekV2TopkRouter ignores norm_topk_prob: from_hf must follow the block.
    "deepseek_v2-norm-ignored": (_TM + "deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe",
                                 "DeepseekV2Config",
                                 dict(n_routed_experts=E, moe_intermediate_size=I,
                                      n_shared_experts=2, topk_method="greedy",
                                      norm_topk_prob=True, routed_scaling_factor=1.5, **_BASE)),
    "deepseek_v3": (_TM + "deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE",
                    "DeepseekV3Config",
                    dict(n_routed_experts=E, moe_intermediate_size=I, n_shared_experts=1,
                         n_group=4, topk_group=2, norm_topk_prob=True,
                         routed_scaling_factor=2.5, **_BASE)),
    "deepseek_v3-nonorm": (_TM + "deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE",
                           "DeepseekV3Config",
                           dict(n_routed_experts=E, moe_intermediate_size=I, n_shared_experts=2,
                                n_group=4, topk_group=2, norm_topk_prob=False,
                                routed_scaling_factor=1.5, **_BASE)),
    "llama4": (_TM + "llama4.modeling_llama4", "Llama4TextMoe", "Llama4TextConfig",
               dict(num_local_experts=E, intermediate_size=I, hidden_size=H,
                    num_experts_per_tok=1)),
    "minimax_m2": (_TM + "minimax_m2.modeling_minimax_m2", "MiniMaxM2SparseMoeBlock",
                   "MiniMaxM2Config", dict(num_local_experts=E, intermediate_size=I, **_BASE)),
}


def _classes(family: str):
    """``(block class, config class)``; skips when transformers lacks them."""
    pytest.importorskip("transformers")
    module_name, block_name, config_name, _ = BLOCKS[family]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        pytest.skip(f"transformers has no {module_name}: {e}")
    block_cls = getattr(module, block_name, None)
    config_cls = getattr(importlib.import_module("transformers"), config_name, None)
    if block_cls is None or config_cls is None:
        pytest.skip(f"this transformers has no {block_name} / {config_name}")
    return block_cls, config_cls


def _randomize(module: nn.Module, seed: int) -> None:
    """Every parameter and buffer <- seeded randn (biases and correction biases included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype))


def _new_block(family: str, seed: int = 0, **config_changes) -> nn.Module:
    block_cls, config_cls = _classes(family)
    kwargs = dict(BLOCKS[family][3], **config_changes)
    block = block_cls(config_cls(**kwargs)).float().eval()
    _randomize(block, seed)
    return block


@functools.lru_cache(maxsize=None)
def _block_and_layer(family: str):
    from moerun.hf import from_hf

    block = _new_block(family, seed=sum(map(ord, family)))
    return block, from_hf(block, backend="reference", device="cpu")


def _hf_out(block: nn.Module, x_TH: torch.Tensor) -> torch.Tensor:
    t, h = x_TH.shape
    with torch.no_grad():
        out = block(x_TH.view(1, t, h))
    out = out[0] if isinstance(out, tuple) else out
    return out.reshape(t, h)


def _moe_out(layer, block, x_TH):
    from moerun.hf import router_weight

    logits_TE = F.linear(x_TH.float(), router_weight(block).float())
    with torch.no_grad():
        return layer(x_TH, logits_TE)


def _rel(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("num_tokens", [1, 7, 33])
@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_from_hf_matches_transformers(family, num_tokens):
    block, layer = _block_and_layer(family)
    x = torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(num_tokens))
    ref = _hf_out(block, x)
    out = _moe_out(layer, block, x)
    assert out.shape == (num_tokens, H) and out.dtype == torch.float32
    assert ref.double().norm() > 0
    assert _rel(out, ref) < FP32_TOL


def test_every_tensor_randomized():
    block, _ = _block_and_layer("deepseek_v3")
    bias = block.gate.e_score_correction_bias
    assert bias.abs().min() > 0 and bias.std() > 0.1
    for t in list(block.parameters()) + list(block.buffers()):
        assert t.abs().sum() > 0


def test_correction_bias_matters():
    # Negative control: a layer that drops the bias disagrees with the block, so the match
    # above really exercises the bias path.
    block, layer = _block_and_layer("deepseek_v3")
    x = torch.randn(33, H, generator=torch.Generator().manual_seed(5))
    ref = _hf_out(block, x)
    saved = layer.e_score_correction_bias.detach().clone()
    try:
        with torch.no_grad():
            layer.e_score_correction_bias.zero_()
        assert _rel(_moe_out(layer, block, x), ref) > SENSITIVE
    finally:
        with torch.no_grad():
            layer.e_score_correction_bias.copy_(saved)


def test_built_layer_config():
    _, l4 = _block_and_layer("llama4")
    c = l4.config
    assert (c.num_experts, c.top_k, c.hidden_size, c.intermediate_size) == (E, 1, H, I)
    assert c.routing.method is M.LLAMA4 and c.apply_router_weight_on_input
    assert c.shared_intermediate_size == I and not c.shared_expert_gate
    _, q2 = _block_and_layer("qwen2_moe")
    assert q2.config.shared_intermediate_size == 24 and q2.config.shared_expert_gate
    _, v2 = _block_and_layer("deepseek_v2-norm-ignored")
    assert v2.config.routing.renormalize is False
    assert v2.config.routing.routed_scaling_factor == 1.5
    _, v3 = _block_and_layer("deepseek_v3")
    assert v3.config.routing == _routing(M.NOAUX_TC, groups=4, topk_group=2, scale=2.5)


def test_router_weight_attribute():
    from moerun.hf import router_weight

    llama, _ = _block_and_layer("llama4")
    assert router_weight(llama).data_ptr() == llama.router.weight.data_ptr()
    mixtral, _ = _block_and_layer("mixtral")
    w = router_weight(mixtral)
    assert w.shape == (E, H) and w.data_ptr() == mixtral.gate.weight.data_ptr()
    assert not w.requires_grad


def test_layer_owns_a_copy():
    from moerun.hf import from_hf

    block = _new_block("qwen3_moe", seed=3)
    layer = from_hf(block, layer_idx=4)  # defaults: backend/comm "auto", the block's device
    assert layer.layer_idx == 4 and layer.device == torch.device("cpu")
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(1))
    before = _moe_out(layer, block, x)
    assert _rel(before, _hf_out(block, x)) < FP32_TOL
    with torch.no_grad():
        block.experts.gate_up_proj.mul_(2.0)
    assert torch.equal(_moe_out(layer, block, x), before)


# ----------------------------------------------------------------- expert layout helper


class _FakeExperts(nn.Module):
    """Stands in for a transformers experts module with the flags its decorator sets."""

    def __init__(self, gate_up, down, **flags):
        super().__init__()
        self.gate_up_proj = nn.Parameter(gate_up, requires_grad=False)
        self.down_proj = nn.Parameter(down, requires_grad=False)
        self.act_fn = nn.SiLU()
        for k, v in flags.items():
            setattr(self, k, v)


def _layout_case():
    g = torch.Generator().manual_seed(11)
    gate_EIH = torch.randn(E, I, H, generator=g)
    up_EIH = torch.randn(E, I, H, generator=g)
    w2_EHI = torch.randn(E, H, I, generator=g)
    return gate_EIH, up_EIH, w2_EHI


def test_layout_transposed_and_interleaved():
    # Stored like gpt-oss: [E, H, 2I] with columns g0 u0 g1 u1 ...; down [E, I, H].
    # H == 2I here, so only the flag (not the shape) can tell the orientation.
    from moerun.hf import _expert_weights

    gate, up, w2 = _layout_case()
    inter = torch.stack([gate, up], dim=2).reshape(E, 2 * I, H)  # rows g0 u0 g1 u1 ...
    fake = _FakeExperts(inter.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous(),
                        is_transposed=True, is_concatenated=False)
    w13, down = _expert_weights(fake, transposed_default=False, e=E, h=H, i=I)
    assert torch.equal(w13, torch.cat([gate, up], dim=1))
    assert torch.equal(down, w2)


def test_layout_unflagged_uses_family_default():
    from moerun.hf import _expert_weights

    gate, up, w2 = _layout_case()
    w13_ref = torch.cat([gate, up], dim=1)
    fake = _FakeExperts(w13_ref.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous())
    w13, down = _expert_weights(fake, transposed_default=True, e=E, h=H, i=I)
    assert torch.equal(w13, w13_ref) and torch.equal(down, w2)
    plain = _FakeExperts(w13_ref.clone(), w2.clone())
    w13, down = _expert_weights(plain, transposed_default=False, e=E, h=H, i=I)
    assert torch.equal(w13, w13_ref) and torch.equal(down, w2)


def _fake(**flags):
    gate, up, w2 = _layout_case()
    return _FakeExperts(torch.cat([gate, up], dim=1), w2, **flags)


LAYOUT_ERRORS = {
    "bias flag": (lambda: _fake(has_bias=True), ValueError,
                  r"experts.has_bias=True: expert biases are unsupported"),
    "ungated": (lambda: _fake(has_gate=False), ValueError, r"experts.has_gate=False"),
    "post norm": (lambda: _fake(has_post_expert_norm=True), ValueError,
                  r"has_post_expert_norm=True: post-expert norms"),
    "bias tensor": (lambda: _fake(down_proj_bias=torch.zeros(E, H)), ValueError,
                    r"experts.down_proj_bias is set"),
    "gelu": (lambda: _fake(act_fn=nn.GELU()), ValueError, r"experts.act_fn is GELU"),
    "shape": (lambda: _fake(is_transposed=True), ValueError,
              r"do not match the config \(E=8, H=32, I=16\) in the \[E, H, 2I\]"),
    "quantized": (lambda: _FakeExperts(torch.zeros(E, 2 * I, H, dtype=torch.float8_e4m3fn),
                                       torch.zeros(E, H, I, dtype=torch.float8_e4m3fn)),
                  ValueError, r"quantized experts are unsupported"),
    "module list": (lambda: nn.ModuleList([nn.Linear(H, I) for _ in range(E)]), TypeError,
                    r"no fused 3-D tensors gate_up_proj / down_proj \(e.g. a ModuleList"),
}


@pytest.mark.parametrize("name", sorted(LAYOUT_ERRORS))
def test_layout_errors(name):
    from moerun.hf import _expert_weights

    make, exc, match = LAYOUT_ERRORS[name]
    with pytest.raises(exc, match=match):
        _expert_weights(make(), transposed_default=False, e=E, h=H, i=I)


# ----------------------------------------------------------------- from_hf errors


def test_unknown_block_class():
    from moerun.hf import from_hf, router_weight

    with pytest.raises(TypeError, match=r"from_hf does not support torch.nn.modules.linear."
                                        r"Linear; supported transformers 5.x blocks: "
                                        r"MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock"):
        from_hf(nn.Linear(H, E))
    with pytest.raises(TypeError, match=r"from_hf does not support .*Llama4TextMoe"):
        router_weight(nn.Linear(H, E))


def test_subclass_of_supported_block_refused():
    from moerun.hf import from_hf

    block_cls, config_cls = _classes("qwen3_moe")
    sub = type("Qwen3MoeSparseMoeBlock", (block_cls,), {"__module__": __name__})
    with pytest.raises(TypeError, match=r"from_hf does not support tests.test_hf."
                                        r"Qwen3MoeSparseMoeBlock"):
        from_hf(sub(config_cls(**BLOCKS["qwen3_moe"][3])))


def test_per_expert_module_list_refused():
    from moerun.hf import from_hf

    block = _new_block("mixtral")
    block.experts = nn.ModuleList([nn.Linear(H, I) for _ in range(E)])
    with pytest.raises(TypeError, match=r"experts module ModuleList has no fused 3-D tensors"):
        from_hf(block)


def test_non_silu_block_refused():
    from moerun.hf import from_hf

    with pytest.raises(ValueError, match=r"hidden_act='gelu' cannot be mapped"):
        from_hf(_new_block("mixtral", hidden_act="gelu"))


def test_llama4_top2_block_refused():
    from moerun.hf import from_hf

    with pytest.raises(ValueError, match=r"num_experts_per_tok=2 cannot be mapped"):
        from_hf(_new_block("llama4", num_experts_per_tok=2))


def test_shared_expert_bias_refused():
    from moerun.hf import from_hf

    block = _new_block("qwen2_moe")
    block.shared_expert.gate_proj = nn.Linear(H, 24, bias=True)
    with pytest.raises(ValueError, match=r"block.shared_expert.gate_proj has a bias"):
        from_hf(block)


def test_router_shape_mismatch_refused():
    from moerun.hf import from_hf

    block = _new_block("qwen3_moe")
    block.gate.weight = nn.Parameter(torch.randn(E, H + 1))
    with pytest.raises(ValueError, match=r"router weight block.gate.weight has shape \(8, 33\)"):
        from_hf(block)
