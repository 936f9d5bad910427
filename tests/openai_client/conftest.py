"""Shared fixtures: the running server (started by scripts/test-openai) and clients."""

import os

import openai
import pytest


@pytest.fixture(scope="session")
def base_url() -> str:
    url = os.environ.get("TESSERA_URL")
    if not url:
        pytest.fail("TESSERA_URL is not set: run these tests through scripts/test-openai")
    return url


@pytest.fixture(scope="session")
def model() -> str:
    return os.environ["TESSERA_MODEL_NAME"]


@pytest.fixture(scope="session")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key(), max_retries=0)


def api_key() -> str:
    """The key the server was started with (scripts/test-openai sets one)."""
    return os.environ.get("TESSERA_API_KEY", "")
