"""The benchmark matrix: named expert shapes and their token counts (``moerun bench``,
``moerun tune``, the Triton GPU tests).

Legend: ``E`` experts (for an EP-local shape: the slots one rank holds), ``K`` top-k, ``H``
hidden, ``I`` expert intermediate, ``T`` tokens (rows given to the experts).

Two groups of cells make the default GPU matrix:

* ``model`` -- four whole MoE layers on one GPU, ``T in {1, 16, 128, 1024, 8192}`` (20 cells),
  CUDA-graph replay up to ``--graph-max-tokens`` (the serving regime), eager above;
* ``ep-local`` -- the experts one rank holds under EP8, with the rows it receives (8 cells):
  ``deepseek-v3-ep8-local`` (32 of DeepSeek-V3's 256 experts; top-4 over them) and
  ``qwen3-235b-ep8-local`` (16 of Qwen3-235B's 128), ``T in {256, 2048, 8192, 32768}``,
  uniform random routing over the local experts, timed **eager** only (as the peer file's
  EP-local rows were). Names and sizes are those of ``shared/peers/h200-*.json``, so the
  peer comparison finds their rows.

``tiny`` is for CPU runs and tests only (group ``tiny``, not in the default matrix).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BenchShape", "SHAPES", "DEFAULT_SHAPES", "DEFAULT_TOKENS", "EP_LOCAL_TOKENS",
           "GROUPS", "parse_shapes", "parse_tokens", "parse_shape_spec"]

DEFAULT_TOKENS = (1, 16, 128, 1024, 8192)
EP_LOCAL_TOKENS = (256, 2048, 8192, 32768)
#: Cell groups in report order; the summary gives one geomean per (backend, group).
GROUPS = ("model", "ep-local", "custom", "tiny")


@dataclass(frozen=True, kw_only=True)
class BenchShape:
    """One expert shape of the matrix.

    Fields:
        name: the cell name (matches the peer file's ``shape``).
        num_experts: E, the experts the kernel runs (= its slot count; for an EP-local shape
            the local slots of one rank).
        top_k: K ids per token, distinct, in ``[0, E)``.
        hidden / intermediate: H and I (``w13`` is ``[E, 2I, H]``, ``w2`` ``[E, H, I]``).
        tokens: the T list of this shape when ``--tokens`` is not given.
        eager_only: time eagerly only (no CUDA-graph replay at any T).
        group: the summary group (:data:`GROUPS`).
    """

    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    tokens: tuple[int, ...] = DEFAULT_TOKENS
    eager_only: bool = False
    group: str = "model"

    def __post_init__(self):
        if min(self.num_experts, self.top_k, self.hidden, self.intermediate) < 1:
            raise ValueError(f"BenchShape {self.name!r}: E, K, H, I must be >= 1")
        if self.top_k > self.num_experts:
            raise ValueError(f"BenchShape {self.name!r}: top_k={self.top_k} > "
                             f"num_experts={self.num_experts} (ids must be distinct)")
        if self.group not in GROUPS:
            raise ValueError(f"BenchShape.group={self.group!r}: use one of {GROUPS}")

    def weight_bytes(self, elt: int) -> int:
        """Bytes of ``w13`` plus ``w2`` for elements of ``elt`` bytes. Pure; host only."""
        return self.num_experts * 3 * self.hidden * self.intermediate * elt


SHAPES: dict[str, BenchShape] = {s.name: s for s in (
    BenchShape(name="mixtral8x7b", num_experts=8, top_k=2, hidden=4096, intermediate=14336),
    BenchShape(name="qwen3-30b-a3b", num_experts=128, top_k=8, hidden=2048, intermediate=768),
    BenchShape(name="qwen3-235b-a22b", num_experts=128, top_k=8, hidden=4096,
               intermediate=1536),
    BenchShape(name="deepseek-v3", num_experts=256, top_k=8, hidden=7168, intermediate=2048),
    # EP-local: what one of 8 ranks runs (peer file rows of the same names)
    BenchShape(name="deepseek-v3-ep8-local", num_experts=32, top_k=4, hidden=7168,
               intermediate=2048, tokens=EP_LOCAL_TOKENS, eager_only=True, group="ep-local"),
    BenchShape(name="qwen3-235b-ep8-local", num_experts=16, top_k=4, hidden=4096,
               intermediate=1536, tokens=EP_LOCAL_TOKENS, eager_only=True, group="ep-local"),
    # Built in for CPU smoke runs and tests: not part of the default matrix.
    BenchShape(name="tiny", num_experts=8, top_k=2, hidden=64, intermediate=32, group="tiny"),
)}
DEFAULT_SHAPES = ("mixtral8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
                  "deepseek-v3-ep8-local", "qwen3-235b-ep8-local")


def parse_shape_spec(spec: str) -> BenchShape:
    """One ``--shapes`` entry: a registered name, or ``E:K:H:I`` (a custom shape named
    ``E{E}k{K}H{H}I{I}``, group ``custom``, the default T list). ValueError names the entry
    and the valid names. Pure; host only."""
    name = spec.strip()
    if name in SHAPES:
        return SHAPES[name]
    if name.count(":") == 3:
        try:
            e, k, h, i = (int(v) for v in name.split(":"))
        except ValueError:
            raise ValueError(f"--shapes: {name!r} is not E:K:H:I (four ints)") from None
        return BenchShape(name=f"E{e}k{k}H{h}I{i}", num_experts=e, top_k=k, hidden=h,
                          intermediate=i, group="custom")
    raise ValueError(f"--shapes: unknown shape {name!r}; valid: {', '.join(SHAPES)}, or "
                     "E:K:H:I")


def parse_shapes(text: str | None) -> list[BenchShape]:
    """``"a,b"`` -> shapes; None/``"default"`` -> :data:`DEFAULT_SHAPES` (20 model cells and 8
    EP-local cells). ValueError names the unknown entry and the valid ones. Pure; host only."""
    if text is None or text == "default":
        return [SHAPES[n] for n in DEFAULT_SHAPES]
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--shapes {text!r}: empty list")
    return [parse_shape_spec(n) for n in names]


def parse_tokens(text: str | None) -> list[int] | None:
    """``"1,16"`` -> ``[1, 16]``; None -> None (each shape's own :attr:`BenchShape.tokens`).
    Each count must be >= 1. Pure; host only."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--tokens {text!r}: expected a comma-separated list of ints") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--tokens {text!r}: every token count must be >= 1")
    return values
