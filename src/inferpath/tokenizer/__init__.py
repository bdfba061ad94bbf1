"""tokenizer."""
