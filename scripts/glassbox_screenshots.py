"""Screenshots of the glass-box page for docs/glassbox.md (docs/glassbox/*.png).

Starts ``inferpath serve``'s app on 127.0.0.1 with the default model and drives the
distribution's Chromium through Playwright:

1. prefill.png: one tab asks the seed's question; the first token (the prefill step's)
   is clicked to show its top 5.
2. decode-shared.png: two tabs ask at the same time; the second tab, whose decode steps
   shared the batch with the first's.

    python scripts/glassbox_screenshots.py [--out docs/glassbox] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread

MODEL = "smollm2-135m-instruct"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1050}


def ask(page, url: str, question: str, max_tokens: int) -> None:
    page.goto(url)
    page.wait_for_function("document.getElementById('model-line').textContent.startsWith('model ')")
    page.fill("#question", question)
    page.fill("#max-tokens", str(max_tokens))
    page.click("#send")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/glassbox")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = LLMEngine.from_model(MODEL, EngineConfig())
    done = "document.body.dataset.state === 'done'"
    with ServerThread(build_app(AsyncEngine(engine), served_model_name=MODEL)) as server, sync_playwright() as pw:
        # one untraced request first, so the screenshots show steady steps, not first-call
        # costs (oneDNN primitives, page faults); a plain prompt shares no cached prefix
        httpx.post(server.url + "/v1/completions", timeout=300,
                   json={"model": MODEL, "prompt": "Warm up: 1, 2, 3,", "max_tokens": 8})
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        ask(page, server.url + "/", "What is a quadratic equation?", args.max_tokens)
        page.wait_for_function(done, timeout=300_000)
        page.click("#tokens .token >> nth=0")
        page.screenshot(path=str(out / "prefill.png"))
        first, second = browser.new_page(viewport=VIEWPORT), browser.new_page(viewport=VIEWPORT)
        ask(first, server.url + "/", "Write a short poem about the sea.", args.max_tokens)
        ask(second, server.url + "/", "What is a quadratic equation?", args.max_tokens)
        first.wait_for_function(done, timeout=300_000)
        second.wait_for_function(done, timeout=300_000)
        second.click("#tokens .token >> nth=3")
        second.screenshot(path=str(out / "decode-shared.png"))
        browser.close()
    for name in ("prefill.png", "decode-shared.png"):
        shrink(out / name)
        print(out / name)


def shrink(path: Path) -> None:
    """A 256-colour palette (fast octree keeps the few chart colours): the repository stays small."""
    from PIL import Image  # matplotlib's dependency

    Image.open(path).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)


if __name__ == "__main__":
    main()
