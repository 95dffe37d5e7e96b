"""The trainer service: datasets, training jobs (methods in `methods/`, one loop in `training.py`), job events and checkpoints (LoRA adapters or full weights)."""
