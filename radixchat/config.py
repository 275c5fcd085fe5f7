"""Settings: one pydantic-settings class.

Precedence, lowest first: defaults < TOML config file < ``RADIXCHAT_*`` environment variables < CLI flags.
The config file is ``$XDG_CONFIG_HOME/radixchat/config.toml`` unless ``--config`` or
``RADIXCHAT_CONFIG`` names another one. Every field is also a CLI flag (``cli.py`` builds them from the
fields below, so ``--help`` can never drift from the code).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from radixchat.errors import ConfigError

DEFAULT_MODEL = "smollm2"


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback)


def default_config_file() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "radixchat" / "config.toml"


def default_cache_dir() -> Path:
    return _xdg("XDG_CACHE_HOME", ".cache") / "radixchat"


class UserToolConfig(BaseModel):
    """A user tool: one ``[[tools]]`` table of the config file (see radixchat/chat/tools.py)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str = ""
    command: list[str] | str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    timeout_s: float = Field(10.0, gt=0, le=600)
    max_output_bytes: int = Field(16384, ge=1, le=10_000_000)
    output: Literal["text", "json"] = "text"

    @field_validator("command")
    @classmethod
    def _split(cls, value: list[str] | str) -> list[str]:
        return split_command(value)


def split_command(value: list[str] | str) -> list[str]:
    """A command as a list, or a shell-like string split as a shell would (without running one)."""
    argv = shlex.split(value) if isinstance(value, str) else list(value)
    if not argv:
        raise ValueError("command must not be empty")
    return argv


class McpServerConfig(BaseModel):
    """An MCP server whose tools join tool mode: one ``[[mcp_servers]]`` table of the config file (see
    radixchat/chat/mcp_client.py). Exactly one of ``command`` (a stdio server radixchat starts) and
    ``url`` (a streamable-HTTP server already running)."""

    model_config = ConfigDict(extra="forbid")

    # Its tools are named SERVER_TOOL, so the name is kept short and plain.
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9-]{0,31}$")
    command: list[str] | str | None = None
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # over the SDK's minimal environment (PATH, HOME, ...)
    timeout_s: float = Field(30.0, gt=0, le=600)  # for starting (connect, list tools) and for each call

    @field_validator("command")
    @classmethod
    def _split(cls, value: list[str] | str | None) -> list[str] | None:
        return None if value is None else split_command(value)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s):// URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (a stdio server) or url (a streamable-HTTP server)")
        if self.url is not None and self.env:
            raise ValueError("env is for servers started with command, not for a url")
        return self


