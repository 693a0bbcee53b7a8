"""Chunked log-probs and entropy equal those of the full logits, in value and in gradient.

`full_logits_reference` below is the specification: the (B, R, V) logits of the response
positions, divided by the temperature, log-softmax, the target's entry and the entropy.
`response_logprobs` must agree with it while computing logits a chunk of tokens at a time.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from batches import policy_batch

from pacs.models.loading import enable_activation_checkpointing, load_causal_lm
from pacs.train import logprobs as logprobs_module
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs, response_logprobs_no_grad, tokens_per_chunk

CHUNK_TOKENS = 4
"""Tokens per chunk in these tests: the 15 response tokens below span 4 chunks, and chunk
boundaries fall inside row 0 and between rows 0 and 1."""


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(logprobs_module, "LOGITS_CHUNK_BYTES", CHUNK_TOKENS * 4 * 101)


@pytest.fixture(scope="module")
def tied_model(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


@pytest.fixture(scope="module")
def untied_model(tiny_model_dir):
    config = transformers.AutoConfig.from_pretrained(tiny_model_dir)
    config.tie_word_embeddings = False
    torch.manual_seed(1)
    model = transformers.Qwen2ForCausalLM(config).to(torch.float64).eval()
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    return model


@pytest.fixture(params=["tied", "untied"])
def model(request):
    return request.getfixturevalue(f"{request.param}_model")


def make_batch(vocab_size: int = 101) -> PolicyBatch:
    """3 rows: prompts of 5, 2 and 4 tokens (left-padded), responses of 7, 3 and 5 tokens."""
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab_size, (length,), generator=generator) for length in (5, 2, 4)]
    responses = [torch.randint(0, vocab_size, (length,), generator=generator) for length in (7, 3, 5)]
    return policy_batch(prompts, responses, [1.0, 0.0, 1.0])


def full_logits_reference(model, batch: PolicyBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, R) log-probs and entropies from the logits that the model's own forward returns at the
    response positions, normalised in float64; 0 at padding."""
    response_width = batch.response_ids.shape[1]
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits.double()
    log_distribution = torch.log_softmax(logits[:, -response_width - 1 : -1] / temperature, dim=-1)
    logprobs = log_distribution.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_distribution.exp() * log_distribution).sum(dim=-1)
    padding = batch.response_mask == 0
    return logprobs.masked_fill(padding, 0.0), entropy.masked_fill(padding, 0.0)


