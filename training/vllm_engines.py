"""The vLLM inference engines rollouts sample through (the protocol is :mod:`posttrain.training.inference`'s).

- :class:`VLLMRolloutEngine` drives ``vllm.LLM`` in the learner's process (an environment with vLLM, a GPU
  host's); :class:`VLLMServerEngine` drives it in a process of its own from vLLM's own environment (``.venv-vllm``
  on a CPU host). Both push the learner's weights into it after every update
  (:mod:`posttrain.training.weight_sync`).
- :class:`VLLMBatcher` and :class:`VLLMServerBatcher` serve a multi-turn environment's episodes on vLLM's engine
  loop, one completion at a time per episode thread.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import save_file

from posttrain.platform.engines.launcher import ServerProcess, free_port
from posttrain.platform.engines.vllm import VllmProfile, find_python, server_env
from posttrain.training.inference import Completion
from posttrain.training.rollout import SamplingConfig
from posttrain.training.vllm_server import Driver, completion
from posttrain.training.weight_sync import save_weights, with_output_layer

log = logging.getLogger(__name__)


class VLLMRolloutEngine:
    """Rollouts through vLLM in the learner's process (``vllm.LLM``): a host whose environment has vLLM (a GPU
    host's ``gpu`` extra), the engine colocated with the learner.

    Sampling: one ``SamplingParams(n=..., temperature, top_p, max_tokens, logprobs=0, seed)`` per
    call, prompts given as token ids; ``logprobs=0`` returns the sampled token's log-prob only.

    Weights (:meth:`load_weights`, after every update) go through the workers' supported in-place reload,
    ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` with ``lm_head`` named
    (:func:`with_output_layer`), never through the model object's private attributes (on vLLM's CPU backend,
    which repacks linear weights, the model's own ``load_weights`` fails). A vLLM without that reload gets the
    state saved as a model directory under ``weights_dir`` and a new ``LLM`` built on it. Either is followed
    by ``llm.reset_prefix_cache()`` (cached prefixes hold the old weights' keys and values); ``weight_sync``
    says which way the last update went.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        args: VllmProfile | None = None,
        weights_dir: str | os.PathLike[str] | None = None,
        version: int = 0,
        llm_class: Any = None,
        sampling_params_class: Any = None,
    ) -> None:
        if llm_class is None or sampling_params_class is None:
            vllm = _import_vllm()
            llm_class, sampling_params_class = llm_class or vllm.LLM, sampling_params_class or vllm.SamplingParams
        args = args or VllmProfile.for_rollouts(model_path)
        self.model_path, self.args, self.version = Path(model_path), args, version
        self.weights_dir = (
            Path(weights_dir) if weights_dir is not None else Path(tempfile.mkdtemp(prefix="posttrain-vllm-"))
        )
        self._llm_class, self._sampling_params_class = llm_class, sampling_params_class
        self.llm = llm_class(**args.llm_kwargs(self.model_path))
        self.weight_sync: str | None = None

    def sampling_params(
        self, n: int, sampling: SamplingConfig, seed: int | None, max_new_tokens: int | None = None
    ) -> Any:
        return self._sampling_params_class(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=max_new_tokens or sampling.max_new_tokens,
            logprobs=0,
            seed=seed,
        )

    def generate(
        self, prompts: Sequence[list[int]], n: int, sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[list[Completion]]:
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts],
            sampling_params=self.sampling_params(n, sampling, seed),
            use_tqdm=False,
        )
        return [[_vllm_completion(o) for o in out.outputs] for out in outputs]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        weights = with_output_layer(state_dict)
        if not self._reload_through_rpc(list(weights.items())):
            self._rebuild_from(save_weights(weights, self.model_path, self.weights_dir, version))
            self.weight_sync = "reload_from_dir"
        self.llm.reset_prefix_cache()
        self.version = version

    def batcher(self, *, seed: int = 0) -> VLLMBatcher:
        return VLLMBatcher(self, seed=seed)

    def close(self) -> None:
        self.llm = None
        shutil.rmtree(self.weights_dir, ignore_errors=True)

    def _reload_through_rpc(self, weights: list[tuple[str, torch.Tensor]]) -> bool:
        if not hasattr(self.llm, "collective_rpc"):
            return False
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        except Exception as exc:  # older workers have no in-place reload: save and rebuild instead
            log.warning("vLLM collective_rpc('reload_weights') failed (%s); reloading from a saved directory", exc)
            return False
        self.weight_sync = "collective_rpc"
        return True

    def _rebuild_from(self, path: Path) -> None:
        self.llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm = self._llm_class(**self.args.llm_kwargs(path))


class VLLMBatcher:
    """:class:`ContinuousBatcher`'s contract on a colocated :class:`VLLMRolloutEngine`, for multi-turn episodes:
    callers' requests go into vLLM's own engine loop through the rollout server's
    :class:`~posttrain.training.vllm_server.Driver` (``add_request`` between ``step`` s, one driver thread making
    every engine call), which batches them continuously and shares cached prefixes (a group's first turns, an
    episode's earlier turns). Request j draws with seed ``seed + j``, so the same requests in the same order sample
    the same completions."""

    def __init__(self, engine: VLLMRolloutEngine, *, seed: int = 0) -> None:
        self.engine, self._seed, self._asked = engine, seed, 0
        self._lock = threading.Lock()
        self._driver = Driver(engine.llm, engine._sampling_params_class)
        self._thread = threading.Thread(target=self._driver.run, name="posttrain-vllm-batcher", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.engine.version

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion:
        """One completion of ``prompt_ids`` (at most ``max_new_tokens``, else the sampling config's)."""
        with self._lock:
            j, self._asked = self._asked, self._asked + 1
        answer = self._driver.generate(vllm_request(prompt_ids, 1, sampling, self._seed + j, max_new_tokens)).result()
        return Completion(**answer["completions"][0])

    def forget_prefixes(self) -> None:  # vLLM's prefix cache is its own, within its KV budget
        pass

    def close(self) -> None:
        self._driver.close()
        self._thread.join(timeout=30)


def vllm_request(
    prompt: Sequence[int], n: int, sampling: SamplingConfig, seed: int | None, max_new_tokens: int | None = None
) -> dict[str, Any]:
    """One request as the rollout server's :class:`~posttrain.training.vllm_server.Driver` takes it."""
    return {"prompt": list(prompt), "n": n, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "max_tokens": max_new_tokens or sampling.max_new_tokens, "seed": seed}  # fmt: skip


SERVER_SCRIPT = Path(__file__).resolve().parent / "vllm_server.py"


class VLLMServerEngine:
    """Rollouts through vLLM in a process of its own, run by another environment's Python (``.venv-vllm`` on a
    CPU host, :func:`~posttrain.platform.engines.vllm.find_python`): :mod:`~posttrain.training.vllm_server`
    on loopback, the learner keeping the platform's environment. The same contract as :class:`VLLMRolloutEngine`:

    - :meth:`generate` sends every prompt in one request; the server's engine loop batches them;
    - :meth:`load_weights` writes the learner's state (``lm_head`` named: :func:`with_output_layer`) to one
      safetensors file in shared memory and the server reloads it through the workers' ``reload_weights``;
      ``sync_seconds`` keeps each update's time;
    - every answer names the policy version its weights were when the request went in, and a completion sampled
      from any other version than the engine's raises (a rollout always knows what sampled it);
    - :meth:`batcher` serves multi-turn episodes: each episode thread's request goes to the server, whose engine
      loop batches the concurrent ones.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        args: VllmProfile | None = None,
        version: int = 0,
        python: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        args = args or VllmProfile.for_rollouts(model_path)
        self.model_path, self.args, self.version = Path(model_path), args, version
        port = free_port("127.0.0.1")
        command = [str(find_python(python)), "-P", str(SERVER_SCRIPT), "--port", str(port),
                   "--llm", json.dumps(args.llm_kwargs(self.model_path)), "--version", str(version)]  # fmt: skip
        env = {**server_env(cpu_threads=args.cpu_threads if args.device == "cpu" else None), "PYTHONNOUSERSITE": "1"}
        self.server = ServerProcess(command, f"http://127.0.0.1:{port}", env=env,
                                    on_log=lambda line: log.info("vllm: %s", line))  # fmt: skip
        self.server.start(timeout_s=start_timeout_s)
        self.client = httpx.Client(base_url=self.server.base_url, timeout=httpx.Timeout(None, connect=10.0))
        shm = Path("/dev/shm")
        self._weights_dir = Path(tempfile.mkdtemp(prefix="posttrain-vllm-weights-", dir=shm if shm.is_dir() else None))
        self.weight_sync = "reload_weights"
        self.sync_seconds: list[float] = []

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        resp = self.client.post(path, json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"the vLLM rollout server at {self.server.base_url} answered {path} with "
                               f"{resp.status_code}: {resp.text[:500]}")  # fmt: skip
        return resp.json()

    def _completions(self, answer: dict[str, Any]) -> list[Completion]:
        if answer["version"] != self.version:
            raise RuntimeError(f"the vLLM rollout server sampled with policy version {answer['version']}, "
                               f"not {self.version}: a weight update and a rollout overlapped")  # fmt: skip
        return [Completion(**c) for c in answer["completions"]]

    def generate(
        self, prompts: Sequence[list[int]], n: int, sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[list[Completion]]:
        answers = self._post("/generate", {"requests": [vllm_request(p, n, sampling, seed) for p in prompts]})
        return [self._completions(a) for a in answers["outputs"]]

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, seed: int | None, max_new_tokens: int | None = None
    ) -> Completion:
        (answer,) = self._post(
            "/generate", {"requests": [vllm_request(prompt_ids, 1, sampling, seed, max_new_tokens)]}
        )["outputs"]
        return self._completions(answer)[0]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        path = self._weights_dir / "weights.safetensors"
        weights, seen = {}, set()
        for name, tensor in with_output_layer(state_dict).items():  # a tensor shared by two names is written twice
            tensor = tensor.detach().to("cpu").contiguous()
            weights[name] = tensor.clone() if tensor.data_ptr() in seen else tensor
            seen.add(tensor.data_ptr())
        save_file(weights, str(path), metadata={"format": "pt"})
        try:
            answer = self._post("/weights", {"path": str(path), "version": version})
        finally:
            path.unlink(missing_ok=True)
        self.sync_seconds.append(float(answer["seconds"]))
        self.version = version

    def batcher(self, *, seed: int = 0) -> VLLMServerBatcher:
        return VLLMServerBatcher(self, seed=seed)

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        shutil.rmtree(self._weights_dir, ignore_errors=True)


class VLLMServerBatcher:
    """:class:`ContinuousBatcher`'s contract on a :class:`VLLMServerEngine`: each caller's request goes to the
    server as it comes, and the server's engine loop batches the concurrent ones. Request j draws with seed
    ``seed + j``."""

    def __init__(self, engine: VLLMServerEngine, *, seed: int = 0) -> None:
        self.engine, self._seed, self._asked = engine, seed, 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def version(self) -> int:
        return self.engine.version

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion:
        with self._lock:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            j, self._asked = self._asked, self._asked + 1
        return self.engine.complete(prompt_ids, sampling, self._seed + j, max_new_tokens)

    def forget_prefixes(self) -> None:  # the server's prefix cache is its own, within its KV budget
        pass

    def close(self) -> None:
        with self._lock:
            self._closed = True


def _import_vllm() -> Any:
    os.environ.setdefault(
        "VLLM_ENABLE_V1_MULTIPROCESSING", "0"
    )  # the engine core in this process (its batcher drives it)
    try:
        import vllm  # optional: the gpu extra
    except ImportError as exc:
        raise ImportError(
            "VLLMRolloutEngine needs vLLM in this environment (a GPU host: pip install 'posttrain[gpu]'); "
            "elsewhere VLLMServerEngine runs it from its own environment (make vllm)"
        ) from exc
    return vllm


def _vllm_completion(output: Any) -> Completion:
    """A vLLM ``CompletionOutput`` (token ids, per-token ``{token_id: Logprob}``, finish reason) as a Completion."""
    return Completion(**completion(output))
