"""The configuration reference: docs/config.md is exactly what `noloco-rt config reference`
prints, every field and section has a doc string, and fault-injection knobs stay out of the
reference and out of `config show` while off, yet remain settable."""

from __future__ import annotations

import dataclasses
import tomllib

from noloco_rt.config import SECTIONS, config_to_toml, load_config, parse_assignment
from noloco_rt.config.reference import REGENERATE, class_docs, render_reference, section_fields
from noloco_rt.config.schema import is_fault_injection
from tests.support.in_process import run_cli_in_process
from tests.support.paths import REPO

FAULT_KNOBS = {"worker.fault_scale_snapshot", "worker.fault_nan_snapshot", "worker.fault_slowdown"}


def test_docs_config_md_is_the_generated_reference():
    checked_in = (REPO / "docs" / "config.md").read_text()
    assert checked_in == render_reference(), f"docs/config.md is out of date: regenerate it with `{REGENERATE}`"


def test_the_command_prints_the_reference(capsys, monkeypatch):
    code, out, err = run_cli_in_process(capsys, monkeypatch, "config", "reference")
    assert code == 0, err
    assert out == render_reference()


def test_every_section_and_field_has_a_doc_string():
    undocumented = []
    for section, cls in SECTIONS.items():
        section_doc, field_docs = class_docs(cls)
        if not section_doc.strip():
            undocumented.append(f"[{section}]")
        undocumented += [f"{section}.{f.name}" for f in dataclasses.fields(cls)
                         if not field_docs.get(f.name, "").strip()]
    assert not undocumented, f"add a doc string on the line after each of {undocumented}"


def test_the_reference_lists_every_field_but_the_fault_knobs():
    text = render_reference()
    every = {f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    listed = {ref.key for section in SECTIONS for ref in section_fields(section)}
    assert listed == every - FAULT_KNOBS
    assert {key for key in every if is_fault_injection(key.split(".")[1])} == FAULT_KNOBS
    for key in every - FAULT_KNOBS:
        assert f"### `{key}`" in text
    for key in FAULT_KNOBS:
        assert key not in text


def test_a_field_reads_as_type_default_variable_and_meaning():
    text = render_reference()
    assert ("### `outer.alpha`\n\n`float | None`, default `unset`, variable `NOLOCO_OUTER_ALPHA`\n\n"
            "Outer momentum; None: the method's paper default.\n") in text
    assert "### `data.paths`\n\n`list[str]`, default `[]`, variable `NOLOCO_DATA_PATHS`" in text
    # Markdown would take <name> for an HTML tag outside a code span.
    assert "\\<name>.pt" in text and "\\<" not in text.split("`noloco-rt keys")[1].split("`")[0]


def test_config_show_leaves_out_fault_knobs_while_off_and_reads_back(tmp_path, capsys, monkeypatch):
    code, shown, err = run_cli_in_process(capsys, monkeypatch, "config", "show")
    assert code == 0, err
    assert shown.startswith("# What each field means: `noloco-rt config reference`")
    assert "fault_" not in shown
    path = tmp_path / "shown.toml"
    path.write_text(shown)
    assert load_config(path, environ={}) == load_config(environ={})
    assert "fault_" not in tomllib.loads(shown)["worker"]


def test_a_fault_knob_that_is_on_is_shown_and_still_settable(tmp_path):
    cfg = load_config(environ={"NOLOCO_WORKER_FAULT_NAN_SNAPSHOT": "true"},
                      overrides=[parse_assignment("worker.fault_slowdown=2.0")])
    assert cfg.worker.fault_slowdown == 2.0 and cfg.worker.fault_nan_snapshot
    text = config_to_toml(cfg)
    assert "fault_slowdown = 2.0" in text and "fault_nan_snapshot = true" in text
    assert "fault_scale_snapshot" not in text
    path = tmp_path / "back.toml"
    path.write_text(text)
    assert load_config(path, environ={}) == cfg
