"""The elementwise map from a causal LM's output embedding to the logits its forward returns.

Most decoders return z = lm_head(h) as their logits. Some map z elementwise first, as their
config says:

    Cohere, Cohere 2            z * s                   s = config.logit_scale
    Granite (and its MoEs)      z / s                   s = config.logits_scaling
    Gemma 2, Gemma 3 when set   c * tanh(z / c)         c = config.final_logit_softcapping

pacs projects the hidden states a chunk of tokens at a time instead of calling the model's whole
head (`pacs.train.batch`), so it applies the map itself: `LogitMap.of(config)`, found from the
config's attributes, never from class names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig


@dataclass(frozen=True)
class LogitMap:
    """logits = f(z), z = lm_head(h), elementwise; a step whose attribute is None is skipped.

    multiplier: z * multiplier                  (config.logit_scale)
    divisor:    z / divisor                     (config.logits_scaling)
    softcap:    softcap * tanh(z / softcap)     (config.final_logit_softcapping)
    """

    multiplier: float | None = None
    divisor: float | None = None
    softcap: float | None = None

    @classmethod
    def of(cls, config: PretrainedConfig) -> LogitMap:
        """The map that `config`'s model applies (of its text model, for a multimodal config)."""
        text_config = config.get_text_config()
        return cls(
            multiplier=getattr(text_config, "logit_scale", None),
            divisor=getattr(text_config, "logits_scaling", None),
            softcap=getattr(text_config, "final_logit_softcapping", None),
        )

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """f(logits), any shape, with the operations and in the order of the models' own
        forwards (so on the same tensor the result is bitwise theirs); `logits` itself when
        the map is the identity."""
        if self.multiplier is not None:
            logits = logits * self.multiplier
        if self.divisor is not None:
            logits = logits / self.divisor
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def describe(self) -> str:
        """The map as a formula, e.g. "30 * tanh(z / 30)"; "z" for the identity."""
        formula = "z"
        if self.multiplier is not None:
            formula = f"{formula} * {self.multiplier:g}"
        if self.divisor is not None:
            formula = f"{formula} / {self.divisor:g}"
        if self.softcap is not None:
            formula = f"{self.softcap:g} * tanh(({formula}) / {self.softcap:g})"
        return formula
