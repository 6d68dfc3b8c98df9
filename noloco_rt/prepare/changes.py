"""What differs between the arguments an output was prepared with and a rerun's: the one
line a refused --out names. Pure."""

from __future__ import annotations

from typing import Any

OPTION_NAMES = {"jsonl_field": "--text-field", "tokenizer_sha256": "--tokenizer (its contents)",
                "train_bpe": "--train-bpe", "val_percent": "--val-percent", "shard_tokens": "--shard-tokens",
                "eos_token": "--eos-token"}


def describe_change(before: dict[str, Any], now: dict[str, Any]) -> str:
    """E.g. "--val-percent 20 -> 10; inputs: b.txt added, a.txt changed size (120 -> 96 bytes)"."""
    parts = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        if key == "inputs":
            parts.append(f"inputs: {_inputs_change(old or [], new or [])}")
        elif key == "tokenizer_sha256":
            parts.append(OPTION_NAMES[key])
        else:
            parts.append(f"{OPTION_NAMES.get(key, key)} {old} -> {new}")
    return "; ".join(parts) or "nothing (the recorded arguments are unreadable)"


def _inputs_change(before: list[list[Any]], now: list[list[Any]]) -> str:
    old = {entry[0]: entry for entry in before if isinstance(entry, list) and entry}
    new = {entry[0]: entry for entry in now if isinstance(entry, list) and entry}
    changes = [f"{path} added" for path in new if path not in old]
    changes += [f"{path} gone" for path in old if path not in new]
    for path in new.keys() & old.keys():
        if old[path] != new[path]:
            changes.append(f"{path} changed size ({old[path][-1]} -> {new[path][-1]} bytes)")
    return ", ".join(sorted(changes)) or "the same files in another order"
