"""Rollouts (token in, token out), the synchronous and pipelined GRPO loops, and resuming them.

A random tiny model almost never solves a real task, so the loop mechanics are exercised
with a verifier kind registered here that gives partial credit (the share of lowercase
letters in the completion): real verifier service, real rewards with variance.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from conftest import reachable_dir
from required_parts import require
from test_training_tiny import tiny_policy_dir

from posttrain.platform.settings import get_settings
from posttrain.platform.verifiers import BaseSpec, TaskSpec, Verdict, VerifierKind, VerifierService, register_verifier
from posttrain.platform.verifiers.pool import PoolConfig
from posttrain.training.config import GRPOConfig
from posttrain.training.inference import Completion
from posttrain.training.learner import completion_batch, completion_logprobs, prompt_passes, shared_prompt_logprobs
from posttrain.training.logprob_check import LogprobMismatchError
from posttrain.training.loop import reward_se, sampled_nll, train_grpo
from posttrain.training.modeling import load_policy
from posttrain.training.rollout import RolloutGroup, SamplingConfig, Trajectory, generate_groups
from posttrain.training.rollouts.base import Generated, PolicySampler, RolloutBatch, assemble_batch
from posttrain.training.scheduler import DomainSpec, Scheduler, SchedulerConfig


def _lowercase_share(spec: BaseSpec, completion: str, task: TaskSpec) -> Verdict:
    share = sum(c.islower() for c in completion) / max(1, len(completion))
    return Verdict.of_score(share, threshold=0.5)


register_verifier(
    VerifierKind(name="test_lowercase_share", spec_model=BaseSpec, check=_lowercase_share, isolation="thread"),
    replace=True,
)

TASKS = [
    TaskSpec(domain="lower", prompt=f"Write lowercase {i}", verifier={"kind": "test_lowercase_share"}, task_id=f"l{i}")
    for i in range(8)
]
DOMAINS = [DomainSpec(name="lower", tasks=TASKS)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_policy_dir(tmp_path_factory.mktemp("grpo") / "tiny")


@pytest.fixture(scope="module")
def service() -> Iterator[VerifierService]:
    with VerifierService(PoolConfig(workers=1)) as svc:
        yield svc


def _config(**overrides: object) -> GRPOConfig:
    base: dict[str, object] = dict(
        domains=DOMAINS,
        scheduler=SchedulerConfig(batch_size=2, seed=0),
        group_size=4,
        max_new_tokens=6,
        lr=1e-3,
        max_steps=3,
        micro_batch_size=4,
        device="cpu",
    )
    return GRPOConfig(**(base | overrides))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollouts_record_the_exact_tokens_and_behaviour_logprobs(tiny_dir: Path, temperature: float) -> None:
    model, tokenizer = load_policy(tiny_dir)
    torch.manual_seed(0)
    groups = generate_groups(
        model, tokenizer, TASKS[:2], group_size=3, sampling=SamplingConfig(max_new_tokens=8, temperature=temperature)
    )
    assert [len(g.trajectories) for g in groups] == [3, 3]
    flat = [t for g in groups for t in g.trajectories]
    for t in flat:
        assert 1 <= len(t.completion_ids) <= 8
        assert len(t.behaviour_logprobs) == len(t.completion_ids)
        assert t.finished == (t.completion_ids[-1] == tokenizer.eos_token_id)
        assert tokenizer.pad_token_id not in t.completion_ids
        assert t.text == tokenizer.decode(t.completion_ids, skip_special_tokens=True)
    # the learner, scoring the same ids in its own layout, reproduces the behaviour log-probs: ratio 1
    batch = completion_batch(flat, [0.0] * len(flat), tokenizer.pad_token_id)
    with torch.no_grad():
        learner = completion_logprobs(model, batch, torch.device("cpu"), temperature)
    torch.testing.assert_close(learner * batch.mask, batch.old_logprobs, atol=1e-4, rtol=1e-4)
    assert (batch.old_logprobs < 0).sum() == batch.mask.sum()  # real log-probs on every completion token
    # the update's path, each group's prompt run once and its cache repeated: the same log-probs and gradients, and
    # under activation checkpointing too (the prompt's row run as is, the completions' layers checkpointed reading
    # the cache): without the cache kept there, the completions would be scored with no prompt at all
    cpu = torch.device("cpu")
    for group in groups:
        rows = completion_batch(group.trajectories, [1.0] * 3, tokenizer.pad_token_id)
        grads = []
        for score, checkpointing in (
            (lambda: completion_logprobs(model, rows, cpu, temperature), False),
            (lambda: shared_prompt_logprobs(model, group.trajectories, cpu, temperature), False),
            (lambda: shared_prompt_logprobs(model, group.trajectories, cpu, temperature), True),
        ):
            if checkpointing:
                model.activation_checkpointing_enable({"use_reentrant": False})
            model.train()
            model.zero_grad()
            try:
                values = score() * rows.mask
                values.sum().backward()
            finally:
                model.activation_checkpointing_disable()
                model.eval()
            torch.testing.assert_close(values.detach(), rows.old_logprobs, atol=1e-4, rtol=1e-4)
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert grads[0].norm() > 0
        torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-3)
        torch.testing.assert_close(grads[2], grads[0], atol=1e-5, rtol=1e-3)
    assert [len(p) for p in prompt_passes(range(6), flat, 2)] == [2, 1, 2, 1]  # by prompt, then micro-batch


def test_sync_loop_updates_and_records_every_metric(tiny_dir: Path, service: VerifierService) -> None:
    seen: dict[int, dict[str, float]] = {}
    groups_seen: list[int] = []
    result = train_grpo(
        _config(kl_coef=0.05),
        str(tiny_dir),
        service=service,
        on_metrics=seen.__setitem__,
        on_groups=lambda step, groups: groups_seen.append(len(groups)),
    )
    assert result.steps == 3 and sorted(seen) == [1, 2, 3]
    for name in (
        "train/loss",
        "train/kl",
        "train/clip_frac_low",
        "train/clip_frac_high",
        "train/ratio_mean",
        "train/grad_norm",
        "rollout/reward_mean",
        "rollout/tokens_per_s",
        "verifier/latency_s",
        "pipeline/queue_depth",
        "pipeline/staleness_mean",
        "pipeline/learner_busy_frac",
    ):
        assert name in seen[3], name
    assert all(torch.isfinite(torch.tensor(v)) for v in seen[3].values())
    assert seen[1]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # on-policy, first update
    assert seen[1]["train/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any update
    assert seen[3]["train/kl"] > 0
    assert 0 < seen[1]["rollout/reward_mean"] < 1
    assert groups_seen == [2, 2, 2]
    untouched, _ = load_policy(tiny_dir)
    assert result.model is not None
    assert not torch.equal(
        result.model.state_dict()["model.embed_tokens.weight"], untouched.state_dict()["model.embed_tokens.weight"]
    )


def test_switching_a_saving_off_costs_time_and_never_changes_the_update(
    tiny_dir: Path, service: VerifierService
) -> None:
    """The switches ``bench/learning.py --ablation`` measures each saving with: running every completion with its
    whole prompt (``shared_prompt: false``), and zero-signal groups through forward and backward at advantage 0
    (``skip_zero_signal: false``) train the same weights as the savings on, from the same seed; so does recomputing
    activations in the backward pass (``activation_checkpointing``, which saves memory for compute)."""
    from posttrain.training.learner import select_groups

    weights = []
    for switches in (
        {"algorithm": {}},
        {"algorithm": {"shared_prompt": False, "skip_zero_signal": False}},
        {"activation_checkpointing": True},
    ):
        result = train_grpo(_config(max_steps=2, **switches), str(tiny_dir), service=service)
        assert result.model is not None
        weights.append(result.model.state_dict()["model.embed_tokens.weight"].clone())
    assert not torch.equal(weights[0], load_policy(tiny_dir)[0].state_dict()["model.embed_tokens.weight"])
    torch.testing.assert_close(weights[1], weights[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(weights[2], weights[0], atol=2e-5, rtol=1e-4)
    flat = [Trajectory([1], [2], [-0.5], "x", True) for _ in range(8)]
    groups = [
        RolloutGroup(task=TASKS[0], trajectories=flat[:4], policy_version=0),
        RolloutGroup(task=TASKS[1], trajectories=flat[4:], policy_version=0),
    ]
    for t, r in zip(flat, [0, 1, 0, 1, 1, 1, 1, 1]):
        t.reward = float(r)
    kept, advantages, zero = select_groups(groups, _config())
    assert len(kept) == 4 and zero == 1
    kept, advantages, zero = select_groups(groups, _config(algorithm={"skip_zero_signal": False}))
    assert len(kept) == 8 and advantages[4:] == [0.0] * 4 and zero == 1


class Alternating:
    """An engine whose completions of every prompt alternate between two replies, ``a`` and ``B``."""

    version = 0

    def __init__(self, tokenizer: object) -> None:
        self.replies = [tokenizer.encode(reply, add_special_tokens=False) for reply in ("a", "B")]  # type: ignore[attr-defined]

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[list[Completion]]:
        return [
            [Completion(self.replies[i % 2], [-0.5] * len(self.replies[i % 2]), True) for i in range(n)]
            for _ in prompts
        ]


register_verifier(
    VerifierKind(
        name="test_never",
        spec_model=BaseSpec,
        check=lambda spec, completion, task: Verdict.of_score(0.0, threshold=0.5),
        isolation="thread",
    ),
    replace=True,
)


def test_extra_draws_ask_only_for_the_groups_with_a_signal_the_step_lacks(
    tiny_dir: Path, service: VerifierService
) -> None:
    """Dynamic sampling on the sync backend: a group of ``mixed`` (lowercase share: ``a`` scores 1, ``B`` 0) always
    has a learning signal, one of ``flat`` (scores 0 whatever the reply) never; each extra draw asks for as many
    prompts as the step still lacks groups with a signal, so no group is sampled only to be cut from the update,
    and the step logs all its groups with a signal beside the ones the update took."""
    from concurrent.futures import ThreadPoolExecutor

    from posttrain.training.loop import batch_metrics
    from posttrain.training.rollouts.base import RolloutSetup, has_signal
    from posttrain.training.rollouts.sync import SyncRollouts

    _, tokenizer = load_policy(tiny_dir)
    mixed = [
        TaskSpec(domain="mixed", prompt=t.prompt, verifier={"kind": "test_lowercase_share"}, task_id=f"m{t.task_id}")
        for t in TASKS
    ]
    flat = [
        TaskSpec(domain="flat", prompt=t.prompt, verifier={"kind": "test_never"}, task_id=f"f{t.task_id}")
        for t in TASKS
    ]
    config = _config(
        domains=[DomainSpec(name="mixed", tasks=mixed), DomainSpec(name="flat", tasks=flat)],
        scheduler=SchedulerConfig(batch_size=4, seed=0, curriculum=False),
        max_rollout_batches_per_step=4,
    )
    scheduler = Scheduler(config.scheduler)
    scheduler.set_domains(config.domains)
    sizes: list[int] = []
    draw = scheduler.next_batch
    scheduler.next_batch = lambda size=None: sizes.append(size or 4) or draw(size)  # type: ignore[method-assign]
    with ThreadPoolExecutor(2) as executor:
        setup = RolloutSetup(
            model=None,
            tokenizer=tokenizer,
            scheduler=scheduler,
            config=config,
            version=0,  # type: ignore[arg-type]
            source=str(tiny_dir),
            service=service,
            executor=executor,
        )
        batch = SyncRollouts(setup, Alternating(tokenizer)).next_batch(version=0)
    signal = [has_signal(g) for g in batch.groups]
    assert signal == [g.task.domain == "mixed" for g in batch.groups] and len(signal) == sum(sizes)
    assert len(sizes) > 1 and sizes[0] == 4, sizes  # seed 0 draws some flat groups first
    for i, size in enumerate(sizes[1:], 1):
        assert size == 4 - sum(signal[: sum(sizes[:i])]), sizes
    assert sum(signal) == 4 or len(sizes) == 4
    used = [g for g in batch.groups if has_signal(g)][:4]
    metrics = batch_metrics(batch, 0, used)
    assert metrics["rollout/groups_signal"] == sum(signal) and metrics["rollout/groups"] == len(signal)


def test_pipelined_loop_respects_the_staleness_bound(tiny_dir: Path, service: VerifierService) -> None:
    seen: dict[int, dict[str, float]] = {}
    groups: dict[int, list] = {}  # type: ignore[type-arg]
    result = train_grpo(
        _config(pipeline=True, max_steps=5, max_off_policy_steps=1, queue_size=2),
        str(tiny_dir),
        service=service,
        on_metrics=seen.__setitem__,
        on_groups=groups.__setitem__,
    )
    assert result.steps == 5
    assert all(m["pipeline/staleness_max"] <= 1 for m in seen.values())
    assert any(m["rollout/groups_used"] > 0 for m in seen.values())
    # later steps train on rollouts of a policy that already saw updates (the snapshot was loaded): the
    # fifth step learns as version 4, from groups sampled by version 3 or 4, never the initial 0
    versions = {g.policy_version for g in groups[5]}
    assert versions and versions <= {3, 4}, versions
    assert 0 < seen[5]["pipeline/learner_busy_frac"] <= 1


def _generated(version: int, rewards: list[float]) -> Generated:
    trajectories = [Trajectory([1], [2], [-0.5], "x", True) for _ in rewards]
    group = RolloutGroup(task=TASKS[0], trajectories=trajectories, policy_version=version)
    futures: list[Future[Verdict]] = []
    for r in rewards:
        futures.append(Future())
        futures[-1].set_result(Verdict.of_score(r, threshold=0.5))
    group.verify_futures = futures
    return Generated([group], version, tokens=len(rewards), seconds=0.1)


def test_pipelined_loop_drops_rollouts_older_than_the_bound(tiny_dir: Path, service: VerifierService) -> None:
    # a batch older than the bound is dropped, not trained on (the learner's safety net) ...
    config = _config(
        pipeline=True,
        rollout_processes=0,
        max_off_policy_steps=1,
        max_rollout_batches_per_step=2,
        scheduler=SchedulerConfig(batch_size=1, seed=0),
    )
    made = iter([_generated(0, [0.0, 1.0]), _generated(2, [0.0, 1.0])])
    batch = assemble_batch(RolloutBatch(), lambda: next(made), 3, config, Scheduler(config.scheduler))
    assert batch.stale_dropped == 1 and [g.policy_version for g in batch.groups] == [2]
    # ... and the rollout thread never samples so far ahead that it has to: with no staleness allowed it
    # samples only while the learner waits, with the newest weights
    seen: dict[int, dict[str, float]] = {}
    train_grpo(
        _config(pipeline=True, rollout_processes=0, max_steps=4, max_off_policy_steps=0, queue_size=3),
        str(tiny_dir),
        service=service,
        on_metrics=seen.__setitem__,
    )
    assert all(m["pipeline/staleness_max"] == 0 for m in seen.values())
    assert sum(m["rollout/groups_stale_dropped"] for m in seen.values()) == 0


def test_resumed_run_gives_the_same_next_step_loss(tiny_dir: Path, service: VerifierService, tmp_path: Path) -> None:
    straight = train_grpo(_config(max_steps=3, output_dir=str(tmp_path / "a")), str(tiny_dir), service=service)
    calls = iter(range(100))
    train_grpo(
        _config(max_steps=3, checkpoint_every=2, output_dir=str(tmp_path / "b")),
        str(tiny_dir),
        service=service,
        should_stop=lambda: next(calls) >= 2,
    )
    resumed = train_grpo(_config(max_steps=3, output_dir=str(tmp_path / "b")), str(tiny_dir), service=service)
    assert len(resumed.metrics) == 1 and resumed.steps == 3
    assert resumed.metrics[0]["train/loss"] == pytest.approx(straight.metrics[2]["train/loss"], rel=1e-6, abs=1e-9)
    assert resumed.metrics[0]["rollout/reward_mean"] == straight.metrics[2]["rollout/reward_mean"]
    assert (tmp_path / "b" / "checkpoints" / "step_00000003" / "model" / "config.json").is_file()
    assert not [p for p in (tmp_path / "b" / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_stored_configs_with_the_flat_rollout_keys_load_as_a_backend() -> None:
    """Job configs stored before ``rollout: {backend: ...}`` still load, as the backend they meant."""

    def backend(**flat: object) -> dict[str, object]:
        return _config(**flat).rollout.model_dump()

    assert backend() == {"backend": "sync"}
    assert backend(max_off_policy_steps=2) == {"backend": "sync"}  # it meant nothing without pipeline
    assert backend(pipeline=True) == {
        "backend": "process",
        "workers": 1,
        "threads": None,
        "learner_threads": None,
        "max_off_policy_steps": 1,
        "queue_size": 4,
    }
    assert backend(pipeline=True, rollout_processes=0, queue_size=3, max_off_policy_steps=0) == {
        "backend": "thread",
        "max_off_policy_steps": 0,
        "queue_size": 3,
    }
    assert backend(pipeline=True, rollout_processes=2, rollout_threads=1, learner_threads=None)["workers"] == 2
    ray = backend(
        rollout_workers=3, verifier_actors=2, rollout_worker_gpus=1, ray_address="ray://head:10001", queue_size=1
    )
    assert ray == {
        "backend": "ray",
        "workers": 3,
        "verifier_actors": 2,
        "worker_gpus": 1,
        "address": "ray://head:10001",
        "max_off_policy_steps": 1,
        "queue_size": 1,
    }
    with pytest.raises(
        ValueError, match=r"either as rollout: \{backend: \.\.\.\} or with the older flat keys \['pipeline'\]"
    ):
        _config(pipeline=True, rollout={"backend": "thread"})
    with pytest.raises(ValueError, match="does not match any of the expected tags: 'sync', 'thread', 'process', 'ray'"):
        _config(rollout={"backend": "gpu"})
    with pytest.raises(ValueError, match="workers"):
        _config(rollout={"backend": "process", "workers": 0})


def test_the_learner_rescores_what_the_engine_sampled_and_fails_a_run_that_drifts(
    tiny_dir: Path, service: VerifierService, monkeypatch: pytest.MonkeyPatch
) -> None:
    strict = {"mean_abs_diff": 1e-3, "kl_k3": 1e-4}
    seen: dict[int, dict[str, float]] = {}
    train_grpo(_config(max_steps=2, logprob_check=strict), str(tiny_dir), service=service, on_metrics=seen.__setitem__)
    for metrics in seen.values():  # the engine's recorded log-probs are the learner's, to float precision
        assert metrics["rollout/logprob_tokens"] > 0 and metrics["rollout/logprob_mean_abs_diff"] < 1e-4, metrics
    # a rollout worker that tags each new version but keeps sampling from the weights it started with
    monkeypatch.setattr(PolicySampler, "load", lambda self, state, version: setattr(self, "version", version))
    with pytest.raises(LogprobMismatchError, match="disagree over .* tokens: mean_abs_diff"):
        train_grpo(
            _config(
                pipeline=True, rollout_processes=0, max_steps=4, max_off_policy_steps=0, lr=1e-2, logprob_check=strict
            ),
            str(tiny_dir),
            service=service,
        )


# ----------------------------------------------------------------------------- rollouts through the real vLLM
# vLLM runs from its own environment (.venv-vllm, make vllm) in a process of its own; the learner here. vLLM's CPU
# attention has no kernel for the tiny model's 16-wide heads, so these run the built-in SmolLM2 in float32.


def _vllm_config(**overrides: object) -> GRPOConfig:
    return _config(**({"rollout": {"backend": "vllm", "dtype": "float32", "max_model_len": 1024}, "lr": 1e-5,
                       "logprob_check": {"mean_abs_diff": 1e-3, "kl_k3": 1e-5}} | overrides))  # fmt: skip


@pytest.mark.requires("vllm")
def test_the_vllm_backend_samples_through_vllm_and_gets_every_update(real_model_dir, service: VerifierService) -> None:  # type: ignore[no-untyped-def]
    """GRPO with rollouts from vLLM in its own environment: every update reaches it through its workers' reload
    (versioned: each step's groups were sampled by the previous update's weights), and the log-prob gate, on at
    every step with a float32 tolerance, finds vLLM's recorded log-probs equal to the learner's."""
    seen: dict[int, dict[str, float]] = {}
    groups: dict[int, list[RolloutGroup]] = {}
    result = train_grpo(_vllm_config(max_steps=3), str(real_model_dir.path), service=service,
                        on_metrics=seen.__setitem__, on_groups=groups.__setitem__)  # fmt: skip
    assert result.steps == 3
    assert all(len(g.trajectories) == 4 for s in (1, 2, 3) for g in groups[s])  # the whole group from one request
    assert [sorted({g.policy_version for g in groups[s]}) for s in (1, 2, 3)] == [[0], [1], [2]]
    assert all(m["rollout/logprob_tokens"] > 0 and m["rollout/logprob_mean_abs_diff"] < 1e-4 for m in seen.values()), (
        seen
    )
    with pytest.raises(ValueError, match="loads the policy from its model directory"):
        train_grpo(_vllm_config(max_steps=1), load_policy(real_model_dir.path), service=service)


@pytest.mark.requires("vllm")
def test_the_vllm_backend_runs_a_multi_turn_environments_episodes_through_vllms_engine_loop(  # type: ignore[no-untyped-def]
    real_model_dir, service: VerifierService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool_use environment on vLLM rollouts (what the smollm2-tools preset runs with ``--rollout vllm``): every
    turn of every episode is a request to the vLLM process, whose engine loop batches the episodes' concurrent
    turns, sampled from the weights of the last update; the learner scores what vLLM recorded."""
    require("bubblewrap")
    sandboxes = reachable_dir()  # the sandbox uid cannot enter pytest's private tmp_path
    monkeypatch.setenv("POSTTRAIN_SANDBOX__ROOT_DIR", str(sandboxes))
    get_settings.cache_clear()
    seen: dict[int, dict[str, float]] = {}
    groups: dict[int, list[RolloutGroup]] = {}
    try:
        result = train_grpo(_vllm_config(max_steps=2, max_new_tokens=12, group_size=2,
                                         environment={"name": "tool_use", "max_turns": 2, "concurrency": 4}),
                            str(real_model_dir.path), service=service, on_metrics=seen.__setitem__,
                            on_groups=groups.__setitem__)  # fmt: skip
    finally:
        get_settings.cache_clear()
        shutil.rmtree(sandboxes, ignore_errors=True)
    assert result.steps == 2
    episodes = [t for s in (1, 2) for g in groups[s] for t in g.trajectories]
    assert all(len(g.trajectories) == 2 for s in (1, 2) for g in groups[s])
    assert episodes and all(t.loss_mask is not None and t.episode is not None for t in episodes)
    assert [sorted({g.policy_version for g in groups[s]}) for s in (1, 2)] == [[0], [1]]
    assert all(m["rollout/logprob_tokens"] > 0 and m["rollout/logprob_mean_abs_diff"] < 1e-4 for m in seen.values()), (
        seen
    )


