"""Real coding agents against a real ``inferpath serve``, end to end and offline: Codex CLI
(Responses API) and Claude Code (Messages API) are asked to create a file; the test passes
when the agent executed a tool call the model wrote and the file holds the text.

Opt-in: each agent turn renders a 9-19k-token prompt (Codex's instructions and tool
schemas; Claude Code's), minutes of prefill for a 1.5B model on a CPU, so the tests run only
with ``INFERPATH_AGENT_TESTS=1`` and the CLI installed (``npm install -g @openai/codex``,
``@anthropic-ai/claude-code``). ``INFERPATH_AGENT_MODEL`` picks the model (default
qwen2.5-coder-1.5b-instruct), ``INFERPATH_AGENT_ATTEMPTS`` the tries (default 3: the agents
send no temperature, so the model samples at 1.0 and a small one does not choose the right
tool every time; every try's outcome is in the failure message). The prefix cache carries
the shared prompt from one try to the next. ``INFERPATH_AGENT_SAMPLING`` (JSON) is the
server's sampling defaults for what the agents leave out (``serve
--override-generation-config``; default: Qwen2.5's published temperature 0.7, top_p 0.8,
top_k 20; ``{}`` for OpenAI's temperature 1).

Codex's home must not be under a temporary directory: Codex then refuses to create the
helper it runs sandboxed commands through, and every command fails to spawn.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from inferpath.config import EngineConfig
from inferpath.engine import AsyncEngine, LLMEngine
from inferpath.models import served_model_name
from inferpath.server.app import build_app
from inferpath.server.launch import ServerThread

ENABLED = os.environ.get("INFERPATH_AGENT_TESTS") == "1"
MODEL = os.environ.get("INFERPATH_AGENT_MODEL", "qwen2.5-coder-1.5b-instruct")
ATTEMPTS = int(os.environ.get("INFERPATH_AGENT_ATTEMPTS", "3"))
SAMPLING = json.loads(os.environ.get("INFERPATH_AGENT_SAMPLING", '{"temperature": 0.7, "top_p": 0.8, "top_k": 20}'))
TASK = "create a file hello.txt containing hi"
#: Seconds one agent run may take (its first turn is the long prefill).
AGENT_TIMEOUT = 1800

pytestmark = pytest.mark.skipif(not ENABLED, reason="real agents take minutes a turn on a CPU: "
                                "set INFERPATH_AGENT_TESTS=1 to run them")


@pytest.fixture(scope="module")
def server():
    # Claude Code's first prompt is ~18.8k tokens: the default 512 MiB of KV holds 9,360 of
    # the 1.5B model's (57,344 B a token in float32), 2 GiB about 37k
    engine = LLMEngine.from_model(MODEL, EngineConfig(max_model_len=32768, kv_cache_memory_bytes=2 * 1024**3))
    running = ServerThread(build_app(AsyncEngine(engine), served_model_name=served_name(),
                                       sampling_defaults=SAMPLING)).start(timeout=300)
    yield running
    running.stop()


def served_name() -> str:
    return served_model_name(MODEL)


def _file_text(workdir: Path) -> str | None:
    path = workdir / "hello.txt"
    return path.read_text() if path.exists() else None


@pytest.mark.skipif(shutil.which("codex") is None, reason="Codex CLI is not installed "
                    "(npm install -g @openai/codex)")
def test_codex_exec_runs_the_models_command_and_the_file_appears(server, tmp_path):
    home = Path.home() / ".cache" / "inferpath" / "agent-tests" / "codex-home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        f'model = "{served_name()}"\nmodel_provider = "local"\nmodel_context_window = 32768\n'
        '[model_providers.local]\nname = "local"\n'
        f'base_url = "{server.url}/v1"\nwire_api = "responses"\n'
        f"stream_idle_timeout_ms = {AGENT_TIMEOUT * 1000}\n"
        "request_max_retries = 0\nstream_max_retries = 0\n")
    outcomes = []
    for attempt in range(ATTEMPTS):
        workdir = tmp_path / f"try{attempt}"
        workdir.mkdir()
        run = subprocess.run(
            ["codex", "exec", "--json", "--skip-git-repo-check", "-s", "workspace-write", TASK],
            cwd=workdir, env={**os.environ, "CODEX_HOME": str(home)}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=AGENT_TIMEOUT)
        events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        items = [e["item"] for e in events if e.get("type") == "item.completed"]
        commands = [(i.get("command"), i.get("exit_code")) for i in items
                    if i.get("type") == "command_execution"]
        text = _file_text(workdir)
        outcomes.append({"rc": run.returncode, "commands": commands, "file": text,
                         "messages": [i.get("text", "")[:200] for i in items
                                      if i.get("type") == "agent_message"]})
        assert not any(e.get("type") in ("error", "turn.failed") for e in events), outcomes
        if text is not None and "hi" in text and any(code == 0 for _, code in commands):
            return
    pytest.fail(f"in {ATTEMPTS} tries Codex never ran a command that made hello.txt: {outcomes}")


@pytest.mark.skipif(shutil.which("claude") is None, reason="Claude Code is not installed "
                    "(npm install -g @anthropic-ai/claude-code)")
def test_claude_code_writes_the_file_through_a_tool(server, tmp_path):
    outcomes = []
    for attempt in range(ATTEMPTS):
        workdir = tmp_path / f"try{attempt}"
        workdir.mkdir()
        env = {**os.environ, "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "unused",
               "ANTHROPIC_MODEL": served_name(), "ANTHROPIC_SMALL_FAST_MODEL": served_name(),
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1024",  # its 32k default overflows the context
               "API_TIMEOUT_MS": str(AGENT_TIMEOUT * 1000),
               # its stream watchdog (300 s at least) ignores pings: a long prefill outlasts
               # it, and Claude Code then retries without streaming
               "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(AGENT_TIMEOUT * 1000),
               "CLAUDE_CONFIG_DIR": str(tmp_path / "claude-config")}
        run = subprocess.run(
            ["claude", "-p", TASK, "--output-format", "stream-json", "--verbose",
             "--permission-mode", "acceptEdits", "--allowedTools", "Write,Bash"],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=AGENT_TIMEOUT)
        events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        tool_uses = [block.get("name") for e in events if e.get("type") == "assistant"
                     for block in e.get("message", {}).get("content", [])
                     if block.get("type") == "tool_use"]
        text = _file_text(workdir)
        outcomes.append({"rc": run.returncode, "tool_uses": tool_uses, "file": text,
                         "stderr": run.stderr[-300:]})
        if text is not None and "hi" in text and tool_uses:
            return
    pytest.fail(f"in {ATTEMPTS} tries Claude Code never wrote hello.txt by a tool: {outcomes}")
