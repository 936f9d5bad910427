"""Tool calling through the official `openai` package: `required` and named calls whose
arguments validate against the tool's schema (Python `jsonschema`), streamed deltas that
assemble to the same calls, a tool-result round trip, and bad tools refused."""

import json
import os

import httpx
import jsonschema
import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 12}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris, and the time in Tokyo?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def validated(calls):
    out = []
    for call in calls:
        assert call.id.startswith("call_")
        assert call.type == "function"
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, call.function.arguments))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_required_calls_validate(client, model, seed):
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required",
        temperature=1.0, seed=seed, max_tokens=120,
    )
    choice = r.choices[0]
    assert choice.message.content is None
    calls = choice.message.tool_calls
    if choice.finish_reason == "length":
        # `required` allows any number of calls, and at temperature 1 the small model can
        # go on calling until the budget runs out (seed 2 does): the budget is spent, and
        # every call before the one cut off validates.
        assert r.usage.completion_tokens == 120
        assert len(validated(calls[:-1])) >= 1
    else:
        assert choice.finish_reason == "tool_calls"
        assert len(validated(calls)) >= 1


def test_named_call_and_parallel_false(client, model):
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    calls = validated(r.choices[0].message.tool_calls)
    assert [name for name, _ in calls] == ["get_weather"]
    one = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, seed=5, max_tokens=120,
    )
    assert len(validated(one.choices[0].message.tool_calls)) == 1


def test_streamed_deltas_assemble_to_the_same_calls(client, model):
    args = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=120)
    whole = client.chat.completions.create(**args)
    calls = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **args):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            if d.id is not None:
                assert d.index not in calls
                assert d.type == "function" and d.function.name
                calls[d.index] = [d.id, d.function.name, ""]
            else:
                assert d.function.name is None
            calls[d.index][2] += d.function.arguments or ""
    assert finish == "tool_calls"
    streamed = [(name, arguments) for _, name, arguments in (calls[i] for i in sorted(calls))]
    assert streamed == validated(whole.choices[0].message.tool_calls)


def test_stream_helper_assembles_the_call(client, model):
    with client.chat.completions.stream(
        model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = validated(final.choices[0].message.tool_calls)
    assert [name for name, _ in calls] == ["get_time"]


def rendered_prompt(base_url, messages):
    """The prompt a chat with `messages` and the tools gets, through /tokenize (which
    renders as the chat does) and /detokenize; and its token count."""
    headers = {"Authorization": f"Bearer {os.environ.get('TESSERA_API_KEY', '')}"}
    tok = httpx.post(f"{base_url}/tokenize", headers=headers,
                     json={"messages": messages, "tools": TOOLS}).json()
    text = httpx.post(f"{base_url}/detokenize", headers=headers,
                      json={"tokens": tok["tokens"]}).json()["prompt"]
    return text, tok["count"]


def test_tool_result_round_trip(client, model, base_url):
    first = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "sunny"})},
    ]
    second = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=30)
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    # The second prompt holds the call and its result. SmolLM2's template knows no tools:
    # the call is written into the assistant turn, the result into a <tool_response>.
    prompt, count = rendered_prompt(base_url, messages)
    assert count == second.usage.prompt_tokens
    arguments = json.loads(call.function.arguments)
    written = json.dumps({"name": "get_weather", "arguments": arguments}, separators=(",", ":"))
    assert f"<|im_start|>assistant\n<tool_call>\n{written}\n</tool_call><|im_end|>" in prompt, prompt
    assert ('<|im_start|>user\n<tool_response>\n{"temperature": 21, "sky": "sunny"}\n'
            '</tool_response><|im_end|>') in prompt, prompt


@pytest.mark.parametrize(
    "tools, tool_choice, param",
    [
        ([{"type": "function", "function": {"description": "no name"}}], None, "tools[0].function.name"),
        (TOOLS, {"type": "function", "function": {"name": "missing"}}, "tool_choice"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}],
         None, "tools[0].function.parameters"),
    ],
)
def test_bad_tools_are_refused(client, model, tools, tool_choice, param):
    kwargs = {"tool_choice": tool_choice} if tool_choice else {}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=ASK, tools=tools, max_tokens=4, **kwargs)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param
