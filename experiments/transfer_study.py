"""Does pre-training help a few-label task at this machine's compute? (issue 30)

One task, fine-tuned the same way from every starting point: `--num_labels` sentences (a
seeded sample of the movie-snippets training split, `experiments/movie_snippets.py`) and
its 2,000-sentence dev set, `--seeds` fine-tuning seeds, `--epochs` epochs at length 64,
the default recipe (lr 3e-4, layer-wise decay 0.8). The starting points (`SETTINGS`):
random initialisation, and tiny-preset pre-trainings that vary what a user can vary:
learning rate, steps, corpus (the task's own text, the bundled Wikipedia sample, both),
the objective (ELECTRA or BERT's MLM) and the discriminator's loss weight. A setting with
several `points` fine-tunes the checkpoints its one run saved at those steps (the budget
curve).

    python experiments/movie_snippets.py --out_dir=cache/movie_snippets
    python experiments/transfer_study.py --data_dir=cache/movie_snippets    # every setting
    python experiments/transfer_study.py ... --settings=none,electra_lr3e-4  # some
    python experiments/transfer_study.py ... --report_only                  # the table

Writes OUT (`--out_dir`, default experiments/results/transfer_movies_500): `report.md`
(the table: each row's pre-training steps, minutes, train FLOPs, final training metrics,
the starting network's attention entropy, the dev accuracy of every seed with its mean and
range, and where the seeds stand against the no-pre-training row), `results.json`, and
under OUT/work (not committed) the data, runs and logs. Finished jobs leave DONE.json and
are skipped by a rerun; trial checkpoints are deleted once scored.
"""

import collections
import os
import random
import re
import statistics
import sys
import time
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import electra_tf  # noqa: E402,F401  (first: the version check)

from electra_tf import configs, fileio  # noqa: E402
from electra_tf.pretraining import flops  # noqa: E402


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # experiments/, not a package
import compute_matched as _cm  # noqa: E402  (its job runner, markers, parser, machine line)

ExperimentError = _cm.ExperimentError
run_logged, last_error, read_json, machine = (_cm.run_logged, _cm.last_error, _cm.read_json,
                                              _cm.machine)

PRESET = "tiny"
MAX_SEQ_LENGTH = 64
DONE = "DONE.json"
LR = "optimizer.learning_rate"
BERT = {"objective.objective": "mlm", "objective.mask_token_prob": "0.8",
        "objective.random_token_prob": "0.1"}
# Encoder shapes at about the train FLOPs of the tiny preset (128 wide, 2 layers): at length
# 64 the 30,522-word output layers dominate a step, so twice the width costs 1.33x per step
# (1,500 steps match 2,000) and a narrow deep encoder (64 wide, 8 layers) 1.01x (2,000).
WIDE = {"model.hidden_size": "256", "model.num_attention_heads": "4",
        "model.intermediate_size": "1024"}
NARROW = {"model.hidden_size": "64", "model.num_hidden_layers": "8",
          "model.num_attention_heads": "2", "model.intermediate_size": "256"}

# name -> corpus (`CORPORA`: movies, the task's training text, 8,568 sentences, labels
# unused; wiki, the bundled Wikipedia sample; both; all, those and the two public-domain
# npm corpora of `npm_corpus.py`), config overrides, steps, the steps fine-tuned.
# vocab: None, BERT's uncased 30,522 pieces; N, a lower-cased WordPiece vocabulary of N pieces
# that the builder learns from the task's training text (`learned_vocab`), the model's
# tables sized to it, and the fine-tuning task and every corpus tokenised with it.
Setting = collections.namedtuple("Setting", "corpus overrides steps points what vocab",
                                 defaults=(None,))
