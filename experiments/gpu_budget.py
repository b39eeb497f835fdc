"""At what GPU budget does pre-training start to pay? (issue 66)

One card run, prepared here and carried there: ELECTRA-Small pre-trained on the largest
text the project carries, its checkpoints at several budgets (minutes of the card) and a
randomly initialised model each fine-tuned on the same tasks with the same recipe and
seeds. Everything on the card is the project's own job on the JAX runtime, without
TensorFlow: `run_pretraining.py --backend=jax` and `run_finetuning.py --backend=jax`.

    # here (a CPU machine with the project installed): the bundle, under 64 MiB
    python experiments/gpu_budget.py prepare --bundle=.gpu_budget --npm_dir=cache/npm \\
        --tweets_dir=cache/tweets
    # there (JAX, no TensorFlow; the bundle's wheels give Keras): the study, ~9 minutes
    python experiments/gpu_budget.py run --bundle=.gpu_budget --out=$OUT
    # anywhere: the tables again from its results.json
    python experiments/gpu_budget.py report --results=$OUT/results.json

`prepare --plan=tiny` writes the same study at the `tiny` preset with a few steps per
budget from the bundled files alone, so that the card's minutes are not spent on a typo
(tests/test_gpu_budget.py runs it end to end on the CPU).

The plan (`PLANS`, written to BUNDLE/plan.json):
- pre-training: one run of `--steps` = the largest budget, checkpoints at every budget
  (the budgets are multiples of the first, which is the save period); the learning rate
  warms up over the first 10% and decays linearly to the largest budget, so the earlier
  checkpoints are points along that one schedule, as in docs/transfer.md's curves;
- budgets: minutes of the card at an assumed rate (`seq_per_s`, from the fed rate of
  docs/benchmarks.md), turned into steps here; the report gives each checkpoint's
  measured minutes, its FLOPs in the paper's and the hardware convention, and its
  pre-training metrics;
- fine-tuning: the untrained model first (while pre-training compiles), then each
  checkpoint as soon as it is saved, up to `parallel` jobs beside the pre-training (each
  with its share of the card's memory), `seeds` trials each, JAX's persistent compilation
  cache shared so that one compile serves every job of a task shape;
- a deadline: pre-training is stopped (SIGTERM: it saves where it is, exit 75) when the
  time left would not fit the last fine-tunings, and its last checkpoint becomes the last
  budget; fine-tunings not finished by the deadline are reported as not run.

Writes OUT/results.json, OUT/report.md and OUT/logs.txt (the step, checkpoint and
fine-tuning lines of every job, and each failure's last lines).
"""

import argparse
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import electra_tf  # noqa: E402,F401  (first: the version check; this process starts the
#                   jobs and runs no model: it imports no JAX, and leaves the card to them)

from electra_tf import configs, fileio  # noqa: E402
from electra_tf.pretraining import flops  # noqa: E402

CORPUS_DIR = os.path.join(REPO, "data", "corpus")
MOVIES = os.path.join(REPO, "data", "movie_snippets")
POLARITY = os.path.join(REPO, "data")  # data/polarity: the 200 bundled sentences


class StudyError(Exception):
    """A bad flag, file or job; the message is one line."""


class Task(NamedTuple):
    name: str
    what: str
    source: str  # where prepare takes DATA/polarity/{train,dev}.tsv from: movies, tweets,
    #              polarity (the bundled 200 sentences)
    num_labels: int  # training rows kept (a seeded sample); 0: all
    epochs: int
    max_seq_length: int


class Plan(NamedTuple):
    preset: str
    max_seq_length: int
    batch_size: int
    learning_rate: float
    budgets_min: Sequence[float]  # minutes of the card at seq_per_s; multiples of the first
    seq_per_s: float
    corpus: Sequence[str]  # parts (CORPUS_PARTS)
    tasks: Sequence[Task]
    seeds: int
    parallel: int  # fine-tuning jobs beside the pre-training
    deadline_s: float
    reserve_s: float  # what the last budget's fine-tunings need after pre-training ends
    memory: Dict[str, float]  # XLA_PYTHON_CLIENT_MEM_FRACTION: pretraining, each fine-tuning
    wheels: bool


