"""Secrets never reach a file a run writes: a Redis password and a CURVE secret key planted in
a run's config are searched for in every file under its output folder, the consensus file
(which people share) included, and in everything it printed."""

from __future__ import annotations

import pytest
import zmq
from click.testing import CliRunner

from noloco_rt.cli import cli
from noloco_rt.consensus.file import load_consensus
from tests.support.secrets import PASSWORD, files_holding


def test_simulate_writes_no_secret_and_its_consensus_still_loads(tmp_path):
    secret = zmq.curve_keypair()[1].decode()
    out = tmp_path / "sim"
    result = CliRunner().invoke(cli, [
        "simulate", "--stages", "2", "--replicas", "2", "--steps", "4", "--eval-every", "4", "--out", str(out),
        "--set", "outer.h=2", "--set", f"network.curve_secret_key={secret}",
        "--set", f"network.redis_url=redis://noloco:{PASSWORD}@127.0.0.1:1/0",
        "--set", f"store.url=s3://keyid:{PASSWORD}@bucket.example/runs"])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert "consensus.safetensors" in written and "config.toml" in written, written
    assert files_holding(out, [secret, PASSWORD]) == []
    assert secret not in result.output and PASSWORD not in result.output
    cfg, _, _ = load_consensus(out / "consensus.safetensors")  # the redacted config reads back
    assert cfg.network.curve_secret_key == "" and cfg.network.redis_url == "redis://noloco:***@127.0.0.1:1/0"


def test_a_store_url_with_a_password_is_shown_without_it():
    from noloco_rt.store.backend import RunStore, StoreError

    url = f"nosuchscheme://keyid:{PASSWORD}@bucket.example/runs"
    with pytest.raises(StoreError) as refused:
        RunStore(url)
    assert PASSWORD not in str(refused.value) and "keyid:***@bucket.example" in str(refused.value)


def test_a_refused_redis_url_is_shown_without_its_password():
    from noloco_rt.config import ConfigError, load_config

    for url in (f"http://noloco:{PASSWORD}@host:6379/0", f"redis://:{PASSWORD}@host:notaport/0"):
        try:
            load_config(overrides=[{"network": {"redis_url": url, "redis_tls_ca_file": "ca.pem"}}], environ={})
        except ConfigError as refused:
            assert PASSWORD not in str(refused) and "***@host" in str(refused), refused
        else:
            raise AssertionError(f"{url} was accepted")


def test_secrets_given_on_the_command_line_are_named_but_not_shown():
    from noloco_rt.commands import secrets_on_command_line

    secret = zmq.curve_keypair()[1].decode()
    found = secrets_on_command_line([{"network": {"redis_url": f"redis://:{PASSWORD}@h:1/0"}},
                                     {"network": {"curve_secret_key": secret}}, {"run": {"steps": 3}}])
    assert [w.split(" on the")[0] for w in found] == ["the Redis password", "the CURVE secret key"]
    assert not any(PASSWORD in w or secret in w for w in found)
    assert secrets_on_command_line([{"network": {"redis_url": "redis://h:1/0"}}]) == []
