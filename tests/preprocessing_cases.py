"""Inputs on which the SQuAD and tagging features are recorded (tests/
preprocessing_recorded.json, made by the Python preprocessors before issue 31 item 5
replaced them with the in-graph ones): the test sets of tests/test_finetune_*.py, awkward
contexts and a seeded random set, all tokenized with data/vocab's WordPiece vocabulary."""

import hashlib
import random

import numpy as np

from electra_tf.finetune.squad import SquadExample, parse_squad_tree
from electra_tf.finetune.tagging import LabelMap, Sentence

LONG = ("the museum opened its doors in the spring and visitors came from the north and "
        "the south to see the paintings the sculptures and the old maps of the valley "
        "every room was full of light and the gardens outside were green and quiet "
        "children ran along the paths while their parents read the small signs beside "
        "each tree the guides spoke about the history of the town and its founders who "
        "had built the first bridge over the river long ago at the end of the tour the "
        "curator margaret hill thanked everyone for coming")
PARAGRAPHS = [
    ("The quick brown fox jumps over the lazy dog near the old river bank.",
     [("what jumps over the dog?", "quick brown fox"), ("where is the dog?", "near the old river bank"),
      ("who owns the fox?", None)]),
    ("In 1990, Paris hosted a small science fair for young students.",
     [("when did paris host the fair?", "1990"), ("which city hosted the fair?", "Paris"),
      ("how much did the fair cost?", None)]),
    (LONG, [("who was the curator?", "margaret hill"), ("what color was the roof?", None)]),
    ("Born in Paris (1895) he died.", [("When", "1895")]),
    ("Le Café (1895) ouvrit.", [("Quand", "Café"), ("Qui?", None)]),
    ("The Musée d'Orsay opened in (1986), after years of work.",
     [("When did it open?", "1986"), ("What opened?", "Musée d'Orsay")]),
    ("Alpha\u202fbeta  gamma\u00a0delta\tepsilon\n(1895) zeta", [("Year?", "1895"),
                                                                ("Which?", "delta")]),
    ("ab cdefg \x07 h ijklmn op", [("what is it here", "h ijklmn"), ("bell?", "\x07")]),
    ("\x07 \x07", [("nothing?", None)]),
    ("", [("empty?", None)]),
    ("   ", [("blank?", None)]),
]
PLAIN = ("alpha", "bravo", "charlie", "delta", "unbelievably", "echo", "foxtrot",
         "extraordinary", "golf", "hotel", "(1990),", "Café", "d'Orsay")


def _random_paragraphs(seed=0, n=40):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(PLAIN) for _ in range(rng.randrange(1, 160))]
        context = " ".join(words)
        qs = []
        for _ in range(rng.randrange(1, 4)):
            question = " ".join(rng.choice(PLAIN) for _ in range(rng.randrange(0, 25)))
            if rng.random() < 0.3:
                qs.append((question, None))
                continue
            first = rng.randrange(len(words))
            last = min(len(words), first + rng.randrange(1, 5))
            qs.append((question, " ".join(words[first:last])))
        out.append((context, qs))
    return out


def squad_tree(paragraphs, v2: bool) -> dict:
    paras = []
    for p, (context, questions) in enumerate(paragraphs):
        qas = []
        for q, (question, answer) in enumerate(questions):
            if answer is None and not v2:
                continue
            qa = {"id": f"p{p}q{q}", "question": question, "answers": [] if answer is None
                  else [{"text": answer, "answer_start": context.index(answer)}]}
            if v2:
                qa["is_impossible"] = answer is None
            qas.append(qa)
        paras.append({"context": context, "qas": qas})
    return {"data": [{"title": "t", "paragraphs": paras}]}


def squad_cases():
    """(name, examples, max_seq_length, doc_stride, max_query_length, is_training)."""
    sets = {"fixed": PARAGRAPHS, "random": _random_paragraphs()}
    for set_name, paragraphs in sets.items():
        for v2 in (False, True):
            for is_training in (True, False):
                examples = parse_squad_tree(squad_tree(paragraphs, v2), is_training, v2,
                                            set_name)
                for L, stride, mql in ((64, 16, 16), (24, 4, 8), (128, 128, 64)):
                    yield (f"{set_name}-v{2 if v2 else 1}-{'train' if is_training else 'dev'}"
                           f"-{L}-{stride}-{mql}", examples, L, stride, mql, is_training)
    questions = ["who was the curator?", "", "what " * 30, "why"]
    contexts = [LONG, "The quick, brown fox.", " ".join(PLAIN * 9), "a\u202fb  c\td\u00a0e"]
    word = __import__("re").compile("[^ \t\r\n\u202f]+")
    examples = [SquadExample(str(i), q, tuple(word.findall(c)), ())
                for i, (q, c) in enumerate(zip(questions, contexts))]
    yield "awkward-dev-64-16-16", examples, 64, 16, 16, False


