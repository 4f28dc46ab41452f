"""A trained model's general check beside the model it was trained from, and the one rule that calls it a regression.

The general check is the held-out tasks of domains a run never trains on (``general/...``), answered by the model
a run starts from and by the model it trains, task by task. Their paired difference (``after - before``, its SE
clustered by task source: :func:`posttrain.platform.stats.paired_difference`) is stored on the trained model's row,
``meta["general_check"]``, by the job that measured it; the Models page, the Compare tab and ``posttrain models list``
show it, and deploying a model whose check fell beyond twice its SE needs ``allow_regression``::

    check = GeneralCheck.from_difference("smollm2-135m-instruct", arena["general"], job_id=12)
    check.regressed            # delta < -2 * se (delta < 0 where se is 0)
    check.describe()           # general check fell 16.4 ± 3.1 points below smollm2-135m-instruct (paired SE, 128 tasks)
    GeneralCheck.of(model)     # what a registered model's row holds; None: never measured
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from posttrain.platform.stats import fell_beyond

META_KEY = "general_check"
REGRESSION_SES = 2.0  # a drop beyond this many paired SEs is a regression
NOT_MEASURED = "general check: not measured"


def regressed(delta: float, se: float) -> bool:
    """The one rule: the general check fell beyond ``REGRESSION_SES`` paired standard errors (with no spread to measure,
    ``se`` 0, any drop), as the tier card flags a tier's quality (:func:`~posttrain.platform.stats.fell_beyond`)."""
    return fell_beyond(delta, se, REGRESSION_SES)


@dataclass(frozen=True)
class GeneralCheck:
    """``after - before`` on the general check's tasks (fractions; x100 for points), paired task by task."""

    against: str  # the registered model it was trained from, which answered the same tasks
    before: float
    after: float
    delta: float
    se: float
    tasks: int
    clusters: int | None = None  # the sources the SE was clustered over (None: every task its own)
    job_id: int | None = None  # the job that measured both

    @property
    def regressed(self) -> bool:
        return regressed(self.delta, self.se)

    @classmethod
    def from_difference(cls, against: str, difference: dict[str, Any], *, job_id: int | None = None) -> GeneralCheck:
        """From a :class:`posttrain.platform.stats.Difference` as a dict (the arena's ``general``)."""
        return cls(against=against, before=float(difference["a"]), after=float(difference["b"]),
                   delta=float(difference["delta"]), se=float(difference["se"]), tasks=int(difference["tasks"]),
                   clusters=difference.get("clusters"), job_id=job_id)  # fmt: skip

    @classmethod
    def from_meta(cls, meta: dict[str, Any] | None) -> GeneralCheck | None:
        """What a model row's meta holds (None: never measured); ``regressed`` is decided again, by :func:`regressed`."""
        found = (meta or {}).get(META_KEY)
        if not isinstance(found, dict):
            return None
        fields: dict[str, Any] = {
            k: found.get(k) for k in ("against", "before", "after", "delta", "se", "tasks", "clusters", "job_id")
        }
        return cls(**fields)

    @classmethod
    def of(cls, model: Any) -> GeneralCheck | None:
        """A registered model's (a ``Model`` row) general check, None when it was never measured."""
        return cls.from_meta(getattr(model, "meta", None))

    def as_meta(self) -> dict[str, Any]:
        return asdict(self) | {"regressed": self.regressed}

    def how(self) -> str:
        """``paired SE, 128 tasks`` (``paired SE over 40 sources, 128 tasks`` where clustered)."""
        over = f" over {self.clusters} sources" if self.clusters is not None and self.clusters != self.tasks else ""
        return f"paired SE{over}, {self.tasks} tasks"

    def drop(self) -> str:
        """``16.4 ± 3.1 points below smollm2-135m-instruct (paired SE, 128 tasks)``: the figure a warning names."""
        return f"{-100 * self.delta:.1f} ± {100 * self.se:.1f} points below {self.against} ({self.how()})"

    def describe(self) -> str:
        """One line for every surface: the drop where it regressed, else the change and that it is within noise."""
        if self.regressed:
            return f"general check fell {self.drop()}"
        within = f", within {REGRESSION_SES:g} SE" if self.delta < 0 else ""
        return f"general check {100 * self.delta:+.1f} ± {100 * self.se:.1f} points vs {self.against} ({self.how()}){within}"

    def short(self) -> str:
        """A table cell: ``-16.4 ± 3.1 pts REGRESSED``."""
        return f"{100 * self.delta:+.1f} ± {100 * self.se:.1f} pts" + (" REGRESSED" if self.regressed else "")


def describe(model: Any) -> str:
    """A registered model's general check in one line, ``general check: not measured`` where no run measured it."""
    check = GeneralCheck.of(model)
    return check.describe() if check is not None else NOT_MEASURED


def deploy_refusal(name: str, check: GeneralCheck | None, allow_regression: bool) -> str | None:
    """Why deploying model ``name`` is refused (None: it is not): its general check regressed and the deploy did not
    say ``allow_regression``."""
    if check is None or not check.regressed or allow_regression:
        return None
    job = f", measured by job {check.job_id}" if check.job_id is not None else ""
    return (f"model {name!r} is held back from deployment: its general check fell {check.drop()}{job}, beyond "
            f"{REGRESSION_SES:g} paired SEs. To deploy it anyway, pass --allow-regression (the CLI), "
            "allow_regression: true (the deploy config), or confirm in the console's Deploy tab; the override is "
            "recorded in the audit log under your name")  # fmt: skip
