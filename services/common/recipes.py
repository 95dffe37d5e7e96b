"""Training methods as data: what each ``recipe.method`` reads, trains on and needs, registered by
:func:`training_method`; the wire ``Recipe`` (:func:`recipe_model`), the gateway's recipe policy and the trainer's
refusal of a field the chosen method does not read are derived from the registered methods, never restated.

A method is declared here by one :class:`MethodConfig` class holding its own recipe fields (each named
``<method>_<term>``, with its default, bounds and description, as TRL's per-method trainer configs document theirs)
and decorated with :func:`training_method` (its summary, dataset formats, adapters, whether it reads the reference
policy). Its step, how rows become examples, what an example costs and its loss, is the module of the same name in
``trainer_service.methods``, found by the name. This module imports no torch: the gateway builds its schema and
policy from it.

The fields every training method reads (the loop's: LoRA shape, optimizer, schedule, lengths, checkpoints) are
:class:`TrainingFields`; ``method`` and ``adapter`` are read by every method, a merge included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

ADAPTERS = ("lora", "full")
"""What a job trains: a LoRA adapter over the frozen base, or every weight."""


class TrainingFields(BaseModel):
    """The recipe fields every method reads: ``adapter`` (a merge: its checkpoints' kind), and the training loop's
    (names as in transformers/PEFT), which every method that trains reads."""

    adapter: Literal["lora", "full"] = Field("lora", description=(
        "`lora`: a LoRA adapter over the frozen base (`lora_*`, `target_modules`); `full`: every weight (full fine-tuning; its "
        "memory estimate must fit the deployment's train workers)."))
    lora_r: int = Field(16, ge=1, le=256)
    lora_alpha: int = Field(32, ge=1, le=1024)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: Literal["all-linear"] | Annotated[list[Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]],
                                                      Field(min_length=1, max_length=7)] = Field(
        "all-linear", description="`all-linear` or a non-empty list of the model's projection layers.")
    learning_rate: float = Field(1e-3, gt=0, le=1.0)
    batch_size: int = Field(8, ge=1, le=256)
    max_steps: int = Field(100, ge=1, le=100_000)
    warmup_steps: int = Field(10, ge=0)
    lr_scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    max_seq_len: int = Field(256, ge=16, le=4096)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    checkpoint_every: int = Field(50, ge=1, description="Write a checkpoint every this many steps (and at the end).")
    devices: int | None = Field(None, ge=1, le=64, description=(
        "Devices (GPUs) the job's steps spread over: DDP for `lora`, FSDP2 for `full`, each device taking its share of every "
        "batch (same loss and checkpoints as one device, tokens billed once). Default: the deployment's train_devices; "
        "a deployment may refuse a recipe's own choice (422)."))


class MethodConfig(BaseModel):
    """A method's own recipe fields, each named ``<method>_<term>`` and documented with its default, bounds and source;
    subclass it once per method and decorate the subclass with :func:`training_method`."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


@dataclass(frozen=True)
class MethodSpec:
    """A registered method. ``summary``: what it does, for ``recipe.method``'s schema; ``config``: its own fields;
    ``formats``: the dataset formats it trains on (``trainer_service.schemas``; none for a merge); ``adapters``: the
    ``recipe.adapter`` values it trains; ``needs_reference``: its loss reads the reference policy (the trainer keeps one
    and counts it in the memory estimate); ``trains``: it runs the training loop (reads :class:`TrainingFields`; a
    merge does not); ``rewarded``: it samples completions the suite's scorer rewards (takes a ``harness``, trains on the
    run's training pool when given no dataset)."""

    name: str
    summary: str
    config: type[MethodConfig]
    formats: frozenset[str]
    adapters: frozenset[str]
    needs_reference: bool
    trains: bool
    rewarded: bool

    @property
    def fields(self) -> frozenset[str]:
        """The recipe fields this method reads; a job of it refuses another field set to other than its default."""
        loop = set(TrainingFields.model_fields) if self.trains else {"adapter"}
        return frozenset({"method", *loop, *self.config.model_fields})


METHODS: dict[str, MethodSpec] = {}
"""The registered methods by name, in registration order (the order the ``Recipe`` lists them and their fields)."""


def training_method(name: str, *, summary: str, formats: Iterable[str] = (), adapters: Iterable[str] = ADAPTERS,
                    needs_reference: bool = False, trains: bool = True,
                    rewarded: bool = False) -> Callable[[type[MethodConfig]], type[MethodConfig]]:
    """Decorator: register the decorated :class:`MethodConfig` as method ``name``'s fields (see :class:`MethodSpec`
    for the rest) and return it unchanged. ``ValueError`` if ``name`` is taken or a field is not named ``<name>_…``."""
    def register(config: type[MethodConfig]) -> type[MethodConfig]:
        if name in METHODS:
            raise ValueError(f"training method {name!r} is registered twice")
        if stray := [f for f in config.model_fields if not f.startswith(f"{name}_")]:
            raise ValueError(f"method {name!r}: its fields are named {name}_<term>, not {stray}")
        METHODS[name] = MethodSpec(name, summary, config, frozenset(formats), frozenset(adapters), needs_reference, trains, rewarded)
        return config
    return register


def method_spec(name: str) -> MethodSpec:
    """The registered method ``name``; ``KeyError`` if there is none."""
    return METHODS[name]


def names(methods: Iterable[MethodSpec]) -> str:
    """The methods' names as prose: "`sft`, `dpo` and `orpo`"."""
    quoted = [f"`{m.name}`" for m in methods]
    return " and ".join(filter(None, [", ".join(quoted[:-1]), quoted[-1]]))


def recipe_model() -> type[BaseModel]:
    """The wire ``Recipe``: ``method`` (one of :data:`METHODS`, ``sft`` by default), :class:`TrainingFields`, then each
    method's own fields, described as that method's only. Strict, no extra field."""
    description = "; ".join(f"`{m.name}`: {m.summary}" for m in METHODS.values()) + "."
    fields: dict[str, Any] = {"method": (Literal[tuple(METHODS)], Field("sft", description=description))}
    fields |= {name: (info.annotation, info) for name, info in TrainingFields.model_fields.items()}
    for method in METHODS.values():
        for name, info in method.config.model_fields.items():
            fields[name] = (info.annotation, FieldInfo.merge_field_infos(info, description=f"`{method.name}` only: {info.description}"))
    return create_model(
        "Recipe", __doc__="How to train: method, adapter and hyper-parameters (names as in transformers/PEFT).",
        __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False,
                              json_schema_extra={"example": {"method": "sft", "lora_r": 16, "learning_rate": 1e-3, "max_steps": 100}}),
        **fields)