# Sampling bounds, shared by the settings and the presets that override them.
Temperature = Annotated[float, Field(ge=0.0, le=5.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=0)]
RepetitionPenalty = Annotated[float, Field(ge=0.01, le=5.0)]
MaxTokens = Annotated[int, Field(ge=1)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
StopSequences = list[Annotated[str, Field(min_length=1)]]


class Preset(BaseModel):
    """A named preset: one ``[presets.NAME]`` table of the config file. ``--preset NAME`` (or ``preset =
    "NAME"``) lays its settings over the config file's; in the app it sets the session's system prompt,
    sampling, mode and offered tools. Unset fields leave things as they are."""

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    system_prompt: str | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    repetition_penalty: RepetitionPenalty | None = None
    max_tokens: MaxTokens | None = None
    seed: Seed | None = None
    stop: StopSequences | None = None
    mode: Literal["chat", "json", "tool"] | None = None  # the app's mode
    tools: list[str] | None = None  # the tools tool mode offers (names of [[tools]] or built-in ones)
    tool_choice: Literal["auto", "required", "none"] | None = None

    # The fields that are also settings (the rest only the app can apply).
    SETTINGS: ClassVar[tuple[str, ...]] = (
        "system_prompt",
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "max_tokens",
        "seed",
        "stop",
    )

    def settings(self) -> dict[str, Any]:
        """The settings this preset sets (its unset fields left out)."""
        return {n: getattr(self, n) for n in self.SETTINGS if getattr(self, n) is not None}


class Settings(BaseSettings):
    """Everything a user can configure. Field descriptions are the ``--help`` texts."""

    model_config = SettingsConfigDict(
        env_prefix="RADIXCHAT_", extra="forbid", validate_default=True, protected_namespaces=()
    )

    # -- model and device ---------------------------------------------------------------------------
    model: str = Field(
        DEFAULT_MODEL,
        description="model to run: 'smollm2' (bundled SmolLM2-135M-Instruct), a Hugging Face model "
        "directory, a .gguf file, or a hub id (needs network); with --backend URL, the served model's "
        "name (default: the server's only model)",
    )
    backend: str = Field(
        "local",
        description="'local' (the in-process engine) or the base URL of an OpenAI-compatible server "
        "(SGLang, vLLM, llama.cpp), e.g. http://gpu-box:30000/v1 ('/v1' is added to a bare host:port)",
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="environment variable holding the remote server's API key (the key is never stored)",
    )
    remote_timeout: float = Field(
        60.0, gt=0.0, le=3600.0, description="seconds a remote server may stay silent before a reply fails"
    )
    remote_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="retries with backoff while a remote server is unreachable or busy (429, 5xx)",
    )
    chat_template: str = Field(
        "auto",
        description="how messages are formatted for the model: auto (the model's own template, else a "
        "built-in chosen by its tokenizer and architecture, with a notice), a built-in (chatml, gemma, "
        "llama3, mistral, phi3, qwen) or a Jinja template file",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the model runs")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights and KV dtype (auto: float32 on CPU, bfloat16 on CUDA)"
    )
    weights: Literal["auto", "float32", "bfloat16", "float16", "int8", "int4", "packed"] = Field(
        "auto",
        description="how the linear layers store and multiply their weights, on CPU: float32 (exact), "
        "bfloat16, float16, int8 (8-bit, groups of 32, 8-bit activations), int4 (4-bit, groups of 32) beside a "
        "float32 copy; packed (a GGUF packed once into "
        "int4 on disk and memory-mapped, no float32 copy); auto: packed for a GGUF whose float32 copy would "
        "take over 1/8 of the available memory, else the fastest on this machine (measured once, cached)",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="compile the decode step in the background (auto: on CPU with a compact weights format)",
    )
    deterministic: bool = Field(
        False,
        description="batch-invariant inference: a greedy reply (or a seeded one) depends on its prompt alone, "
        "not on what else runs, the cache or the KV store; costs decode speed (no compiled decode step; "
        "one kernel for every row count; attention in bfloat16 products), see README",
    )
    kv_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="dtype of the KV cache (auto: on CPU with float32 weights math, the fastest for long "
        "contexts on this machine, measured once; float32 is exact; elsewhere the model's dtype)",
    )
    code_prefetch: Literal["auto", "off"] = Field(
        "auto",
        description="on CPU, how far ahead the native decode products prefetch the weights they stream "
        "(auto: each product's distance measured once per machine, taken only where it is clearly faster; "
        "off: none; never changes a result)",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="where converted models, the KV store and this machine's measurements are kept",
    )

    # -- engine ---------------------------------------------------------------------------------------
    kv_pool_tokens: int | None = Field(
        None, ge=16, description="KV pool size in tokens (default: 32768 on CPU, memory fraction on CUDA)"
    )
    kv_memory_fraction: float = Field(
        0.85, gt=0.0, le=0.98, description="on CUDA, share of free device memory given to the KV pool"
    )
    max_running_requests: int = Field(32, ge=1, description="most requests decoding at once")
    chunked_prefill_size: int = Field(
        512, ge=1, description="most prompt tokens prefilled per step (long prompts are chunked)"
    )
    schedule_policy: Literal["lpm", "fcfs"] = Field(
        "lpm", description="admission order: longest prefix match first, or first come first served"
    )
    radix_cache: bool = Field(True, description="reuse KV across requests (off: ablation baseline)")
    kv_store: bool = Field(
        True,
        description="the KV store on disk (<cache-dir>/kv): requests load the KV stored there (saved "
        "sessions', and with --kv-spill the pool's evicted KV) instead of computing it again",
    )
    kv_store_gib: float = Field(
        2.0,
        gt=0.0,
        le=4096.0,
        description="disk budget of the KV store in GiB (least recently used go first)",
    )
    kv_spill: bool = Field(
        True,
        description="write KV evicted from the pool to the KV store and load it back on a later hit "
        "instead of recomputing it",
    )
    debug: bool = Field(False, description="check cache integrity whenever the engine goes idle")
    context_overflow: Literal["drop-oldest", "error"] = Field(
        "drop-oldest",
        description="when a conversation outgrows the model's context: drop its oldest turns after the "
        "system prompt (down to about half the context, at once), or refuse the turn with an error",
    )

    # -- default sampling -----------------------------------------------------------------------------
    temperature: Temperature = Field(0.2, description="sampling temperature (0 = greedy)")
    top_p: TopP = Field(0.9, description="nucleus sampling mass")
    top_k: TopK = Field(0, description="keep the k most likely tokens (0 = off)")
    repetition_penalty: RepetitionPenalty = Field(1.1, description="penalty for repeated tokens (1 = off)")
    max_tokens: MaxTokens = Field(512, description="most tokens generated per reply")
    max_thinking_tokens: int = Field(
        1024,
        ge=1,
        description="in json and tool modes, most tokens a thinking model may think before its closing "
        "tag is forced (and never more than half of max_tokens), so the constrained answer always comes",
    )
    seed: Seed | None = Field(None, description="sampling seed (default: random)")
    stop: StopSequences = Field(
        default_factory=list,
        description='stop sequences: a reply ends before the first of them (stop = ["\\n\\n"] in the '
        "config file)",
    )
    system_prompt: str | None = Field(None, description="system prompt for new conversations")

    # -- presets ----------------------------------------------------------------------------------------
    preset: str | None = Field(
        None,
        description="a [presets.NAME] table of the config file laid over the settings (its system prompt "
        "and sampling; in the app also its mode and tools); flags still win",
    )
    presets: dict[str, Preset] = Field(
        default_factory=dict, description="named presets ([presets.NAME] tables in the config file)"
    )

    # -- tools (tool mode) ------------------------------------------------------------------------------
    tools: list[UserToolConfig] = Field(
        default_factory=list, description="user tools ([[tools]] tables in the config file)"
    )
    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list, description="MCP servers whose tools join tool mode ([[mcp_servers]] tables)"
    )
    max_tool_rounds: int = Field(4, ge=1, le=32, description="most tool-call rounds in one turn")
    max_tool_calls: int = Field(
        1,
        ge=1,
        le=16,
        description="most tool calls in one reply (as parallel_tool_calls; 1: one call, then the result). "
        "Small models repeat a call block until the token limit; a later round costs only its delta",
    )

    # -- the chat app -----------------------------------------------------------------------------------
    theme: str | None = Field(None, description="Textual theme of the chat app (e.g. nord, gruvbox)")
    keymap: dict[str, str] = Field(
        default_factory=dict,
        description="key bindings by binding id ([keymap] table in the config file; see docs/tui.md)",
    )

    # -- files --------------------------------------------------------------------------------------
    sessions_dir: Path = Field(Path("sessions"), description="where sessions are saved")
    models_dir: Path = Field(
        Path("~/models"),
        description="where the chat app's model picker (F7) looks for .gguf files and Hugging Face model "
        "folders (two levels deep)",
    )

    @field_validator("backend", mode="after")
    @classmethod
    def _backend_url(cls, value: str) -> str:
        value = value.strip()
        return value if value == "local" else normalize_base_url(value)

    @field_validator("chat_template", mode="after")
    @classmethod
    def _chat_template(cls, value: str) -> str:
        from radixchat.chat.templates import BUILTIN, builtin_names

        value = value.strip()
        if value == "auto" or value in BUILTIN:
            return value
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(
                f"'{value}' is neither auto, a built-in ({builtin_names()}) nor an existing file"
            )
        return str(path)

    @field_validator("mcp_servers", mode="after")
    @classmethod
    def _unique_servers(cls, value: list[McpServerConfig]) -> list[McpServerConfig]:
        names = [s.name for s in value]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ValueError(f"two servers are named {twice!r}")
        return value

    @field_validator("cache_dir", "sessions_dir", "models_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    # The TOML file path is chosen at load time (``--config``), so it is threaded through a class var.
    _toml_file: ClassVar[Path | None] = None

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
        if cls._toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls._toml_file))
        return tuple(sources)

    @classmethod
    def load(cls, overrides: dict[str, Any] | None = None, config_file: Path | str | None = None) -> Settings:
        """Build settings from all sources; ``overrides`` are CLI flags (highest precedence).

        Raises ConfigError with a one-line message naming the setting (and the file, if it is to blame).
        """
        explicit = config_file is not None or "RADIXCHAT_CONFIG" in os.environ
        path = Path(config_file or os.environ.get("RADIXCHAT_CONFIG") or default_config_file()).expanduser()
        if explicit and not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        toml_file = path if path.is_file() else None
        if toml_file is not None:
            _check_toml(toml_file)
        cls._toml_file = toml_file
        overrides = overrides or {}
        try:
            settings = cls(**overrides)
            if settings.preset is None:
                return settings
            preset = settings.presets.get(settings.preset)
            if preset is None:
                known = ", ".join(sorted(settings.presets)) or "none in the config file"
                raise ConfigError(f"unknown preset '{settings.preset}' (presets: {known})")
            # Over the file and the environment, under the flags.
            return cls(**{**preset.settings(), **overrides})
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, toml_file)) from None
        finally:
            cls._toml_file = None