SETTINGS = collections.OrderedDict([
    ("none", Setting(None, {}, 0, [0], "no pre-training (random initialisation)")),
    ("electra_preset", Setting("movies", {}, 2000, [2000],
                               "ELECTRA, the tiny preset (lr 1e-3)")),
    ("electra_preset_seed2", Setting("movies", {"train.seed": "2"}, 2000, [2000],
                                     "as electra_preset, pre-training seed 2")),
    ("electra_preset_official_masking", Setting(
        "movies", {"objective.mask_with_replacement": "true"}, 2000, [2000],
        "as electra_preset, the official masked-position draw (with replacement)")),
    ("electra_lr3e-4", Setting("movies", {LR: "3e-4"}, 6000, [250, 500, 1000, 2000, 4000, 6000],
                               "ELECTRA, lr 3e-4")),
    ("bert_mlm_preset", Setting("movies", dict(BERT), 2000, [1000, 2000],
                                "BERT's MLM, the preset (lr 1e-3)")),
    ("bert_mlm_lr3e-4_6k", Setting("movies", dict(BERT, **{LR: "3e-4"}), 6000, [3000, 6000],
                                   "BERT's MLM, lr 3e-4, 6,000 steps")),
    ("bert_mlm_lr3e-4", Setting("movies", dict(BERT, **{LR: "3e-4"}), 2000, [1000, 2000],
                                "BERT's MLM, lr 3e-4")),
    ("electra_gen0.25", Setting("movies", {"model.generator_hidden_size": "0.25"}, 2000,
                                [2000], "ELECTRA, a generator 1/4 of the discriminator's "
                                "width (the paper's Small)")),
    ("electra_unigram", Setting("movies", {"objective.generator": "unigram"}, 2000, [2000],
                                "replaced-token detection against unigram samples (no "
                                "generator)")),
    ("electra_lr3e-4_wiki", Setting("wiki", {LR: "3e-4"}, 2000, [2000],
                                    "ELECTRA, lr 3e-4, Wikipedia sample")),
    ("electra_lr1e-3_warmup1k", Setting("movies", {LR: "1e-3", "optimizer.warmup_steps": "1000"},
                                        2000, [2000], "ELECTRA, lr 1e-3, warm-up 1,000 steps")),
    ("electra_disc10", Setting("movies", {LR: "3e-4", "objective.disc_weight": "10"}, 2000,
                               [2000], "ELECTRA, lr 3e-4, discriminator weight 10")),
    ("electra_lr1e-4", Setting("movies", {LR: "1e-4"}, 2000, [2000], "ELECTRA, lr 1e-4")),
    ("electra_lr3e-4_both", Setting("both", {LR: "3e-4"}, 2000, [2000],
                                    "ELECTRA, lr 3e-4, task text + Wikipedia sample")),
    ("none_wide", Setting(None, dict(WIDE), 0, [0],
                          "no pre-training, encoder 256 wide (4 heads, FFN 1,024), 2 layers")),
    ("electra_wide_lr3e-4", Setting("movies", dict(WIDE, **{LR: "3e-4"}), 1500, [1500],
                                    "ELECTRA, lr 3e-4, encoder 256 wide, 2 layers: the "
                                    "FLOPs of 2,000 tiny steps")),
    # Learned vocabularies (issue 49). At length 64 a 4,096-piece vocabulary cuts a tiny
    # step's matmul FLOPs (hardware convention) by 1.39x against 30,522 pieces, and its
    # FLOPs in the paper's convention (lookups as one-hot matmuls) by 4.2x: 2,000 tiny steps
    # are matched by 2,790 steps in the first and by 8,330 in the second. The points span both.
    ("none_wp4k", Setting(None, {}, 0, [0], "no pre-training, a 4,096-piece WordPiece "
                          "vocabulary learned from the task's text", vocab=4096)),
    ("electra_wp4k_lr3e-4", Setting("movies", {LR: "3e-4"}, 8000, [1000, 2000, 3000, 4000,
                                                                    8000],
                                    "ELECTRA, lr 3e-4, the 4,096-piece learned vocabulary",
                                    vocab=4096)),
    ("none_wp2k", Setting(None, {}, 0, [0], "no pre-training, a 2,048-piece WordPiece "
                          "vocabulary learned from the task's text", vocab=2048)),
    ("electra_wp2k_lr3e-4", Setting("movies", {LR: "3e-4"}, 4000, [1000, 2000, 4000],
                                    "ELECTRA, lr 3e-4, the 2,048-piece learned vocabulary",
                                    vocab=2048)),
    ("none_wp8k", Setting(None, {}, 0, [0], "no pre-training, an 8,192-piece WordPiece "
                          "vocabulary learned from the task's text", vocab=8192)),
    ("electra_wp8k_lr3e-4", Setting("movies", {LR: "3e-4"}, 2000, [1000, 2000],
                                    "ELECTRA, lr 3e-4, the 8,192-piece learned vocabulary",
                                    vocab=8192)),
    ("bert_mlm_wp4k_lr3e-4", Setting("movies", dict(BERT, **{LR: "3e-4"}), 3000,
                                     [1000, 2000, 3000],
                                     "BERT's MLM, lr 3e-4, the 4,096-piece learned vocabulary",
                                     vocab=4096)),
    # Corpus size at the learned 4,096 pieces (issue 49): the task's text (the rows of
    # electra_wp4k_lr3e-4, ~150k words), with the Wikipedia sample (~0.57 M words), and
    # with the State of the Union addresses and Moby Dick besides (~2.6 M words).
    ("electra_wp4k_lr3e-4_both", Setting("both", {LR: "3e-4"}, 4000, [1000, 2000, 4000],
                                         "ELECTRA, lr 3e-4, learned 4,096, task text + "
                                         "Wikipedia sample", vocab=4096)),
    ("electra_wp4k_lr3e-4_all", Setting("all", {LR: "3e-4"}, 4000, [1000, 2000, 4000],
                                        "ELECTRA, lr 3e-4, learned 4,096, task text + "
                                        "Wikipedia + npm corpora", vocab=4096)),
    ("electra_wp4k_lr3e-4_all_8k", Setting("all", {LR: "3e-4"}, 8000, [4000, 8000],
                                           "ELECTRA, lr 3e-4, learned 4,096, task text + "
                                           "Wikipedia + npm corpora, 8,000 steps",
                                           vocab=4096)),
    ("bert_mlm_wp4k_lr3e-4_all", Setting("all", dict(BERT, **{LR: "3e-4"}), 4000,
                                         [1000, 2000, 4000],
                                         "BERT's MLM, lr 3e-4, learned 4,096, task text + "
                                         "Wikipedia + npm corpora", vocab=4096)),
    # The decisive rows again from a second pre-training seed (the same text, vocabulary
    # and fine-tuning seeds): how much of a row's distance from no pre-training is the draw
    # of one pre-training run.
    ("electra_wp4k_lr3e-4_all_seed2", Setting("all", {LR: "3e-4", "train.seed": "2"}, 4000,
                                              [1000, 2000, 4000],
                                              "as electra_wp4k_lr3e-4_all, pre-training "
                                              "seed 2", vocab=4096)),
    ("bert_mlm_wp4k_lr3e-4_all_seed2", Setting("all", dict(BERT, **{LR: "3e-4",
                                                                    "train.seed": "2"}),
                                               4000, [1000, 2000, 4000],
                                               "as bert_mlm_wp4k_lr3e-4_all, pre-training "
                                               "seed 2", vocab=4096)),
    ("none_narrow", Setting(None, dict(NARROW), 0, [0],
                            "no pre-training, encoder 64 wide (2 heads, FFN 256), 8 layers")),
    ("electra_narrow_lr3e-4", Setting("movies", dict(NARROW, **{LR: "3e-4"}), 2000, [2000],
                                      "ELECTRA, lr 3e-4, encoder 64 wide, 8 layers: the "
                                      "FLOPs of 2,000 tiny steps")),
])


