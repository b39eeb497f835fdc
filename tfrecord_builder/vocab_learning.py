"""`learn_vocab`: a WordPiece vocab.txt or a SentencePiece model learned from the corpus.

The corpus is read as `build` reads it (`corpus`), keeping at most `max_sentences`
non-empty lines (a seeded reservoir sample), normalised as the builder's `Tokenizer`
normalises (WordPiece: `bert_normalize`; SentencePiece: `str.lower()` when lower-casing,
the model's NFKC does the rest). Both vocabularies start [PAD]=0, [UNK]=1, [CLS]=2,
[SEP]=3, [MASK]=4; in a SentencePiece model the last three are control symbols, so the
text "[MASK]" is never the mask id. SentencePiece trains into a local staging directory;
its results are copied to the output (any filesystem), PREFIX.model last.
"""

import collections
import math
import os
import posixpath
import random
import re
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf
from absl import logging

from electra_tf import fileio
from electra_tf.data.files import shown
from tfrecord_builder import BuildError
from tfrecord_builder import corpus
from electra_tf.text import SPECIAL_TOKENS, bert_normalize, vocab_info

VOCAB_TYPES = ("wordpiece", "sentencepiece")
RESERVED_TOKENS = list(SPECIAL_TOKENS)  # [PAD] [UNK] [CLS] [SEP] [MASK] -> ids 0..4
MIN_VOCAB_SIZE = len(RESERVED_TOKENS) + 50
DEFAULT_SEED = 12345
WORDPIECE_FILE = "vocab.txt"  # name used when --vocab_output is a directory
SPM_PREFIX = "spm"

# WordPiece learning (tf-text's wordpiece_tokenizer_learner_lib parameters).
WP_NUM_ITERATIONS = 4
WP_MAX_INPUT_TOKENS = 5_000_000
WP_MAX_TOKEN_LENGTH = 50
WP_MAX_UNIQUE_CHARS = 1000
WP_UPPER_THRESH = 10_000_000
# Stop searching once a threshold gives at most this much over the target (then trim).
WP_ACCEPT_OVER = 0.02

# SentencePiece training.
SPM_MAX_SENTENCE_BYTES = 1 << 16


# ----------------------------------------------------------------------------- sampling


class Reservoir:
    """Uniform sample of at most `k` items from a stream (Li's algorithm L).

    Deterministic for a given seed and stream; all items, in order, when the stream
    holds at most `k`. Skips whole runs of items without drawing a number for each.
    """

    def __init__(self, k: int, seed: int = DEFAULT_SEED):
        if k < 1:
            raise ValueError("k must be at least 1")
        self.k = k
        self.items: List[str] = []
        self.seen = 0
        self._rng = random.Random(seed)
        self._w = 1.0
        self._next = 0  # stream index of the next item to take once full

    def _u(self) -> float:
        return 1.0 - self._rng.random()  # in (0, 1]

    def _advance(self):
        self._w *= math.exp(math.log(self._u()) / self.k)
        w = min(max(self._w, 1e-12), 1.0 - 1e-16)
        self._next += int(math.floor(math.log(self._u()) / math.log1p(-w))) + 1

    def extend(self, items: Sequence[str]):
        base, n, i = self.seen, len(items), 0
        if len(self.items) < self.k:
            i = min(self.k - len(self.items), n)
            self.items.extend(items[:i])
            if len(self.items) == self.k:
                self._next = base + i - 1
                self._advance()
        if len(self.items) == self.k:
            while self._next < base + n:
                self.items[self._rng.randrange(self.k)] = items[self._next - base]
                self._advance()
        self.seen = base + n


