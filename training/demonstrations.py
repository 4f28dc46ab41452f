"""Expert demonstrations of the terminal-programming workload, made by a scripted agent in real sandboxes.

A ``repair.*`` task knows its fix: its reference is the module without the planted defects (for
``repair.humaneval``, the prompt with HumanEval's canonical body). :class:`ScriptedAgent` plays an expert
through the real ``code_repair`` environment, token in and token out: it lists the files, runs the visible
tests, reads the module (those two in either order), applies the fix with ``edit_file`` (one call per
changed hunk, in one turn or one a turn), runs the tests again and replies. Every tool output in the
episode is what the sandbox really printed, because the environment ran the calls. The commands, the
order and the words vary with the seed, so a model trained on them does not learn one fixed script.

    episodes = demonstrations(tasks, tokenizer, env_config, sampling, service, pool, seed=0)
    write_episodes(path, episodes)   # JSON lines, the same form as sampled episodes (environments/base.py)
    SFTConfig(episodes_path=path, ...)  # SFT on the policy's tokens only

    SFTConfig(demonstrations={"domains": [{"name": "repair.off_by_one", "difficulty": 2}]}, output_dir=..., ...)
    # the run makes them itself (demonstration_file): <output_dir>/demonstrations.jsonl, made once

Only episodes whose edits all applied and whose final module passes every hidden test are kept. The agent's turns are tokenised once
each, with the end-of-turn token the policy would have sampled, so an episode is the sequence of ids
sampling would have produced had the policy written the same text.
"""

from __future__ import annotations

import difflib
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from posttrain.platform.sandbox import SandboxPool
from posttrain.platform.tasks.domains import generate
from posttrain.platform.tasks.domains.families.repair_tasks import MODULE, VISIBLE
from posttrain.platform.verifiers import PoolConfig, TaskSpec, VerifierService
from posttrain.training.config import DemonstrationsConfig, EnvironmentConfig, SamplingConfig
from posttrain.training.environments.base import Episode, write_episodes
from posttrain.training.environments.code_repair import CodeRepair
from posttrain.training.environments.runner import open_pool
from posttrain.training.inference import Completion

TOOLS = ["bash", "read_file", "edit_file", "list_dir"]
"""The tools a demonstration uses; the environment must offer each."""


@dataclass(frozen=True)
class Edit:
    """One ``edit_file`` call: ``old`` occurs once in the module when the call runs."""

    old: str
    new: str
    function: str | None  # the function the hunk is in, for the reply


def fix_edits(module: str, fixed: str) -> list[Edit]:
    """The edits that turn ``module`` into ``fixed``, one per changed hunk, last hunk first (so each
    ``old`` is found in the text the earlier edits left), each ``old`` widened by whole lines of context
    until it occurs once."""
    before, after = module.splitlines(keepends=True), fixed.splitlines(keepends=True)
    hunks = [op for op in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes() if op[0] != "equal"]
    edits, text = [], module
    for _, i1, i2, j1, j2 in reversed(hunks):
        lo, hi, below = i1, i2, True
        while not ((old := "".join(before[lo:hi])) and text.count(old) == 1):
            if lo == 0 and hi == len(before):
                raise ValueError("no unique text to anchor an edit on; the module repeats itself")
            if (below and hi < len(before)) or lo == 0:
                hi += 1
            else:
                lo -= 1
            below = not below
        new = "".join(before[lo:i1] + after[j1:j2] + before[i2:hi])
        edits.append(Edit(old, new, _function_at(before, i1)))
        text = text.replace(old, new, 1)
    if text != fixed:
        raise ValueError("the edits do not reproduce the fixed module")
    return edits


def _function_at(lines: Sequence[str], index: int) -> str | None:
    for line in reversed(lines[: index + 1]):
        if match := re.match(r"def (\w+)", line):
            return match.group(1)
    return None


