"""The demo workload: a small Llama-style model serving a few prompts.

Built from a config with random weights (no download), it loads the model,
sets aside a static KV cache the way an inference engine does, and generates.
It runs on the GPU when there is one and on the CPU otherwise. Profile it:

    gpuflame run -o demo.pb.gz examples/demo.py
    gpuflame report demo.pb.gz
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache


def small_llama_config() -> LlamaConfig:
    """Llama's shape at a size a laptop CPU runs in seconds."""
    return LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )


class ModelRunner:
    """Loads the model and owns its KV cache, like a serving engine's runner."""

    def __init__(self, device: torch.device, max_batch: int, max_len: int) -> None:
        self.device = device
        self.max_batch = max_batch
        self.max_len = max_len
        self.model = self.load_model()
        self.kv_cache = self._allocate_kv_cache_tensors()

    def load_model(self) -> LlamaForCausalLM:
        torch.manual_seed(0)
        model = LlamaForCausalLM(small_llama_config()).to(self.device)
        return model.eval()

    def _allocate_kv_cache_tensors(self) -> StaticCache:
        """The whole KV cache up front, as a serving engine reserves it at start-up."""
        config = self.model.config
        cache = StaticCache(config=config, max_cache_len=self.max_len)
        cache.early_initialization(
            batch_size=self.max_batch,
            num_heads=config.num_key_value_heads,
            head_dim=config.hidden_size // config.num_attention_heads,
            dtype=self.model.dtype,
            device=self.device,
        )
        return cache

    @torch.inference_mode()
    def generate(self, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
        self.kv_cache.reset()
        return self.model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            **{cache_argument(self.model): self.kv_cache},
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    runner = ModelRunner(device, args.batch, args.prompt_len + args.new_tokens)
    generator = torch.Generator().manual_seed(1)
    for _ in range(args.rounds):
        prompts = torch.randint(1, 4096, (args.batch, args.prompt_len), generator=generator).to(device)
        out = runner.generate(prompts, args.new_tokens)
    print(f"demo: generated {out.shape[0]} x {out.shape[1] - args.prompt_len} tokens on {device}")


def cache_argument(model: torch.nn.Module) -> str:
    """What generate() calls the cache: `cache` in newer transformers, `past_key_values` in older (Python 3.10's)."""
    import inspect  # here, so the lines the README and docs/images quote stay put

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


if __name__ == "__main__":
    main()
