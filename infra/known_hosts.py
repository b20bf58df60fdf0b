"""known_hosts as OpenSSH reads it (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT"), for paramiko, which reads only part
of it and, given the file by name, rewrites it whole when it accepts a key.

The file is only ever read. Forms: host names and comma lists, `[host]:port`, hashed names (`|1|salt|hash`),
patterns with `*` and `?` and negated `!patterns`, `@revoked` keys (refused whatever else the file says), and
`@cert-authority` lines (paramiko cannot check host certificates: a host trusted only through one is refused with
the fix). Trailing comments are ignored. A line in no form OpenSSH reads is refused with its number.

`accept_unknown_host_keys` trusts an unknown key for that connection only, in memory; neither this file nor
OpenSSH's later checks learn it.
"""
from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from infra.config import SpecdiagError


@dataclass
class KnownHosts:
    path: Path
    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)  # plain and hashed names
    patterns: list[tuple[list[str], paramiko.PKey]] = field(default_factory=list)
    revoked: list[paramiko.PKey] = field(default_factory=list)
    authorities: list[list[str]] = field(default_factory=list)  # the host patterns of @cert-authority lines

    def matches(self, host: str, patterns: list[str]) -> bool:
        """OpenSSH's rule: some pattern matches and no negated one does."""
        if any(_glob(host, p[1:]) for p in patterns if p.startswith("!")):
            return False
        return any(_glob(host, p) for p in patterns if not p.startswith("!"))

    def by_pattern(self, host: str) -> list[paramiko.PKey]:
        return [key for names, key in self.patterns if self.matches(host, names)]

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return any(key == r for r in self.revoked)


def _glob(host: str, pattern: str) -> bool:
    """ssh's pattern: `*` and `?` are wildcards, every other character (brackets too) is itself; no case."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, host, re.IGNORECASE) is not None


def read(path: str | Path) -> KnownHosts:
    known = KnownHosts(Path(path).expanduser())
    if not known.path.exists():
        return known
    for n, raw in enumerate(known.path.read_text(errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker not in (None, "@revoked", "@cert-authority") or len(fields) < 3:
            raise SpecdiagError(f"{known.path}:{n} is not a known_hosts line OpenSSH reads ([marker] hostnames "
                                "keytype key [comment]): fix or remove it")
        names, key = fields[0].split(","), _key(fields[1], fields[2], known.path, n)
        if key is None:  # a key type paramiko cannot use: that line trusts nothing here
            continue
        if marker == "@revoked":
            known.revoked.append(key)
        elif marker == "@cert-authority":
            known.authorities.append(names)
        elif any(c in name for name in names for c in "*?!"):
            known.patterns.append((names, key))
        else:
            for name in names:
                known.keys.add(name, key.get_name(), key)
    return known


def _key(keytype: str, data: str, path: Path, n: int) -> paramiko.PKey | None:
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise SpecdiagError(f"{path}:{n}: the key is not base64: fix or remove the line") from None
    try:
        return paramiko.PKey.from_type_string(keytype, blob)
    except paramiko.ssh_exception.UnknownKeyType:
        return None
    except Exception:
        raise SpecdiagError(f"{path}:{n}: the {keytype} key does not decode: fix or remove the line") from None


class Policy(paramiko.MissingHostKeyPolicy):
    """A host not found by exact or hashed name: trusted where a pattern line names it with this key; refused
    where a pattern line names it with another key, or only a @cert-authority line does; else accepted for this
    connection only (`accept`), or refused."""

    def __init__(self, known: KnownHosts, accept: bool):
        self.known, self.accept = known, accept

    def missing_host_key(self, client, hostname, key):
        expected = self.known.by_pattern(hostname)
        if any(key == k for k in expected):
            return
        if expected:
            raise paramiko.BadHostKeyException(hostname, key, expected[0])
        if any(self.known.matches(hostname, names) for names in self.known.authorities):
            raise SpecdiagError(f"{self.known.path} trusts {hostname} only through a @cert-authority line, which "
                              "paramiko cannot check: add the host's own key (ssh-keyscan) beside it")
        if not self.accept:
            raise paramiko.SSHException(f"Server {hostname!r} not found in known_hosts")
