"""Tiny random causal LMs of many architectures, built locally (no model hub), for the tests
that check pacs against each: 2 layers, hidden size 64, 4 attention heads (2 key/value heads
where the architecture has them) and the built-in character tokenizer (`pacs.models.tiny`).

Logit maps are made strong enough to matter at this size: a random model's logits are about
0.1, so Gemma 2's softcap is 1.0 (not 30) and Granite divides by 4 (Cohere keeps its default
scale, 1/16); without the map their log-probs would be off by far more than the tests' tolerance.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from pacs.models.tiny import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, build_char_tokenizer

TOKENS = {"bos_token_id": None, "eos_token_id": SPECIAL_TOKENS.index(EOS_TOKEN), "pad_token_id": SPECIAL_TOKENS.index(PAD_TOKEN)}
"""The character tokenizer's special tokens (it has no BOS)."""
COMMON = {
    **TOKENS,
    "vocab_size": 101,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
MOE = {"num_experts_per_tok": 2}
GEMMA = {"head_dim": 16}


def _gpt2() -> transformers.GPT2Config:
    return transformers.GPT2Config(**TOKENS, vocab_size=101, n_embd=64, n_layer=2, n_head=4, n_positions=256)


ARCHITECTURES = {
    "llama": lambda: transformers.LlamaConfig(**COMMON),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16),
    "mistral": lambda: transformers.MistralConfig(**COMMON),
    "phi3": lambda: transformers.Phi3Config(**COMMON),
    "gpt2": _gpt2,
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**COMMON, **MOE, head_dim=16, num_experts=4, moe_intermediate_size=32),
    "mixtral": lambda: transformers.MixtralConfig(**COMMON, **MOE, num_local_experts=4),
    "olmo2": lambda: transformers.Olmo2Config(**COMMON),
    "gemma3": lambda: transformers.Gemma3TextConfig(**COMMON, **GEMMA),
    "gemma2": lambda: transformers.Gemma2Config(**COMMON, **GEMMA, final_logit_softcapping=1.0),
    "granite": lambda: transformers.GraniteConfig(**COMMON, logits_scaling=4.0),
}
"""Name -> the tiny config of the architectures in docs/architectures.md's table."""

LOGIT_MAP_VARIANTS = {
    "gemma3-softcapped": lambda: transformers.Gemma3TextConfig(**COMMON, **GEMMA, final_logit_softcapping=1.0),
    "cohere": lambda: transformers.CohereConfig(**COMMON),
}
"""More logit maps, checked by the log-prob tests: Gemma 3 with its softcapping set, Cohere's scale."""

NARROW = {
    "qwen2-narrow": lambda: transformers.Qwen2Config(
        **{**COMMON, "hidden_size": 32, "intermediate_size": 64, "num_key_value_heads": 4}, tie_word_embeddings=True
    ),
}
"""A Qwen2 like `builtin:tiny` (tied embeddings, 4 key/value heads) at a quarter of its width: the
model of the distributed exactness tests, whose float64 steps it makes about twice as fast."""


def tiny_causal_lm(name: str, *, seed: int = 0) -> transformers.PreTrainedModel:
    """A randomly initialised (seed `seed`) float32 causal LM of architecture `name` (a key of
    ARCHITECTURES, LOGIT_MAP_VARIANTS or NARROW), in eval mode."""
    torch.manual_seed(seed)
    config = {**ARCHITECTURES, **LOGIT_MAP_VARIANTS, **NARROW}[name]()
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()


def save_tiny_model(name: str, directory: Path, *, seed: int = 0) -> Path:
    """Save `tiny_causal_lm(name)` in float32 with the character tokenizer to `directory`: a
    Hugging Face model directory that `pacs train` can start from. Returns `directory`."""
    tokenizer = build_char_tokenizer()
    model = tiny_causal_lm(name, seed=seed)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
