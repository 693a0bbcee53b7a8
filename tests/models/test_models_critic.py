"""PPO's critic for any decoder: transformers' token-classification model where it has one,
otherwise the backbone (`AutoModel`) plus a linear value head, saved and loaded as a plain
Hugging Face directory."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file
from tiny_architectures import save_tiny_model
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

from pacs.models.loading import load_value_model, token_classification_class

TOKENS = torch.tensor([[7, 8, 9, 10, 11, 12]])


@pytest.fixture(scope="module")
def olmo2_dir(tmp_path_factory):
    """OLMo 2: transformers has no token-classification class for it."""
    return save_tiny_model("olmo2", tmp_path_factory.mktemp("olmo2") / "model")


def test_without_a_token_classification_class_the_critic_is_the_backbone_and_a_value_head(olmo2_dir):
    assert type(transformers.AutoConfig.from_pretrained(olmo2_dir)) not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING
    critic = load_value_model(str(olmo2_dir))
    assert isinstance(critic.model, transformers.Olmo2Model)
    assert (critic.score.in_features, critic.score.out_features) == (64, 1)
    causal_lm = load_file(olmo2_dir / "model.safetensors")
    backbone = {name: value for name, value in critic.state_dict().items() if name.startswith("model.")}
    assert backbone.keys() == {name for name in causal_lm if name.startswith("model.")}
    assert all(torch.equal(value, causal_lm[name]) for name, value in backbone.items())
    assert critic(input_ids=TOKENS).logits.shape == (1, 6, 1)


def test_a_saved_critic_loads_back_with_its_value_head(olmo2_dir, tmp_path):
    critic = load_value_model(str(olmo2_dir), dtype="float64")
    critic.save_pretrained(tmp_path / "critic")
    loaded = load_value_model(str(tmp_path / "critic"), dtype="float64")
    assert type(loaded).__name__ == "Olmo2ForTokenClassification"
    saved = critic.state_dict()
    assert loaded.state_dict().keys() == saved.keys()
    assert all(torch.equal(value, saved[name]) for name, value in loaded.state_dict().items())
    assert loaded.dropout.p == 0.0


def test_an_architecture_with_a_token_classification_class_keeps_it():
    assert token_classification_class(transformers.LlamaConfig()) is transformers.LlamaForTokenClassification


def test_a_config_without_a_backbone_is_refused_naming_its_model_type():
    class UnknownConfig(transformers.PretrainedConfig):
        model_type = "unknown-decoder"

    with pytest.raises(ValueError, match="model_type 'unknown-decoder'.*neither a token-classification model nor a backbone"):
        token_classification_class(UnknownConfig())


@pytest.mark.slow
def test_a_critic_built_for_an_architecture_unpickles_in_a_fresh_process(olmo2_dir, tmp_path):
    """Under FSDP rank 0 sends every rank the critic as a pickled skeleton; a rank that has not
    built the class itself must still find it."""
    import pickle
    import subprocess
    import sys

    critic = load_value_model(str(olmo2_dir))
    (tmp_path / "critic.pickle").write_bytes(pickle.dumps(critic.to("meta")))
    script = f"import pickle; print(type(pickle.loads(open({str(tmp_path / 'critic.pickle')!r}, 'rb').read())).__name__)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "Olmo2ForTokenClassification", result.stderr[-2000:]