def _call(name: str, **arguments: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


_LOOK = ["Let me see what is in the project.", "First, the files.", "I'll start by listing the files."]
_TEST = ["Let me run the visible tests.", "Running the tests to see what fails.", "Now the tests."]
_READ = ["Let me read the module.", "Now the code itself.", "Reading solution.py."]
_FIX = [
    "The failing output points at {where}. Fixing it.",
    "Found it in {where}; here is the fix.",
    "The bug is in {where}. Editing.",
]
_AGAIN = ["Checking the tests again.", "Running the tests once more.", "Let me confirm the fix."]
_DONE = [
    "DONE. Fixed {where} in solution.py; the visible tests pass.",
    "DONE: {where} repaired, and the tests pass.",
    "DONE. solution.py is fixed ({where}) and test_visible.py passes.",
]  # the task asks for DONE


def expert_script(task: TaskSpec, seed: int) -> list[str]:
    """The assistant turns of one demonstration of ``task``, varied by ``seed``."""
    files, reference = task.metadata.get("files"), task.reference
    if not isinstance(files, dict) or MODULE not in files or not reference:
        raise ValueError(
            f"task {task.task_id or task.domain!r} is not a repair task with a reference; demonstrations need one"
        )
    module = files[MODULE]
    fixed = reference if reference.endswith("\n") or not module.endswith("\n") else reference + "\n"
    edits = fix_edits(module, fixed)
    rng = random.Random(seed)
    where = ", ".join(dict.fromkeys(e.function or "the module" for e in reversed(edits)))
    python = rng.choice(["python3", "python3 -B", "python3 -u"])  # the sandbox has python3, not python
    test = _call("bash", command=f"{python} {VISIBLE}")
    read = rng.choice([_call("read_file", path=MODULE), _call("bash", command=f"cat {MODULE}")])
    look = rng.choice([_call("list_dir", path="."), _call("bash", command="ls"), _call("bash", command="ls -l")])
    say = lambda choices, text: (rng.choice(choices).format(where=where) + "\n" + text).strip()  # noqa: E731
    first = [say(_TEST, test), say(_READ, read)]
    rng.shuffle(first)
    calls = [_call("edit_file", path=MODULE, old=e.old, new=e.new) for e in edits]
    if len(calls) == 1 or rng.random() < 0.5:  # every edit in one turn
        fixes = ["\n".join([rng.choice(_FIX).format(where=where), *calls])]
    else:  # one edit a turn
        fixes = [
            rng.choice(_FIX).format(where=e.function or "the module") + "\n" + call for e, call in zip(edits, calls)
        ]
    return [say(_LOOK, look), *first, *fixes, say(_AGAIN, test), rng.choice(_DONE).format(where=where)]


class ScriptedAgent:
    """A policy client that plays a script's turns in order, each tokenised once and closed by the
    end-of-turn token (log-prob 0: the expert chose it for certain)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, turns: Sequence[str]) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no end-of-turn token; a scripted turn cannot end")
        self.tokenizer, self.turns, self.played = tokenizer, list(turns), 0

    @property
    def version(self) -> int:
        return 0

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion:
        if self.played >= len(self.turns):
            raise RuntimeError("the script has no turn left; the environment asked for more turns than it holds")
        text = self.turns[self.played]
        self.played += 1
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
        limit = max_new_tokens or sampling.max_new_tokens
        return Completion(ids[:limit], [0.0] * min(len(ids), limit), finished=len(ids) <= limit)


def demonstrations(
    tasks: Iterable[TaskSpec],
    tokenizer: PreTrainedTokenizerBase,
    env_config: EnvironmentConfig,
    sampling: SamplingConfig,
    service: VerifierService,
    pool: SandboxPool,
    *,
    seed: int = 0,
) -> list[Episode]:
    """One scripted episode per task through the real ``code_repair`` environment, kept when the final
    module passes every hidden test (the rubric's own verdict, stored on the episode)."""
    environment = CodeRepair(env_config, tokenizer, sampling)
    if missing := [t for t in TOOLS if t not in environment.tools]:
        raise ValueError(
            f"the environment does not offer {missing}, which demonstrations use; add them to environment.tools"
        )
    kept = []
    for index, task in enumerate(tasks):
        try:
            script = expert_script(task, seed * 100_003 + index)
        except ValueError:  # a module whose fix no edit can anchor: no demonstration of it
            continue
        if len(script) > env_config.max_turns:
            raise ValueError(
                f"a demonstration takes {len(script)} turns, over environment.max_turns={env_config.max_turns}; raise it"
            )
        with pool.acquire() as sandbox:
            episode = environment.rollout(ScriptedAgent(tokenizer, script), task, sandbox)
            if episode.stop_reason == "answer":
                episode.verdict = environment.score(episode, service, sandbox)
        edits_ran = all(c.status == "ok" for c in episode.tool_calls if c.name == "edit_file")
        if episode.verdict is not None and episode.verdict.passed and edits_ran:
            kept.append(episode)
    return kept


def demonstration_tasks(config: DemonstrationsConfig) -> list[TaskSpec]:
    """The ``train``-split tasks ``config`` demonstrates (never an eval task: those stay held out)."""
    return [
        t
        for i, d in enumerate(config.domains)
        for t in generate(d.name, config.tasks_per_domain, seed=config.seed * 1000 + i, difficulty=d.difficulty)
    ]


def demonstration_file(config: DemonstrationsConfig, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """The demonstrations of ``config`` as an episodes file at ``path``: the file a run made before for the
    same config and tokenizer (its ``.config.json`` beside it says which), else made now in sandboxes of the
    platform's pool (the sandbox settings), graded by a verifier service of its own, and written at once."""
    path = Path(path)
    made_for = json.dumps(
        {"config": config.model_dump(mode="json"), "tokenizer": tokenizer.name_or_path, "vocab": len(tokenizer)},
        sort_keys=True,
    )
    stamp = path.with_suffix(".config.json")
    if path.is_file() and stamp.is_file() and stamp.read_text() == made_for:
        return path
    tasks = demonstration_tasks(config)
    pool = open_pool(1)
    service = VerifierService(PoolConfig(workers=1))
    try:
        sampling = SamplingConfig(max_new_tokens=config.environment.max_episode_tokens)
        episodes = demonstrations(tasks, tokenizer, config.environment, sampling, service, pool, seed=config.seed)
    finally:
        service.close()
        pool.close()
    if not episodes:
        raise RuntimeError(
            f"none of the {len(tasks)} scripted repairs of {[d.name for d in config.domains]} passed the hidden "
            "tests in this machine's sandboxes: a sandbox that cannot run python3 fails them all (see the "
            "[sandbox] settings and the job's log)"
        )
    write_episodes(path, episodes)
    stamp.write_text(made_for)
    return path
