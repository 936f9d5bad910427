"""`/v1/responses` through the official `openai` package: `responses.create` with text and
item inputs, instructions, `max_output_tokens`, `text.format`, function tools and a
function-call round trip; `responses.stream` and raw streaming events; refusals of what
a stateless server cannot do."""

import json

import jsonschema
import openai
import pytest

QUESTION = "What is the capital of France? Answer in one sentence."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def test_create_with_text_input_equals_chat(client, model):
    r = client.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=16)
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=16
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "completed"
    assert r.output_text == chat.choices[0].message.content
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_items_instructions_and_incomplete(client, model):
    r = client.responses.create(
        model=model, instructions="Answer briefly.", max_output_tokens=3, temperature=0,
        input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
    )
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    assert r.instructions == "Answer briefly."


def test_text_format_json_schema(client, model):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=model, input="Give me a city as JSON.", temperature=0, max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(r.output_text), schema)


def test_function_call_and_round_trip(client, model):
    r = client.responses.create(
        model=model, input="Weather in Paris?", tools=[WEATHER], temperature=0, max_output_tokens=60,
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    follow = client.responses.create(
        model=model, tools=[WEATHER], temperature=0, max_output_tokens=20,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "{\"sky\": \"sunny\"}"},
        ],
    )
    assert follow.status in ("completed", "incomplete")
    assert follow.output
    assert follow.usage.input_tokens > r.usage.input_tokens


def test_raw_stream_event_sequence(client, model):
    plain = client.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=16)
    events = list(client.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=16, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for k in ["response.output_item.added", "response.content_part.added", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"]:
        assert kinds.count(k) == 1, k
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text
    assert events[-1].response.output_text == plain.output_text
    assert events[-1].response.usage.output_tokens == plain.usage.output_tokens


def test_stream_helper_with_function_call(client, model):
    with client.responses.stream(
        model=model, input="Weather in Paris?", tools=[WEATHER], temperature=0, max_output_tokens=60,
        tool_choice="required",
    ) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert deltas == "".join(c.arguments for c in calls)
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])


LOGPROBS = "message.output_text.logprobs"


def test_logprobs_included_on_request(client, model):
    r = client.responses.create(
        model=model, input=QUESTION, temperature=0, max_output_tokens=8, include=[LOGPROBS], top_logprobs=2,
    )
    part = r.output[0].content[0]
    assert part.type == "output_text" and part.text == r.output_text
    assert len(part.logprobs) == r.usage.output_tokens
    # The end-of-turn token that ended the answer is an output token too.
    assert "".join(lp.token for lp in part.logprobs) == part.text + "<|im_end|>"
    for lp in part.logprobs:
        assert lp.logprob <= 0 and bytes(lp.bytes) == lp.token.encode()
        assert len(lp.top_logprobs) == 2
        # Greedy: the chosen token is the most likely one.
        assert lp.top_logprobs[0].token == lp.token and lp.top_logprobs[0].logprob == lp.logprob
        assert lp.top_logprobs[1].logprob <= lp.logprob
    plain = client.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=8)
    assert plain.output_text == r.output_text
    assert plain.output[0].content[0].logprobs == []


def test_stream_deltas_carry_logprobs(client, model):
    with client.responses.stream(
        model=model, input=QUESTION, temperature=0, max_output_tokens=8, include=[LOGPROBS], top_logprobs=1,
    ) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    streamed = [(lp.token, lp.logprob) for e in deltas for lp in e.logprobs]
    whole = [(lp.token, lp.logprob) for lp in final.output[0].content[0].logprobs]
    assert streamed == whole and len(whole) == final.usage.output_tokens
    assert "".join(e.delta for e in deltas) == final.output_text


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"include": [LOGPROBS], "tools": [WEATHER]}, "include"),
    ],
)
def test_stateful_and_unsupported_requests_are_refused(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input=QUESTION, max_output_tokens=4, **extra)
    assert e.value.body["param"] == param