def gradients(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


def test_more_than_one_chunk_is_exercised():
    assert tokens_per_chunk(101) == CHUNK_TOKENS


def test_chunk_size_is_64_mib_of_fp32_logits_and_at_least_one_token(monkeypatch):
    monkeypatch.setattr(logprobs_module, "LOGITS_CHUNK_BYTES", 64 * 2**20)
    assert tokens_per_chunk(151_936) == 110
    assert tokens_per_chunk(10**9) == 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_match_the_full_logits(model, temperature):
    batch = make_batch()
    logprobs, entropy = response_logprobs(model, batch, temperature=temperature, with_entropy=True)
    expected_logprobs, expected_entropy = full_logits_reference(model, batch, temperature)
    assert logprobs.dtype == entropy.dtype == torch.float64
    torch.testing.assert_close(logprobs, expected_logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-6, rtol=0)
    torch.testing.assert_close(response_logprobs(model, batch, temperature=temperature), expected_logprobs, atol=1e-6, rtol=0)


def test_padding_positions_hold_exactly_zero(model):
    batch = make_batch()
    logprobs, entropy = response_logprobs(model, batch, with_entropy=True)
    padding = batch.response_mask == 0
    assert padding.any()
    assert (logprobs[padding] == 0).all() and (entropy[padding] == 0).all()
    assert (logprobs[~padding] != 0).all() and (entropy[~padding] != 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradients_of_every_parameter_match_the_full_logits(model, temperature):
    batch = make_batch()
    generator = torch.Generator().manual_seed(1)
    logprob_weights = torch.randn(batch.response_ids.shape, generator=generator, dtype=torch.float64)
    entropy_weights = torch.randn(batch.response_ids.shape, generator=generator, dtype=torch.float64)

    logprobs, entropy = response_logprobs(model, batch, temperature=temperature, with_entropy=True)
    chunked = gradients(model, (logprob_weights * logprobs).sum() + (entropy_weights * entropy).sum())
    expected_logprobs, expected_entropy = full_logits_reference(model, batch, temperature)
    expected = gradients(model, (logprob_weights * expected_logprobs).sum() + (entropy_weights * expected_entropy).sum())

    assert chunked.keys() == expected.keys()
    for name in expected:
        assert expected[name].abs().max() > 0, name
        torch.testing.assert_close(chunked[name], expected[name], atol=1e-6, rtol=0, msg=name)


def test_gradients_without_entropy_match_the_full_logits(tied_model):
    batch = make_batch()
    weights = torch.randn(batch.response_ids.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    chunked = gradients(tied_model, (weights * response_logprobs(tied_model, batch, temperature=0.7)).sum())
    expected = gradients(tied_model, (weights * full_logits_reference(tied_model, batch, 0.7)[0]).sum())
    for name in expected:
        torch.testing.assert_close(chunked[name], expected[name], atol=1e-6, rtol=0, msg=name)


def test_each_chunk_is_recomputed_in_backward_not_kept(tied_model, monkeypatch):
    calls = []
    original = logprobs_module._ChunkedResponseTerms.chunk_terms
    monkeypatch.setattr(
        logprobs_module._ChunkedResponseTerms, "chunk_terms", lambda self, *chunk: calls.append(1) or original(self, *chunk)
    )
    logprobs, entropy = response_logprobs(tied_model, make_batch(), with_entropy=True)
    forward_chunks = len(calls)
    assert forward_chunks >= 4, "15 response tokens in chunks of at most 4"
    (logprobs.sum() + entropy.sum()).backward()
    assert len(calls) == 2 * forward_chunks
    tied_model.zero_grad(set_to_none=True)


def test_no_grad_pass_in_micro_batches_matches_the_full_logits(tied_model):
    batch = make_batch()
    logprobs, entropy = response_logprobs_no_grad(tied_model, batch, micro_batch_size=2, temperature=0.7, with_entropy=True)
    expected_logprobs, expected_entropy = full_logits_reference(tied_model, batch, 0.7)
    torch.testing.assert_close(logprobs, expected_logprobs.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy, expected_entropy.detach(), atol=1e-6, rtol=0)


def test_a_row_without_response_tokens_gets_zeros_and_a_gradient_graph(tied_model):
    batch = make_batch().rows(slice(0, 1))
    batch.response_mask = torch.zeros_like(batch.response_mask)
    logprobs, entropy = response_logprobs(tied_model, batch, with_entropy=True)
    assert (logprobs == 0).all() and (entropy == 0).all()
    (logprobs.sum() + entropy.sum()).backward()
    tied_model.zero_grad(set_to_none=True)


def test_logits_are_float32_for_a_bfloat16_model(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="bfloat16")
    logprobs, entropy = response_logprobs(model, make_batch(), with_entropy=True)
    assert logprobs.dtype == entropy.dtype == torch.float32


def test_output_embedding_is_restored_after_a_call(tied_model):
    output_embeddings = tied_model.lm_head
    parameters = list(tied_model.parameters())
    response_logprobs(tied_model, make_batch())
    assert tied_model.lm_head is output_embeddings
    assert tied_model.lm_head.weight is tied_model.model.embed_tokens.weight
    assert all(a is b for a, b in zip(tied_model.parameters(), parameters, strict=True))


def test_output_embedding_is_restored_after_an_exception(tied_model):
    output_embeddings = tied_model.lm_head
    batch = make_batch()
    batch.response_ids = batch.response_ids.clone()
    batch.response_ids[0, 2] = 10**6  # an input of the response forward: the embedding raises
    with pytest.raises(IndexError):
        response_logprobs(tied_model, batch)
    assert tied_model.lm_head is output_embeddings
    assert tied_model.lm_head.weight is tied_model.model.embed_tokens.weight


def test_a_model_wrapped_in_ddp_gives_the_same_values_and_gradients(tiny_model_dir, tmp_path):
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    batch = make_batch()
    expected = gradients(model, sum(t.sum() for t in full_logits_reference(model, batch, 0.7)))
    torch.distributed.init_process_group(
        "gloo", store=torch.distributed.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        logprobs, entropy = response_logprobs(wrapped, batch, temperature=0.7, with_entropy=True)
        chunked = gradients(model, logprobs.sum() + entropy.sum())
    finally:
        torch.distributed.destroy_process_group()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for name in expected:
        torch.testing.assert_close(chunked[name], expected[name], atol=1e-6, rtol=0, msg=name)


class DoublesItsLogits(transformers.Qwen2ForCausalLM):
    """A model whose forward changes its logits in a way its config does not declare."""

    def forward(self, **inputs):
        outputs = super().forward(**inputs)
        outputs.logits = outputs.logits * 2
        return outputs


def test_a_model_whose_forward_changes_its_logits_otherwise_than_its_config_says_is_refused(tiny_model_dir):
    model = DoublesItsLogits.from_pretrained(tiny_model_dir).eval()
    output_embeddings = model.lm_head
    with pytest.raises(
        ValueError, match=r"DoublesItsLogits.forward does not return f\(lm_head\(hidden_states\)\) .* \(f\(z\) = z\)"
    ):
        response_logprobs(model, make_batch())
    assert model.lm_head is output_embeddings


def test_a_logit_map_that_the_config_declares_but_the_forward_skips_is_refused(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    model.config.logits_scaling = 4.0  # as MPT's config holds a logit_scale its transformers model never applies
    with pytest.raises(ValueError, match=r"Qwen2ForCausalLM.forward does not return .* \(f\(z\) = z / 4\)"):
        response_logprobs(model, make_batch())


def make_group_batch(vocab_size: int = 101) -> PolicyBatch:
    """Runs of 3, 1, 2 and 2 rows sharing a prompt (prompts of 6, 3, 5 and 3 tokens), responses
    of 1 to 6 tokens, a one-token response in a shared run included."""
    generator = torch.Generator().manual_seed(1)
    prompts, responses = [], []
    for prompt_length, response_lengths in ((6, (4, 1, 6)), (3, (2,)), (5, (3, 5)), (3, (6, 1))):
        prompt = torch.randint(0, vocab_size, (prompt_length,), generator=generator)
        for length in response_lengths:
            prompts.append(prompt)
            responses.append(torch.randint(0, vocab_size, (length,), generator=generator))
    return policy_batch(prompts, responses, [1.0] * len(prompts))


def test_rows_that_share_a_prompt_are_found_as_runs():
    assert logprobs_module.shared_prompt_runs(make_group_batch()).tolist() == [3, 1, 2, 2]
    assert logprobs_module.shared_prompt_runs(make_batch()).tolist() == [1, 1, 1]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_shared_prompt_run_once_gives_the_full_logits_values_and_gradients(model, temperature):
    batch = make_group_batch()
    logprobs, entropy = response_logprobs(model, batch, temperature=temperature, with_entropy=True)
    expected_logprobs, expected_entropy = full_logits_reference(model, batch, temperature)
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)
    weights = torch.linspace(0.5, 1.5, logprobs.numel(), dtype=torch.float64).view_as(logprobs)
    shared = gradients(model, (weights * (logprobs + 0.1 * entropy)).sum())
    expected_logprobs, expected_entropy = full_logits_reference(model, batch, temperature)
    full = gradients(model, (weights * (expected_logprobs + 0.1 * expected_entropy)).sum())
    for name, gradient in full.items():
        torch.testing.assert_close(shared[name], gradient, rtol=0, atol=1e-11, msg=name)


def test_each_shared_prompt_goes_through_the_model_once(tied_model, monkeypatch):
    batch = make_group_batch()
    calls = []
    forward = type(tied_model).forward
    monkeypatch.setattr(
        type(tied_model),
        "forward",
        lambda self, **inputs: calls.append(tuple(inputs["input_ids"].shape)) or forward(self, **inputs),
    )
    response_logprobs(tied_model, batch)
    assert calls[0] == (4, 6), "the 4 distinct prompts, once each"
    response_calls = calls[1:]
    assert sum(rows for rows, _ in response_calls) == 8, "each response once, without its prompt"
    assert max(width for _, width in response_calls) == 5, "the longest response but its last token"


def test_responses_of_different_lengths_run_in_buckets_that_pad_less(tied_model, monkeypatch):
    batch = make_group_batch()  # tokens after the first: 3, 0, 5, 1, 2, 4, 5, 0
    calls = []
    forward = type(tied_model).forward
    monkeypatch.setattr(
        type(tied_model),
        "forward",
        lambda self, **inputs: calls.append(tuple(inputs["input_ids"].shape)) or forward(self, **inputs),
    )
    response_logprobs(tied_model, batch)
    padded_tokens = sum(rows * width for rows, width in calls[1:])
    assert len(calls[1:]) > 1
    assert padded_tokens < 8 * 5, "one forward over every response would pad them all to 5 tokens"


def test_with_activation_checkpointing_each_row_runs_whole_in_its_length_bucket(tiny_model_dir, monkeypatch):
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    enable_activation_checkpointing(model)
    model.train()
    batch = make_group_batch()
    calls = []
    forward = type(model).forward
    monkeypatch.setattr(
        type(model), "forward", lambda self, **inputs: calls.append(tuple(inputs["input_ids"].shape)) or forward(self, **inputs)
    )
    logprobs, entropy = response_logprobs(model, batch, with_entropy=True)
    assert len(calls) == logprobs_module.MAX_BUCKETS
    assert sum(rows for rows, _ in calls) == 8, "each row once, [prompt | response] trimmed to its bucket"
    monkeypatch.undo()
    expected_logprobs, expected_entropy = full_logits_reference(model, batch, 1.0)
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)
    bucketed = gradients(model, (logprobs + 0.1 * entropy).sum())
    full = gradients(model, (expected_logprobs + 0.1 * expected_entropy).sum())
    for name, gradient in full.items():
        torch.testing.assert_close(bucketed[name], gradient, rtol=0, atol=1e-11, msg=name)


def test_rows_said_not_to_share_prompts_run_whole_in_their_length_buckets(model, monkeypatch):
    """`prompts_shared=False` (supervised pairs): no prompt forward, each row once as
    [prompt | response] in its bucket, and the values of the full logits."""
    batch = make_batch()
    calls = []
    forward = type(model).forward
    monkeypatch.setattr(
        type(model), "forward", lambda self, **inputs: calls.append(tuple(inputs["input_ids"].shape)) or forward(self, **inputs)
    )
    logprobs, entropy = response_logprobs(model, batch, with_entropy=True, prompts_shared=False)
    assert len(calls) == len(batch) and sum(rows for rows, _ in calls) == len(batch)
    monkeypatch.undo()
    expected_logprobs, expected_entropy = full_logits_reference(model, batch, 1.0)
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-12)


def test_the_number_of_forwards_depends_on_the_rows_alone_not_their_lengths(tied_model, monkeypatch):
    """DDP and FSDP ranks must run as many forwards as each other (each one is a collective)."""
    counts = []
    forward = type(tied_model).forward
    for response_lengths in ((1, 1, 1, 1, 1, 1), (9, 1, 2, 2, 30, 5), (4, 4, 4, 4, 4, 4)):
        generator = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 101, (3,), generator=generator)] * 2 + [torch.randint(0, 101, (5,), generator=generator)] * 4
        responses = [torch.randint(0, 101, (length,), generator=generator) for length in response_lengths]
        calls = []
        monkeypatch.setattr(type(tied_model), "forward", lambda self, **inputs: calls.append(1) or forward(self, **inputs))
        response_logprobs(tied_model, policy_batch(prompts, responses, [1.0] * 6))
        counts.append(len(calls))
    assert counts == [1 + logprobs_module.MAX_BUCKETS] * 3