DEMO = Task("movies", "the demo's task: 8,568 movie snippets, 1 epoch at 64 (the README's "
            "recipe)", "movies", 0, 1, 64)
FEW = Task("movies_500", "500 of the movie snippets (seed 0), 10 epochs at 64 "
           "(docs/transfer.md's task)", "movies", 500, 10, 64)
TWEETS = Task("tweets", "3,196 rated tweets, 2 epochs at 64 (another register)", "tweets",
              0, 2, 64)

PLANS = {
    # One H100/H200 in one device call of at most 10 minutes: Small's fed rate there was
    # 3,811-5,314 seq/s (docs/benchmarks.md); 4,000 turns 0.5-6 minutes into 936-11,232
    # steps of 128 x 128.
    "card": Plan("small", 128, 128, 5e-4, (0.5, 1, 2, 4, 6), 4000.0,
                 ("enwiki", "lee_news", "movies", "tweets", "sotu", "moby_dick"),
                 (DEMO, FEW, TWEETS), 3, 3, 540.0, 75.0,
                 {"pretrain": 0.45, "finetune": 0.15}, True),
    # The CPU check of the same code: `tiny` at a few steps per budget, the bundled files.
    # (Its "minutes" are a unit only: 1 and 2 of them at 8 / 15 seq/s are 4 and 8 steps.)
    "tiny": Plan("tiny", 64, 8, 1e-3, (1, 2), 8 / 15, ("lee_news",),
                 (Task("polarity", "the bundled 200 sentences, 1 epoch at 32", "polarity",
                       0, 1, 32),
                  Task("polarity_64", "64 of them, 2 epochs at 32", "polarity", 64, 2, 32)),
                 2, 2, 1200.0, 0.0, {}, False),
}

# Corpus parts: name -> (what, where prepare finds the text: a path, or a task's training
# sentences).
CORPUS_PARTS = {
    "enwiki": ("the bundled Wikipedia sample", os.path.join(CORPUS_DIR, "enwiki_sample.txt")),
    "lee_news": ("the bundled Lee news sample", os.path.join(CORPUS_DIR, "lee_news_sample.txt")),
    "movies": ("the movie snippets' training sentences (labels dropped)", "task:movies"),
    "tweets": ("the tweets' training sentences (labels dropped)", "task:tweets"),
    "sotu": ("the State of the Union addresses (npm_corpus.py)", "npm:sotu"),
    "moby_dick": ("Moby Dick (npm_corpus.py)", "npm:moby_dick"),
}
# The wheels a GPU machine with JAX and no TensorFlow lacks (device KINDS.md): Keras and
# the two packages it needs that are not there, and the CRC of electra_tf/wire.py.
WHEELS = ("keras==3.15.1", "namex", "optree", "google-crc32c")


def budget_steps(plan: Plan) -> List[int]:
    """The steps of each budget: multiples of the first budget's steps, which is a multiple
    of 4 (the step lines come every quarter of it, so one falls on every budget)."""
    first = 4 * max(1, round(plan.budgets_min[0] * 60 * plan.seq_per_s / plan.batch_size / 4))
    return [first * max(1, round(m / plan.budgets_min[0])) for m in plan.budgets_min]


def plan_config(plan: Plan, steps: int):
    return configs.load_config(plan.preset, pretrain_overrides(plan, steps))


