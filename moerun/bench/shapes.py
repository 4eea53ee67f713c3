"""The benchmark matrix: named expert shapes and token counts (``moerun bench``).

Legend: ``E`` experts, ``K`` top-k, ``H`` hidden, ``I`` expert intermediate, ``T`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BenchShape", "SHAPES", "DEFAULT_SHAPES", "DEFAULT_TOKENS", "parse_shapes",
           "parse_tokens"]


@dataclass(frozen=True, kw_only=True)
class BenchShape:
    """One MoE layer's expert shape: ``name``, ``num_experts`` E, ``top_k`` K, ``hidden`` H,
    ``intermediate`` I (per expert; ``w13`` is ``[E, 2I, H]``, ``w2`` ``[E, H, I]``)."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int

    def weight_bytes(self, elt: int) -> int:
        """Bytes of ``w13`` plus ``w2`` for elements of ``elt`` bytes."""
        return self.num_experts * 3 * self.hidden * self.intermediate * elt


SHAPES: dict[str, BenchShape] = {s.name: s for s in (
    BenchShape(name="mixtral8x7b", num_experts=8, top_k=2, hidden=4096, intermediate=14336),
    BenchShape(name="qwen3-30b-a3b", num_experts=128, top_k=8, hidden=2048, intermediate=768),
    BenchShape(name="qwen3-235b-a22b", num_experts=128, top_k=8, hidden=4096,
               intermediate=1536),
    BenchShape(name="deepseek-v3", num_experts=256, top_k=8, hidden=7168, intermediate=2048),
    # Built in for CPU smoke runs and tests: not part of the default matrix.
    BenchShape(name="tiny", num_experts=8, top_k=2, hidden=64, intermediate=32),
)}
DEFAULT_SHAPES = ("mixtral8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3")
DEFAULT_TOKENS = (1, 16, 128, 1024, 8192)


def parse_shapes(text: str | None) -> list[BenchShape]:
    """``"a,b"`` -> shapes; None/``"default"`` -> the four model shapes. ValueError names the
    unknown entry and the valid ones."""
    if text is None or text == "default":
        return [SHAPES[n] for n in DEFAULT_SHAPES]
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--shapes {text!r}: empty list")
    for name in names:
        if name not in SHAPES:
            raise ValueError(f"--shapes: unknown shape {name!r}; valid: {', '.join(SHAPES)}")
    return [SHAPES[n] for n in names]


def parse_tokens(text: str | None) -> list[int]:
    """``"1,16"`` -> ``[1, 16]``; None -> :data:`DEFAULT_TOKENS`. Each count must be >= 1."""
    if text is None:
        return list(DEFAULT_TOKENS)
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--tokens {text!r}: expected a comma-separated list of ints") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--tokens {text!r}: every token count must be >= 1")
    return values
