"""A job's step loop on two processes (``trainer_service.distributed``), gloo on the CPU, on the test-only model
``tiny-smollm2``: DDP for a LoRA adapter and FSDP2 for full weights give the single-process loss curve for the same
global batch, bill the same tokens, write checkpoints a single process loads and answers from (and resumes); GRPO's
rewards are called in the launching process; a process killed mid-job is ``DeviceLost``, and the worker queues such a
job again and resumes it from its newest checkpoint with every token charged once.

Tolerance: the two processes' losses equal the single process's to 1e-3 relative (measured: 1e-4; the sum of two
shards' gradients rounds differently, and Adam's first steps magnify that in the weights, which stay within 1e-2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from trainer_service import worker
from trainer_service.config import TrainConfig
from trainer_service.distributed import DeviceLost, train
from trainer_service.methods import METHODS
from trainer_service.methods.grpo import GRPO
from trainer_service.metrics import StepMetrics
from trainer_service.schemas import parse_row
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import prepared_models, throwaway_databases
from tests.models import TINY_MODEL

pytestmark = pytest.mark.slow

# rows of unequal lengths, so the two processes' shards hold different numbers of supervised tokens
ROWS = [parse_row({"prompt": f"What is {a} + {a}?" + " Think." * (a % 4), "completion": str(2 * a) * (1 + a % 3)}, 1) for a in range(12)]
RTOL = 1e-3


@pytest.fixture(scope="module")
def base() -> Path:
    return prepared_models(TINY_MODEL) / TINY_MODEL


def config(**fields: Any) -> TrainConfig:
    return TrainConfig(**{"max_steps": 4, "batch_size": 4, "warmup_steps": 0, "max_seq_len": 64, "checkpoint_every": 2,
                          "learning_rate": 1e-2, "lr_scheduler_type": "constant", "bf16_autocast": False, **fields})


def run(base: Path, out: Path, cfg: TrainConfig, devices: int, **kwargs: Any) -> tuple[Any, list[StepMetrics], list[dict]]:
    """SFT on :data:`ROWS`: ``(result, step metrics, start events)``."""
    steps: list[StepMetrics] = []
    starts: list[dict] = []
    kwargs = {"on_step": steps.append, **kwargs}
    result = train(base, METHODS["sft"], ROWS, cfg, out, devices=devices, on_start=starts.append, **kwargs)
    return result, steps, starts


def rank_processes() -> list[psutil.Process]:
    """The processes running a job's ranks: the children of multiprocessing's fork server (itself this process's child)."""
    return [p for p in psutil.Process().children(recursive=True) if p.ppid() != os.getpid() and "forkserver" in " ".join(p.cmdline())]


def answer(model: Any, tokenizer: Any) -> tuple[torch.Tensor, list[int]]:
    """A checkpoint's answer: its next-token log-probabilities on a probe prompt and its greedy continuation."""
    ids = tokenizer("What is 3 + 3?", return_tensors="pt").input_ids
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6)[0, ids.shape[1]:].tolist()
    return logprobs, tokens


def assert_same_curve(one: list[StepMetrics], two: list[StepMetrics]) -> None:
    assert [m.step for m in two] == [m.step for m in one]
    assert [m.tokens for m in two] == [m.tokens for m in one]  # billed once, not once a process
    for a, b in zip(one, two, strict=True):
        assert b.loss == pytest.approx(a.loss, rel=RTOL), (a.step, a.loss, b.loss)


