"""Tokenization, the one owner: vocabularies (on any filesystem, checked for ELECTRA's
special tokens), BERT's text normalisation, the builder's batch `Tokenizer` and the in-graph
`TextEncoder` (tokenize and pack BERT inputs) of fine-tuning, exports and scoring. Both use
`normalize` and the same tf-text tokenizers, so the builder and fine-tuning give the same
ids. Without TensorFlow the same ids come from `normalize_text` (its twin in Python), the
`tokenizers` package's WordPiece and the `sentencepiece` package: `Tokenizer` and
`HostTextEncoder`. A leaf module: it imports only `electra_tf.fileio`; TensorFlow and
tf-text are imported where used (`TextEncoder`, `normalize`).
"""

import dataclasses
import functools
import hashlib
import os
import re
import sys
import unicodedata
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import sentencepiece as spm

from electra_tf import fileio

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
KIND_FLAGS = {"wordpiece": "--vocab_file", "sentencepiece": "--spm_model"}  # kind -> its flag


class VocabError(ValueError):
    """A vocabulary or SentencePiece model that cannot be read or lacks a special token;
    the message is one line naming the flag and the file."""


def read_vocab_bytes(path: str, flag: str) -> bytes:
    """The bytes of a vocabulary file or SentencePiece model on any filesystem; VocabError
    names `flag` and the path."""
    try:
        return fileio.read_bytes(path)
    except _fs_errors() as e:
        raise VocabError(f"{flag}: cannot read {path}: {fileio.error_reason(e)}") from None


