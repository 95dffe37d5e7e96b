"""The ``crucible`` command line (typer + rich): the embedded stack, the demo, operator admin, leaderboard."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from crucible.sdk import AdminClient, CrucibleAPIError, CrucibleClient

app = typer.Typer(help="Crucible: research agents improve an agent system under a budget; graded on a hidden split.", no_args_is_help=True)
admin_app = typer.Typer(help="Operator commands (admin key from the data directory or CRUCIBLE_ADMIN_KEY).", no_args_is_help=True)
dev_app = typer.Typer(help="Developer commands.", no_args_is_help=True)
app.add_typer(admin_app, name="admin")
app.add_typer(dev_app, name="dev")
console = Console(width=None if sys.stdout.isatty() else 140)

ROOT = Path(__file__).resolve().parent.parent
DEMO_BENCHMARK = ROOT / "benchmarks" / "chain-sum-demo.yaml"
DataDir = Annotated[Path, typer.Option(envvar="CRUCIBLE_DATA_DIR", help="Data directory of the embedded stack.")]
PortBase = Annotated[int, typer.Option(help="Gateway port; the ledger, trainer, inference and grader take the next four.")]
GatewayUrl = Annotated[str, typer.Option(envvar="CRUCIBLE_GATEWAY_URL", help="Gateway base URL.")]


ModelsFile = Annotated[Path | None, typer.Option(envvar="CRUCIBLE_MODELS_FILE", exists=True, dir_okay=False,
                                                 help="YAML file of base model cards (or built-in names) under `models:`, prepared besides the default.")]


def _prepare(data_dir: Path, models_file: Path | None = None, names: tuple[str, ...] = ()) -> float:
    """Prepare the default base model(s), the built-in ``names`` and the cards of ``models_file`` into the data
    directory's models folder (each once; cached): that folder is the registry every service reads."""
    from services.common.llms import DEFAULT_MODELS, ModelConflict, ModelPreparationError, parse_card, prepare_model, read_models_file

    start = time.monotonic()
    try:
        cards = {name: parse_card(name) for name in (*DEFAULT_MODELS, *names)}
        cards |= {card.name: card for card in (read_models_file(models_file) if models_file else [])}
        for card in cards.values():
            with console.status(f"preparing base model {card.name} ({card.source.kind}; once, then cached)"):
                path = prepare_model(card, data_dir / "models")
            console.print(f"[green]✓[/] base model {card.name} at {path}")
    except (ModelPreparationError, ModelConflict) as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    return time.monotonic() - start


def _start(data_dir: Path, port_base: int):  # noqa: ANN202
    from crucible.stack import PortTaken, Stack

    stack = Stack(data_dir, port_base)
    try:
        with console.status("starting services and workers"):
            stack.start(on_ready=lambda name: console.print(f"[green]✓[/] {name} ready"))
    except PortTaken as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    return stack


def _admin_key(data_dir: Path) -> str:
    from crucible.stack import admin_key

    return os.environ.get("CRUCIBLE_ADMIN_KEY") or admin_key(data_dir)


def _wait_forever(stack) -> None:  # noqa: ANN001
    """Keep the stack up until Ctrl-C or SIGTERM: a process that exits is restarted (with a back-off); one
    that keeps dying ends the whole stack, with its log's tail."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def exited(name: str, code: int, restarting: bool) -> None:
        verb = "restarting it" if restarting else "it keeps dying; giving up"
        console.print(f"[yellow]{name} exited with {code}; {verb}[/] (log: {stack.data_dir / 'logs' / (name + '.log')})")

    stack.supervise(on_exit=exited)
    try:
        while not stop.wait(1.0):
            failed = stack.failed()
            if failed:
                for name in failed:
                    console.print(f"[red]{name}[/]:\n{stack.log_tail(name)}")
                break
    except KeyboardInterrupt:
        pass


@app.command("prepare-model")
def prepare_model(names: Annotated[list[str] | None, typer.Argument(help="Built-in models to prepare besides the default.")] = None,
                  data_dir: DataDir = Path(".crucible"), models_file: ModelsFile = None) -> None:
    """Prepare base models into the data directory's models folder (once; cached): the default (SmolLM2), the built-in
    NAMES (e.g. gemma3-270m) and the models file's cards."""
    _prepare(data_dir, models_file, tuple(names or ()))


