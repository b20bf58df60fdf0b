"""Typed experiment configuration: YAML profiles under infra/profiles, overridden from the CLI.

Precedence, stated once: CLI flags (and --set key=value) > the YAML profile > the defaults below.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, StringConstraints, ValidationError, model_validator

from infra import secrets

PROFILES_DIR = Path(__file__).parent / "profiles"
PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Methods the vLLM speculative config accepts; the ones after "ngram" need a drafter checkpoint.
SPEC_METHODS_WITHOUT_MODEL = ("ngram", "suffix", "mtp")
SPEC_METHODS_WITH_MODEL = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")


class SpecdiagError(Exception):
    """A user-facing error: printed as one message naming the fix, never as a traceback."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _env_keys(env: dict[str, str]) -> dict[str, str]:
    """Names `env` and a shell take as variables: a key such as `-i` would reach `env` on the host as an option."""
    bad = [k for k in env if not ENV_KEY.fullmatch(k)]
    if bad:
        raise ValueError(f"{bad[0]!r} is no environment variable name (letters, digits and _, not first a digit)")
    return env


ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# An engine environment. Dumped as JSON (MLflow's profile.json, Prefect's flow-run parameters, a spread arm's
# parameters) its secret values are markers (infra/secrets.py); read back, each marked value is taken from this
# process's environment (a spread worker's, a --rerun's), and every secret value is registered for redaction.
Env = Annotated[dict[str, str], AfterValidator(_env_keys), AfterValidator(secrets.restore),
                PlainSerializer(secrets.env, when_used="json")]


class DrafterConfig(_Strict):
    """One speculative config: what goes into vLLM's --speculative-config."""

    method: str
    model: str | None = None
    num_speculative_tokens: int = Field(default=4, ge=1, le=32)
    extra: dict[str, Any] = Field(default_factory=dict)
    # Environment for this arm's server only, e.g. an engine-side patch switched on for one arm.
    engine_env: Env = Field(default_factory=dict)
    # What this drafter reaches when served right (e.g. from its model card; note the source in a comment). A control
    # counts as known-good against this, or against its own offline acceptance: low against it means the engine.
    expected_acceptance: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _check_drafter(self) -> "DrafterConfig":
        known = SPEC_METHODS_WITHOUT_MODEL + SPEC_METHODS_WITH_MODEL
        if self.method not in known:
            raise ValueError(f"unknown speculative method {self.method!r}; known: {', '.join(known)}")
        if self.method in SPEC_METHODS_WITH_MODEL and not self.model:
            raise ValueError(f"method {self.method!r} needs a drafter checkpoint in 'model'")
        clash = {"method", "model", "num_speculative_tokens"} & set(self.extra)
        if clash:
            raise ValueError(f"'extra' must not repeat {sorted(clash)}: set them as fields")
        return self

    def speculative_config(self, model_path: str | None) -> dict[str, Any]:
        cfg: dict[str, Any] = {"method": self.method}
        if model_path:
            cfg["model"] = model_path
        cfg["num_speculative_tokens"] = self.num_speculative_tokens
        cfg.update(self.extra)
        return cfg


class TargetConfig(_Strict):
    model: str  # a path, or "embedded:<name>" for a model the project builds itself
    served_model_name: str | None = None
    args: list[str] = Field(default_factory=list)  # extra server arguments, identical for every arm
    port: int = Field(default=8011, ge=1024, le=65535)

    def max_model_len(self) -> int | None:
        """The longest sequence the server accepts, when the arguments set it (--max-model-len N or =N)."""
        for i, a in enumerate(self.args):
            if a.startswith("--max-model-len="):
                return int(a.split("=", 1)[1])
            if a == "--max-model-len" and i + 1 < len(self.args):
                return int(self.args[i + 1])
        return None


class EngineConfig(_Strict):
    kind: Literal["vllm"] = "vllm"
    python: str | None = None  # interpreter with vLLM; None = the embedded vLLM CPU virtualenv
    env: Env = Field(default_factory=dict)
    # vLLM >= 0.32 returns each request's own accepted/drafted counts per verify step (the acceptance intervals
    # over requests and acceptance by position in the sequence come from them); "none" for older engines.
    per_request_spec_metrics: Literal["none", "summary", "detailed"] = "detailed"


