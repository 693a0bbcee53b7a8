"""The built-in tiny model ``builtin:tiny``: a character-level tokenizer and a small Qwen2.

Everything is built locally (no model hub), so tests, demos and CI can train a real causal LM
in seconds on a CPU. The saved directory is a plain Hugging Face model directory, loadable with
``AutoModelForCausalLM.from_pretrained`` and ``PreTrainedTokenizerFast.from_pretrained`` (as
`pacs.models.loading.load_tokenizer` does: ``AutoTokenizer`` may load it as ``Qwen2Tokenizer``,
whose byte-level pre-tokenizer drops every space).

Tokens: one per printable ASCII character (0x20..0x7E) plus the special tokens in
``SPECIAL_TOKENS``. Characters outside printable ASCII (newline, tab, non-ASCII) map to
``<|unk|>``. There is no BOS token; ``<|end|>`` is EOS and ends every chat message:

    <|user|>What is 12+34? Put the final answer in \\boxed{}.<|end|><|assistant|>
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from pacs.models.saving import save_from_this_process, with_umask_modes

PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
EOS_TOKEN = "<|end|>"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, "<|system|>", "<|user|>", "<|assistant|>", EOS_TOKEN)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TINY_MAX_POSITIONS = 2048


def build_char_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Build the character-level tokenizer of ``builtin:tiny`` (101 tokens, ids 0..100).

    Ids 0..5 are ``SPECIAL_TOKENS`` in order (pad = 0, eos = ``<|end|>`` = 5), then one id per
    printable ASCII character in code-point order. ``decode(encode(text)) == text`` for any
    printable-ASCII ``text``; each chat role marker and ``<|end|>`` encodes to a single id.
    """
    vocab = {token: token_id for token_id, token in enumerate(SPECIAL_TOKENS)}
    for code_point in range(0x20, 0x7F):
        vocab[chr(code_point)] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=TINY_MAX_POSITIONS,
    )


def tiny_model_config(
    vocab_size: int,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int = 512,
    max_positions: int = TINY_MAX_POSITIONS,
    eos_token_id: int,
    pad_token_id: int,
) -> transformers.Qwen2Config:
    """Return a small Qwen2 configuration: tied embeddings, no dropout, default RoPE;
    `num_kv_heads` key/value heads (grouped-query attention; None: `num_heads`).

    With the defaults and the 101-token character vocabulary the model has 538,624 parameters.
    """
    return transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads if num_kv_heads is None else num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def save_builtin_tiny(directory: Path, *, seed: int = 0, **shape: int) -> Path:
    """Build the tokenizer and a randomly initialised float32 tiny model, save them to ``directory``.

    ``shape``: keyword arguments of `tiny_model_config` (``hidden_size``, ``num_layers``, ...) for
    a model of another size with the same tokenizer (``benchmarks/async_rollouts.py``'s ~100M
    one); without them, ``builtin:tiny``.

    The files (config.json, model.safetensors, generation_config.json, tokenizer files) are
    written to a temporary sibling directory that is then renamed to ``directory``, so a reader
    never sees a half-written model. If another process finishes the same directory first,
    its copy is kept. Returns ``directory``.
    """
    directory = Path(directory)
    if directory.exists():
        raise ValueError(f"Cannot save builtin:tiny to {directory}: it already exists; remove it or choose a new directory")
    tokenizer = build_char_tokenizer()
    config = tiny_model_config(
        len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        save_from_this_process(model, staging)
        tokenizer.save_pretrained(staging)
        os.replace(with_umask_modes(staging), directory)
    except OSError:
        if not (directory / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
