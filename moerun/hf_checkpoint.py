"""Expert-by-expert loading of Hugging Face safetensors checkpoints (DESIGN 11b).

Legend: ``E`` experts, ``H`` hidden, ``I`` expert intermediate.

:func:`checkpoint_expert_items` turns one MoE layer's expert tensors in a checkpoint into the
``(expert_id, name, tensor)`` items :meth:`moerun.ConfigurableMoE.load_expert_weights` takes,
lazily: a rank reads only the experts it holds (the role of vLLM / SGLang's
``make_expert_params_mapping`` + ``weight_loader``). :func:`load_expert_checkpoint` does that
for every block :func:`moerun.patch_model` replaced.

Key layouts recognised under a layer's experts prefix ``P`` (``save_pretrained`` of
transformers 5 writes the per-expert ones; released checkpoints use the same):

===============================================  ==========================================
keys                                             families
===============================================  ==========================================
``P{e}.gate_proj.weight`` ``[I, H]``, ``up_proj``,  Qwen2/3-MoE, DeepSeek-V2/V3
``P{e}.down_proj.weight`` ``[H, I]``
``P{e}.w1.weight`` (gate), ``w3`` (up), ``w2``      Mixtral, MiniMax-M2
(down)
``Pgate_up_proj`` ``[E, 2I, H]``, ``Pdown_proj``   fused; ``transposed=True``: ``[E, H, 2I]`` /
``[E, H, I]``                                     ``[E, I, H]`` (Llama 4)
===============================================  ==========================================

FP8 block-scaled checkpoints (issue 12) add each weight's ``weight_scale_inv`` (per-expert
``P{e}.gate_proj.weight_scale_inv`` ...; fused ``Pgate_up_proj_scale_inv`` /
``Pdown_proj_scale_inv``), read as the ``*_scale_inv`` items of
:meth:`moerun.ConfigurableMoE.load_expert_weights`.

Needs the ``safetensors`` package (installed with transformers).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Iterator

import torch
from torch import nn

__all__ = ["checkpoint_expert_items", "load_expert_checkpoint"]

_PER_EXPERT = re.compile(r"^(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight"
                         r"(_scale_inv)?$")
_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_FUSED = ("gate_up_proj", "down_proj", "gate_up_proj_scale_inv", "down_proj_scale_inv")


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError as exc:
        raise ImportError("reading checkpoints needs safetensors: pip install safetensors "
                          "(it comes with transformers)") from exc
    return safe_open


def _checkpoint_files(source: str | os.PathLike) -> list[str]:
    """The ``.safetensors`` files of a model directory (its index's shards, else every
    ``*.safetensors`` in it) or ``[source]`` for one file."""
    path = os.fspath(source)
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist; pass a model directory "
                                "(save_pretrained output) or a .safetensors file")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, s) for s in shards]
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint directory {path!r} holds no .safetensors file")
    return files


class _Checkpoint:
    """Open handles of a checkpoint's files and the file of every key."""

    def __init__(self, source: str | os.PathLike) -> None:
        safe_open = _safe_open()
        self.handles = [safe_open(f, framework="pt") for f in _checkpoint_files(source)]
        self.where = {key: h for h in self.handles for key in h.keys()}


def _items(ckpt: _Checkpoint, prefix: str, transposed: bool
           ) -> list[tuple[int, str, Callable[[], torch.Tensor]]]:
    found: list[tuple[int, str, Callable[[], torch.Tensor]]] = []
    for key, handle in ckpt.where.items():
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):]
        m = _PER_EXPERT.match(rest)
        if m is not None:
            name = _NAMES.get(m.group(2), m.group(2)) + ("_scale_inv" if m.group(3) else "")
            found.append((int(m.group(1)), name,
                          lambda h=handle, k=key: h.get_tensor(k)))
        elif rest in _FUSED:
            fused = handle.get_slice(key)
            for e in range(fused.get_shape()[0]):
                # one expert's slice is read from the file only when called
                found.append((e, rest, lambda s=fused, e=e: s[e].t() if transposed else s[e]))
    found.sort(key=lambda item: (item[0], item[1]))
    return found


