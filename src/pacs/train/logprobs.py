"""The policy's per-token log-probabilities (and entropy, and a critic's values) on a
`PolicyBatch`.

Sequences are stored as [left-padded prompt | right-padded response]. Position ids count real
tokens only, as `generate` does with left padding, so the log-probabilities recomputed here are
those of the policy that sampled the responses. The vocabulary projection runs in chunks of
positions (`LOGITS_CHUNK_BYTES`), recomputed in backward; rows are grouped by response length
(`length_buckets`) and responses that share a prompt run it once (`shared_prompt_runs`), or,
padding-free, rows are packed end to end with restarting position ids (`packed_bins`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from pacs.distributed.world import World
from pacs.models.cache import CACHE_ARGUMENT
from pacs.models.loading import eval_mode
from pacs.models.logits import LogitMap
from pacs.train.batch import PolicyBatch, micro_batch_slices, row_tokens


def _sequence_inputs(batch: PolicyBatch) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids (B, P + R) of [prompt | response]."""
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def response_values(critic: PreTrainedModel, batch: PolicyBatch, *, padding_free: bool = False) -> torch.Tensor:
    """The critic's value of the state before each response token: (B, R), in float32 or wider;
    exactly 0.0 at padding.

    `critic` is a token-classification model with one output (a value head); position t of the
    response is valued from the hidden state that predicts token t, as log-probs are.
    `padding_free`: one forward over the rows' real tokens packed end to end (`packed_layout`),
    as the policy's padding-free passes run, instead of one over [prompt | response] padded.
    """
    if padding_free:
        layout = packed_layout(batch)
        packed_scores = critic(input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False).logits[..., 0]
        scores = packed_scores[layout.predictor_bin, layout.predictor_place]
    else:
        response_width = batch.response_ids.shape[1]
        scores = critic(**_sequence_inputs(batch)).logits[:, -response_width - 1 : -1, 0]
    scores = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    return scores.masked_fill(batch.response_mask == 0, 0.0)


