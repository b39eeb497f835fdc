"""Human-rated movie-review snippets as a polarity fine-tuning task (2,000 dev examples).

The 10,605 Rotten Tomatoes snippets (Pang & Lee's movie reviews) of Hutto & Gilbert
(2014), "VADER", ICWSM-14, each with the mean sentiment rating (-4..4) of >= 20 human
raters, ship in the PyPI sdist of vaderSentiment 3.3.2 (MIT). This script gets that sdist
(pip, or --sdist), checks its sha256, reads
additional_resources/hutto_ICWSM_2014.tar.gz!movieReviewSnippets_GroundTruth.txt in
memory, drops the snippets rated exactly 0, labels the rest 1 (mean > 0) or 0, puts the
--dev_size IDs with the smallest sha256 in dev and writes OUT/polarity/{train,dev}.tsv
(the bundled polarity set's layout) and SOURCE.json, last.

`--source=tweets` writes the same layout from the sdist's 4,200 rated tweets
(tweets_GroundTruth.txt; 1,000 dev examples by default): a second sentiment task, of
another register, from the same package and raters' protocol.

    python experiments/movie_snippets.py --out_dir=/tmp/movie_snippets
    python experiments/movie_snippets.py --source=tweets --out_dir=/tmp/tweets
    python run_finetuning.py --task=polarity --data_dir=/tmp/movie_snippets
"""

import argparse
import hashlib
import io
import math
import os
import subprocess
import sys
import tarfile
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)
import tensorflow as tf  # noqa: E402

from electra_tf import fileio  # noqa: E402

PACKAGE = "vaderSentiment==3.3.2"
SDIST_NAME = "vaderSentiment-3.3.2.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
DEFAULT_DEV_SIZE = 2000


class Source(NamedTuple):
    member: str  # the ground-truth file in the tarball INNER
    dev_size: int  # the default number of dev examples
    task: str
    text: str


SOURCES = {
    "movies": Source(MEMBER, DEFAULT_DEV_SIZE,
                     "movie review snippets, sentence polarity (1: mean rating > 0, 0: < 0)",
                     "Rotten Tomatoes snippets from the movie reviews of Pang & Lee (2004)"),
    "tweets": Source("hutto_ICWSM_2014/tweets_GroundTruth.txt", 1000,
                     "tweets, polarity (1: mean rating > 0, 0: < 0)",
                     "tweets collected and rated by Hutto & Gilbert (2014)"),
}
TASK_DIR = "polarity"  # run_finetuning.py --task=polarity reads DATA_DIR/polarity
MARKER = "SOURCE.json"  # written last: its presence means the task is complete
HEADER = "sentence\tlabel\n"
_FILE_ERRORS = (OSError, tf.errors.OpError)


