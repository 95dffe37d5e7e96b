"""The trainer service: datasets, training jobs, job events and checkpoints (LoRA adapters)."""
