"""Tokenization, the one owner: vocabularies (on any filesystem, checked for ELECTRA's
special tokens), BERT's text normalisation, the builder's batch `Tokenizer` and the in-graph
`TextEncoder` (tokenize and pack BERT inputs) of fine-tuning, exports and scoring. Both use
`normalize` and the same tf-text tokenizers, so the builder and fine-tuning give the same
ids. A leaf module: it imports only `electra_tf.fileio`.
"""

import dataclasses
import hashlib
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

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
    except (OSError, tf.errors.OpError) as e:
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


def wordpiece_tokenizer(vocab: List[str]) -> tf_text.FastBertTokenizer:
    """WordPiece over `normalize`d text: the tokenizer only splits and looks up."""
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
              clean: bool = True) -> tf.Tensor:
    """BERT's text normalisation of a string tensor, in-graph; never fails on bad bytes.
    clean: invalid UTF-8 becomes U+FFFD, dropped with every control character. lower: ICU's
    full lower-casing (as str.lower); with strip_accents also NFD without marks (Mn).
    Not FastBertTokenizer's: it splits at control characters and case-folds with NFKC ('²'
    -> '2', final 'ς' -> 'σ'), departing from reference BERT on ~0.2% of Wikipedia lines.
    """
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


def bert_normalize(lines: List[str], lower: bool) -> List[str]:
    """`normalize` (the WordPiece builder's: clean, and if `lower` lower-case and strip
    accents) of Python strings."""
    if not lines:
        return []
    out = normalize(tf.constant(lines, tf.string), lower, strip_accents=lower)
    return [line.decode("utf-8") for line in out.numpy().tolist()]


class Tokenizer:
    """The builder's batched tokenization; `data`: the vocabulary's bytes
    (`read_vocab_data`), else read from `info.path`."""

    def __init__(self, info: VocabInfo, data: Optional[bytes] = None):
        self.info = info
        self.special_ids = info.special_ids
        self.vocab, data = read_vocab(info.kind, info.path, data)
        self._tokenizer = tf_tokenizer(info.kind, self.vocab, data)
        lower = info.do_lower_case
        # SentencePiece models see raw text, lower-cased only when asked.
        self._options = (dict(lower=lower, strip_accents=False, clean=False)
                         if info.kind == "sentencepiece" else
                         dict(lower=lower, strip_accents=lower))

    def tokenize(self, lines: List[str]) -> Tuple[np.ndarray, np.ndarray]:
        """Batch of lines -> (flat int32 ids, int64 row splits of len(lines) + 1)."""
        if not lines:
            return np.zeros([0], np.int32), np.zeros([1], np.int64)
        strings = normalize(tf.constant(lines, dtype=tf.string), **self._options)
        ragged = self._tokenizer.tokenize(strings)
        return ragged.flat_values.numpy(), ragged.row_splits.numpy()

    def ids_to_tokens(self, ids) -> List[str]:
        return [self.vocab[i] for i in ids]


class TextEncoder(tf.Module):
    """In-graph WordPiece or SentencePiece tokenization (`tokenize`) and BERT packing
    (`pack`: `[CLS] first [SEP] (second [SEP])`, BERT's truncation rule)."""

    def __init__(self, vocab_file: Optional[str] = None, do_lower_case: bool = True,
                 spm_model: Optional[str] = None, name: str = "text_encoder"):
        super().__init__(name=name)
        if (vocab_file is None) == (spm_model is None):
            raise VocabError("give exactly one of --vocab_file and --spm_model")
        self.do_lower_case = bool(do_lower_case)
        self.kind = "wordpiece" if spm_model is None else "sentencepiece"
        path = vocab_file if spm_model is None else spm_model
        self.vocab, data = read_vocab(self.kind, path)
        self.asset = tf.saved_model.Asset(path)
        self._tokenizer = tf_tokenizer(self.kind, self.vocab, data)
        self.special_ids: Dict[str, int] = _special_ids(self.vocab, path, KIND_FLAGS[self.kind])
        self.vocab_size = len(self.vocab)
        self.vocab_path = path if fileio.is_remote(path) else \
            os.path.abspath(path)  # local paths only: abspath would mangle gs://b/x

    # ------------------------------------------------------------------ graph ops

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
        # BERT's pair truncation (drop the last token of the longer segment, of the second
        # on ties) keeps what a round robin allots; tests/test_finetune_text.py checks
        # every pair of lengths. WaterfallTrimmer would empty the second segment first.
        budget = max_seq_length - 1 - len(segments)  # [CLS], and a [SEP] per segment
        segments = tf_text.RoundRobinTrimmer(budget).trim(segments)
        ids, segment_ids = tf_text.combine_segments(
            segments, self.special_ids["[CLS]"], self.special_ids["[SEP]"])
        input_ids, input_mask = tf_text.pad_model_inputs(ids, max_seq_length,
                                                         self.special_ids["[PAD]"])
        segment_ids, _ = tf_text.pad_model_inputs(segment_ids, max_seq_length, 0)
        return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}

    def encode(self, first, second=None, max_seq_length: int = 128) -> Dict[str, tf.Tensor]:
        """Raw strings [N] (and an optional second segment [N]) -> packed inputs."""
        second_ids = None if second is None else self.tokenize(second)
        return self.pack(self.tokenize(first), second_ids, max_seq_length)

    # ------------------------------------------------------------------ host helpers
    # Eager: the ops of a one-off tf.function cost less than its trace and graph
    # optimisation (0.2 s against 1.5 s for 1,780 sentences; ~1 ms per later batch).

    def tokenize_lists(self, strings: Sequence[str], batch_size: int = 4096) -> List[List[int]]:
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
                     max_seq_length: int = 128, batch_size: int = 4096) -> Dict[str, np.ndarray]:
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
