"""Writing a Hugging Face model directory from whichever process is asked to.

Once a process group exists, transformers' `save_pretrained` writes only on global rank 0
(`should_save_on_this_rank`), and silently writes nothing elsewhere. A node's own cache (a
built-in model, its warm-start) is written by that node's first process, whatever its global
rank, so pacs saves those through `save_from_this_process`.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel


def save_from_this_process(model: PreTrainedModel, directory: Path, **options) -> None:
    """`model.save_pretrained(directory, **options)`, written by this process even when it is
    not global rank 0 of a process group."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    try:
        model.save_pretrained(directory, **options)
    finally:
        del model.should_save_on_this_rank
