"""A trained model's registry entry says whether its run trained it to call tools (the playground reads it)."""

from __future__ import annotations

from posttrain.training.config import GRPOConfig, SFTConfig
from posttrain.training.jobs import tool_environment


def test_a_run_records_the_tool_environment_it_trained_in() -> None:
    repair = GRPOConfig(model="m", domains=["repair.off_by_one"], environment={"name": "code_repair"})
    assert tool_environment(repair) == "code_repair"
    assert tool_environment(GRPOConfig(model="m", domains=["arith.add.int"])) is None  # single-turn answers
    demonstrations = {
        "domains": [{"name": "repair.off_by_one", "difficulty": 2}],
        "tasks_per_domain": 1,
        "environment": {"name": "code_repair"},
    }
    assert tool_environment(SFTConfig(model="m", demonstrations=demonstrations)) == "code_repair"
    assert tool_environment(SFTConfig(model="m", episodes_path="stored.jsonl")) == "episodes"
    assert tool_environment(SFTConfig(model="m", domains=["arith.add.int"])) is None