def check_setting(name: str, s: Setting):
    """A setting's points are saved by one run: each a multiple of the first (the
    checkpoint interval) and none past its steps; its overrides are valid config keys; its
    corpus is one of `CORPORA`."""
    if s.corpus is not None and s.corpus not in CORPORA:
        raise ExperimentError(f"{name}: corpus {s.corpus!r}: expected one of "
                              f"{', '.join(CORPORA)}")
    if s.steps == 0:
        if s.points != [0] or s.corpus is not None:
            raise ExperimentError(f"{name}: a setting without pre-training has points [0]")
        if any(not k.startswith("model.") for k in s.overrides):
            raise ExperimentError(f"{name}: a setting without pre-training overrides only "
                                  "model.* keys (the shape it initialises)")
        return
    if any(p % min(s.points) or p > s.steps for p in s.points):
        raise ExperimentError(f"{name}: points {s.points} must be multiples of "
                              f"{min(s.points)} and at most {s.steps}")
    try:
        configs.load_config(PRESET, dict(s.overrides))
    except configs.ConfigError as e:
        raise ExperimentError(f"{name}: {e}") from None


def parse_args(argv):
    p = _cm._Parser(description=__doc__.splitlines()[0])
    p.add_argument("--data_dir", default="cache/movie_snippets",
                   help="experiments/movie_snippets.py's output (polarity/{train,dev}.tsv)")
    p.add_argument("--out_dir", default=os.path.join(REPO, "experiments", "results",
                                                     "transfer_movies_500"))
    p.add_argument("--work_dir", default=None, help="Data, runs and logs (default OUT/work)")
    p.add_argument("--npm_dir", default="cache/npm",
                   help="experiments/npm_corpus.py's output (sotu.txt, moby_dick.txt), read "
                   "by the settings whose corpus is `all`")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--num_labels", type=int, default=500)
    p.add_argument("--label_seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--report_only", action="store_true")
    p.add_argument("--compare", default="",
                   help="results.json files of earlier runs of this script whose rows the "
                   "plot shows beside this run's (e.g. the BERT-vocabulary study)")
    p.add_argument("--plot_settings", default="none,electra_lr3e-4,bert_mlm_lr3e-4_6k,"
                   "bert_mlm_lr3e-4,none_wp4k,electra_wp4k_lr3e-4,bert_mlm_wp4k_lr3e-4,none_wp2k,"
                   "electra_wp2k_lr3e-4",
                   help="the settings the plot draws (the table has them all)")
    args = p.parse_args(argv)
    args.work_dir = args.work_dir or os.path.join(args.out_dir, "work")
    unknown = [s for s in args.settings.split(",") if s not in SETTINGS]
    if unknown:
        p.error(f"--settings: unknown {unknown}; known: {', '.join(SETTINGS)}")
    for name in args.settings.split(","):
        check_setting(name, SETTINGS[name])
    return args


