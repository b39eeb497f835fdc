"""One checkpoint source: any path a user gives (our model_dir or a `ckpt-N` in it, a GDES run,
a TF1 checkpoint, a Hugging Face directory) -> its kind, ModelConfig and TF1-named arrays, or
one ConvertError. Object-based checkpoints are read without a model: their object graph
records each variable's Keras path, which is its TF1 name (Adam slots: `<name>/adam_m|v`)."""

import dataclasses
import os
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from electra_tf import fileio
from electra_tf.configs import ConfigError, ModelConfig, PretrainingConfig, load_config
from electra_tf.conversion import formats
from electra_tf.conversion.formats import ConvertError
from electra_tf.model.modeling import DELTA_SUFFIX, TABLES, TF1_ROOTS
from electra_tf.training import checkpoints

_GRAPH_KEY = checkpoints.GRAPH_KEY


@dataclasses.dataclass
class Source:
    """What a path holds. `kind`: "model_dir", "gdes" (tables folded as its exports write
    them), "tf1" (name-based), "hf" or "keras_hub" (a preset); `path`: the prefix read
    (for "hf" and "keras_hub" the directory);
    `config`: the arrays' model (given, else from `config_file`, else inferred; released);
    `shapes`: {TF1 name: shape} of every tensor (weights, slots, global_step)."""
    kind: str
    path: str
    config: ModelConfig
    config_file: Optional[str]
    shapes: Dict[str, Tuple[int, ...]]
    read: Callable[[str], np.ndarray]
    ignored: List[str]  # Hugging Face parameters without a TF1 name (pooler, heads)

    def arrays(self, names=None, slots: bool = True) -> Dict[str, np.ndarray]:
        """{TF1 name: array} of those of `names` (default: all) it holds; slots if `slots`."""
        return {n: self.read(n) for n in (self.shapes if names is None else names)
                if n in self.shapes and (slots or not n.endswith(formats.SLOT_SUFFIXES))}

    @property
    def has_generator(self) -> bool:
        return any(n.startswith(("generator/", "generator_predictions/")) for n in self.shapes)


def _open(path: str, what: str = ""):
    """(prefix, reader) of the checkpoint at `path` (`checkpoints.checkpoint_prefix`, an
    exported `discriminator/` included); a ConvertError naming it when unreadable."""
    try:
        prefix = checkpoints.checkpoint_prefix(path, what, ("discriminator",))
        return prefix, checkpoints.checkpoint_reader(prefix, what)
    except checkpoints.CheckpointError as e:
        raise ConvertError(str(e)) from None


def inspect_tf1(ckpt_path: str, num_heads: Optional[int] = None) -> formats.Report:
    """What a TF1 (name-based) checkpoint prefix or directory holds, against the model its
    shapes describe; a ConvertError for a shape that is not that model's."""
    reader = _open(ckpt_path)[1]
    shapes = reader.get_variable_to_shape_map()
    config, has_generator = formats.infer_model_config(shapes, num_heads)
    expected = formats.expected_shapes(config, has_generator)
    mapped, unmapped, slots = [], [], []
    for name in sorted(set(shapes) - {"global_step"}):
        if name.endswith(formats.SLOT_SUFFIXES):
            slots.append(name)
        elif name not in expected:
            unmapped.append(name)
        elif tuple(shapes[name]) != tuple(expected[name]):
            raise ConvertError(f"{name}: checkpoint shape {list(shapes[name])} != expected "
                               f"{list(expected[name])}")
        else:
            mapped.append(name)
    step = int(reader.get_tensor("global_step")) if "global_step" in shapes else None
    return formats.Report(config, has_generator, mapped, sorted(set(expected) - set(mapped)),
                          unmapped, slots, step)


