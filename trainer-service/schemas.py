"""Dataset rows: the one definition of a JSONL line the trainer accepts, used by the upload and by training.

A dataset is a JSON Lines file (UTF-8, an optional byte-order mark, one JSON object per line, lines end at ``\\n``, blank lines skipped)
whose rows all have one format. A format has Crucible's spelling (TRL's dataset formats) and, where OpenAI's fine-tuning
API has one, OpenAI's too, so a file uploaded for OpenAI (``files.create(purpose="fine-tune")``) is a dataset as it is:

- ``messages`` (supervised; OpenAI's supervised format): ``{"messages": [{"role": ..., "content": ...}, ...]}``, roles
  ``system``, ``user`` and ``assistant``. The last message is the assistant's answer, the turn training supervises; at
  least one user or system message comes before it (earlier assistant messages are context, not supervised). OpenAI's
  per-message ``weight`` is accepted as ``1`` on that last message (what training does anyway) and refused anywhere
  else or as ``0``: multi-turn weighting is not supported.
- ``prompt_completion``: ``{"prompt": ..., "completion": ...}``, trained as one user turn and the assistant's answer.
- ``preference`` (DPO), either spelling, mixed freely in a file:
  ``{"prompt": ..., "chosen": ..., "rejected": ...}`` with two different answers; the prompt is a string (one user
  turn) or a list of messages ending with a user message (a system prompt, earlier turns). Or OpenAI's
  ``{"input": {"messages": [...]}, "preferred_output": [{"role": "assistant", "content": ...}],
  "non_preferred_output": [{"role": "assistant", "content": ...}]}``: the prompt is ``input.messages`` (ending with a
  user message), each output exactly one assistant message; it is read as the first spelling (a ``PreferenceRow``).
- ``prompt_only`` (GRPO; TRL's prompt-only format, OpenAI's reinforcement fine-tuning format): a prompt, given as
  ``prompt`` (as in ``preference``) or as ``messages`` (a list ending with a user message), and any other keys: the
  row's extra columns (JSON values, at most 64 KiB of them), which the reward reads (a grader's ``{{ item.<key> }}``):
  ``{"prompt": ..., "item_id": ...}``, ``{"messages": [..., {"role": "user", ...}], "answer": ...}``. ``item_id``, a
  string when present, names an item of the run's training pool, for the suite's scorer as reward; whether a row needs
  one and whether it is one is checked when a job uses the dataset. ``completion`` is not a column: the policy writes
  the answer.

A row's keys say its format: ``chosen`` or ``rejected``, ``preferred_output`` or ``non_preferred_output`` make it
``preference``; ``messages`` makes it ``messages`` when its last message is the assistant's, ``prompt_only`` when it is
the user's or the row has other keys, else ``messages`` (whose error then asks for the answer); ``input`` without
``prompt`` makes it ``preference`` (OpenAI's); ``prompt`` makes it ``prompt_completion`` with ``completion`` or alone,
else ``prompt_only``; ``item_id`` makes it ``prompt_only``; anything else is taken as a ``messages`` row, whose errors
then name the missing ``messages`` and every unknown key.

OpenAI's ``developer`` role is read as ``system`` in every format. Tools are not: ``tools``, ``parallel_tool_calls``
and ``functions`` (in a row or in OpenAI's ``input``), a message's ``tool_calls`` and the ``tool`` role are refused
by name, as tool definitions and calls are not supported in training rows.

Every text is a string with at least one non-whitespace character, and a row or a message has no key its
format does not define (a ``prompt_only`` row's other keys are its columns): nothing in a file is silently ignored. A
row that passes here has a supervised answer for the trainer (its text plus the chat template's end-of-turn tokens, see
``trainer_service.examples.tokenize_examples``); whether any of it is left after truncation at a job's
``max_seq_len`` is decided when the job is created, with the model's tokenizer.

:func:`parse_dataset` reads a file into typed rows or raises ``Unprocessable`` naming the 1-based ``line``
and the ``field``: a dotted path in the row (``messages[2].content``), ``(row)`` for the line as a whole,
``file`` for the file as a whole (empty, not UTF-8, not JSON Lines, too many rows).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from services.common.errors import Unprocessable

MAX_DATASET_ROWS = 200_000
MAX_ERRORS_SHOWN = 5
MAX_COLUMNS_BYTES = 64 * 1024
"""The most JSON (UTF-8 bytes) a ``prompt_only`` row's extra columns may hold together."""

