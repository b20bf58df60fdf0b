import json
import random

import pytest

from infra.config import SpecdiagError
from infra.promptsets import load, looks_random, natural_share, shipped


def test_shipped_sets_cover_chat_reasoning_code_and_long_context():
    assert {"chat", "math", "code", "long"} <= set(shipped())
    for name in ("chat", "math", "code", "long"):
        prompts = load(name, 8)
        assert len(prompts) == 8 and all(len(p) > 20 for p in prompts)
    assert min(len(p) for p in load("long", 8)) > 900  # long context: passages of a few hundred tokens


def test_sharegpt_json_and_jsonl_take_the_first_user_turn(tmp_path):
    convs = [{"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "Hi there, who are you?"},
                                {"from": "gpt", "value": "An assistant."}]},
             {"messages": [{"role": "user", "content": "Name three rivers in Europe."}]}]
    (tmp_path / "share.json").write_text(json.dumps(convs))
    (tmp_path / "share.jsonl").write_text("\n".join(json.dumps(c) for c in convs))
    expected = ["Hi there, who are you?", "Name three rivers in Europe."]
    assert load(str(tmp_path / "share.json"), 2) == expected == load(str(tmp_path / "share.jsonl"), 2)
    (tmp_path / "bad.json").write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "x"}]}]))
    with pytest.raises(SpecdiagError, match="entry 1 has no 'prompt' and no user turn"):
        load(str(tmp_path / "bad.json"), 1)


def test_random_token_prompts_are_refused_with_the_reason(tmp_path):
    with pytest.raises(SpecdiagError, match="random-token prompts collapse every drafter"):
        load("random", 4)
    rng = random.Random(0)
    pieces = ["Ġ", "ĉ", "}", "_{", "ørn", "0x", "⁄", "ющ", "##", "\\", "=>", "ivity", "ãĥ", "7"]
    gibberish = ["".join(rng.choice(pieces) for _ in range(3)) + " " + " ".join(
        "".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) for _ in range(40)) for _ in range(6)]
    (tmp_path / "rand.jsonl").write_text("\n".join(json.dumps({"prompt": g}) for g in gibberish))
    assert looks_random(gibberish)
    with pytest.raises(SpecdiagError, match="looks like random-token prompts, refused"):
        load(str(tmp_path / "rand.jsonl"), 4)


def test_natural_text_and_code_are_not_mistaken_for_random():
    for name in ("chat", "math", "code", "long"):
        assert not looks_random(load(name, 16)), name
    assert natural_share("The quick brown fox jumps over the lazy dog.") == 1.0
