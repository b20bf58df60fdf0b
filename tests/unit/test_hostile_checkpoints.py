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


class _Runs:
    """A pickled object whose loading would run a shell command, as a hostile `pytorch_model.bin` carries."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_a_bin_that_pickles_code_or_no_tensors_is_that_arms_finding(tmp_path):
    """A torch .bin whose pickle calls a function is refused unread (weights_only), one line, and its code never
    runs; a .bin of allowed types that are no tensors, or no archive at all, is that arm's one-line finding too."""
    import torch
    target, marker = embedded.resolve("embedded:smollm2"), tmp_path / "ran"
    for name, content in (("code", {"fc.weight": torch.zeros(2, 2), "x": _Runs(marker)}), ("ints", {"fc.weight": 3}),
                          ("list", [torch.zeros(2)]), ("junk", None)):
        head = _head(tmp_path, name)
        (head / "model.safetensors").unlink()
        if content is None:
            (head / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not a torch archive")
        else:
            torch.save(content, head / "pytorch_model.bin")
        found = inspect_arms.fn(target, [_arm(head)])["mine"]
        assert [(f.severity, f.code) for f in found] == [("error", "unreadable")], (name, found)
        assert "\n" not in found[0].message and "pytorch_model.bin" in found[0].message, found
    assert not marker.exists()
    assert "posix.system" in inspect_arms.fn(target, [_arm(tmp_path / "code")])["mine"][0].message