@torch.no_grad()
def per_token_no_grad(
    model: PreTrainedModel,
    compute: Callable[[PolicyBatch], torch.Tensor | tuple[torch.Tensor, ...]],
    batch: PolicyBatch,
    micro_batches: list[slice],
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`compute(micro)` -> (b, R) tensor(s) of `model`, over the whole batch one micro-batch of
    `micro_batches` (`micro_batch_slices`) at a time, without gradient and in eval mode: (B, R),
    or a tuple of them when `compute` returns a tuple."""
    outputs: list[torch.Tensor] = []
    with eval_mode(model):
        for rows in micro_batches:
            micro = batch.rows(rows)
            results = compute(micro)
            results = results if isinstance(results, tuple) else (results,)
            if not outputs:
                outputs = [torch.zeros_like(batch.response_mask) for _ in results]
            for out, result in zip(outputs, results):
                out[rows, : micro.response_ids.shape[1]] = result.to(out.dtype)
    return tuple(outputs) if len(outputs) > 1 else outputs[0]


def response_values_no_grad(
    critic: PreTrainedModel,
    batch: PolicyBatch,
    *,
    micro_batch_size: int,
    micro_batch_tokens: int | None = None,
    world: World | None = None,
    padding_free: bool = False,
) -> torch.Tensor:
    """`response_values` over the whole batch, without gradient, in `micro_batch_slices`: (B, R)."""
    micro_batches = micro_batch_slices(batch, max_rows=micro_batch_size, max_tokens=micro_batch_tokens, world=world)
    return per_token_no_grad(
        critic, lambda micro: response_values(critic, micro, padding_free=padding_free), batch, micro_batches
    )


LOGITS_CHUNK_BYTES = 64 * 2**20
"""Size of one chunk's fp32 logits: 64 MiB, i.e. 110 response tokens of Qwen2.5's 151,936-token
vocabulary (`tokens_per_chunk`; 128 MiB for a float64 model, whose logits stay float64). A
log-prob pass holds a few arrays of this size at a time (the chunk's logits, its softmax and, in
backward, their gradients), whatever the response length."""


def tokens_per_chunk(vocab_size: int) -> int:
    """Response tokens per chunk: as many as have `LOGITS_CHUNK_BYTES` of fp32 logits, at least 1."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside data-parallel wrappers (DDP and the like hold it as `.module`)."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


class _ChunkedResponseTerms(torch.nn.Module):
    """Stands in for a causal LM's output embedding (`lm_head`) during one forward call, so the
    projection runs inside the model's own forward (where FSDP has gathered the root's
    parameters and DDP sees them used) but never builds the (B, W, V) logits.

    forward(hidden_states): the final hidden states the model would project, (N, S, H) ->
    `select(hidden_states)` (B, W, H), the states that predict `targets` (B, W) -> (B, W, 1)
    log pi(target), or (B, W, 2) with the entropy as the second channel; exactly 0.0 where
    `target_mask` is 0.

    The hidden states that predict real targets are gathered into (n, H) and projected
    `tokens_per_chunk(vocab_size)` tokens at a time; with gradient enabled each chunk is
    checkpointed, so backward recomputes its logits instead of keeping them. `output_embeddings`
    is the model's own module (same parameters: tied embeddings stay tied); `logit_map` is what
    the model's forward applies to its result (softcapping, scaling: `LogitMap`).
    """

    def __init__(
        self,
        output_embeddings: torch.nn.Module,
        logit_map: LogitMap,
        select: Callable[[torch.Tensor], torch.Tensor],
        targets: torch.Tensor,
        target_mask: torch.Tensor,
        *,
        vocab_size: int,
        temperature: float,
        with_entropy: bool,
    ):
        super().__init__()
        self.output_embeddings = output_embeddings
        self.logit_map = logit_map
        self.select = select
        self.targets = targets
        self.at_target = target_mask > 0
        self.chunk_tokens = tokens_per_chunk(vocab_size)
        self.temperature = temperature
        self.with_entropy = with_entropy
        self.result: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden = self.select(hidden_states)[self.at_target]
        targets = self.targets[self.at_target]
        pieces = []
        for start in range(0, max(len(targets), 1), self.chunk_tokens):  # n = 0: one empty chunk
            chunk = (hidden[start : start + self.chunk_tokens], targets[start : start + self.chunk_tokens])
            if torch.is_grad_enabled():
                pieces.append(checkpoint(self.chunk_terms, *chunk, use_reentrant=False))
            else:
                pieces.append(self.chunk_terms(*chunk))
        terms = torch.cat(pieces)
        self.result = terms.new_zeros(*self.at_target.shape, terms.shape[-1])
        self.result[self.at_target] = terms
        return self.result

    def chunk_terms(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """hidden (n, H), targets (n,) -> (n, 1) log-probs, or (n, 2) log-probs and entropies.

        z = f(lm_head(hidden)) / T in float32 (float64 for a float64 model), f the model's
        logit map:
            log pi(target) = z_target - logsumexp(z)
            entropy        = logsumexp(z) - sum_v softmax(z)_v z_v
        """
        logits = self.output_embeddings(hidden)
        logits = self.logit_map(logits.to(torch.promote_types(logits.dtype, torch.float32))) / self.temperature
        normaliser = torch.logsumexp(logits, dim=-1)
        logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser
        if not self.with_entropy:
            return logprobs.unsqueeze(-1)
        entropy = normaliser - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
        return torch.stack([logprobs, entropy], dim=-1)


def _forward_terms(model: torch.nn.Module, head: _ChunkedResponseTerms, **inputs) -> tuple[torch.Tensor, object]:
    """Run `model(**inputs)` with `head` standing in for its output embedding (restored
    afterwards, also on error): the head's terms, and the model's key/value cache if asked for.

    The forward must return f(head's result) as logits, f the logit map of its config (the
    result itself where there is none); anything else (a map the config does not declare,
    slicing) would make the chunked terms wrong, and raises ValueError."""
    inner = unwrap_model(model)
    output_embeddings = inner.get_output_embeddings()
    inner.set_output_embeddings(head)
    try:
        outputs = model(**inputs)
    finally:
        inner.set_output_embeddings(output_embeddings)
    expected = None if head.result is None else head.logit_map(head.result)
    if expected is None or not _same_values(outputs.logits, expected):
        raise ValueError(
            f"{type(inner).__name__}.forward does not return f(lm_head(hidden_states)) as logits with the logit map f "
            f"its config declares (f(z) = {head.logit_map.describe()}), so chunked log-probs would be wrong for it; "
            "supported: logits that are lm_head's output, scaled (config.logit_scale, config.logits_scaling) "
            "or softcapped (config.final_logit_softcapping) as the config says"
        )
    return head.result, outputs.get(CACHE_ARGUMENT)


def _same_values(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two tensors are the same tensor or have the same shape and values (NaN equal to
    NaN: a model that produced NaN is not one whose forward maps its logits otherwise)."""
    return first is second or (first.shape == second.shape and torch.allclose(first, second, rtol=0, atol=0, equal_nan=True))


def shared_prompt_runs(batch: PolicyBatch) -> torch.Tensor:
    """(U,) lengths of the runs of consecutive rows with the same prompt (a group's responses,
    or the part of a group in this batch); they sum to len(batch)."""
    same_as_previous = (batch.prompt_ids[1:] == batch.prompt_ids[:-1]).all(dim=1) & (
        batch.prompt_mask[1:] == batch.prompt_mask[:-1]
    ).all(dim=1)
    run_starts = torch.cat([same_as_previous.new_ones(1), ~same_as_previous]).nonzero().squeeze(1)
    return torch.diff(run_starts, append=run_starts.new_tensor([len(batch)]))


def _checkpoints_activations(model: torch.nn.Module) -> bool:
    """Whether a training forward of `model` recomputes layers in backward (which drops caches)."""
    return model.training and any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def response_logprobs(
    model: PreTrainedModel,
    batch: PolicyBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    prompts_shared: bool = True,
    padding_free: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log pi(response_t | prompt, response_<t) for every response position: (B, R); with
    `with_entropy`, also the policy's entropy at each position, (B, R). Padding positions hold
    exactly 0.0 (callers mask them anyway).

    Logits are divided by the sampling temperature (the behaviour policy at temperature T is
    softmax(logits / T)) and taken in float32 or wider. They are computed only at response
    tokens and a chunk at a time (`_ChunkedResponseTerms`, which stands in for the model's
    output embedding during the call), so memory grows with the chunk, not with B x R x vocab.

    A prompt shared by consecutive rows (a group's responses) is run once: a first forward
    over the U distinct prompts gives their key/value cache and the first response token's
    terms; the responses then run on their prompt's cache in length buckets
    (`length_buckets`), a forward per bucket padded to its own longest response. Prompt tokens,
    most of a step's tokens when prompts are long and responses short, then cost 1/n of the
    plain way, in forward and backward, with the same result. The plain way, a forward over
    [prompt | response] per length bucket, is taken when activation checkpointing (which drops
    caches) is on, and when the caller says that no two rows share a prompt
    (`prompts_shared=False`: supervised pairs, where a prompt cache would only cost an extra
    forward and the copies of its keys and values). Either way the number of forwards depends
    only on B, the checkpointing setting and `prompts_shared`, which every rank of DDP and FSDP
    must pass alike (each forward is a collective there).

    `padding_free`: one forward over the rows' real tokens packed end to end instead
    (`_packed_terms`): no prompt cache, no buckets, no padding but a bin's tail; one forward
    whatever the rows.

    The model's logits are f(lm_head(h)), f the elementwise map its config declares (`LogitMap`:
    Gemma 2's softcapping, Granite's and Cohere's scaling; the identity for most models), and
    pi = softmax(f(lm_head(h)) / T).

    `model` may be wrapped (DDP's `.module`). Raises ValueError for a model without an output
    embedding or one whose forward returns anything other than f(lm_head(h)) as logits.
    """
    inner = unwrap_model(model)
    if inner.get_output_embeddings() is None:
        raise ValueError(f"{type(inner).__name__} has no output embedding (lm_head); a causal LM is needed")
    if padding_free:
        terms = _packed_terms(model, batch, temperature, with_entropy)
    elif _checkpoints_activations(inner) or not prompts_shared:
        terms = _plain_terms(model, batch, temperature, with_entropy)
    else:
        terms = _shared_prompt_terms(model, batch, shared_prompt_runs(batch), temperature, with_entropy)
    return (terms[..., 0], terms[..., 1]) if with_entropy else terms[..., 0]


def _head(model, select, targets, target_mask, temperature, with_entropy) -> _ChunkedResponseTerms:
    inner = unwrap_model(model)
    return _ChunkedResponseTerms(
        inner.get_output_embeddings(),
        LogitMap.of(inner.config),
        select,
        targets,
        target_mask,
        vocab_size=inner.config.vocab_size,
        temperature=temperature,
        with_entropy=with_entropy,
    )


def _plain_terms(model, batch: PolicyBatch, temperature: float, with_entropy: bool) -> torch.Tensor:
    """(B, R, C) terms from one forward over [prompt | response] per length bucket
    (`length_buckets`), each bucket's rows trimmed to their own width."""
    terms = None
    for rows in length_buckets(batch.response_mask.sum(dim=1).long()):
        bucket = batch.rows(rows)
        width = bucket.response_ids.shape[1]
        head = _head(
            model, lambda hidden: hidden[:, -width - 1 : -1], bucket.response_ids, bucket.response_mask, temperature, with_entropy
        )
        bucket_terms, _ = _forward_terms(model, head, **_sequence_inputs(bucket), logits_to_keep=width + 1)
        if terms is None:
            terms = bucket_terms.new_zeros(len(batch), batch.response_ids.shape[1], bucket_terms.shape[-1])
        terms[rows, :width] = bucket_terms
    return terms


def packed_bins(lengths: torch.Tensor, capacity: int) -> list[list[int]]:
    """Rows placed end to end into bins of at most `capacity` tokens, first fit by decreasing
    length: each bin a list of row indices in the order they are laid out.

    lengths: (B,) tokens per row, each at most `capacity`. The bins are as few as first fit
    decreasing finds (at most B; with `capacity` the longest row, every bin holds at least one
    row as long as any other bin's contents)."""
    free: list[int] = []
    bins: list[list[int]] = []
    for row in torch.argsort(lengths, descending=True, stable=True).tolist():
        length = int(lengths[row])
        place = next((index for index, room in enumerate(free) if room >= length), None)
        if place is None:
            bins.append([])
            free.append(capacity)
            place = len(bins) - 1
        bins[place].append(row)
        free[place] -= length
    return bins


@dataclass(frozen=True)
class PackedLayout:
    """A batch's rows laid end to end into K bins of L tokens (`packed_layout`).

    input_ids:       (K, L) the rows' real tokens, [prompt | response] without padding
    position_ids:    (K, L) restarting at 0 for each row
    predictor_bin:   (B, R) the bin of the place whose hidden state predicts response token t of row i
    predictor_place: (B, R) that place in its bin (clamped into the bin where t is padding)
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predictor_bin: torch.Tensor
    predictor_place: torch.Tensor


def packed_layout(batch: PolicyBatch) -> PackedLayout:
    """The rows' real tokens packed into `packed_bins` of the longest row's length, with position
    ids restarting at 0 for each row. A forward over them with no attention mask and no cache gets
    from transformers a causal mask blocked per row (`masking_utils.find_packed_sequence_indices`,
    for sdpa and eager attention as for flash attention; a cache would turn the detection off), so
    no token attends to another row's. A bin's tail after its last row continues that row's
    positions: causal attention keeps the row's tokens from seeing it. A bin as long as the
    longest row costs attention no more than that row padded alone, and K ≤ B rows run instead of B.

    The hidden state at packed place j predicts the token at j + 1: row i's response token t,
    laid out at offset o_i after its P_i prompt tokens, is predicted at o_i + P_i + t − 1."""
    prompt_lengths = batch.prompt_mask.sum(dim=1)
    lengths = row_tokens(batch)
    capacity = int(lengths.max())
    bins = packed_bins(lengths, capacity)
    device = batch.prompt_ids.device
    input_ids = torch.zeros(len(bins), capacity, dtype=batch.prompt_ids.dtype, device=device)
    position_ids = torch.zeros(len(bins), capacity, dtype=torch.long, device=device)
    predictor_bin = torch.zeros_like(batch.response_ids, dtype=torch.long)
    predictor_place = torch.zeros_like(batch.response_ids, dtype=torch.long)
    response_places = torch.arange(batch.response_ids.shape[1], device=device)
    for index, rows in enumerate(bins):
        offset = 0
        for row in rows:
            prompt_length, length = int(prompt_lengths[row]), int(lengths[row])
            tokens = torch.cat(
                [batch.prompt_ids[row, batch.prompt_mask[row].bool()], batch.response_ids[row, : length - prompt_length]]
            )
            input_ids[index, offset : offset + length] = tokens
            position_ids[index, offset : offset + length] = torch.arange(length, device=device)
            predictor_bin[row] = index
            predictor_place[row] = (offset + prompt_length - 1 + response_places).clamp(min=0, max=capacity - 1)
            offset += length
        position_ids[index, offset:] = position_ids[index, offset - 1] + 1 + torch.arange(capacity - offset, device=device)
    return PackedLayout(input_ids, position_ids, predictor_bin, predictor_place)


def _packed_terms(model, batch: PolicyBatch, temperature: float, with_entropy: bool) -> torch.Tensor:
    """(B, R, C) terms from one forward over the rows' real tokens, packed (`packed_layout`)."""
    layout = packed_layout(batch)
    head = _head(
        model,
        lambda hidden: hidden[layout.predictor_bin, layout.predictor_place],
        batch.response_ids,
        batch.response_mask,
        temperature,
        with_entropy,
    )
    terms, _ = _forward_terms(
        model, head, input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False, logits_to_keep=0
    )
    return terms


def _shared_prompt_terms(model, batch: PolicyBatch, runs: torch.Tensor, temperature: float, with_entropy: bool) -> torch.Tensor:
    """(B, R, C) terms from a forward over each run's prompt, then one over the responses per
    length bucket (`length_buckets`) on the prompts' cache, each bucket trimmed to its own width.

    runs: (U,) rows per distinct prompt, in row order (`shared_prompt_runs`).
    """
    run_starts = runs.cumsum(0) - runs
    prompt_ids, prompt_mask = batch.prompt_ids[run_starts], batch.prompt_mask[run_starts]
    first_token = _head(
        model,
        lambda hidden: hidden[:, -1:].repeat_interleave(runs, dim=0),
        batch.response_ids[:, :1],
        batch.response_mask[:, :1],
        temperature,
        with_entropy,
    )
    first_terms, prompt_cache = _forward_terms(
        model,
        first_token,
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(dim=1) - 1).clamp(min=0),
        use_cache=True,
        logits_to_keep=1,
    )
    response_ids, response_mask = batch.response_ids, batch.response_mask
    response_width = response_ids.shape[1]
    if response_width == 1:  # one-token responses still run every bucket's forward (see length_buckets)
        response_ids, response_mask = F.pad(response_ids, (0, 1)), F.pad(response_mask, (0, 1))
    rest = first_terms.new_zeros(len(batch), response_ids.shape[1] - 1, first_terms.shape[-1])
    prompt_of_row = torch.arange(len(runs), device=runs.device).repeat_interleave(runs)
    prompt_lengths = batch.prompt_mask.sum(dim=1, keepdim=True)
    rest_lengths = response_mask.sum(dim=1).long() - 1  # tokens after the first
    for rows in length_buckets(rest_lengths):
        width = max(1, int(rest_lengths[rows].max()))  # a bucket of one-token responses runs a padding token
        head = _head(
            model,
            lambda hidden: hidden,
            response_ids[rows, 1 : width + 1],
            response_mask[rows, 1 : width + 1],
            temperature,
            with_entropy,
        )
        inputs = response_ids[rows, :width]
        bucket_terms, _ = _forward_terms(
            model,
            head,
            input_ids=inputs,
            attention_mask=torch.cat([batch.prompt_mask[rows], response_mask[rows, :width].long()], dim=1),
            position_ids=prompt_lengths[rows] + torch.arange(width, device=inputs.device),
            **{CACHE_ARGUMENT: _cache_rows(prompt_cache, prompt_of_row[rows])},
            use_cache=True,
            logits_to_keep=0,
        )
        rest[rows, :width] = bucket_terms
    return torch.cat([first_terms, rest[:, : response_width - 1]], dim=1)


def _cache_rows(cache, rows: torch.Tensor):
    """A key/value cache holding `cache`'s rows `rows` (K,) in that order (repeats allowed), for
    one forward to extend; `cache` itself is left unchanged (the autograd graph reaches it). The
    layers select their rows as transformers defines for each kind of layer, by `index_select`
    (`_RowsByIndexSelect`), so that the gradient reaching the prompt's cache is the same bits on
    every run."""
    selected = copy.copy(cache)
    selected.layers = [copy.copy(layer) for layer in cache.layers]
    with _RowsByIndexSelect(rows):
        selected.batch_select_indices(rows)
    return selected


class _RowsByIndexSelect(TorchFunctionMode):
    """`tensor[..., rows, ...]` (full slices before `rows`) run as `tensor.index_select(dim, rows)`.

    Why: the backward of indexing with repeated rows is an accumulating `index_put`, which torch's
    CPU kernel runs on several threads with atomic float adds, in an order that changes from run
    to run: with 2 threads, two identical runs of the demo recipe ended 1.2e-7 apart in their
    weights, the only operation that made them differ. `index_select`'s backward (`index_add`)
    adds the repeats in index order: the same bits on every run, at any thread count."""

    def __init__(self, rows: torch.Tensor):
        super().__init__()
        self.rows = rows

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and isinstance(args[1], tuple):
            key = args[1]
            dim = next((position for position, part in enumerate(key) if part is self.rows), None)
            if (
                dim is not None
                and all(_whole(part) for part in key[:dim])
                and all(part is Ellipsis or _whole(part) for part in key[dim + 1 :])
            ):
                return args[0].index_select(dim, self.rows)
        return func(*args, **(kwargs or {}))


def _whole(part) -> bool:
    """Whether an index part is `:`."""
    return isinstance(part, slice) and part == slice(None)


MAX_BUCKETS = 4
"""Forwards per pass over a micro-batch's responses: min(MAX_BUCKETS, rows). Each one has a fixed
cost (kernel launches, Python over the layers) that the padding it saves must repay."""


def length_buckets(lengths: torch.Tensor) -> list[torch.Tensor]:
    """Rows grouped so that a forward per group, each padded to its own longest row, pads less.

    lengths: (B,) tokens per row. Returns min(MAX_BUCKETS, B) index tensors (n_k,) that together
    hold every row once. Rows are sorted by length, and the sorted run is cut, one cut at a time,
    where a cut removes the most padding (cost = sum_k n_k x longest row of k); where no cut
    removes any, the largest bucket is halved.

    The number of buckets depends on B alone, never on the lengths: under DDP and FSDP every
    forward is a collective (buffers broadcast, parameters gathered), so every rank must run
    as many forwards as the others, whatever its responses' lengths.
    """
    order = torch.argsort(lengths, stable=True)
    sorted_lengths = lengths[order]
    bounds = [0, len(order)]
    while len(bounds) - 1 < min(MAX_BUCKETS, len(order)):
        candidates = []  # (padding removed, rows, where to cut) for each bucket of 2 rows or more
        for start, end in zip(bounds[:-1], bounds[1:]):
            part = sorted_lengths[start:end]
            if len(part) > 1:
                before = torch.arange(1, len(part), device=part.device)  # rows left of each possible cut
                saving, place = (before * (part[-1] - part[:-1])).max(dim=0)  # those rows pad less
                cut = start + int(place) + 1 if saving > 0 else start + len(part) // 2
                candidates.append((int(saving), len(part), cut))
        bounds = sorted(bounds + [max(candidates)[2]])
    return [order[start:end] for start, end in zip(bounds[:-1], bounds[1:])]


def fill_rollout_logprobs(
    model: PreTrainedModel,
    batch: PolicyBatch,
    rows: slice,
    *,
    micro_batch_size: int,
    temperature: float,
    micro_batch_tokens: int | None = None,
    world: World | None = None,
    padding_free: bool = False,
) -> None:
    """Write the policy's log-probs and entropy at `batch.rows(rows)` (no gradient) into
    `batch.old_logprobs` and `batch.entropy`; nothing when `rows` selects no row.
    Every rank of `world` must select as many rows (`micro_batch_slices`)."""
    selected = batch.rows(rows)
    if len(selected) == 0:
        return
    logprobs, entropy = response_logprobs_no_grad(
        model,
        selected,
        micro_batch_size=micro_batch_size,
        micro_batch_tokens=micro_batch_tokens,
        world=world,
        temperature=temperature,
        with_entropy=True,
        padding_free=padding_free,
    )
    width = selected.response_ids.shape[1]
    batch.old_logprobs[rows, :width] = logprobs
    batch.entropy[rows, :width] = entropy


def response_logprobs_no_grad(
    model: PreTrainedModel,
    batch: PolicyBatch,
    *,
    micro_batch_size: int,
    micro_batch_tokens: int | None = None,
    world: World | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    padding_free: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`response_logprobs` over the whole batch, without gradient, in `micro_batch_slices` of at
    most `micro_batch_size` rows and `micro_batch_tokens` tokens (the same slices on every rank of
    `world`): (B, R) (and the entropy)."""
    micro_batches = micro_batch_slices(batch, max_rows=micro_batch_size, max_tokens=micro_batch_tokens, world=world)
    return per_token_no_grad(
        model,
        lambda micro: response_logprobs(
            model, micro, temperature=temperature, with_entropy=with_entropy, padding_free=padding_free
        ),
        batch,
        micro_batches,
    )
