"""The package's layers point down (docs/architecture.md, "Layers"): every import in
electra_tf/ and tfrecord_builder/, top-level and inside functions, read from the source."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lowest first. A module may import its own package (the same entry) and any lower layer;
# two packages of one layer never import each other. "electra_tf" is what no longer entry
# claims: the package root and its leaf modules (compat, fileio, rng, objective_specs).
LAYERS = [
    ["electra_tf"],
    ["electra_tf.configs"],
    ["electra_tf.model", "electra_tf.text", "electra_tf.data"],
    ["electra_tf.training"],  # what both runtimes share: the contract, update, loop, ...
    ["electra_tf.training.tf_runtime", "electra_tf.training.jax_runtime"],
    ["electra_tf.training.backends"],  # the one place that knows both runtimes
    ["electra_tf.conversion"],
    ["electra_tf.pretraining", "electra_tf.finetune"],
    ["tfrecord_builder"],
]
# Command lines sit above every layer: they may import anything, and nothing imports them
# (`python -m` paths users type stay where they are).
CLIS = {"electra_tf.check_install", "electra_tf.conversion.convert",
        "electra_tf.conversion.saved_model_cli", "electra_tf.finetune.cli",
        "tfrecord_builder.cli", "tfrecord_builder.__main__"}


def owner(module: str):
    """(layer index, the LAYERS entry) of a module of ours; None for a third-party one."""
    best = None
    for i, entries in enumerate(LAYERS):
        for entry in entries:
            if module == entry or module.startswith(entry + "."):
                if best is None or len(entry) > len(best[1]):
                    best = (i, entry)
    return best


def imports(source: str, module: str, modules=()):
    """Every module `source` imports, with its line: absolute and relative, at any depth.
    `modules`: names that are modules besides the files on disk."""
    package = module.rsplit(".", 1)[0]  # (no package __init__ of ours imports relatively)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"  # `from pkg import submodule` names the module
                yield node.lineno, full if owner(full) and (full in modules or _is_module(full)) \
                    else base


def _is_module(name: str) -> bool:
    path = os.path.join(REPO, *name.split("."))
    return os.path.isdir(path) or os.path.isfile(path + ".py")


def violations(sources):
    """`sources`: {module name: source text} -> one line per import that points up or
    sideways, or into a command line."""
    found = []
    for module, source in sorted(sources.items()):
        mine = owner(module)
        if mine is None:
            continue
        for line, target in sorted(set(imports(source, module))):
            theirs = owner(target)
            if theirs is None:
                continue
            where = f"{module}:{line} imports {target}"
            if module in CLIS or (theirs[1] == mine[1] and target not in CLIS):
                continue
            if target in CLIS:
                found.append(f"{where}, a command line")
            elif theirs[0] > mine[0]:
                found.append(f"{where}, a higher layer ({theirs[1]} above {mine[1]})")
            elif theirs[0] == mine[0]:
                found.append(f"{where}, a sibling of the same layer")
    return found


def package_sources():
    sources = {}
    for package in ("electra_tf", "tfrecord_builder"):
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    module = module[:-len(".__init__")] if module.endswith(".__init__") \
                        else module
                    with open(path, encoding="utf-8") as f:
                        sources[module] = f.read()
    return sources


def test_no_module_imports_a_higher_layer_or_a_sibling():
    sources = package_sources()
    assert len(sources) >= 60  # every module was read
    assert violations(sources) == []


def test_every_module_has_a_layer():
    assert [m for m in package_sources() if owner(m) is None] == []


@pytest.mark.parametrize("module, source, problem", [
    ("electra_tf.conversion.formats", "from electra_tf.pretraining.trainer import X",
     "a higher layer (electra_tf.pretraining above electra_tf.conversion)"),
    ("electra_tf.pretraining.score", "def f():\n    from electra_tf.finetune import text",
     "a sibling of the same layer"),
    ("electra_tf.model.modeling", "import electra_tf.text", "a sibling of the same layer"),
    ("electra_tf.text", "from tfrecord_builder import BuildError",
     "a higher layer (tfrecord_builder above electra_tf.text)"),
    ("electra_tf.finetune.model", "from electra_tf.finetune import cli", "a command line"),
    ("electra_tf.training.loop", "from ..pretraining import flops",
     "a higher layer (electra_tf.pretraining above electra_tf.training)"),
])
def test_an_upward_import_is_named_with_its_line(module, source, problem):
    found = violations({module: source})
    assert len(found) == 1 and found[0].endswith(problem) and f"{module}:" in found[0]


def test_imports_down_and_within_a_package_are_allowed():
    assert violations({
        "electra_tf.finetune.trainer": "from electra_tf.finetune import model\n"
                                       "from electra_tf.training import loop\n"
                                       "from electra_tf import text, fileio\nimport numpy",
        "tfrecord_builder.build": "from electra_tf.data import manifest",
        "electra_tf.conversion.convert": "from electra_tf.pretraining import model_dir",
    }) == []


def import_cycles(sources):
    """Every cycle of imports among our modules (the layers above forbid one across
    packages; this finds one inside a package): strongly connected components of the import
    graph (Tarjan's algorithm), each a sorted list of its modules. A module's import of a
    package it lies in is no edge: Python has run that package's __init__ before it."""
    graph = {m: sorted({t for _, t in imports(s, m, sources)
                        if t in sources and t != m and not m.startswith(t + ".")})
             for m, s in sources.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_two_modules_import_each_other_even_through_others():
    assert import_cycles(package_sources()) == []


def test_a_cycle_inside_a_package_is_found():
    assert import_cycles({
        "electra_tf.finetune.trainer": "from electra_tf.finetune import jax_trainer",
        "electra_tf.finetune.jax_trainer": "def f():\n    from electra_tf.finetune import tasks",
        "electra_tf.finetune.tasks": "from . import trainer",
        "electra_tf.finetune.model": "from electra_tf.finetune import tasks",
    }) == [["electra_tf.finetune.jax_trainer", "electra_tf.finetune.tasks",
            "electra_tf.finetune.trainer"]]