def test_a_steps_reward_se_is_over_its_prompts_and_the_sampled_nll_over_the_policys_own_tokens() -> None:
    """``rollout/reward_se``: the spread of the groups' mean rewards over the root of their number (a prompt's
    samples share its difficulty: one cluster); ``rollout/sampled_nll``: the mean -log p of the sampled tokens,
    environment tokens of an episode left out. Checked against a hand computation."""
    task = TaskSpec(domain="sums", prompt="1+1?", verifier={"kind": "exact_match"}, reference="2")

    def group(rewards: list[float]) -> RolloutGroup:
        return RolloutGroup(task, [Trajectory([1], [2], [-0.5], "", True, reward=r) for r in rewards], 0)

    groups = [group([1.0, 1.0, 0.0, 0.0]), group([1.0, 1.0, 1.0, 1.0]), group([0.0, 0.0, 0.0, 0.0])]
    means = [0.5, 1.0, 0.0]  # sample variance 0.25, over 3 groups: SE = sqrt(0.25 / 3)
    assert sum((m - 0.5) ** 2 for m in means) / 2 == pytest.approx(0.25)
    assert reward_se(groups) == pytest.approx((0.25 / 3) ** 0.5)
    assert reward_se(groups[:1]) == 0.0  # one prompt: no spread over prompts to measure
    # two prompts with the same mean: no spread over prompts, whatever the spread within each
    assert reward_se([group([1.0, 0.0]), group([1.0, 0.0])]) == 0.0
    episode = Trajectory([1], [5, 6, 7, 8], [-1.0, -9.0, -9.0, -3.0], "", True, loss_mask=[1, 0, 0, 1])
    plain = Trajectory([1], [5, 6], [-0.5, -1.5], "", True)
    assert sampled_nll([episode, plain]) == pytest.approx((1.0 + 3.0 + 0.5 + 1.5) / 4)
