"""Bad files stay inside their arm (issue 39, item 7): a corrupt or hostile checkpoint is that arm's one-line static
finding, never a traceback of the whole diagnosis or a read outside the checkpoint's folder; env keys that a shell
would take as options are refused when the profile is read."""
import json
import shutil
import struct

import pytest

from infra import checkpoints, embedded
from infra.arms import Arm
from infra.config import DrafterConfig, SpecdiagError, load_profile
from infra.executor import LocalExecutor
from tasks.inspect import inspect_arms


def _head(tmp_path, name):
    return shutil.copytree(embedded.resolve("embedded:smol-eagle3"), tmp_path / name)


def _arm(path):
    return Arm("mine", "candidate", str(path), DrafterConfig(method="eagle3", model=str(path)))


def test_a_header_size_past_the_file_is_that_arms_finding(tmp_path):
    target = embedded.resolve("embedded:smollm2")
    for name, header in (("huge", struct.pack("<Q", 1 << 62)), ("short", struct.pack("<Q", 5000) + b'{"a":'),
                         ("notjson", struct.pack("<Q", 4) + b"\xff\xfe{{")):
        head = _head(tmp_path, name)
        (head / "model.safetensors").write_bytes(header)
        with pytest.raises(SpecdiagError, match="safetensors"):
            checkpoints.tensor_index(LocalExecutor(), str(head))
        found = inspect_arms.fn(target, [_arm(head)])["mine"]
        assert [(f.severity, f.code) for f in found] == [("error", "unreadable")], found  # gating: no server loads
        assert "\n" not in found[0].message


def test_an_index_naming_files_outside_the_folder_is_refused(tmp_path):
    head = _head(tmp_path, "indexed")
    (tmp_path / "secret.safetensors").write_bytes((head / "model.safetensors").read_bytes())
    index = {"weight_map": {"fc.weight": "../secret.safetensors"}}
    (head / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SpecdiagError, match="outside the checkpoint folder"):
        checkpoints.tensor_index(LocalExecutor(), str(head), wanted=lambda k: True)
    for bad in ("/etc/passwd", "a/../../x"):
        assert not checkpoints._inside(bad)
    assert checkpoints._inside("model-00001-of-00002.safetensors")


def test_env_keys_a_shell_would_take_as_options_are_refused():
    for key in ("-i", "1X", "A B", "X=Y"):
        with pytest.raises(SpecdiagError, match="is no environment variable name"):
            load_profile("demo", sets=[f'engine.env={{"{key}": "v"}}'])
    assert load_profile("demo", sets=["engine.env.VLLM_OK_1=v"]).engine.env["VLLM_OK_1"] == "v"