class JumpHost(_Strict):
    address: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None


class HostConfig(_Strict):
    """Where servers run: this machine, or a GPU host over SSH. Same flow either way; only the executor differs."""

    name: str = "local"
    kind: Literal["local", "ssh"] = "local"
    address: str | None = None  # ssh: host name or IP
    port: int = Field(default=22, ge=1, le=65535)
    user: str = "root"
    key_file: str | None = None  # None: the default keys in ~/.ssh
    known_hosts: str = "~/.ssh/known_hosts"
    accept_unknown_host_keys: bool = False  # explicit opt-in; unknown keys are refused by default
    jump: JumpHost | None = None  # a bastion to go through (ssh -J)
    connect_timeout_s: float = Field(default=15.0, gt=0)
    python: str | None = None  # the interpreter with vLLM on this host; overrides engine.python
    workdir: str = "runs"  # server logs; relative to the project root (local) or the login directory (ssh)
    gpu_memory_free_mib: int = 1024  # cleanup counts a GPU as free under this much used memory
    gpus: list[int] | None = None  # GPUs the server uses; None = all
    cpus: list[int] | None = None  # CPU cores the whole server is confined to (taskset; vLLM CPU binds its threads)
    server_port: int | None = Field(default=None, ge=1024, le=65535)  # the server's port here; None = target.port
    env: Env = Field(default_factory=dict)  # engine environment on this host, over engine.env
    stop_any_gpu_process: bool = False  # opt in: cleanup may stop processes this tool did not start
    # The longest an arm waits for this host's GPUs and port while another diagnosis holds them; then it fails saying
    # who holds them (a holder whose process died gives them back at once).
    lock_wait_s: float = Field(default=4 * 3600.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "HostConfig":
        if self.kind == "ssh" and not self.address:
            raise ValueError(f"host {self.name!r} is kind ssh: set its address")
        return self


class BenchConfig(_Strict):
    prompts: str = "chat"  # a shipped set (infra/prompts/<name>.jsonl) or a JSONL path
    num_prompts: int = Field(default=6, ge=1)
    warmup: int = Field(default=1, ge=0)
    max_tokens: int = Field(default=48, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    concurrency: int = Field(default=1, ge=1)
    endpoint: Literal["chat", "completions"] = "chat"
    # Sent with every chat request (vLLM's chat_template_kwargs), e.g. {enable_thinking: false} for a Qwen3 target.
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    thinking_kwarg: str = "enable_thinking"  # the variable the target's template reads (thinking probe; check yours)
    request_timeout_s: float = Field(default=300.0, gt=0)
    request_rate: float | None = Field(default=None, gt=0)  # Poisson arrivals (req/s); None = back to back
    # After the measured window, the same prompts again at each of these concurrencies, on the same server
    # (metrics <name>_c<N> and concurrency_sweep.csv); not used by the verdict.
    concurrency_sweep: list[int] = Field(default_factory=list)
    # Early stop (the default; --fixed turns it off): end the measured window once acceptance and tok/s are known
    # to the precision the verdict needs (num_prompts is then the cap), or a budget is spent.
    early_stop: bool = True
    acceptance_half_width: float = Field(default=0.05, gt=0)  # Wilson, n = drafts
    tok_s_rel_half_width: float = Field(default=0.10, gt=0)  # t-interval half-width / mean, per-request tok/s
    min_requests: int = Field(default=3, ge=2)
    max_output_tokens: int | None = Field(default=None, ge=1)  # token budget for the measured window (--budget-tokens)
    max_bench_s: float | None = Field(default=None, gt=0)  # time budget for the measured window (--budget-s)


class ReuseConfig(_Strict):
    """An arm whose fingerprint matches a successful arm in MLflow is reused, not measured again (tasks/reuse.py)."""

    enabled: bool = True  # --fresh: measure every arm
    max_age_h: float = Field(default=168.0, gt=0)  # --max-age: older measurements are not reused


class SwapConfig(_Strict):
    """Drafter arms of the same shapes share one loaded server: each next drafter is swapped into the running engine
    (infra/swap.py) instead of a server load (25 minutes on a 1T target)."""

    enabled: bool = True  # --no-swap: every drafter arm gets its own load
    timeout_s: float = Field(default=300.0, gt=0)  # one swap, end to end (a 1T head's weights are read from disk)


class OfflineConfig(_Strict):
    """Where the offline evaluation's target states come from (the methods it covers: Profile.offline_eval)."""

    # A folder of hidden-state dumps on the host (SpecForge rows_*/data_*.ckpt, speculators hs_*.safetensors, or
    # seq_*.pt): the evaluation reads them instead of running the target, whatever its size.
    hidden_states: str | None = None
    loss_masks: str | None = None  # speculators: its preprocessed dataset (default: the dumps' parent folder)
    # Without dumps, a target over this many GB is not loaded with transformers: the evaluation is skipped.
    max_target_gb: float = Field(default=32.0, gt=0)
    python: str | None = None  # interpreter for it on the host (torch, safetensors); None = the engine's


class SpreadConfig(_Strict):
    """One diagnosis's arms run concurrently, one per host, by Prefect workers (infra/spread.py): each host of
    `hosts` has a work queue `host-<name>` in `pool`, polled by a worker started with --limit 1."""

    hosts: list[str] = Field(default_factory=list)  # hosts of the inventory; empty: in order, in this process
    pool: str = "specdiag"
    deployment: str = "arm/spread"  # the arm flow's deployment (prefect.yaml)
    # Spread over a Prefect server or an MLflow server that answers without credentials (--insecure-services): anyone
    # who reaches them can start arms, and so run code on the workers and, through their SSH keys, on the hosts.
    insecure_services: bool = False


class Profile(_Strict):
    name: str
    target: TargetConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    hosts: dict[str, HostConfig] = Field(default_factory=dict)  # the inventory; "local" is always there
    host: HostConfig | str = Field(default_factory=HostConfig)  # a HostConfig, or a name from hosts
    bench: BenchConfig = Field(default_factory=BenchConfig)
    drafters: dict[str, DrafterConfig]
    drafter: str | None = None  # the candidate
    control: str | None = None  # the known-good control
    arms: list[str] = Field(default_factory=list)  # extra arms after candidate and control
    health_timeout_s: float = Field(default=300.0, gt=0)
    # Offline drafter evaluation (no server): for EAGLE-3 arms, all drafter arms, or none.
    offline_eval: Literal["eagle3", "all", "none"] = "eagle3"
    offline: OfflineConfig = Field(default_factory=OfflineConfig)
    # Probe arms derived from the candidate (see infra/arms.py: probe_arms), each one more server launch.
    probes: list[Literal["k_sweep", "graphs", "raw_prompts", "temperature", "thinking", "control_mapping",
                          "aux_layers"]] = Field(
        default_factory=list)
    k_sweep: list[int] = Field(default_factory=lambda: [1, 2, 4, 6])
    # Launch an arm even when a static check found a fault that makes its server load pointless (tasks/inspect.GATING)
    force: bool = False
    confirm: bool = False  # run the verdict's fix as one more arm (tasks/confirm.py)
    reuse: ReuseConfig = Field(default_factory=ReuseConfig)
    swap: SwapConfig = Field(default_factory=SwapConfig)
    spread: SpreadConfig = Field(default_factory=SpreadConfig)
    # Env keys whose values are secret besides those infra/secrets.py takes for secret (credential-like names, and
    # any key that is no known engine tunable): redacted wherever recorded or logged.
    secrets: list[str] = Field(default_factory=list)
    # The YAML file it was read from (relative to the project where it lies inside): a spread worker checks a run's
    # code-choosing settings against its own copy of it (infra/spread.vet)
    source: str | None = None

    @model_validator(mode="after")
    def _mark_secrets(self) -> "Profile":
        """The keys `secrets` names are secret from here on: their values too are redacted."""
        secrets.mark(self.secrets)
        for env in [self.engine.env, *(h.env for h in self.hosts.values()),
                    *(d.engine_env for d in self.drafters.values())]:
            secrets.restore(env)
        return self

    @model_validator(mode="after")
    def _pick_host(self) -> "Profile":
        for name, h in self.hosts.items():
            if h.name != name:
                self.hosts[name] = h.model_copy(update={"name": name})
        self.hosts.setdefault("local", HostConfig())
        if "host" not in self.model_fields_set:  # unnamed: this machine, as the inventory's "local" describes it
            self.host = "local"
        for name in ([self.host] if isinstance(self.host, str) else []) + self.spread.hosts:
            if name not in self.hosts:
                raise ValueError(f"unknown host {name!r}; known hosts: {', '.join(sorted(self.hosts))}")
        if isinstance(self.host, str):
            self.host = self.hosts[self.host]
        return self

    def on_host(self, name: str) -> "Profile":
        """This profile with one host of its inventory serving it."""
        return self.model_copy(update={"host": self.hosts[name]})

    @property
    def server_port(self) -> int:
        return self.host.server_port or self.target.port

    @property
    def engine_env(self) -> dict[str, str]:
        """The servers' environment on this host: the engine's, then the host's own."""
        return {**self.engine.env, **self.host.env}

    @property
    def engine_python(self) -> str | None:
        return self.host.python or self.engine.python


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def known_drafters() -> list[str]:
    """Every drafter the shipped profiles name: the choices a deployment's form offers."""
    names: set[str] = set()
    for name in known_profiles():
        data = yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text()) or {}
        names |= set(data.get("drafters") or {})
    return sorted(names)


# What a deployment's form takes, as JSON schema the Prefect server enforces: a shipped profile or a YAML path; a
# shipped drafter or a checkpoint folder's path (absolute, ~ or ./), as on the command line.
ProfileRef = Union[Annotated[Literal[tuple(known_profiles())], Field(title="shipped profile")],
                   Annotated[str, StringConstraints(pattern=r"\.ya?ml$"), Field(title="YAML file")]]
DrafterRef = Union[Annotated[Literal[tuple(known_drafters())], Field(title="named drafter")],
                   Annotated[str, StringConstraints(pattern=r"^(/|~|\.\.?/)"), Field(title="checkpoint path")]]
NoControl = Annotated[Literal[""], Field(title="no control")]


def _set_dotted(data: dict, dotted: str, raw: str) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise SpecdiagError(f"--set {dotted}: {key!r} is not a section")
    try:
        node[keys[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise SpecdiagError(f"--set {dotted}={raw}: value is not valid YAML ({exc})") from None


def _format_validation(name: str, exc: ValidationError) -> str:
    lines = [f"profile {name!r} is invalid:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def load_profile(name_or_path: str, overrides: dict[str, Any] | None = None,
                 sets: list[str] | None = None) -> Profile:
    """Load a profile by name (infra/profiles) or YAML path, apply CLI overrides, validate."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise SpecdiagError(
            f"unknown profile {name_or_path!r}; known profiles: {', '.join(known_profiles())} "
            f"(or pass the path of a YAML file)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecdiagError(f"profile {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecdiagError(f"profile {path} holds a {type(data).__name__}, not a mapping of sections: write it as "
                            f"'target:', 'drafters:', 'bench:' ... (see infra/profiles/demo.yaml)")
    data.setdefault("name", path.stem)
    resolved = path.resolve()
    data["source"] = str(resolved.relative_to(PROJECT_ROOT) if resolved.is_relative_to(PROJECT_ROOT) else resolved)
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, json.dumps(value))
    for item in sets or []:
        if "=" not in item:
            raise SpecdiagError(f"--set {item!r}: expected KEY=VALUE, e.g. bench.max_tokens=64")
        key, raw = item.split("=", 1)
        _set_dotted(data, key.strip(), raw)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise SpecdiagError(_format_validation(data.get("name", str(path)), exc)) from None