class ExperimentError(Exception):
    """A bad flag, file or download; the message is one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ExperimentError(message)


class Example(NamedTuple):
    id: int
    rating: float  # mean human rating, -4..4
    text: str

    @property
    def label(self) -> int:
        return 1 if self.rating > 0 else 0


def parse_ground_truth(text: str, name: str) -> List[Example]:
    """Every line `ID<TAB>MEAN-RATING<TAB>TEXT` of `text` (zeros included), the text
    collapsed to single spaces. A malformed line is an error naming `name:line`."""
    lines = text.lstrip("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()  # the file's final newline
    examples, seen = [], {}
    for number, line in enumerate(lines, 1):
        fields = line.rstrip("\r").split("\t")
        where = f"{name}:{number}"
        if len(fields) != 3:
            raise ExperimentError(f"{where}: expected 3 tab-separated fields (ID, mean "
                                  f"rating, text), found {len(fields)}")
        raw_id, raw_rating, snippet = fields[0].strip(), fields[1], " ".join(fields[2].split())
        if not (raw_id.isascii() and raw_id.isdigit()):
            raise ExperimentError(f"{where}: ID {raw_id!r} is not a number")
        try:
            rating = float(raw_rating)
        except ValueError:
            rating = math.nan
        if not math.isfinite(rating):
            raise ExperimentError(f"{where}: rating {raw_rating!r} is not a number")
        if not snippet or int(raw_id) in seen:
            raise ExperimentError(f"{where}: " + (f"ID {int(raw_id)} is also on line "
                                  f"{seen[int(raw_id)]}" if snippet else "empty text"))
        seen[int(raw_id)] = number
        examples.append(Example(int(raw_id), rating, snippet))
    return examples


def split(examples: Sequence[Example], dev_size: int) -> Tuple[List[Example], List[Example]]:
    """(train, dev): dev is the `dev_size` examples with the smallest sha256 of their
    decimal ID (independent of the order of the lines); both sorted by ID."""
    if not 0 < dev_size < len(examples):
        raise ExperimentError(f"--dev_size={dev_size}: must be between 1 and "
                              f"{len(examples) - 1} (there are {len(examples)} examples)")
    ranked = sorted(examples, key=lambda e: (hashlib.sha256(b"%d" % e.id).digest(), e.id))
    return (sorted(ranked[dev_size:], key=lambda e: e.id),
            sorted(ranked[:dev_size], key=lambda e: e.id))


def to_tsv(examples: Sequence[Example]) -> str:
    return HEADER + "".join(f"{e.text}\t{e.label}\n" for e in examples)


def counts(examples: Sequence[Example]) -> Dict[str, int]:
    positive = sum(e.label for e in examples)
    return {"examples": len(examples), "positive": positive,
            "negative": len(examples) - positive}


def write_task(train: Sequence[Example], dev: Sequence[Example], out_dir: str,
               source: Optional[dict] = None) -> dict:
    """OUT/polarity/{train,dev}.tsv, then SOURCE.json (`source` plus the counts) last;
    an old SOURCE.json is removed first, so that it never vouches for new files."""
    task_dir = fileio.join(out_dir, TASK_DIR)
    marker = dict(source or {}, counts={"train": counts(train), "dev": counts(dev)})
    path = task_dir
    try:
        fileio.makedirs(task_dir)
        fileio.remove(fileio.join(task_dir, MARKER))
        for name, examples in (("train.tsv", train), ("dev.tsv", dev)):
            path = fileio.join(task_dir, name)
            fileio.write_atomic(path, to_tsv(examples), sync=True)
        path = fileio.join(task_dir, MARKER)
        fileio.write_json_atomic(path, marker, sync=True)
    except _FILE_ERRORS as e:
        raise ExperimentError(f"cannot write {path}: {fileio.error_reason(e)}") from None
    return marker


def read_sdist(path: str, sha256: str) -> bytes:
    try:
        data = fileio.read_bytes(path)
    except _FILE_ERRORS as e:
        raise ExperimentError(f"cannot read {path}: {fileio.error_reason(e)}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise ExperimentError(f"{path}: sha256 {actual} does not match the expected {sha256}")
    return data


def download(directory: str) -> str:
    """The sdist, fetched from PyPI into the local `directory` by pip."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", PACKAGE, "-d", directory]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [l for l in (done.stderr + done.stdout).splitlines() if l.strip()]
    lines = [l for l in lines if l.startswith("ERROR")] or lines
    path = os.path.join(directory, SDIST_NAME)  # local: a staging directory
    if done.returncode != 0 or not fileio.exists(path):
        raise ExperimentError(f"pip download {PACKAGE} failed (exit {done.returncode})"
                              + (f": {lines[-1]}" if lines else ""))
    return path


