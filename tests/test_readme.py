"""The README's "Using it" section runs as written, and the acceptance script of issue 13
(README public API only: one ``patch_model`` call on tiny Qwen3-MoE, Mixtral and DeepSeek-V3
models gives the unpatched model's greedy tokens, single rank and EP=2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.hf_tasks import readme_acceptance_task

README = Path(__file__).resolve().parents[1] / "README.md"


def _using_it_snippets() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Using it", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_using_it_has_the_layer_and_the_model_snippets():
    snippets = _using_it_snippets()
    assert len(snippets) == 2
    assert "ConfigurableMoE(" in snippets[0] and "moerun.patch_model(model)" in snippets[1]


def test_layer_snippet_runs(capsys):
    namespace: dict = {}
    exec(compile(_using_it_snippets()[0], "README.md:layer", "exec"), namespace)
    assert namespace["out"].shape == (namespace["T"], namespace["H"])
    assert namespace["y"].shape == (namespace["T"], namespace["H"])
    assert namespace["layer"].closed
    assert "moerun resolution report" in capsys.readouterr().out


def test_model_snippet_runs(capsys):
    pytest.importorskip("transformers")
    namespace: dict = {}
    exec(compile(_using_it_snippets()[1], "README.md:model", "exec"), namespace)
    assert namespace["replaced"] == 2
    assert torch.equal(namespace["before"], namespace["after"])
    assert len(namespace["out"].router_logits) == 2
    assert capsys.readouterr().out.strip().endswith("2 True")


def test_supported_block_list_matches_the_code():
    from moerun.hf import SUPPORTED_BLOCKS

    text = README.read_text(encoding="utf-8")
    listed = re.search(r"\*\*Supported blocks\*\*.*?:\n(.*?)\.\n", text, re.S).group(1)
    assert re.findall(r"`(\w+)`", listed) == list(SUPPORTED_BLOCKS)


ACCEPTANCE = ["qwen3_moe", "mixtral", "deepseek_v3"]


@pytest.mark.parametrize("family", ACCEPTANCE)
def test_acceptance_single_rank(family):
    pytest.importorskip("transformers")
    res = readme_acceptance_task(None, family=family, length=6)
    assert res["replaced"] == 2
    assert res["after"] == res["before"]


@pytest.mark.parametrize("family", ACCEPTANCE)
def test_acceptance_negative_control(family):
    # the check above can fail: without the routed experts the tokens change
    pytest.importorskip("transformers")
    res = readme_acceptance_task(None, family=family, length=6, zero_experts=True)
    assert res["after"] != res["before"]


@pytest.mark.parametrize("family", ACCEPTANCE)
def test_acceptance_ep2(family, pools):
    pytest.importorskip("transformers")
    res = pools(2).run(readme_acceptance_task, family=family, per_rank=[{"length": 4},
                                                                        {"length": 9}])
    for r in res:
        assert r["replaced"] == 2
        assert r["after"] == r["before"]