def test_ddp_lora_gives_the_single_process_curve_and_an_adapter_that_answers_alike(base: Path, tmp_path: Path) -> None:
    """Two processes asked to stop after their fourth step stop together, at a step of their own, with a checkpoint there;
    the launcher leaves this process's signal handlers as they were."""
    single, one, _ = run(base, tmp_path / "one", config(), 1)
    two: list[StepMetrics] = []
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    double, _, starts = run(base, tmp_path / "two", config(max_steps=500), 2, should_stop=lambda: len(two) >= 4, on_step=two.append)
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers  # a Celery worker's shutdown stays its own
    assert starts[0]["devices"] == 2 and starts[0]["parallelism"] == "ddp" and starts[0]["device"].startswith("2 × cpu")
    assert double.stopped and 4 <= double.steps_done < 500 and double.last_checkpoint.name == f"step-{double.steps_done}"
    assert_same_curve(one, two[:4])
    assert double.usage.training == sum(m.tokens for m in two)
    folder = tmp_path / "two" / "step-4"
    assert sorted(os.listdir(folder)) == sorted(os.listdir(single.last_checkpoint))
    tokenizer = AutoTokenizer.from_pretrained(base)
    answers = [answer(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), f).eval(), tokenizer)
               for f in (single.last_checkpoint, folder)]
    assert torch.allclose(answers[0][0], answers[1][0], atol=1e-2)
    assert answers[0][1] == answers[1][1]


def test_fsdp2_full_weights_give_the_single_process_curve_and_a_checkpoint_one_process_resumes(base: Path, tmp_path: Path) -> None:
    """Two processes write one whole checkpoint at step 2 (the tied ``lm_head`` saved once, the optimizer state keyed as
    one process keys it); one process resumes it to the uninterrupted run's steps 3 and 4."""
    cfg = config(adapter="full", learning_rate=1e-3)
    single, one, _ = run(base, tmp_path / "one", cfg, 1)
    sharded, two, starts = run(base, tmp_path / "two", config(adapter="full", learning_rate=1e-3, max_steps=2), 2)
    assert starts[0]["parallelism"] == "fsdp2" and sharded.last_checkpoint.name == "step-2"
    assert_same_curve(one[:2], two)
    whole = load_file(tmp_path / "one" / "step-2" / "model.safetensors")
    gathered = load_file(sharded.last_checkpoint / "model.safetensors")
    assert gathered.keys() == whole.keys()
    assert max(float((whole[k] - gathered[k]).abs().max()) for k in whole) < 1e-2
    state = torch.load(sharded.last_checkpoint / "training_state.pt", weights_only=True)
    assert sorted(state["optimizer"]["state"]) == state["optimizer"]["param_groups"][0]["params"] == list(range(len(state["optimizer"]["state"])))
    resumed, rest, _ = run(base, tmp_path / "two", cfg, 1, resume=sharded.last_checkpoint)
    assert [m.step for m in rest] == [3, 4]
    assert_same_curve(one[2:], rest)
    assert resumed.usage == single.usage  # steps 1-2 counted from the checkpoint, 3-4 by the resumed run
    tokenizer = AutoTokenizer.from_pretrained(base)
    answers = [answer(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), tokenizer)
               for folder in (single.last_checkpoint, resumed.last_checkpoint)]
    assert torch.allclose(answers[0][0], answers[1][0], atol=1e-2)
    assert answers[0][1] == answers[1][1]
    with pytest.raises(RuntimeError, match=r"^ValueError: resume state .* does not match"):  # raised in the processes: the job fails
        run(base, tmp_path / "three", config(adapter="full", batch_size=2), 2, resume=sharded.last_checkpoint)


class KillingReward:
    """GRPO's reward, called in the launching process: 1 for an even first token; at call ``kill_at`` it kills one of the
    job's processes (the one not waiting for this answer keeps on until the launcher stops it)."""

    def __init__(self, kill_at: int | None = None) -> None:
        self.calls = 0
        self.pids: set[int] = set()
        self.kill_at = kill_at

    def __call__(self, examples: list[Any], completions: list[list[int]]) -> list[float]:
        self.calls += 1
        self.pids.add(os.getpid())
        if self.calls == self.kill_at:
            os.kill(rank_processes()[-1].pid, signal.SIGKILL)
        return [float(bool(c) and c[0] % 2 == 0) for c in completions]


