"""The warm-start on tool-using demonstrations: their token layout (the model's stretches and the
tool's) and a loss over the model's tokens only."""

from __future__ import annotations

import pytest
import torch
import transformers
from qwen_style import qwen_style_tokenizer

from pacs.data.arithmetic import generate_multiplications
from pacs.models.tiny import build_char_tokenizer, tiny_model_config
from pacs.rollout.base import pad_rows
from pacs.rollout.multiturn import ChatFormat
from pacs.train.batch import PolicyBatch
from pacs.train.builtin_models import tool_demonstration
from pacs.train.sft import demonstration_tokens, warm_start_loss

ROW = generate_multiplications("val", 1)[0]  # 4693*9299


def test_a_demonstrations_stretches_are_the_call_the_tool_output_with_the_next_generation_prompt_and_the_answer():
    tokenizer = build_char_tokenizer()
    token_ids, model_tokens = demonstration_tokens(tokenizer, ROW["prompt"], tool_demonstration(ROW))
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(4693*9299)"}}</tool_call><|end|>'
    tool = "<|tool|>43640207<|end|><|assistant|>"
    answer = "\\boxed{43640207}<|end|>"
    stretches = [(call, 1), (tool, 0), (answer, 1)]
    assert tokenizer.decode(token_ids) == call + tool + answer
    expected_mask = [flag for text, flag in stretches for _ in tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert model_tokens == expected_mask


@pytest.mark.parametrize("make_tokenizer", [build_char_tokenizer, qwen_style_tokenizer], ids=["tiny", "qwen2.5-template"])
def test_a_demonstration_is_the_trajectory_a_chat_format_rollout_of_the_same_turns_makes(make_tokenizer):
    tokenizer = make_tokenizer()
    token_ids, model_tokens = demonstration_tokens(tokenizer, ROW["prompt"], tool_demonstration(ROW))
    call_end = model_tokens.index(0)
    answer_start = call_end + model_tokens[call_end:].index(1)
    chat = ChatFormat(tokenizer, "python")
    assert chat.call_in(token_ids[:call_end]) == (
        call_end,
        chat.parsed('{"name": "python", "arguments": {"code": "print(4693*9299)"}}'),
    )
    assert token_ids[call_end:answer_start] == chat.output_tokens(token_ids[:call_end], "43640207\n")
    assert token_ids[-1] == tokenizer.eos_token_id and model_tokens[answer_start:] == [1] * (len(token_ids) - answer_start)


def test_prompt_and_demonstration_are_the_whole_conversation_as_the_chat_template_renders_it():
    tokenizer = build_char_tokenizer()
    prompt = tokenizer.apply_chat_template(ROW["prompt"], add_generation_prompt=True, tokenize=False)
    conversation = tokenizer.apply_chat_template(ROW["prompt"] + tool_demonstration(ROW), tokenize=False)
    token_ids, _ = demonstration_tokens(tokenizer, ROW["prompt"], tool_demonstration(ROW))
    assert (
        tokenizer(prompt, add_special_tokens=False)["input_ids"] + token_ids
        == tokenizer(conversation, add_special_tokens=False)["input_ids"]
    )


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_turn():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    with pytest.raises(ValueError, match=r"demonstration turn 0 \(assistant\): the chat template's rendering does not extend"):
        demonstration_tokens(tokenizer, ROW["prompt"], tool_demonstration(ROW))


def test_a_template_that_ends_no_assistant_message_with_the_end_of_sequence_text_is_refused():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    with pytest.raises(
        ValueError, match=r"turn 0 \(assistant\): the chat template renders it without the end-of-sequence text '<\|end\|>'"
    ):
        demonstration_tokens(tokenizer, ROW["prompt"], tool_demonstration(ROW))


def test_a_user_turn_in_a_demonstration_is_refused_naming_it():
    turns = [*tool_demonstration(ROW)[:1], {"role": "user", "content": "and now?"}]
    with pytest.raises(ValueError, match="demonstration turn 1 has role 'user'; turns are 'assistant' or 'tool'"):
        demonstration_tokens(build_char_tokenizer(), ROW["prompt"], turns)


def test_the_warm_start_loss_is_the_token_mean_of_minus_log_pi_over_the_models_tokens_only():
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = tiny_model_config(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = transformers.Qwen2ForCausalLM(config).to(torch.float64).eval()
    rows = generate_multiplications("val", 2, digits=2)
    prompts, responses, masks = [], [], []
    for row, turns in zip(rows, [tool_demonstration(rows[0]), tool_demonstration(rows[1])[:1]]):
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompts.append(torch.tensor(tokenizer(prompt, add_special_tokens=False)["input_ids"]))
        token_ids, model_tokens = demonstration_tokens(tokenizer, row["prompt"], turns)
        responses.append(torch.tensor(token_ids))
        masks.append(torch.tensor(model_tokens, dtype=torch.float64))
    response_mask = pad_rows([torch.ones(len(r), dtype=torch.float64) for r in responses], 0, left=False)
    batch = PolicyBatch(
        prompt_ids=pad_rows(prompts, tokenizer.pad_token_id, left=True),
        prompt_mask=pad_rows([torch.ones_like(p) for p in prompts], 0, left=True),
        response_ids=pad_rows(responses, tokenizer.pad_token_id, left=False),
        response_mask=response_mask,
        rewards=torch.zeros(2, dtype=torch.float64),
        old_logprobs=torch.zeros_like(response_mask),
        entropy=torch.zeros_like(response_mask),
        model_token_mask=pad_rows(masks, 0, left=False),
    )
    scored = []
    with torch.no_grad():
        for prompt, response, mask in zip(prompts, responses, masks):
            sequence = torch.cat([prompt, response])
            logprobs = torch.log_softmax(model(sequence[None]).logits[0, len(prompt) - 1 : -1], dim=-1)
            token_logprobs = logprobs.gather(1, response[:, None])[:, 0]
            scored += token_logprobs[mask.bool()].tolist()
        loss = warm_start_loss(model, batch)
    assert len(scored) == int(batch.loss_mask.sum()) < int(response_mask.sum())
    assert loss.item() == pytest.approx(-sum(scored) / len(scored), rel=1e-12)
