"""The CLI entry point run in the test's own process, for commands refused before any real
work (a subprocess per case costs seconds of imports): exit code, stdout, stderr."""

from __future__ import annotations

import os

import pytest


def run_cli_in_process(capsys, monkeypatch, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    from noloco_rt.cli import main

    for key in [k for k in os.environ if k.startswith("NOLOCO_")]:
        monkeypatch.delenv(key)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err
