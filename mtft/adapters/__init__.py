"""Parameter-efficient adapters and the fine-tuning methods: full, head-only, Shared-A Multi-LoRA."""
