import os
import socket
import time

import pytest

from infra.executor import LocalExecutor, shell_command


def test_launch_records_command_and_stop_group_kills_children(tmp_path):
    ex = LocalExecutor()
    log = tmp_path / "x.log"
    # a parent that forks a child which ignores SIGTERM: both must be gone after stop_group
    script = "trap '' TERM; (trap '' TERM; sleep 300) & echo started; sleep 300"
    proc = ex.launch(["bash", "-c", script], {"VLLM_A": "b c", "HF_TOKEN": "hf_x"}, str(log))
    # as recorded: an engine tunable as it is, a credential as its marker (infra/secrets.py)
    assert proc.command.startswith("HF_TOKEN='<redacted:")
    assert "VLLM_A='b c' bash -c " in proc.command and "hf_x" not in proc.command
    for _ in range(50):
        if len(ex.group_pids(proc.pgid)) >= 2:
            break
        time.sleep(0.1)
    assert ex.is_alive(proc.pid) and len(ex.group_pids(proc.pgid)) >= 2
    assert ex.stop_group(proc.pgid, grace_s=0.5) == []
    assert ex.group_pids(proc.pgid) == [] and not ex.is_alive(proc.pid)
    assert "started" in ex.read_tail(str(log))


def test_read_from_offsets(tmp_path):
    f = tmp_path / "log"
    f.write_text("one\n")
    ex = LocalExecutor()
    text, off = ex.read_from(str(f), 0)
    with open(f, "a") as fh:
        fh.write("two\n")
    assert text == "one\n" and ex.read_from(str(f), off) == ("two\n", 8)
    assert ex.read_from(str(tmp_path / "missing"), 0) == ("", 0)


def test_port_free():
    ex = LocalExecutor()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not ex.port_free(s.getsockname()[1])


def test_shell_command_quotes():
    assert shell_command(["echo", "a b;c"], {}) == "echo 'a b;c'"
    assert shell_command(["x"], {"VLLM_K": "v"}) == "VLLM_K=v x"


def test_local_fetch_and_put_onto_the_same_path_are_no_ops(tmp_path):
    """With the default host.workdir the host's run folder is this machine's copy: the report is read where it is."""
    ex = LocalExecutor()
    report = tmp_path / "runs" / "abc" / "offline_eval.json"
    report.parent.mkdir(parents=True)
    report.write_text('{"arms": {}}')
    assert ex.fetch(str(report), tmp_path / "runs" / "abc" / ".." / "abc" / "offline_eval.json").read_text() \
        == '{"arms": {}}'
    assert ex.put(report, str(report)) == str(report) and report.read_text() == '{"arms": {}}'
    copy = ex.fetch(str(report), tmp_path / "elsewhere" / "r.json")  # a real copy still copies
    assert copy.read_text() == '{"arms": {}}' and copy != report


def test_secret_values_are_markers_wherever_recorded(tmp_path, monkeypatch):
    """infra/secrets.py: which env values are secret, the marker a record carries, the text and log redaction, and a
    profile read back from its JSON (a spread worker's, a --rerun's) taking each marked value from its environment."""
    from infra import secrets
    from infra.config import Profile, load_profile

    monkeypatch.delenv("HF_TOKEN", raising=False)  # as it was, after the test (hide_sets exports it)
    assert secrets.secret_key("HF_TOKEN") and secrets.secret_key("VLLM_API_KEY") and secrets.secret_key("ODD")
    assert not secrets.secret_key("VLLM_CPU_KVCACHE_SPACE") and not secrets.secret_key("TOKENIZERS_PARALLELISM")
    sets = secrets.hide_sets(["engine.env.HF_TOKEN=hf_unitCANARY0001", "bench.max_tokens=8"])
    assert sets == [f"engine.env.HF_TOKEN={secrets.marker('hf_unitCANARY0001')}", "bench.max_tokens=8"]
    cfg = load_profile("demo", sets=sets)  # the marker, taken from the environment hide_sets put it in
    assert cfg.engine.env["HF_TOKEN"] == "hf_unitCANARY0001"
    assert "hf_unitCANARY0001" not in cfg.model_dump_json() and cfg.model_dump()["engine"]["env"]["HF_TOKEN"]
    assert secrets.redact("x hf_unitCANARY0001 y") == f"x {secrets.marker('hf_unitCANARY0001')} y"
    import logging
    record = logging.getLogger("specdiag.test").makeRecord("n", logging.INFO, "f", 1, "got %s", ("hf_unitCANARY0001",),
                                                           None)
    assert "hf_unitCANARY0001" not in record.getMessage()
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(Exception, match="export HF_TOKEN"):
        Profile.model_validate_json(cfg.model_dump_json())
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(Exception, match="not the value recorded"):
        Profile.model_validate_json(cfg.model_dump_json())
    from infra import registry
    monkeypatch.setenv("SPECDIAG_CACHE", str(tmp_path))
    registry.remember(1, 1, "a", "unit-secrets", "HF_TOKEN=hf_unitCANARY0001 vllm serve")
    assert all("hf_unitCANARY0001" not in e["command"] for e in registry.launched("unit-secrets"))
    registry.forget(1, "unit-secrets")
