"""The shared encoder (any Hugging Face encoder, or the offline tiny one), its tokenizer, the task heads, and the
multi-task model that runs a mixed batch through one encoder forward."""
