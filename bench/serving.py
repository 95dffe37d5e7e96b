"""What the platform costs on top of its engine: evaluation throughput, the gateway's hop, a new checkpoint's first token.

    .venv/bin/python bench/serving.py [--items 64] [--max-tokens 64] [--repeats 3] [--calls 40] [--port-base 18400]

Boots the embedded stack (every service a real process, SQLite, the real model, the configured engine —
``CRUCIBLE_ENGINE``, default transformers) and measures, each against a baseline taken in the same run:

1. **Evaluation throughput.** A validation evaluation of ``--items`` chain-sum items (greedy, ``--max-tokens``) through
   the gateway → grader → inference → engine: new tokens per second from its creation to its end. Baseline: the same
   prompts (read back from its trajectories) through the engine's own batched generate in this process (transformers'
   ``model.generate`` on left-padded batches of the engine's batch size), same greedy decoding and limit. ``--repeats``
   rounds of the two, interleaved; the ratio of the medians. Target: platform ÷ raw >= 0.9.
2. **The gateway's hop.** p50 latency of a one-token chat completion through the gateway vs the same call straight to
   the inference service (the gateway's service token and a signed run context), ``--calls`` each, interleaved.
   Target: gateway ÷ direct <= 1.10.
3. **A new checkpoint's first token.** A one-step LoRA training job makes a checkpoint; then the time from sending a
   streamed chat completion on it to its first content chunk (adapter hot-load included), and the same on the base
   model. Target: <= 2 s on CPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crucible.sdk import AdminClient, CrucibleClient  # noqa: E402
from crucible.stack import Stack, admin_key, service_token  # noqa: E402
from tests.conftest import TEST_BENCHMARK, prepared_models  # noqa: E402

MODEL = "smollm2-135m-instruct"


def benchmark(items: int, max_tokens: int) -> dict:
    doc = copy.deepcopy(TEST_BENCHMARK)
    doc["name"] = "bench-platform"
    doc["suite"]["splits"]["validation"]["size"] = items
    doc["suite"]["params"].update({"min_terms": 3, "max_terms": 5})
    doc["evaluation"]["max_tokens"] = max_tokens
    doc["budget"]["usd"] = 1000
    return doc


def evaluation_throughput(client: CrucibleClient, max_tokens: int, batch: int, repeats: int) -> tuple[list[float], list[float], int]:
    """(platform tokens/s per repeat, raw tokens/s per repeat, items): ``repeats`` validation evaluations, each followed
    by the engine's own batched generate on the same prompts (interleaved, so a noisy neighbour hits both alike)."""
    import torch
    from inference_service.chat import ChatRenderer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = prepared_models() / MODEL
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    renderer = ChatRenderer(tokenizer)

    def raw(prompts: list[list[int]]) -> float:
        generated, start = 0, time.perf_counter()
        for i in range(0, len(prompts), batch):
            chunk = prompts[i : i + batch]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, p in enumerate(chunk):
                ids[row, width - len(p) :], mask[row, width - len(p) :] = torch.tensor(p), 1
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            for row in out[:, width:].tolist():
                generated += row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        return generated / (time.perf_counter() - start)

    platform, baseline, items = [], [], 0
    for _ in range(repeats):
        created = client.create_evaluation(MODEL)
        done = client.wait_evaluation(created["id"], poll_s=2)  # the time is the server's; polling would take CPU from the engine
        assert done["status"] == "succeeded", done
        trajectories = client.trajectories(created["id"])
        platform.append(sum(t["completion_tokens"] for t in trajectories) / (_time(done["finished_at"]) - _time(done["created_at"])))
        items = len(trajectories)
        baseline.append(raw([tokenizer(renderer.render(t["messages"]), add_special_tokens=False)["input_ids"] for t in trajectories]))
    return platform, baseline, items