def checkpoint_expert_items(source: str | os.PathLike, prefix: str, *,
                            transposed: bool = False
                            ) -> Iterator[tuple[int, str, Callable[[], torch.Tensor]]]:
    """The experts of one layer in a safetensors checkpoint, as lazy load items.

    Args:
        source: a model directory (``model.safetensors`` or a sharded index) or one
            ``.safetensors`` file.
        prefix: the layer's experts key prefix, ending in ``"."`` (e.g.
            ``"model.layers.3.mlp.experts."``).
        transposed: fused tensors are stored ``[E, H, 2I]`` / ``[E, I, H]`` (Llama 4).

    Returns an iterator of ``(expert_id, name, read)``, sorted by expert: ``name`` in ``gate_proj``,
    ``up_proj``, ``down_proj`` (per-expert keys; ``w1``/``w3``/``w2`` renamed) or
    ``gate_up_proj`` / ``down_proj`` (one expert of a fused tensor), each also with the
    ``_scale_inv`` suffix for an FP8 checkpoint's scale blocks; ``read()`` returns the
    CPU tensor, reading only that tensor (or that expert's slice) from the file.

    Raises ``FileNotFoundError`` for a missing checkpoint and ``ValueError`` when no key
    starts with ``prefix`` (lists a few keys that exist).

    Host only; opens the checkpoint's files and reads their headers now; each ``read()`` reads its
    tensor from disk.
    """
    ckpt = _Checkpoint(source)
    items = _items(ckpt, prefix, transposed)
    if not items:
        sample = ", ".join(sorted(k for k in ckpt.where if "expert" in k)[:4]) or "none"
        raise ValueError(f"checkpoint {os.fspath(source)!r} has no expert tensors under "
                         f"prefix={prefix!r}; expert keys there include: {sample}")
    return iter(items)


def _prefixes(path: str, spec: Any) -> list[str]:
    """Checkpoint prefixes of a patched block at module path ``path`` (``...layers.3.mlp``)."""
    parent, _, attr = path.rpartition(".")
    names = (attr,) + tuple(n for n in spec.checkpoint_names if n != attr)
    return [(f"{parent}." if parent else "") + f"{name}.experts." for name in names]


@torch.no_grad()
def load_expert_checkpoint(model: nn.Module, source: str | os.PathLike) -> int:
    """Reload the routed experts of every :class:`moerun.HFMoEBlock` in ``model`` from a
    safetensors checkpoint, each rank reading only its own experts.

    The checkpoint's key prefix is the block's module path (``model.layers.3.mlp.experts.``)
    or the family's other name for it (Mixtral / MiniMax-M2 ``block_sparse_moe``). The
    shared expert and the correction bias are not read: the layer keeps its current ones
    (the HF model loads them with its other weights).

    Returns the number of items copied over all blocks (per-expert keys: 3 per local
    expert). Raises ``ValueError`` when a block's experts are missing from the checkpoint
    (:func:`checkpoint_expert_items`) or incomplete (:meth:`load_expert_weights`). No
    collective. Host memory: one expert tensor at a time beyond the layer's own.
    """
    from moerun.hf_patch import HFMoEBlock

    ckpt = _Checkpoint(source)
    copied = 0
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, HFMoEBlock)]
    if not blocks:
        raise ValueError(f"load_expert_checkpoint: {type(model).__name__} has no block "
                         "replaced by moerun.patch_model; call patch_model(model) first")
    for name, block in blocks:
        layer, spec = block.moe, block._spec
        items = []
        for prefix in _prefixes(name, spec):
            items = _items(ckpt, prefix, spec.transposed)
            if items:
                break
        if not items:
            tried = ", ".join(repr(p) for p in _prefixes(name, spec))
            raise ValueError(f"checkpoint {os.fspath(source)!r} has no expert tensors for "
                             f"{name} (tried prefixes {tried})")
        shared = None
        if layer.shared_expert is not None:
            se = layer.shared_expert
            shared = {"w13": se.w13.clone(), "w2": se.w2.clone()}
            if se.gate is not None:
                shared["gate"] = se.gate.clone()
        bias = None
        if layer.e_score_correction_bias is not None:
            bias = layer.e_score_correction_bias.detach().clone()
        copied += layer.load_expert_weights(items, shared=shared, e_score_correction_bias=bias)
    return copied
