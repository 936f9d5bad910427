"""Runs the curl examples of the README's HTTP API section, as written, against the
server (only `http://localhost:8000` is replaced by the test server's address)."""

import json
import os
import pathlib
import re
import subprocess

import pytest

HERE = pathlib.Path(__file__).parent
README = HERE.parent.parent / "README.md"


def http_api_section() -> str:
    text = README.read_text()
    start = text.index("## HTTP API")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[str]:
    """Split a block into commands: each starts at a line beginning with `curl`."""
    out: list[str] = []
    for line in block.splitlines(keepends=True):
        if line.startswith("curl") or not out:
            out.append(line)
        else:
            out[-1] += line
    return [c for c in out if c.strip()]


ALL = [c for b in bash_blocks(http_api_section()) for c in commands(b)]


def test_every_route_has_an_example():
    routes = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize",
              "/detokenize", "/health", "/openapi.json", "/v1/messages", "/v1/embeddings", "/v1/rerank"]
    for route in routes:
        assert any(route in c for c in ALL), f"no README curl example for {route}"


@pytest.mark.parametrize("command", ALL, ids=[c.split()[2].rsplit("/", 1)[-1] for c in ALL])
def test_curl_example(command, base_url):
    # Embeddings come from the server started as an embedding model.
    if "/v1/embeddings" in command:
        base_url = os.environ["TESSERA_EMBEDDING_URL"]
    cmd = command.replace("http://localhost:8000", base_url)
    env = dict(os.environ)
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail; " + cmd.replace("curl -s", "curl -sf", 1)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    if "/metrics" in cmd:
        assert "tessera_num_requests_running" in out
    elif '"stream": true' in cmd:
        events = [l[len("data: "):] for l in out.splitlines() if l.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] > 0
    else:
        body = json.loads(out)
        assert "error" not in body
        if "/chat/completions" in cmd and "response_format" in cmd:
            assert body["choices"][0]["finish_reason"] == "stop"
            cat = json.loads(body["choices"][0]["message"]["content"])
            assert set(cat) == {"name", "age"} and 0 <= cat["age"] <= 30
        elif "/chat/completions" in cmd and "structured_outputs" in cmd:
            assert body["choices"][0]["finish_reason"] == "stop"
            assert body["choices"][0]["message"]["content"] in ("positive", "negative")
        elif "/chat/completions" in cmd and '"tools"' in cmd:
            assert body["choices"][0]["finish_reason"] == "tool_calls"
            call = body["choices"][0]["message"]["tool_calls"][0]
            assert call["function"]["name"] == "get_weather"
            args = json.loads(call["function"]["arguments"])
            assert set(args) == {"city"} and len(args["city"]) <= 20
        elif "/chat/completions" in cmd:
            assert body["choices"][0]["message"]["content"] == "The capital of France is Paris."
        elif "/v1/rerank" in cmd:
            assert len(body["results"]) == 2
            assert body["results"][0]["relevance_score"] >= body["results"][1]["relevance_score"]
        elif "/v1/embeddings" in cmd:
            assert [d["index"] for d in body["data"]] == [0, 1]
            assert len(body["data"][0]["embedding"]) == 576
