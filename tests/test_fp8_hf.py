"""Hugging Face FP8 checkpoints (issue 12): ``quantization_config`` -> ``MoEConfig.quant``,
``from_hf`` of a transformers ``FP8Experts`` block inside a ``DeepseekV3MoE``, and
``patch_model`` on a tiny DeepSeek-V3 whose experts are ``FP8Experts``.

transformers' own FP8 expert forward needs its ``kernels`` package (GPU kernels), so the
references are the HF block / model with the **dequantized** weights in fp32 (HF code,
independent of moerun: the 6e-2 bar) and DESIGN 11a's ``reference_fp8_moe`` on the HF
router's choices plus the HF shared expert (the 3e-2 bar).
"""

from __future__ import annotations

import copy

import pytest
import torch

import moerun
from moerun import MoEConfig, QuantConfig
from moerun.quant import dequantize_weight_blocks, quantize_weight_blocks, reference_fp8_moe
from tests.moe_cases import TOL_FP8, TOL_FP8_UNQUANTIZED, rel_err

transformers = pytest.importorskip("transformers")
fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")

V3 = dict(model_type="deepseek_v3", n_routed_experts=8, num_experts_per_tok=2, hidden_size=256,
          moe_intermediate_size=128, n_group=2, topk_group=1, dtype="bfloat16")
FP8_QC = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic",
          "fmt": "e4m3"}


# -- config ---------------------------------------------------------------------------------
def test_from_hf_config_maps_block_fp8():
    cfg = MoEConfig.from_hf_config(dict(V3, quantization_config=FP8_QC))
    assert cfg.quant == QuantConfig() and cfg.dtype == torch.bfloat16
    dq = MoEConfig.from_hf_config(dict(V3, quantization_config=dict(FP8_QC, dequantize=True)))
    assert dq.quant is None
    assert MoEConfig.from_hf_config(V3).quant is None
    fp8_cfg = transformers.FineGrainedFP8Config(weight_block_size=[128, 128])
    assert MoEConfig.from_hf_config(dict(V3, quantization_config=fp8_cfg)).quant == QuantConfig()


QC_ERRORS = {
    "awq": ({"quant_method": "awq", "bits": 4}, r"quantization_config.quant_method='awq'"),
    "mxfp4": ({"quant_method": "mxfp4"}, r"quantization_config.quant_method='mxfp4'"),
    "static": (dict(FP8_QC, activation_scheme="static"),
               r"quantization_config.activation_scheme='static' cannot be mapped: must be "
               r"'dynamic'"),
    "per-tensor": ({"quant_method": "fp8"}, r"quantization_config.weight_block_size=None"),
    "bad block": (dict(FP8_QC, weight_block_size=[128, 0]),
                  r"quantization_config.weight_block_size=\[128, 0\]"),
    "act group": (dict(FP8_QC, weight_block_size=[128]),
                  r"quantization_config.weight_block_size=\[128\]"),
    "fp4 experts": (dict(FP8_QC, expert_dtype="fp4"), r"quantization_config.expert_dtype='fp4'"),
    "ue8m0": (dict(FP8_QC, scale_fmt="ue8m0"), r"quantization_config.scale_fmt='ue8m0'"),
}


@pytest.mark.parametrize("name", sorted(QC_ERRORS))
def test_from_hf_config_refuses_other_quantization(name):
    qc, match = QC_ERRORS[name]
    with pytest.raises(ValueError, match=match):
        MoEConfig.from_hf_config(dict(V3, quantization_config=qc))


def test_from_hf_config_fp8_needs_block_multiples():
    with pytest.raises(ValueError, match=r"MoEConfig.intermediate_size=96 is invalid: with "
                                         r"quant"):
        MoEConfig.from_hf_config(dict(V3, moe_intermediate_size=96, quantization_config=FP8_QC))


# -- one block --------------------------------------------------------------------------------
def _v3_config(**changes):
    kw = dict(hidden_size=256, moe_intermediate_size=128, n_routed_experts=8,
              num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
              intermediate_size=256, num_hidden_layers=1, norm_topk_prob=True,
              routed_scaling_factor=2.5, experts_implementation="eager")
    kw.update(changes)
    return transformers.DeepseekV3Config(**kw)


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in module.named_parameters():
            if p.dtype.is_floating_point and p.element_size() > 1:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
                        if p.dim() >= 2 else 1.0 + 0.1 * torch.randn(p.shape, generator=g))
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def _to_fp8_experts(block, cfg, *, fp8_shared: bool = False):
    """Swap ``block.experts`` (and optionally the shared MLP's Linears) for transformers'
    FP8 modules holding the block-quantized weights; the float block keeps the dequantized
    weights (the reference). Returns ``(fp8 block, float reference block)``."""
    experts = fp8.FP8Experts(config=cfg, block_size=(128, 128))
    q13, s13 = quantize_weight_blocks(block.experts.gate_up_proj.detach())
    q2, s2 = quantize_weight_blocks(block.experts.down_proj.detach())
    with torch.no_grad():
        for name, t in (("gate_up_proj", q13), ("gate_up_proj_scale_inv", s13),
                        ("down_proj", q2), ("down_proj_scale_inv", s2)):
            getattr(experts, name).copy_(t)
        block.experts.gate_up_proj.copy_(dequantize_weight_blocks(q13, s13))
        block.experts.down_proj.copy_(dequantize_weight_blocks(q2, s2))
    ref = copy.deepcopy(block)
    block.experts = experts
    if fp8_shared:
        for name in ("gate_proj", "up_proj", "down_proj"):
            lin = getattr(block.shared_experts, name)
            q, s = quantize_weight_blocks(lin.weight.detach())
            new = fp8.FP8Linear(lin.in_features, lin.out_features, block_size=(128, 128))
            with torch.no_grad():
                new.weight.copy_(q)
                new.weight_scale_inv.copy_(s)
                getattr(ref.shared_experts, name).weight.copy_(dequantize_weight_blocks(q, s))
            setattr(block.shared_experts, name, new)
    return block, ref


