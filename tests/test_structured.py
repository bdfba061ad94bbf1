"""Structured output and tool calls without a model: the grammar masks in the sampler, the
spec and schema rules, logit_bias validation, and the tool-call parsers and streamer.

The grammar compiler runs over SmolLM2's real tokenizer (llguidance over our byte-level
tokens); the reference for a mask is a direct check of each allowed token's bytes.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
import torch

from inferpath.models import resolve_model
from inferpath.sampling import Sampler, SamplingParams, SamplingRow
from inferpath.server.tool_stream import ToolCallStream
from inferpath.server.tools import parse_tool_calls, tool_call_grammar, FunctionDefinition
from inferpath.structured import GrammarError, StructuredOutput
from inferpath.structured.compiler import GrammarCompiler
from inferpath.structured.schema import close_objects
from inferpath.tokenizer import load_tokenizer
from inferpath.weights import load_checkpoint


@functools.cache
def compiler() -> tuple[GrammarCompiler, object]:
    checkpoint = load_checkpoint(resolve_model("smollm2-135m-instruct"), dtype=torch.float32)
    tokenizer = load_tokenizer(checkpoint.tokenizer_path)
    eos = frozenset(tokenizer.eos_token_ids) | frozenset(checkpoint.eos_token_ids)
    return GrammarCompiler(tokenizer, checkpoint.config.vocab_size, eos), tokenizer


def test_choice_mask_allows_exactly_the_prefixes_and_free_rows_are_untouched():
    grammars, tokenizer = compiler()
    spec = StructuredOutput.choice(["yes", "no"])
    vocab = grammars.vocab_size
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(0))
    constrained = SamplingRow(SamplingParams(temperature=0, structured=spec), [1], [],
                              grammar=grammars.new_matcher(spec))
    free = SamplingRow(SamplingParams(temperature=0), [1], [])
    out = Sampler(seed=0)(logits, [constrained, free])
    assert out.token_ids[1] == int(logits[1].argmax())  # the free row is untouched
    chosen = tokenizer.token_bytes(out.token_ids[0])
    assert chosen and (b"yes".startswith(chosen) or b"no".startswith(chosen))
    # the mask itself: every allowed token is a prefix of a choice, and each choice's
    # first-byte tokens are allowed
    from inferpath.structured.matcher import fill_bitmasks, apply_bitmasks
    masked = apply_bitmasks(logits, [0], fill_bitmasks([grammars.new_matcher(spec)]))
    allowed = torch.nonzero(masked[0] > float("-inf")).flatten().tolist()
    assert all(b"yes".startswith(tokenizer.token_bytes(t)) or b"no".startswith(tokenizer.token_bytes(t))
               for t in allowed)
    assert {tokenizer.encode_ordinary("y")[0], tokenizer.encode_ordinary("n")[0]} <= set(allowed)
    assert torch.equal(masked[1], logits[1])


def test_a_sequence_under_a_regex_grammar_matches_it_and_ends_in_eos():
    grammars, tokenizer = compiler()
    spec = StructuredOutput("regex", "[0-9]{2}-[a-c]{2}")
    matcher = grammars.new_matcher(spec)
    sampler = Sampler(seed=1)
    generator = torch.Generator().manual_seed(5)
    output: list[int] = []
    params = SamplingParams(temperature=1.0, seed=5, structured=spec)
    for _ in range(12):
        logits = torch.randn(1, grammars.vocab_size, generator=generator)
        (token,) = sampler(logits, [SamplingRow(params, [1], output, generator, grammar=matcher)]).token_ids
        if token in tokenizer.eos_token_ids or token == 2:
            break
        assert matcher.accept(token)
        output.append(token)
    else:
        pytest.fail("never reached EOS")
    assert re.fullmatch("[0-9]{2}-[a-c]{2}", tokenizer.decode(output))


@pytest.mark.parametrize("spec, needle", [
    (StructuredOutput.json_schema({"type": "object", "properties": {"a": {"type": "strng"}}}), "strng"),
    (StructuredOutput("regex", "(("), "unclosed"),
    (StructuredOutput("grammar", "start: undefined_rule"), "undefined_rule"),
])
def test_uncompilable_specs_raise_naming_the_problem(spec, needle):
    with pytest.raises(GrammarError, match=needle):
        compiler()[0].new_matcher(spec)


def test_spec_and_logit_bias_validation():
    with pytest.raises(GrammarError, match="non-empty list"):
        StructuredOutput.choice([])
    with pytest.raises(GrammarError, match="kind"):
        StructuredOutput("yaml", "x")
    with pytest.raises(ValueError, match="logit_bias value 101"):
        SamplingParams(logit_bias={3: 101})
    with pytest.raises(ValueError, match="logit_bias key -1"):
        SamplingParams(logit_bias={-1: 1})
    assert SamplingParams(logit_bias={"7": -100, 2: 5}).logit_bias == ((2, 5.0), (7, -100.0))


def test_logit_bias_moves_only_its_row():
    logits = torch.zeros(2, 10)
    logits[:, 3] = 5.0
    biased = SamplingRow(SamplingParams(temperature=0, logit_bias={3: -100, 8: 10}), [1], [])
    free = SamplingRow(SamplingParams(temperature=0), [1], [])
    assert Sampler(seed=0)(logits, [biased, free]).token_ids == [8, 3]
    assert logits[0, 3] == 5.0  # the caller's logits are not modified


def test_close_objects_closes_only_unopened_objects():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}},
                                               "b": {"type": "object", "properties": {},
                                                     "additionalProperties": True}}}
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["b"]["additionalProperties"] is True
    assert "additionalProperties" not in schema  # a copy


def test_hermes_and_llama3_parsers():
    content, calls = parse_tool_calls(
        'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>', "hermes")
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", {})]
    assert parse_tool_calls("plain answer", "hermes") == ("plain answer", [])
    broken = '<tool_call>\n{"name": "f", "argum'
    assert parse_tool_calls(broken, "hermes") == (broken, [])
    content, calls = parse_tool_calls('<|python_tag|>{"name": "f", "parameters": {"s": "a;b"}}; '
                                      '{"name": "g", "parameters": {}}', "llama3_json")
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("f", {"s": "a;b"}), ("g", {})]


def test_tool_stream_sends_content_then_call_fragments():
    stream = ToolCallStream("hermes")
    text = 'Sure.<tool_call>\n{"name": "f", "arguments": {"city": "Paris, France"}}\n</tool_call>'
    deltas = []
    for i in range(0, len(text), 3):
        deltas += stream.add(text[i:i + 3])
    content = "".join(d["content"] for d in deltas)
    assert content == "Sure."
    final, has_calls = stream.finish()
    assert has_calls
    assert final[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in final[1:])
    assert json.loads(arguments) == {"city": "Paris, France"}
    plain = ToolCallStream("hermes")
    sent = plain.add("a <tool") + plain.add("box> b")  # a false start is released
    sent += plain.finish()[0]
    assert "".join(d["content"] for d in sent) == "a <toolbox> b"


def test_tool_call_grammar_accepts_only_valid_calls():
    grammars, tokenizer = compiler()
    functions = [FunctionDefinition(name="add", parameters={
        "type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]})]
    spec = tool_call_grammar(functions, "hermes", parallel=False)
    good = '<tool_call>\n{"name":"add","arguments":{"a":1}}\n</tool_call>'
    bad = '<tool_call>\n{"name":"sub","arguments":{"a":1}}\n</tool_call>'
    for text, expected in ((good, True), (bad, False)):
        matcher = grammars.new_matcher(spec)
        accepted = all(matcher.accept(t) for t in tokenizer.encode_ordinary(text))
        assert accepted == expected, text


def test_live_stream_of_grammar_enforced_calls_sends_arguments_before_the_end():
    from inferpath.server.tool_stream import LiveHermesStream

    text = ('<tool_call>\n{"name":"f","arguments":{"city":"Paris, France","days":[1,2,3]}}\n'
            '</tool_call>\n<tool_call>\n{"name":"g","arguments":{}}\n</tool_call>')
    stream = LiveHermesStream()
    before_finish = []
    for i in range(0, len(text), 2):
        before_finish += stream.add(text[i:i + 2])
    after, has_calls = stream.finish()
    assert has_calls
    deltas = before_finish + after
    openings = [d["tool_calls"][0] for d in deltas if "id" in d["tool_calls"][0]]
    assert [(o["index"], o["function"]["name"]) for o in openings] == [(0, "f"), (1, "g")]
    arguments = {0: "", 1: ""}
    for d in deltas:
        call = d["tool_calls"][0]
        arguments[call["index"]] += call["function"]["arguments"]
    assert json.loads(arguments[0]) == {"city": "Paris, France", "days": [1, 2, 3]}
    assert json.loads(arguments[1]) == {}
    first_call_fragments = [d for d in before_finish if d["tool_calls"][0]["index"] == 0
                            and d["tool_calls"][0]["function"]["arguments"]]
    assert len(first_call_fragments) > 3  # streamed as written, not in one piece at the end


PERSON = {"type": "object", "required": ["name", "age", "tags", "home"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "home": {"type": "object", "required": ["city"],
                                  "properties": {"city": {"type": "string"}}}}}


def _adversarial_run(max_tokens: int | None, steps: int) -> bytes:
    """Greedy decoding whose 'model' always prefers the longest allowed token: inside a
    string it writes on forever and never closes anything by itself."""
    grammars, tokenizer = compiler()
    spec = StructuredOutput("json_schema", json.dumps(PERSON))
    matcher = grammars.new_matcher(spec)
    eos = sorted(tokenizer.eos_token_ids)
    lengths = torch.tensor([float(len(tokenizer.token_bytes(i))) if i < tokenizer.vocab_size else 0.0
                            for i in range(grammars.vocab_size)])
    lengths[eos] = -1.0  # never chooses to stop either
    sampler, output = Sampler(seed=0), []
    for _ in range(steps):
        row = SamplingRow(SamplingParams(temperature=0, max_tokens=max_tokens, structured=spec), [1], output,
                          eos_token_ids=eos, grammar=matcher)
        token = sampler(lengths.unsqueeze(0).clone(), [row]).token_ids[0]
        if token in eos:
            break
        assert matcher.accept(token)
        output.append(token)
    return b"".join(tokenizer.token_bytes(t) for t in output)


@pytest.mark.parametrize("max_tokens", [20, 23, 27, 34, 45])
def test_a_schema_answer_cut_by_max_tokens_still_parses_and_validates(max_tokens):
    import jsonschema

    free = _adversarial_run(None, max_tokens)  # the same 'model' without the budget check
    with pytest.raises(json.JSONDecodeError):
        json.loads(free)
    text = _adversarial_run(max_tokens, max_tokens)
    jsonschema.validate(json.loads(text), PERSON)


CITY = {"type": "object", "required": ["name", "population_millions", "founded", "districts"],
        "properties": {"name": {"type": "string"}, "population_millions": {"type": "number"},
                       "founded": {"type": "integer"},
                       "districts": {"type": "array", "items": {"type": "string"}}}}


def _digit_loving_run(schema: dict, steps: int, prefer: bytes = b"0123456789") -> bytes:
    """Greedy decoding whose 'model' always prefers a token made of ``prefer`` bytes (the
    digits: a model caught in a digit loop, as logit_bias on digits makes one), then the
    longest allowed one; it never chooses EOS. No max_tokens: only the JSON bounds can end
    its values."""
    grammars, tokenizer = compiler()
    spec = StructuredOutput("json_schema", json.dumps(schema))
    matcher = grammars.new_matcher(spec)
    eos = sorted(tokenizer.eos_token_ids)
    scores = []
    for i in range(grammars.vocab_size):
        data = tokenizer.token_bytes(i) if i < tokenizer.vocab_size else b""
        scores.append(100.0 + len(data) if data and all(b in prefer for b in data) else float(len(data)))
    logits = torch.tensor(scores)
    logits[eos] = -1.0
    sampler, output = Sampler(seed=0), []
    for _ in range(steps):
        row = SamplingRow(SamplingParams(temperature=0, max_tokens=None, structured=spec), [1],
                          output, eos_token_ids=eos, grammar=matcher)
        token = sampler(logits.unsqueeze(0).clone(), [row]).token_ids[0]
        if token in eos:
            return b"".join(tokenizer.token_bytes(t) for t in output)
        assert matcher.accept(token)
        output.append(token)
    raise AssertionError(f"no end after {steps} tokens: {b''.join(tokenizer.token_bytes(t) for t in output)!r}")


def test_a_digit_loop_yields_bounded_json_that_ends_by_itself():
    """Numbers stop at what their type holds (19 digits for an integer field, 17
    significant for a number field), strings and arrays that loop are closed: the answer
    is valid JSON and ends in EOS, with no max_tokens to close it."""
    import jsonschema

    from inferpath.structured.json_bounds import MAX_INTEGER_DIGITS, MAX_SIGNIFICANT_DIGITS

    for prefer in (b"0.", b"0"):  # zeros and dots loop too: 0.00000000, "....", "0000"
        jsonschema.validate(json.loads(_digit_loving_run(CITY, 400, prefer)), CITY)
    text = _digit_loving_run(CITY, 400, b"123456789")
    value = json.loads(text)
    jsonschema.validate(value, CITY)
    numbers = re.findall(rb'"(population_millions|founded)":(-?[0-9.eE+-]+)', text)
    assert len(numbers) == 2, text
    for field, number in numbers:
        digits = re.sub(rb"[^0-9]", b"", number.split(b"e")[0].split(b"E")[0]).lstrip(b"0")
        limit = MAX_INTEGER_DIGITS if field == b"founded" else MAX_SIGNIFICANT_DIGITS
        assert 0 < len(digits) <= limit, (field, number)
    assert len(str(value["founded"])) == MAX_INTEGER_DIGITS  # the loop ran to the bound
    assert len(value["name"]) < 40 and len(value["districts"]) == 1  # the string loop closed


def test_schema_bounds_are_kept_by_the_grammar():
    """maxLength, pattern and maxItems are the grammar's: a looping 'model' stops there."""
    schema = {"type": "object", "required": ["code", "tag", "items"],
              "properties": {"code": {"type": "string", "maxLength": 5},
                             "tag": {"type": "string", "pattern": "^[0-9]{2,4}$"},
                             "items": {"type": "array", "items": {"type": "integer", "maximum": 99},
                                       "maxItems": 3}}}
    value = json.loads(_digit_loving_run(schema, 200))
    assert len(value["code"]) <= 5 and re.fullmatch(r"[0-9]{2,4}", value["tag"])
    assert len(value["items"]) <= 3 and all(v <= 99 for v in value["items"])