# ------------------------------------------------------------------------------------------------------- methods


@training_method("sft", summary="next-token loss on the answers of `messages` or `prompt_completion` datasets",
                 formats=("messages", "prompt_completion"))
class SFTConfig(MethodConfig):
    """Supervised fine-tuning reads no field of its own."""


@training_method("dpo", summary="Direct Preference Optimization on `preference` datasets (`prompt`, `chosen`, `rejected`)",
                 formats=("preference",), needs_reference=True)
class DPOConfig(MethodConfig):
    """Direct Preference Optimization (Rafailov et al. 2023)."""

    dpo_beta: float = Field(0.1, gt=0, le=10, description="β of the DPO loss, how far the policy may move from the reference "
                            "(Rafailov et al. 2023; TRL's default 0.1).")


@training_method("grpo", summary="reinforcement learning with the suite's scorer as reward", formats=("prompt_only",),
                 needs_reference=True, rewarded=True)
class GRPOConfig(MethodConfig):
    """Group Relative Policy Optimization (Shao et al. 2024)."""

    grpo_group_size: int = Field(4, ge=2, le=64, description="completions sampled per prompt (the group whose mean and "
                                 "standard deviation normalize each completion's reward into its advantage; TRL's `num_generations`).")
    grpo_kl_coef: float = Field(0.04, ge=0, le=10, description="β of the KL penalty to the reference policy (Shao et al. 2024's "
                                "0.04; 0 drops the reference).")
    grpo_temperature: float = Field(1.0, gt=0, le=2, description="sampling temperature of the rollouts.")
    grpo_max_new_tokens: int = Field(64, ge=1, le=2048, description="tokens a rollout may generate (fewer when the prompt "
                                     "leaves less of `max_seq_len`).")


@training_method("merge", summary="no training, the job's `merge` combines checkpoints into a new one", trains=False)
class MergeConfig(MethodConfig):
    """A merge reads its job's ``merge`` (:class:`~services.common.contracts.MergeSpec`), no recipe field of its own."""


@training_method("primitives", summary="the client's own training loop through Tinker's primitives (`forward_backward`, `optim_step`, "
                 "`sample`; the `/api/v1` routes of Tinker's service API): such a job is made by Tinker's `create_lora_training_client`, "
                 "never by `POST /v1/training/jobs`", adapters=("lora",), trains=False)
class PrimitivesConfig(MethodConfig):
    """A live model reads ``lora_r`` (the client's rank) and ``seed``; the client chooses the rest in its own calls."""


@training_method("orpo", summary="Odds Ratio Preference Optimization on `preference` datasets, with no reference model",
                 formats=("preference",))
class ORPOConfig(MethodConfig):
    """Odds Ratio Preference Optimization (Hong et al. 2024)."""

    orpo_lambda: float = Field(0.1, gt=0, le=10, description="λ weighting the odds-ratio loss against the chosen answers' "
                               "next-token loss (Hong et al. 2024, eq. 6; TRL's `ORPOConfig.beta`, default 0.1).")
