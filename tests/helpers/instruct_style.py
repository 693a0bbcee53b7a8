"""The generation defaults an instruct model ships (as Qwen2.5-Instruct's generation_config.json
does): a repetition penalty, its own temperature / top-p / top-k, and two end-of-turn tokens. The
engines must sample purely (softmax(logits/T)) whatever a model's defaults say."""

from __future__ import annotations

from transformers import GenerationConfig, PreTrainedTokenizerBase


def instruct_generation_config(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Those defaults for the built-in tiny tokenizer (its `<|user|>` token ends a turn too)."""
    return GenerationConfig(
        repetition_penalty=1.05,
        temperature=0.7,
        top_p=0.8,
        top_k=20,
        do_sample=True,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|user|>")],
        pad_token_id=tokenizer.pad_token_id,
    )
