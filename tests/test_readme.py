"""The README and the docs/ pages: their command lines use flags the CLIs define (the Cloud
TPU quickstart in docs/cloud-tpu.md included: tests/test_gcs_emulator.py runs those commands
against a Cloud Storage emulator); the README is a front page under 200 lines that links
every docs/ page and keeps the two commands .ci/run reads; relative links resolve."""

import glob
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


def _pages():
    """README.md and every docs/*.md page, as paths relative to REPO."""
    docs = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
    return ["README.md"] + docs


def _read(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return f.read()


def _doc_commands():
    """(cli, [flag names]) of every command line in the README and docs/ that runs one of
    CLIS."""
    commands = []
    for page in _pages():
        for block in re.findall(r"```bash\n(.*?)```", _read(page), re.S):
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
def test_doc_commands_use_defined_flags():
    commands = _doc_commands()
    # The quickstart's commands are among them: build, pre-train (TPU VM, slice, Node),
    # fine-tune.
    assert sum(cli == "run_pretraining.py" and "tpu" in names for cli, names in commands) >= 3
    assert any(cli == "run_finetuning.py" and "tpu" in names for cli, names in commands)
    assert any(cli == "tfrecord_builder" and "output_dir" in names for cli, names in commands)
    defined = {cli: _defined_flags(cli) for cli in CLIS}
    unknown = sorted({(cli, n) for cli, names in commands for n in names
                      if n not in defined[cli]})
    assert not unknown, f"README/docs flags the CLIs do not define: {unknown}"


def _fake_repo(monkeypatch, tmp_path, pages):
    """A repository of these {path: text} pages stands in for REPO."""
    for page, text in pages.items():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))


def test_the_check_catches_an_unknown_flag(monkeypatch, tmp_path):
    _fake_repo(monkeypatch, tmp_path, {
        "README.md": "```bash\npython run_pretraining.py --tpu=local --no_such_flag=1\n```\n",
        "docs/data.md": "```bash\npython -m tfrecord_builder \\\n  --output_dir=x --bad_flag\n```\n"})
    assert _doc_commands() == [("run_pretraining.py", ["tpu", "no_such_flag"]),
                               ("tfrecord_builder", ["output_dir", "bad_flag"])]


@pytest.mark.subprocess
def test_objectives_in_docs_and_help_are_the_specs():
    """docs/objectives.md's objective table has one row per spec, in order; --objective's
    help gives each with its description; the page is linked from the README and
    docs/architecture.md."""
    from electra_tf.objective_specs import SPECS
    page = _read(os.path.join("docs", "objectives.md"))
    table = page[page.index("| `--objective` |"):].split("\n\n")[0]
    assert re.findall(r"^\| `(\w+)`", table, re.M) == list(SPECS)
    flat = re.sub(r"\s+", "", _help("run_pretraining.py"))  # the help is wrapped
    for spec in SPECS.values():
        assert re.sub(r"\s+", "", f"{spec.name}: {spec.description}") in flat, spec.name
    assert "(objectives.md)" in _read(os.path.join("docs", "architecture.md"))
    assert "(docs/objectives.md)" in _read("README.md")


# The two commands at the top of the README, byte for byte: .ci/run runs the line under
# "**Run the tests:**", and a newcomer copies both.
MAIN_JOB = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e \".[tensorflow]\" && "
            "python run_pretraining.py && python run_finetuning.py")
TESTS = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e \".[test]\" && "
         "python -m pytest -q -n 2 --dist worksteal tests")


def _command_under(text, heading):
    """The first line of the first ```bash block after the line starting with heading."""
    rest = text[text.index("\n" + heading):]
    return re.search(r"^```bash\n(.*)$", rest, re.M).group(1)


def test_readme_is_a_front_page():
    readme = _read("README.md")
    assert len(readme.splitlines()) < 200
    assert _command_under(readme, "**Run the main job on the bundled sample**") == MAIN_JOB
    assert _command_under(readme, "**Run the tests:**") == TESTS
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]*)?\)", readme))
    pages = {p for p in _pages() if p != "README.md"}
    assert pages and not pages - linked, f"docs pages the README does not link: {pages - linked}"


def _anchor(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]|\[|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page):
    text = re.sub(r"```.*?```", "", _read(page), flags=re.S)
    return {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def _broken_links():
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", _read(page), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(REPO, dest)):
                broken.append((page, target))
            elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
                broken.append((page, target))
    return broken


def test_relative_links_resolve():
    assert not _broken_links()


def test_code_blocks_are_closed():
    """Every ``` fence that opens a block has its closing fence (a lost one would swallow
    the page's text into a command block, or a command into the text)."""
    for page in _pages():
        fences = re.findall(r"^```(\w*)$", _read(page), re.M)
        assert len(fences) % 2 == 0 and not any(fences[1::2]), page


def test_the_link_check_catches_a_missing_file_and_anchor(monkeypatch, tmp_path):
    _fake_repo(monkeypatch, tmp_path, {
        "README.md": "[a](docs/a.md#two-words) [b](docs/a.md#gone) [c](docs/missing.md) "
                     "[d](https://x.org)\n",
        "docs/a.md": "# Two words\n\n```bash\n# not a heading\n```\n"
                     "[up](../README.md) [self](#not-a-heading)\n"})
    assert sorted(_broken_links()) == [("README.md", "docs/a.md#gone"),
                                       ("README.md", "docs/missing.md"),
                                       ("docs/a.md", "#not-a-heading")]


def test_the_tier_and_leg_expressions_are_the_ones_the_docs_and_ci_use():
    """The fast unit tier and the other legs' selection: conftest's expressions are the
    ones the README, docs/testing.md and docs/install.md quote, and .ci/run reads the legs'
    from conftest."""
    import conftest
    assert f'`-m "{conftest.UNIT_TIER}"`' in _read("README.md")
    assert f'-m "{conftest.UNIT_TIER}" tests' in _read("docs/testing.md")
    assert f'`-m "{conftest.OTHER_LEGS}"`' in _read("docs/testing.md")
    assert f'-m "{conftest.OTHER_LEGS}" tests' in _read("docs/install.md")
    assert "conftest.OTHER_LEGS" in _read(os.path.join(".ci", "run"))
    assert conftest.UNIT_TIER == "not (subprocess or e2e or slow)"
    assert conftest.OTHER_LEGS == "(every_leg or not (subprocess or e2e)) and not jax"
    assert f'`-m "{conftest.JAX_LEG}"` (`conftest.JAX_LEG`)' in _read("docs/testing.md")
    assert "conftest.JAX_LEG" in _read(os.path.join(".ci", "run"))
    assert conftest.JAX_LEG == "jax and every_leg"

if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
