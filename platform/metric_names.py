"""The names of a training run's metrics: the trainers write them, the console charts them, from here.

Per step of a run (``Metric`` rows at step ``n``): the learner's ``train/*``, the rollout side's
``rollout/*``, ``verifier/*`` and ``pipeline/*``, a multi-turn environment's ``env/*``, ``time/step_s`` and ``memory/*``. A whole-recipe job logs its SFT
warm-up and control arm under :data:`SFT_PREFIX` and :data:`CONTROL_PREFIX` (the same ``train/``
names, renamed), and evaluations under ``eval/`` (``eval/pass@1``, ``eval/<domain>/pass@1``, ...).
"""

from __future__ import annotations

# --- the learner (SFT and GRPO)
LOSS = "train/loss"
LR = "train/lr"
GRAD_NORM = "train/grad_norm"
TRAINED_TOKENS = "train/tokens"
TRAIN_TOKENS_PER_S = "train/tokens_per_s"
KL = "train/kl"
RATIO_MEAN = "train/ratio_mean"
RATIO_MAX = "train/ratio_max"
CLIP_FRAC_LOW = "train/clip_frac_low"
CLIP_FRAC_HIGH = "train/clip_frac_high"

# --- GRPO's rollouts, verification and pipeline
REWARD_MEAN = "rollout/reward_mean"
PASS_RATE = "rollout/pass_rate"
REWARD_SE = "rollout/reward_se"  # the SE of the step's mean reward over its prompts (each prompt's samples one cluster)
SAMPLED_NLL = "rollout/sampled_nll"  # mean -log p of the sampled tokens: the policy's entropy as sampled, estimated
COMPLETION_LEN_MEAN = "rollout/completion_len_mean"
TRUNCATED_FRAC = "rollout/truncated_frac"
ROLLOUT_TOKENS_PER_S = "rollout/tokens_per_s"
GROUPS = "rollout/groups"
GROUPS_USED = "rollout/groups_used"  # the groups the update took: those with a signal, at most the batch size
GROUPS_SIGNAL = (
    "rollout/groups_signal"  # the step's groups whose rewards differed, all of them (the learning signal drawn)
)
GROUPS_STALE_DROPPED = "rollout/groups_stale_dropped"
TASKS_SKIPPED_QUIET = "rollout/tasks_skipped_quiet"  # draws so far of a task whose last groups had no signal, skipped
LOGPROB_PREFIX = "rollout/logprob_"  # + the figures of the train/inference log-prob check
VERIFIER_LATENCY_S = "verifier/latency_s"
VERIFIER_INFRA_ERRORS = "verifier/infra_errors"
QUEUE_DEPTH = "pipeline/queue_depth"
STALENESS_MEAN = "pipeline/staleness_mean"
STALENESS_MAX = "pipeline/staleness_max"
LEARNER_BUSY_FRAC = "pipeline/learner_busy_frac"
BATCHES_IN_FLIGHT = "pipeline/batches_in_flight"
PUBLISH_S = "pipeline/publish_s"
WORKERS_REPLACED = "pipeline/workers_replaced"
ACTORS_REPLACED = "pipeline/actors_replaced"
BATCHES_REDONE = "pipeline/batches_redone"
STEP_S = "time/step_s"
UPDATE_S = "time/update_s"  # the learner's update and weight publish of a step
# the process's peak resident set so far (GiB) when the step's rollouts were in and when its update was done: the
# step and phase where it rises is where a run's memory goes
PEAK_RSS_ROLLOUT_GB = "memory/peak_rss_rollout_gb"
PEAK_RSS_GB = "memory/peak_rss_gb"

# --- a multi-turn environment's episodes (per step)
ENV_TURNS_MEAN = "env/turns_mean"
ENV_TOOL_CALLS_MEAN = "env/tool_calls_mean"
ENV_TOOL_ERRORS = "env/tool_errors"
ENV_TOOL_LATENCY_S = "env/tool_latency_s"
ENV_EPISODE_S = "env/episode_s"
ENV_INFRA_REDONE = "env/infra_redone"
ENV_UNSCORED = "env/unscored"
ENV_ANSWERED_FRAC = "env/answered_frac"

# --- evaluation and the stages of a whole-recipe job
EVAL_PREFIX = "eval/"
EVAL_PASS_AT_1 = "eval/pass@1"
EVAL_PASS_RATE = "eval/pass_rate"
SFT_PREFIX = "sft/"
CONTROL_PREFIX = "control/"
SFT_LOSS = SFT_PREFIX + LOSS.removeprefix("train/")


def renamed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """A stage's learner metrics under ``prefix`` (``train/loss`` -> ``sft/loss``)."""
    return {prefix + k.removeprefix("train/"): v for k, v in metrics.items()}
