"""The demo workload (examples/demo.py) on every transformers a supported Python gets.

Python 3.10 gets transformers 5.20 at most (5.21 on require 3.11), whose
generate() takes the KV cache as ``past_key_values`` and refuses ``cache``
(the newer name) as an unused model argument: the demo failed there before
generating anything. The stand-in model below checks generate()'s arguments
against its forward() as transformers does; the demo's real run on the
pinned transformers is in tests/unit/ship/test_pyroscope.py.
"""

from __future__ import annotations

import importlib.util
import inspect
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.paths import REPO

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402 - after the skips


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuflame_demo", REPO / "examples" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OldCacheName(torch.nn.Module):
    """transformers <= 5.20 (Python 3.10's): forward takes ``past_key_values``."""

    def forward(self, input_ids: Any = None, past_key_values: Any = None, attention_mask: Any = None) -> None:
        pass

    def generate(self, prompts: Any, **kwargs: Any) -> Any:
        accepted = set(inspect.signature(self.forward).parameters) | {"max_new_tokens", "do_sample", "pad_token_id"}
        unused = [k for k in kwargs if k not in accepted]
        if unused:  # transformers' own check, GenerationMixin._validate_model_kwargs
            raise ValueError(f"The following `model_kwargs` are not used by the model: {unused}")
        self.got = kwargs
        return prompts


class NewCacheName(OldCacheName):
    """transformers >= 5.21: forward takes ``cache``."""

    def forward(self, input_ids: Any = None, cache: Any = None, attention_mask: Any = None) -> None:
        pass


class Cache:
    def reset(self) -> None:
        pass


@pytest.mark.parametrize(("model_class", "name"), [(OldCacheName, "past_key_values"), (NewCacheName, "cache")])
def test_the_demo_hands_its_kv_cache_to_generate_under_the_name_transformers_takes(
    model_class: type[OldCacheName], name: str
) -> None:
    demo = load_demo()
    runner = object.__new__(demo.ModelRunner)
    runner.model, runner.kv_cache = model_class(), Cache()
    prompts = torch.ones(1, 3, dtype=torch.long)
    assert runner.generate(prompts, 2) is prompts
    assert runner.model.got[name] is runner.kv_cache


def test_the_demo_names_the_cache_as_the_installed_transformers_does() -> None:
    from transformers import LlamaForCausalLM

    accepted = inspect.signature(LlamaForCausalLM.forward).parameters
    assert load_demo().cache_argument(LlamaForCausalLM.__new__(LlamaForCausalLM)) in accepted
