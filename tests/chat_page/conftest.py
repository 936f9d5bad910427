"""Shared fixtures: the servers (started by scripts/test-chat-page) and a headless Chromium."""

import os
import shutil

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests through scripts/test-chat-page")
    return value


@pytest.fixture(scope="session")
def open_url() -> str:
    """A server without API keys."""
    return _env("TESSERA_URL")


@pytest.fixture(scope="session")
def keyed_url() -> str:
    """A server started with --api-key (TESSERA_API_KEY)."""
    return _env("TESSERA_KEYED_URL")


@pytest.fixture(scope="session")
def api_key() -> str:
    return _env("TESSERA_API_KEY")


@pytest.fixture(scope="session")
def model() -> str:
    return _env("TESSERA_MODEL_NAME")


@pytest.fixture
def browser():
    """Debian's Chromium, headless, with a fresh profile (so no stored key) per test.

    Prompts are left open for the test to handle (not dismissed by the next command)."""
    chromium = shutil.which("chromium")
    chromedriver = shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.fail("chromium and chromedriver are needed: scripts/test-chat-page installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1000,800"):
        options.add_argument(arg)
    options.unhandled_prompt_behavior = "ignore"
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