def test_json_lexer_counts_digits_outside_strings_and_repeated_items():
    from inferpath.structured.json_bounds import JsonLexer, is_loop, numbers_in

    lexer = JsonLexer()
    lexer.feed(b'{"a":"12345678901234567890","b":[0.000')
    assert lexer.depth == 2 and not lexer.in_string and lexer.number.num_significant == 0
    (number,) = numbers_in(lexer, b"1234,")
    assert number.num_significant == 4 and number.num_digits == 8
    assert lexer.number.num_digits == 4  # the lexer itself did not move
    lexer.feed(b'1,"x",0,0,"x",["y"],"x"')
    assert lexer.repeats_an_item(b",") and lexer.repeats_an_item(b"]}")
    assert not lexer.repeats_an_item(b"y")  # still inside the item
    lexer.feed(b',["y"')
    assert not lexer.repeats_an_item(b"]")  # the inner array's item, seen once there
    assert not lexer.repeats_an_item(b"],")  # the outer array's ["y"]: a second time
    assert is_loop([7] * 24) and is_loop([1, 2, 3] * 8) and not is_loop([1, 2, 3] * 7 + [1, 2])
    assert is_loop(list(range(10)) * 3) and not is_loop(list(range(10)) * 2 + [0, 1, 2, 3])


def test_digits_past_the_integer_bound_fit_in_a_string_with_a_pattern():
    """A value that needs more digits than a 64-bit integer is a string with a pattern:
    the number bounds leave strings alone (a 30-digit run of distinct digits)."""
    grammars, tokenizer = compiler()
    schema = {"type": "object", "required": ["id"],
              "properties": {"id": {"type": "string", "pattern": "^[0-9]{1,40}$"}}}
    matcher = grammars.new_matcher(StructuredOutput("json_schema", json.dumps(schema)))
    digits = "314159265358979323846264338327"  # not periodic: no loop either
    for token in tokenizer.encode_ordinary('{"id":"' + digits[:-1]):
        assert matcher.accept(token)
    last = tokenizer.encode_ordinary(digits[-1])[0]
    assert matcher.steer(last, sorted(tokenizer.eos_token_ids)) == last
