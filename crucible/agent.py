"""The reference research agent: a scripted baseline that improves the system through the gateway only.

Loop, for each task of the benchmark: queue the initial system's validation evaluation → build a training set
from the task's training pool (questions seen in validation removed) → LoRA SFT job, following its
events and queueing the evaluation of each of its last checkpoints as it lands (the grader scores them while the job
trains on) → keep the best on validation → submit it → wait for the grade.
It stops searching when the budget left cannot cover another step, and submits what it has. It edits only
what the run's track allows: training needs data or trainer editable, else it submits the initial system.

With ``AgentConfig.loop = "tinker"`` the agent trains the same SFT data through Tinker's primitives instead of a recipe
job: its own loop of ``forward_backward`` (``cross_entropy`` on the answers' tokens) and ``optim_step`` with the
unmodified ``tinker`` SDK against the gateway's Tinker API, saving sampler weights (ordinary checkpoints of the run)
where a job would checkpoint (:meth:`BaselineAgent.train_with_primitives`).

On the evaluator track the agent builds an evaluator instead (:mod:`crucible.evaluator_agent`): a sample of the targets'
public items and an exact-match grader, piloted on the candidates and frozen.

A task whose system is a code harness (the terminal suite's) is improved through the harness instead, where the
harness is editable: the agent downloads the suite's harness archive, edits its system prompt (:func:`edit_harness`),
uploads the edited archive, evaluates it, and keeps whichever harness scores higher. Such a task's training pool has
no reference answers (its verifiers are the reference), so the agent trains nothing there.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any

import jinja2
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from crucible.evaluator_agent import evaluator_archive, sample_items
from crucible.sdk import CrucibleAPIError, CrucibleClient

DEFAULT_MAX_SEQ_LEN = 256  # the trainer's default recipe.max_seq_len (tokens)
FULL_LEARNING_RATE = 1e-5  # the agent's learning rate for full fine-tuning (LoRA: the recipe's default, 1e-3)
TRAINER_DEFAULTS = {"method": "sft", "adapter": "lora"}  # what the API documents for a recipe field left out
LONG_MAX_SEQ_LEN = 1024  # what the baseline asks for when it may choose (tokens)
PROMPT_OVERHEAD_BYTES = 64  # room for the chat template's tokens around the messages


def steps_of(recipe: dict[str, Any]) -> int:
    """The optimizer steps a job's recipe plans (``max_steps``; 1 when it has none, as a merge)."""
    return int(recipe.get("max_steps") or 1)


def prompt_bytes(messages: list[dict[str, str]]) -> int:
    """UTF-8 bytes of every message but the answer: an upper bound of its prompt's tokens without the chat template's
    (a BPE token is at least one byte)."""
    return sum(len(m["content"].encode()) for m in messages[:-1])


