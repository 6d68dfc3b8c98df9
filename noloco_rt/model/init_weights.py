"""Start a run from weights (model.init_from): a consensus file or a Hugging Face Llama folder.

Each stage reads only its own tensors (safetensors reads lazily, by name), so a worker of
a large model never holds the rest. The HF direction reuses noloco_rt.consensus.hf_format (names
and the inverse rotary permutation); a sharded HF folder is followed through its
model.safetensors.index.json. Any missing tensor, wrong shape or unmappable config is one
InitWeightsError line naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.config.presets import PRESETS, ModelShape
from noloco_rt.consensus.file import CONSENSUS_FORMAT, ExportError, verify_contents
from noloco_rt.consensus.hf_format import HFFormatError, check_hf_config, from_hf, hf_name
from noloco_rt.model.llama import PipelineStage, build_stage
from noloco_rt.model.staged import StagedModel

HF_WEIGHTS, HF_INDEX = "model.safetensors", "model.safetensors.index.json"
_IGNORED_HF = ("rotary_emb.inv_freq",)  # buffers some older HF checkpoints saved; recomputed, not weights


class InitWeightsError(ValueError):
    """The weights cannot start this run; the message names the file and the tensor or field."""


@dataclass(frozen=True)
class WeightSource:
    path: Path
    files: dict[str, Path]
    """Tensor name in the source -> the file holding it."""
    hf: bool
    """True: HF Llama names and rotary layout; False: a noloco consensus file."""
    tied: bool = False
    """HF tie_word_embeddings: lm_head is model.embed_tokens."""

    def name_of(self, name: str) -> str:
        """The source's name for noloco parameter `name`."""
        if not self.hf:
            return name
        mapped = hf_name(name)
        if mapped == "lm_head.weight" and mapped not in self.files and self.tied:
            return "model.embed_tokens.weight"
        return mapped


def _safetensors_keys(path: Path, where: Path) -> tuple[list[str], dict[str, str]]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return list(handle.keys()), dict(handle.metadata() or {})
    except (SafetensorError, OSError) as exc:
        raise InitWeightsError(f"init-from {where}: {path.name} is not a readable safetensors file ({exc})") from None


def _consensus_source(path: Path) -> WeightSource:
    keys, metadata = _safetensors_keys(path, path)
    if metadata.get("format") != CONSENSUS_FORMAT:
        raise InitWeightsError(f"init-from {path}: not a noloco-rt consensus file (format "
                               f"{metadata.get('format')!r}); for a Hugging Face model give its folder")
    return WeightSource(path=path, files=dict.fromkeys(keys, path), hf=False)


