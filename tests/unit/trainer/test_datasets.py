"""What the upload accepts, the trainer trains: dataset rows through the trainer app, on a real database.

The trainer app runs in-process (TestClient) on SQLite and on PostgreSQL, with the real ledger app behind it
(its own database) and SmolLM2's tokenizer (on the test-only tiny model, whose training steps take milliseconds).
Every kind of row the trainer cannot train is a 422 at upload naming its ``line`` and ``field``; a row whose answer is
cut away at ``max_seq_len`` is a 422 at job creation with nothing held or charged. A file written for OpenAI's
fine-tuning API (supervised, DPO and reinforcement rows) is a dataset as it is, read as the same rows as Crucible's own
spelling; what OpenAI's rows may hold that training cannot honour (tools, per-message weights) is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_service import service, worker
from trainer_service.app import create_app
from trainer_service.examples import IGNORE_INDEX, UntrainableRows, _render_pair, tokenize_examples
from trainer_service.models import Dataset
from trainer_service.schemas import MAX_COLUMNS_BYTES, ChatRow, PreferenceRow, PromptOnlyRow, parse_dataset, parse_row

from services.common.auth import RunContext, run_headers
from services.common.errors import Unprocessable
from services.common.http import ServiceClient
from services.common.ids import new_id
from services.common.settings import ServiceSettings
from services.ledger.app import create_app as create_ledger_app
from services.ledger.client import LedgerClient
from services.ledger.settings import LedgerSettings
from tests.conftest import prepared_models, throwaway_databases
from tests.models import TINY_MODEL

GATEWAY_TOKEN = "gateway-test-token"
TRAINER_TOKEN = "trainer-test-token"
MODEL = TINY_MODEL  # SmolLM2's tokenizer (what is counted and charged); a job's steps on it take milliseconds


def chat(*turns: tuple[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


def jsonl(*rows: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


GOOD = chat(("user", "What is 2 + 2?"), ("assistant", "4"))


def msg(role: str, content: Any) -> dict[str, Any]:
    return {"role": role, "content": content}


def openai_dpo(*prompt: dict[str, Any], preferred: str = "4", non_preferred: str = "5", **extra: Any) -> dict[str, Any]:
    """A DPO row as OpenAI's fine-tuning API spells it."""
    return {"input": {"messages": list(prompt)}, "preferred_output": [msg("assistant", preferred)],
            "non_preferred_output": [msg("assistant", non_preferred)], **extra}