def test_length_buckets_hold_every_row_once():
    lengths = torch.tensor([3, 0, 9, 1, 2, 40, 5, 0, 17, 4])
    buckets = logprobs_module.length_buckets(lengths)
    assert torch.cat(buckets).sort().values.tolist() == list(range(10))
    assert len(buckets) == logprobs_module.MAX_BUCKETS


def test_length_buckets_never_put_a_short_and_a_long_row_together():
    lengths = torch.tensor([2, 100, 3, 100, 2, 99, 3, 98])
    for bucket in logprobs_module.length_buckets(lengths):
        assert lengths[bucket].max() <= 3 or lengths[bucket].min() >= 98


def test_length_buckets_halve_rows_of_equal_lengths():
    buckets = logprobs_module.length_buckets(torch.full((16,), 7))
    assert sorted(len(bucket) for bucket in buckets) == [4, 4, 4, 4]


def test_fewer_rows_than_buckets_make_a_bucket_each():
    assert [bucket.tolist() for bucket in logprobs_module.length_buckets(torch.tensor([5, 2]))] == [[1], [0]]


def test_gradients_through_shared_prompts_are_the_same_bits_on_every_pass_at_several_threads(tiny_model_dir):
    """The prompt's key/value cache reaches each of its responses' rows through an index with
    repeats. Its backward must not depend on thread scheduling: float32, 4 threads, 8 responses of
    one length per prompt (so each length bucket repeats a prompt 8 times: the sum of 3 or more
    terms depends on their order), and prompts long enough that torch's CPU kernels would split
    an accumulating index over threads."""
    model = load_causal_lm(str(tiny_model_dir), dtype="float32")
    generator = torch.Generator().manual_seed(2)
    prompts, responses = [], []
    for _ in range(8):
        prompt = torch.randint(0, 101, (40,), generator=generator)
        for _ in range(8):
            prompts.append(prompt)
            responses.append(torch.randint(0, 101, (4,), generator=generator))
    batch = policy_batch(prompts, responses, [1.0] * len(prompts), dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        passes = [gradients(model, response_logprobs(model, batch).sum()) for _ in range(4)]
    finally:
        torch.set_num_threads(threads)
    for name, gradient in passes[0].items():
        assert all(torch.equal(gradient, other[name]) for other in passes[1:]), name