@app.command()
def up(data_dir: DataDir = Path(".crucible"), port_base: PortBase = 8000, models_file: ModelsFile = None) -> None:
    """Start every service and worker as local processes; Ctrl-C stops them all."""
    _prepare(data_dir, models_file)
    stack = _start(data_dir, port_base)
    console.print(f"gateway at {stack.gateway_url} (docs at {stack.gateway_url}/docs); admin key in {data_dir / 'secrets' / 'gateway.env'}. Ctrl-C stops.")
    try:
        _wait_forever(stack)
    finally:
        with console.status("stopping"):
            stack.stop()
        console.print("stopped")


@app.command()
def down(data_dir: DataDir = Path(".crucible")) -> None:
    """Stop the stack that `crucible up` (or `crucible demo`) started on DATA_DIR, from any shell: its starter first, then
    any of its processes still running."""
    from crucible.stack import stop_recorded

    with console.status("stopping"):
        stopped = stop_recorded(data_dir)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else f"no stack is running on {data_dir}")


class _PeakMemory:
    """Samples the summed RSS (bytes) of this process and its descendants once a second."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(1.0):
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def __enter__(self) -> _PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()


@app.command()
def demo(
    data_dir: DataDir = Path(".crucible"),
    port_base: PortBase = 8000,
    benchmark: Annotated[Path, typer.Option(help="Benchmark file.")] = DEMO_BENCHMARK,
    steps: Annotated[int, typer.Option(help="LoRA SFT steps of the baseline's training job.")] = 100,
    exit_after: Annotated[bool, typer.Option("--exit", help="Stop the stack when done instead of serving the leaderboard.")] = False,
    models_file: ModelsFile = None,
) -> None:
    """The main job: start the stack, run the baseline research agent on the demo benchmark, grade, rank."""
    from crucible.agent import AgentConfig, BaselineAgent

    t0 = time.monotonic()
    with _PeakMemory() as mem:
        _prepare(data_dir, models_file)
        stack = _start(data_dir, port_base)
        try:
            admin = AdminClient(stack.gateway_url, _admin_key(data_dir))
            doc = yaml.safe_load(benchmark.read_text())
            bm = admin.load_benchmark(doc)
            for warning in bm.get("warnings", []):
                console.print(f"[yellow]warning:[/] {warning}")
            with console.status("grading the initial system on the hidden test split (once per benchmark)"):
                baselines = admin.wait_baselines(bm["id"])
            for name, task in baselines["tasks"].items():
                initial = task["initial"]["value"] if task.get("initial") else None
                console.print(f"[green]✓[/] initial system's hidden-test score{'' if len(baselines['tasks']) == 1 else f' on {name}'}: "
                              f"{'failed' if initial is None else f'{100 * initial:.1f}%'} (n={task['test_items']})")
            setup_s = time.monotonic() - t0
            run = admin.create_run(bm["name"], "baseline")
            console.print(f"[green]✓[/] benchmark {bm['name']} ({bm['id']}); run {run['id']} for agent 'baseline' (key {run['key_prefix']}…, shown once)")
            agent = BaselineAgent(CrucibleClient(stack.gateway_url, run["api_key"]), AgentConfig.for_steps(steps), console)
            agent.run()
            _print_leaderboard(admin.leaderboard())
            report = admin.report(run["id"])
            print_report(report)
            total = time.monotonic() - t0
            console.print(f"wall time {total:.0f} s: setup (model, stack, initial test grading) {setup_s:.0f} s, the run {report['wall_s']:.0f} s, of which "
                          f"waiting on queues and grading {100 * report['waiting_and_grading_share']:.1f}%; "
                          f"peak memory (all processes) {mem.peak / 2**30:.2f} GiB")
            if not exit_after:
                console.print(f"leaderboard at {stack.gateway_url}/leaderboard — Ctrl-C stops every process")
                _wait_forever(stack)
        finally:
            with console.status("stopping"):
                stack.stop()
    console.print("stopped")


def _print_leaderboard(rows: list[dict[str, Any]]) -> None:
    table = Table(title="Crucible leaderboard (hidden test split)")
    for col in ("#", "benchmark", "agent", "status", "initial", "final", "95% CI", "model-free", "reference", "gap closed", "RSI-Index", "n", "val. evals",
                "spent USD", "hours", "contamination"):
        table.add_column(col, justify="right" if col not in ("benchmark", "agent", "status", "contamination") else "left")

    def pct(x: float | None) -> str:
        return "…" if x is None else f"{100 * x:.1f}%"

    def ci(x: list[float] | None) -> str:
        return "–" if not x else f"{100 * x[0]:.1f}–{100 * x[1]:.1f}%"

    def model_free(r: dict[str, Any]) -> str:
        if r.get("model_free_score") is None:
            return "…" if r["status"] in ("queued", "running") else "–"
        return pct(r["model_free_score"]) + (" ⚑" if r.get("model_free_above_initial") else "")

    def flag(r: dict[str, Any]) -> str:
        return "…" if r["contaminated"] is None else ("flagged" if r["contaminated"] else "clean")

    for r in rows:
        table.add_row(str(r["rank"] or "–"), r["benchmark"], r["agent_name"], r["status"], pct(r["initial_score"]), pct(r["final_score"]), ci(r["final_ci"]),
                      model_free(r), pct(r["reference_score"]), pct(r["gap_closed"]), pct(r["rsi_index"]), str(r["n"] or "–"), str(r["validation_evaluations"]),
                      f"{r['spent_usd']:.4f}", f"{r['elapsed_hours']:.2f}", flag(r))
        if len(r["tasks"]) > 1:
            for t in r["tasks"]:
                table.add_row("", f"  {t['task']}", "", t["status"], pct(t["initial_score"]), pct(t["final_score"]), ci(t["final_ci"]),
                              model_free(t), pct(t["reference_score"]), pct(t["gap_closed"]), "", str(t["n"] or "–"), "", "", "", flag(t))
    console.print(table)


@app.command()
def leaderboard(gateway: GatewayUrl = "http://127.0.0.1:8000") -> None:
    """Print the leaderboard table."""
    import httpx

    _print_leaderboard(httpx.get(f"{gateway}/v1/leaderboard", timeout=60).json()["data"])


def print_report(report: dict[str, Any]) -> None:
    """The run report as tables: time by activity with the waiting share, then the designs tried."""
    wall = report["wall_s"] or 1.0
    time_table = Table(title=f"Run {report['run_id']}: {wall:,.0f} s, {report['agent_calls']} agent calls, "
                             f"spent {report['spent_usd_micros'] / 1e6:.4f} of {report['budget_usd_micros'] / 1e6:.2f} USD")
    for col in ("activity", "share of the run", "exclusive s", "wall s", "busy s (job-seconds)", "count"):
        time_table.add_column(col, justify="left" if col == "activity" else "right")
    for t in report["time"]:
        time_table.add_row(t["activity"], f"{100 * t['exclusive_s'] / wall:.1f}%", f"{t['exclusive_s']:,.1f}", f"{t['wall_s']:,.1f}",
                           f"{t['busy_s']:,.1f}", str(t["count"]))
    time_table.add_row("waiting + grading", f"{100 * report['waiting_and_grading_share']:.1f}%", f"{report['waiting_and_grading_s']:,.1f}",
                       "", "", "", style="bold")
    console.print(time_table)
    tried = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in report["tried"].items())
    designs = Table(title=f"Designs tried: {tried}")
    for col in ("kind", "design", "uses", "val. evals", "best val. score", "cost USD"):
        designs.add_column(col, justify="left" if col in ("kind", "design") else "right")
    for d in report["designs"]:
        best = "–" if d["best_validation_score"] is None else f"{100 * d['best_validation_score']:.1f}%"
        designs.add_row(d["kind"], d["key"][:60], str(d["uses"]), str(d["evaluations"]), best, f"{d['cost_usd_micros'] / 1e6:.4f}")
    console.print(designs)


@app.command()
def report(api_key: Annotated[str | None, typer.Option(envvar="CRUCIBLE_API_KEY", help="The run's API key (its own report).")] = None,
           run_id: Annotated[str | None, typer.Option(help="Any run's report, with the operator's admin key (from the data directory).")] = None,
           gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible"),
           as_json: Annotated[bool, typer.Option("--json", help="Print the report's JSON instead of tables.")] = False) -> None:
    """Where a run's time and money went (training, evaluating, queued, final grading, the agent's own) and what it tried."""
    if (api_key is None) == (run_id is None):
        raise typer.BadParameter("give the run's --api-key, or --run-id with the admin key")
    try:
        doc = CrucibleClient(gateway, api_key).report() if api_key else _admin(gateway, data_dir).report(run_id)  # type: ignore[arg-type]
    except CrucibleAPIError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    if as_json:
        print(json.dumps(doc, indent=1))
    else:
        print_report(doc)


class AgentMethod(StrEnum):
    sft = "sft"
    dpo = "dpo"
    grpo = "grpo"
    tinker = "tinker"


class AgentAdapter(StrEnum):
    lora = "lora"
    full = "full"


LLM = "LLM agent (--llm)"


@app.command()
def agent(api_key: Annotated[str, typer.Option("--api-key", "--run-key", envvar="CRUCIBLE_API_KEY", help="The run's API key.")],
          gateway: GatewayUrl = "http://127.0.0.1:8000",
          steps: Annotated[int, typer.Option(help="Baseline: steps of its training job.")] = 100,
          method: Annotated[AgentMethod, typer.Option(help="Baseline: how it trains: sft on the training pool's answers, dpo on pairs "
                                                      "of a right and a wrong answer, grpo on the training pool's prompts rewarded by the "
                                                      "suite's scorer, or tinker: sft by its own loop through Tinker's primitives.")] = AgentMethod.sft,
          adapter: Annotated[AgentAdapter, typer.Option(help="Baseline: a LoRA adapter, or every weight (full fine-tuning).")] = AgentAdapter.lora,
          llm: Annotated[bool, typer.Option("--llm", help="Let a chat model decide, through the run's MCP tools, instead of the scripted baseline.",
                                            rich_help_panel=LLM)] = False,
          model: Annotated[str | None, typer.Option(help="The chat model's name at --base-url.", rich_help_panel=LLM)] = None,
          base_url: Annotated[str | None, typer.Option(envvar="OPENAI_BASE_URL", help="An OpenAI-compatible API (…/v1). Default: the gateway's "
                                                       "own inference, paid from the run's budget with the run's key.", rich_help_panel=LLM)] = None,
          llm_api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="The key of --base-url (not the run's key).",
                                                          rich_help_panel=LLM)] = None,
          max_steps: Annotated[int, typer.Option(min=0, help="Model turns at most.", rich_help_panel=LLM)] = 40,
          max_minutes: Annotated[float | None, typer.Option(min=0, help="The agent's wall-clock limit (default: the run's deadline).",
                                                            rich_help_panel=LLM)] = None,
          max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per model answer at most.", rich_help_panel=LLM)] = 1024,
          tools: Annotated[str | None, typer.Option(help="Comma-separated MCP tools to offer the model (default: all; fewer for a small "
                                                    "context).", rich_help_panel=LLM)] = None,
          temperature: Annotated[float | None, typer.Option(min=0, help="Sampling temperature (default: the API's).", rich_help_panel=LLM)] = None,
          wait: Annotated[bool, typer.Option(help="Wait (up to an hour) for the final submission's grade.", rich_help_panel=LLM)] = True) -> None:
    """Run a reference research agent against a running gateway: the scripted baseline, or with --llm a chat model's loop."""
    if llm:
        _llm_agent(api_key, gateway, model, base_url, llm_api_key, max_steps, max_minutes, max_tokens, tools, temperature, wait)
        return
    from crucible.agent import AgentConfig, BaselineAgent

    config = AgentConfig.for_steps(steps, "sft" if method == AgentMethod.tinker else method.value, adapter.value)
    config.loop = "tinker" if method == AgentMethod.tinker else "job"
    BaselineAgent(CrucibleClient(gateway, api_key), config, console).run()


