"""The chat page at `GET /` in a real browser: it loads, streams an answer through the
API, and asks for the API key when the server has one."""

import time

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

FRANCE = "What is the capital of France? Answer in one sentence."
# What the default model answers greedily, as tests/openai_client checks through the API.
FRANCE_ANSWER = "The capital of France is Paris."

# Records every text the newest answer shows, as the page renders it.
RECORD_ANSWER_TEXTS = """
window.answerTexts = [];
new MutationObserver(() => {
  const answers = document.querySelectorAll("#log .assistant > span");
  const text = answers.length ? answers[answers.length - 1].textContent : "";
  const seen = window.answerTexts;
  if (text && seen[seen.length - 1] !== text) seen.push(text);
}).observe(document.getElementById("log"), { childList: true, characterData: true, subtree: true });
"""


def wait(driver, timeout: float = 30) -> WebDriverWait:
    return WebDriverWait(driver, timeout, poll_frequency=0.1)


def assert_no_prompt(driver) -> None:
    try:
        text = driver.switch_to.alert.text
    except NoAlertPresentException:
        return
    pytest.fail(f"the page asked: {text!r}")


def wait_ready(driver, model: str) -> None:
    """The page has found the model and lets a message be sent."""
    wait(driver).until(EC.text_to_be_present_in_element((By.ID, "model"), model))
    assert driver.find_element(By.ID, "model").text == model
    wait(driver, 5).until(EC.element_to_be_clickable((By.ID, "send")))


def set_greedy(driver, max_tokens: int) -> None:
    """Temperature 0 and a cap on the answer, through the page's settings."""
    driver.find_element(By.CSS_SELECTOR, "#settings summary").click()
    driver.find_element(By.ID, "temperature").send_keys("0")
    driver.find_element(By.ID, "max_tokens").send_keys(str(max_tokens))


def ask(driver, text: str) -> str:
    """Types a message, sends it with Enter, waits for the whole answer and returns it."""
    before = len(driver.find_elements(By.CSS_SELECTOR, "#log .assistant"))
    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    wait(driver, 120).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#log .assistant[data-done]")) > before
    )
    out = driver.find_elements(By.CSS_SELECTOR, "#log .assistant")[-1]
    answer = driver.execute_script("return arguments[0].querySelector('span').textContent", out)
    assert out.get_attribute("data-done") == "1", f"the turn ended with: {answer!r}"
    assert "error" not in out.get_attribute("class")
    return answer


def test_page_sends_a_message_and_streams_the_answer(browser, open_url, model):
    browser.get(open_url + "/")
    assert browser.title == "Tessera"
    wait_ready(browser, model)
    assert_no_prompt(browser)
    assert browser.find_element(By.ID, "log").text == ""

    set_greedy(browser, max_tokens=16)
    browser.execute_script(RECORD_ANSWER_TEXTS)
    answer = ask(browser, FRANCE)

    users = browser.find_elements(By.CSS_SELECTOR, "#log .user")
    assert [u.text for u in users] == [FRANCE]
    assert answer == FRANCE_ANSWER
    # Streamed: the answer grew on the page, each text extending the one before.
    texts = browser.execute_script("return window.answerTexts")
    assert len(texts) >= 2, f"the answer appeared at once: {texts}"
    assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(texts, texts[1:])), texts
    assert texts[-1] == answer
    chunks = browser.find_element(By.CSS_SELECTOR, "#log .assistant").get_attribute("data-chunks")
    assert int(chunks) >= 2
    # Sending again is possible once the answer is complete.
    assert browser.find_element(By.ID, "send").is_enabled()
    assert browser.find_element(By.ID, "stop").get_attribute("hidden") is not None


def test_page_asks_for_the_api_key(browser, keyed_url, api_key, model):
    browser.get(keyed_url + "/")
    # The page loads without the key, and asks for it at once (the prompt blocks the page).
    prompt = wait(browser).until(EC.alert_is_present())
    assert "API key" in prompt.text
    prompt.send_keys("wrong-" + api_key)
    prompt.accept()
    # The refusal is shown on the page, nothing can be sent, and the page asks again.
    wait(browser, 10).until(
        EC.text_to_be_present_in_element((By.ID, "model"), "missing or incorrect API key")
    )
    assert browser.title == "Tessera"
    assert not browser.find_element(By.ID, "send").is_enabled()
    prompt = wait(browser, 10).until(EC.alert_is_present())
    prompt.send_keys(api_key)
    prompt.accept()

    wait_ready(browser, model)
    set_greedy(browser, max_tokens=16)
    assert ask(browser, FRANCE) == FRANCE_ANSWER

    # The key is remembered: a reload goes straight to the model.
    assert browser.execute_script("return localStorage.getItem('tessera-api-key')") == api_key
    browser.refresh()
    wait_ready(browser, model)
    assert_no_prompt(browser)


def test_cancelling_the_key_prompt_stops_asking(browser, keyed_url, api_key, model):
    # Forget the key on a page of the same origin that runs no script, then open the chat.
    browser.get(keyed_url + "/health")
    browser.execute_script("localStorage.removeItem('tessera-api-key')")
    browser.get(keyed_url + "/")
    prompt = wait(browser).until(EC.alert_is_present())
    prompt.dismiss()
    # The refusal and the way out are shown (the settings open on the key button), and
    # the page does not ask again by itself.
    wait(browser, 10).until(
        EC.text_to_be_present_in_element((By.ID, "model"), "Settings: \"Set the API key\"")
    )
    time.sleep(3)
    assert_no_prompt(browser)
    assert not browser.find_element(By.ID, "send").is_enabled()
    browser.find_element(By.ID, "key").click()
    prompt = wait(browser, 10).until(EC.alert_is_present())
    prompt.send_keys(api_key)
    prompt.accept()
    wait_ready(browser, model)
