"""Dataset rows: the one definition of a JSONL line the trainer accepts, used by the upload and by training.

A dataset is a JSON Lines file (UTF-8, an optional byte-order mark, one JSON object per line, lines end at ``\\n``, blank lines skipped)
whose rows all have one format:

- ``messages``: ``{"messages": [{"role": ..., "content": ...}, ...]}``, roles ``system``, ``user`` and
  ``assistant``. The last message is the assistant's answer, the turn training supervises; at least one
  user or system message comes before it (earlier assistant messages are context, not supervised).
- ``prompt_completion``: ``{"prompt": ..., "completion": ...}``, trained as one user turn and the
  assistant's answer.
- ``preference``: ``{"prompt": ..., "chosen": ..., "rejected": ...}`` with two different answers (DPO); the prompt
  is a string (one user turn) or a list of messages ending with a user message (a system prompt, earlier turns).
- ``prompt_only``: ``{"prompt": ..., "item_id": ...}``, a prompt (as in ``preference``) for an item of the run's
  training pool (GRPO: the policy answers the prompt and the suite's scorer rewards the answer against that item;
  TRL's prompt-only format with the item as the reward's extra column). Whether ``item_id`` is a training-pool item
  is checked when a job uses the dataset.

Every text is a string with at least one non-whitespace character, and a row or a message has no key its
format does not define: nothing in a file is silently ignored. A row that passes here has a supervised
answer for the trainer (its text plus the chat template's end-of-turn tokens, see
``trainer_service.examples.tokenize_examples``); whether any of it is left after truncation at a job's
``max_seq_len`` is decided when the job is created, with the model's tokenizer.

:func:`parse_dataset` reads a file into typed rows or raises ``Unprocessable`` naming the 1-based ``line``
and the ``field``: a dotted path in the row (``messages[2].content``), ``(row)`` for the line as a whole,
``file`` for the file as a whole (empty, not UTF-8, not JSON Lines, too many rows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, StrictStr, Tag, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from services.common.errors import Unprocessable

MAX_DATASET_ROWS = 200_000
MAX_ERRORS_SHOWN = 5


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", "must not be empty or only whitespace")
    return text


Text = Annotated[StrictStr, AfterValidator(_not_blank)]
"""A JSON string with at least one non-whitespace character."""


class Message(BaseModel):
    """One chat turn."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: Text

    def as_dict(self) -> dict[str, str]:
        """``{"role", "content"}`` as a chat template takes it."""
        return {"role": self.role, "content": self.content}


class ChatRow(BaseModel):
    """A ``messages`` row: context turns, then the assistant's answer (supervised)."""

    model_config = ConfigDict(extra="forbid")
    format: ClassVar[str] = "messages"

    messages: list[Message] = Field(min_length=1)

    @model_validator(mode="after")
    def _answer_last_after_a_prompt(self) -> ChatRow:
        last = len(self.messages) - 1
        if self.messages[last].role != "assistant":
            raise PydanticCustomError("answer_not_last", "the last message must be the assistant's answer (the turn training supervises)",
                                      {"field": f"messages[{last}].role"})
        if not any(m.role in ("user", "system") for m in self.messages[:last]):
            raise PydanticCustomError("no_prompt", "the assistant's answer needs a user or system message before it", {"field": "messages"})
        return self

    def sft_turns(self) -> tuple[list[dict[str, str]], dict[str, str]]:
        """``(prompt messages, answer message)`` for supervised fine-tuning."""
        return [m.as_dict() for m in self.messages[:-1]], self.messages[-1].as_dict()


class PromptCompletionRow(BaseModel):
    """A ``prompt_completion`` row: the prompt is one user turn, the completion the assistant's answer."""

    model_config = ConfigDict(extra="forbid")
    format: ClassVar[str] = "prompt_completion"

    prompt: Text
    completion: Text

    def sft_turns(self) -> tuple[list[dict[str, str]], dict[str, str]]:
        """``(prompt messages, answer message)`` for supervised fine-tuning."""
        return [{"role": "user", "content": self.prompt}], {"role": "assistant", "content": self.completion}