def test_grpo_rewards_are_called_in_the_worker_and_a_killed_process_is_a_lost_device(base: Path, tmp_path: Path) -> None:
    """GRPO on sharded full weights (sampling through the FSDP2 root, every process decoding until all are done) and on
    DDP; the rewards of both processes' rollouts are this process's calls; a process killed mid-job is ``DeviceLost``."""
    rows = [parse_row({"prompt": f"Count from {a} to {a + 3}.", "item_id": f"item-{a}"}, 1) for a in range(4)]
    sharded_reward, steps = KillingReward(), []
    train(base, GRPO(sharded_reward), rows, config(adapter="full", max_steps=2, batch_size=2, grpo_group_size=2, grpo_max_new_tokens=6),
          tmp_path / "full", devices=2, on_step=steps.append)
    assert [m.step for m in steps] == [1, 2] and sharded_reward.calls == 4 and all(m.decode_tokens > 0 for m in steps)
    assert (tmp_path / "full" / "step-2" / "model.safetensors").is_file()
    cfg = config(max_steps=6, batch_size=2, checkpoint_every=1, grpo_group_size=2, grpo_max_new_tokens=4)
    reward = KillingReward(kill_at=5)  # two calls a step (one a process): the third step's first call
    steps = []
    with pytest.raises(DeviceLost, match="lost"):
        train(base, GRPO(reward), rows, cfg, tmp_path / "lora", devices=2, on_step=steps.append)
    # this object, in this process, was called by both processes (the survivor's third-step call may come before it is stopped)
    assert reward.calls in (5, 6) and reward.pids == {os.getpid()}
    assert [m.step for m in steps] == [1, 2] and all(m.decode_tokens > 0 and m.prefill_tokens > 0 for m in steps)
    assert sorted(p.name for p in (tmp_path / "lora").glob("step-*")) == ["step-1", "step-2"]
    assert not rank_processes()  # the launcher stopped the survivor


