"""``ConfigurableMoE.forward_async`` (DESIGN 7): the forward up to its last issued collective,
finished by the handle's ``wait()``. On the CPU over gloo through the worker pool: the output
equals ``forward``'s bit for bit and the unsharded fp64 reference; when ``forward_async``
returns, every combine is issued and exactly the last one per micro-batch is not waited; the
layer refuses another forward until ``wait()``; ``wait()`` is idempotent; one rank."""

from __future__ import annotations

import pytest
import torch

from tests import async_tasks

FP32 = 1e-5


@pytest.mark.parametrize("scheduler,comm,counts,max_num_tokens,shared,order", [
    ("external", "allgather", (5, 3), None, 0, "auto"),
    ("external", "alltoall", (4, 0, 6), 4, 8, "during_combine"),
    ("dbo", "allgather", (6, 4), None, 8, "during_combine"),
    ("dbo", "alltoall", (5, 7, 2), 6, 0, "auto"),
])
def test_forward_async_equals_forward(pools, scheduler, comm, counts, max_num_tokens, shared,
                                      order):
    results = pools(len(counts)).run(async_tasks.async_task, counts=counts, comm=comm,
                                     scheduler=scheduler, max_num_tokens=max_num_tokens,
                                     shared=shared, shared_order=order)
    ranks = len(counts)
    for res in results:
        assert all(res["diff"]) and all(e < FP32 for e in res["err"]), res
        ubs = 2 if res["split"] else 1
        assert res["split"] == (scheduler == "dbo")
        for (issued, waited), (issued_end, waited_end) in zip(res["at_return"], res["after"]):
            # every combine issued; all but the last of each micro-batch waited
            assert issued == issued_end and waited == issued - ubs and waited_end == issued
            chunks = issued // ubs
            if max_num_tokens is None:
                assert chunks == 1
            else:  # ceil(dp * max(T) / max_num_tokens) chunks per (micro-)batch
                assert chunks >= 2
        for before, at_return, done, after in res["steps"]:
            assert (at_return, done, after) == (before, False, before + 1)
        for refused in res["refused"]:
            assert all(m is not None and "forward_async handle of this layer is not waited; "
                       "call its wait() first" in m for m in refused), refused
        assert all(res["same_object"])
    assert ranks == len(results)


def test_forward_async_on_one_rank_and_misuse():
    from moerun import ConfigurableMoE, ForwardHandle, MoEConfig

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8)
    g = torch.Generator().manual_seed(3)
    x, logits = torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)
    w13, w2 = torch.randn(4, 16, 8, generator=g), torch.randn(4, 8, 8, generator=g)
    with ConfigurableMoE(cfg, backend="reference") as layer:
        layer.load_weights(w13, w2)
        want = layer(x, logits)
        handle = layer.forward_async(x, logits)
        assert isinstance(handle, ForwardHandle) and repr(handle) == "ForwardHandle(pending)"
        with pytest.raises(RuntimeError, match="forward while a forward_async handle"):
            layer(x, logits)
        assert torch.equal(handle.wait(), want) and layer.step == 2
        assert repr(handle) == "ForwardHandle(waited)"
        handle = layer.forward_async(x, logits)
    # closed before wait(): the handle refuses, and keeps refusing
    from moerun import LayerClosedError

    for _ in range(2):
        with pytest.raises(LayerClosedError, match="closed"):
            handle.wait()
    assert handle.done and repr(handle) == "ForwardHandle(failed)"


@pytest.mark.gpu
def test_forward_async_on_cuda_finishes_on_its_own_stream():
    """On CUDA: ``wait()`` runs the rest of the forward on the stream that was current at
    ``forward_async``, even when the caller has switched streams in between."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from moerun import ConfigurableMoE, MoEConfig

    dev = torch.device("cuda")
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32,
                    shared_intermediate_size=32, dtype=torch.float32)
    g = torch.Generator(device=dev).manual_seed(5)
    x = torch.randn(33, 64, generator=g, device=dev)
    logits = torch.randn(33, 8, generator=g, device=dev)
    w13 = torch.randn(8, 64, 64, generator=g, device=dev) / 8
    w2 = torch.randn(8, 64, 32, generator=g, device=dev) / 8
    shared = {"w13": torch.randn(64, 64, generator=g, device=dev) / 8,
              "w2": torch.randn(64, 32, generator=g, device=dev) / 8}
    with ConfigurableMoE(cfg, device=dev, backend="reference") as layer:
        layer.load_weights(w13, w2, shared=shared)
        want = layer(x, logits)
        handle = layer.forward_async(x, logits)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # the caller's own work on another stream
            busy = torch.randn(512, 512, device=dev) @ torch.randn(512, 512, device=dev)
            out = handle.wait()
        torch.cuda.synchronize()
        assert torch.equal(out, want) and busy.isfinite().all()
