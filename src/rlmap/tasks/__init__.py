"""Embedded tasks, the tiny model and its tokenizer, the warm-start step, data loading."""
