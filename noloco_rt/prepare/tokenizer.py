"""Hugging Face tokenizers: load one, or train a byte-level BPE; ids <-> text for `sample`.

`tokenizers` is imported inside the functions: it is only needed by prepare and sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from noloco_rt.prepare.documents import InputError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TRAINED_EOS = "<|endoftext|>"
# End-of-document tokens of common tokenizers, tried in order when none is named.
EOS_CANDIDATES = (TRAINED_EOS, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
MIN_BPE_VOCAB = 257  # the 256 byte symbols and the end-of-document token


def load_tokenizer(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for any unreadable file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"cannot read tokenizer {path}: {reason}") from None


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 style: every byte is a symbol, so any text encodes) trained on texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_BPE_VOCAB:
        raise InputError(f"--train-bpe {vocab_size}: the vocabulary needs at least {MIN_BPE_VOCAB} tokens")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[TRAINED_EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def eos_token(tokenizer: Tokenizer, requested: str | None) -> tuple[str, int]:
    """The document separator: `requested`, else the first of EOS_CANDIDATES the tokenizer has."""
    names = (requested,) if requested else EOS_CANDIDATES
    for name in names:
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return name, token_id
    if requested:
        raise InputError(f"--eos-token {requested!r} is not in the tokenizer's vocabulary")
    raise InputError(f"the tokenizer has none of {', '.join(EOS_CANDIDATES)}; name its end-of-document "
                     "token with --eos-token")


def vocab_size(tokenizer: Tokenizer) -> int:
    return tokenizer.get_vocab_size(with_added_tokens=True)


class TextCodec:
    """encode/decode with a run's tokenizer, for sampling."""

    def __init__(self, path: Path, eos_id: int | None = None) -> None:
        self.tokenizer = load_tokenizer(path)
        # what an empty prompt starts with, as a new document does in the shards
        self.separator = [eos_id if eos_id is not None else eos_token(self.tokenizer, None)[1]]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in tokens], skip_special_tokens=False)