def sample_lines(inputs: Sequence[str], max_sentences: int, seed: int = DEFAULT_SEED,
                 chunk_bytes: int = corpus.DEFAULT_CHUNK_BYTES
                 ) -> Tuple[List[str], List[str], corpus.LineStats]:
    """Reads `inputs` like the builder; returns (sampled non-empty lines, files, stats).

    `stats.lines` counts every line read, `stats.skipped` the dropped ones."""
    files = corpus.expand_inputs(inputs)
    reservoir = Reservoir(max_sentences, seed)
    stats = corpus.LineStats()
    for file_index, path in enumerate(files):
        for chunk in corpus.iter_file_chunks(path, file_index, chunk_bytes):
            reservoir.extend([line for line in corpus.clean_lines(chunk, stats) if line])
    logging.info("learn_vocab: sampled %d of %d non-empty lines (%d lines read, skipped %s) "
                 "from %d file(s)", len(reservoir.items), reservoir.seen, stats.lines,
                 stats.skipped or "none", len(files))
    return reservoir.items, files, stats


# ----------------------------------------------------------------------------- WordPiece


def count_words(lines: Sequence[str], do_lower_case: bool, batch_size: int = 1024) -> dict:
    """Word counts with BERT's pre-tokenization, as tf-text's `bert_vocab_from_dataset`
    does it, over a tf.data.Dataset of the builder-normalised lines."""
    from tensorflow_text.python.ops import bert_tokenizer

    def batches():
        for i in range(0, len(lines), batch_size):
            yield bert_normalize(list(lines[i:i + batch_size]), lower=do_lower_case)

    dataset = tf.data.Dataset.from_generator(
        batches, output_signature=tf.TensorSpec([None], tf.string))
    # Lower-casing and accent stripping were done by bert_normalize, exactly as the
    # builder does before FastBertTokenizer; BasicTokenizer only splits here.
    basic = bert_tokenizer.BasicTokenizer(lower_case=False, keep_whitespace=False,
                                          normalization_form=None)
    words = dataset.map(basic.tokenize).prefetch(tf.data.AUTOTUNE)
    counts = collections.Counter()
    for batch in words:
        counts.update(batch.flat_values.numpy().tolist())
    return {word.decode("utf-8", "replace"): n for word, n in counts.items()}


