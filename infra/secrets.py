"""Nothing secret recorded: env values that may be credentials never reach MLflow, Prefect's logs, the report or the
server registry. A value is secret where its key names a credential (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY,
VLLM_API_KEY), where the profile lists its key under `secrets`, or where the key is none of the engine tunables known
to be harmless (VLLM_*, CUDA_*, OMP_*, ...): an unknown variable is taken for a secret, since recording one costs a
line of diagnosis and leaking one costs a credential.

Every profile built in this process registers its secret values (infra/config.Profile). Records then carry
`<redacted:HASH>` (the first 12 hex digits of the value's SHA-256: two runs with the same token still compare equal)
wherever a value was: in env mappings, structurally; in free text (commands, logs), by replacement, for values of 8
characters or more (a shorter value would also blank out ordinary words; nothing that short is a credential). The
record factory of `logging` redacts every log record, the prints Prefect forwards to its API among them.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading

import yaml

CREDENTIAL = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|PASSPHRASE|KEY|APIKEY|CREDENTIALS?|AUTH|COOKIE|"
                        r"SESSION|PRIVATE|SIGNATURE|DSN)(_|$)", re.I)
# Engine tunables and paths whose values say how the engine ran and carry no credential.
HARMLESS = re.compile(r"^(VLLM|SPECDIAG|CUDA|NCCL|NVIDIA|OMP|KMP|MKL|GOMP|PYTORCH|TORCH|TORCHINDUCTOR|TRITON|HF_HUB|"
                      r"TRANSFORMERS|TOKENIZERS|SGLANG)_|^(PATH|LD_LIBRARY_PATH|LD_PRELOAD|PYTHONPATH|HOME|HF_HOME|"
                      r"TMPDIR|LANG|LC_ALL|TZ)$")
MIN_TEXT = 8  # values shorter than this are redacted in env mappings only, never replaced in free text

MARKER = re.compile(r"^<redacted:([0-9a-f]{12})>$")

_values: set[str] = set()
_marked: set[str] = set()  # keys a profile's `secrets` names
_lock = threading.Lock()


def secret_key(key: str) -> bool:
    """Whether the value of env variable `key` is redacted: marked secret by a profile, named like a credential, or
    not known harmless."""
    return key in _marked or bool(CREDENTIAL.search(key)) or not HARMLESS.match(key)


def marker(value: str) -> str:
    return f"<redacted:{hashlib.sha256(value.encode()).hexdigest()[:12]}>"


def is_marker(value: str) -> bool:
    return bool(MARKER.match(value or ""))


def env(mapping: dict[str, str]) -> dict[str, str]:
    """The mapping with every secret value replaced by its marker (keys stay: they say what was set)."""
    return {k: marker(v) if v and secret_key(k) and not is_marker(v) else v for k, v in mapping.items()}


def hide_sets(sets: list[str]) -> list[str]:
    """--set items with every secret env value moved into this process's environment (where a profile read back
    finds it) and replaced by its marker: what Prefect records as the flow's parameters holds no secret."""
    out = []
    for item in sets:
        path, _, raw = item.partition("=")
        parts, value = path.strip().split("."), _scalar(raw)
        if len(parts) >= 2 and parts[-2] in ("env", "engine_env") and value and secret_key(parts[-1]):
            os.environ[parts[-1]] = value
            register([value])
            item = f"{path}={marker(value)}"
        out.append(item)
    return out


def _scalar(raw: str) -> str | None:
    """A --set value as the profile reads it (YAML), where that is a string."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return None
    return value if isinstance(value, str) else None


def mark(keys) -> None:
    with _lock:
        _marked.update(keys)


def restore(mapping: dict[str, str]) -> dict[str, str]:
    """An env mapping read back: each marker replaced by the value of the variable of the same name in this process's
    environment, where its hash matches (else a ValueError naming the fix); every secret value registered."""
    for key, recorded in mapping.items():
        if not is_marker(recorded):
            continue
        value = os.environ.get(key)
        if value is None:
            raise ValueError(f"{key} was recorded redacted ({recorded}): export {key} with its value in this "
                             "process's environment (for a spread arm, where its worker starts)")
        if marker(value) != recorded:
            raise ValueError(f"the {key} in this environment is not the value recorded ({recorded}): export the "
                             "one the diagnosis ran with")
        mapping[key] = value
    register(v for k, v in mapping.items() if secret_key(k))
    return mapping


def register(values) -> None:
    """Values to replace wherever they appear in text recorded or logged by this process."""
    new = {v for v in values if v and len(v) >= MIN_TEXT}
    if new - _values:
        with _lock:
            _values.update(new)
        _install()


def redact(text: str) -> str:
    """`text` with every registered secret value replaced by its marker."""
    if not _values or not isinstance(text, str):
        return text
    for v in sorted(_values, key=len, reverse=True):  # a value that holds another goes first
        if v in text:
            text = text.replace(v, marker(v))
    return text


_installed = False


def _install() -> None:
    """Redact every log record this process makes, whoever logs it (Prefect's print capture included)."""
    global _installed
    if _installed:
        return
    make = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = make(*args, **kwargs)
        if _values and isinstance(record.msg, str):
            try:
                record.msg, record.args = redact(record.getMessage()), ()
            except (TypeError, ValueError):  # a message its arguments do not fit: logging reports it as ever
                pass
        return record
    logging.setLogRecordFactory(factory)
    _installed = True