TOOL_KEYS = ("tools", "parallel_tool_calls", "functions")
"""OpenAI's tool definitions, in a row or in a preference row's ``input``: refused by name."""
TOOL_CALL_KEYS = ("tool_calls", "function_call", "tool_call_id")
"""OpenAI's tool calls and results, in a message: refused by name."""
NO_TOOLS = "tool definitions are not supported in training rows"
NO_TOOL_CALLS = "tool calls are not supported in training rows"
WEIGHT_ONLY_ON_ANSWER = ("weight is accepted only as 1 on the last message of a messages row, the assistant's answer "
                         "(multi-turn weighting is not supported: earlier assistant messages are context, never trained)")


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", "must not be empty or only whitespace")
    return text


Text = Annotated[StrictStr, AfterValidator(_not_blank)]
"""A JSON string with at least one non-whitespace character."""


class Message(BaseModel):
    """One chat turn. OpenAI's ``developer`` role is read as ``system``."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: Text

    @field_validator("role", mode="before")
    @classmethod
    def _developer_is_system(cls, role: Any) -> Any:
        return "system" if role == "developer" else role

    def as_dict(self) -> dict[str, str]:
        """``{"role", "content"}`` as a chat template takes it."""
        return {"role": self.role, "content": self.content}


class ChatMessage(Message):
    """A turn of a ``messages`` row: OpenAI's ``weight`` may mark the answer (``1``, the last message only)."""

    weight: StrictInt | None = None


class ChatRow(BaseModel):
    """A ``messages`` row: context turns, then the assistant's answer (supervised)."""

    model_config = ConfigDict(extra="forbid")
    format: ClassVar[str] = "messages"

    messages: list[ChatMessage] = Field(min_length=1)

    @model_validator(mode="after")
    def _answer_last_after_a_prompt(self) -> ChatRow:
        last = len(self.messages) - 1
        if self.messages[last].role != "assistant":
            raise PydanticCustomError("answer_not_last", "the last message must be the assistant's answer (the turn training supervises); "
                                      "a prompt-only row (GRPO, OpenAI's reinforcement format) ends with the user's message instead",
                                      {"field": f"messages[{last}].role"})
        if not any(m.role in ("user", "system") for m in self.messages[:last]):
            raise PydanticCustomError("no_prompt", "the assistant's answer needs a user or system message before it", {"field": "messages"})
        for i, m in enumerate(self.messages):
            if m.weight is not None and (i != last or m.weight != 1):
                raise PydanticCustomError("weight", WEIGHT_ONLY_ON_ANSWER, {"field": f"messages[{i}].weight"})
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


Conversation = Annotated[list[Message], Field(min_length=1)]
"""Messages before an answer (at least one)."""
Prompt = Annotated[Annotated[Text, Tag(_PROMPT_TEXT)] | Annotated[Conversation, Tag(_PROMPT_CONVERSATION)],
                   Discriminator(lambda v: _PROMPT_CONVERSATION if isinstance(v, list) else _PROMPT_TEXT)]
"""A prompt: one user turn (a string) or the conversation before the answer (messages ending with a user message)."""


def _prompt_messages(prompt: str | list[Message]) -> list[dict[str, str]]:
    """The prompt as chat messages (a string prompt is one user message)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [m.as_dict() for m in prompt]


def _check_user_last(prompt: str | list[Message], field: str = "prompt") -> None:
    """A conversational prompt (at ``field``) ends with the user's message."""
    if isinstance(prompt, list) and prompt[-1].role != "user":
        raise PydanticCustomError("prompt_not_user_last", "a conversational prompt ends with the user's message the answer replies to",
                                  {"field": f"{field}[{len(prompt) - 1}].role"})


