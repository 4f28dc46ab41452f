"""One typed settings object for the whole platform.

Values come, highest precedence first, from keyword arguments, environment
variables ``POSTTRAIN_*`` (nested fields with ``__``, e.g.
``POSTTRAIN_SANDBOX__POOL_SIZE``), and an optional TOML file named by
``POSTTRAIN_CONFIG`` (default ``./posttrain.toml`` when it exists). The defaults
give the embedded set-up: SQLite under ``./var/``, a local worker, the console
on http://localhost:8501.

An invalid value fails at start-up with :class:`SettingsError`, whose message
names the variable and what it accepts.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from posttrain.platform.settings.sandbox import SandboxConfig

ENV_PREFIX = "POSTTRAIN_"


class SettingsError(ValueError):
    """A configuration value is invalid; the message names it and the fix."""


class OIDCConfig(BaseModel):
    """Console single sign-on through an OpenID Connect provider (:mod:`posttrain.platform.oidc` uses it)."""

    model_config = ConfigDict(extra="forbid")

    client_id: str = Field(min_length=1)
    client_secret: SecretStr
    server_metadata_url: str = Field(
        pattern=r"^https?://", description="the provider's .well-known/openid-configuration URL"
    )
    provider_name: str = Field(default="single sign-on", description="shown on the login button")
    redirect_uri: str | None = Field(default=None, description="default http://localhost:<console_port>/oauth2callback")
    cookie_secret: SecretStr | None = Field(
        default=None, description="default: generated once under <data_dir>/console"
    )
    default_role: Literal["viewer", "operator", "admin"] = "viewer"
    username_claim: str = "email"
    allowed_domains: list[str] = Field(default_factory=list, description="email domains allowed in (empty: any)")


def _config_file() -> Path:
    return Path(os.environ.get(f"{ENV_PREFIX}CONFIG", "posttrain.toml"))


class Settings(BaseSettings):
    """Everything configurable about a posttrain installation."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    data_dir: Path = Field(
        default=Path("var"),
        description="Where documents, job logs, checkpoints and models are stored.",
    )
    path_roots: list[Path] = Field(
        default_factory=list,
        description="Directories besides data_dir that job configs may name (a team's model store); "
        "every path in a job config must lie inside data_dir or one of these.",
    )
    database_url: str = Field(
        default="",
        description="SQLAlchemy URL: sqlite:///path.db or postgresql+psycopg://user:pw@host/db. "
        "Empty means a SQLite file inside data_dir.",
    )

    worker_cpu_slots: int = Field(default=2, ge=1, le=1024, description="CPU jobs a worker runs at once.")
    worker_gpu_slots: int = Field(default=0, ge=0, le=64, description="GPU jobs a worker runs at once.")
    worker_serving_slots: int = Field(
        default=4,
        ge=0,
        le=256,
        description="Deployments a worker keeps at once beside its CPU jobs: a server waits on requests between them, "
        "so it takes a serving slot, not a CPU slot that training needs.",
    )
    job_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="torch threads of each job process. Unset: the machine's cores shared among the worker's CPU "
        "slots (one on 2 cores with 2 slots: two threads a process beside another computing process made "
        "generation 5-7x slower there); an OMP_NUM_THREADS in the environment wins over the unset default.",
    )
    llama_server: Path | None = Field(
        default=None,
        description="the llama-server binary of the llamacpp engine; unset: the one `make llamacpp` "
        "built and linked into the virtual environment, else one on PATH",
    )
    vllm_python: Path | None = Field(
        default=None,
        description="the Python of an environment with vLLM, which runs the vllm engine's servers; "
        "unset: this environment's when it has vLLM (the gpu extra), else .venv-vllm (`make vllm`)",
    )
    worker_poll_interval_s: float = Field(default=0.2, gt=0, le=60)
    heartbeat_interval_s: float = Field(default=2.0, gt=0, le=600)
    heartbeat_timeout_s: float = Field(
        default=30.0, gt=0, le=86400, description="A running job whose heartbeat is older is orphaned."
    )
    cancel_grace_s: float = Field(
        default=5.0, ge=0, le=3600, description="Seconds between SIGTERM and SIGKILL on cancel."
    )
    retry_backoff_s: float = Field(default=2.0, ge=0, le=3600, description="First retry delay; doubles per attempt.")

    console_host: str = Field(default="127.0.0.1")
    console_port: int = Field(default=8501, ge=1, le=65535)
    console_session_hours: float = Field(
        default=12.0,
        gt=0,
        le=24 * 30,
        description="how long a console login lasts across reloads and tabs (a signed HttpOnly cookie); logout, a "
        "password change or a disabled account ends it sooner",
    )

    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig,
        description="Tool-calling sandboxes: POSTTRAIN_SANDBOX__BACKEND, POSTTRAIN_SANDBOX__POOL_SIZE, ...",
    )

    gateway_host: str = Field(default="127.0.0.1")
    gateway_port: int = Field(default=8000, ge=1, le=65535, description="the OpenAI-compatible endpoint")
    cli_user: str | None = Field(
        default=None,
        description="The console user the posttrain command acts as, with that user's role; unset: the local "
        "administrator cli:<login name> (whoever runs the command holds the database's credentials).",
    )

    ray_address: str | None = Field(default=None, description="Ray cluster address; unset runs everything locally.")
    oidc: OIDCConfig | None = Field(
        default=None,
        description="Console single sign-on (OpenID Connect): POSTTRAIN_OIDC__CLIENT_ID, __CLIENT_SECRET, "
        "__SERVER_METADATA_URL, ... (see posttrain.platform.oidc); unset: password login only.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("database_url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value and not value.startswith(("sqlite://", "postgresql+psycopg://", "postgresql://")):
            raise ValueError(
                "must start with sqlite:/// or postgresql+psycopg:// (e.g. postgresql+psycopg://user:pw@host:5432/db)"
            )
        if value.startswith("postgresql://"):
            value = "postgresql+psycopg://" + value[len("postgresql://") :]
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file()
        if path.is_file():
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    # Derived locations -------------------------------------------------
    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'posttrain.db').resolve()}"

    @property
    def sandbox_root(self) -> Path:
        return self.sandbox.root_dir or self.data_dir / "sandboxes"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    def secrets_dir(self) -> Path:
        """``<data_dir>/secrets`` (mode 0700), made when missing: files only the platform's processes read."""
        path = self.data_dir / "secrets"
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def ensure_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)


def _describe(error: Mapping[str, Any]) -> str:
    loc = [str(part) for part in error.get("loc", ())]
    variable = ENV_PREFIX + "__".join(loc).upper() if loc else ENV_PREFIX + "*"
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f"={given!r}"
    model: Any = Settings
    field = None
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            break
        model = field.annotation
    hint = f" ({field.description})" if field is not None and field.description else ""
    return f"invalid setting {variable}{shown}: {error['msg']}{hint}"


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment, raising :class:`SettingsError` on bad values."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError("; ".join(_describe(e) for e in exc.errors())) from None


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; call ``get_settings.cache_clear()`` after changing the environment)."""
    return load_settings()
