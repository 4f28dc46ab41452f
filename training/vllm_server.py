"""vLLM's side of ``rollout: {backend: vllm}`` when vLLM lives in an environment of its own (``.venv-vllm``).

    .venv-vllm/bin/python -P training/vllm_server.py --port 8199 --llm '{"model": "var/models/m", ...}' --version 0

The learner keeps the platform's environment; this script, run by vLLM's Python, holds ``vllm.LLM`` in a process
of its own and answers on loopback, the way TRL's ``vllm-serve`` and verl's server mode reach theirs. It imports
vLLM, torch, safetensors and the standard library only (the platform is not installed there). The client is
:class:`posttrain.training.vllm_engines.VLLMServerEngine`.

    GET  /health    -> {"version": V}
    POST /generate  {"requests": [{"prompt": [ids], "n": N, "temperature": T, "top_p": P, "max_tokens": M,
                                   "seed": S}, ...]}
                    -> {"outputs": [{"version": V, "completions": [{"token_ids": [...], "logprobs": [...],
                                                                    "finished": bool}, ...]}, ...]}
    POST /weights   {"path": "FILE.safetensors", "version": V} -> {"version": V, "seconds": s}

One driver thread owns the engine: every request from every connection goes into vLLM's own engine loop
(``add_request``, then ``step``), so concurrent callers (a multi-turn environment's episode threads) are batched
continuously and share cached prefixes. A weight update waits until no request is in flight, reloads through the
workers' supported path (``collective_rpc("reload_weights", weights_iterator=...)``: on the CPU backend, which
repacks linear weights, the model's own ``load_weights`` fails), clears the prefix cache (it holds the old weights'
keys and values) and tags what is sampled afterwards with the new version: each request's answer names the version
its weights were when it went in. The log-probs returned are those of each sampled token under
``log_softmax(logits / temperature)`` (``logprobs_mode="processed_logprobs"``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from safetensors import safe_open


class Driver:
    """The engine's one caller: requests and weight updates queue here and run on :meth:`run`'s thread. The
    server's, and the colocated engine's batcher's (:class:`posttrain.training.vllm_engines.VLLMBatcher`). ``params``
    go into every request's ``SamplingParams``."""

    def __init__(self, llm: Any, sampling_params_class: Any, version: int = 0, **params: Any) -> None:
        self.llm, self.sampling_params_class, self.params = llm, sampling_params_class, params
        self.version = version
        self._cond = threading.Condition()
        self._requests: list[tuple[str, dict[str, Any], Future[Any]]] = []
        self._updates: list[tuple[str, int, Future[Any]]] = []
        self._asked = 0
        self._closed = False

    def generate(self, request: dict[str, Any]) -> Future[Any]:
        """Queue one request (``prompt``, ``n``, ``temperature``, ``top_p``, ``max_tokens``, ``seed``); its future
        gives ``{"version": V, "completions": [...]}``."""
        future: Future[Any] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the vLLM driver is closed")
            self._asked += 1
            self._requests.append((f"posttrain-{id(self)}-{self._asked}", request, future))  # unique in a shared engine
            self._cond.notify_all()
        return future

    def update(self, path: str, version: int) -> Future[Any]:
        future: Future[Any] = Future()
        with self._cond:
            self._updates.append((path, version, future))
            self._cond.notify_all()
        return future

    def close(self) -> None:
        """End :meth:`run`: requests still waiting fail."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _params(self, r: dict[str, Any]) -> Any:
        return self.sampling_params_class(n=int(r.get("n", 1)), temperature=float(r["temperature"]),
                                          top_p=float(r.get("top_p", 1.0)), max_tokens=int(r["max_tokens"]),
                                          logprobs=0, seed=r.get("seed"), **self.params)  # fmt: skip

    def _reload(self, path: str, version: int) -> float:
        started = time.monotonic()
        with safe_open(path, framework="pt") as f:
            weights = [(name, f.get_tensor(name)) for name in f.keys()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        self.version = version
        return time.monotonic() - started

    def run(self) -> None:
        core = self.llm.llm_engine
        out: dict[str, tuple[int, Future[Any]]] = {}
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._requests or self._updates or out)
                update = self._updates.pop(0) if self._updates and not out else None
                joining = [] if update else self._requests
                if not update:
                    self._requests = []
                closed = self._closed
            if closed:
                self._fail(core, out, joining, RuntimeError("the vLLM driver closed"))
                return
            if update is not None:  # nothing in flight: what is sampled next is the new version's
                path, version, future = update
                try:
                    future.set_result({"version": version, "seconds": self._reload(path, version)})
                except BaseException as exc:  # noqa: BLE001 - the caller gets it
                    future.set_exception(exc)
                continue
            try:
                for request_id, request, future in joining:
                    out[request_id] = (self.version, future)
                    core.add_request(request_id, {"prompt_token_ids": list(request["prompt"])}, self._params(request))
                for output in core.step():
                    entry = out.pop(output.request_id, None) if output.finished else None
                    if entry is not None:
                        entry[1].set_result(
                            {"version": entry[0], "completions": [completion(o) for o in output.outputs]}
                        )
            except BaseException as exc:  # noqa: BLE001 - every caller waiting gets it
                self._fail(core, out, joining, exc)

    @staticmethod
    def _fail(core: Any, out: dict[str, tuple[int, Future[Any]]], joining: list[Any], exc: BaseException) -> None:
        """Every caller waiting gets ``exc``; their requests leave vLLM."""
        if out:
            try:
                core.abort_request(list(out))
            except Exception:  # noqa: BLE001 - the engine is broken already
                pass
        for future in [*(f for _, f in out.values()), *(f for *_, f in joining)]:
            if not future.done():
                future.set_exception(exc)
        out.clear()


def completion(output: Any) -> dict[str, Any]:
    """A vLLM ``CompletionOutput``: the sampled ids, each one's log-prob, whether a stop token ended it (the fields
    of :class:`posttrain.training.inference.Completion`)."""
    ids = list(output.token_ids)
    steps = output.logprobs or []
    if len(steps) != len(ids):
        raise RuntimeError(
            f"vLLM returned log-probs for {len(steps)} of {len(ids)} sampled tokens; "
            "sample with SamplingParams(logprobs=0)"
        )
    return {"token_ids": ids, "logprobs": [float(step[tok].logprob) for step, tok in zip(steps, ids)],
            "finished": output.finish_reason == "stop"}  # fmt: skip


def handler(driver: Driver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._send(200, {"version": driver.version})
            else:
                self._send(404, {"error": f"no {self.path}"})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            try:
                if self.path == "/generate":
                    futures = [driver.generate(r) for r in body["requests"]]
                    self._send(200, {"outputs": [f.result() for f in futures]})
                elif self.path == "/weights":
                    self._send(200, driver.update(body["path"], int(body["version"])).result())
                else:
                    self._send(404, {"error": f"no {self.path}"})
            except Exception as exc:  # noqa: BLE001 - the client raises it with this text
                self._send(500, {"error": f"{type(exc).__name__}: {exc}"})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--llm", required=True, help="vllm.LLM's keyword arguments, as JSON")
    parser.add_argument("--version", type=int, default=0, help="the policy version of the model directory's weights")
    args = parser.parse_args()
    # run as a script, this file's folder comes first on the path, where a module of the platform's could stand in
    # for one of vLLM's (``-P`` keeps it off too)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: one driver thread
    import vllm  # vLLM's own environment
    from vllm.sampling_params import RequestOutputKind

    # FINAL_ONLY: a request with n > 1 comes back once, with all n completions (by default each step returns one)
    driver = Driver(
        vllm.LLM(**json.loads(args.llm)), vllm.SamplingParams, args.version, output_kind=RequestOutputKind.FINAL_ONLY
    )
    threading.Thread(target=driver.run, name="vllm-driver", daemon=True).start()
    server = ThreadingHTTPServer((args.host, args.port), handler(driver))
    print(f"rollout server on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