def test_a_job_that_loses_a_device_is_queued_again_and_resumes_with_every_token_charged_once(tmp_path_factory: pytest.TempPathFactory,
                                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the trainer app and the worker on PostgreSQL with the real ledger: a deployment of two devices a job;
    one of a job's processes killed after its first checkpoint is stored; the job is queued again with a
    ``device_lost`` event, its next attempt resumes from its newest checkpoint and succeeds, charged exactly the tokens
    its steps trained (as estimated). A recipe asking for more devices than a worker has is a 422 naming ``recipe.devices``."""
    from tests.unit.trainer.test_datasets import jsonl, trainer_app

    rows = [{"prompt": f"What is {a} + {a}?", "completion": str(2 * a)} for a in range(12)]
    with (throwaway_databases(("trainer", "ledger"), "postgresql", tmp_path_factory.mktemp("db")) as urls,
          trainer_app(urls, tmp_path_factory.mktemp("data"), train_devices=2, train_recipe_devices=True) as trainer):
        ctx = trainer.new_run()
        ds = trainer.upload(ctx, jsonl(*rows)).json()
        refused = trainer.create_job(ctx, [ds["id"]], devices=3, max_seq_len=64)
        assert refused.status_code == 422 and refused.json()["field"] == "recipe.devices", refused.text
        job = trainer.create_job(ctx, [ds["id"]], max_steps=60, batch_size=4, checkpoint_every=2, max_seq_len=64, warmup_steps=0,
                                 lr_scheduler="constant").json()
        stored = worker._JobRun.on_checkpoint
        killed: list[int] = []

        def on_checkpoint(self: Any, step: int, path: Path) -> None:
            stored(self, step, path)
            if not killed:
                killed.append(step)
                os.kill(rank_processes()[-1].pid, signal.SIGKILL)

        monkeypatch.setattr(worker._JobRun, "on_checkpoint", on_checkpoint)
        worker.run_job(trainer.service, job["id"])
        events = trainer.call("GET", f"/internal/jobs/{job['id']}/events", ctx).json()["data"]
        lost = trainer.call("GET", f"/internal/jobs/{job['id']}", ctx).json()
        assert lost["status"] == "queued" and trainer.enqueued[-1] == job["id"]
        assert [e for e in events if e["type"] == "device_lost"], [e["type"] for e in events]
        assert any(e["type"] == "device" and e["data"]["devices"] == 2 for e in events)
        monkeypatch.undo()
        worker.run_job(trainer.service, job["id"])
        done = trainer.call("GET", f"/internal/jobs/{job['id']}", ctx).json()
        assert done["status"] == "succeeded", done["error"]
        events = trainer.call("GET", f"/internal/jobs/{job['id']}/events", ctx).json()["data"]
        resumed = [e["data"] for e in events if e["type"] == "resumed"]
        assert resumed and resumed[0]["step"] >= killed[0]
        balance, entries, holds = trainer.books(ctx)
        assert [h["status"] for h in holds] == ["settled"] and balance["held_usd_micros"] == 0
        charged = sum(e["quantity"] for e in entries if e["type"] == "charge" and e["kind"] == "training_tokens")
        assert charged == done["trained_tokens"] == done["estimated_tokens"] > 0


def test_a_jobs_processes_end_with_the_worker_that_launched_them(base: Path, tmp_path: Path) -> None:
    """A worker killed mid-job (SIGKILL: no clean-up runs) leaves no process of its job training on: they are the fork
    server's children, not the worker's, and each watches the worker."""
    script = tmp_path / "worker.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\n"
        "from trainer_service.config import TrainConfig\nfrom trainer_service.distributed import train\n"
        "from trainer_service.methods import METHODS\nfrom tests.unit.trainer.test_distributed import ROWS\n"
        "if __name__ == '__main__':\n"
        "    cfg = TrainConfig(max_steps=10**6, batch_size=4, warmup_steps=0, max_seq_len=64, checkpoint_every=10**6, bf16_autocast=False)\n"
        "    train(Path(sys.argv[1]), METHODS['sft'], ROWS, cfg, Path(sys.argv[2]), devices=2,\n"
        "          on_step=lambda m: m.step == 3 and print('training', flush=True))\n")
    root = Path(__file__).resolve().parents[3]
    worker = subprocess.Popen([sys.executable, str(script), str(base), str(tmp_path / "out")], stdout=subprocess.PIPE, text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert worker.stdout.readline().strip() == "training"
        ranks = [p for p in psutil.Process(worker.pid).children(recursive=True) if "forkserver" in " ".join(p.cmdline())]
        assert len(ranks) == 3  # the fork server and its two processes
    finally:
        worker.kill()
        worker.wait()
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert alive == [], [p.pid for p in alive]


def test_a_job_accepted_once_runs_on_what_its_worker_has_whatever_the_operator_changed() -> None:
    """At creation a recipe's ``devices`` is checked against the deployment's settings (422 naming it); a worker reads it
    without refusing, so a job queued before the operator lowered ``train_devices`` or stopped recipes choosing still runs,
    on at most what the worker has."""
    from trainer_service.estimate import job_devices

    from services.common.contracts import Recipe
    from services.common.errors import Unprocessable
    from services.common.settings import ServiceSettings

    asked = Recipe(devices=2, batch_size=4)
    assert job_devices(ServiceSettings(train_devices=2, train_recipe_devices=True), asked) == 2
    assert job_devices(ServiceSettings(train_devices=4), Recipe(batch_size=3)) == 3  # a device takes an example a step at least
    fewer = Recipe(devices=1, batch_size=4)
    assert job_devices(ServiceSettings(train_devices=2, train_recipe_devices=True), fewer) == 1
    for changed, recipe, runs_on in ((ServiceSettings(train_devices=2, train_recipe_devices=False), fewer, 1),  # choosing no longer allowed
                                     (ServiceSettings(train_devices=1, train_recipe_devices=True), asked, 1)):  # fewer devices now
        with pytest.raises(Unprocessable) as refused:
            job_devices(changed, recipe)
        assert refused.value.extra["field"] == "recipe.devices" and refused.value.extra["train_devices"] == changed.train_devices
        assert job_devices(changed, recipe, refuse=False) == runs_on