def _block(seed=0, **kw):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = _v3_config()
    torch.manual_seed(seed)
    block = DeepseekV3MoE(cfg).eval()
    _randomize(block, seed + 1)
    return _to_fp8_experts(block, cfg, **kw)


@pytest.mark.parametrize("fp8_shared", [False, True])
def test_from_hf_fp8_experts_block_meets_both_bars(fp8_shared):
    block, ref_block = _block(fp8_shared=fp8_shared)
    layer = moerun.from_hf(block)
    assert layer.config.quant == QuantConfig() and layer.report.backend == "reference"
    assert layer.w13.dtype == torch.float8_e4m3fn
    assert torch.equal(layer.w13.view(torch.uint8), block.experts.gate_up_proj.view(torch.uint8))
    assert torch.equal(layer.w2_scale, block.experts.down_proj_scale_inv)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(48, 256, generator=g)
    logits = torch.nn.functional.linear(x, moerun.router_weight(block).float())
    with torch.no_grad():
        out = layer(x, logits)
        ref = ref_block(x.view(1, 48, 256)).view(48, 256)  # HF, dequantized weights, fp32
        # DESIGN 11a on the HF router's own choice, plus the HF shared expert
        _, weights, ids = ref_block.gate(x)
        ref_11a = reference_fp8_moe(x, block.experts.gate_up_proj,
                                    block.experts.gate_up_proj_scale_inv,
                                    block.experts.down_proj, block.experts.down_proj_scale_inv,
                                    weights.float(), ids, QuantConfig())
        ref_11a = ref_11a + ref_block.shared_experts(x)
    assert rel_err(out, ref_11a) < TOL_FP8
    assert rel_err(out, ref) < TOL_FP8_UNQUANTIZED
    layer.close()


def test_from_hf_refuses_unsupported_fp8_experts():
    block, _ = _block()
    block.experts.activation_scheme = "static"
    with pytest.raises(ValueError, match=r"experts.activation_scheme='static'"):
        moerun.from_hf(block)
    block.experts.activation_scheme = "dynamic"
    block.experts.block_size = None
    with pytest.raises(ValueError, match=r"experts.block_size=None: per-tensor FP8"):
        moerun.from_hf(block)


# -- a whole model ---------------------------------------------------------------------------
def _tiny_fp8_model():
    """A 2-layer DeepSeek-V3 (H = I = 128) whose experts are FP8Experts, and the fp32 model
    with the same, dequantized, expert weights."""
    from tests.hf_tasks import _COMMON, _MLA

    kw = dict(_COMMON, **_MLA)
    kw.update(hidden_size=128, moe_intermediate_size=128, intermediate_size=128,
              n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4,
              topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    cfg = transformers.DeepseekV3Config(**kw)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    _randomize(model, 1000)
    ref = copy.deepcopy(model)
    for layer, ref_layer in zip(model.model.layers, ref.model.layers):
        block, ref_block = _to_fp8_experts(layer.mlp, cfg)
        layer.mlp, ref_layer.mlp = block, ref_block
    return model, ref


def test_patch_model_with_fp8_experts_and_to_bf16():
    from tests.hf_tasks import prompt

    model, ref = _tiny_fp8_model()
    assert moerun.patch_model(model) == 2
    blocks = [m for m in model.modules() if isinstance(m, moerun.HFMoEBlock)]
    assert all(b.moe.config.quant == QuantConfig() for b in blocks)
    ids = prompt(7, seed=1, batch=2)
    with torch.no_grad():
        out = model(ids).logits
        want = ref(ids).logits
    assert rel_err(out, want) < TOL_FP8_UNQUANTIZED
    model.to(torch.bfloat16)  # rebuilds each layer in bf16 activations, fp8 weights kept
    for b in blocks:
        assert b.moe.config.dtype == torch.bfloat16 and b.moe.w13.dtype == torch.float8_e4m3fn
    with torch.no_grad():
        out16 = model(ids).logits
    assert rel_err(out16, want) < TOL_FP8_UNQUANTIZED


def test_fp8_checkpoint_items_carry_the_scales(tmp_path):
    from safetensors.torch import save_file

    from moerun import ConfigurableMoE
    from moerun.hf_checkpoint import checkpoint_expert_items
    from tests.moe_cases import make_case

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128,
                    quant=QuantConfig())
    c = make_case(cfg, 1, seed=0)
    tensors = {}
    for e in range(4):  # the per-expert keys of a DeepSeek-V3 FP8 checkpoint
        p = f"model.layers.0.mlp.experts.{e}."
        for name, w, s in (("gate_proj", c.w13[e, :128], c.w13_scale[e, :1]),
                           ("up_proj", c.w13[e, 128:], c.w13_scale[e, 1:]),
                           ("down_proj", c.w2[e], c.w2_scale[e])):
            tensors[p + name + ".weight"] = w.contiguous()
            tensors[p + name + ".weight_scale_inv"] = s.contiguous()
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    with ConfigurableMoE(cfg) as layer:
        assert layer.load_expert_weights(
            checkpoint_expert_items(path, "model.layers.0.mlp.experts.")) == 24
        assert torch.equal(layer.w13.view(torch.uint8), c.w13.view(torch.uint8))
        assert torch.equal(layer.w13_scale, c.w13_scale)
        assert torch.equal(layer.w2_scale, c.w2_scale)
