"""What fine-tuning receives from a pre-training checkpoint, and what that network looks like.

For each model given (`--model=NAME=PATH`, repeatable; `PATH` is one of our pre-training
model dirs or checkpoint prefixes, a TF1-named checkpoint such as the official trainer's,
or `random` for a fresh initialisation with the fine-tuning seed), on sentences of a
`sentence<TAB>label` TSV:

1. **Loading**, variable by variable: fine-tuning's encoder is initialised the way
   `run_finetuning.py` does it (`finetune.model.init_encoder`) and each of its variables is
   compared with the checkpoint's array of the same name. Reported: how many are equal,
   differ or are missing, and which checkpoint roots are not loaded (the generator, the
   pre-training heads). With `random` nothing is loaded.
2. **The network, in inference mode**: per layer the RMS of the token states, the mean
   |gamma| and |beta| of its LayerNorms; per attention layer the entropy (normalised by the
   log of the real length) and the share of attention on [CLS] and on [SEP]; for the last
   layer's [CLS] and mean-pooled states, the share of their variance that depends on the
   input (the across-sentence variance over the mean squared norm) and the mean cosine
   between sentences.
3. **Fine-tuning at its first step**: the gradient norm of the classification loss per
   layer, with the fine-tuning head initialised as `run_finetuning.py` does (seed 1).
4. **Linear probes**: a logistic regression on the frozen, standardised [CLS] and
   mean-pooled features of `--train_tsv`, scored on `--dev_tsv`; and the same on the word
   table alone (each sentence the mean of its tokens' embedding rows, no network).

    python experiments/transfer_diagnostics.py --model=random=random \\
        --model=ours=runs/pretrain_tiny --config=tiny \\
        --train_tsv=DATA/polarity/train.tsv --dev_tsv=DATA/polarity/dev.tsv --out=diag.json
"""

import argparse
import json
import math
import os
import re
import sys
from typing import Dict, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import electra_tf  # noqa: E402,F401  (first: the version check)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from electra_tf import configs  # noqa: E402
from electra_tf.conversion import source  # noqa: E402
from electra_tf.finetune.model import FinetuningModel, init_encoder, make_head  # noqa: E402
from electra_tf.text import TextEncoder  # noqa: E402
from electra_tf.model.modeling import attention_bias  # noqa: E402