@dataclass
class AgentConfig:
    """What the baseline does: training-set size, recipe, which checkpoints to evaluate."""

    train_examples: int = 800
    recipe: dict[str, Any] = field(default_factory=lambda: {"method": "sft", "batch_size": 8, "max_steps": 100, "warmup_steps": 10, "checkpoint_every": 50})
    evaluate_last_checkpoints: int = 2
    validation_limit: int | None = None
    poll_s: float = 1.0
    # grade while the job trains (the initial system's evaluation, each late checkpoint's as it lands): less waiting where
    # the grader and the trainer have cores or GPUs of their own; off, each evaluation is waited for in turn (a small CPU
    # machine whose cores the trainer already uses finishes sooner)
    evaluate_while_training: bool = True
    # "job": a recipe job of the trainer; "tinker": the agent's own SFT loop through Tinker's primitives (the tinker SDK)
    loop: str = "job"
    # the evaluator track: public validation items per target its evaluator asks each candidate (fewer where the budget's calls are fewer)
    evaluator_items: int = 12

    @classmethod
    def for_steps(cls, steps: int, method: str = "sft", adapter: str = "lora") -> AgentConfig:
        """The default config with a training job of ``steps`` steps, checkpointed halfway and at the end, by
        ``method`` (``sft`` on the training pool's answers, ``dpo`` on pairs of a right and a wrong answer, ``grpo`` on the
        training pool's prompts with the suite's scorer as reward) with
        ``adapter`` (``lora`` or ``full``; a benchmark's lock wins over both)."""
        config = cls()
        config.recipe = {**config.recipe, "method": method, "max_steps": steps, "checkpoint_every": max(1, steps // 2)}
        if adapter != "lora":
            config.recipe["adapter"] = adapter
        return config


HARNESS_HINT = ("Work step by step: first look at the files you need (ls, head), then write the exact output the task asks for, "
                "to the exact path it names. Use non-interactive commands only. ")
"""What :func:`edit_harness` adds in front of the default terminal harness's system prompt."""


def edit_harness(archive: bytes, hint: str = HARNESS_HINT) -> bytes | None:
    """The terminal suite's default harness (``agent.py``, whose prompt starts ``SYSTEM = (``) with ``hint`` put in
    front of its system prompt, repacked; ``None`` when the archive is not that harness."""
    out, edited = io.BytesIO(), False
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as src, tarfile.open(fileobj=out, mode="w:gz") as dst:
        for member in src:
            data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name == "agent.py" and data is not None and b"SYSTEM = (" in data:
                data = data.replace(b"SYSTEM = (", b"SYSTEM = (" + json.dumps(hint).encode() + b"\n    ", 1)
                member.size, edited = len(data), True
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return out.getvalue() if edited else None


@dataclass
class TaskResult:
    task: str
    initial_validation: float
    best_model: str
    best_validation: float
    submission: dict[str, Any]
    best_harness: str | None = None


@dataclass
class AgentResult:
    """Per task what the agent found and submitted; the first task's fields at the top (one-task benchmarks)."""

    tasks: list[TaskResult]

    @property
    def initial_validation(self) -> float:
        return self.tasks[0].initial_validation

    @property
    def best_model(self) -> str:
        return self.tasks[0].best_model

    @property
    def best_validation(self) -> float:
        return self.tasks[0].best_validation

    @property
    def submission(self) -> dict[str, Any]:
        return self.tasks[0].submission


def _pct(x: float | None) -> str:
    return "…" if x is None else f"{100 * x:.1f}%"


def _usd(micros: int) -> str:
    return f"${micros / 1_000_000:.4f}"


class BaselineAgent:
    """Runs :class:`AgentConfig`'s loop for the run behind ``client``, printing one line per research step."""

    def __init__(self, client: CrucibleClient, config: AgentConfig | None = None, console: Console | None = None) -> None:
        self.client = client
        self.config = config or AgentConfig()
        self.console = console or Console()

    def step(self, message: str) -> None:
        self.console.print(f"[bold cyan]agent[/] {message}")

    def evaluate(self, model: str, harness: dict[str, Any] | None, label: str, task: str | None = None, harness_archive: str | None = None) -> float:
        """Validation score of ``model`` (with ``harness`` or the code harness ``harness_archive``) on ``task`` (a progress bar while it runs)."""
        return self.score(self.start_evaluation(model, harness, task, harness_archive), label)

    def start_evaluation(self, model: str, harness: dict[str, Any] | None = None, task: str | None = None,
                         harness_archive: str | None = None) -> dict[str, Any]:
        """Queue a validation evaluation of ``model`` and return it at once (its score is read by :meth:`score`)."""
        return self.client.create_evaluation(model, harness, limit=self.config.validation_limit, task=task, harness_archive=harness_archive)

    def score(self, ev: dict[str, Any], label: str) -> float:
        """Wait for evaluation ``ev`` (a progress bar of its items graded so far) and return its validation score."""
        with Progress(TextColumn(f"  evaluating {label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True) as bar:
            task = bar.add_task("eval", total=ev["items_total"], completed=ev["items_done"])
            ev = self.client.wait_evaluation(ev["id"], self.config.poll_s, on_poll=lambda e: bar.update(task, completed=e["items_done"]))
        if ev["status"] != "succeeded":
            raise RuntimeError(f"evaluation {ev['id']} {ev['status']}: {ev.get('error')}")
        if ev["score"] is None:  # an evaluator's pilot on candidates no development target orders
            self.step(f"validation {label}: no score (no pair of its candidates is ordered by a development target)")
            return 0.0
        trajectories = self.client.trajectories(ev["id"])
        wrong = [t for t in trajectories if t["score"] < 1.0][:1]
        if wrong and wrong[0].get("rollout"):
            rollout = wrong[0]["rollout"]
            example = f" (e.g. task {wrong[0]['item_id']}: {rollout['model_calls']} model calls{', ' + rollout['failure'] if rollout['failure'] else ''})"
        else:
            example = f" (e.g. {wrong[0]['question'][-40:]!r} → {wrong[0]['completion'][:20]!r}, expected {wrong[0]['expected']})" if wrong else ""
        self.step(f"validation {label}: {_pct(ev['score']['value'])} on n={ev['score']['n']}{example}")
        return float(ev["score"]["value"])

    def build_training_set(self, harness: dict[str, Any], validation_questions: set[str], task: str | None = None,
                           max_prompt_bytes: int | None = None, method: str = "sft") -> bytes:
        """Rows from the task's training pool, as ``method`` trains them: for ``sft`` chat rows (system
        prompt, the question as the harness renders it, answer); for ``dpo`` preference rows with that conversation
        as the prompt, the pool's answer chosen and another item's different answer rejected. Validation questions
        removed, and rows whose prompt is ``max_prompt_bytes`` bytes or more (:func:`prompt_bytes`) left out, so
        that truncation at the recipe's ``max_seq_len`` always leaves their answer to train on."""
        template = jinja2.Environment(autoescape=False).from_string(harness.get("user_template") or "{{ question }}")
        preference = method == "dpo"
        rows, offset, answers = [], 0, []
        while len(rows) < self.config.train_examples:
            batch = self.client.train_sample(offset=offset, limit=1000, task=task)
            if not batch:
                break
            offset += len(batch)
            for item in batch:
                if item["question"] in validation_questions:
                    continue
                messages = ([{"role": "system", "content": harness["system_prompt"]}] if harness.get("system_prompt") else [])
                messages += [{"role": "user", "content": template.render(question=item["question"])}, {"role": "assistant", "content": item["answer"]}]
                if max_prompt_bytes is not None and prompt_bytes(messages) >= max_prompt_bytes:
                    continue
                if not preference:
                    rows.append({"messages": messages})
                elif wrong := next((a for a in reversed(answers) if a != item["answer"]), None):
                    rows.append({"prompt": messages[:-1], "chosen": item["answer"], "rejected": wrong})
                answers.append(item["answer"])
        rows = rows[: self.config.train_examples]
        return "".join(json.dumps(r) + "\n" for r in rows).encode()

    def recipe_for(self, card: dict[str, Any]) -> dict[str, Any]:
        """The configured recipe as the run's policy lets it be sent: nothing if the trainer is not editable,
        else without the locked fields (the gateway sets them) and, with an allow list, only allowed fields. A job
        that will train every weight gets learning rate 1e-5 unless one is configured (full fine-tuning moves every
        weight: a smaller step)."""
        recipe = {k: v for k, v in self.config.recipe.items() if self._may_set(card, k)}
        if self.effective(card, "adapter") == "full" and "learning_rate" not in recipe and self._may_set(card, "learning_rate"):
            recipe["learning_rate"] = FULL_LEARNING_RATE
        return recipe

    def effective(self, card: dict[str, Any], key: str) -> Any:
        """The value recipe field ``key`` will have in the job: the benchmark's lock, else the configured value if the
        agent may send it, else the trainer's default."""
        if key in card["recipe"]["lock"]:
            return card["recipe"]["lock"][key]
        if key in self.config.recipe and self._may_set(card, key):
            return self.config.recipe[key]
        return TRAINER_DEFAULTS.get(key)

    @staticmethod
    def _may_set(card: dict[str, Any], key: str) -> bool:
        policy = card["recipe"]
        return "trainer" in card["editable"] and key not in policy["lock"] and (policy["allow"] == "all" or key in policy["allow"])

    def max_seq_len(self, card: dict[str, Any]) -> tuple[int, bool]:
        """``(max_seq_len the job will use, whether the agent may choose it)``: the lock, the configured value, or the
        trainer's default."""
        locked = card["recipe"]["lock"].get("max_seq_len")
        if locked is not None:
            return int(locked), False
        return int(self.config.recipe.get("max_seq_len", DEFAULT_MAX_SEQ_LEN)), self._may_set(card, "max_seq_len")

    def train(self, model: str, dataset_ids: list[str], recipe: dict[str, Any], on_checkpoint: Any = None) -> dict[str, Any]:
        """Run one training job to its end, streaming its events into a progress bar (no datasets: a ``grpo`` job on
        the training pool); ``on_checkpoint(checkpoint_id, step, recipe)`` is called as each checkpoint lands, while the job goes on."""
        job = self.client.create_training_job(model, dataset_ids, recipe)
        self.step(f"training job {job['id']} queued: {job['estimated_tokens']} tokens at most, recipe {job['recipe']}")
        seq = 0
        with Progress(TextColumn("  training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                      console=self.console, transient=True) as bar:
            task = bar.add_task("train", total=job["recipe"]["max_steps"], info="")
            while True:
                for ev in self.client.training_events(job["id"], after=seq):
                    seq = ev["seq"]
                    d = ev["data"]
                    if ev["type"] == "step":
                        reward = f"  reward {d['reward_mean']:.2f}" if "reward_mean" in d else ""
                        bar.update(task, completed=d["step"], info=f"loss {d['loss']:.3f}{reward}  {d['tokens_per_s']:.0f} tok/s")
                    elif ev["type"] in ("checkpoint", "started", "succeeded", "failed", "cancelled"):
                        bar.console.print(f"  [dim]{ev['message']}[/]")
                        if ev["type"] == "checkpoint" and on_checkpoint is not None:
                            on_checkpoint(d["checkpoint"], d["step"], job["recipe"])
                job = self.client.training_job(job["id"])
                if job["status"] in ("succeeded", "failed", "cancelled"):
                    break
                time.sleep(self.config.poll_s)
        self.step(f"training job {job['id']} {job['status']}: {job['steps_done']} steps, {job['trained_tokens']} tokens")
        return job

    def train_with_primitives(self, model: str, rows: list[dict[str, Any]], recipe: dict[str, Any], on_checkpoint: Any = None) -> dict[str, Any]:
        """SFT on ``rows`` (``messages`` rows) by the agent's own loop through Tinker's primitives: ``recipe``'s
        ``max_steps`` steps of ``batch_size`` rows (``forward_backward`` with ``cross_entropy``, the answer's tokens
        weighted 1 and the prompt's 0, then ``optim_step`` at ``learning_rate``), sampler weights saved every
        ``checkpoint_every`` steps and at the end (``on_checkpoint(checkpoint_id, step, recipe)`` as each lands). Returns
        the live model's training job, as :meth:`train` returns a recipe job."""
        import tinker
        from tinker import types

        steps, batch = int(recipe.get("max_steps", 100)), int(recipe.get("batch_size", 8))
        every, rate = int(recipe.get("checkpoint_every") or steps), float(recipe.get("learning_rate", 1e-3))
        plan = {**recipe, "max_steps": steps, "checkpoint_every": every}
        service = tinker.ServiceClient(api_key=f"tml-{self.client.key}", base_url=self.client.base_url)
        try:
            training = service.create_lora_training_client(base_model=model, rank=int(recipe.get("lora_r", 16)),
                                                           seed=int(recipe.get("seed", 0))).result()
            tokenizer = training.get_tokenizer()
            data = []
            def ids(messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
                return list(tokenizer(text, add_special_tokens=False)["input_ids"])

            for row in rows:
                prompt, full = ids(row["messages"][:-1], True), ids(row["messages"], False)
                data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                        loss_fn_inputs={"target_tokens": full[1:], "weights": [0.0] * (len(prompt) - 1) + [1.0] * (len(full) - len(prompt))}))
            self.step(f"live model {training.model_id}: {len(data)} examples, {steps} steps of {batch} through Tinker's primitives")
            for step in range(1, steps + 1):
                chunk = [data[(step * batch + i) % len(data)] for i in range(batch)]
                try:
                    loss = training.forward_backward(chunk, "cross_entropy")
                    training.optim_step(types.AdamParams(learning_rate=rate)).result()
                except tinker.APIStatusError as exc:  # the budget ran out (402): keep what was saved, if anything
                    problem = exc.body if isinstance(exc.body, dict) else {"status": exc.status_code, "detail": str(exc)}
                    if exc.status_code != 402 or not self.client.checkpoints(self._live_job()["id"]):
                        raise CrucibleAPIError(problem) from exc
                    self.step(f"budget exhausted at step {step}; keeping the weights saved so far")
                    break
                weight = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in chunk)
                self.console.print(f"  [dim]step {step}/{steps}: loss {loss.result().metrics['loss:sum'] / max(weight, 1):.3f}[/]")
                if step % every == 0 or step == steps:
                    training.save_weights_for_sampler(f"step-{step}").result()
                    if on_checkpoint is not None:
                        on_checkpoint(self.client.checkpoints(self._live_job()["id"])[-1]["id"], step, plan)
        except tinker.PermissionDeniedError as exc:  # the track or the benchmark's lock refuses the primitives
            raise CrucibleAPIError(exc.body if isinstance(exc.body, dict) else {"status": 403, "detail": str(exc)}) from exc
        finally:
            service.close("success").result()
        job = self._live_job()
        self.step(f"live model's job {job['id']}: {job['steps_done']} steps, {job['trained_tokens']} tokens")
        return {**job, "recipe": {**job["recipe"], **plan}}

    def _live_job(self) -> dict[str, Any]:
        """The run's newest training job of Tinker's primitives."""
        return [j for j in self.client.training_jobs() if j["recipe"]["method"] == "primitives"][-1]

    def run(self) -> AgentResult:
        c = self.client
        card = c.run()
        self.step(f"run {card['run_id']} on {card['benchmark']['name']} ({card['track']} track, tasks "
                  f"{', '.join(t['name'] for t in card['benchmark']['tasks'])}); budget left {_usd(card['budget']['remaining_usd_micros'])}, "
                  f"{card['seconds_left'] / 3600:.2f} h left")
        several = len(card["benchmark"]["tasks"]) > 1
        if card["track"] == "evaluator":
            results = [self.run_evaluator(card)]
        else:
            results = [self.run_task(t, card, t["name"] if several else None) for t in card["benchmark"]["tasks"]]
        budget = c.budget()
        self.step(f"done: spent {_usd(budget['spent_usd_micros'])} of {_usd(budget['budget_usd_micros'])}")
        return AgentResult(tasks=results)

    def run_evaluator(self, card: dict[str, Any]) -> TaskResult:
        """The evaluator track (:mod:`crucible.evaluator_agent`): build a sample-and-exact-match evaluator from the
        development targets' public validation items (a sealed target's items are as hidden as its scores), pilot it on
        the candidates (agreement with the development targets), freeze it."""
        c, bm = self.client, card["benchmark"]
        development = [t["name"] for t in bm["tasks"] if t.get("target") == "development"]
        for name in development:
            scores = {s["candidate"]: s["score"]["value"] if s["score"] else None for s in c.candidate_scores(task=name)}
            self.step(f"[{name}] development target: " + ", ".join(f"{k} {_pct(v)}" for k, v in scores.items()))
        budget = bm["evaluator"]
        per_target = max(1, min(self.config.evaluator_items, budget["calls"] // max(1, len(development))))
        items = sample_items(c, development, per_target)
        archive = c.upload_harness(evaluator_archive(items, budget["max_tokens"]), name="sample-evaluator")
        self.step(f"evaluator {archive['id']}: {len(items)} public items ({per_target} per target), exact match on the first number")
        pilot = self.evaluate(None, None, f"evaluator {archive['id']} on {len(bm['candidates'])} candidates (agreement with development targets)",  # type: ignore[arg-type]
                              "evaluator", harness_archive=archive["id"])
        sub = self.submit_and_wait(None, "[evaluator] ", "evaluator", harness_archive=archive["id"])  # type: ignore[arg-type]
        return TaskResult(task="evaluator", initial_validation=pilot, best_model="evaluator", best_validation=pilot, submission=sub,
                          best_harness=archive["id"])

    def improve_harness(self, base: str, archive_id: str, label: str, task: str | None) -> tuple[str, float] | None:
        """Download the code harness ``archive_id``, edit it (:func:`edit_harness`), upload and evaluate it: ``(new archive
        id, its validation score)``, or ``None`` when the archive is not one the agent knows how to edit."""
        edited = edit_harness(self.client.harness_archive(archive_id))
        if edited is None:
            self.step(f"{label}harness {archive_id} is not the terminal agent; leaving it as it is")
            return None
        uploaded = self.client.upload_harness(edited, name="terminal-agent-edited")
        self.step(f"{label}uploaded edited harness {uploaded['id']} ({uploaded['bytes']} bytes): a planning hint in its system prompt")
        return uploaded["id"], self.evaluate(base, None, f"{label}edited harness {uploaded['id']}", task, harness_archive=uploaded["id"])

    def run_code_harness_task(self, spec: dict[str, Any], card: dict[str, Any], task: str | None) -> TaskResult:
        """The loop on a task run by a code harness: evaluate the suite's harness, try an edited one if the harness is
        editable, submit the base model with the better harness."""
        base, archive = spec["initial_system"]["model"], spec["initial_system"]["harness_archive"]
        label = f"[{spec['name']}] " if task else ""
        best_harness, best = archive, self.evaluate(base, None, f"{label}initial system ({base}, harness {archive})", task)
        initial = best
        if "harness" in card["editable"]:
            try:
                tried = self.improve_harness(base, archive, label, task)
            except CrucibleAPIError as exc:
                if exc.status not in (402, 403):
                    raise
                self.step(f"{label}cannot try another harness ({exc.status} {exc.code}: {exc.problem.get('detail')})")
                tried = None
            if tried is not None and tried[1] > best:
                best_harness, best = tried
        self.step(f"{label}best on validation: harness {best_harness} at {_pct(best)} (initial {_pct(initial)}); submitting it")
        sub = self.submit_and_wait(base, label, task, harness_archive=best_harness if best_harness != archive else None)
        return TaskResult(task=spec["name"], initial_validation=initial, best_model=base, best_validation=best, submission=sub, best_harness=best_harness)

    def submit_and_wait(self, model: str, label: str, task: str | None, harness_archive: str | None = None) -> dict[str, Any]:
        """Submit ``model`` (with ``harness_archive``, if given) and wait for its grade."""
        sub = self.client.submit(model, note="baseline agent: best on validation", task=task, harness_archive=harness_archive)
        with Progress(TextColumn(f"  {label}grading on the hidden test split"), BarColumn(pulse_style="cyan"), TimeElapsedColumn(),
                      console=self.console, transient=True) as bar:
            bar.add_task("grade", total=None)
            sub = self.client.wait_submission(sub["id"], self.config.poll_s)
        self.step(f"{label}submission {sub['id']} {sub['status']}: hidden test {_pct(sub['score']['value'] if sub.get('score') else None)}")
        return sub

    def run_task(self, spec: dict[str, Any], card: dict[str, Any], task: str | None) -> TaskResult:
        """The loop on one task (``task`` is ``None`` for a one-task benchmark)."""
        c = self.client
        if spec["initial_system"].get("harness_archive"):
            return self.run_code_harness_task(spec, card, task)
        harness = spec["initial_system"]["harness"]
        base = spec["initial_system"]["model"]
        label = f"[{spec['name']}] " if task else ""
        initial_ev = self.start_evaluation(base, None, task)  # graded while the agent builds its data and the job trains
        overlap = self.config.evaluate_while_training
        initial = None if overlap else self.score(initial_ev, f"{label}initial system ({base})")
        job = None
        landed: list[tuple[dict[str, Any], str]] = []  # checkpoints' evaluations, started as each checkpoint lands

        def evaluate_on_landing(ckpt_id: str, step: int, recipe: dict[str, Any]) -> None:
            every, steps = recipe.get("checkpoint_every") or steps_of(recipe), steps_of(recipe)
            if step <= steps - every * self.config.evaluate_last_checkpoints:
                return  # not one of the last checkpoints
            try:
                landed.append((self.start_evaluation(ckpt_id, None, task), f"{label}checkpoint {ckpt_id} (step {step})"))
            except CrucibleAPIError as exc:
                if exc.status not in (402, 429):
                    raise
                self.step(f"{label}not evaluating {ckpt_id} now ({exc.status} {exc.code})")

        if {"data", "trainer"} & set(card["editable"]):
            validation_questions = {it["question"] for it in c.validation_items(task)}
            recipe = self.recipe_for(card)
            seq_len, choosable = self.max_seq_len(card)
            if choosable:  # long prompts (code): room for them, up to what a CPU trains in reasonable time
                seq_len = max(seq_len, LONG_MAX_SEQ_LEN)
                recipe["max_seq_len"] = seq_len
            method = self.effective(card, "method")
            if method == "grpo":  # the training pool's prompts, rewarded by the suite's scorer: nothing to upload
                self.step(f"{label}GRPO on the training pool's prompts, rewarded by the suite's own scorer")
                dataset_ids = []
            else:
                data = self.build_training_set(harness, validation_questions, task, max_prompt_bytes=seq_len - PROMPT_OVERHEAD_BYTES,
                                               method=method)
                ds = c.upload_dataset(data, f"baseline-{spec['name']}.jsonl")
                self.step(f"{label}uploaded dataset {ds['id']}: {ds['rows']} rows ({ds['bytes']} bytes), none of them a validation question")
                dataset_ids = [ds["id"]]
            try:
                if self.config.loop == "tinker" and method == "sft":
                    rows = [json.loads(line) for line in data.decode().splitlines()]
                    job = self.train_with_primitives(base, rows, recipe, on_checkpoint=evaluate_on_landing if overlap else None)
                else:
                    job = self.train(base, dataset_ids, recipe, on_checkpoint=evaluate_on_landing if overlap else None)
            except CrucibleAPIError as exc:
                if exc.status not in (402, 403):
                    raise
                self.step(f"{label}cannot train ({exc.status} {exc.code}: {exc.problem.get('detail')}); submitting the initial system")
        initial = self.score(initial_ev, f"{label}initial system ({base})") if initial is None else initial
        best_model, best = base, initial
        if job is not None:
            started = {ev["model"] for ev, _ in landed}
            for ckpt in c.checkpoints(job["id"])[-self.config.evaluate_last_checkpoints:]:
                if ckpt["id"] not in started:  # one that landed as the job ended, or was refused while it ran
                    try:
                        landed.append((self.start_evaluation(ckpt["id"], None, task), f"{label}checkpoint {ckpt['id']} (step {ckpt['step']})"))
                    except CrucibleAPIError as exc:
                        if exc.status != 402:
                            raise
                        self.step("budget exhausted; stopping the search")
                        break
            for ev, name in landed:
                score = self.score(ev, name)
                if score > best:
                    best_model, best = ev["model"], score
        self.step(f"{label}best on validation: {best_model} at {_pct(best)} (initial {_pct(initial)}); submitting it")
        sub = self.submit_and_wait(best_model, label, task)
        return TaskResult(task=spec["name"], initial_validation=initial, best_model=best_model, best_validation=best, submission=sub)