def ground_truth_text(sdist: bytes, name: str, member: str = MEMBER) -> str:
    """`member` of the tarball INNER inside the sdist, decoded; all in memory."""
    try:
        with tarfile.open(fileobj=io.BytesIO(sdist)) as outer:
            inner = outer.extractfile(INNER).read()
        with tarfile.open(fileobj=io.BytesIO(inner)) as tar:
            data = tar.extractfile(member).read()
    except (tarfile.TarError, KeyError, AttributeError, OSError, EOFError) as e:
        raise ExperimentError(f"{name}: no readable {INNER}!{member} "
                              f"({type(e).__name__})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ExperimentError(f"{member}:{line}: not valid UTF-8") from None


def up_to_date(task_dir: str, sha256: str, dev_size: int, member: str = MEMBER) -> bool:
    try:
        marker = fileio.read_json(fileio.join(task_dir, MARKER))
        files = all(fileio.exists(fileio.join(task_dir, f)) for f in ("train.tsv", "dev.tsv"))
    except (*_FILE_ERRORS, ValueError):
        return False  # missing or torn: write it again
    return (files and marker.get("sha256") == sha256 and marker.get("dev_size") == dev_size
            and marker.get("member", MEMBER) == member)


def prepare(out_dir: str, sdist_path: Optional[str] = None,
            dev_size: Optional[int] = None, sha256: Optional[str] = None,
            source: str = "movies") -> Optional[dict]:
    """Writes the task of `source` (SOURCES) to OUT/polarity; None when it is up to date
    already. `sha256`: what the sdist must hash to (default SDIST_SHA256); `dev_size`:
    default the source's."""
    sha256 = sha256 or SDIST_SHA256
    if source not in SOURCES:
        raise ExperimentError(f"--source={source}: one of {', '.join(SOURCES)}")
    member = SOURCES[source].member
    dev_size = SOURCES[source].dev_size if dev_size is None else dev_size
    task_dir = fileio.join(out_dir, TASK_DIR)
    if up_to_date(task_dir, sha256, dev_size, member):
        print(f"movie_snippets: {task_dir} is up to date (sha256 {sha256[:12]}, "
              f"dev_size {dev_size})")
        return None
    if sdist_path is None:
        with fileio.local_staging_dir("movie-snippets-") as tmp:
            sdist = read_sdist(download(tmp), sha256)
    else:
        sdist = read_sdist(sdist_path, sha256)
    rows = parse_ground_truth(ground_truth_text(sdist, sdist_path or SDIST_NAME, member),
                              member)
    examples = [e for e in rows if e.rating != 0]  # rated neither way: ambiguous
    train, dev = split(examples, dev_size)
    marker = write_task(train, dev, out_dir, {
        "task": SOURCES[source].task,
        "member": member,
        "source": f"{member} in {INNER} of the PyPI sdist {SDIST_NAME} ({PACKAGE})",
        "url": "https://pypi.org/project/vaderSentiment/3.3.2/",
        "sha256": sha256,
        "licence": "MIT (vaderSentiment, Copyright (c) 2016 C.J. Hutto)",
        "text": SOURCES[source].text,
        "citation": "Hutto, C.J. & Gilbert, E.E. (2014). VADER: A Parsimonious Rule-based "
                    "Model for Sentiment Analysis of Social Media Text. ICWSM-14.",
        "dev_size": dev_size,
        "split": "dev: the dev_size IDs with the smallest sha256(decimal ID); both by ID",
        "lines": len(rows),
        "dropped_zero_rating": len(rows) - len(examples)})
    balance = ", ".join(f"{name} {c['examples']} ({c['positive']} positive, "
                        f"{c['negative']} negative)" for name, c in marker["counts"].items())
    print(f"movie_snippets: wrote {task_dir}: {balance}; {len(rows) - len(examples)} of "
          f"{len(rows)} {'snippets' if source == 'movies' else source} rated 0 dropped")
    return marker


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(prog="movie_snippets.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out_dir", required=True, help="Writes OUT_DIR/polarity (any "
                   "filesystem: gs://, ram://); use it as run_finetuning.py --data_dir.")
    p.add_argument("--sdist", default=None, help=f"A local copy of {SDIST_NAME} (default: "
                   f"pip download {PACKAGE}).")
    p.add_argument("--source", default="movies", choices=sorted(SOURCES),
                   help="movies: the 10,605 rated movie-review snippets (the fine-tuning "
                   "demo's task); tweets: the 4,200 rated tweets.")
    p.add_argument("--dev_size", type=int, default=None,
                   help="Dev examples (default: movies 2000, tweets 1000).")
    return p.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    try:
        args = parse_args(argv)
        prepare(args.out_dir, args.sdist, args.dev_size, source=args.source)
    except ExperimentError as e:
        print(f"movie_snippets: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
