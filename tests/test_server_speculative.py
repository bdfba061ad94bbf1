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