CHUNK_WORDS = {"DT": ["the", "a", "this"], "NN": ["cat", "dog", "house", "unaffable", "Café"],
               "VBZ": ["runs", "jumped", "sees"], "IN": ["in", "on", "over"]}


def _chunk_sentences(seed=0, n=60):
    rng = random.Random(seed)
    out = []
    for s in range(n):
        words, labels = [], []
        for _ in range(rng.randrange(1, 12)):
            kind = rng.choice(["NP", "VP", "PP", "O"])
            if kind == "NP":
                words += [rng.choice(CHUNK_WORDS["DT"]), rng.choice(CHUNK_WORDS["NN"])]
                labels += ["B-NP", "I-NP"]
            elif kind == "VP":
                words.append(rng.choice(CHUNK_WORDS["VBZ"]))
                labels.append("B-VP")
            elif kind == "PP":
                words.append(rng.choice(CHUNK_WORDS["IN"]))
                labels.append("B-PP")
            else:
                words.append(rng.choice([".", ",", "\x07", "(1990)", "extraordinary"]))
                labels.append("O")
        out.append(Sentence(tuple(words), tuple(labels), 1 + 20 * s, "chunk.txt"))
    return out


def tagging_cases():
    """(name, sentences, label_map, max_seq_length, scheme)."""
    fixed = [Sentence(("Confidence", "in", "the", "pound"), ("B-NP", "B-PP", "B-NP", "I-NP"),
                      1, "hand.txt"),
             Sentence(("ab", "\x07", "cde"), ("B-NP", "O", "B-VP"), 6, "ctl.txt"),
             Sentence(("\x07\x07",), ("B-NP",), 10, "ctl.txt"),
             Sentence(("EU", "rejects", "German", "call"), ("I-ORG", "O", "I-MISC", "O"),
                      12, "ner.txt"),
             Sentence(("Peter", "Blackburn"), ("I-PER", "I-PER"), 17, "ner.txt")]
    chunk = _chunk_sentences()
    for name, sentences in (("fixed", fixed), ("chunk", chunk)):
        for scheme in ("bioes", "bio", "raw"):
            label_map = LabelMap.from_sentences(sentences, scheme)
            for L in (5, 8, 16, 128):
                yield f"{name}-{scheme}-{L}", sentences, label_map, L, scheme


def digest(arrays) -> dict:
    """{name: "shape sha256-prefix"} of integer/bool/float arrays or lists of rows."""
    out = {}
    for name, value in arrays.items():
        if isinstance(value, list):  # rows of varying length: lengths, then the values
            value = np.concatenate([[len(r) for r in value]]
                                   + [np.asarray(r).reshape(-1) for r in value]) \
                if value else np.zeros([0])
        value = np.asarray(value)
        flat = value.astype(np.float64 if value.dtype.kind == "f" else np.int64)
        out[name] = f"{value.shape} {hashlib.sha256(flat.tobytes()).hexdigest()[:16]}"
    return out


def squad_digest(f) -> dict:
    return digest({"input_ids": f.input_ids, "input_mask": f.input_mask,
                   "segment_ids": f.segment_ids, "start_positions": f.start_positions,
                   "end_positions": f.end_positions, "is_impossible": f.is_impossible,
                   "example_index": f.example_index,
                   # Rows, as the Python preprocessor kept them when this was recorded.
                   "token_to_orig_map": list(f.token_to_orig_map),
                   "token_is_max_context": list(f.token_is_max_context),
                   "token_piece": list(f.token_piece), "num_examples": np.array([f.num_examples])})


def tagging_digest(f) -> dict:
    # Words without tokens: those without a position that max_seq_length did not cut.
    untokenized = sum(int((p < 0).sum()) for p in f.word_positions) - f.num_truncated_words
    return digest({"input_ids": f.input_ids, "input_mask": f.input_mask,
                   "segment_ids": f.segment_ids, "label_ids": f.label_ids,
                   "label_weights": f.label_weights, "word_positions": f.word_positions,
                   "counts": np.array([f.num_truncated_words, untokenized])})