def normalize_base_url(url: str) -> str:
    """``http://host:30000`` → ``http://host:30000/v1``; a URL with a path is kept (less a trailing '/')."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"must be 'local' or an http(s):// URL of an OpenAI-compatible server, got {url!r}")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/') or '/v1'}"


def _check_toml(path: Path) -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def describe_validation_error(exc: ValidationError, toml_file: Path | None = None) -> str:
    """One line naming the first invalid setting, its env var, and why."""
    err = exc.errors()[0]
    name = ".".join(str(p) for p in err["loc"]) or "settings"
    msg = err["msg"].removeprefix("Value error, ")
    where = f" in {toml_file}" if toml_file else ""
    if err["loc"][:1] == ("presets",) and len(err["loc"]) >= 3:
        table, field = err["loc"][1], ".".join(str(p) for p in err["loc"][2:])
        if err["type"] == "extra_forbidden":
            return f"unknown field '{field}' in [presets.{table}]{where}"
        return f"invalid field '{field}' in [presets.{table}]{where}: {msg}"
    if err["loc"][:1] in (("tools",), ("mcp_servers",)):  # tables of the config file: no flag, no env var
        table, field = err["loc"][0], ".".join(str(p) for p in err["loc"][2:])
        index = err["loc"][1] if len(err["loc"]) > 1 else None
        entry = f"[[{table}]] #{index + 1}" if isinstance(index, int) else f"[[{table}]]"
        if err["type"] == "extra_forbidden":
            return f"unknown field '{field}' in {entry}{where}"
        return f"invalid {f'field {field!r} in ' if field else ''}{entry}{where}: {msg}"
    if err["type"] == "extra_forbidden":
        return f"unknown setting '{name}'{where}"
    hint = f" (flag --{name.replace('_', '-')}, env RADIXCHAT_{name.upper()})"
    return f"invalid setting '{name}': {msg}{hint}"