def _llm_agent(run_key: str, gateway: str, model: str | None, base_url: str | None, llm_api_key: str | None, max_steps: int,
               max_minutes: float | None, max_tokens: int, tools: str | None, temperature: float | None, wait: bool) -> None:
    """``crucible agent --llm``: the chat model at ``base_url`` (default the gateway's own inference, with the run key) runs
    :class:`crucible.llm_agent.LLMAgent` on the run's MCP tools."""
    import asyncio

    from rich.markup import escape

    from crucible.llm_agent import LLMAgentConfig, LLMUnavailable, UnknownTools, openai_chat, run_llm_agent

    if not model:
        raise typer.BadParameter("--llm needs the chat model's name", param_hint="--model")
    if base_url is None:
        base_url, llm_api_key = f"{gateway.rstrip('/')}/v1", run_key
    chat = openai_chat(model, base_url, llm_api_key or "none", max_tokens=max_tokens, temperature=temperature)
    config = LLMAgentConfig(max_steps=max_steps, max_wall_s=None if max_minutes is None else max_minutes * 60,
                            tools=frozenset(t.strip() for t in tools.split(",") if t.strip()) if tools else None, grade_wait_s=3600.0 if wait else 0.0)
    console.print(f"[bold magenta]llm-agent[/] model {escape(model)} at {escape(base_url)}")
    try:
        result = asyncio.run(run_llm_agent(gateway, run_key, chat, config, console))
    except (LLMUnavailable, UnknownTools) as exc:
        console.print(f"[red]{escape(str(exc))}[/] (nothing submitted)")
        raise typer.Exit(1) from exc
    console.print(f"[bold magenta]llm-agent[/] done after {result.steps} turns and {len(result.calls)} tool calls: {escape(result.stop_reason)}")