def read_tsv(path: str, limit: int = 0) -> Tuple[List[str], np.ndarray]:
    with tf.io.gfile.GFile(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    rows = rows[:limit] if limit else rows
    return [r[0] for r in rows], np.array([int(r[1]) for r in rows], np.int32)


def checkpoint_arrays(path: str, config: configs.ModelConfig) -> Dict[str, np.ndarray]:
    """{TF1 name: array} of everything in the checkpoint (conversion.source: TF1 files and
    our training checkpoints alike)."""
    return source.resolve(path, config).arrays()


def loading_report(model: FinetuningModel, arrays: Dict[str, np.ndarray]) -> Dict:
    equal, differ, missing = [], [], []
    for v in model.electra.trainable_variables:
        if v.path not in arrays:
            missing.append(v.path)
        elif np.array_equal(v.numpy(), arrays[v.path]):
            equal.append(v.path)
        else:
            differ.append(v.path)
    loaded = set(equal) | set(differ)
    # Optimizer slots and the step counter of a TF1 training checkpoint are not weights.
    weights = [n for n in arrays if not re.search(r"adam_[mv]$|global_step$", n)]
    not_loaded = sorted({n.split("/")[0] for n in weights if n not in loaded})
    return {"encoder_variables": len(model.electra.trainable_variables), "equal": len(equal),
            "differ": differ, "missing": missing, "checkpoint_roots_not_loaded": not_loaded,
            "checkpoint_weights": len(weights)}


def forward_stats(encoder, batch) -> Dict:
    """Inference-mode forward pass of `encoder` block by block, with the statistics."""
    ids, mask, seg = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    maskf = tf.cast(mask, tf.float32)
    real = tf.reduce_sum(maskf)

    def rms(x):  # over real tokens
        sq = tf.reduce_mean(tf.square(tf.cast(x, tf.float32)), -1)
        return float(tf.sqrt(tf.reduce_sum(sq * maskf) / real))

    x = encoder.embeddings(ids, seg)
    layers = [{"layer": "embeddings", "rms": rms(x),
               "ln_gamma": float(tf.reduce_mean(tf.abs(encoder.embeddings.layer_norm.gamma))),
               "ln_beta": float(tf.reduce_mean(tf.abs(encoder.embeddings.layer_norm.beta)))}]
    if encoder.embeddings_project is not None:
        x = encoder.embeddings_project(x)
        layers.append({"layer": "embeddings_project", "rms": rms(x)})
    length = tf.reduce_sum(maskf, 1)  # [B]
    is_cls = tf.cast(tf.equal(tf.range(tf.shape(ids)[1])[None], 0), tf.float32)
    is_sep = tf.one_hot(tf.cast(length, tf.int32) - 1, tf.shape(ids)[1])
    for i, block in enumerate(encoder.blocks):
        bsz, seq_len = tf.shape(x)[0], tf.shape(x)[1]
        q = block._split_heads(block.query(x), bsz, seq_len) / math.sqrt(block.head_size)
        k = block._split_heads(block.key(x), bsz, seq_len)
        probs = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) + attention_bias(mask), -1)
        ent = -tf.reduce_sum(probs * tf.math.log(probs + 1e-12), -1)  # [B, N, L]
        norm_ent = ent / tf.math.log(tf.maximum(length, 2.0))[:, None, None]
        qmask = maskf[:, None, :]
        mean_q = lambda t: float(tf.reduce_sum(t * qmask) / (real * block.num_heads))
        on_cls = tf.reduce_sum(probs * is_cls[:, None, None, :], -1)
        on_sep = tf.reduce_sum(probs * is_sep[:, None, None, :], -1)
        y = block(x, mask, training=False)
        layers.append({
            "layer": f"layer_{i}", "rms": rms(y),
            "attention_entropy": mean_q(norm_ent), "attention_on_cls": mean_q(on_cls),
            "attention_on_sep": mean_q(on_sep),
            "cls_attention_entropy": float(tf.reduce_mean(norm_ent[:, :, 0])),
            "ln_gamma_attention": float(tf.reduce_mean(tf.abs(block.attention_layer_norm.gamma))),
            "ln_gamma_output": float(tf.reduce_mean(tf.abs(block.output_layer_norm.gamma))),
            "ln_beta_output": float(tf.reduce_mean(tf.abs(block.output_layer_norm.beta))),
            "max_abs_qk_logit": float(tf.reduce_max(tf.abs(tf.matmul(q, k, transpose_b=True)))),
        })
        x = y
    return {"layers": layers, "final": x}


def input_dependence(features: np.ndarray) -> Dict:
    """Share of the squared norm that varies across sentences, and the mean cosine."""
    centered = features - features.mean(0, keepdims=True)
    share = float((centered ** 2).sum(1).mean() / (features ** 2).sum(1).mean())
    unit = features / np.linalg.norm(features, axis=1, keepdims=True)
    cos = unit @ unit.T
    n = len(features)
    return {"input_dependent_share": share,
            "mean_cosine": float((cos.sum() - n) / (n * (n - 1)))}


def features(encoder, batch) -> Tuple[np.ndarray, np.ndarray]:
    hidden = encoder(batch["input_ids"], batch["input_mask"], batch["segment_ids"]).numpy()
    m = batch["input_mask"].numpy()[..., None].astype(np.float32)
    return hidden[:, 0], (hidden * m).sum(1) / m.sum(1)


def word_table_features(encoder, batch) -> np.ndarray:
    """Each sentence as the mean of its tokens' rows of the word-embedding table (no
    network): what the table alone says about a sentence."""
    table = encoder.embeddings.word_embeddings.numpy()
    ids, mask = batch["input_ids"].numpy(), batch["input_mask"].numpy().astype(np.float32)
    return (table[ids] * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)