class PreferenceRow(BaseModel):
    """A ``preference`` row: a prompt with a preferred and a dispreferred answer. The prompt is one user turn (a
    string) or the conversation before the answer (messages ending with a user message: a system prompt, earlier
    turns), TRL's conversational preference format with the answers as plain strings. OpenAI's spelling
    (:class:`OpenAIPreferenceRow`) is read as this."""

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


class OpenAIPreferenceInput(BaseModel):
    """OpenAI's preference ``input``: the prompt's messages (its ``tools`` and ``parallel_tool_calls`` are refused)."""

    model_config = ConfigDict(extra="forbid")

    messages: Conversation


class OpenAIPreferenceRow(BaseModel):
    """A ``preference`` row as OpenAI's fine-tuning API spells it (DPO): ``input.messages`` is the prompt, the one
    assistant message of ``preferred_output`` the chosen answer, that of ``non_preferred_output`` the rejected one.
    Parsing returns it as a :class:`PreferenceRow` (:meth:`as_preference`), the one shape training reads."""

    model_config = ConfigDict(extra="forbid")
    format: ClassVar[str] = "preference"

    input: OpenAIPreferenceInput
    preferred_output: list[Message]
    non_preferred_output: list[Message]

    @model_validator(mode="after")
    def _one_answer_each(self) -> OpenAIPreferenceRow:
        _check_user_last(self.input.messages, "input.messages")
        for name in ("preferred_output", "non_preferred_output"):
            output: list[Message] = getattr(self, name)
            if len(output) != 1:
                raise PydanticCustomError("one_answer", "must hold exactly one message, the assistant's answer (got {count})",
                                          {"field": name, "count": len(output)})
            if output[0].role != "assistant":
                raise PydanticCustomError("answer_not_assistant", "the answer is the assistant's message", {"field": f"{name}[0].role"})
        if self.preferred_output[0].content == self.non_preferred_output[0].content:
            raise PydanticCustomError("same_answers", "the non-preferred answer is the same text as the preferred one; a preference pair "
                                      "needs two different answers", {"field": "non_preferred_output[0].content"})
        return self

    def as_preference(self) -> PreferenceRow:
        """The row in Crucible's spelling (already validated: nothing is checked again)."""
        return PreferenceRow.model_construct(prompt=list(self.input.messages), chosen=self.preferred_output[0].content,
                                             rejected=self.non_preferred_output[0].content)


