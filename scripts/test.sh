#!/usr/bin/env bash
# Install inferpath with its test dependencies, fetch the test data (real models, llama.cpp
# vocab vectors) into the cache outside the repo, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0 2>/dev/null || python -m pip install -q 'torch>=2.4,<2.14'
python -m pip install -q -e '.[test]'
# the glass-box page's browser test drives the distribution's Chromium (Playwright's own
# browser download is not reachable): install it where apt-get can
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
python -m inferpath models pull smollm2-135m-instruct
python -m inferpath models pull qwen2.5-coder-0.5b-instruct
python -m inferpath models pull gemma-3-270m
python -m pytest -q --timeout 1500 "$@"
