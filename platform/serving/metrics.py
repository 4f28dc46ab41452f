"""Prometheus text metrics under vLLM's names, so dashboards for vLLM work on the embedded engine."""

from __future__ import annotations

import threading
from collections import defaultdict

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))


class _Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(_LATENCY_BUCKETS)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(_LATENCY_BUCKETS):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


class EngineMetrics:
    """Counters, gauges and histograms for one served model."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.success: dict[str, int] = defaultdict(int)
        self.ttft = _Histogram()
        self.e2e = _Histogram()
        self.errors: dict[int, int] = defaultdict(int)

    def request_finished(
        self,
        reason: str,
        prompt_tokens: int,
        generation_tokens: int,
        ttft_s: float | None,
        e2e_s: float,
        draft: int = 0,
        accepted: int = 0,
    ) -> None:
        with self._lock:
            self.success[reason] += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            self.draft_tokens += draft
            self.accepted_tokens += accepted
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            self.e2e.observe(e2e_s)

    def request_rejected(self, status: int) -> None:
        with self._lock:
            self.errors[status] += 1

    def render(self) -> str:
        label = f'model_name="{self.model_name}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{{{labels}}} {value}")

        def histogram(name: str, help_text: str, h: _Histogram) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} histogram")
            for bound, count in zip(_LATENCY_BUCKETS, h.counts):
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'{name}_bucket{{{label},le="{le}"}} {count}')
            lines.append(f"{name}_sum{{{label}}} {h.total}")
            lines.append(f"{name}_count{{{label}}} {h.n}")

        with self._lock:
            metric("vllm:num_requests_running", "gauge", "Requests in the running batch.", [(label, self.running)])
            metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", [(label, self.waiting)])
            metric("vllm:prompt_tokens_total", "counter", "Prefill tokens processed.", [(label, self.prompt_tokens)])
            metric(
                "vllm:generation_tokens_total",
                "counter",
                "Generation tokens produced.",
                [(label, self.generation_tokens)],
            )
            metric(
                "vllm:request_success_total",
                "counter",
                "Finished requests by finish reason.",
                [(f'{label},finished_reason="{r}"', n) for r, n in sorted(self.success.items())] or [(label, 0)],
            )
            metric(
                "vllm:spec_decode_num_draft_tokens_total",
                "counter",
                "Speculative draft tokens proposed.",
                [(label, self.draft_tokens)],
            )
            metric(
                "vllm:spec_decode_num_accepted_tokens_total",
                "counter",
                "Speculative draft tokens accepted.",
                [(label, self.accepted_tokens)],
            )
            histogram("vllm:time_to_first_token_seconds", "Time to first token.", self.ttft)
            histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.", self.e2e)
            metric(
                "posttrain:request_errors_total",
                "counter",
                "Rejected requests by HTTP status.",
                [(f'{label},status="{s}"', n) for s, n in sorted(self.errors.items())] or [(label, 0)],
            )
        return "\n".join(lines) + "\n"