def _not_null(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError("null", "must not be null (leave the key out instead)")
    return value


class PromptOnlyRow(BaseModel):
    """A ``prompt_only`` row: a prompt the policy answers during GRPO, and the row's extra columns the reward reads
    (:meth:`reference`): the suite's scorer the training-pool item ``item_id``, a grader any column. The prompt is
    ``prompt`` (a string or messages) or OpenAI's ``messages``, read as ``prompt`` (``messages`` is then ``None``)."""

    model_config = ConfigDict(extra="allow")
    format: ClassVar[str] = "prompt_only"
    __pydantic_extra__: dict[str, Any] = Field(init=False)  # the extra columns (JSON values, checked by _columns)

    prompt: Prompt | None = None
    messages: Conversation | None = None
    item_id: Annotated[Text, Field(max_length=200)] | None = None

    @field_validator("prompt", "messages", "item_id", mode="before")
    @classmethod
    def _given_not_null(cls, value: Any) -> Any:
        return _not_null(value)

    @model_validator(mode="before")
    @classmethod
    def _columns(cls, data: Any) -> Any:
        """Refuse what is not a column: tool definitions, a completion, a value that is not JSON, more than
        ``MAX_COLUMNS_BYTES`` of JSON in all."""
        if not isinstance(data, dict):
            return data
        columns = {k: v for k, v in data.items() if k not in ("prompt", "messages", "item_id")}
        sizes: dict[str, int] = {}
        for key, value in columns.items():
            if key in TOOL_KEYS:
                raise PydanticCustomError("tools", NO_TOOLS, {"field": key})
            if key == "completion":
                raise PydanticCustomError("completion", "a prompt-only row has no completion: the policy writes the answer (a supervised "
                                          "row is {prompt, completion}, or messages ending with the assistant's answer)", {"field": key})
            try:  # a value from a parsed line is JSON; one given from Python may not be
                sizes[key] = len(json.dumps({key: value}, ensure_ascii=False, allow_nan=False).encode()) - 2  # "key": value
            except (TypeError, ValueError, RecursionError):
                raise PydanticCustomError("not_json", "a column is a JSON value (NaN and Infinity are not)", {"field": str(key)}) from None
        if (total := sum(sizes.values())) > MAX_COLUMNS_BYTES:
            largest = max(sizes, key=lambda k: sizes[k])
            raise PydanticCustomError("columns_too_large", "the row's extra columns hold {total} bytes of JSON, over the {limit} a row may "
                                      "carry (this column is the largest)", {"field": largest, "total": total, "limit": MAX_COLUMNS_BYTES})
        return data

    @model_validator(mode="after")
    def _one_prompt_user_last(self) -> PromptOnlyRow:
        if self.prompt is not None and self.messages is not None:
            raise PydanticCustomError("two_prompts", "give the prompt once: as prompt or as messages", {"field": "messages"})
        if self.messages is not None:
            _check_user_last(self.messages, "messages")
            self.prompt, self.messages = self.messages, None
        elif self.prompt is None:
            raise PydanticCustomError("no_prompt", "a prompt-only row needs its prompt: prompt (a string or messages) or messages "
                                      "(ending with the user's message)", {"field": "prompt"})
        else:
            _check_user_last(self.prompt)
        return self

    def prompt_messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages (a string prompt is one user message)."""
        assert self.prompt is not None  # a validated row has one
        return _prompt_messages(self.prompt)

    def reference(self) -> dict[str, Any]:
        """The row's extra columns, ``item_id`` among them when the row has one: what a grader reads as ``item``."""
        columns: dict[str, Any] = dict(self.model_extra or {})
        if self.item_id is not None:
            columns["item_id"] = self.item_id
        return columns


SFTRow = ChatRow | PromptCompletionRow
"""A row supervised fine-tuning trains on."""


def _last_role(messages: Any) -> Any:
    """The ``role`` of the last of ``messages`` (``None`` when there is none to read)."""
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return messages[-1].get("role")
    return None


def _row_format(row: Any) -> str | None:
    """The format a JSON value claims by its keys (``None`` if it is not an object; ``openai_preference`` for
    OpenAI's spelling of ``preference``); the rules are the module docstring's."""
    if not isinstance(row, dict):
        return None
    if "chosen" in row or "rejected" in row:
        return "preference"
    if "preferred_output" in row or "non_preferred_output" in row:
        return "openai_preference"
    if "messages" in row:
        role = _last_role(row["messages"])
        if role == "assistant":
            return "messages"
        return "prompt_only" if role == "user" or len(row) > 1 else "messages"
    if "input" in row and "prompt" not in row:
        return "openai_preference"
    if "prompt" in row:
        return "prompt_completion" if "completion" in row or len(row) == 1 else "prompt_only"
    if "item_id" in row:
        return "prompt_only"
    return "prompt_completion" if "completion" in row else "messages"


DatasetRow = Annotated[
    Annotated[ChatRow, Tag("messages")] | Annotated[PromptCompletionRow, Tag("prompt_completion")] | Annotated[PreferenceRow, Tag("preference")]
    | Annotated[OpenAIPreferenceRow, AfterValidator(OpenAIPreferenceRow.as_preference), Tag("openai_preference")]
    | Annotated[PromptOnlyRow, Tag("prompt_only")],
    Discriminator(_row_format, custom_error_type="not_an_object",
                  custom_error_message="each line must be a JSON object: {\"messages\": [...]}, {\"prompt\", \"completion\"}, "
                                       "{\"prompt\", \"chosen\", \"rejected\"}, {\"input\", \"preferred_output\", \"non_preferred_output\"} "
                                       "or a prompt with extra columns ({\"prompt\", \"item_id\"}, {\"messages\", ...})"),
]
AnyRow = ChatRow | PromptCompletionRow | PreferenceRow | PromptOnlyRow
"""A row of any format, as parsing returns it (OpenAI's preference rows as ``PreferenceRow``)."""
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
    """An error's text, told for the key it is about where a generic one would not help."""
    loc, key = error["loc"], error["loc"][-1] if error["loc"] else None
    if error["type"] == "extra_forbidden":
        if key in TOOL_KEYS:
            return NO_TOOLS
        if key in TOOL_CALL_KEYS:
            return NO_TOOL_CALLS
        if key == "weight":
            return WEIGHT_ONLY_ON_ANSWER
        if loc[0] == "messages" and len(loc) == 2:
            return ("unknown key: a messages row ending with the assistant's answer has only messages (extra columns belong to a "
                    "prompt-only row, whose messages end with the user's message)")
        return "unknown key (the format has no such field)"
    if error["type"] == "literal_error" and key == "role":
        return "must be system, user or assistant (developer is read as system); tool messages are not supported in training rows"
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


# --------------------------------------------------------------------------- Tinker's primitives (trainer_service.sessions)


class LoraSpec(BaseModel):
    """A live model's adapter, as Tinker's ``create_lora_training_client`` asks for it."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(32, ge=1, le=256)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    @model_validator(mode="after")
    def _trains_something(self) -> LoraSpec:
        if not (self.train_attn or self.train_mlp or self.train_unembed):
            raise PydanticCustomError("nothing_to_train", "train_attn, train_mlp and train_unembed are all off: the adapter would train nothing")
        return self


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_metadata: dict[str, Any] = Field(default_factory=dict)


class SessionOut(BaseModel):
    session_id: str
    alive: bool = True


class LiveModelCreate(BaseModel):
    """A new live model ``<session_id>:train:<model_seq_id>``: a fresh adapter over ``base_model``, or (``path``) the
    state a client saved (``optimizer``: with its optimizer's). ``recipe``: under the benchmark's policy (the gateway's)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str = Field(max_length=40)
    model_seq_id: int = Field(ge=0, le=1_000_000)
    base_model: str | None = Field(None, max_length=200)
    lora: LoraSpec = Field(default_factory=LoraSpec)
    path: str | None = Field(None, max_length=400)
    optimizer: bool = False
    recipe: dict[str, Any]


class FutureOut(BaseModel):
    """A request's id for the client's future (``model_id``: the model it made or acts on)."""

    request_id: str
    model_id: str | None = None
    sampler_id: str | None = None


class LiveModelInfo(BaseModel):
    model_id: str
    base_model: str
    lora: dict[str, Any]
    job_id: str
    tokenizer_dir: str = Field(description="The base model's folder as the trainer reads it (its tokenizer's files).")


class SamplerCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str = Field(max_length=40)
    sampling_session_seq_id: int = Field(ge=0, le=10**12)
    model_path: str | None = Field(None, max_length=400)
    base_model: str | None = Field(None, max_length=200)


class SamplerSnapshot(BaseModel):
    """``save_weights_and_get_sampling_client``: a sampler of live model ``model_id``'s weights at request ``seq_id``."""

    model_config = ConfigDict(extra="forbid")

    model_id: str = Field(max_length=120)
    seq_id: int = Field(ge=1)
    sampling_session_seq_id: int = Field(ge=0, le=10**12)


class SamplerOut(BaseModel):
    sampler_id: str
    base_model: str
    model_path: str | None = None


class RequestAnswer(BaseModel):
    """A request's state: ``pending``, ``done`` (``result``: a JSON object, or ``proto_b64``: protobuf bytes in base64),
    ``failed`` (``error``, ``category``: ``user`` | ``server``)."""

    status: Literal["pending", "done", "failed"]
    result: dict[str, Any] | None = None
    proto_b64: str | None = None
    error: str | None = None
    category: str | None = None


class SavedWeightsOut(BaseModel):
    path: str
    kind: Literal["weights", "sampler_weights"]
    checkpoint_id: str | None = None
    created_at: dt.datetime
