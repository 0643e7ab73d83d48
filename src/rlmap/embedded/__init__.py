"""The embedded default: a tiny model built from a config, its byte-level
tokenizer, and the supervised warm start that makes it able to answer."""
