"""The glass-box page in a real browser: the distribution's Chromium driven by Playwright,
against a real ``inferpath`` server on 127.0.0.1 serving SmolLM2 with its native kernels.

The page is compared with second paths: its streamed answer with the API's answer to the
same greedy request (official openai client), its stage table with ``/v1/trace/{id}``,
and a plain client's response with what it would be without the page's header.
"""

from __future__ import annotations

import shutil

import httpx
import openai
import pytest

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread

MODEL = "smollm2-135m-instruct"
QUESTION = "What is a quadratic equation?"
MAX_TOKENS = 24
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (scripts/test.sh does it)")
    return path


@pytest.fixture(scope="module")
def server():
    engine = LLMEngine.from_model(MODEL, EngineConfig())
    with ServerThread(build_app(AsyncEngine(engine), served_model_name=MODEL)) as running:
        yield running


@pytest.fixture(scope="module")
def page_after_answer(server, tmp_path_factory):
    """The page after asking the seed's question: (page facts, trace JSON, screenshot path)."""
    from playwright.sync_api import sync_playwright

    shot = tmp_path_factory.mktemp("glassbox") / "page.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(server.url + "/")
            page.wait_for_function("document.getElementById('model-line').textContent.startsWith('model ')")
            page.fill("#question", QUESTION)
            page.fill("#max-tokens", str(MAX_TOKENS))
            page.click("#send")
            page.wait_for_function("document.body.dataset.state === 'done'", timeout=120_000)
            request_id = page.evaluate("document.body.dataset.requestId")
            facts = {
                "answer": page.inner_text("#answer"),
                "status": page.inner_text("#status"),
                "table": page.evaluate("""() => [...document.querySelectorAll('#stages tbody tr')].map(tr => ({
                    stage: tr.dataset.stage,
                    values: Object.fromEntries([...tr.querySelectorAll('td[data-key]')].map(
                        td => [td.dataset.key, td.dataset.value ?? null]))}))"""),
                "num_tokens": page.locator("#tokens .token").count(),
                "answer_box": page.locator("#answer").bounding_box(),
                "roofline_box": page.locator("#roofline").bounding_box(),
                "inked": page.evaluate("""() => ['roofline', 'steps-chart'].map(id => {
                    const c = document.getElementById(id);
                    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
                    return n; })"""),
            }
            page.hover("#tokens .token >> nth=1")
            page.wait_for_selector("#popup:not([hidden])")
            facts["popup"] = page.evaluate(
                "[...document.querySelectorAll('#popup tr.candidate')].map(tr => Number(tr.dataset.probability))")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    trace = httpx.get(f"{server.url}/v1/trace/{request_id}", timeout=30).json()
    return facts, trace, shot


def test_the_page_is_served_at_the_root(server):
    response = httpx.get(server.url + "/", timeout=30)
    assert response.status_code == 200 and "the glass box" in response.text
    assert httpx.get(server.url + "/glassbox/app.js", timeout=30).status_code == 200


def test_the_streamed_answer_is_the_apis_answer(server, page_after_answer):
    facts, _, _ = page_after_answer
    assert facts["status"] == "done"
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=MAX_TOKENS, temperature=0)
    assert facts["answer"] == reply.choices[0].message.content and facts["answer"].strip()


def test_the_stage_table_shows_the_trace_endpoints_numbers(page_after_answer):
    facts, trace, _ = page_after_answer
    keys = {f"{phase}_{what}" for phase in ("prefill", "decode")
            for what in ("measured_s", "predicted_s", "ratio", "intensity")}
    keys |= {"bytes_read", "flops"}
    assert [row["stage"] for row in facts["table"]] == [row["stage"] for row in trace["summary"]]
    for shown, row in zip(facts["table"], trace["summary"]):
        assert set(shown["values"]) == keys
        for key, value in shown["values"].items():
            assert (None if value is None else float(value)) == row[key], (row["stage"], key)
    assert facts["num_tokens"] == sum(1 for s in trace["steps"] if s["token"]) == MAX_TOKENS
    for row in trace["summary"]:  # the ÷ column: measured over predicted
        if row["decode_predicted_s"]:
            assert row["decode_ratio"] == pytest.approx(row["decode_measured_s"] / row["decode_predicted_s"])


def test_the_top5_popup_shows_five_probabilities(page_after_answer):
    facts, _, _ = page_after_answer
    probs = facts["popup"]
    assert len(probs) == 5 and all(p > 0 for p in probs) and sum(probs) <= 1 + 1e-6
    assert probs == sorted(probs, reverse=True)


