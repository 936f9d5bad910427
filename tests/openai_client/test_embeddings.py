"""/v1/embeddings through the official client, against the default model served as an
embedding model (`--runner pooling`, started by scripts/test-openai beside the
generating server)."""

import math
import os

import openai
import pytest

from conftest import api_key


@pytest.fixture(scope="module")
def embedder() -> openai.OpenAI:
    url = os.environ.get("TESSERA_EMBEDDING_URL")
    if not url:
        pytest.fail("TESSERA_EMBEDDING_URL is not set: run these tests through scripts/test-openai")
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key(), max_retries=0)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_one_input_is_a_unit_vector_of_the_models_width(embedder, model):
    # The client asks for base64 and decodes it.
    reply = embedder.embeddings.create(model=model, input="The cat sat on the mat.")
    assert reply.object == "list"
    assert reply.model == model
    assert len(reply.data) == 1
    vector = reply.data[0].embedding
    assert len(vector) == 576
    assert abs(math.sqrt(sum(x * x for x in vector)) - 1.0) < 1e-4
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens


def test_a_batch_keeps_its_order_and_each_vector(embedder, model):
    texts = ["Paris is the capital of France.", "The cat sat on the mat.", "Revenue rose."]
    batch = embedder.embeddings.create(model=model, input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    alone = embedder.embeddings.create(model=model, input=texts[1], encoding_format="float")
    assert cosine(batch.data[1].embedding, alone.data[0].embedding) >= 0.9999
    assert cosine(batch.data[0].embedding, batch.data[2].embedding) < 0.999
    assert batch.usage.prompt_tokens > alone.usage.prompt_tokens


def test_dimensions_is_refused_for_a_model_not_trained_for_it(embedder, model):
    with pytest.raises(openai.BadRequestError) as e:
        embedder.embeddings.create(model=model, input="hello", dimensions=64)
    assert e.value.body["param"] == "dimensions"


def test_each_server_refuses_the_other_runners_routes(embedder, client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model, input="hello")
    assert "--runner pooling" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        embedder.chat.completions.create(
            model=model, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert "--runner pooling" in e.value.message