def read_wordpiece_vocab(path: str, data: Optional[bytes] = None) -> List[str]:
    """One token per line, id = line number (the BERT vocab.txt layout). `data`: the
    file's bytes when they are at hand (then `path` only names it in errors)."""
    raw = read_vocab_bytes(path, "--vocab_file") if data is None else data
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise VocabError(f"--vocab_file: {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()
    tokens = [t.rstrip("\r") for t in tokens]
    if not tokens:
        raise VocabError(f"--vocab_file: {path} is empty")
    return tokens


def _fs_errors() -> tuple:
    """What a file read raises: OSError, and TensorFlow's OpError where TensorFlow's
    filesystem layer may be in use (TensorFlow loaded)."""
    tf = sys.modules.get("tensorflow")
    errors = getattr(tf, "errors", None)
    return (OSError,) if errors is None else (OSError, errors.OpError)


def _tensorflow():
    """(tensorflow, tensorflow_text), imported on first use."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import tensorflow_text as tf_text  # pylint: disable=import-outside-toplevel
    return tf, tf_text


def wordpiece_tokenizer(vocab: List[str]):
    """WordPiece over `normalize`d text: the tokenizer only splits and looks up (a
    tf_text.FastBertTokenizer)."""
    tf, tf_text = _tensorflow()
    return tf_text.FastBertTokenizer(vocab, suffix_indicator="##", max_bytes_per_word=100,
                                     token_out_type=tf.int32, unknown_token="[UNK]",
                                     lower_case_nfd_strip_accents=False)


def _special_ids(vocab: List[str], path: str, flag: str) -> Dict[str, int]:
    lookup = {}
    for i, token in enumerate(vocab):
        lookup.setdefault(token, i)
    missing = [t for t in SPECIAL_TOKENS if t not in lookup]
    if missing:
        raise VocabError(f"{flag}: {path} lacks the special token(s) {', '.join(missing)}")
    return {t: lookup[t] for t in SPECIAL_TOKENS}


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """What the manifest records of a vocabulary."""
    kind: str  # "wordpiece" or "sentencepiece"
    path: str
    vocab_size: int
    sha256: str
    special_ids: Dict[str, int]
    do_lower_case: bool

    def to_json(self) -> dict:
        return {"kind": self.kind, "vocab_file": os.path.basename(self.path),
                "vocab_size": self.vocab_size, "vocab_sha256": self.sha256,
                "do_lower_case": self.do_lower_case, "special_token_ids": self.special_ids}


def read_spm_model(path: str, data: Optional[bytes] = None):
    """(model bytes, SentencePieceProcessor) of the model at `path` (or in `data`)."""
    model = read_vocab_bytes(path, "--spm_model") if data is None else data
    try:
        return model, spm.SentencePieceProcessor(model_proto=model)
    except RuntimeError as e:
        raise VocabError(f"--spm_model: {path} is not a SentencePiece model "
                         f"({str(e).splitlines()[0]})") from None


def read_vocab(kind: str, path: str, data: Optional[bytes] = None) -> Tuple[List[str], bytes]:
    """(tokens by id, the file's bytes) of a WordPiece vocab or a SentencePiece model
    (`kind`); `data`: the bytes when at hand."""
    data = read_vocab_bytes(path, KIND_FLAGS[kind]) if data is None else data
    if kind == "sentencepiece":
        proc = read_spm_model(path, data)[1]
        return [proc.id_to_piece(i) for i in range(proc.get_piece_size())], data
    return read_wordpiece_vocab(path, data), data


def tf_tokenizer(kind: str, vocab: List[str], data: bytes):
    """The tf-text tokenizer of a vocabulary `read_vocab` read."""
    tf, tf_text = _tensorflow()
    if kind == "sentencepiece":
        return tf_text.SentencepieceTokenizer(model=data, out_type=tf.int32)
    return wordpiece_tokenizer(vocab)


def vocab_info(vocab_file: Optional[str] = None, spm_model: Optional[str] = None,
               do_lower_case: bool = True) -> VocabInfo:
    """Reads and checks a WordPiece vocab or SentencePiece model."""
    if not (spm_model or vocab_file):
        raise VocabError("give --vocab_file (WordPiece) or --spm_model (SentencePiece)")
    kind, path = ("sentencepiece", spm_model) if spm_model else ("wordpiece", vocab_file)
    tokens, data = read_vocab(kind, path)
    return VocabInfo(kind, path, len(tokens), hashlib.sha256(data).hexdigest(),
                     _special_ids(tokens, path, KIND_FLAGS[kind]), do_lower_case)


def read_vocab_data(info: VocabInfo) -> bytes:
    """The bytes of `info`'s vocabulary, checked against its sha256. Worker processes get
    these rather than the path: they need not see the file (a ram:// file is private to
    its process; a Beam worker may not see the launcher's disk)."""
    flag = KIND_FLAGS[info.kind]
    data = read_vocab_bytes(info.path, flag)
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise VocabError(f"{flag}: {info.path} changed while it was read; run again")
    return data


# --------------------------------------------------------------------------- a run's vocabulary

# What a pre-training run directory carries of its tokenizer (written when the run starts,
# from its data's manifest): the vocabulary file (vocab.txt, or spm.model for SentencePiece)
# and VOCAB_JSON, the manifest's record of it (kind, size, sha256, casing, special ids, the
# build's name for the file).
VOCAB_JSON = "vocab.json"
RUN_VOCAB_FILES = {"wordpiece": "vocab.txt", "sentencepiece": "spm.model"}


@dataclasses.dataclass(frozen=True)
class RunVocab:
    """A vocabulary found with a checkpoint: its file, kind and casing."""
    path: str
    kind: str  # "wordpiece" or "sentencepiece"
    do_lower_case: bool

    def flags(self) -> Dict:
        """The TextEncoder / fine-tuning arguments it stands for."""
        return ({"vocab_file": None, "spm_model": self.path} if self.kind == "sentencepiece"
                else {"vocab_file": self.path, "spm_model": None}) | {
                    "do_lower_case": self.do_lower_case}


def _manifest_vocab_bytes(record: dict, data_dir: str, search: Sequence[str]) -> Optional[bytes]:
    """The bytes of the manifest's vocabulary: the builder's copy in the build directory
    (vocab.txt or spm.model), else a file of the manifest's name for it in the build
    directory or a `search` directory, when its sha256 is the manifest's."""
    name = record.get("vocab_file")
    if not name:
        return None
    copy = RUN_VOCAB_FILES.get(record.get("kind"), "vocab.txt")
    places = [(data_dir, copy)] + [(folder, name) for folder in (data_dir, *search)]
    for folder, file_name in places:
        path = fileio.join(folder, file_name)
        if fileio.isfile(path):
            data = read_vocab_bytes(path, KIND_FLAGS.get(record.get("kind"), "--vocab_file"))
            if hashlib.sha256(data).hexdigest() == record.get("vocab_sha256"):
                return data
    return None


def record_run_vocab(model_dir: str, manifest: Optional[dict], data_dir: str,
                     search: Sequence[str] = ()) -> Optional[str]:
    """Writes the training data's vocabulary and VOCAB_JSON into `model_dir` (the chief, at
    the run's start; an existing pair is kept if it is the same vocabulary, replaced with
    a warning if not). -> None, or why nothing was written (no manifest, the file not
    found beside the data or in `search`)."""
    if not manifest or "tokenizer" not in manifest:
        return "the training data has no manifest.json naming its vocabulary"
    built = manifest["tokenizer"]
    data = _manifest_vocab_bytes(built, data_dir, search)
    if data is None:
        return (f"{built.get('vocab_file')} (sha256 {str(built.get('vocab_sha256'))[:12]}"
                f"...) is neither in {data_dir} nor in {', '.join(search) or 'no other place'}")
    # Under the conventional name (TF1 and Hugging Face directories hold a vocab.txt).
    record = dict(built, vocab_file=RUN_VOCAB_FILES.get(built.get("kind"), "vocab.txt"),
                  built_from=built.get("vocab_file"))
    json_path = fileio.join(model_dir, VOCAB_JSON)
    if fileio.exists(json_path) and fileio.read_json(json_path) == record:
        return None
    fileio.write_atomic(fileio.join(model_dir, record["vocab_file"]), data)
    fileio.write_json_atomic(json_path, record)  # last: it vouches for the file
    return None


def find_run_vocab(path: str, levels: int = 3) -> Optional[RunVocab]:
    """The vocabulary recorded with the checkpoint at `path` (a run directory, a
    `ckpt-N` or `discriminator/model.ckpt` in one; up to `levels` - 1 directories above):
    VOCAB_JSON and its file, or a keras-hub preset's or Hugging Face directory's
    vocabulary. None when there is none."""
    here = path if fileio.isdir(path) else os.path.dirname(path)
    for _ in range(levels):
        record = fileio.join(here, VOCAB_JSON)
        if fileio.isfile(record):
            info = fileio.read_json(record)
            vocab = fileio.join(here, info.get("vocab_file", ""))
            if fileio.isfile(vocab):
                return RunVocab(vocab, info.get("kind", "wordpiece"),
                                bool(info.get("do_lower_case", True)))
        hub_vocab = fileio.join(here, "assets", "tokenizer", "vocabulary.txt")
        hub_tokenizer = fileio.join(here, "tokenizer.json")
        if fileio.isfile(hub_vocab) and fileio.isfile(hub_tokenizer):  # keras-hub preset
            config = fileio.read_json(hub_tokenizer).get("config", {})
            return RunVocab(hub_vocab, "wordpiece", bool(config.get("lowercase", False)))
        hf_config = fileio.join(here, "tokenizer_config.json")
        if fileio.isfile(fileio.join(here, "vocab.txt")) and fileio.isfile(hf_config):
            lower = fileio.read_json(hf_config).get("do_lower_case", True)
            return RunVocab(fileio.join(here, "vocab.txt"), "wordpiece", bool(lower))
        parent = os.path.dirname(here.rstrip("/")) or "."
        if parent == here or (fileio.is_remote(here) and not fileio.is_remote(parent)):
            break
        here = parent
    return None


# Category C except tab/newline/CR, and U+FFFD (what invalid UTF-8 decodes to): the
# characters BERT's normaliser deletes. Unicode data is TensorFlow's (RE2, ICU), not
# Python's: RE2's \pC has no Cn, so unassigned code points stay (reference BERT drops
# those of its Python's Unicode version), and letters newer than ICU's data keep their case.
_JUNK = r"[^\PC\t\n\r]|\x{FFFD}"


def normalize(strings, lower: bool, strip_accents: bool = True,
              clean: bool = True):
    """BERT's text normalisation of a string tensor, in-graph; never fails on bad bytes.
    clean: invalid UTF-8 becomes U+FFFD, dropped with every control character. lower: ICU's
    full lower-casing (as str.lower); with strip_accents also NFD without marks (Mn).
    Not FastBertTokenizer's: it splits at control characters and case-folds with NFKC ('²'
    -> '2', final 'ς' -> 'σ'), departing from reference BERT on ~0.2% of Wikipedia lines.
    `normalize_text` is its twin in Python.
    """
    tf, tf_text = _tensorflow()
    strings = tf.convert_to_tensor(strings, tf.string)
    if clean:
        strings = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace",
                                               replacement_char=0xFFFD)
        strings = tf.strings.regex_replace(strings, _JUNK, "")
    if lower:
        strings = tf.strings.lower(strings, encoding="utf-8")
        if strip_accents:
            strings = tf_text.normalize_utf8(strings, "NFD")
            strings = tf.strings.regex_replace(strings, r"\p{Mn}", "")
    return strings


# ------------------------------------------------------------------ the same without TensorFlow

# Where TensorFlow's Unicode data (RE2's categories, its ICU's case mapping and NFD)
# differs from Python 3.11's (Unicode 14), found code point by code point against
# TensorFlow 2.21 (tests/test_text_notf.py repeats the comparison where it is installed).
_TF_JUNK_EXTRA = "\U00013439-\U0001343f"  # format controls (Cf) of Unicode 15
_TF_UNLOWERED = ("\u2c2f\ua7c0\ua7d0\ua7d6\ua7d8\U00010570-\U0001057a\U0001057c-\U0001058a"
                 "\U0001058c-\U00010592\U00010594\U00010595")  # capitals ICU does not lower
_TF_MN_EXTRA = ("\u0ece\U00010efd-\U00010eff\U00011241\U00011f00\U00011f01"
                "\U00011f36-\U00011f3a\U00011f40\U00011f42\U00013440\U00013447-\U00013455"
                "\U0001e08f\U0001e4ec-\U0001e4ef")  # nonspacing marks (Mn) of Unicode 15
_TF_NFD = {  # decompositions of Unicode 16
    0x105C9: "\U000105d2\u0307", 0x105E4: "\U000105da\u0307",
    0x11383: "\U00011382\U000113c9", 0x11385: "\U00011384\U000113bb",
    0x1138E: "\U0001138b\U000113c2", 0x11391: "\U00011390\U000113c9",
    0x113C5: "\U000113c2\U000113c2", 0x113C7: "\U000113c2\U000113b8",
    0x113C8: "\U000113c2\U000113c9", 0x16121: "\U0001611e\U0001611e",
    0x16122: "\U0001611e\U00016129", 0x16123: "\U0001611e\U0001611f",
    0x16124: "\U00016129\U0001611f", 0x16125: "\U0001611e\U00016120",
    0x16126: "\U0001611e\U0001611e\U0001611f", 0x16127: "\U0001611e\U00016129\U0001611f",
    0x16128: "\U0001611e\U0001611e\U00016120", 0x16D68: "\U00016d67\U00016d67",
    0x16D69: "\U00016d63\U00016d67", 0x16D6A: "\U00016d63\U00016d67\U00016d67",
}
# What tf-text's WordPiece splits at: White_Space, BERT's punctuation (ASCII symbols and
# category P) and BERT's CJK ideograph blocks, each character a word of its own.
_SPACES = "\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_ASCII_PUNCT = "!-/:-@\\[-`{-~"
_CJK = ("\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002b73f"
        "\U0002b740-\U0002b81f\U0002b820-\U0002ceaf\U0002f800-\U0002fa1f")
_TF_PUNCT_EXTRA = ("\u1b4e\u1b4f\u1b7f\U00010d6e\U000113d4\U000113d5\U000113d7\U000113d8"
                   "\U00011b00-\U00011b09\U00011be1\U00011f43-\U00011f4f"
                   "\U00016d6d-\U00016d6f\U0001e5ff")  # punctuation of Unicode 15 and 16


def _class(ranges: List[Tuple[int, int]], extra: str = "") -> str:
    """A regular expression character class of code point ranges and `extra` (a class
    body written with literal characters)."""
    body = "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)
    return f"[{body}{extra}]"


@functools.lru_cache(maxsize=None)
def _categories() -> Dict[str, List[Tuple[int, int]]]:
    """Code point ranges of the general categories the normaliser and the word splitter
    use, from Python's Unicode data: "junk" (C except tab/LF/CR), "Mn", "P"."""
    found: Dict[str, List[Tuple[int, int]]] = {"junk": [], "Mn": [], "P": []}
    category = unicodedata.category
    for cp in range(0x110000):
        cat = category(chr(cp))
        key = ("junk" if cat[0] == "C" and cat != "Cn" and cp not in (9, 10, 13) else
               "Mn" if cat == "Mn" else "P" if cat[0] == "P" else None)
        if key is None:
            continue
        ranges = found[key]
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return found


@dataclasses.dataclass(frozen=True)
class _Patterns:
    junk: "re.Pattern"
    unlowered: "re.Pattern"  # a capturing group: re.split keeps the characters
    nfd_override: "re.Pattern"
    marks: "re.Pattern"
    words: "re.Pattern"


# The same for ASCII text (most lines): no marks, nothing ICU and Python case differently.
_ASCII_JUNK = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]+")
_ASCII_WORDS = re.compile(f"[{_ASCII_PUNCT}]|[^\t\n\x0b\x0c\r {_ASCII_PUNCT}]+")


@functools.lru_cache(maxsize=None)
def _patterns() -> _Patterns:
    cats = _categories()
    junk = _class(cats["junk"], "\ufffd" + _TF_JUNK_EXTRA)
    split = _class(cats["P"], _ASCII_PUNCT + _CJK + _TF_PUNCT_EXTRA)
    word = f"[^{_SPACES}{split[1:-1]}]+"
    return _Patterns(
        junk=re.compile(junk + "+"),
        unlowered=re.compile(f"([{_TF_UNLOWERED}])"),
        nfd_override=re.compile("[" + "".join(map(chr, _TF_NFD)) + "]"),
        marks=re.compile(_class(cats["Mn"], _TF_MN_EXTRA) + "+"),
        words=re.compile(f"{split}|{word}"))


def _lower(text: str, patterns: _Patterns) -> str:
    """str.lower, leaving the capitals ICU's data lacks, and ending at a NUL as TensorFlow's
    lower-casing does (a C string)."""
    if "\x00" in text:
        text = text[:text.index("\x00")]
    if patterns.unlowered.search(text) is None:
        return text.lower()
    parts = patterns.unlowered.split(text)  # odd indices: the characters to keep
    return "".join(p if i % 2 else p.lower() for i, p in enumerate(parts))


def normalize_text(strings: Sequence, lower: bool, strip_accents: bool = True,
                   clean: bool = True) -> List[str]:
    """`normalize` in Python, to the character (Unicode data as TensorFlow's): strings
    (str, or UTF-8 bytes: invalid bytes as U+FFFD) -> str."""
    patterns = _patterns()
    out = []
    for text in strings:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if text.isascii():
            if clean:
                text = _ASCII_JUNK.sub("", text)
            if lower:
                text = (text[:text.index("\x00")] if "\x00" in text else text).lower()
            out.append(text)
            continue
        if clean:
            text = patterns.junk.sub("", text)
        if lower:
            text = _lower(text, patterns)
            if strip_accents:
                if patterns.nfd_override.search(text):
                    text = text.translate(_TF_NFD)
                text = patterns.marks.sub("", unicodedata.normalize("NFD", text))
        out.append(text)
    return out


def split_words(text: str) -> List[str]:
    """The words tf-text's WordPiece sees in `normalize`d text: split at white space,
    and each punctuation or CJK character a word."""
    return (_ASCII_WORDS if text.isascii() else _patterns().words).findall(text)


def _tf_text_loaded() -> bool:
    """Where TensorFlow is loaded, tf-text tokenizes (TextEncoder's ops); elsewhere the
    host tokenizers do, with the same ids."""
    if sys.modules.get("tensorflow") is None:
        return False
    try:
        import tensorflow_text  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return False
    return True


def bert_normalize(lines: List[str], lower: bool) -> List[str]:
    """`normalize` (the WordPiece builder's: clean, and if `lower` lower-case and strip
    accents) of Python strings."""
    if not lines:
        return []
    if not _tf_text_loaded():
        return normalize_text(lines, lower, strip_accents=lower)
    tf, _ = _tensorflow()
    out = normalize(tf.constant(lines, tf.string), lower, strip_accents=lower)
    return [line.decode("utf-8") for line in out.numpy().tolist()]


MAX_BYTES_PER_WORD = 100  # a longer word is [UNK], as in tf-text's WordPiece


class HostWordPiece:
    """tf-text's FastBertTokenizer (as `wordpiece_tokenizer` makes it) without TensorFlow:
    `split_words`, then the `tokenizers` package's WordPiece, once per distinct word."""

    CACHE_WORDS = 1 << 20  # the word -> ids cache starts over beyond this many

    def __init__(self, vocab: List[str]):
        from tokenizers.models import WordPiece  # pylint: disable=import-outside-toplevel
        lookup: Dict[str, int] = {}
        for i, token in enumerate(vocab):
            lookup.setdefault(token, i)
        self._unk = [lookup["[UNK]"]] if "[UNK]" in lookup else []
        self._model = WordPiece(lookup, unk_token="[UNK]", continuing_subword_prefix="##",
                                max_input_chars_per_word=MAX_BYTES_PER_WORD)
        self._cache: Dict[str, List[int]] = {}

    def _word_ids(self, word: str) -> List[int]:
        if len(word.encode("utf-8")) > MAX_BYTES_PER_WORD:
            ids = self._unk
        else:
            ids = [token.id for token in self._model.tokenize(word)]
        if len(self._cache) >= self.CACHE_WORDS:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def tokenize(self, texts: Sequence[str]) -> List[List[int]]:
        """`normalize`d strings -> ids per string."""
        cache, miss = self._cache, self._word_ids
        out = []
        for text in texts:
            ids: List[int] = []
            for word in split_words(text):
                found = cache.get(word)
                ids.extend(miss(word) if found is None else found)
            out.append(ids)
        return out


class HostSentencePiece:
    """tf-text's SentencepieceTokenizer (defaults: no sampling, no BOS/EOS) without
    TensorFlow: the `sentencepiece` package itself."""

    def __init__(self, data: bytes):
        self._processor = spm.SentencePieceProcessor(model_proto=data)

    def tokenize(self, texts: Sequence[str]) -> List[List[int]]:
        return self._processor.encode(list(texts), out_type=int)


def host_tokenizer(kind: str, vocab: List[str], data: bytes):
    """The TensorFlow-free tokenizer of a vocabulary `read_vocab` read."""
    return HostSentencePiece(data) if kind == "sentencepiece" else HostWordPiece(vocab)


def _normalize_options(kind: str, lower: bool) -> dict:
    """`normalize`'s options for a tokenizer: SentencePiece models see raw text,
    lower-cased only when asked; WordPiece (BERT) cleans and strips accents."""
    return (dict(lower=lower, strip_accents=False, clean=False) if kind == "sentencepiece"
            else dict(lower=lower, strip_accents=lower))


def _ragged(rows: List[List[int]]) -> Tuple[np.ndarray, np.ndarray]:
    """Lists of ids -> (flat int32 ids, int64 row splits)."""
    splits = np.zeros([len(rows) + 1], np.int64)
    np.cumsum([len(r) for r in rows], out=splits[1:])
    flat = np.fromiter((i for row in rows for i in row), np.int32, count=int(splits[-1]))
    return flat, splits


class Tokenizer:
    """The builder's batched tokenization; `data`: the vocabulary's bytes
    (`read_vocab_data`), else read from `info.path`. tf-text where TensorFlow is loaded,
    the host tokenizers elsewhere: the same ids."""

    def __init__(self, info: VocabInfo, data: Optional[bytes] = None):
        self.info = info
        self.special_ids = info.special_ids
        self.vocab, data = read_vocab(info.kind, info.path, data)
        self._options = _normalize_options(info.kind, info.do_lower_case)
        self.uses_tensorflow = _tf_text_loaded()
        self._tokenizer = (tf_tokenizer(info.kind, self.vocab, data) if self.uses_tensorflow
                           else host_tokenizer(info.kind, self.vocab, data))

    def tokenize(self, lines: List[str]) -> Tuple[np.ndarray, np.ndarray]:
        """Batch of lines -> (flat int32 ids, int64 row splits of len(lines) + 1)."""
        if not lines:
            return np.zeros([0], np.int32), np.zeros([1], np.int64)
        if not self.uses_tensorflow:
            return _ragged(self._tokenizer.tokenize(normalize_text(lines, **self._options)))
        tf, _ = _tensorflow()
        strings = normalize(tf.constant(lines, dtype=tf.string), **self._options)
        ragged = self._tokenizer.tokenize(strings)
        return ragged.flat_values.numpy(), ragged.row_splits.numpy()

    def ids_to_tokens(self, ids) -> List[str]:
        return [self.vocab[i] for i in ids]


def _pack_lengths(first: int, second: Optional[int], budget: int) -> Tuple[int, int]:
    """Tokens kept of each segment under BERT's pair truncation, which is what a round
    robin allots (tf-text's RoundRobinTrimmer)."""
    budget = max(budget, 0)
    if second is None:
        return min(first, budget), 0
    kept_first = min(first, max(budget - second, (budget + 1) // 2))
    return kept_first, min(second, budget - kept_first)


class _EncoderBase:
    """What both encoders hold of their vocabulary."""

    def _read(self, vocab_file: Optional[str], do_lower_case: bool,
              spm_model: Optional[str]) -> Tuple[str, bytes]:
        if (vocab_file is None) == (spm_model is None):
            raise VocabError("give exactly one of --vocab_file and --spm_model")
        self.do_lower_case = bool(do_lower_case)
        self.kind = "wordpiece" if spm_model is None else "sentencepiece"
        path = vocab_file if spm_model is None else spm_model
        self.vocab, data = read_vocab(self.kind, path)
        self.special_ids: Dict[str, int] = _special_ids(self.vocab, path, KIND_FLAGS[self.kind])
        self.vocab_size = len(self.vocab)
        self.vocab_path = path if fileio.is_remote(path) else \
            os.path.abspath(path)  # local paths only: abspath would mangle gs://b/x
        return path, data


class HostTextEncoder(_EncoderBase):
    """`TextEncoder`'s host methods (`tokenize_lists`, `encode_numpy`) without TensorFlow:
    the same ids, BERT's truncation and layout, in numpy."""

    def __init__(self, vocab_file: Optional[str] = None, do_lower_case: bool = True,
                 spm_model: Optional[str] = None):
        _, data = self._read(vocab_file, do_lower_case, spm_model)
        self._tokenizer = host_tokenizer(self.kind, self.vocab, data)
        # SentencePiece keeps its accents: only WordPiece (BERT) strips them.
        self._options = dict(lower=self.do_lower_case,
                             strip_accents=self.kind == "wordpiece")

    def tokenize_lists(self, strings: Sequence, batch_size: int = 4096) -> List[List[int]]:
        """Strings -> lists of ids."""
        out: List[List[int]] = []
        for start in range(0, len(strings), batch_size):
            chunk = normalize_text(strings[start:start + batch_size], **self._options)
            out.extend(self._tokenizer.tokenize(chunk))
        return out

    def pack_lists(self, first: Sequence[Sequence[int]],
                   second: Optional[Sequence[Sequence[int]]] = None,
                   max_seq_length: int = 128) -> Dict[str, np.ndarray]:
        """Token ids of one or two segments -> padded int32 BERT inputs [N, max_seq_length]
        (`TextEncoder.pack`)."""
        n = len(first)
        out = {k: np.zeros([n, max_seq_length], np.int32)
               for k in ("input_ids", "input_mask", "segment_ids")}
        out["input_ids"][:] = self.special_ids["[PAD]"]
        cls, sep = self.special_ids["[CLS]"], self.special_ids["[SEP]"]
        budget = max_seq_length - (2 if second is None else 3)
        for i in range(n):
            a = first[i]
            b = None if second is None else second[i]
            na, nb = _pack_lengths(len(a), None if b is None else len(b), budget)
            ids = [cls, *a[:na], sep]
            segments = [0] * len(ids)
            if b is not None:
                ids += [*b[:nb], sep]
                segments += [1] * (nb + 1)
            ids, segments = ids[:max_seq_length], segments[:max_seq_length]
            out["input_ids"][i, :len(ids)] = ids
            out["input_mask"][i, :len(ids)] = 1
            out["segment_ids"][i, :len(ids)] = segments
        return out

    def encode_numpy(self, first: Sequence, second: Optional[Sequence] = None,
                     max_seq_length: int = 128, batch_size: int = 4096) -> Dict[str, np.ndarray]:
        """Strings -> numpy int32 inputs [N, max_seq_length] (`TextEncoder.encode_numpy`)."""
        first_ids = self.tokenize_lists(first, batch_size)
        second_ids = None if second is None else self.tokenize_lists(second, batch_size)
        return self.pack_lists(first_ids, second_ids, max_seq_length)


def _text_encoder_class():
    """TextEncoder, a tf.Module: defined when first asked for (it imports TensorFlow)."""
    tf, tf_text = _tensorflow()

    class TextEncoder(_EncoderBase, tf.Module):  # pylint: disable=redefined-outer-name
        """In-graph WordPiece or SentencePiece tokenization (`tokenize`) and BERT packing
        (`pack`: `[CLS] first [SEP] (second [SEP])`, BERT's truncation rule)."""

        def __init__(self, vocab_file: Optional[str] = None, do_lower_case: bool = True,
                     spm_model: Optional[str] = None, name: str = "text_encoder"):
            tf.Module.__init__(self, name=name)
            path, data = self._read(vocab_file, do_lower_case, spm_model)
            self.asset = tf.saved_model.Asset(path)
            self._tokenizer = tf_tokenizer(self.kind, self.vocab, data)

        # -------------------------------------------------------------- graph ops

        def tokenize(self, strings) -> tf.RaggedTensor:
            """[N] strings -> [N, (tokens)] int32 ids."""
            # SentencePiece keeps its accents: only WordPiece (BERT) strips them.
            strings = normalize(strings, self.do_lower_case,
                                strip_accents=self.kind == "wordpiece")
            return self._tokenizer.tokenize(strings)

        def pack(self, first: tf.RaggedTensor, second: Optional[tf.RaggedTensor] = None,
                 max_seq_length: int = 128) -> Dict[str, tf.Tensor]:
            """Token ids of one or two segments -> padded BERT inputs [N, max_seq_length]."""
            segments = [tf.cast(first, tf.int32)]
            if second is not None:
                segments.append(tf.cast(second, tf.int32))
            # BERT's pair truncation (drop the last token of the longer segment, of the
            # second on ties) keeps what a round robin allots; tests/test_text.py checks
            # every pair of lengths. WaterfallTrimmer would empty the second segment first.
            budget = max_seq_length - 1 - len(segments)  # [CLS], and a [SEP] per segment
            segments = tf_text.RoundRobinTrimmer(budget).trim(segments)
            ids, segment_ids = tf_text.combine_segments(
                segments, self.special_ids["[CLS]"], self.special_ids["[SEP]"])
            input_ids, input_mask = tf_text.pad_model_inputs(ids, max_seq_length,
                                                             self.special_ids["[PAD]"])
            segment_ids, _ = tf_text.pad_model_inputs(segment_ids, max_seq_length, 0)
            return {"input_ids": input_ids, "input_mask": input_mask,
                    "segment_ids": segment_ids}

        def encode(self, first, second=None, max_seq_length: int = 128) -> Dict[str, tf.Tensor]:
            """Raw strings [N] (and an optional second segment [N]) -> packed inputs."""
            second_ids = None if second is None else self.tokenize(second)
            return self.pack(self.tokenize(first), second_ids, max_seq_length)

        # -------------------------------------------------------------- host helpers
        # Eager: the ops of a one-off tf.function cost less than its trace and graph
        # optimisation (0.2 s against 1.5 s for 1,780 sentences; ~1 ms per later batch).

        def tokenize_lists(self, strings: Sequence[str],
                           batch_size: int = 4096) -> List[List[int]]:
            """Python strings -> lists of ids, through the same ops (batched)."""
            out: List[List[int]] = []
            for start in range(0, len(strings), batch_size):
                chunk = list(strings[start:start + batch_size])
                ragged = self.tokenize(tf.constant(chunk, tf.string))
                flat = ragged.flat_values.numpy()
                splits = ragged.row_splits.numpy()
                out.extend(flat[splits[i]:splits[i + 1]].tolist() for i in range(len(chunk)))
            return out

        def encode_numpy(self, first: Sequence[str], second: Optional[Sequence[str]] = None,
                         max_seq_length: int = 128,
                         batch_size: int = 4096) -> Dict[str, np.ndarray]:
            """Python strings -> numpy int32 inputs [N, max_seq_length] (the training path)."""
            parts: Dict[str, List[np.ndarray]] = {}
            for start in range(0, len(first), batch_size):
                args = [tf.constant(list(first[start:start + batch_size]), tf.string)]
                if second is not None:
                    args.append(tf.constant(list(second[start:start + batch_size]), tf.string))
                for k, v in self.encode(*args, max_seq_length=max_seq_length).items():
                    parts.setdefault(k, []).append(v.numpy())
            if not parts:
                return {k: np.zeros([0, max_seq_length], np.int32)
                        for k in ("input_ids", "input_mask", "segment_ids")}
            return {k: np.concatenate(v) for k, v in parts.items()}

    TextEncoder.__module__ = __name__
    TextEncoder.__qualname__ = "TextEncoder"
    return TextEncoder


def __getattr__(name: str):
    """`TextEncoder` on first use: the one name here that needs TensorFlow to exist."""
    if name == "TextEncoder":
        cls = globals().get("_TEXT_ENCODER") or _text_encoder_class()
        globals()["_TEXT_ENCODER"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
