"""Anthropic's Messages API through the official `anthropic` package: a plain message, a
system prompt, stop sequences, `max_tokens` reached, streaming through the SDK's stream
helper with every event type in order, forced tool use whose `input` validates against
the schema, a `tool_result` round trip rendered through the chat template, `count_tokens`
equal to the real prompt length, and the errors with their statuses."""

import json
import os

import anthropic
import httpx
import jsonschema
import pytest

# Anthropic's newest SDK has no `temperature` parameter (its models take none); the
# server does, and greedy decoding makes the answers repeatable.
GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def api_key():
    return os.environ.get("TESSERA_API_KEY", "")


@pytest.fixture(scope="module")
def claude(base_url):
    """The SDK as Claude Code's kin use it: `x-api-key` and `anthropic-version`."""
    return anthropic.Anthropic(base_url=base_url, api_key=api_key(), max_retries=0)


def count(claude, model, **kwargs):
    return claude.messages.count_tokens(model=model, **kwargs).input_tokens


def prompt_tokens(message):
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_a_plain_message_and_count_tokens(claude, model):
    message = claude.messages.create(model=model, max_tokens=32, extra_body=GREEDY, messages=QUESTION)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"]
    assert "Paris" in message.content[0].text
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert 0 < message.usage.output_tokens <= 32
    # count_tokens is the real prompt's length.
    assert count(claude, model, messages=QUESTION) == prompt_tokens(message)


def openai_count(base_url, messages, tools=None):
    """The prompt length of the same chat through /tokenize (OpenAI's form)."""
    body = {"messages": messages} | ({"tools": tools} if tools else {})
    headers = {"Authorization": f"Bearer {api_key()}"}
    return httpx.post(f"{base_url}/tokenize", headers=headers, json=body).json()["count"]


def test_a_system_prompt_reaches_the_prompt(claude, model, base_url):
    plain = count(claude, model, messages=QUESTION)
    system = "You are a terse geography teacher."
    with_system = count(claude, model, system=system, messages=QUESTION)
    # The template's own default system prompt gives way to this one.
    assert with_system != plain
    assert with_system == openai_count(base_url, [{"role": "system", "content": system}] + QUESTION)
    blocks = count(claude, model, system=[{"type": "text", "text": system}], messages=QUESTION)
    assert blocks == with_system
    message = claude.messages.create(model=model, max_tokens=8, extra_body=GREEDY, system=system,
                                     messages=QUESTION)
    assert prompt_tokens(message) == with_system


def test_stop_sequences_and_max_tokens(claude, model):
    whole = claude.messages.create(model=model, max_tokens=32, extra_body=GREEDY, messages=QUESTION)
    text = whole.content[0].text
    assert " is " in text, text
    stopped = claude.messages.create(model=model, max_tokens=32, extra_body=GREEDY, messages=QUESTION,
                                     stop_sequences=["NEVER", " is "])
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == " is "
    assert stopped.content[0].text == text.split(" is ")[0]
    cut = claude.messages.create(model=model, max_tokens=3, extra_body=GREEDY, messages=QUESTION)
    assert cut.stop_reason == "max_tokens"
    assert cut.usage.output_tokens == 3


def test_streaming_gives_every_event_in_order(claude, model):
    whole = claude.messages.create(model=model, max_tokens=16, extra_body=GREEDY, messages=QUESTION)
    kinds = []
    deltas = []
    with claude.messages.stream(model=model, max_tokens=16, extra_body=GREEDY,
                                messages=QUESTION) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta":
                assert event.delta.type == "text_delta"
                deltas.append(event.delta.text)
        final = stream.get_final_message()
    # The SDK's helper adds its own `text` events beside the wire's.
    wire = [k for k in kinds if k != "text"]
    assert wire[0] == "message_start"
    assert wire[1] == "content_block_start"
    assert set(wire[2:-3]) == {"content_block_delta"}
    assert wire[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "".join(deltas) == whole.content[0].text
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_forced_tool_use_validates_against_the_schema(claude, model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = claude.messages.create(model=model, max_tokens=80, extra_body=GREEDY, messages=ask,
                                     tools=[WEATHER],
                                     tool_choice={"type": "tool", "name": "get_weather"})
    uses = [b for b in message.content if b.type == "tool_use"]
    assert len(uses) == 1, message.content
    assert uses[0].name == "get_weather"
    assert uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    assert message.stop_reason == "tool_use"
    # Streamed, the same call arrives as input_json_delta fragments.
    with claude.messages.stream(model=model, max_tokens=80, extra_body=GREEDY, messages=ask,
                                tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(u.name, u.input) for u in uses]
    assert final.stop_reason == "tool_use"


def test_a_tool_result_round_trip_renders_through_the_template(claude, model, base_url):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    turns = ask + [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris", "unit": "celsius"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "21 degrees, sunny"}]}]},
    ]
    message = claude.messages.create(model=model, max_tokens=24, extra_body=GREEDY, messages=turns,
                                     tools=[WEATHER])
    assert message.content and message.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # The same conversation in OpenAI's form, rendered by /tokenize and read back: the
    # call is in the assistant turn and the result in a <tool_response>, and the count is
    # the message's.
    openai_turns = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "21 degrees, sunny"},
    ]
    tools = [{"type": "function", "function": {"name": WEATHER["name"],
                                               "description": WEATHER["description"],
                                               "parameters": WEATHER["input_schema"]}}]
    headers = {"Authorization": f"Bearer {api_key()}"}
    tok = httpx.post(f"{base_url}/tokenize", headers=headers,
                     json={"messages": openai_turns, "tools": tools}).json()
    prompt = httpx.post(f"{base_url}/detokenize", headers=headers,
                        json={"tokens": tok["tokens"]}).json()["prompt"]
    assert '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}\n</tool_call>' in prompt
    assert "<tool_response>\n21 degrees, sunny\n</tool_response>" in prompt
    assert tok["count"] == prompt_tokens(message)
    assert count(claude, model, messages=turns, tools=[WEATHER]) == tok["count"]


def test_errors_have_anthropics_types_and_statuses(claude, model, base_url):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=model, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="no-such-model", max_tokens=8, messages=QUESTION)
    assert e.value.body["error"]["type"] == "not_found_error"
    wrong = anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model=model, max_tokens=8, messages=QUESTION)
    assert e.value.body["error"]["type"] == "authentication_error"
    # A body over the server's limit (4 MiB).
    huge = [{"role": "user", "content": "x" * (5 << 20)}]
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(model=model, max_tokens=8, messages=huge)
    assert e.value.status_code == 413
    assert e.value.body["error"]["type"] == "request_too_large"
    # The default model does not think: asking it to is refused, not ignored.
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=model, max_tokens=8, messages=QUESTION,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert "does not think" in e.value.body["error"]["message"]
    # Server tools cannot run here: refused by name, never ignored.
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=model, max_tokens=8, messages=QUESTION,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "server tool" in e.value.body["error"]["message"]
