"""The inference service: model registry (bases + checkpoints), engines, OpenAI-compatible chat completions."""
