"""The README's command lines use flags the CLIs define (the Cloud TPU quickstart included:
tests/test_gcs_emulator.py runs those commands against a Cloud Storage emulator)."""

import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIS = {"run_pretraining.py": ["run_pretraining.py"],
        "run_finetuning.py": ["run_finetuning.py"],
        "tfrecord_builder": ["-m", "tfrecord_builder"]}


def _tokens(text):
    lexer = shlex.shlex(text.replace("$", "X"), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def _commands_in(words):
    found = []
    for i, word in enumerate(words):
        if " " in word:  # a quoted command line (e.g. gcloud ... --command="...")
            found += _commands_in(_tokens(word.split("=", 1)[-1]))
        for cli, target in ((c, args[-1]) for c, args in CLIS.items()):
            if word == target:
                names = []
                for w in words[i + 1:]:
                    if w in ("&&", ";", "|", "||", "&"):
                        break
                    if w.startswith("--"):
                        names.append(w[2:].split("=")[0])
                found.append((cli, names))
    return found


def _readme_commands():
    """(cli, [flag names]) of every README command line that runs one of CLIS."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        commands += _commands_in(_tokens(block.replace("\\\n", " ")))
    return commands


def _help(cli):
    proc = subprocess.run([sys.executable, *CLIS[cli], "--helpfull"], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert "helpfull" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def _defined_flags(cli):
    return set(re.findall(r"^\s+--(?:\[no\])?([a-z_0-9]+)", _help(cli), re.M))


@pytest.mark.subprocess
def test_readme_commands_use_defined_flags():
    commands = _readme_commands()
    # The quickstart's commands are among them: build, pre-train (TPU VM, slice, Node),
    # fine-tune.
    assert sum(cli == "run_pretraining.py" and "tpu" in names for cli, names in commands) >= 3
    assert any(cli == "run_finetuning.py" and "tpu" in names for cli, names in commands)
    assert any(cli == "tfrecord_builder" and "output_dir" in names for cli, names in commands)
    defined = {cli: _defined_flags(cli) for cli in CLIS}
    unknown = sorted({(cli, n) for cli, names in commands for n in names
                      if n not in defined[cli]})
    assert not unknown, f"README flags the CLIs do not define: {unknown}"


def test_the_check_catches_an_unknown_flag(monkeypatch, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("```bash\npython run_pretraining.py --tpu=local --no_such_flag=1\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    assert _readme_commands() == [("run_pretraining.py", ["tpu", "no_such_flag"])]


@pytest.mark.subprocess
def test_objectives_in_readme_and_help_are_the_specs():
    """The README's objective table has one row per spec, in order; --objective's help
    gives each with its description; docs/objectives.md is linked where the tables are."""
    from electra_tf.objective_specs import SPECS
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    table = readme[readme.index("| `--objective` |"):].split("\n\n")[0]
    assert re.findall(r"^\| `(\w+)`", table, re.M) == list(SPECS)
    flat = re.sub(r"\s+", "", _help("run_pretraining.py"))  # the help is wrapped
    for spec in SPECS.values():
        assert re.sub(r"\s+", "", f"{spec.name}: {spec.description}") in flat, spec.name
    with open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8") as f:
        assert "(objectives.md)" in f.read()
    assert "(docs/objectives.md)" in readme


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