def find_run_config(path: str) -> Optional[Tuple[str, PretrainingConfig]]:
    """(config.json, its config) of the pre-training run a checkpoint belongs to: looked
    for in `path` (a directory) or beside it (a prefix) and up to two directories above,
    not above a bucket. None when there is none."""
    here = path if fileio.isdir(path) and not fileio.exists(path + ".index") else \
        os.path.dirname(path)
    for _ in range(3):
        config_path = fileio.join(here, "config.json")
        if fileio.exists(config_path):
            try:
                return config_path, load_config(config_path)
            except (ConfigError, ValueError, OSError) as e:
                raise ConvertError(f"{config_path}: {e}") from None
        parent = os.path.dirname(here.rstrip("/")) or "."
        if fileio.is_remote(here) and not fileio.is_remote(parent):
            break  # above the bucket
        here = parent
    return None


def _object_names(reader) -> Dict[str, str]:
    """{TF1 name: checkpoint key} of an object-based checkpoint's variables under the TF1
    roots (weights and their slots) and its `global_step` object."""
    _, variables = checkpoints.saved_object_graph(reader.get_tensor(_GRAPH_KEY))
    out = {name: key for name, key in variables.values() if name.split("/")[0] in TF1_ROOTS}
    step = "global_step/.ATTRIBUTES/VARIABLE_VALUE"
    return dict(out, global_step=step) if reader.has_tensor(step) else out


def _fold_gdes(shapes: Dict, read: Callable) -> Tuple[Dict, Callable]:
    """A GDES run's names in the released layout: each `electra/embeddings/<table>_delta`
    becomes `electra/embeddings/<table>` = the generator's table + the delta."""
    tables = {f"electra/embeddings/{t}": f"generator/embeddings/{t}" for t in TABLES}
    deltas = {name + DELTA_SUFFIX: name for name in tables}

    def read_folded(name):
        if name in tables:
            return read(tables[name]) + read(name + DELTA_SUFFIX)
        return read(name)
    return {deltas.get(n, n): s for n, s in shapes.items()}, read_folded


def resolve(path: str, config: Optional[ModelConfig] = None, what: str = "",
            num_heads: Optional[int] = None) -> Source:
    """The Source at `path`. `config`: the model the caller already knows (else the run's
    or Hugging Face config.json, else inferred from the shapes, heads = `num_heads` or
    hidden // 64). `what` (a flag, e.g. "--init_checkpoint") leads every message."""
    if formats.is_hf_dir(path):
        try:
            hf_config, arrays, ignored = formats.import_hf_encoder(path)
        except ConvertError as e:
            raise ConvertError(f"{what}: {e}" if what else str(e)) from None
        return Source("hf", path, (config or hf_config).released(), None if config else
                      fileio.join(path, "config.json"), {n: a.shape for n, a in arrays.items()},
                      arrays.__getitem__, ignored)
    from electra_tf.conversion import keras_hub
    if keras_hub.is_preset_dir(path):  # ours (export-keras-hub) or a published one
        try:
            hub_config, arrays, _ = keras_hub.import_keras_hub(path)
        except ConvertError as e:
            raise ConvertError(f"{what}: {e}" if what else str(e)) from None
        return Source("keras_hub", path, (config or hub_config).released(), None if config
                      else fileio.join(path, "config.json"),
                      {n: a.shape for n, a in arrays.items()}, arrays.__getitem__, [])
    prefix, reader = _open(path, what)
    shapes = reader.get_variable_to_shape_map()
    kind, read = "tf1", reader.get_tensor
    if _GRAPH_KEY in shapes:
        keys = _object_names(reader)
        shapes = {n: shapes[k] for n, k in keys.items()}
        kind, read = "model_dir", lambda name: reader.get_tensor(keys[name])
        if f"electra/embeddings/word_embeddings{DELTA_SUFFIX}" in shapes:
            kind = "gdes"
            shapes, read = _fold_gdes(shapes, read)
    found = None if config else find_run_config(prefix)
    if found:
        config = found[1].model
    elif config is None:
        try:
            config, _ = formats.infer_model_config(shapes, num_heads)
        except ConvertError as e:
            raise ConvertError(f"{what + '=' if what else ''}{path}: {e}") from None
    return Source(kind, prefix, config.released(), found[0] if found else None,
                  {n: tuple(s) for n, s in shapes.items()}, read, [])