@app.command()
def mcp(api_key: Annotated[str, typer.Option(envvar="CRUCIBLE_API_KEY", help="The run's API key.")],
        gateway: GatewayUrl = "http://127.0.0.1:8000") -> None:
    """Serve the run's API as MCP tools over stdio, for a coding agent (Claude Code, Codex) that launches this command.

    The tools call the gateway with the run's key (what HTTP refuses, they refuse); `path` arguments are this machine's files.
    The gateway serves the same tools over streamable HTTP at /mcp."""
    from gateway.mcp import stdio_server

    stdio_server(gateway, api_key).run("stdio")


def _admin(gateway: str, data_dir: Path) -> AdminClient:
    return AdminClient(gateway, _admin_key(data_dir))


@admin_app.command("load-benchmark")
def admin_load_benchmark(path: Path, wait: Annotated[bool, typer.Option(help="Wait until the benchmark's splits are built.")] = True,
                         gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """Load a benchmark YAML file. The gateway answers in seconds; the grader builds the tasks' splits in the background
    (minutes for a swe suite, whose hidden bugs are verified in the sandbox), then grades the baselines. Loading the same
    file again is safe (the same benchmark; nothing is built or graded twice), also after a timeout; another file under
    a loaded name is refused unless that benchmark failed. `crucible admin benchmarks` shows each one's status. Exits 1
    when the file is refused or the build fails."""
    admin = _admin(gateway, data_dir)
    try:
        with console.status("loading") as status:
            bm = admin.load_benchmark(yaml.safe_load(path.read_text()), wait=wait,
                                      on_poll=lambda b: status.update(f"building the splits of {b['name']} ({b['id']})"))
    except CrucibleAPIError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    console.print(f"benchmark {bm['name']} loaded as {bm['id']}: {bm['status']}"
                  + ("" if wait else " (follow it with `crucible admin benchmarks`)"))
    for warning in bm.get("warnings", []):
        console.print(f"[yellow]warning:[/] {warning}")


@admin_app.command("benchmarks")
def admin_benchmarks(gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """List the loaded benchmarks with their status: building (the grader builds their splits), ready (runs may be
    created), failed (why; fix the file and load it again)."""
    table = Table("benchmark", "id", "status", "tasks", "loaded", "error")
    for bm in _admin(gateway, data_dir).benchmarks():
        tasks = len(bm["spec"].get("tasks") or []) or 1
        status = {"ready": "[green]ready[/]", "failed": "[red]failed[/]"}.get(bm["status"], bm["status"])
        table.add_row(bm["name"], bm["id"], status, str(tasks), bm["created_at"][:19], bm.get("error") or "")
    console.print(table)


@admin_app.command("import-tasks")
def admin_import_tasks(path: Annotated[Path, typer.Argument(help="A folder: Harbor task folders (terminal), or instances.jsonl and repos/ (swe).")],
                       suite: Annotated[str, typer.Option(help="terminal or swe")],
                       name: Annotated[str, typer.Option(help="The collection's name; a benchmark's suite.splits.test.collection names it.")],
                       wait: Annotated[bool, typer.Option(help="Wait for the validation and print each task's verdict.")] = True,
                       gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """Import an operator's own tasks into the grader's test store, for a hidden test split no repository holds: each
    task is accepted once its oracle resolves it in the sandbox (and doing nothing does not). Exits 1 when a task is
    refused or the import fails."""
    import io
    import tarfile

    if not path.is_dir():
        console.print(f"[red]{path}: not a folder[/]")
        raise typer.Exit(1)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(path, arcname=path.resolve().name)
    admin = _admin(gateway, data_dir)
    try:
        collection = admin.import_tasks(name, suite, buf.getvalue())
        if wait:
            with console.status("validating") as status:
                collection = admin.wait_task_collection(name, on_poll=lambda c: status.update(
                    f"validating {name}: {c['accepted']} accepted, {c['refused']} refused, {c['pending']} to go"))
    except CrucibleAPIError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    table = Table(title=f"{collection['suite']} tasks of {name}")
    for col in ("task", "status", "why refused"):
        table.add_column(col)
    for task in collection["tasks"]:
        table.add_row(task["name"], task["status"], task["reason"] or "")
    console.print(table)
    console.print(f"{collection['accepted']} accepted, {collection['refused']} refused, {collection['pending']} pending; "
                  f"a benchmark draws its test split from the accepted ones with suite.splits.test.collection: {name}")
    if collection["refused"]:
        raise typer.Exit(1)


@admin_app.command("add-model")
def admin_add_model(card: Annotated[str, typer.Argument(help="A model card YAML file, or the name of a built-in model (gemma3-270m).")],
                    gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """Register a base model: inference prepares it into the models folder and serves it without a restart."""
    from services.common.llms import BUILTIN_CARDS

    path = Path(card)
    if path.is_file():
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        source = doc.get("source") if isinstance(doc, dict) else None
        if isinstance(source, dict) and "path" in source:  # a relative path is relative to the card's file, as in a models file
            source["path"] = str((path.resolve().parent / source["path"]).resolve())
    elif card in BUILTIN_CARDS:
        doc = BUILTIN_CARDS[card].model_dump(mode="json")
    else:
        console.print(f"[red]{card}: no such file, and no built-in model of this name[/] (built in: {', '.join(sorted(BUILTIN_CARDS))})")
        raise typer.Exit(1)
    try:
        with console.status(f"registering {doc.get('name') if isinstance(doc, dict) else card} (inference prepares it; minutes for a large GGUF)"):
            out = _admin(gateway, data_dir).add_model(doc)
    except CrucibleAPIError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    console.print(f"base model {out['name']} registered and served ({out['source']['kind']})")


@admin_app.command("models")
def admin_models(gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """List the served base models."""
    table = Table(title="base models")
    for col in ("name", "source", "context cap", "thinking", "chat template"):
        table.add_column(col)
    for m in _admin(gateway, data_dir).models():
        table.add_row(m["name"], m["source"]["kind"], str(m["context_tokens"] or "model's"), "yes" if m["thinking"] else "no",
                      "card's" if m["chat_template"] else "tokenizer's")
    console.print(table)


@admin_app.command("check-benchmark")
def admin_check_benchmark(path: Path, draw: Annotated[bool, typer.Option(
        "--draw", help="Also draw the splits of suites whose items are verified as drawn (swe: each candidate's tests run; minutes on a machine "
                       "that has not verified them yet)")] = False) -> None:
    """Check a benchmark YAML file locally (no server, no hidden seed), in seconds: the file, each task's suite params and
    split sizes, and what the operator should know of its splits: the task's item space, its public items, the share of
    natural test draws that are public (left out of the hidden split), and warnings (a task small enough to
    enumerate cannot keep its test split secret; see ``grader/splits.py``). A suite whose items are verified by running
    code as a split draws them (its ``slow_draws``: swe) has its splits drawn only with ``--draw``; loading the
    benchmark draws them."""
    from gateway.benchmarks import grading_spec, parse_benchmark
    from grader.splits import enumerable_warning, item_space, split_report
    from grader.suites import get_suite
    from services.common.errors import Unprocessable

    rows: list[tuple[str, ...]] = []
    warnings: list[str] = []
    notes: list[str] = []
    try:
        spec = parse_benchmark(yaml.safe_load(path.read_text(encoding="utf-8")))
        for task in spec.task_list():
            suite = get_suite(task.suite.name)
            suite.check_params(task.suite.params)
            grading = grading_spec(spec, task, "bm_check")
            if getattr(suite, "slow_draws", False) and not draw:
                space, splits = item_space(grading), grading.suite.splits
                sizes = splits.train.size + splits.validation.size + splits.test.size
                rows.append((grading.task, grading.suite.name, f"{'' if space.exact else '~'}{space.count}", str(sizes), "not drawn", "not drawn"))
                warnings += [w for w in [enumerable_warning(grading, space)] if w]
                notes.append(f"task {grading.task!r}: {grading.suite.name} verifies each item as a split draws it, so its splits are drawn when the "
                             "benchmark is loaded (check-benchmark --draw draws them here)")
                continue
            r = split_report(grading)
            rows.append((r.task, r.suite, f"{'' if r.item_space.exact else '~'}{r.item_space.count}", str(r.split_items), str(r.public_items),
                         f"{r.public_share_of_draws:.1%}"))
            warnings += r.warnings
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        console.print(Text.assemble(("✗ ", "red"), f"{path}: not a readable YAML file: {exc}"))
        raise typer.Exit(1) from None
    except Unprocessable as exc:
        field = exc.extra.get("field")
        detail = exc.detail if not field or exc.detail.startswith(field) else f"{field}: {exc.detail}"
        console.print(Text.assemble(("✗ ", "red"), f"{path}: {detail}"))
        raise typer.Exit(1) from None
    tasks = ", ".join(f"{t.name} ({t.suite.name})" for t in spec.task_list())
    console.print(f"[green]✓[/] {spec.name}: track {spec.track}, tasks {tasks}")
    table = Table("task", "suite", "distinct items", "split items", "public items", "public share of test draws")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    for note in notes:
        console.print(f"note: {note}")


@admin_app.command("benchmark-schema")
def admin_benchmark_schema() -> None:
    """Print the JSON schema of benchmark files."""
    from gateway.schemas import BenchmarkFile

    print(json.dumps(BenchmarkFile.model_json_schema(), indent=2))


@admin_app.command("create-run")
def admin_create_run(benchmark: str, agent_name: Annotated[str, typer.Option("--agent")], budget_usd: float | None = None, hours: float | None = None,
                     track: Annotated[str | None, typer.Option(help="Run on another track than the file's: data, trainer, harness or joint.")] = None,
                     gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """Create a run; prints its API key once."""
    overrides = {k: v for k, v in {"budget_usd": budget_usd, "wall_clock_hours": hours, "track": track}.items() if v is not None}
    try:
        run = _admin(gateway, data_dir).create_run(benchmark, agent_name, **overrides)
    except CrucibleAPIError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    console.print(f"run {run['id']} deadline {run['deadline_at']}\nAPI key (shown once): [bold]{run['api_key']}[/]")


@admin_app.command("runs")
def admin_runs(gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """List runs."""
    table = Table("run", "benchmark", "agent", "track", "budget USD", "deadline", "revoked")
    for r in _admin(gateway, data_dir).runs():
        table.add_row(r["id"], r["benchmark_id"], r["agent_name"], r["track"], f"{r['budget_usd_micros'] / 1e6:.2f}", r["deadline_at"], str(r["revoked"]))
    console.print(table)


@admin_app.command("revoke")
def admin_revoke(run_id: str, gateway: GatewayUrl = "http://127.0.0.1:8000", data_dir: DataDir = Path(".crucible")) -> None:
    """Revoke a run's API key (effective on its next request)."""
    _admin(gateway, data_dir).revoke(run_id)
    console.print(f"revoked the key of {run_id}")


@app.command()
def migrate(
    service: Annotated[list[str] | None, typer.Option("--service", "-s", help="Only this service (repeatable): gateway, ledger, trainer, inference, grader, teststore.")] = None,
    url: Annotated[str | None, typer.Option(help="Database URL to migrate instead of the configured one (needs exactly one --service).")] = None,
) -> None:
    """Apply every service's Alembic migrations (services also apply their own when they start).

    Each database URL comes from the same settings the service reads: ``CRUCIBLE_DATABASE_URL`` (one
    service's own database: name that service with ``--service``) or the SQLite file in
    ``CRUCIBLE_DATA_DIR``; the test store's from ``CRUCIBLE_GRADER_TEST_STORE_URL``.
    """
    from crucible.devtools import SERVICES, migrate_service

    chosen = service or list(SERVICES)
    unknown = [s for s in chosen if s not in SERVICES]
    if unknown:
        raise typer.BadParameter(f"unknown service {', '.join(unknown)}; choose from {', '.join(SERVICES)}", param_hint="--service")
    if (url and len(chosen) > 1) or (os.environ.get("CRUCIBLE_DATABASE_URL") and len([s for s in chosen if s != "teststore"]) > 1):
        raise typer.BadParameter("a database URL belongs to one service: name it with --service", param_hint="--service")
    from sqlalchemy.exc import ArgumentError, OperationalError

    for name in chosen:
        try:
            revision = migrate_service(name, url)
        except ArgumentError as exc:
            raise typer.BadParameter(f"not a database URL ({exc})", param_hint="--url or CRUCIBLE_DATABASE_URL") from None
        except OperationalError as exc:
            console.print(f"[red]✗[/] {name}: cannot reach its database: {str(exc.orig).strip()}")
            raise typer.Exit(1) from None
        console.print(f"[green]✓[/] {name}: at revision {revision}")


@dev_app.command("revision")
def dev_revision(service: str, message: str) -> None:
    """Autogenerate an Alembic revision for SERVICE (gateway|ledger|trainer|inference|grader|teststore)."""
    from crucible.devtools import autogenerate

    autogenerate(service, message, ROOT)