def gateway_hop(stack: Stack, data_dir: Path, key: str, run_id: str, calls: int) -> tuple[float, float]:
    """p50 seconds of a one-token completion through the gateway and straight to inference (its typed client, with
    the gateway's service token and a signed run context, as the gateway calls it)."""
    from inference_service.client import InferenceClient

    from services.common.auth import RunContext
    from services.common.http import ServiceClient
    from services.common.openai_protocol import ChatCompletionRequest

    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 1, "temperature": 0}
    inference = InferenceClient(ServiceClient(f"http://127.0.0.1:{stack.port_base + 3}", service_token(data_dir, "gateway"), timeout_s=120))
    ctx = RunContext(run_id=run_id, task_id="bench-platform")
    through, direct = [], []
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"}) as http:
        for i in range(calls + 3):
            start = time.perf_counter()
            resp = http.post(f"{stack.gateway_url}/v1/chat/completions", json=body)
            if resp.status_code != 200:
                raise RuntimeError(f"gateway: {resp.status_code} {resp.text[:300]}")
            middle = time.perf_counter()
            inference.chat_completions(ctx, ChatCompletionRequest.model_validate(body))
            end = time.perf_counter()
            if i >= 3:  # warm-up calls left out
                through.append(middle - start)
                direct.append(end - middle)
    inference.close()
    return statistics.median(through), statistics.median(direct)


def first_token(stack: Stack, client: CrucibleClient, key: str) -> tuple[float, float]:
    """Seconds to the first streamed content chunk on a checkpoint never served before, and on the base model."""
    rows = "\n".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + {i}?"}, {"role": "assistant", "content": str(2 * i)}]})
                     for i in range(16))
    dataset = client.upload_dataset(rows.encode())
    job = client.create_training_job(MODEL, [dataset["id"]], {"max_steps": 1, "batch_size": 4, "lora_r": 16})
    while (job := client.training_job(job["id"]))["status"] not in ("succeeded", "failed", "cancelled"):
        time.sleep(1)
    assert job["status"] == "succeeded", job
    (ckpt,) = [c["id"] for c in client.checkpoints(job["id"])][-1:]

    def ttft(model: str) -> float:
        body = {"model": model, "messages": [{"role": "user", "content": "What is 7 + 8?"}], "max_tokens": 8, "temperature": 0, "stream": True}
        start = time.perf_counter()
        with httpx.Client(timeout=120) as http, http.stream("POST", f"{stack.gateway_url}/v1/chat/completions", json=body,
                                                            headers={"Authorization": f"Bearer {key}"}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"] and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    return time.perf_counter() - start
        raise RuntimeError("no content")

    return ttft(ckpt), ttft(MODEL)


def _time(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=64, help="validation items evaluated")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="the raw baseline's batch (the transformers engine's max_batch_size)")
    parser.add_argument("--repeats", type=int, default=3, help="evaluations (each followed by the raw baseline)")
    parser.add_argument("--calls", type=int, default=40, help="calls per side for the gateway's hop")
    parser.add_argument("--port-base", type=int, default=18400)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with tempfile.TemporaryDirectory(prefix="crucible-bench-") as tmp:
        data_dir = Path(tmp)
        (data_dir / "models").symlink_to(prepared_models(), target_is_directory=True)
        stack = Stack(data_dir, args.port_base)
        print("starting the embedded stack …", flush=True)
        stack.start(timeout_s=600)
        try:
            admin = AdminClient(stack.gateway_url, admin_key(data_dir))
            admin.load_benchmark(benchmark(args.items, args.max_tokens))
            run = admin.create_run("bench-platform", "bench", budget_usd=1000)
            client = CrucibleClient(stack.gateway_url, run["api_key"])
            through, direct = gateway_hop(stack, data_dir, run["api_key"], run["id"], args.calls)
            print(f"gateway hop: p50 {through * 1000:.1f} ms through the gateway, {direct * 1000:.1f} ms direct: {through / direct:.2f}× (target <= 1.10)")
            new, base = first_token(stack, client, run["api_key"])
            print(f"first token: {new:.2f} s on a new checkpoint (hot-load included), {base:.2f} s on the base model (target <= 2 s)")
            platform, raw, items = evaluation_throughput(client, args.max_tokens, args.batch, args.repeats)
            p, r = statistics.median(platform), statistics.median(raw)
            print(f"evaluation: {p:.1f} new tokens/s through the platform ({items} items; {', '.join(f'{x:.1f}' for x in platform)}), "
                  f"{r:.1f} raw batched generate ({', '.join(f'{x:.1f}' for x in raw)}): {p / r:.2f}× (medians of {args.repeats}; target >= 0.9)")
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