def probe(train_x, train_y, dev_x, dev_y) -> float:
    from sklearn.linear_model import LogisticRegression
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    clf = LogisticRegression(max_iter=2000).fit((train_x - mu) / sd, train_y)
    return float(clf.score((dev_x - mu) / sd, dev_y))


def head_gradients(model: FinetuningModel, batch, labels) -> Dict[str, float]:
    with tf.GradientTape() as tape:
        logits = model(batch, training=False)["logits"]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    grads = tape.gradient(loss, model.trainable_variables)
    groups: Dict[str, float] = {}
    for v, g in zip(model.trainable_variables, grads):
        parts = v.path.split("/")
        key = parts[2] if len(parts) > 2 and parts[1] == "encoder" else parts[1] \
            if parts[0] == "electra" else "head"
        groups[key] = groups.get(key, 0.0) + float(tf.reduce_sum(tf.square(g)))
    out = {k: math.sqrt(s) for k, s in groups.items()}
    out["loss"] = float(loss)
    return out


def diagnose(name: str, path: str, config: configs.ModelConfig, data: Dict) -> Dict:
    keras.utils.set_random_seed(1)
    model = FinetuningModel(config, make_head("classification", config, 2))
    report: Dict = {"name": name, "path": path}
    if path != "random":
        init_encoder(model.electra, path)
        report["loading"] = loading_report(model, checkpoint_arrays(path, config))
    stats = forward_stats(model.electra, data["dev_batch"])
    report["layers"] = stats["layers"]
    cls, mean = features(model.electra, data["dev_batch"])
    report["cls"] = input_dependence(cls)
    report["mean_pooled"] = input_dependence(mean)
    report["first_step_gradients"] = head_gradients(model, data["train_batch"],
                                                    data["train_labels"][:64])
    tr_cls, tr_mean = features(model.electra, data["train_all"])
    dv_cls, dv_mean = features(model.electra, data["dev_all"])
    report["probe_cls"] = probe(tr_cls, data["train_labels"], dv_cls, data["dev_labels"])
    report["probe_mean"] = probe(tr_mean, data["train_labels"], dv_mean, data["dev_labels"])
    report["probe_word_table"] = probe(
        word_table_features(model.electra, data["train_all"]), data["train_labels"],
        word_table_features(model.electra, data["dev_all"]), data["dev_labels"])
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, help="NAME=PATH or NAME=random")
    p.add_argument("--config", default="tiny", help="Model preset or JSON (every model)")
    p.add_argument("--train_tsv", required=True)
    p.add_argument("--dev_tsv", required=True)
    p.add_argument("--vocab_file", default=os.path.join(REPO, "data", "vocab",
                                                        "bert_uncased_vocab.txt"))
    p.add_argument("--max_seq_length", type=int, default=64)
    p.add_argument("--num_stats", type=int, default=512, help="Dev sentences for the stats")
    p.add_argument("--out", default=None, help="Write the reports as JSON here")
    args = p.parse_args(argv)
    config = configs.load_config(args.config).model
    text = TextEncoder(args.vocab_file)
    train_s, train_y = read_tsv(args.train_tsv)
    dev_s, dev_y = read_tsv(args.dev_tsv)
    enc = lambda s: {k: tf.constant(v) for k, v in
                     text.encode_numpy(s, max_seq_length=args.max_seq_length).items()}
    data = {"train_all": enc(train_s), "dev_all": enc(dev_s), "train_labels": train_y,
            "dev_labels": dev_y, "dev_batch": enc(dev_s[:args.num_stats]),
            "train_batch": enc(train_s[:64])}
    reports = []
    for spec in args.model:
        name, _, path = spec.partition("=")
        reports.append(diagnose(name, path, config, data))
        print(json.dumps(reports[-1], indent=1), flush=True)
    if args.out:
        with tf.io.gfile.GFile(args.out, "w") as f:
            f.write(json.dumps(reports, indent=1) + "\n")


if __name__ == "__main__":
    main()
