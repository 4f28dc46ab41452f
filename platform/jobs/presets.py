"""Named run recipes (presets) as the console and the CLI see them, whichever part defines them.

    for name, preset in presets().items():
        preset.sections["train_grpo"]      # the fields a train_grpo job takes from it
        preset.documents                   # the documents its task set is built from (a document preset)
        preset.record                      # what it cost when a benchmark ran it

Training defines the presets (:mod:`posttrain.training.presets`) and registers a catalogue of them here when its job
kinds load (:data:`~posttrain.platform.jobs.registry.KIND_MODULES`, the same plugin registry), so a page reaches
them through the platform and never imports training. A preset is run by naming it in a job config (``preset:``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from posttrain.platform.jobs import registry


class PresetDocuments(BaseModel):
    """The documents a preset's task set is built from, and how: uploaded, preprocessed, then one ``build_tasks``
    job over them (``source``: the documents source's fields, less the document ids)."""

    model_config = ConfigDict(extra="forbid")
    task_set: str
    paths: list[str] = Field(min_length=1, description="files or glob patterns")
    source: dict[str, Any] = Field(default_factory=dict)


class PresetRecord(BaseModel):
    """A benchmark's recording of a preset (``bench/results/<benchmark>.json``): when, what the whole benchmark took
    (``runs``: the arms or stages it ran, each a run of the preset's recipe or a variant of it) and its peak memory,
    and the held-out pass@1 before and after when it ran the preset once."""

    benchmark: str
    date: str
    minutes: float
    runs: int
    peak_rss_gb: float | None = None
    pass_before: float | None = None
    pass_after: float | None = None

    @property
    def held_out(self) -> str | None:
        """Held-out pass@1 before and after ("15% → 37%"), when the benchmark ran the preset once."""
        if self.pass_before is None or self.pass_after is None:
            return None
        return f"{self.pass_before:.0%} → {self.pass_after:.0%}"

    def describe(self) -> str:
        took = f"{self.minutes:.0f} min" + (f" for {self.runs} runs" if self.runs > 1 else "")
        memory = f", peak {self.peak_rss_gb:.1f} GiB" if self.peak_rss_gb else ""
        figure = f"; held-out pass@1 {self.held_out}" if self.held_out else ""
        return f"recorded by bench {self.benchmark} on {self.date[:10]}: {took}{memory}{figure}"


class Preset(BaseModel):
    """One preset: the fields each job kind takes from it (``sections``: kind -> fields), the registered model a
    real-model preset starts from (None: it builds its own), its documents, and its benchmark recording."""

    name: str
    description: str
    sections: dict[str, dict[str, Any]]
    model: str | None = None
    documents: PresetDocuments | None = None
    record: PresetRecord | None = None


RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"  # a source checkout's recordings

Catalogue = Callable[[], list[Preset]]
_catalogues: list[Catalogue] = []
_lock = threading.Lock()


def register_presets(catalogue: Catalogue) -> None:
    """Offer the presets ``catalogue()`` returns (a kind module calls this when it is imported)."""
    with _lock:
        if catalogue not in _catalogues:
            _catalogues.append(catalogue)


def presets() -> dict[str, Preset]:
    """Every registered preset by name (none where no part defines any), each with its recording."""
    registry.kinds()  # the kind modules register their catalogues as they load
    records = preset_records()
    with _lock:
        catalogues = list(_catalogues)
    return {p.name: p.model_copy(update={"record": records.get(p.name)}) for c in catalogues for p in c()}


def preset_records(results: Path = RESULTS_DIR) -> dict[str, PresetRecord]:
    """Each preset's recording in ``results`` (none where the checkout ships none, an installed wheel): the preset's
    own ``learning-*`` benchmark first, another that ran it (a forgetting run) otherwise."""
    found: dict[str, PresetRecord] = {}
    paths = sorted(results.glob("*.json"), key=lambda p: (not p.stem.startswith("learning-"), p.stem))
    for path in paths:
        try:
            recording = json.loads(path.read_text())
            summary = recording["summary"]
            preset, minutes = summary.get("preset"), float(summary.get("minutes") or recording.get("minutes") or 0)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a recording of this shape
        if not isinstance(preset, str) or preset in found or minutes < 1:
            continue  # an ablation of a few steps is no preset's cost
        runs = len(summary.get("arms") or summary.get("stages") or {}) or 1
        single = (
            runs == 1 and isinstance(summary.get("pass_before"), float) and isinstance(summary.get("pass_after"), float)
        )
        found[preset] = PresetRecord(
            benchmark=path.stem,
            date=str(recording.get("date", "")),
            minutes=minutes,
            runs=runs,
            peak_rss_gb=summary.get("peak_rss_gb"),
            pass_before=summary["pass_before"] if single else None,
            pass_after=summary["pass_after"] if single else None,
        )
    return found