def learn_wordpiece(lines: Sequence[str], vocab_size: int, do_lower_case: bool) -> List[str]:
    """A WordPiece vocabulary of exactly `vocab_size` tokens (fewer only when the text
    cannot support that many): reserved tokens, then every kept character and its
    ##-form, then the learned pieces by frequency.

    Uses tf-text's learner (`wordpiece_tokenizer_learner_lib`, the algorithm behind
    `bert_vocab_from_dataset`) with our own threshold search: the library's search floors
    the frequency threshold at 10, accepts 5% under the target and can return more than
    the target; here the threshold is the largest whose vocabulary reaches the target,
    and the surplus (least frequent learned pieces) is trimmed.
    """
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner
    word_counts = count_words(lines, do_lower_case)
    if not word_counts:
        return []
    # Characters and their ##-forms are never trimmed, so keep the alphabet to at most
    # half the vocabulary; words with rarer characters are left out of learning.
    max_chars = max(1, min(WP_MAX_UNIQUE_CHARS, (vocab_size - len(RESERVED_TOKENS)) // 4))
    params = learner.Params(
        upper_thresh=WP_UPPER_THRESH, lower_thresh=1, num_iterations=WP_NUM_ITERATIONS,
        max_input_tokens=WP_MAX_INPUT_TOKENS, max_token_length=WP_MAX_TOKEN_LENGTH,
        max_unique_chars=max_chars, vocab_size=vocab_size, slack_ratio=0.0,
        include_joiner_token=True, joiner="##", reserved_tokens=RESERVED_TOKENS)
    all_counts = learner.get_input_words(list(word_counts.items()), RESERVED_TOKENS,
                                         params.max_token_length)
    allowed = learner.get_allowed_chars(all_counts, params.max_unique_chars)
    filtered = learner.filter_input_words(all_counts, allowed, params.max_input_tokens)
    if not filtered:
        return []
    chars = learner.extract_char_tokens(filtered)
    logging.info("learn_vocab: %d distinct words (%d kept), %d characters", len(word_counts),
                 len(filtered), len(chars))

    lo, hi = 1, min(max(c for _, c in filtered), WP_UPPER_THRESH)
    over: Optional[List[str]] = None  # smallest vocabulary seen with >= vocab_size
    under: Optional[List[str]] = None  # largest vocabulary seen with < vocab_size
    while lo <= hi:
        # Bisect on a log scale: the right threshold is usually far below the top count.
        thresh = min(hi, max(lo, int(math.sqrt(lo * hi))))
        vocab = learner.learn_with_thresh(filtered, thresh, params)
        logging.info("learn_vocab: frequency threshold %d -> %d tokens", thresh, len(vocab))
        if len(vocab) >= vocab_size:
            if over is None or len(vocab) < len(over):
                over = vocab
            if len(vocab) <= vocab_size * (1 + WP_ACCEPT_OVER):
                break
            lo = thresh + 1
        else:
            if under is None or len(vocab) > len(under):
                under = vocab
            hi = thresh - 1
    if over is None:
        logging.warning("learn_vocab: the text supports only %d WordPiece tokens (asked for "
                        "%d); give more text or a smaller --vocab_size", len(under), vocab_size)
        vocab = under
    else:
        vocab = _trim(over, vocab_size, chars)
    # A token with a line break would shift every id after it in vocab.txt.
    return [t for t in vocab if t and "\n" not in t and "\r" not in t]


def _trim(vocab: List[str], vocab_size: int, chars) -> List[str]:
    """Drops the last (least frequent) learned pieces, never a reserved token or a
    single character or its ##-form, so every kept word stays tokenizable."""
    protected = set(RESERVED_TOKENS) | set(chars) | {"##" + c for c in chars}
    excess = len(vocab) - vocab_size
    keep = []
    for token in reversed(vocab):
        if excess > 0 and token not in protected:
            excess -= 1
            continue
        keep.append(token)
    if excess > 0:
        raise BuildError(f"--vocab_size={vocab_size} is too small: the special tokens and "
                         f"{len(chars)} characters (each also as ##-suffix) need {len(keep)}")
    return keep[::-1]


# ----------------------------------------------------------------------------- SentencePiece


def _spm_error(e: Exception) -> str:
    """First line of a SentencePiece error, without its source location and check."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return re.sub(r"^\w+: \S+\(\d+\) \[[^\]]*\]\s*", "", line) or line


def train_sentencepiece(lines: Sequence[str], vocab_size: int, model_prefix: str,
                        do_lower_case: bool, model_type: str = "unigram",
                        seed: int = DEFAULT_SEED):
    """Trains PREFIX.model / PREFIX.vocab: [PAD]=0 (pad), [UNK]=1 (unk), [CLS]=2,
    [SEP]=3, [MASK]=4 (control symbols), no BOS/EOS. `model_prefix` is a LOCAL path:
    SentencePiece writes with the C++ standard library (learn_vocab stages there)."""
    import sentencepiece as spm
    text = (line.lower() for line in lines) if do_lower_case else iter(lines)
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=text, model_prefix=model_prefix, vocab_size=vocab_size,
            model_type=model_type, pad_id=0, pad_piece=RESERVED_TOKENS[0],
            unk_id=1, unk_piece=RESERVED_TOKENS[1], bos_id=-1, eos_id=-1,
            control_symbols=RESERVED_TOKENS[2:], input_sentence_size=0,
            max_sentence_length=SPM_MAX_SENTENCE_BYTES, hard_vocab_limit=True,
            num_threads=max(1, min(os.cpu_count() or 1, 32)), minloglevel=1)
    except (RuntimeError, OSError, ValueError) as e:
        raise BuildError(f"--vocab_size={vocab_size}: SentencePiece training failed: "
                         f"{_spm_error(e)}") from None


# ----------------------------------------------------------------------------- entry point


def resolve_output(output: str, vocab_type: str) -> str:
    """Final path: vocab.txt (WordPiece) or PREFIX.model (SentencePiece). A directory
    gets vocab.txt / spm.model inside it; a SentencePiece PREFIX may end in .model."""
    if not output or not output.strip():
        raise BuildError("--vocab_output: give an output path")
    try:
        is_dir = output.endswith(("/", os.sep)) or fileio.isdir(output)
    except tf.errors.OpError as e:
        raise BuildError(f"--vocab_output: cannot use {output}: "
                         f"{fileio.error_reason(e)}") from None
    if vocab_type == "wordpiece":
        return fileio.join(output, WORDPIECE_FILE) if is_dir else output
    prefix = fileio.join(output, SPM_PREFIX) if is_dir else output
    if prefix.endswith(".model"):
        prefix = prefix[:-len(".model")]
    return prefix + ".model"


def _parent(path: str) -> str:
    if "://" in path:
        return posixpath.dirname(path.rstrip("/"))
    return os.path.dirname(os.path.abspath(path))  # local path only (URLs above)


def _check_writable(path: str):
    directory = _parent(path)
    problem = fileio.writable_dir_problem(directory)
    if problem:
        raise BuildError(f"--vocab_output: cannot write to {directory}: {problem}")
    if fileio.isdir(path):
        raise BuildError(f"--vocab_output: {path} is a directory")


def learn_vocab(inputs: Sequence[str], output: str, vocab_type: str = "wordpiece",
                vocab_size: int = 8000, do_lower_case: bool = True,
                max_sentences: int = 2_000_000, seed: int = DEFAULT_SEED,
                spm_model_type: str = "unigram") -> str:
    """Learns a vocabulary from the corpus `inputs`; returns the path written.

    wordpiece: `output` is the vocab.txt (one token a line, id = line number).
    sentencepiece: `output` is the model prefix; PREFIX.model and PREFIX.vocab are
    written and PREFIX.model returned.
    """
    if vocab_type not in VOCAB_TYPES:
        raise BuildError(f"--vocab_type={vocab_type}: must be one of {', '.join(VOCAB_TYPES)}")
    if vocab_size < MIN_VOCAB_SIZE:
        raise BuildError(f"--vocab_size={vocab_size}: must be at least {MIN_VOCAB_SIZE} "
                         f"({len(RESERVED_TOKENS)} special tokens + 50)")
    if max_sentences < 1:
        raise BuildError(f"--max_sentences={max_sentences}: must be at least 1")
    if isinstance(inputs, str):
        inputs = [inputs]
    path = resolve_output(output, vocab_type)
    files = corpus.expand_inputs(inputs)
    _check_writable(path)  # before the (long) read and learning
    lines, files, _ = sample_lines(files, max_sentences, seed)
    if not lines:
        raise BuildError(f"--input: no text to learn a vocabulary from in {shown(files)}")

    if vocab_type == "wordpiece":
        tokens = learn_wordpiece(lines, vocab_size, do_lower_case)
        if len(tokens) <= len(RESERVED_TOKENS):
            raise BuildError(f"--input: no words to learn a vocabulary from in "
                             f"{shown(files)}")
        fileio.write_atomic(path, "".join(token + "\n" for token in tokens))
        info = vocab_info(vocab_file=path, do_lower_case=do_lower_case)
    else:
        with fileio.local_staging_dir("learn_vocab-") as tmp:
            tmp_prefix = os.path.join(tmp, SPM_PREFIX)
            train_sentencepiece(lines, vocab_size, tmp_prefix, do_lower_case,
                                model_type=spm_model_type, seed=seed)
            vocab_info(spm_model=tmp_prefix + ".model")  # the special pieces are there
            # Each file lands whole (temp + rename); the model, which `build` is given
            # and which names the pair, lands last.
            fileio.write_atomic(path[:-len(".model")] + ".vocab",
                                fileio.read_bytes(tmp_prefix + ".vocab"))
            fileio.write_atomic(path, fileio.read_bytes(tmp_prefix + ".model"))
        info = vocab_info(spm_model=path, do_lower_case=do_lower_case)
    logging.info("learn_vocab: wrote %s (%s, %d tokens, special ids %s)", path, info.kind,
                 info.vocab_size, info.special_ids)
    return path
