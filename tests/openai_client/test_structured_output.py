"""`response_format` through the official `openai` package: every answer under a JSON
schema validates (Python `jsonschema`), streamed or not; bad schemas raise BadRequestError."""

import json

import jsonschema
import openai
import pydantic
import pytest

PROMPT = [
    {"role": "system", "content": "You answer in JSON."},
    {"role": "user", "content": "Give me an example record."},
]

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "nickname": {"type": "string", "maxLength": 12},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
            "status": {"enum": ["open", "shipped", "closed"]},
            "lines": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "maxLength": 8},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        "price": {"type": "number", "minimum": 0, "maximum": 500},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["id", "status", "lines"],
        "additionalProperties": False,
    },
}


def fmt(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_output_validates_plain_sampled_and_streamed(client, model, name):
    schema = SCHEMAS[name]
    r = client.chat.completions.create(
        model=model, messages=PROMPT, temperature=0, max_tokens=200, response_format=fmt(name, schema)
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), schema)

    sampled = client.chat.completions.create(
        model=model, messages=PROMPT, temperature=1.0, seed=3, n=2, max_tokens=200,
        response_format=fmt(name, schema),
    )
    for c in sampled.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), schema)

    chunks = list(client.chat.completions.create(
        model=model, messages=PROMPT, temperature=0, max_tokens=200, stream=True,
        response_format=fmt(name, schema),
    ))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    population: int = pydantic.Field(ge=0, le=50_000_000)
    country_code: str = pydantic.Field(pattern=r"^[A-Z]{2}$")


def test_parse_with_a_pydantic_model(client, model):
    r = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "Describe Paris."}],
        temperature=0, max_tokens=120, response_format=City,
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(r.choices[0].message.parsed, City)


def test_json_object_on_completions(client, model):
    # The client's completions.create has no response_format argument; the server takes it.
    r = client.completions.create(
        model=model, prompt="A book, described as a JSON object:\n", temperature=0, max_tokens=150,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].text), dict)


def test_bad_schemas_raise_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=PROMPT, response_format=fmt("t", {"type": "array", "uniqueItems": True})
        )
    assert e.value.body["param"] == "response_format"
    assert "uniqueItems" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=PROMPT, response_format=fmt("t", {"type": "fish"}))


def test_vllm_structured_outputs_through_extra_body(client, model):
    """vLLM's documented client usage: the constraint goes in `extra_body`."""
    question = [{"role": "user", "content": "Classify this sentiment: Tessera is wonderful!"}]
    r = client.chat.completions.create(
        model=model, messages=question, temperature=0.8, seed=3, n=2,
        extra_body={"structured_outputs": {"choice": ["positive", "negative"]}},
    )
    for c in r.choices:
        assert c.message.content in ("positive", "negative")
        assert c.finish_reason == "stop"
    r = client.completions.create(
        model=model, prompt="An email address for Alan Turing: ", temperature=0, max_tokens=30,
        extra_body={"guided_regex": r"[a-z]+\.[a-z]+@enigma\.com"},
    )
    text = r.choices[0].text
    local, _, domain = text.partition("@")
    assert domain == "enigma.com" and local.count(".") == 1, text
    assert all(part.isalpha() and part.islower() for part in local.split(".")), text
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=question, extra_body={"structured_outputs": {"regex": "(a"}}
        )
    assert e.value.body["param"] == "structured_outputs"
