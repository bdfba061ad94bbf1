"""Structured output speculates: drafts are cut to what the grammar allows, every drafted
position is masked by the grammar after the drafts before it, and the request's matcher
only ever sees the tokens the verifier emits.

The reference is a second path of our own: the same structured requests decoded without
drafts (greedy: token for token; sampled: every output still valid). Real SmolLM2-135M
weights; the drafters are ``ngram`` and ``draft_model`` (SmolLM2's first 10 layers).
"""

import json
import re

import pytest

from inferpath.sampling.params import SamplingParams
from inferpath.structured.spec import StructuredOutput

from test_speculative import DRAFT, NGRAM, PROMPTS, make_engine, parts, tokens  # noqa: F401

SCHEMA = {"type": "object", "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"type": "string"}}}
PEOPLE = [
    '{"name":"Ann","age":31,"city":"Paris"}\n{"name":"Ann","age":31,"city":"Paris"}\n',
    'Copy this record: {"name":"Bob Stone","age":47,"city":"Rome"} Copy: ',
    '{"name":"Eve","age":5,"city":"Oslo"} {"name":"Eve","age":5,',
    'JSON: {"name":"Li Wei","age":28,"city":"Shanghai"}\nAgain, the same JSON: ',
]
COLOURS = "(red|green|blue)( (red|green|blue)){3,8}"
STRUCTURED = [  # (prompt, spec): JSON schema, regex and choice rows
    *[(p, StructuredOutput.json_schema(SCHEMA)) for p in PEOPLE],
    ("red green blue red green blue red green blue red", StructuredOutput("regex", COLOURS)),
    ("Colours: blue blue red blue blue red blue", StructuredOutput("regex", COLOURS)),
    ("The quick brown fox jumps over the lazy dog. " * 3,
     StructuredOutput.choice(["The quick brown fox jumps over the lazy dog.", "The slow cat."])),
]


def greedy(spec, max_tokens=32):
    return SamplingParams(max_tokens=max_tokens, temperature=0, structured=spec)


def run_tagged(engine, requests):
    """Finished outputs by id for ``requests`` [(id, prompt, params)], and which ids had
    drafts verified."""
    drafted = set()
    schedule = engine.scheduler.schedule

    def watching():
        out = schedule()
        drafted.update(c.request.request_id for c in out.chunks if c.draft_token_ids)
        return out

    engine.scheduler.schedule = watching
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return finals, drafted


def check_valid(text, spec):
    if spec.kind == "json_schema":
        import jsonschema

        jsonschema.validate(json.loads(text), json.loads(spec.value))
    elif spec.kind == "regex":
        assert re.fullmatch(spec.value, text), text
    else:
        assert text in json.loads(spec.value), text


@pytest.fixture(scope="module")
def plain_structured(parts):
    requests = [(f"s{i}", p, greedy(spec)) for i, (p, spec) in enumerate(STRUCTURED)]
    finals, _ = run_tagged(make_engine(parts), requests)
    return {rid: finals[rid].outputs[0].token_ids for rid, _, _ in requests}


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft_model"])
def test_greedy_structured_with_drafts_equals_without_alone(parts, plain_structured, spec):
    engine = make_engine(parts, spec)
    for i, (prompt, structured) in enumerate(STRUCTURED):
        finals, drafted = run_tagged(engine, [(f"s{i}", prompt, greedy(structured))])
        out = finals[f"s{i}"].outputs[0]
        assert out.token_ids == plain_structured[f"s{i}"], (prompt, out.text)
        check_valid(out.text, structured)
    stats = engine.stats()
    # the grammar rows really speculated, with accepted and rejected drafts
    assert 0 < stats.num_spec_accepted_tokens < stats.num_spec_draft_tokens
    # ngram copies the prompt's JSON and words; the 10-layer draft is a weak one
    print(f"{spec['method']}: acceptance length {stats.mean_acceptance_length:.2f}")
    assert stats.mean_acceptance_length > (1.5 if spec is NGRAM else 1.0)
    assert stats.num_kv_blocks_used == 0


def test_greedy_structured_beside_plain_rows_in_one_batch(parts, plain_structured):
    from test_speculative import GREEDY

    plain_engine = make_engine(parts)
    free = [(f"f{i}", p, GREEDY) for i, p in enumerate(PROMPTS[:4])]
    plain_free, _ = run_tagged(plain_engine, free)
    engine = make_engine(parts, NGRAM)
    requests = [(f"s{i}", p, greedy(spec)) for i, (p, spec) in enumerate(STRUCTURED)] + free
    finals, drafted = run_tagged(engine, requests[:4] + requests[7:] + requests[4:7])
    for rid, _, _ in requests[:len(STRUCTURED)]:
        assert finals[rid].outputs[0].token_ids == plain_structured[rid]
    for rid, _, _ in free:
        assert finals[rid].outputs[0].token_ids == plain_free[rid].outputs[0].token_ids
    assert {"s0", "s1", "s4"} <= drafted and drafted & {rid for rid, _, _ in free}
    assert engine.stats().num_spec_accepted_tokens > 0


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft_model"])
def test_sampled_structured_rows_with_drafts_stay_valid(parts, spec):
    engine = make_engine(parts, spec, seed=0)
    requests = []
    for i, (prompt, structured) in enumerate(STRUCTURED):
        for n in range(2):
            params = SamplingParams(max_tokens=40, temperature=0.7, seed=10 * i + n,
                                    structured=structured)
            requests.append((f"s{i}.{n}", prompt, params))
    finals, drafted = run_tagged(engine, requests)
    for rid, prompt, params in requests:
        out = finals[rid].outputs[0]
        if out.finish_reason == "stop":
            check_valid(out.text, params.structured)
    assert sum(finals[rid].outputs[0].finish_reason == "stop" for rid, _, _ in requests) >= 10
    assert len(drafted) >= 4 and engine.stats().num_spec_accepted_tokens > 0


def test_drafts_are_cut_where_the_grammar_refuses_and_forks_leave_the_matcher(parts):
    from test_structured import compiler

    grammars, tokenizer = compiler()
    matcher = grammars.new_matcher(StructuredOutput("regex", "ab(cd)+e"))
    ids = [tokenizer.encode(c)[0] for c in "abcdcde"]
    eos = min(tokenizer.eos_token_ids)
    assert matcher.valid_prefix(ids) == 7
    assert matcher.valid_prefix(ids + [eos, ids[0]]) == 7  # nothing past the completing "e"
    assert matcher.valid_prefix(ids[:2] + [ids[0]] + ids[2:]) == 2  # "aba...": cut at the 2nd a
    forks = matcher.along(ids[:3])
    assert forks[0] is matcher and len(forks) == 4
    assert forks[3].valid_prefix(ids[3:]) == 4 and matcher.valid_prefix(ids[3:]) == 0
    with pytest.raises(ValueError, match="valid_prefix"):
        matcher.along([ids[1]])
