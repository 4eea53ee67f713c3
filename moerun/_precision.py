"""``exact_fp32``: the fp32 matmul setting of moerun's commands (torch-free at import, so the
CLI's ``--help`` stays fast)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["exact_fp32"]


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """TF32 off for matmul and cuDNN inside the block (or the decorated function), restored
    after: the fp32 references and ceilings of a bench, tune or run command stay exact
    without changing the caller's process. Host only; not thread-safe (the flags are
    process-global)."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
