"""tfrecord_builder.tfds_source: a locally prepared tensorflow-datasets text dataset as input.

A tiny TFDS builder (documents made of lines of data/corpus/enwiki_sample.txt) is
prepared into a temporary data dir, with no network, and built from like a corpus file.
"""

import functools
import json
import os
import sys

import numpy as np
import pytest

from tfrecord_builder import BuildError
from tfrecord_builder import tfds_source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "data", "corpus", "enwiki_sample.txt")
VOCAB = os.path.join(ROOT, "data", "vocab", "bert_uncased_vocab.txt")
NUM_TRAIN, NUM_VALIDATION = 12, 3


def _documents():
    """NUM_TRAIN + NUM_VALIDATION documents of 2..9 corpus lines each (clean lines)."""
    with open(CORPUS, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    docs, pos = [], 0
    for i in range(NUM_TRAIN + NUM_VALIDATION):
        n = 2 + (i * 5) % 8
        doc = []
        while len(doc) < n:
            if len(lines[pos]) < 600:  # keeps every document well under the hard limit
                doc.append(lines[pos])
            pos += 1
        docs.append(doc)
    return docs


def _messy_text(i, doc):
    """The document as a multi-line record, with the noise real datasets have."""
    if i % 3 == 0:
        return "\n\n".join(doc) + "\n"  # paragraphs separated by blank lines
    if i % 3 == 1:
        return "\r\n".join(f"  {line}\t" for line in doc)
    return "\n".join(doc[:1] + ["", "   "] + doc[1:])


@functools.lru_cache(maxsize=None)
def _builder_cls():
    """Defined (and so registered with TFDS) once per process."""
    tfds = pytest.importorskip("tensorflow_datasets")

    class ElectraTfTinyWikiQz7(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "title": tfds.features.Text(),
                "text": tfds.features.Text(),
                "paragraphs": tfds.features.Sequence(tfds.features.Text()),
                "id": tfds.features.Scalar(dtype=np.int64),
            }))

        def _split_generators(self, dl_manager):
            del dl_manager  # nothing is downloaded
            return {"train": self._generate_examples(0, NUM_TRAIN),
                    "validation": self._generate_examples(NUM_TRAIN, NUM_VALIDATION)}

        def _generate_examples(self, start, n):
            docs = _documents()
            for i in range(start, start + n):
                yield i, {"title": f"doc {i}", "text": _messy_text(i, docs[i]),
                          "paragraphs": docs[i], "id": i}

    return ElectraTfTinyWikiQz7


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(dataset name, data dir) of the tiny dataset, prepared locally."""
    cls = _builder_cls()
    data_dir = str(tmp_path_factory.mktemp("tfds_data"))
    cls(data_dir=data_dir).download_and_prepare()
    return cls.name, data_dir


def _cfg(name, data_dir, tmp_path, **kw):
    from tfrecord_builder.build import BuildConfig
    args = dict(output_dir=str(tmp_path / "out"), tfds_name=name, tfds_data_dir=data_dir,
                vocab_file=VOCAB, num_shards=2, num_workers=1, chunk_bytes=2048)
    args.update(kw)
    return BuildConfig(**args)


def _split_docs(chunks):
    docs = []
    for chunk in chunks:
        docs.extend(d for d in chunk.data.decode("utf-8").split("\n\n") if d)
    return [d.rstrip("\n") for d in docs]


def test_build_counts_every_token(prepared, tmp_path):
    from tfrecord_builder import build
    from electra_tf.text import Tokenizer, vocab_info
    name, data_dir = prepared
    manifest = build.build(_cfg(name, data_dir, tmp_path))
    lines = [line for doc in _documents()[:NUM_TRAIN] for line in doc]
    flat, _ = Tokenizer(vocab_info(VOCAB)).tokenize(lines)
    assert manifest["corpus_tokens"] == len(flat)
    assert manifest["documents"] == NUM_TRAIN
    assert manifest["retention"] >= 0.99
    assert manifest["inputs"] == [f"tfds:{name}/train"]
    assert manifest["examples"] == sum(s["examples"] for s in manifest["shards"]) > 0
    with open(os.path.join(tmp_path / "out", "manifest.json")) as f:
        assert json.load(f)["build_fingerprint"] == manifest["build_fingerprint"]


def test_build_to_ram_output_dir_equals_local(prepared, tmp_path, monkeypatch):
    """--output_dir on ram:// (as on gs://): the same manifest and shards, byte for byte,
    as the local build, and nothing local named after the URL."""
    import uuid
    import tensorflow as tf
    from tfrecord_builder import build
    name, data_dir = prepared
    local = build.build(_cfg(name, data_dir, tmp_path))
    monkeypatch.chdir(tmp_path)
    out = f"ram://test_tfds_{uuid.uuid4().hex}/out"
    manifest = build.build(_cfg(name, data_dir, tmp_path, output_dir=out))
    assert manifest == local
    names = sorted(n for n in tf.io.gfile.listdir(out))
    assert names == sorted([s["name"] for s in local["shards"]]
                           + ["manifest.json", "token_counts.txt", "vocab.txt"])
    for n in names:
        with tf.io.gfile.GFile(f"{out}/{n}", "rb") as f, open(tmp_path / "out" / n, "rb") as g:
            assert f.read() == g.read(), n
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_chunks_are_ordered_document_aligned_and_deterministic(prepared, tmp_path):
    import tensorflow_datasets as tfds
    name, data_dir = prepared
    cfg = _cfg(name, data_dir, tmp_path)
    source = tfds_source.open_tfds_source(cfg)
    assert source.names == (f"tfds:{name}/train",)
    assert source.sizes == (NUM_TRAIN,)
    fp = source.fingerprint["tfds"]
    assert (fp["name"], fp["split"], fp["text_key"], fp["version"], fp["num_examples"]) == (
        name, "train", "text", "1.0.0", NUM_TRAIN)

    chunks = list(tfds_source.iter_tfds_chunks(cfg))
    assert len(chunks) > 2  # several chunks at chunk_bytes=2048
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert all(c.file_index == 0 and c.path == source.names[0] and not c.split_line
               for c in chunks)
    assert chunks[0].first_line == 0 and chunks[-1].raw_pos == NUM_TRAIN
    for prev, nxt in zip(chunks, chunks[1:]):
        assert nxt.first_line == prev.raw_pos > prev.first_line
    for c in chunks[:-1]:
        assert len(c.data) >= cfg.chunk_bytes
    assert all(not c.data.startswith(b"\n") and c.data.endswith(b"\n") for c in chunks)

    # Records in stored order; each chunk starts with the record `first_line` names.
    builder = tfds.builder(name, data_dir=data_dir)
    ds = builder.as_dataset(split="train", shuffle_files=False,
                            read_config=tfds.ReadConfig(interleave_cycle_length=1))
    ids = [int(ex["id"]) for ex in ds.as_numpy_iterator()]
    docs = _documents()
    assert _split_docs(chunks) == ["\n".join(docs[i]) for i in ids]
    for c in chunks:
        assert c.data.decode("utf-8").split("\n\n")[0] == "\n".join(docs[ids[c.first_line]])

    again = list(tfds_source.iter_tfds_chunks(cfg))
    assert [(c.index, c.data, c.raw_pos) for c in again] == [
        (c.index, c.data, c.raw_pos) for c in chunks]

    # A list-of-strings feature gives the same documents; a slice gives part of them.
    as_list = list(tfds_source.iter_tfds_chunks(_cfg(name, data_dir, tmp_path,
                                                     tfds_text_key="paragraphs")))
    assert [c.data for c in as_list] == [c.data for c in chunks]
    part = _cfg(name, data_dir, tmp_path, tfds_split="validation[:2]")
    assert tfds_source.open_tfds_source(part).sizes == (2,)
    assert len(_split_docs(tfds_source.iter_tfds_chunks(part))) == 2


def _error(cfg) -> str:
    with pytest.raises(BuildError) as e:
        tfds_source.open_tfds_source(cfg)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_errors_name_the_dataset(prepared, tmp_path):
    name, data_dir = prepared
    empty = str(tmp_path / "empty")
    msg = _error(_cfg(name, empty, tmp_path))
    assert name in msg and empty in msg and "not prepared" in msg

    msg = _error(_cfg(name, data_dir, tmp_path, tfds_split="test"))
    assert "test" in msg and name in msg and "train, validation" in msg

    msg = _error(_cfg(name, data_dir, tmp_path, tfds_text_key="body"))
    assert "body" in msg and name in msg
    assert all(k in msg for k in ("text", "title", "paragraphs", "id"))

    msg = _error(_cfg(name, data_dir, tmp_path, tfds_text_key="id"))
    assert "id" in msg and "not text" in msg

    msg = _error(_cfg("electra_tf_no_such_dataset_qz7", data_dir, tmp_path))
    assert "electra_tf_no_such_dataset_qz7" in msg and "no such dataset" in msg

    from tfrecord_builder import build
    with pytest.raises(BuildError, match="body"):
        build.build(_cfg(name, data_dir, tmp_path, tfds_text_key="body"))


def test_missing_tensorflow_datasets(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(BuildError, match=r"needs tensorflow-datasets: pip install -e \.\[tfds\]"):
        tfds_source.open_tfds_source(_cfg("wikipedia/20230601.en", None, tmp_path))


def test_document_bytes_layout():
    assert tfds_source.document_bytes("  a b \n\n\n c\r\nd\u2028e  \n") == b"a b\nc\nd\ne\n"
    assert tfds_source.document_bytes(b" \n \n") == b""
    assert tfds_source.document_bytes(["x\ny", " ", "z"]) == b"x\ny\nz\n"
    # Bad UTF-8 stays, on its own line, for the worker to count and drop.
    assert tfds_source.document_bytes(b"ok\n\xff bad \nfine") == b"ok\n\xff bad\nfine\n"


def test_chunk_documents_bounds_giant_documents():
    line = "word " * 99 + "word"  # 499 bytes
    texts = ["short one", "\n".join([line] * 40), "", "tail doc", "x" * 9000]
    chunks = list(tfds_source.chunk_documents(texts, "tfds:t/train", 1024))
    assert all(len(c.data) <= 4 * 1024 for c in chunks)
    assert b"".join(c.data for c in chunks).replace(b"\n\n", b"\n") == b"".join(
        tfds_source.document_bytes(t) for t in texts)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    raw = [c.raw_pos for c in chunks]
    assert raw == sorted(raw) and raw[-1] == len(texts)
    assert chunks[0].first_line == 0 and chunks[1].first_line == 1
    # The giant line is cut twice (split_line); its rest closes the last chunk.
    assert [c.split_line for c in chunks[-3:]] == [True, True, False]
    assert [c.first_line for c in chunks[-3:]] == [4, 4, 4]
    assert not any(c.split_line for c in chunks[:-3])