OPENAI_DPO = openai_dpo(msg("developer", "Answer with the number only."), msg("user", "What is 2 + 2?"))
RFT = {"messages": [msg("developer", "Answer with the number only."), msg("user", "What is 2 + 2?")], "answer": "4", "tags": ["sum", 2]}
"""A reinforcement fine-tuning row as OpenAI spells it: the prompt, then the columns its grader reads."""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_urls(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``{"trainer": url, "ledger": url}``: two fresh databases of the backend."""
    with throwaway_databases(("trainer", "ledger"), request.param, tmp_path_factory.mktemp("trainer-db")) as urls:
        yield urls


@dataclass
class Trainer:
    """The trainer app (``http``, called as the gateway), its service object (``service``), the ledger app it
    holds budget on (``ledger``) and the jobs it sent to the workers (``enqueued``)."""

    http: TestClient
    service: service.Trainer
    ledger: TestClient
    enqueued: list[str]

    def new_run(self, budget_usd_micros: int = 1_000_000) -> RunContext:
        ctx = RunContext(run_id=new_id("run"), task_id=new_id("bm"))
        self.ledger.post("/internal/accounts", json={"account_id": ctx.run_id, "budget_usd_micros": budget_usd_micros}).raise_for_status()
        return ctx

    def call(self, method: str, path: str, ctx: RunContext, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {GATEWAY_TOKEN}", **run_headers(ctx, GATEWAY_TOKEN), **kw.pop("headers", {})}
        return self.http.request(method, path, headers=headers, **kw)

    def upload(self, ctx: RunContext, data: bytes) -> httpx.Response:
        return self.call("POST", "/internal/datasets", ctx, content=data, headers={"Content-Type": "application/jsonl"})

    def create_job(self, ctx: RunContext, datasets: list[str], **recipe: Any) -> httpx.Response:
        return self.call("POST", "/internal/jobs", ctx, json={"model": MODEL, "datasets": datasets, "recipe": {"max_steps": 2, "batch_size": 2, **recipe}})

    def books(self, ctx: RunContext) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """``(balance, entries, holds)`` of the run's ledger account."""
        balance = self.ledger.get(f"/internal/accounts/{ctx.run_id}").json()
        entries = self.ledger.get(f"/internal/accounts/{ctx.run_id}/entries").json()
        holds = self.ledger.get(f"/internal/accounts/{ctx.run_id}/holds").json()
        return balance, entries, holds


@contextmanager
def trainer_app(database_urls: dict[str, str], data_dir: Path, **settings: Any) -> Iterator[Trainer]:
    """The trainer app on ``database_urls`` with ``settings`` (``ServiceSettings`` fields), its calls to the ledger going to
    the ledger app in this process; jobs it sends to the workers are only recorded (run them with ``worker.run_job``)."""
    (data_dir / "models").symlink_to(prepared_models(MODEL), target_is_directory=True)
    ledger_app = create_ledger_app(LedgerSettings(database_url=database_urls["ledger"], service_token="ledger-test-token",
                                                  trusted_tokens={"trainer": TRAINER_TOKEN}))
    enqueued: list[str] = []
    with pytest.MonkeyPatch.context() as mp, TestClient(ledger_app, base_url="http://ledger", headers={"Authorization": f"Bearer {TRAINER_TOKEN}"}) as ledger:
        mp.setenv("CRUCIBLE_DATA_DIR", str(data_dir))
        settings_ = ServiceSettings(data_dir=data_dir, database_url=database_urls["trainer"], service_token=TRAINER_TOKEN,
                                    trusted_tokens={"gateway": GATEWAY_TOKEN}, **settings)
        with TestClient(create_app(settings_)) as http:
            trainer_ = http.app.state.trainer
            transport = ServiceClient("http://ledger", TRAINER_TOKEN, name="ledger")
            transport.client = ledger  # the trainer's calls go to the ledger app in this process
            trainer_.ledger.close()
            trainer_.ledger = LedgerClient(transport)
            trainer_.enqueue = enqueued.append  # the queue is the worker's side, not tested here
            yield Trainer(http=http, service=trainer_, ledger=ledger, enqueued=enqueued)


@pytest.fixture(scope="module")
def trainer(database_urls: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trainer]:
    with trainer_app(database_urls, tmp_path_factory.mktemp("trainer-data")) as trainer_:
        yield trainer_


def assert_refused(resp: httpx.Response, field: str, line: int | None) -> dict[str, Any]:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    problem = resp.json()
    assert (problem["field"], problem.get("line")) == (field, line), problem
    return problem


# --------------------------------------------------------------------------- upload


ACCEPTED = [
    ("messages", jsonl(GOOD, chat(("system", "Be brief."), ("user", "hi"), ("assistant", "yo"), ("user", "and?"), ("assistant", "done")))),
    ("messages", jsonl({"messages": [msg("developer", "Be brief."), msg("user", "hi"), {**msg("assistant", "yo"), "weight": 1}]}, GOOD)),  # OpenAI's
    ("prompt_completion", b'{"prompt": "a", "completion": "b"}\n\n{"prompt": "c", "completion": "d"}\n'),
    ("preference", b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n'
                   b'{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"}], "chosen": "b", "rejected": "c"}'),
    ("preference", jsonl(OPENAI_DPO, openai_dpo(msg("user", "hi"), msg("assistant", "yo"), msg("user", "and?"), preferred="done", non_preferred="no"))),
    ("preference", jsonl(OPENAI_DPO, {"prompt": "a", "chosen": "b", "rejected": "c"})),  # the two spellings of one format, mixed
    ("prompt_only", jsonl({"prompt": "What is 2 + 2?", "item_id": "item-1"}, {"prompt": [msg("user", "hi")], "item_id": "item-2"})),
    ("prompt_only", jsonl(RFT, {"messages": [msg("user", "What is 3 + 3?")]})),  # OpenAI's reinforcement rows, with and without columns
    ("prompt_only", jsonl({"prompt": "What is 2 + 2?", "answer": "4"}, {"messages": [msg("user", "x")], "item_id": "item-1", "answer": None})),
    ("prompt_completion", "\ufeff".encode() + b'{"prompt": "e", "completion": "f"}\r\n{"prompt": "g", "completion": "h"}\n'),  # a byte-order mark
]


@pytest.mark.parametrize(("fmt", "data"), [pytest.param(fmt, data, id=f"{fmt}-{i}") for i, (fmt, data) in enumerate(ACCEPTED)])
def test_every_format_is_accepted_in_crucibles_and_openais_spelling_and_counted(trainer: Trainer, fmt: str, data: bytes) -> None:
    ctx = trainer.new_run()
    resp = trainer.upload(ctx, data)
    assert resp.status_code == 201, resp.text
    assert (resp.json()["format"], resp.json()["rows"]) == (fmt, 2)


def test_openais_dpo_row_is_read_as_the_same_preference_row() -> None:
    """OpenAI's spelling becomes Crucible's at parse time (``developer`` read as ``system``): training, which reads
    ``prompt_messages()``, ``chosen`` and ``rejected``, sees one shape."""
    ours = parse_row({"prompt": [msg("system", "Answer with the number only."), msg("user", "What is 2 + 2?")], "chosen": "4", "rejected": "5"}, 1)
    theirs = parse_row(OPENAI_DPO, 1)
    assert type(theirs) is PreferenceRow and theirs.format == "preference"
    assert (theirs.prompt_messages(), theirs.chosen, theirs.rejected) == (ours.prompt_messages(), "4", "5")


def test_an_openai_dpo_dataset_is_a_dpo_job_estimated_as_its_crucible_spelling(trainer: Trainer) -> None:
    ctx = trainer.new_run()
    plain = {"prompt": [msg("system", "Answer with the number only."), msg("user", "What is 2 + 2?")], "chosen": "4", "rejected": "5"}
    estimates = []
    for row in (OPENAI_DPO, plain):
        ds = trainer.upload(ctx, jsonl(row, row)).json()
        resp = trainer.create_job(ctx, [ds["id"]], method="dpo")
        assert resp.status_code == 201, resp.text
        estimates.append(resp.json()["estimated_tokens"])
    assert estimates[0] == estimates[1] > 0


def test_a_reinforcement_row_is_a_prompt_and_the_columns_its_reward_reads() -> None:
    rft = parse_row(RFT, 1)
    assert isinstance(rft, PromptOnlyRow) and rft.format == "prompt_only"
    assert rft.prompt_messages() == [msg("system", "Answer with the number only."), msg("user", "What is 2 + 2?")]
    assert (rft.item_id, rft.reference()) == (None, {"answer": "4", "tags": ["sum", 2]})
    pooled = parse_row({"prompt": "What is 2 + 2?", "item_id": "item-1"}, 1)
    assert isinstance(pooled, PromptOnlyRow)
    assert (pooled.prompt_messages(), pooled.item_id, pooled.reference()) == ([msg("user", "What is 2 + 2?")], "item-1", {"item_id": "item-1"})
    # a column may be named like anything of the model's own: it stays a column
    odd = parse_row({"messages": [msg("user", "x")], "format": "csv", "prompt_messages": 1, "model_config": {}, "messages_": []}, 1)
    assert odd.format == "prompt_only" and odd.reference() == {"format": "csv", "prompt_messages": 1, "model_config": {}, "messages_": []}
    assert odd.prompt_messages() == [msg("user", "x")]


REFUSED_ROWS = [
    # the regression: an answer with nothing before it (accepted once, then job creation answered 500)
    ("assistant turn with nothing before it", chat(("assistant", "42")), "messages"),
    ("assistant turn after only another assistant turn", chat(("assistant", "hi"), ("assistant", "42")), "messages"),
    ("no assistant turn to supervise", chat(("system", "x")), "messages[0].role"),  # ending with the user's, a prompt-only row
    ("assistant turn not last", chat(("user", "x"), ("assistant", "y"), ("developer", "z")), "messages[2].role"),
    ("unknown role", chat(("robot", "x"), ("assistant", "y")), "messages[0].role"),
    ("tool role the trainer does not render", chat(("user", "x"), ("tool", "{}"), ("assistant", "y")), "messages[1].role"),
    ("content not a string", chat(("user", 5), ("assistant", "y")), "messages[0].content"),
    ("content as OpenAI parts", chat(("user", [{"type": "text", "text": "x"}]), ("assistant", "y")), "messages[0].content"),
    ("content null", chat(("user", "x"), ("assistant", None)), "messages[1].content"),
    ("empty answer", chat(("user", "x"), ("assistant", "")), "messages[1].content"),
    ("blank prompt", chat(("user", " \n\t"), ("assistant", "y")), "messages[0].content"),
    ("empty messages", {"messages": []}, "messages"),
    ("messages not a list", {"messages": "hi"}, "messages"),
    ("message not an object", {"messages": ["hi", {"role": "assistant", "content": "y"}]}, "messages[0]"),
    ("message without role", {"messages": [{"content": "x"}, {"role": "assistant", "content": "y"}]}, "messages[0].role"),
    ("unknown key in a message", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 0}]}, "messages[1].weight"),
    ("unknown key in a chat row", {**GOOD, "id": 7}, "id"),
    ("prompt/completion with empty completion", {"prompt": "a", "completion": ""}, "completion"),
    ("prompt/completion with empty prompt", {"prompt": "", "completion": "b"}, "prompt"),
    ("prompt/completion without completion", {"prompt": "a"}, "completion"),
    ("completion not a string", {"prompt": "a", "completion": 2}, "completion"),
    ("unknown key in a prompt/completion row", {"prompt": "a", "completion": "b", "label": 1}, "label"),
    ("chat and prompt keys in one row", {**GOOD, "prompt": "a"}, "prompt"),
    ("preference with chosen == rejected", {"prompt": "a", "chosen": "b", "rejected": "b"}, "rejected"),
    ("preference with empty chosen", {"prompt": "a", "chosen": "", "rejected": "b"}, "chosen"),
    ("preference without rejected", {"prompt": "a", "chosen": "b"}, "rejected"),
    ("preference with a completion key too", {"prompt": "a", "chosen": "b", "rejected": "c", "completion": "d"}, "completion"),
    ("preference prompt neither text nor messages", {"prompt": 5, "chosen": "b", "rejected": "c"}, "prompt"),
    ("preference conversation ending with the system", {"prompt": [{"role": "system", "content": "s"}], "chosen": "b", "rejected": "c"},
     "prompt[0].role"),
    ("preference conversation with an empty message", {"prompt": [{"role": "user", "content": " "}], "chosen": "b", "rejected": "c"},
     "prompt[0].content"),
    ("preference conversation empty", {"prompt": [], "chosen": "b", "rejected": "c"}, "prompt"),
    ("weight on an earlier assistant turn", {"messages": [msg("user", "x"), {**msg("assistant", "y"), "weight": 1}, msg("user", "z"),
                                                          msg("assistant", "w")]}, "messages[1].weight"),
    ("weight on a user turn", {"messages": [{**msg("user", "x"), "weight": 1}, msg("assistant", "y")]}, "messages[0].weight"),
    ("weight not a number", {"messages": [msg("user", "x"), {**msg("assistant", "y"), "weight": "1"}]}, "messages[1].weight"),
    ("tool calls in a chat row", {"messages": [msg("user", "x"), {**msg("assistant", "y"), "tool_calls": []}]}, "messages[1].tool_calls"),
    ("tools in a chat row", {**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("functions in a chat row", {**GOOD, "functions": [{"name": "f"}]}, "functions"),
    ("parallel_tool_calls in a chat row", {**GOOD, "parallel_tool_calls": False}, "parallel_tool_calls"),
    # OpenAI's DPO rows
    ("OpenAI DPO with tools", {**OPENAI_DPO, "input": {**OPENAI_DPO["input"], "tools": []}}, "input.tools"),
    ("OpenAI DPO with parallel_tool_calls", {**OPENAI_DPO, "input": {**OPENAI_DPO["input"], "parallel_tool_calls": True}}, "input.parallel_tool_calls"),
    ("OpenAI DPO with an unknown input key", {**OPENAI_DPO, "input": {**OPENAI_DPO["input"], "model": "x"}}, "input.model"),
    ("OpenAI DPO with tools beside input", {**OPENAI_DPO, "tools": []}, "tools"),
    ("OpenAI DPO with two preferred answers", {**OPENAI_DPO, "preferred_output": [msg("assistant", "4"), msg("assistant", "four")]},
     "preferred_output"),
    ("OpenAI DPO with no non-preferred answer", {**OPENAI_DPO, "non_preferred_output": []}, "non_preferred_output"),
    ("OpenAI DPO without non_preferred_output", {"input": OPENAI_DPO["input"], "preferred_output": OPENAI_DPO["preferred_output"]},
     "non_preferred_output"),
    ("OpenAI DPO with a user answer", {**OPENAI_DPO, "preferred_output": [msg("user", "4")]}, "preferred_output[0].role"),
    ("OpenAI DPO with a weighted answer", {**OPENAI_DPO, "preferred_output": [{**msg("assistant", "4"), "weight": 1}]}, "preferred_output[0].weight"),
    ("OpenAI DPO with the same answers", openai_dpo(msg("user", "x"), preferred="4", non_preferred="4"), "non_preferred_output[0].content"),
    ("OpenAI DPO prompt ending with the assistant", openai_dpo(msg("user", "x"), msg("assistant", "y")), "input.messages[1].role"),
    ("OpenAI DPO prompt empty", openai_dpo(), "input.messages"),
    ("OpenAI DPO with an empty answer", openai_dpo(msg("user", "x"), preferred=" "), "preferred_output[0].content"),
    ("input alone", {"input": {"messages": [msg("user", "x")]}}, "preferred_output"),
    ("both preference spellings in one row", {"prompt": "a", "chosen": "b", "rejected": "c", "preferred_output": []}, "preferred_output"),
    # prompt-only and OpenAI's reinforcement rows
    ("reinforcement row with tools", {**RFT, "tools": []}, "tools"),
    ("reinforcement row with functions", {**RFT, "functions": []}, "functions"),
    ("reinforcement row with parallel_tool_calls", {**RFT, "parallel_tool_calls": True}, "parallel_tool_calls"),
    ("reinforcement row with a completion", {**RFT, "completion": "4"}, "completion"),
    ("reinforcement prompt ending with the system", {"messages": [msg("system", "x")], "answer": "4"}, "messages[0].role"),
    ("reinforcement prompt with a weight", {"messages": [{**msg("user", "x"), "weight": 1}], "answer": "4"}, "messages[0].weight"),
    ("reinforcement prompt with an empty message", {"messages": [msg("user", "x"), msg("user", "")]}, "messages[1].content"),
    ("prompt given twice", {**RFT, "prompt": "What is 2 + 2?"}, "messages"),
    ("prompt-only row without a prompt", {"item_id": "item-1"}, "prompt"),
    ("prompt null", {"prompt": None, "messages": [msg("user", "x")], "answer": "4"}, "prompt"),
    ("item_id null", {"prompt": "a", "item_id": None}, "item_id"),
    ("item_id not a string", {"prompt": "a", "item_id": 7}, "item_id"),
    ("item_id too long", {"prompt": "a", "item_id": "i" * 201}, "item_id"),
    ("item_id blank", {"prompt": "a", "item_id": " "}, "item_id"),
    ("prompt-only conversation ending with the assistant", {"prompt": [msg("user", "x"), msg("assistant", "y")], "item_id": "i"},
     "prompt[1].role"),
    ("columns over 64 KiB", {**RFT, "small": "x" * 100, "big": "x" * MAX_COLUMNS_BYTES}, "big"),
    ("no format's keys", {"text": "a"}, "messages"),
    ("not an object", [1, 2], "(row)"),
    ("a bare string", "hello", "(row)"),
]


@pytest.mark.parametrize(("row", "field"), [pytest.param(row, field, id=name) for name, row, field in REFUSED_ROWS])
def test_a_row_the_trainer_cannot_train_is_refused_at_upload_naming_line_and_field(trainer: Trainer, row: Any, field: str) -> None:
    ctx = trainer.new_run()
    data = b"\n  \n" + jsonl(row)  # blank lines count: the row is line 3
    problem = assert_refused(trainer.upload(ctx, data), field, 3)
    assert problem["detail"].startswith("line 3: ")
    assert trainer.call("GET", "/internal/datasets", ctx).json()["data"] == []


@pytest.mark.parametrize(("rows", "formats"), [
    pytest.param(({"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}, GOOD), ("prompt_completion", "messages"), id="sft"),
    pytest.param((GOOD, GOOD, {"messages": [msg("user", "What is 2 + 2?")]}), ("messages", "prompt_only"), id="chat then reinforcement"),
    pytest.param((RFT, {"prompt": "a", "item_id": "i"}, OPENAI_DPO), ("prompt_only", "preference"), id="reinforcement then OpenAI DPO"),
    pytest.param((OPENAI_DPO, {"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "item_id": "i"}), ("preference", "prompt_only"),
                 id="both preference spellings then prompt-only"),
])
def test_rows_of_two_formats_in_one_file_are_refused_at_the_first_row_of_the_other_format(trainer: Trainer, rows: tuple[Any, ...],
                                                                                          formats: tuple[str, str]) -> None:
    ctx = trainer.new_run()
    problem = assert_refused(trainer.upload(ctx, jsonl(*rows)), "(row)", 3)
    assert f"the row is {formats[1]} but the rows before it are {formats[0]}" in problem["detail"]


@pytest.mark.parametrize(("row", "field", "words"), [
    pytest.param({**GOOD, "tools": []}, "tools", "tool definitions are not supported", id="chat row"),
    pytest.param({**RFT, "parallel_tool_calls": True}, "parallel_tool_calls", "tool definitions are not supported", id="reinforcement row"),
    pytest.param({**OPENAI_DPO, "input": {**OPENAI_DPO["input"], "tools": []}}, "input.tools", "tool definitions are not supported", id="DPO input"),
    pytest.param({"messages": [msg("user", "x"), {**msg("assistant", "y"), "tool_calls": []}]}, "messages[1].tool_calls",
                 "tool calls are not supported", id="tool call"),
    pytest.param(chat(("user", "x"), ("tool", "{}"), ("assistant", "y")), "messages[1].role", "tool messages are not supported", id="tool role"),
    pytest.param({"messages": [msg("user", "x"), {**msg("assistant", "y"), "weight": 0}]}, "messages[1].weight",
                 "multi-turn weighting is not supported", id="weight 0"),
    pytest.param({"messages": [msg("user", "x"), {**msg("assistant", "y"), "weight": 1}, msg("user", "z"), msg("assistant", "w")]},
                 "messages[1].weight", "multi-turn weighting is not supported", id="weight on an earlier turn"),
    pytest.param({**GOOD, "answer": "4"}, "answer", "prompt-only row", id="a column on a chat row"),
    pytest.param(chat(("system", "x")), "messages[0].role", "assistant's answer", id="chat row without an answer"),
    pytest.param({**RFT, "big": "x" * MAX_COLUMNS_BYTES}, "big", "extra columns", id="columns too large"),
])
def test_what_training_cannot_honour_in_an_openai_row_is_refused_by_name_never_ignored(row: Any, field: str, words: str) -> None:
    with pytest.raises(Unprocessable) as exc:
        parse_dataset(b"\n" + jsonl(row))
    assert (exc.value.extra["field"], exc.value.extra["line"]) == (field, 2)
    assert f"line 2: {field}: " in str(exc.value) and words in str(exc.value)


@pytest.mark.parametrize(("data", "line"), [
    pytest.param(b"", None, id="0-byte file"),
    pytest.param(b"\n\n  \n", None, id="only blank lines"),
    pytest.param(jsonl(GOOD) + b"\xff\xfe\n", 2, id="not UTF-8"),
    pytest.param(b"question,answer\n1+1,2\n", 1, id="CSV, not JSONL"),
    pytest.param(json.dumps(GOOD, indent=2).encode(), 1, id="pretty-printed JSON, not JSONL"),
    pytest.param(jsonl(GOOD) + b"{bad json\n", 2, id="a line that is not JSON"),
])
def test_a_file_that_is_not_a_jsonl_dataset_is_refused_naming_the_file(trainer: Trainer, data: bytes, line: int | None) -> None:
    ctx = trainer.new_run()
    assert_refused(trainer.upload(ctx, data), "file", line)


def test_deeply_nested_json_is_a_422_not_a_crash(trainer: Trainer) -> None:
    ctx = trainer.new_run()
    assert trainer.upload(ctx, b"[" * 100_000 + b"\n").json()["line"] == 1


# --------------------------------------------------------------------------- the trainer's side of the same rules


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared_models(MODEL) / MODEL)


_texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(turns=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), _texts), min_size=1, max_size=5))
def test_every_chat_row_the_upload_accepts_trains_on_its_answer_and_end_of_turn(tokenizer: Any, turns: list[tuple[str, str]]) -> None:
    try:
        row = parse_row(chat(*turns), 1)
    except Unprocessable:
        return
    if turns[-1][0] == "user":  # a prompt with no answer: OpenAI's reinforcement row, nothing supervised
        assert isinstance(row, PromptOnlyRow) and row.prompt_messages() == [{"role": r, "content": c} for r, c in turns]
        return
    assert isinstance(row, ChatRow)
    [example] = tokenize_examples(tokenizer, [row], max_seq_len=100_000)
    supervised = [t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE_INDEX]
    assert example.num_supervised == len(supervised) > 0
    answer = tokenizer.decode(tokenizer(turns[-1][1], add_special_tokens=False)["input_ids"])  # as the tokenizer sees it (lossy for a few code points)
    assert tokenizer.decode(supervised) == answer + "<|im_end|>\n"  # the answer and the template's end of turn, nothing else


def test_the_answer_survives_truncation_exactly_while_max_seq_len_exceeds_the_prompt(tokenizer: Any) -> None:
    row = parse_row(GOOD, 1)
    prefix, _ = _render_pair(tokenizer, *row.sft_turns())
    prompt_len = len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    [example] = tokenize_examples(tokenizer, [row], max_seq_len=prompt_len + 1)
    assert example.num_supervised == 1
    with pytest.raises(UntrainableRows) as exc:
        tokenize_examples(tokenizer, [row, parse_row(GOOD, 2), row], max_seq_len=prompt_len)
    assert exc.value.indices == [0, 1, 2]


# --------------------------------------------------------------------------- job creation


def long_prompt_row(words: int) -> dict[str, Any]:
    return chat(("user", " ".join(["tell me about the weather"] * words)), ("assistant", "sunny"))


def test_rows_truncated_to_nothing_are_refused_at_job_creation_with_nothing_held_or_charged(trainer: Trainer) -> None:
    ctx = trainer.new_run()
    data = jsonl(GOOD, long_prompt_row(40)) + b"\n" + jsonl(GOOD, long_prompt_row(60))  # the long rows are lines 2 and 5
    ds = trainer.upload(ctx, data).json()
    queued_before = list(trainer.enqueued)

    problem = assert_refused(trainer.create_job(ctx, [ds["id"]], max_seq_len=64), "datasets", 2)
    assert (problem["rows"], problem["dataset"]) == (2, ds["id"])
    assert "2 row(s)" in problem["detail"] and "max_seq_len=64" in problem["detail"]
    balance, entries, holds = trainer.books(ctx)
    assert (balance["held_usd_micros"], balance["spent_usd_micros"], holds) == (0, 0, [])
    assert [e["type"] for e in entries] == ["grant"]  # the budget, and nothing after it
    assert trainer.call("GET", "/internal/jobs", ctx).json()["data"] == [] and trainer.enqueued == queued_before

    # the same rows with room for their answers: the job is held for and queued (the books above could have moved)
    resp = trainer.create_job(ctx, [ds["id"]], max_seq_len=1024)
    assert resp.status_code == 201, resp.text
    balance, _, holds = trainer.books(ctx)
    assert [h["status"] for h in holds] == ["open"] and balance["held_usd_micros"] > 0
    assert trainer.enqueued == [*queued_before, resp.json()["id"]]


def test_preference_pairs_the_cut_makes_identical_are_refused_for_dpo_with_nothing_held(trainer: Trainer) -> None:
    """Two answers that differ only after ~200 shared tokens, at max_seq_len 64: DPO would train at loss ln 2 with no
    margin, write a checkpoint and be charged. Refused naming the rows; with room to differ, the job is created."""
    ctx = trainer.new_run()
    shared = " ".join(["the weather today is sunny and warm"] * 25)
    rows = [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "Describe the day.", "chosen": shared + " yes", "rejected": shared + " no"},
            {"prompt": "And tomorrow?", "chosen": shared + " rain", "rejected": shared + " snow"}]
    ds = trainer.upload(ctx, jsonl(*rows)).json()
    queued_before = list(trainer.enqueued)
    problem = assert_refused(trainer.create_job(ctx, [ds["id"]], method="dpo", max_seq_len=64), "datasets", 2)
    assert (problem["rows"], problem["dataset"]) == (2, ds["id"]) and "same tokens as chosen and as rejected" in problem["detail"]
    balance, _, holds = trainer.books(ctx)
    assert (balance["held_usd_micros"], holds, trainer.enqueued) == (0, [], queued_before)
    assert trainer.create_job(ctx, [ds["id"]], method="dpo", max_seq_len=1024).status_code == 201
    assert trainer.create_job(ctx, [ds["id"]], method="orpo", max_seq_len=64).status_code == 201  # its NLL term trains on the chosen answer


def test_a_stored_dataset_that_breaks_the_rules_is_refused_at_job_creation_not_a_500(trainer: Trainer) -> None:
    """A dataset stored before a rule existed is validated again when a job reads it."""
    from services.common import artifacts

    ctx = trainer.new_run()
    ds = trainer.upload(ctx, jsonl(GOOD, GOOD)).json()
    with trainer.service.db.session() as s:
        uri = s.get(Dataset, ds["id"]).uri
    stored = Path(artifacts.local_path(uri))
    stored.chmod(0o644)
    stored.write_bytes(jsonl(GOOD, chat(("assistant", "42"))))  # as the upload accepted it once
    problem = assert_refused(trainer.create_job(ctx, [ds["id"]]), "messages", 2)
    assert problem["dataset"] == ds["id"]
    assert trainer.books(ctx)[2] == []


def test_preference_rows_are_refused_for_sft_naming_the_dataset(trainer: Trainer) -> None:
    ctx = trainer.new_run()
    ds = trainer.upload(ctx, b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n').json()
    problem = assert_refused(trainer.create_job(ctx, [ds["id"]]), "datasets", None)
    assert problem["dataset"] == ds["id"] and "preference" in problem["detail"]
    assert trainer.books(ctx)[2] == []


def test_an_accepted_dataset_trains_with_loss_at_every_step_and_is_charged_what_it_trained(trainer: Trainer) -> None:
    """The worker's side of the same rules: the rows the upload accepted train, each step has loss, the hold
    is settled with the tokens trained."""
    ctx = trainer.new_run()
    ds = trainer.upload(ctx, jsonl(GOOD, chat(("system", "Be brief."), ("user", "3 + 3?"), ("assistant", "6"), ("user", "and 4 + 4?"), ("assistant", "8")))).json()
    job = trainer.create_job(ctx, [ds["id"]], max_seq_len=64, warmup_steps=0).json()
    worker.run_job(trainer.service, job["id"])
    done = trainer.call("GET", f"/internal/jobs/{job['id']}", ctx).json()
    assert done["status"] == "succeeded", done["error"]
    steps = [e["data"] for e in trainer.call("GET", f"/internal/jobs/{job['id']}/events", ctx).json()["data"] if e["type"] == "step"]
    assert len(steps) == 2 and all(step["loss"] > 0 for step in steps)
    balance, entries, holds = trainer.books(ctx)
    assert [h["status"] for h in holds] == ["settled"] and balance["held_usd_micros"] == 0
    charged = sum(e["quantity"] for e in entries if e["type"] == "charge" and e["kind"] == "training_tokens")
    assert charged == done["trained_tokens"] == done["estimated_tokens"] > 0
