"""Fault tests: each breaks one thing for real (a process, a connection, a store, an input) and asserts what is left:
no process, a free lock, the right run states and artifacts, and one clear line."""
from tests.e2e.conftest import no_servers_left  # noqa: F401  (no vLLM server or registry entry left)
from tests.ssh.conftest import host, sshd  # noqa: F401  (the real sshd on 127.0.0.1, for SSH faults)
