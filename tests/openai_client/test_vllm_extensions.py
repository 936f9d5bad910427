"""vLLM's request extensions through the official `openai` package's `extra_body`, as
clients written against vLLM send them."""

import openai
import pytest

HELLO = [{"role": "user", "content": "Say hello."}]


def test_min_tokens_holds_back_the_end_and_refusals_name_the_field(client, model):
    short = client.chat.completions.create(model=model, messages=HELLO, temperature=0, max_tokens=60)
    assert short.choices[0].finish_reason == "stop"
    n = short.usage.completion_tokens
    longer = client.chat.completions.create(
        model=model, messages=HELLO, temperature=0, max_tokens=60, extra_body={"min_tokens": n + 5}
    )
    assert longer.usage.completion_tokens >= n + 5
    assert longer.choices[0].message.content.startswith(short.choices[0].message.content)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=HELLO, extra_body={"use_beam_search": True}
        )
    assert e.value.body["param"] == "use_beam_search"


def test_continue_final_message_and_template_kwargs(client, model):
    partial = "The capital of France is"
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": partial},
    ]
    r = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=5,
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "chat_template_kwargs": {"enable_thinking": False}},
    )
    # The reply continues the sentence rather than starting a new turn.
    assert "Paris" in r.choices[0].message.content
    assert not r.choices[0].message.content.startswith(partial)
