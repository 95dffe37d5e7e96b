"""The reference agent's recipe under a benchmark's policy: what it sends, and the method and adapter its job will
really have (a lock wins), so its training rows are of the format the job trains on."""

from __future__ import annotations

from crucible.agent import FULL_LEARNING_RATE, AgentConfig, BaselineAgent


def card(lock: dict[str, object], allow: object = "all") -> dict[str, object]:
    return {"recipe": {"lock": lock, "allow": allow}, "editable": ["data", "trainer", "harness"]}


def test_an_open_recipe_gets_the_agents_method_adapter_and_a_full_fine_tuning_learning_rate() -> None:
    agent = BaselineAgent(None, AgentConfig.for_steps(4, method="dpo", adapter="full"))  # type: ignore[arg-type]
    open_card = card({})
    assert (agent.effective(open_card, "method"), agent.effective(open_card, "adapter")) == ("dpo", "full")
    recipe = agent.recipe_for(open_card)
    assert (recipe["method"], recipe["adapter"], recipe["learning_rate"]) == ("dpo", "full", FULL_LEARNING_RATE)


def test_a_lock_wins_over_the_agents_options_and_nothing_of_them_is_sent() -> None:
    agent = BaselineAgent(None, AgentConfig.for_steps(4, method="dpo", adapter="full"))  # type: ignore[arg-type]
    locked = card({"method": "sft", "adapter": "lora"})
    assert (agent.effective(locked, "method"), agent.effective(locked, "adapter")) == ("sft", "lora")
    assert {"method", "adapter", "learning_rate"}.isdisjoint(agent.recipe_for(locked))
    allow_list = card({}, allow=["max_steps"])  # method and adapter not allowed: the trainer's defaults
    assert (agent.effective(allow_list, "method"), agent.effective(allow_list, "adapter")) == ("sft", "lora")
    assert set(agent.recipe_for(allow_list)) == {"max_steps"}