def few_label_task(args) -> str:
    """WORK/task/polarity/{train,dev}.tsv: `num_labels` seeded training rows, the whole dev."""
    task = os.path.join(args.work_dir, "task")
    train_out = os.path.join(task, "polarity", "train.tsv")
    if fileio.exists(train_out):
        return task
    lines = fileio.read_bytes(os.path.join(args.data_dir, "polarity", "train.tsv")) \
        .decode("utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    if args.num_labels > len(rows):
        raise ExperimentError(f"--num_labels={args.num_labels}: the training split has "
                              f"{len(rows)} rows")
    sample = random.Random(args.label_seed).sample(rows, args.num_labels)
    fileio.makedirs(os.path.join(task, "polarity"))
    dev = fileio.read_bytes(os.path.join(args.data_dir, "polarity", "dev.tsv"))
    fileio.write_atomic(os.path.join(task, "polarity", "dev.tsv"), dev)
    fileio.write_atomic(train_out, "\n".join([header] + sample) + "\n")
    return task


def corpus_data(args, corpus: str, vocab: Optional[int] = None) -> str:
    """--train_data for `corpus` (tokenised with the learned `vocab`, if any), built at
    length 64 on first use."""
    return ",".join(_build(args, part, vocab) for part in CORPORA[corpus])


CORPORA = {"movies": ["movies"], "wiki": ["wiki"], "both": ["movies", "wiki"],
           "all": ["movies", "wiki", "sotu", "moby_dick"]}
NPM_CORPORA = ("sotu", "moby_dick")  # written by npm_corpus.py into --npm_dir


def movies_text(args) -> str:
    """WORK/data/movies_train.txt: the training split's sentences, labels dropped."""
    text = os.path.join(args.work_dir, "data", "movies_train.txt")
    if not fileio.exists(text):
        fileio.makedirs(os.path.dirname(text))
        rows = fileio.read_bytes(os.path.join(args.data_dir, "polarity", "train.tsv")) \
            .decode("utf-8").splitlines()[1:]
        fileio.write_atomic(text, "\n".join(r.split("\t")[0] for r in rows) + "\n")
    return text


def learned_vocab(args, size: int):
    """(vocab.txt, its number of pieces): a lower-cased WordPiece vocabulary of about `size`
    pieces learned by the builder from the task's training text, on first use."""
    path = os.path.join(args.work_dir, "vocab", f"wordpiece{size}", "vocab.txt")
    if not fileio.exists(path):
        cmd = [sys.executable, "-m", "tfrecord_builder", "learn_vocab",
               f"--input={movies_text(args)}", f"--vocab_size={size}",
               f"--vocab_output={path}", "--do_lower_case"]
        if run_logged(cmd, os.path.join(args.work_dir, "logs", f"vocab_{size}.log")):
            raise ExperimentError(f"learning a {size}-piece vocabulary failed (log: "
                                  f"{args.work_dir}/logs)")
    pieces = len(fileio.read_bytes(path).decode("utf-8").splitlines())
    return path, pieces


def _build(args, part: str, vocab: Optional[int] = None) -> str:
    suffix = f"-wp{vocab}" if vocab else ""
    out = os.path.join(args.work_dir, "data", f"{part}-seq{MAX_SEQ_LENGTH}{suffix}")
    if fileio.exists(os.path.join(out, "manifest.json")):
        return out
    cmd = [sys.executable, "-m", "tfrecord_builder", "build", f"--output_dir={out}",
           f"--max_seq_length={MAX_SEQ_LENGTH}", "--num_shards=4"]
    if vocab:
        cmd.append(f"--vocab_file={learned_vocab(args, vocab)[0]}")
    if part == "movies":
        cmd.append(f"--input={movies_text(args)}")
    elif part in NPM_CORPORA:
        text = os.path.join(args.npm_dir, f"{part}.txt")
        if not fileio.exists(text):
            raise ExperimentError(f"--npm_dir={args.npm_dir}: no {part}.txt (write it with "
                                  f"python experiments/npm_corpus.py --corpus={part} "
                                  f"--out_dir={args.npm_dir})")
        cmd.append(f"--input={text}")
    if run_logged(cmd, os.path.join(args.work_dir, "logs", f"build_{part}{suffix}.log")):
        raise ExperimentError(f"building {out} failed (log: {args.work_dir}/logs)")
    return out


def vocab_overrides(args, s: Setting) -> Dict[str, str]:
    """The model's vocab_size for a setting's vocabulary ({} for BERT's)."""
    return {} if s.vocab is None else {"model.vocab_size": str(learned_vocab(args, s.vocab)[1])}


LOG_LINE = re.compile(r"step (\d+)/(\d+) \| loss ([\d.]+)(.*)")


def last_metrics(log_path: str, step: Optional[int] = None) -> Dict[str, float]:
    """The metrics of the last `step N/M | loss ...` line of a training log (with `step`:
    of the last line at that step)."""
    try:
        text = fileio.read_bytes(log_path).decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001  (a missing log: no metrics)
        return {}
    found: Dict[str, float] = {}
    for line in text.splitlines():
        m = LOG_LINE.search(line)
        if m and (step is None or int(m.group(1)) == step):
            found = {"step": int(m.group(1)), "loss": float(m.group(3))}
            for key, value in re.findall(r"(\w+) (-?[\d.]+(?:e-?\d+)?)\b", m.group(4)):
                if key in ("mlm_loss", "mlm_acc", "disc_loss", "disc_acc", "disc_auc",
                           "main_lm_loss", "main_lm_acc"):  # main_lm_*: BERT's MLM
                    found[key] = float(value)
    return found


def trial_losses(log_path: str) -> List[float]:
    """Each fine-tuning trial's training loss at its last logged step."""
    losses, last = [], None
    try:
        text = fileio.read_bytes(log_path).decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001
        return []
    for line in text.splitlines():
        m = LOG_LINE.search(line)
        if m:
            last = (int(m.group(1)), int(m.group(2)), float(m.group(3)))
            if last[0] == last[1]:
                losses.append(last[2])
    return losses


def pretrain(args, name: str, s: Setting) -> Optional[dict]:
    run = os.path.join(args.work_dir, "pretrain", name)
    marker = read_json(os.path.join(run, DONE))
    if marker:
        return marker
    overrides = dict(s.overrides, **vocab_overrides(args, s))
    overrides.update({"train.num_train_steps": str(s.steps),
                      "train.max_seq_length": str(MAX_SEQ_LENGTH),
                      "train.save_checkpoints_steps": str(min(s.points)),
                      "train.keep_checkpoint_max": "100"})
    cmd = [sys.executable, os.path.join(REPO, "run_pretraining.py"), f"--config={PRESET}",
           f"--model_dir={run}", f"--train_data={corpus_data(args, s.corpus, s.vocab)}",
           "--params_override=" + ",".join(f"{k}={v}" for k, v in overrides.items())]
    log = os.path.join(args.work_dir, "logs", f"pretrain_{name}.log")
    print(f"transfer_study: pre-training {name} ({s.steps} steps) ...", flush=True)
    t0 = time.monotonic()
    rc = run_logged(cmd, log)
    if rc:
        print(f"transfer_study: {name}: FAILED: {last_error(log)}", flush=True)
        return None
    cfg = configs.load_config(PRESET, dict(overrides))
    marker = {"seconds": time.monotonic() - t0, "metrics": last_metrics(log),
              "train_flops_per_step": flops.count_config(cfg, flops.PAPER).train_per_step()["total"],
              "hardware_flops_per_step": flops.count_config(
                  cfg, flops.HARDWARE).train_per_step()["total"],
              "overrides": overrides, "corpus": s.corpus, "vocab": s.vocab}
    fileio.write_json_atomic(os.path.join(run, DONE), marker, sort_keys=True)
    return marker


def random_init_config(args, name: str) -> str:
    """--config for a randomly initialised start: the preset, or with a setting's model.*
    overrides a JSON of that shape under WORK/configs."""
    overrides = dict(SETTINGS[name].overrides, **vocab_overrides(args, SETTINGS[name]))
    if not overrides:
        return PRESET
    fileio.makedirs(os.path.join(args.work_dir, "configs"))
    path = os.path.join(args.work_dir, "configs", f"{name}.json")
    fileio.write_json_atomic(path, configs.load_config(PRESET, dict(overrides)).to_json())
    return path


def finetune(args, name: str, step: int) -> Optional[dict]:
    out = os.path.join(args.work_dir, "finetune", name, f"step{step}")
    marker = read_json(os.path.join(out, DONE))
    if marker:
        return marker
    init = ["--init_checkpoint=none", f"--config={random_init_config(args, name)}"] \
        if step == 0 else [
            "--init_checkpoint=" + os.path.join(args.work_dir, "pretrain", name, f"ckpt-{step}")]
    cmd = [sys.executable, os.path.join(REPO, "run_finetuning.py"), "--task=polarity",
           f"--data_dir={few_label_task(args)}", f"--model_dir={out}",
           f"--num_trials={args.seeds}", f"--num_train_epochs={args.epochs}",
           f"--max_seq_length={MAX_SEQ_LENGTH}"] + init
    if SETTINGS[name].vocab is not None:  # the task tokenised as the model was trained
        cmd.append(f"--vocab_file={learned_vocab(args, SETTINGS[name].vocab)[0]}")
    log = os.path.join(args.work_dir, "logs", f"finetune_{name}_step{step}.log")
    print(f"transfer_study: fine-tuning {name} step {step} ...", flush=True)
    t0 = time.monotonic()
    rc = run_logged(cmd, log)
    results = read_json(os.path.join(out, "results.json"))
    if rc or not results:
        print(f"transfer_study: {name} step {step}: FAILED: {last_error(log)}", flush=True)
        return None
    marker = {"seconds": time.monotonic() - t0, "scores": results["scores"],
              "train_losses": trial_losses(log)}
    fileio.write_json_atomic(os.path.join(out, DONE), marker, sort_keys=True)
    _cm.drop_trial_checkpoints(out)
    return marker


def baseline_of(name: str) -> str:
    """The no-pre-training setting a row is judged against: the one of the same encoder
    shape (the same model.* overrides), else `none`."""
    shape = {k: v for k, v in SETTINGS[name].overrides.items() if k.startswith("model.")}
    vocab = SETTINGS[name].vocab
    return next((n for n, s in SETTINGS.items()
                 if s.steps == 0 and s.overrides == shape and s.vocab == vocab), "none")


def collect(args) -> Dict:
    rows = []
    for name, s in SETTINGS.items():
        pm = read_json(os.path.join(args.work_dir, "pretrain", name, DONE)) or {}
        for step in s.points:
            fm = read_json(os.path.join(args.work_dir, "finetune", name, f"step{step}", DONE))
            if not fm:
                continue
            per_step = pm.get("train_flops_per_step", 0.0)
            log = os.path.join(args.work_dir, "logs", f"pretrain_{name}.log")
            at_point = last_metrics(log, step) if step else {}
            rows.append({"setting": name, "what": s.what, "corpus": s.corpus, "step": step,
                         "baseline": baseline_of(name), "vocab": s.vocab,
                         "hardware_flops": pm.get("hardware_flops_per_step", 0.0) * step,
                         "pretrain_steps": s.steps, "pretrain_seconds": pm.get("seconds"),
                         "flops": per_step * step, "final_metrics": at_point,
                         "scores": fm["scores"], "train_losses": fm.get("train_losses", [])})
    return {"rows": rows, "num_labels": args.num_labels, "seeds": args.seeds,
            "epochs": args.epochs}


def render(results: Dict, command: str) -> str:
    rows = results["rows"]
    scores = {r["setting"]: r["scores"] for r in rows if r["step"] == 0}
    out = ["# Few-label transfer: does pre-training help at this compute?", "",
           f"Command: `{command}`", "", f"Machine: {machine()}", "",
           f"Task: {results['num_labels']} labelled movie snippets, 2,000-sentence dev set "
           f"(majority 0.5125), {results['epochs']} epochs at length {MAX_SEQ_LENGTH}, "
           f"{results['seeds']} fine-tuning seeds, lr 3e-4, layer-wise decay 0.8.", "",
           "Pre-training wall times are left out: the 2-core machine ran several jobs at once "
           "and some were paused.", "",
           "| setting | corpus | vocabulary | step | train FLOPs (paper / matmul) "
           "| pre-training at that step: disc AUC / MLM acc "
           "| fine-tuning train loss | dev accuracy: mean (min-max) | vs no pre-training "
           "of its shape |",
           "|---|---|---|---:|---:|---|---|---|---|"]
    for r in rows:
        m = r["final_metrics"]
        sc = r["scores"]
        mean = statistics.fmean(sc)
        base = r.get("baseline", "none")
        vs = "—" if r["step"] == 0 or base not in scores else \
            f"{_cm.separation(sc, scores[base])} ({base})"
        auc = f"{m['disc_auc']:.3f}" if "disc_auc" in m else "—"
        acc = m.get("mlm_acc", m.get("main_lm_acc"))
        intr = "—" if not m else f"{auc} / " + ("—" if acc is None else f"{acc:.3f}")
        losses = ", ".join(f"{x:.3f}" for x in r["train_losses"]) or "—"
        vocab = "BERT 30,522" if r.get("vocab") is None else f"learned {r['vocab']:,}"
        hw = f"{r['hardware_flops']:.2e}" if r.get("hardware_flops") else "—"
        out.append(f"| {r['setting']}: {r['what']} | {r['corpus'] or '—'} | {vocab} | "
                   f"{r['step']} | {r['flops']:.2e} / {hw} | {intr} | {losses} | "
                   f"{mean:.4f} ({min(sc):.4f}-{max(sc):.4f}) | {vs} |")
    return "\n".join(out) + "\n"


def matmul_flops(row: Dict) -> float:
    """A row's pre-training FLOPs in the hardware convention (matmuls only): its own count,
    or, for rows of runs made before it was recorded, the setting's config's."""
    if row.get("hardware_flops") or not row["step"]:
        return row.get("hardware_flops", 0.0)
    s = SETTINGS[row["setting"]]
    overrides = dict(s.overrides, **{"train.max_seq_length": str(MAX_SEQ_LENGTH)})
    if s.vocab is not None:
        overrides["model.vocab_size"] = str(s.vocab)
    cfg = configs.load_config(PRESET, overrides)
    return flops.count_config(cfg, flops.HARDWARE).train_per_step()["total"] * row["step"]


def plot(rows: List[Dict], names: List[str], path: str) -> bool:
    """The regime map at `path`: dev accuracy (mean, min-max over fine-tuning seeds) against
    pre-training matmul FLOPs, a line per setting through its points; each no-pre-training
    row a band (its seed range) in its vocabulary's colour."""
    plt = _cm.pyplot("transfer_study")
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(11, 5))
    colours = {None: "tab:blue", 4096: "tab:orange"}
    shown = [n for n in names if any(r["setting"] == n for r in rows)]
    markers = iter("osD^v<>p*h" * 3)
    for name in shown:
        pts = sorted((r for r in rows if r["setting"] == name), key=lambda r: r["step"])
        vocab = SETTINGS[name].vocab
        colour = colours.get(vocab, "tab:green")
        label = f"{name} ({'BERT 30,522' if vocab is None else f'learned {vocab:,}'})"
        if pts[0]["step"] == 0:
            sc = pts[0]["scores"]
            ax.axhspan(min(sc), max(sc), color=colour, alpha=0.15,
                       label=f"{label}: no pre-training, seed range")
            ax.axhline(statistics.fmean(sc), color=colour, linewidth=1)
            continue
        xs = [matmul_flops(r) for r in pts]
        mean = [statistics.fmean(r["scores"]) for r in pts]
        err = [[m - min(r["scores"]) for m, r in zip(mean, pts)],
               [max(r["scores"]) - m for m, r in zip(mean, pts)]]
        style = "--" if name.startswith("bert") else "-"
        ax.errorbar(xs, mean, yerr=err, marker=next(markers), capsize=3, color=colour,
                    linestyle=style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("pre-training FLOPs (matmuls, hardware convention)")
    ax.set_ylabel("dev accuracy, 500 labels (mean, min-max over 3 seeds)")
    ax.set_title("Few-label transfer against pre-training compute, by vocabulary",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the data
    fig.tight_layout()
    _cm.save_png(plt, fig, path)
    return True


def main(argv=None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    # The table covers every setting with results: its command runs them all.
    command = "python experiments/transfer_study.py " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:])
        if a != "--report_only" and not a.startswith("--settings"))
    failed = 0
    if not args.report_only:
        few_label_task(args)
        for name in args.settings.split(","):
            s = SETTINGS[name]
            if s.steps and pretrain(args, name, s) is None:
                failed += 1
                continue
            for step in s.points:
                failed += finetune(args, name, step) is None
    results = collect(args)
    fileio.makedirs(args.out_dir)
    fileio.write_json_atomic(os.path.join(args.out_dir, "results.json"), results,
                             sort_keys=True)
    fileio.write_atomic(os.path.join(args.out_dir, "report.md"), render(results, command))
    print(render(results, command))
    earlier = [row for path in filter(None, args.compare.split(","))
               for row in read_json(path)["rows"]]
    here = {(r["setting"], r["step"]) for r in results["rows"]}
    rows = results["rows"] + [r for r in earlier if (r["setting"], r["step"]) not in here]
    plot(rows, args.plot_settings.split(","), os.path.join(args.out_dir, "regime_map.png"))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ExperimentError as e:
        print(f"transfer_study: error: {e}", file=sys.stderr)
        sys.exit(2)
