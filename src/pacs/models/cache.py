"""The name transformers gives a model's key/value cache, as a `forward`/`generate` argument and as
an output field: `cache` since transformers renamed it (5.2x), `past_key_values` before. Newer
versions still take the old name, with a FutureWarning in every command that a user can do
nothing about; older ones know only the old name. pacs passes the one this transformers uses."""

from __future__ import annotations

from transformers.modeling_outputs import CausalLMOutputWithPast

CACHE_ARGUMENT = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
