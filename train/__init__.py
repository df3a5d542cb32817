"""LoRA / QLoRA fine-tuning of the review simulator (train/sft.py)."""