def pretrain_overrides(plan: Plan, steps: int) -> Dict[str, str]:
    return {"train.train_batch_size": str(plan.batch_size),
            "train.max_seq_length": str(plan.max_seq_length),
            "optimizer.learning_rate": str(plan.learning_rate),
            "optimizer.warmup_steps": str(max(1, steps // 10)),
            "train.num_train_steps": str(steps)}


# --- prepare (a CPU machine with the project and the network to PyPI) -----------------

def _tsv_rows(path: str) -> List[str]:
    return fileio.read_bytes(path).decode("utf-8").splitlines()


def _source_dir(source: str, args) -> str:
    """The directory holding polarity/{train,dev}.tsv of a task source."""
    if source == "movies":
        return MOVIES
    if source == "polarity":
        return POLARITY
    if source == "tweets":
        if not args.tweets_dir:
            raise StudyError("--tweets_dir is needed for the tweets task (write it with "
                             "python experiments/movie_snippets.py --source=tweets "
                             "--out_dir=DIR)")
        return args.tweets_dir
    raise StudyError(f"unknown task source {source!r}")


def write_task(task: Task, args, out: str) -> Dict[str, int]:
    """OUT/polarity/{train,dev}.tsv of `task`: its source's dev split, its training rows
    (a sample of num_labels, seed 0). -> the row counts."""
    src = os.path.join(_source_dir(task.source, args), "polarity")
    for name in ("train.tsv", "dev.tsv"):
        if not fileio.exists(os.path.join(src, name)):
            raise StudyError(f"{task.name}: no {os.path.join(src, name)}")
    header, *rows = _tsv_rows(os.path.join(src, "train.tsv"))
    if task.num_labels:
        if task.num_labels > len(rows):
            raise StudyError(f"{task.name}: {task.num_labels} labels asked, {src}/train.tsv "
                             f"has {len(rows)} rows")
        rows = random.Random(0).sample(rows, task.num_labels)
    dest = os.path.join(out, "polarity")
    fileio.makedirs(dest)
    fileio.write_atomic(os.path.join(dest, "train.tsv"), "\n".join([header, *rows]) + "\n")
    dev = _tsv_rows(os.path.join(src, "dev.tsv"))
    fileio.write_atomic(os.path.join(dest, "dev.tsv"), "\n".join(dev) + "\n")
    return {"train": len(rows), "dev": len(dev) - 1}


def corpus_file(part: str, args, work: str) -> str:
    where = CORPUS_PARTS[part][1]
    if where.startswith("npm:"):
        if not args.npm_dir:
            raise StudyError(f"--npm_dir is needed for the {part} corpus (write it with "
                             f"python experiments/npm_corpus.py --corpus={where[4:]} "
                             f"--out_dir=DIR)")
        path = os.path.join(args.npm_dir, f"{where[4:]}.txt")
        if not fileio.exists(path):
            raise StudyError(f"--npm_dir={args.npm_dir}: no {where[4:]}.txt (python "
                             f"experiments/npm_corpus.py --corpus={where[4:]} "
                             f"--out_dir={args.npm_dir})")
        return path
    if where.startswith("task:"):  # the training sentences, one document each
        source = where[5:]
        rows = _tsv_rows(os.path.join(_source_dir(source, args), "polarity", "train.tsv"))
        path = os.path.join(work, f"{source}_train.txt")
        fileio.write_atomic(path, "\n\n".join(r.split("\t")[0] for r in rows[1:]) + "\n")
        return path
    return where


def download_wheels(dest: str) -> List[str]:
    """The WHEELS for the GPU machines' Python 3.12 on x86-64 (device README), by pip."""
    fileio.makedirs(dest)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--disable-pip-version-check",
           *[f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                          "manylinux2014_x86_64")], "-d", dest, *WHEELS]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise StudyError(f"pip download of {', '.join(WHEELS)} failed: "
                         f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return sorted(fileio.listdir(dest))


def tree_bytes(path: str) -> int:
    return sum(fileio.size(f) for f in fileio.walk_files(path))


def prepare(args) -> dict:
    plan = PLANS[args.plan]
    bundle = args.bundle
    if fileio.exists(fileio.join(bundle, "plan.json")):
        fileio.rmtree(bundle)  # a bundle is written whole, never patched
    work = os.path.join(bundle, "text")
    fileio.makedirs(work)
    tasks = {t.name: write_task(t, args, os.path.join(bundle, "tasks", t.name))
             for t in plan.tasks}
    inputs = [corpus_file(p, args, work) for p in plan.corpus]
    data = os.path.join(bundle, "data")
    cmd = [sys.executable, "-m", "tfrecord_builder", "build", f"--output_dir={data}",
           f"--input={','.join(inputs)}", f"--max_seq_length={plan.max_seq_length}",
           f"--num_shards={args.num_shards}", f"--num_workers={args.num_workers}"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise StudyError(f"building the corpus failed: "
                         f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    fileio.rmtree(work)
    manifest = fileio.read_json(os.path.join(data, "manifest.json"))
    steps = budget_steps(plan)
    cfg = plan_config(plan, steps[-1])
    written = {
        "plan": args.plan, **{k: v for k, v in plan._asdict().items() if k != "tasks"},
        "tasks": [t._asdict() for t in plan.tasks], "task_rows": tasks,
        "budget_steps": steps, "overrides": pretrain_overrides(plan, steps[-1]),
        "flops_per_step": {"paper": flops.count_config(cfg, flops.PAPER).train_per_step()[
            "total"], "hardware": flops.count_config(cfg, flops.HARDWARE).train_per_step()[
            "total"]},
        "corpus_parts": {p: CORPUS_PARTS[p][0] for p in plan.corpus},
        "corpus_manifest": {k: manifest.get(k) for k in ("examples", "corpus_tokens",
                                                         "documents", "max_seq_length",
                                                         "num_shards")},
        "wheels": download_wheels(os.path.join(bundle, "wheels")) if plan.wheels else []}
    fileio.write_json_atomic(os.path.join(bundle, "plan.json"), written, sort_keys=True)
    size = tree_bytes(bundle)
    print(f"gpu_budget: wrote {bundle}: {args.plan} plan, budgets {steps} steps, corpus "
          f"{written['corpus_manifest']}, tasks {tasks}, {size / 2**20:.1f} MiB")
    if size > args.max_mib * 2**20:
        raise StudyError(f"{bundle} is {size / 2**20:.1f} MiB, over --max_mib={args.max_mib} "
                         "(a device call carries 64 MiB with the repository)")
    return written


# --- run (the card: JAX, no TensorFlow) ------------------------------------------------

STEP_LINE = re.compile(r"\] step (\d+)/(\d+) \| loss ([\d.]+)(.*)")
SAVED_LINE = re.compile(r"Saved checkpoint (\S+/ckpt-(\d+))\s*$")
PREEMPTED_LINE = re.compile(r"SIGTERM at step (\d+): saved (\S+/ckpt-\d+);")
METRICS = ("mlm_loss", "mlm_acc", "disc_loss", "disc_acc", "disc_auc")


class Job:
    """One command line, its output appended to a log file by a thread; `on_line` sees
    each line with the seconds since the study started."""

    def __init__(self, name, cmd, env, log_path, t0, on_line=None):
        self.name, self.cmd, self.t0 = name, cmd, t0
        self.log_path = log_path
        self.started = time.monotonic() - t0
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        self.on_line = on_line
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self):
        with fileio.open_file(self.log_path, "a") as log:
            log.write("$ " + " ".join(self.cmd) + "\n")
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                if self.on_line:
                    self.on_line(line.rstrip("\n"), time.monotonic() - self.t0)

    def done(self) -> bool:
        return self.proc.poll() is not None

    def finish(self) -> int:
        code = self.proc.wait()
        self.thread.join(timeout=30)
        return code


def _tail(path: str, n: int = 12) -> List[str]:
    try:
        return fileio.read_bytes(path).decode("utf-8", "replace").splitlines()[-n:]
    except OSError:
        return []


class Study:
    def __init__(self, bundle: str, out: str, deadline_s: Optional[float], parallel=None,
                 stop_at: Optional[int] = None):
        self.bundle, self.out = bundle, out
        self.plan = fileio.read_json(os.path.join(bundle, "plan.json"))
        self.deadline = deadline_s if deadline_s is not None else self.plan["deadline_s"]
        self.parallel = parallel or self.plan["parallel"]
        self.work = os.path.join(out, "work")
        fileio.makedirs(os.path.join(self.work, "logs"))
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.pending = queue.Queue()  # (task, start): start is 0 (untrained) or a step
        self.steps: Dict[int, dict] = {}  # logged step -> metrics and seconds
        self.saved: Dict[int, float] = {}  # checkpoint step -> seconds
        self.first_step_s: Optional[float] = None
        self.cut: Optional[int] = None  # the step a SIGTERM saved
        self.devices: Optional[str] = None  # the pre-training's line naming its devices
        self.stop_at = stop_at  # a step at which to stop the pre-training as the deadline does
        self.stopping = threading.Event()  # a SIGTERM was sent to it
        self.pretrain: Optional[Job] = None
        self.finetuned: Dict[str, Dict[int, dict]] = {t["name"]: {} for t in self.plan["tasks"]}

    def env(self, memory: Optional[float]) -> Dict[str, str]:
        # One compilation cache for every job, bounded and so locked (compile_cache.py):
        # JAX's own directory setting would leave it unlocked.
        env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
        env.update(KERAS_BACKEND="jax", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
                   ELECTRA_TF_COMPILATION_CACHE=os.path.join(self.work, "jax_cache"),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
        if memory:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = str(memory)
        return env

    def _pretrain_line(self, line: str, seconds: float):
        m = STEP_LINE.search(line)
        with self.lock:
            if m:
                step = int(m.group(1))
                if self.first_step_s is None:
                    self.first_step_s = seconds
                found = {"seconds": seconds, "loss": float(m.group(3))}
                for key, value in re.findall(r"(\w+) (-?[\d.]+(?:e-?\d+)?)\b", m.group(4)):
                    if key in METRICS:
                        found[key] = float(value)
                rate = re.search(r"([\d.]+) seq/s", m.group(4))
                if rate:
                    found["seq_per_s"] = float(rate.group(1))
                self.steps[step] = found
            saved = SAVED_LINE.search(line)
            cut = PREEMPTED_LINE.search(line)
            if cut:
                self.cut = int(cut.group(1))
                self.saved.setdefault(self.cut, seconds)
                if self.cut not in self.plan["budget_steps"]:  # the last budget that ran
                    for task in self.plan["tasks"]:
                        self.pending.put((task["name"], self.cut))
            if self.devices is None and "device(s) (" in line:
                self.devices = line.split("] ", 1)[-1]
        if m and self.stop_at is not None and int(m.group(1)) >= self.stop_at and \
                not self.stopping.is_set():
            self.stopping.set()
            self.pretrain.proc.send_signal(signal.SIGTERM)
        if saved:
            step = int(saved.group(2))
            self.saved[step] = seconds
            if step in self.plan["budget_steps"]:
                for task in self.plan["tasks"]:
                    self.pending.put((task["name"], step))

    def pretrain_cmd(self) -> List[str]:
        plan = self.plan
        overrides = dict(plan["overrides"], **{
            "train.save_checkpoints_steps": str(plan["budget_steps"][0]),
            "train.keep_checkpoint_max": "1000", "train.log_every_steps": str(max(
                1, plan["budget_steps"][0] // 4))})
        return [sys.executable, "run_pretraining.py", "--backend=jax",
                f"--config={plan['preset']}", f"--model_dir={self.work}/pretrain",
                f"--train_data={self.bundle}/data",
                "--params_override=" + ",".join(f"{k}={v}" for k, v in overrides.items())]

    def finetune_cmd(self, task: dict, start: int) -> List[str]:
        model_dir = os.path.join(self.work, "finetune", task["name"], f"step{start}")
        init = ([f"--init_checkpoint={self.work}/pretrain/ckpt-{start}"] if start else
                ["--init_checkpoint=none", f"--config={self.work}/model.json"])
        return [sys.executable, "run_finetuning.py", "--backend=jax", "--task=polarity",
                f"--data_dir={self.bundle}/tasks/{task['name']}", f"--model_dir={model_dir}",
                f"--num_trials={self.plan['seeds']}",
                f"--num_train_epochs={task['epochs']}",
                f"--max_seq_length={task['max_seq_length']}", *init]

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.t0)

    def run(self) -> dict:
        plan = self.plan
        fileio.write_json_atomic(os.path.join(self.work, "model.json"),
                                 configs.load_config(plan["preset"], dict(
                                     plan["overrides"])).to_json())
        tasks = {t["name"]: t for t in plan["tasks"]}
        for name in tasks:  # the untrained model first: it compiles while pre-training does
            self.pending.put((name, 0))
        self.pretrain = pretrain = Job(
            "pretrain", self.pretrain_cmd(), self.env(plan["memory"].get("pretrain")),
            os.path.join(self.work, "logs", "pretrain.log"), self.t0, self._pretrain_line)
        running: List[tuple] = []
        while True:
            if not pretrain.done() and not self.stopping.is_set() and \
                    self.left() < plan["reserve_s"]:
                self.stopping.set()
                pretrain.proc.send_signal(signal.SIGTERM)  # saves where it is, exit 75
            for entry in [r for r in running if r[2].done()]:
                running.remove(entry)
                self._collect(*entry)
            while len(running) < self.parallel and not self.pending.empty():
                name, start = self.pending.get()
                model_dir = os.path.join(self.work, "finetune", name, f"step{start}")
                job = Job(f"{name}@{start}", self.finetune_cmd(tasks[name], start),
                          self.env(plan["memory"].get("finetune")),
                          os.path.join(self.work, "logs", f"finetune_{name}_{start}.log"),
                          self.t0)
                running.append((name, start, job, model_dir))
            if pretrain.done() and not pretrain.thread.is_alive() and not running and \
                    self.pending.empty():
                break
            if self.left() < 0:
                for _, _, job, _ in running:
                    job.proc.kill()
                for name, start, job, model_dir in running:
                    job.finish()
                    self.finetuned[name][start] = {"not_run": "the deadline"}
                while not self.pending.empty():
                    name, start = self.pending.get()
                    self.finetuned[name][start] = {"not_run": "the deadline"}
                if not pretrain.done():
                    pretrain.proc.kill()
                break
            time.sleep(0.5)
        return self.results(pretrain.finish())

    def _collect(self, name, start, job, model_dir):
        code = job.finish()
        path = os.path.join(model_dir, "results.json")
        entry = {"seconds": round(time.monotonic() - self.t0 - job.started, 1)}
        if code == 0 and fileio.exists(path):
            results = fileio.read_json(path)
            entry.update(scores=results["scores"], metric=results["metric"],
                         median=results["median"], trials=results["trials"],
                         init_checkpoint=results["init_checkpoint"])
        else:
            entry["failed"] = f"exit {code}: " + " | ".join(_tail(job.log_path, 3))
        self.finetuned[name][start] = entry
        for trial in range(self.plan["seeds"]):  # the trials' weights are not needed
            trial_dir = fileio.join(model_dir, f"trial_{trial}")
            if fileio.exists(trial_dir):
                fileio.rmtree(trial_dir)

    def results(self, pretrain_code: int) -> dict:
        plan = self.plan
        per_step = plan["flops_per_step"]
        compile_s = self.first_step_s
        starts = [0] + sorted(s for s in self.saved if s in plan["budget_steps"] or
                              s == self.cut)
        rows = []
        for start in starts:
            logged = self.steps.get(start, {})
            rows.append({
                "step": start,
                "budget_min": (plan["budgets_min"][plan["budget_steps"].index(start)]
                               if start in plan["budget_steps"] else None),
                "saved_s": self.saved.get(start),
                "train_s": (None if not start or compile_s is None else
                            round(self.saved[start] - compile_s, 1)),
                "flops_paper": per_step["paper"] * start,
                "flops_hardware": per_step["hardware"] * start,
                "metrics": {k: v for k, v in logged.items() if k in METRICS},
                "finetune": {t: self.finetuned[t].get(start, {"not_run": "no checkpoint"})
                             for t in self.finetuned}})
        rates = [v["seq_per_s"] for k, v in sorted(self.steps.items()) if "seq_per_s" in v]
        return {"plan": plan, "pretrain_exit": pretrain_code, "cut_at": self.cut,
                "first_step_s": compile_s, "seq_per_s_median": (
                    statistics.median(rates[1:]) if len(rates) > 1 else None),
                "rows": rows, "seconds": round(time.monotonic() - self.t0, 1),
                "machine": self.devices or "the pre-training logged no devices"}


def write_logs(study: Study, path: str):
    """The lines a reader needs from every job's log: steps, checkpoints, trials, errors."""
    keep = re.compile(r"\] step \d+/\d+ |Saved checkpoint|Trial \d|dev |error|Error|"
                      r"SIGTERM|Resumed|compil", re.IGNORECASE)
    out = []
    logs = os.path.join(study.work, "logs")
    for name in sorted(fileio.listdir(logs)):
        lines = fileio.read_bytes(fileio.join(logs, name)).decode("utf-8", "replace") \
            .splitlines()
        out.append(f"== {name}")
        out += [ln for ln in lines if ln.startswith("$ ") or keep.search(ln)][-200:]
        out += ["   (last lines)"] + lines[-5:]
    fileio.write_atomic(path, "\n".join(out) + "\n")


# --- report -----------------------------------------------------------------------------

def _mean_range(scores: Sequence[float]) -> str:
    return f"{statistics.mean(scores):.4f} ({min(scores):.4f}-{max(scores):.4f})"


def versus(scores: Sequence[float], baseline: Sequence[float]) -> str:
    if min(scores) > max(baseline):
        return "above (every seed)"
    if max(scores) < min(baseline):
        return "below (every seed)"
    return "within the spread"


def render(results: dict) -> str:
    plan = results["plan"]
    lines = [f"# Pre-training budgets on one card ({results['machine']})", "",
             f"Plan `{plan['plan']}`: `{plan['preset']}`, {plan['batch_size']} x "
             f"{plan['max_seq_length']}, lr {plan['learning_rate']}, budgets "
             f"{plan['budgets_min']} min at an assumed {plan['seq_per_s']:.4g} seq/s = "
             f"{plan['budget_steps']} steps; corpus: {', '.join(plan['corpus_parts'].values())}"
             f" ({plan['corpus_manifest']}); {plan['seeds']} fine-tuning seeds per row.",
             "",
             (f"Pre-training: first step after {results['first_step_s']:.1f} s (start-up "
              "and compile)" if results["first_step_s"] is not None else
              "Pre-training: no step logged")
             + f", median {results['seq_per_s_median']} seq/s while fine-tunings "
             f"shared the card, exit {results['pretrain_exit']}"
             + (f", stopped at step {results['cut_at']} (SIGTERM: the deadline or "
                "--stop_at_step)"
                if results["cut_at"] is not None else "")
             + f"; the whole study {results['seconds']} s.", ""]
    none = results["rows"][0]
    for task in plan["tasks"]:
        name = task["name"]
        rows = plan["task_rows"][name]
        lines += [f"## {name}: {task['what']} ({rows['train']} train, {rows['dev']} dev)", "",
                  "| start | budget | pre-training s | FLOPs paper / hardware | disc AUC / "
                  "MLM acc | dev | vs no pre-training |", "|---|---:|---:|---:|---|---|---|"]
        base = none["finetune"][name].get("scores")
        wins = []
        for row in results["rows"]:
            ft = row["finetune"][name]
            start = "none (random init)" if not row["step"] else f"ckpt-{row['step']}"
            budget = "" if not row["step"] else (
                f"{row['budget_min']} min" if row["budget_min"] is not None else "cut")
            m = row["metrics"]
            intrinsic = (f"{m['disc_auc']:.3f} / {m['mlm_acc']:.3f}"
                         if "disc_auc" in m and "mlm_acc" in m else "")
            if "scores" in ft:
                dev = _mean_range(ft["scores"])
                vs = "" if not row["step"] or not base else versus(ft["scores"], base)
                if vs.startswith("above"):
                    wins.append(row)
            else:
                dev, vs = ft.get("failed") or f"not run ({ft.get('not_run')})", ""
            flops_cell = (f"{row['flops_paper']:.2e} / {row['flops_hardware']:.2e}"
                          if row["step"] else "0")
            lines.append(f"| {start} | {budget} | {row['train_s'] or ''} | {flops_cell} | "
                         f"{intrinsic} | {dev} | {vs} |")
        first = wins[0] if wins else None
        lines += ["", (f"Smallest budget that wins beyond the seed spread: ckpt-{first['step']}"
                       f" ({first['flops_paper']:.2e} FLOPs, {first['train_s']} s of "
                       "pre-training)." if first else
                       "No budget wins beyond the seed spread up to the largest run."), ""]
    return "\n".join(lines)


# --- command line ----------------------------------------------------------------------

def parse_args(argv):
    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise StudyError(message)

    p = Parser(prog="gpu_budget.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    prep = sub.add_parser("prepare", help="Write the bundle (here).")
    prep.add_argument("--bundle", required=True)
    prep.add_argument("--plan", choices=sorted(PLANS), default="card")
    prep.add_argument("--npm_dir", default=None, help="sotu.txt and moby_dick.txt "
                      "(experiments/npm_corpus.py).")
    prep.add_argument("--tweets_dir", default=None, help="polarity/ of "
                      "experiments/movie_snippets.py --source=tweets.")
    prep.add_argument("--num_shards", type=int, default=16)
    prep.add_argument("--num_workers", type=int, default=2)
    prep.add_argument("--max_mib", type=float, default=48.0)
    run = sub.add_parser("run", help="Run the study (the card).")
    run.add_argument("--bundle", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--deadline_s", type=float, default=None, help="Seconds for the whole "
                     "study (default: the plan's).")
    run.add_argument("--parallel", type=int, default=None, help="Fine-tuning jobs at once "
                     "(default: the plan's).")
    run.add_argument("--stop_at_step", type=int, default=None, help="Stop the pre-training "
                     "at this step as the deadline does (SIGTERM: it saves there, and that "
                     "checkpoint is fine-tuned as the last budget).")
    rep = sub.add_parser("report", help="The tables of a results.json.")
    rep.add_argument("--results", required=True)
    return p.parse_args(list(argv))


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if args.command == "prepare":
            prepare(args)
        elif args.command == "run":
            if not fileio.exists(os.path.join(args.bundle, "plan.json")):
                raise StudyError(f"--bundle={args.bundle}: no plan.json (write it with "
                                 "gpu_budget.py prepare)")
            study = Study(args.bundle, args.out, args.deadline_s, args.parallel,
                          args.stop_at_step)
            results = study.run()
            fileio.write_json_atomic(os.path.join(args.out, "results.json"), results,
                                     sort_keys=True)
            report = render(results)
            fileio.write_atomic(os.path.join(args.out, "report.md"), report + "\n")
            write_logs(study, os.path.join(args.out, "logs.txt"))
            print(report)
        else:
            print(render(fileio.read_json(args.results)))
    except StudyError as e:
        print(f"gpu_budget: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