def _hf_files(folder: Path) -> dict[str, Path]:
    if (folder / HF_WEIGHTS).is_file():  # transformers prefers the single file too
        keys, _ = _safetensors_keys(folder / HF_WEIGHTS, folder)
        return dict.fromkeys(keys, folder / HF_WEIGHTS)
    if not (folder / HF_INDEX).is_file():
        raise InitWeightsError(f"init-from {folder}: neither {HF_WEIGHTS} nor {HF_INDEX} is there")
    try:
        weight_map = json.loads((folder / HF_INDEX).read_text())["weight_map"]
        files = {str(name): str(file) for name, file in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InitWeightsError(f"init-from {folder}: {HF_INDEX} has no readable weight_map ({exc})") from None
    for file in set(files.values()):
        if not shard_name_ok(file):
            raise InitWeightsError(f"init-from {folder}: {HF_INDEX} names {file[:80]!r}, not a .safetensors "
                                   f"file of this folder")
    return {name: folder / file for name, file in files.items()}


def shard_name_ok(name: str) -> bool:
    """A weight_map entry is a .safetensors file name inside the folder: no path parts, no
    hidden or parent name (pure); an index is data and never points a reader elsewhere."""
    return (name.endswith(".safetensors") and "/" not in name and "\\" not in name and not name.startswith(".")
            and "\0" not in name)


def _hf_source(folder: Path, shape: ModelShape) -> WeightSource:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise InitWeightsError(f"init-from {folder}: no readable config.json ({exc})") from None
    if not isinstance(config, dict):
        raise InitWeightsError(f"init-from {folder}: config.json is not a JSON object")
    try:
        check_hf_config(config, shape)
    except HFFormatError as exc:
        raise InitWeightsError(f"init-from {folder}: {exc}") from None
    return WeightSource(path=folder, files=_hf_files(folder), hf=True,
                        tied=bool(config.get("tie_word_embeddings", False)))


def open_source(path: str | Path, shape: ModelShape) -> WeightSource:
    """The consensus file or HF folder at `path`, checked against the run's model shape."""
    path = Path(path)
    if path.is_dir():
        return _hf_source(path, shape)
    if path.is_file():
        return _consensus_source(path)
    raise InitWeightsError(f"init-from {path}: no such file or folder")


def _open_error(source: WeightSource, file: Path, exc: Exception) -> InitWeightsError:
    return InitWeightsError(f"init-from {source.path}: {file.name} cannot be read ({exc})")


def _stored_shapes(source: WeightSource, stored: set[str]) -> dict[str, tuple[int, ...]]:
    """Shapes from the files' headers (no tensor data read) of the stored names present."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted({source.files[name] for name in stored if name in source.files}):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in stored & set(handle.keys()):
                    if source.files[name] == file:
                        shapes[name] = tuple(handle.get_slice(name).get_shape())
        except (SafetensorError, OSError) as exc:
            raise _open_error(source, file, exc) from None
    return shapes


def _label(stored: str, name: str) -> str:
    return stored if stored == name else f"{stored} (for {name})"


def check_tensors(source: WeightSource, expected: list[tuple[str, torch.Size]]) -> None:
    """Every expected noloco tensor is in the source with its shape; the first that is not,
    in parameter order, is the error."""
    shapes = _stored_shapes(source, {source.name_of(name) for name, _ in expected})
    for name, shape in expected:
        stored = source.name_of(name)
        if stored not in shapes:
            raise InitWeightsError(f"init-from {source.path}: no tensor {_label(stored, name)}")
        if shapes[stored] != tuple(shape):
            raise InitWeightsError(f"init-from {source.path}: tensor {_label(stored, name)} has shape "
                                   f"{shapes[stored]}, the run's model needs {tuple(shape)}"
                                   f"{_what_to_match(name, shapes[stored], tuple(shape))}")


VOCABULARY_TENSORS = ("embed.weight", "head.weight")
"""noloco's tensors whose first dimension is the vocabulary."""


def _what_to_match(name: str, stored: tuple[int, ...], needed: tuple[int, ...]) -> str:
    """Which settings make the run's model match the weights, for the shape error (pure)."""
    if name in VOCABULARY_TENSORS and stored[1:] == needed[1:]:
        return (f": the weights have a vocabulary of {stored[0]} tokens, the run {needed[0]}. Train on the data "
                f"they were trained on (a `prepare`d folder: --set data.source=tokens --set data.paths=DIR, "
                f"which sets model.vocab_size from its tokenizer)")
    return ": the weights are of another shape; choose the preset they were trained with (--preset)"


def read_tensors(source: WeightSource, expected: list[tuple[str, torch.Size]], n_heads: int) -> dict[str, torch.Tensor]:
    """The expected tensors, checked, read and put in noloco's layout (float32 or whatever was stored)."""
    check_tensors(source, expected)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted({source.files[source.name_of(name)] for name, _ in expected}):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name, _ in expected:
                    stored = source.name_of(name)
                    if source.files[stored] == file:
                        tensors[name] = handle.get_tensor(stored)
        except (SafetensorError, OSError) as exc:
            raise _open_error(source, file, exc) from None
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise InitWeightsError(f"init-from {source.path}: tensor {source.name_of(name)} has dtype "
                                   f"{tensor.dtype}, expected floating point")
        if source.hf:
            tensors[name] = from_hf(name, tensor, n_heads)
    return tensors


def _whole_model(cfg: Config) -> PipelineStage:
    with torch.device("meta"):  # names and shapes only
        return PipelineStage(PRESETS[cfg.model.preset], cfg.model.vocab_size, 0, 1)


def check_init_source(cfg: Config) -> None:
    """Refuse (InitWeightsError) model.init_from unless it holds exactly the run's model:
    every tensor present with its shape, none left over. Reads headers only."""
    model = _whole_model(cfg)
    source = open_source(cfg.model.init_from, model.shape)
    expected = [(name, param.shape) for name, param in model.named_parameters()]
    check_tensors(source, expected)
    used = {source.name_of(name) for name, _ in expected}
    extra = sorted(name for name in source.files if name not in used and not name.endswith(_IGNORED_HF))
    if extra:
        raise InitWeightsError(f"init-from {source.path}: tensor {extra[0]} has no place in the run's model "
                               f"(preset {cfg.model.preset})" + (f", nor {len(extra) - 1} more" if len(extra) > 1 else ""))
    if not source.hf:
        _verify_consensus(source.path)


def _verify_consensus(path: Path) -> None:
    """A consensus file's SHA-256 over all its tensors, and finite values, as `eval` checks
    them: a damaged file must not seed a run. Reads the whole file once."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
            metadata = dict(handle.metadata() or {})
        verify_contents(tensors, metadata, path)
    except (SafetensorError, OSError) as exc:
        raise InitWeightsError(f"init-from {path}: not a readable safetensors file ({exc})") from None
    except ExportError as exc:
        raise InitWeightsError(f"init-from {exc}") from None


def initial_replica(cfg: Config, stage: int, *, device: torch.device | str = "cpu",
                    model: StagedModel | None = None) -> StageReplica:
    """A replica of `stage` as a run starts it: from the run seed, or from model.init_from's
    weights when set; identical for every replica of a stage either way. With model.factory,
    `model` (the run's StagedModel, loaded once by the caller) builds it."""
    if cfg.model.factory:
        if model is None:
            raise ValueError("model.factory is set: pass the run's StagedModel (noloco_rt.model.staged)")
        return StageReplica.of_module(model.build_stage(stage).to(device), cfg)
    if not cfg.model.init_from:
        return StageReplica.create(cfg, stage, device=device)
    module = build_stage(cfg.model.preset, vocab_size=cfg.model.vocab_size, stage=stage,
                         num_stages=cfg.pipeline.stages, seed=cfg.run.seed, device=device)
    load_stage_weights(module, cfg.model.init_from)
    return StageReplica.of_module(module, cfg)


@torch.no_grad()
def load_stage_weights(module: PipelineStage, path: str | Path) -> None:
    """Copy this stage's tensors from `path` into `module`, in place."""
    source = open_source(path, module.shape)
    params = dict(module.named_parameters())
    tensors = read_tensors(source, [(name, p.shape) for name, p in params.items()], module.shape.n_heads)
    for name, param in params.items():
        param.copy_(tensors[name].to(param.device, param.dtype))