def test_the_screenshot_has_an_answer_and_the_charts_drawn(page_after_answer):
    import matplotlib.image

    facts, _, shot = page_after_answer
    assert facts["answer_box"]["height"] > 30 and facts["answer_box"]["width"] > 200
    assert all(n > 2000 for n in facts["inked"]), facts["inked"]  # canvas pixels painted
    image = matplotlib.image.imread(shot)  # (height, width, channels) floats in [0, 1]
    box = facts["roofline_box"]
    region = image[int(box["y"]):int(box["y"] + box["height"]), int(box["x"]):int(box["x"] + box["width"]), :3]
    assert region.size and (region.mean(axis=2) < 0.9).mean() > 0.01  # the chart is on the screenshot


def test_a_plain_client_is_not_traced_and_sees_no_trace(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    plain = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120).json()
    traced = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120,
                        headers={"X-Inferpath-Trace": "1"}).json()
    assert set(plain) == set(traced) and "trace" not in str(set(plain))  # the same OpenAI response
    assert plain["choices"][0]["message"] == traced["choices"][0]["message"]
    assert httpx.get(f"{server.url}/v1/trace/{traced['id']}", timeout=30).status_code == 200
    missing = httpx.get(f"{server.url}/v1/trace/{plain['id']}", timeout=30)
    assert missing.status_code == 404 and "X-Inferpath-Trace" in missing.text


def test_a_trace_re_priced_on_a_preset_gives_explains_figures(server):
    """The same request's steps priced on h100-sxm: each step's prediction is the cost model's
    pass for that preset, the shapes and tokens the step ran (what ``explain`` computes)."""
    from inferpath.explain.cost import pass_cost
    from inferpath.explain.hardware import get_hardware
    from inferpath.explain.trace import precision_of

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120,
                       headers={"X-Inferpath-Trace": "1"}).json()
    here = httpx.get(f"{server.url}/v1/trace/{reply['id']}", timeout=30).json()
    there = httpx.get(f"{server.url}/v1/trace/{reply['id']}?hardware=h100-sxm", timeout=30).json()
    assert there["hardware"]["name"] == "h100-sxm" and here["hardware"]["name"] == "this-machine"
    assert [s["step_s"] for s in there["steps"]] == [s["step_s"] for s in here["steps"]]  # measured: the same
    same = LLMEngine.from_model(MODEL, EngineConfig())  # the server's model, as the engine runs it
    config, precision, h100 = same.model_config, precision_of(same), get_hardware("h100-sxm")
    for step in there["steps"]:
        expected = pass_cost(config, h100, precision, step["num_new_tokens"], step["context_len"],
                             fused_attention=True)
        assert step["predicted_s"] == pytest.approx(expected.time_s)
        assert step["bound"] == expected.bound
    phases = {s["phase"]: s["bound"] for s in there["steps"]}
    assert phases["decode"] == "memory"  # the seed's point, on the seed's hardware
    bad = httpx.get(f"{server.url}/v1/trace/{reply['id']}?hardware=abacus", timeout=30)
    assert bad.status_code == 400 and "abacus" in bad.text and "h100-sxm" in bad.text
    names = httpx.get(f"{server.url}/v1/trace-hardware", timeout=30).json()["hardware"]
    assert names[0] == "this-machine" and "h100-sxm" in names


def test_two_traced_requests_at_once_show_the_batch_they_shared(server):
    from concurrent.futures import ThreadPoolExecutor

    def ask(question: str) -> dict:
        body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 12,
                "temperature": 0, "ignore_eos": True}
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120,
                          headers={"X-Inferpath-Trace": "1"}).json()

    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(ask, ["Name a colour.", "Name a fruit."]))
    traces = [httpx.get(f"{server.url}/v1/trace/{r['id']}", timeout=30).json() for r in replies]
    shared = [{s["index"] for s in t["steps"] if s["num_seqs"] == 2} for t in traces]
    assert shared[0] and shared[0] == shared[1]  # the same engine steps, seen from both requests
    for trace in traces:
        assert all(s["num_seqs"] in (1, 2) for s in trace["steps"])
        assert [s["token"]["id"] for s in trace["steps"]] == [s["token"]["id"] for s in trace["steps"] if s["token"]]


def test_a_tensor_parallel_server_serves_the_page_and_says_why_it_cannot_trace():
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from inferpath.server.errors import install_error_handlers
    from inferpath.server.trace_routes import install_trace_routes

    engine = SimpleNamespace(engine_config=SimpleNamespace(tensor_parallel_size=2))
    app = FastAPI()
    install_error_handlers(app, lambda *a: None)
    install_trace_routes(app, SimpleNamespace(async_engine=SimpleNamespace(engine=engine), tracer=None))
    client = TestClient(app)
    assert client.get("/").status_code == 200
    refused = client.get("/v1/trace/chatcmpl-1")
    assert refused.status_code == 400 and "tensor_parallel_size must be 1" in refused.text