_PROMPT_TEXT, _PROMPT_CONVERSATION = "(text)", "(conversation)"
"""The two shapes of a preference prompt; validation errors name the path without them (``prompt[0].role``)."""


Prompt = Annotated[Annotated[Text, Tag(_PROMPT_TEXT)] | Annotated[list[Message], Field(min_length=1), Tag(_PROMPT_CONVERSATION)],
                   Discriminator(lambda v: _PROMPT_CONVERSATION if isinstance(v, list) else _PROMPT_TEXT)]
"""A prompt: one user turn (a string) or the conversation before the answer (messages ending with a user message)."""


def _prompt_messages(prompt: str | list[Message]) -> list[dict[str, str]]:
    """The prompt as chat messages (a string prompt is one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [m.as_dict() for m in prompt]


def _check_user_last(prompt: str | list[Message]) -> None:
    if isinstance(prompt, list) and prompt[-1].role != "user":
        raise PydanticCustomError("prompt_not_user_last", "a conversational prompt ends with the user's message the answer replies to",
                                  {"field": f"prompt[{len(prompt) - 1}].role"})


class PreferenceRow(BaseModel):
    """A ``preference`` row: a prompt with a preferred and a dispreferred answer. The prompt is one user turn (a
    string) or the conversation before the answer (messages ending with a user message: a system prompt, earlier
    turns), TRL's conversational preference format with the answers as plain strings."""

    model_config = ConfigDict(extra="forbid")
    format: ClassVar[str] = "preference"

    prompt: Prompt
    chosen: Text
    rejected: Text

    @model_validator(mode="after")
    def _two_answers(self) -> PreferenceRow:
        _check_user_last(self.prompt)
        if self.chosen == self.rejected:
            raise PydanticCustomError("same_answers", "rejected is the same text as chosen; a preference pair needs two different answers",
                                      {"field": "rejected"})
        return self

    def prompt_messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages (a string prompt is one user message)."""
        return _prompt_messages(self.prompt)


class PromptOnlyRow(BaseModel):
    """A ``prompt_only`` row: a prompt the policy answers during GRPO, rewarded by the suite's scorer against the
    training-pool item ``item_id``."""

    model_config = ConfigDict(extra="forbid")
    format: ClassVar[str] = "prompt_only"

    prompt: Prompt
    item_id: Annotated[Text, Field(max_length=200)]

    @model_validator(mode="after")
    def _user_last(self) -> PromptOnlyRow:
        _check_user_last(self.prompt)
        return self

    def prompt_messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages (a string prompt is one user message)."""
        return _prompt_messages(self.prompt)


SFTRow = ChatRow | PromptCompletionRow
"""A row supervised fine-tuning trains on."""


def _row_format(row: Any) -> str | None:
    """The format a JSON value claims by its keys (``None`` if it is not an object). An object with none of the
    formats' keys is taken as a ``messages`` row, whose errors then name the missing ``messages`` and every
    unknown key."""
    if not isinstance(row, dict):
        return None
    if "messages" in row:
        return "messages"
    if "chosen" in row or "rejected" in row:
        return "preference"
    if "item_id" in row:
        return "prompt_only"
    if "prompt" in row or "completion" in row:
        return "prompt_completion"
    return "messages"


DatasetRow = Annotated[
    Annotated[ChatRow, Tag("messages")] | Annotated[PromptCompletionRow, Tag("prompt_completion")] | Annotated[PreferenceRow, Tag("preference")]
    | Annotated[PromptOnlyRow, Tag("prompt_only")],
    Discriminator(_row_format, custom_error_type="not_an_object",
                  custom_error_message="each line must be a JSON object: {\"messages\": [...]}, {\"prompt\", \"completion\"}, "
                                       "{\"prompt\", \"chosen\", \"rejected\"} or {\"prompt\", \"item_id\"}"),
]
AnyRow = ChatRow | PromptCompletionRow | PreferenceRow | PromptOnlyRow
"""A row of any format."""
_ROW: TypeAdapter[AnyRow] = TypeAdapter(DatasetRow)


