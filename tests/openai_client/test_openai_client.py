"""`tessera serve` driven by the official `openai` package."""

import openai
import pytest

FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_chat_greedy_exact(client, model):
    r = client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=16)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].finish_reason == "stop"
    assert r.id.startswith("chatcmpl-")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream_with_usage(client, model):
    plain = client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=16)
    stream = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=0, max_tokens=16,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_chat_n2_and_seed_reproducible(client, model):
    args = dict(model=model, messages=FRANCE, temperature=1.0, seed=1234, max_tokens=6)
    a = client.chat.completions.create(**args)
    b = client.chat.completions.create(**args)
    assert a.choices[0].message.content == b.choices[0].message.content
    two = client.chat.completions.create(n=2, **args)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].message.content == a.choices[0].message.content


def test_chat_stop_string(client, model):
    r = client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=16, stop=[" Paris"])
    assert r.choices[0].message.content == "The capital of France is"
    assert r.choices[0].finish_reason == "stop"


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(
        model=model, messages=FRANCE, temperature=0, max_tokens=3, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_completions_plain_stream_logprobs(client, model):
    r = client.completions.create(model=model, prompt="Paris is the capital of", max_tokens=3, temperature=0, logprobs=2)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    assert len(r.choices[0].logprobs.tokens) == 3
    assert r.choices[0].logprobs.text_offset[0] == 0
    chunks = list(client.completions.create(
        model=model, prompt="Paris is the capital of", max_tokens=3, temperature=0,
        stream=True, stream_options={"include_usage": True},
    ))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.total_tokens == r.usage.total_tokens


def test_completions_echo_logprobs_score_the_prompt(client, model):
    # What evaluation harnesses send for a log-likelihood: the context and continuation
    # as one prompt, echoed with log-probabilities.
    context, continuation = "The capital of France is", " Paris"
    r = client.completions.create(
        model=model, prompt=context + continuation, max_tokens=1, temperature=0, echo=True, logprobs=1,
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(context + continuation)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    prompt_tokens = r.usage.prompt_tokens
    assert len(lp.tokens) == prompt_tokens + 1
    assert "".join(lp.tokens[:prompt_tokens]) == context + continuation
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) == 1 for t in lp.top_logprobs[1:])
    # " Paris" is the model's first choice after the context.
    assert lp.tokens[prompt_tokens - 1] == continuation
    assert list(lp.top_logprobs[prompt_tokens - 1]) == [continuation]
    # The older form: max_tokens=0 returns the scored prompt alone.
    z = client.completions.create(
        model=model, prompt=context + continuation, max_tokens=0, temperature=0, echo=True, logprobs=1,
    )
    assert z.choices[0].text == context + continuation
    assert z.usage.completion_tokens == 0
    assert z.choices[0].logprobs.token_logprobs == lp.token_logprobs[:prompt_tokens]
    # Streamed: the scored prompt first, then the generated token.
    chunks = list(client.completions.create(
        model=model, prompt=context + continuation, max_tokens=1, temperature=0, echo=True, logprobs=1,
        stream=True,
    ))
    assert chunks[0].choices[0].text == context + continuation
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert sum((s.tokens for s in streamed), []) == lp.tokens
    scores = sum((s.token_logprobs for s in streamed), [])
    assert scores[0] is None
    assert all(abs(a - b) < 1e-3 for a, b in zip(scores[1:], lp.token_logprobs[1:]))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_completions_list_of_prompts(client, model):
    r = client.completions.create(model=model, prompt=["Hello", "Goodbye"], max_tokens=2, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1]


def test_errors_surface_as_openai_exceptions(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=FRANCE, temperature=7)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=FRANCE, tools=[{"type": "function", "function": {"description": "f"}}])
    assert e.value.body["param"] == "tools[0].function.name"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=FRANCE, max_tokens=1)
    # SmolLM2 was not trained to fill in the middle: its vocabulary has no such tokens.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="def f(", suffix="    return x\n", max_tokens=4)
    assert e.value.body["param"] == "suffix"
    assert "fill-in-the-middle" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_models(client, model):
    assert [m.id for m in client.models.list().data] == [model]
    assert client.models.retrieve(model).id == model


def test_authentication_error(base_url, model):
    bad = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
