"""Speculative decoding behind the HTTP server, read with the official ``openai`` client:
streamed greedy text with ngram drafts is the engine's text without them, and /metrics
counts drafts, drafted and accepted tokens under vLLM's names."""

from server_harness import MODEL, client, read_metrics, start_server

PROMPT = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


def test_streamed_text_and_spec_decode_metrics():
    srv = start_server(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    try:
        oai = client(srv)
        stream = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
                                        stream=True)
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        metrics = read_metrics(srv)
    finally:
        srv.stop()
    plain = start_server()
    try:
        expected = client(plain).completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                                    temperature=0).choices[0].text
    finally:
        plain.stop()
    assert text == expected
    assert metrics["inferpath:spec_decode_num_drafts_total"] > 0
    accepted = metrics["inferpath:spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted <= metrics["inferpath:spec_decode_num_draft_tokens_total"]
    assert metrics['inferpath:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] > 0


def test_suffix_decoding_drafts_an_answer_asked_before():
    """The same chat question twice through the server with suffix decoding: the second
    answer is drafted from the first one's cached output (most of its tokens accepted), and
    both answers are the same text."""
    srv = start_server(speculative_config={"method": "suffix", "num_speculative_tokens": 8})
    try:
        oai = client(srv)
        messages = [{"role": "user", "content": "Write a short poem about autumn leaves."}]
        accepted, texts = [], []
        for _ in range(2):
            before = read_metrics(srv)["inferpath:spec_decode_num_accepted_tokens_total"]
            answer = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, temperature=0)
            texts.append(answer.choices[0].message.content)
            accepted.append(read_metrics(srv)["inferpath:spec_decode_num_accepted_tokens_total"] - before)
    finally:
        srv.stop()
    assert texts[0] == texts[1] and texts[0]
    assert accepted[1] >= accepted[0] + 16  # measured 24 and 52 of 64 tokens
