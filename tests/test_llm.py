"""The offline LLM API and the AsyncEngine on SmolLM2-135M-Instruct.

References are our own second paths: a stream against the finished text, concurrent
async streams against the same prompts run by LLM.generate.
"""

import asyncio

import pytest

from inferpath import LLM, SamplingParams
from inferpath.engine import AsyncEngine, QueueFullError, RequestError
from inferpath.engine.async_engine import EngineDeadError

GREEDY = SamplingParams(max_tokens=6, temperature=0)
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Hi"]


@pytest.fixture(scope="module")
def llm():
    return LLM(num_kv_blocks=48, max_waiting_requests=4)


@pytest.fixture(scope="module")
def generated(llm):
    return llm.generate(PROMPTS, GREEDY)


def test_generate_returns_finished_outputs_in_prompt_order(llm, generated):
    assert [o.prompt for o in generated] == PROMPTS
    for output in generated:
        completion = output.outputs[0]
        assert output.finished and completion.finish_reason == "length"
        assert len(completion.token_ids) == 6
        assert completion.text == llm.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    assert llm.generate(PROMPTS[1], GREEDY)[0].outputs[0].token_ids == generated[1].outputs[0].token_ids


def test_chat_applies_the_template(llm):
    messages = [{"role": "user", "content": "Reply with one word: yes or no. Is the sky blue?"}]
    (output,) = llm.chat(messages, SamplingParams(max_tokens=16, temperature=0))
    assert output.prompt_token_ids == llm.tokenizer.encode_chat(messages)
    assert output.outputs[0].finish_reason == "stop" and output.outputs[0].text.strip()


@pytest.mark.parametrize("messages,named", [
    ("hi", "got str"), (5, "got int"), ([], "non-empty"), (["hi"], r"messages\[0\] must be a dict"),
    ([{"role": "user", "content": 5}], r"messages\[0\]\['content'\]"),
    ([[{"role": "user", "content": "a"}], [None]], r"messages\[0\] must be a dict"),
])
def test_chat_refuses_what_is_not_a_conversation(llm, messages, named):
    with pytest.raises(ValueError, match=named):
        llm.chat(messages)
    assert llm.engine.stats().num_waiting == 0


def test_stream_yields_the_same_text_piece_by_piece(llm, generated):
    pieces = list(llm.stream(PROMPTS[0], GREEDY))
    assert len(pieces) > 1
    assert "".join(pieces) == generated[0].outputs[0].text


def test_closing_a_stream_early_frees_its_blocks(llm):
    stream = llm.stream(PROMPTS[2], SamplingParams(max_tokens=40, temperature=0))
    next(stream)
    stream.close()
    assert llm.engine.stats().num_kv_blocks_used == 0


def test_async_streams_equal_offline_results(llm, generated):
    async def main():
        engine = AsyncEngine(llm.engine)
        await engine.start()
        try:
            async def follow(request_id, prompt):
                outputs = [o async for o in engine.add_request(request_id, prompt, GREEDY)]
                assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
                assert "".join(o.outputs[0].delta_text for o in outputs) == outputs[-1].outputs[0].text
                return outputs[-1]

            return await asyncio.gather(*(follow(f"a{i}", p) for i, p in enumerate(PROMPTS)))
        finally:
            await engine.shutdown()

    finals = asyncio.run(main())
    assert [o.outputs[0].token_ids for o in finals] == [o.outputs[0].token_ids for o in generated]


def test_async_abort_frees_blocks_and_ends_the_stream(llm):
    async def main():
        engine = AsyncEngine(llm.engine)
        await engine.start()
        try:
            stream = engine.add_request("long", PROMPTS[0], SamplingParams(max_tokens=200, temperature=0))
            first = await stream.__anext__()
            engine.abort("long")
            rest = [o async for o in stream]
            return first, rest
        finally:
            await engine.shutdown()

    first, rest = asyncio.run(main())
    assert not first.finished and rest[-1].finished
    assert rest[-1].outputs[0].finish_reason == "abort"
    assert llm.engine.stats().num_kv_blocks_used == 0


def test_async_errors_are_raised_at_once_and_the_loop_survives_a_failing_step(llm, generated):
    async def main():
        engine = AsyncEngine(llm.engine)
        await engine.start()
        try:
            with pytest.raises(RequestError, match="max_model_len"):
                engine.add_request("huge", [5] * 9000, GREEDY)
            with pytest.raises(QueueFullError, match="max_waiting_requests=4"):
                for i in range(5):
                    engine.add_request(f"q{i}", PROMPTS[2], GREEDY)
            for i in range(4):
                engine.abort(f"q{i}")
            while llm.engine.has_unfinished_requests():  # aborts take effect at the next step
                await asyncio.sleep(0.01)
            execute = llm.engine.runner.execute

            def broken(scheduled):
                if scheduled.is_empty:
                    return execute(scheduled)
                llm.engine.runner.execute = execute  # fail once
                raise RuntimeError("injected failure")

            llm.engine.runner.execute = broken
            with pytest.raises(EngineDeadError, match="injected failure"):
                async for _ in engine.add_request("doomed", PROMPTS[0], GREEDY):
                    pass
            return [o async for o in engine.add_request("after", PROMPTS[1], GREEDY)][-1]
        finally:
            await engine.shutdown()

    after = asyncio.run(main())
    assert after.outputs[0].token_ids == generated[1].outputs[0].token_ids
    assert llm.engine.stats().num_kv_blocks_used == 0 and not llm.engine.has_unfinished_requests()
