"""Small GPT-2 and Llama models built from a config with random weights (never a download).

transformers' ``GPT2LMHeadModel`` and ``LlamaForCausalLM`` where transformers
imports; else a pure-torch stand-in of each (the GPU machine may lack
transformers): a GPT-2 block stack (LayerNorm, causal attention, GELU MLP)
and a Llama block stack (RMSNorm, grouped-query attention, SwiGLU, no rotary
embedding) that generates greedily into a KV cache allocated whole up front.
:func:`implementation` says which one a run used; every output names it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Size:
    """One model and batch size for both workloads."""

    layers: int
    width: int
    heads: int
    kv_heads: int
    vocab: int
    seq: int
    batch: int
    new_tokens: int


SIZES = {
    "tiny": Size(layers=2, width=64, heads=4, kv_heads=2, vocab=256, seq=32, batch=2, new_tokens=4),
    "full": Size(layers=4, width=512, heads=8, kv_heads=4, vocab=8192, seq=256, batch=8, new_tokens=16),
}


def implementation(requested: str = "auto") -> str:
    """``transformers`` or ``pure-torch``: what *requested* (auto, transformers, pure-torch) resolves to here."""
    if requested == "auto":
        return "transformers" if importlib.util.find_spec("transformers") is not None else "pure-torch"
    return requested


class GptBlock(nn.Module):
    def __init__(self, s: Size) -> None:
        super().__init__()
        self.heads = s.heads
        self.ln1, self.ln2 = nn.LayerNorm(s.width), nn.LayerNorm(s.width)
        self.qkv, self.proj = nn.Linear(s.width, 3 * s.width), nn.Linear(s.width, s.width)
        self.mlp = nn.Sequential(nn.Linear(s.width, 4 * s.width), nn.GELU(), nn.Linear(4 * s.width, s.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.ln2(x))


class TinyGpt2(nn.Module):
    """GPT-2's layout in pure torch: token and position embeddings, pre-norm blocks, tied head."""

    def __init__(self, s: Size) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(s.vocab, s.width), nn.Embedding(s.seq, s.width)
        self.blocks = nn.ModuleList(GptBlock(s) for _ in range(s.layers))
        self.ln = nn.LayerNorm(s.width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T


class KVCache:
    """The whole cache up front, one key and one value tensor per layer, as a serving engine reserves it."""

    def __init__(self, s: Size, device: torch.device, dtype: torch.dtype) -> None:
        shape = (s.batch, s.kv_heads, s.seq + s.new_tokens, s.width // s.heads)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(s.layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(s.layers)]


class LlamaBlock(nn.Module):
    def __init__(self, s: Size) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = s.heads, s.kv_heads, s.width // s.heads
        self.norm1, self.norm2 = nn.RMSNorm(s.width), nn.RMSNorm(s.width)
        self.q = nn.Linear(s.width, s.width, bias=False)
        self.kv = nn.Linear(s.width, 2 * s.kv_heads * self.dim, bias=False)
        self.o = nn.Linear(s.width, s.width, bias=False)
        hidden = 2 * s.width + s.width // 2
        self.gate, self.up = nn.Linear(s.width, hidden, bias=False), nn.Linear(s.width, hidden, bias=False)
        self.down = nn.Linear(hidden, s.width, bias=False)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        b, t, w = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.dim).permute(2, 0, 3, 1, 4)
        keys[:, :, start : start + t] = k
        values[:, :, start : start + t] = v
        att = F.scaled_dot_product_attention(
            q, keys[:, :, : start + t], values[:, :, : start + t], is_causal=t > 1, enable_gqa=True
        )
        x = x + self.o(att.transpose(1, 2).reshape(b, t, w))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    """Llama's layout in pure torch (no rotary embedding: memory, not quality, is measured)."""

    def __init__(self, s: Size) -> None:
        super().__init__()
        self.size = s
        self.embed = nn.Embedding(s.vocab, s.width)
        self.blocks = nn.ModuleList(LlamaBlock(s) for _ in range(s.layers))
        self.norm = nn.RMSNorm(s.width)
        self.head = nn.Linear(s.width, s.vocab, bias=False)

    def forward(self, ids: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        x = self.embed(ids)
        for block, keys, values in zip(self.blocks, cache.keys, cache.values, strict=True):
            x = block(x, keys, values, start)
        return self.head(self.norm(x[:, -1:]))

    @torch.inference_mode()
    def generate(self, prompts: torch.Tensor, cache: KVCache, new_tokens: int) -> torch.Tensor:
        out = [prompts]
        logits = self(prompts, cache, 0)
        for step in range(new_tokens):
            token = logits.argmax(-1)
            out.append(token)
            if step + 1 < new_tokens:
                logits = self(token, cache, prompts.shape[1] + step)
        return torch.cat(out, dim=1)


def gpt2_train(size: Size, device: torch.device, impl: str) -> Callable[[], float]:
    """A GPT-2 model, AdamW and one batch: the returned callable runs one training step."""
    torch.manual_seed(0)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), device=device)
    if impl == "transformers":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=size.layers,
            n_embd=size.width,
            n_head=size.heads,
            vocab_size=size.vocab,
            n_positions=size.seq,
            bos_token_id=0,
            eos_token_id=0,
        )
        model: nn.Module = GPT2LMHeadModel(config)
        model.to(device)

        def loss_of() -> torch.Tensor:
            return model(input_ids=ids, labels=ids).loss
    else:
        model = TinyGpt2(size).to(device)

        def loss_of() -> torch.Tensor:
            return F.cross_entropy(model(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        loss = loss_of()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def llama_generate(size: Size, device: torch.device, impl: str) -> Callable[[], Any]:
    """A Llama model and a static KV cache: the returned callable generates ``new_tokens`` greedily."""
    torch.manual_seed(0)
    prompts = torch.randint(1, size.vocab, (size.batch, size.seq), device=device)
    if impl == "transformers":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=size.vocab,
            hidden_size=size.width,
            intermediate_size=2 * size.width + size.width // 2,
            num_hidden_layers=size.layers,
            num_attention_heads=size.heads,
            num_key_value_heads=size.kv_heads,
            max_position_embeddings=size.seq + size.new_tokens,
        )
        model = LlamaForCausalLM(config).eval()
        cast(nn.Module, model).to(device)  # transformers' own annotation of to() refuses a device

        @torch.inference_mode()
        def generate() -> Any:
            return model.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=size.new_tokens,
                min_new_tokens=size.new_tokens,
                do_sample=False,
                cache_implementation="static",
                pad_token_id=0,
            )

        return generate
    llama = TinyLlama(size).to(device).eval()
    cache = KVCache(size, device, next(llama.parameters()).dtype)
    return lambda: llama.generate(prompts, cache, size.new_tokens)


WORKLOADS: dict[str, Callable[[Size, torch.device, str], Callable[[], Any]]] = {
    "gpt2-train": gpt2_train,
    "llama-generate": llama_generate,
}


def started(name: str, size: Size, device: torch.device, impl: str) -> tuple[Callable[[], Any], str]:
    """*name*'s workload, called once already, and the models that ran it.

    Where transformers' models fail (a version whose API moved) the pure-torch stand-in runs instead, and the
    name says why; an out-of-memory error is the workload's own and goes up.
    """
    try:
        work = WORKLOADS[name](size, device, impl)
        work()
        return work, impl
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        if impl != "transformers":
            raise
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    work = WORKLOADS[name](size, device, "pure-torch")
    work()
    return work, f"pure-torch (transformers failed: {why})"
