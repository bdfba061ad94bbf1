"""Bounded JSON by default (issue 26), through the official openai client against a real
SmolLM2-135M server: ``chat.completions.parse`` with Pydantic models of float, int, str
and list fields, 20 prompts at ``max_tokens`` 160, every answer parsed with
``finish_reason`` ``stop`` (before the bounds, 3 of 3 city prompts ran a number for ~130
digits into ``length``); and a model pushed into a digit loop by ``logit_bias`` still
answers valid JSON whose numbers fit their types, with ``finish_reason`` ``stop``.
"""

from __future__ import annotations

import asyncio
import re

import pydantic
import pytest

from server_harness import MODEL, async_client, start_server, tokenize

from inferpath.structured.json_bounds import (
    MAX_EXPONENT_DIGITS,
    MAX_INTEGER_DIGITS,
    MAX_SIGNIFICANT_DIGITS,
)

MAX_TOKENS = 160


class City(pydantic.BaseModel):
    name: str
    country: str
    population_millions: float


class CityFacts(pydantic.BaseModel):
    name: str
    founded_year: int
    area_km2: float
    landmarks: list[str]


CITIES = ["Lyon", "Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Delhi", "Rome", "Quito", "Seoul",
          "Accra", "Lagos", "Dakar", "Hanoi", "Dublin", "Madrid", "Lisbon", "Nairobi", "Ottawa",
          "Vienna"]
PROMPTS = (
    [(City, f"Tell me about the city of {c}: its name, country and population in millions.")
     for c in CITIES[:10]]
    + [(CityFacts, f"Give facts about {c}: name, founding year, area and landmarks.")
       for c in CITIES[10:]])


@pytest.fixture(scope="module")
def server():
    running = start_server(max_num_seqs=32)
    yield running
    running.stop()


def parse_all(server, prompts, **kwargs):
    async def run_all():
        aclient = async_client(server)
        return await asyncio.gather(*(aclient.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": prompt}], response_format=model,
            temperature=0, max_tokens=MAX_TOKENS, **kwargs) for model, prompt in prompts))

    return asyncio.run(run_all())


def assert_numbers_fit_their_types(content: str, model: type[pydantic.BaseModel]) -> None:
    """Each number of the answer as written: an integer field's digits within 64 bits'
    19, a float field's significant digits within a double's 17, its exponent 3 digits."""
    for name, field in model.model_fields.items():
        match = re.search(rf'"{name}":(-?[0-9.eE+-]+)', content)
        if field.annotation not in (int, float):
            continue
        assert match, (name, content)
        mantissa, _, exponent = match.group(1).lower().partition("e")
        digits = mantissa.lstrip("-").replace(".", "")
        if field.annotation is int:
            assert len(digits) <= MAX_INTEGER_DIGITS, (name, content)
        else:
            assert len(digits.lstrip("0")) <= MAX_SIGNIFICANT_DIGITS, (name, content)
        assert len(exponent.lstrip("+-")) <= MAX_EXPONENT_DIGITS, (name, content)


def test_20_pydantic_answers_parse_and_stop_within_160_tokens(server):
    completions = parse_all(server, PROMPTS)
    for (model, prompt), completion in zip(PROMPTS, completions):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (prompt, choice.message.content)
        assert isinstance(choice.message.parsed, model)
        assert completion.usage.completion_tokens < MAX_TOKENS
        assert_numbers_fit_their_types(choice.message.content, model)
    assert len({c.choices[0].message.parsed.name for c in completions}) > 10  # really different


def test_a_model_forced_into_a_digit_loop_still_answers_bounded_json(server):
    """logit_bias +100 on every digit: the model writes digits wherever the grammar allows
    them (strings included). Numbers stop at their type's digits, looping strings close."""
    digit_ids = {tokenize(server, prompt=str(d), add_special_tokens=False)[0] for d in range(10)}
    assert len(digit_ids) == 10  # SmolLM2 writes each digit as its own token
    prompts = PROMPTS[:3] + PROMPTS[10:13]
    completions = parse_all(server, prompts, logit_bias={str(t): 100 for t in digit_ids})
    for (model, prompt), completion in zip(prompts, completions):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (prompt, choice.message.content)
        assert isinstance(choice.message.parsed, model)
        assert_numbers_fit_their_types(choice.message.content, model)
        assert re.search(r":\d{10}", choice.message.content)  # the bias really made digits
