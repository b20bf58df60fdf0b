"""Prompt sets: the shipped ones (infra/prompts/<name>.jsonl: chat, math, code, long), a user's JSONL
({"prompt": ...} per line), or ShareGPT-style data ({"conversations": [{"from": "human", "value": ...}, ...]},
as JSONL or one JSON array). The first user turn of a conversation is the prompt.

Random-token prompts are refused for acceptance measurements: any drafter collapses on them (13-27%, and 0.6%
for a drafter that reaches 48% on natural text), so they say nothing about the drafter.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from infra.config import SpecdiagError

PROMPTS_DIR = Path(__file__).parent / "prompts"
RANDOM_REASON = ("random-token prompts collapse every drafter's acceptance (13-27% for any drafter; 0.6% for one "
                 "that reaches 48% on natural text): they measure nothing about the drafter. Use a shipped set "
                 "(chat, math, code, long), your own JSONL, or ShareGPT-style data")
_WORD = re.compile(r"^[\"'(\[]?[A-Za-z]+(?:['-][A-Za-z]+)*[\"')\].,!?;:]*$")


def shipped() -> list[str]:
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))


def _first_user_turn(row: dict) -> str | None:
    if "prompt" in row:
        return str(row["prompt"])
    turns = row.get("conversations") or row.get("messages") or []
    for turn in turns:
        who = turn.get("from") or turn.get("role")
        if who in ("human", "user"):
            return str(turn.get("value") or turn.get("content") or "")
    return None


def _rows(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecdiagError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, list):
            raise SpecdiagError(f"{path}: expected a JSON array of conversations (ShareGPT style)")
        return data
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise SpecdiagError(f"{path}:{n}: not a JSON object") from None
    return rows


def natural_share(prompt: str) -> float:
    """Share of whitespace-separated pieces that look like words: ~0.7-1.0 for text (code included), low for
    decoded random token ids."""
    pieces = prompt.split()
    return sum(bool(_WORD.match(p)) for p in pieces) / len(pieces) if pieces else 1.0


def looks_random(prompts: list[str]) -> bool:
    return sum(natural_share(p) for p in prompts) / max(1, len(prompts)) < 0.4


def load(spec: str, count: int, repeat: bool = True) -> list[str]:
    """`count` prompts (the set repeats when shorter, unless not `repeat`: then every prompt once, in order, at most
    `count`): a shipped set name, or a .jsonl/.json path."""
    if spec.lower() in ("random", "random-tokens"):
        raise SpecdiagError(f"prompt set {spec!r} refused: {RANDOM_REASON}")
    path = Path(spec).expanduser() if spec.endswith((".jsonl", ".json")) else PROMPTS_DIR / f"{spec}.jsonl"
    if not path.exists():
        raise SpecdiagError(f"prompt set {spec!r} not found; shipped sets: {', '.join(shipped())} "
                            f"(or a .jsonl / ShareGPT .json path)")
    prompts = []
    for n, row in enumerate(_rows(path), 1):
        prompt = _first_user_turn(row) if isinstance(row, dict) else None
        if not prompt:
            raise SpecdiagError(f"{path}: entry {n} has no 'prompt' and no user turn in 'conversations'")
        prompts.append(prompt)
    if not prompts:
        raise SpecdiagError(f"{path} holds no prompts")
    if looks_random(prompts):
        raise SpecdiagError(f"{path} looks like random-token prompts, refused: {RANDOM_REASON}")
    if not repeat:
        return list(dict.fromkeys(prompts))[:count]
    return [prompts[i % len(prompts)] for i in range(count)]


def distinct(spec: str) -> int:
    """How many different prompts the set holds."""
    return len(set(load(spec, 1 << 30, repeat=False)))