def _field(error: dict[str, Any]) -> str:
    """The dotted path of a validation error (``messages[0].content``), without the format tag in front."""
    if "field" in (error.get("ctx") or {}):
        return str(error["ctx"]["field"])
    path = ""
    for part in (p for p in error["loc"][1:] if p not in (_PROMPT_TEXT, _PROMPT_CONVERSATION)):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(row)"


def _message(error: dict[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key (the format has no such field)"
    return str(error["msg"])


def parse_row(row: Any, line: int) -> AnyRow:
    """Validate one decoded JSON value (from line ``line``) as a dataset row.

    Raises ``Unprocessable`` with ``line`` and the ``field`` of the first error; the detail lists up to
    five errors of the row.
    """
    try:
        return _ROW.validate_python(row)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        shown = "; ".join(f"{_field(e)}: {_message(e)}" for e in errors[:MAX_ERRORS_SHOWN])
        more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
        raise Unprocessable(f"line {line}: {shown}{more}", field=_field(errors[0]), line=line) from None


@dataclass(frozen=True)
class ParsedDataset:
    """A validated dataset: its ``format``, its rows, and the 1-based file ``lines`` they came from."""

    format: str
    rows: list[AnyRow]
    lines: list[int]


def parse_dataset(data: bytes) -> ParsedDataset:
    """Validate a JSONL file and return its rows (see the module docstring for what a row is).

    Raises ``Unprocessable`` for the first problem: ``field="file"`` when the file is empty or only blank
    lines, not UTF-8 (with the ``line`` of the first bad byte), not JSON Lines (a line that is not JSON),
    or over ``MAX_DATASET_ROWS`` rows; a row's own ``field`` and ``line`` when a row is invalid; ``(row)``
    for a row whose format differs from the first row's.
    """
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark, as spreadsheet and Windows exports write, is no content
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise Unprocessable(f"the file is not UTF-8 text (line {line}, byte {exc.start})", field="file", line=line) from exc
    rows: list[AnyRow] = []
    lines: list[int] = []
    for lineno, raw in enumerate(text.split("\n"), start=1):  # JSON Lines ends lines at \n only (U+2028 may sit in a string)
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise Unprocessable(f"line {lineno} is not JSON ({exc.msg}): a dataset is JSON Lines, one JSON object per line",
                                field="file", line=lineno) from exc
        except RecursionError as exc:
            raise Unprocessable(f"line {lineno}: JSON nested too deeply", field="(row)", line=lineno) from exc
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits
            raise Unprocessable(f"line {lineno}: {exc}", field="(row)", line=lineno) from exc
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Unprocessable(f"line {lineno}: a string holds an unpaired surrogate (\\u{ord(exc.object[exc.start]):04x}), not text",
                                field="(row)", line=lineno) from exc
        row = parse_row(value, lineno)
        if rows and row.format != rows[0].format:
            raise Unprocessable(f"line {lineno}: the row is {row.format} but the rows before it are {rows[0].format}; "
                                "a dataset has one format", field="(row)", line=lineno)
        if len(rows) == MAX_DATASET_ROWS:
            raise Unprocessable(f"more than {MAX_DATASET_ROWS} rows", field="file", line=lineno)
        rows.append(row)
        lines.append(lineno)
    if not rows:
        raise Unprocessable("the file has no rows (it is empty or only blank lines)", field="file")
    return ParsedDataset(format=rows[0].format, rows=rows, lines=lines)


class CheckpointRecord(BaseModel):
    """Where a checkpoint lives, for the inference service: ``uri`` is its adapter folder (``file://…``)."""

    id: str
    run_id: str
    base_model: str
    uri: str
    kind: Literal["lora", "full"]
    step: int
