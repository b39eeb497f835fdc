"""Fault injection: kills the pre-training, data-building and fine-tuning commands at
random moments (and deliberately while a checkpoint is being written), reruns them as a
user would, and checks that nothing is lost beyond a checkpoint interval and that the
final outputs equal those of uninterrupted runs, bit for bit.

    python bench/fault_injection.py                       # the default run, ~7 min on 2 CPUs
    python bench/fault_injection.py --kills=20 --seed=3   # more pre-training kills

Four parts, all in subprocesses exactly as a user runs them (`python run_pretraining.py`,
`python -m tfrecord_builder`, `python run_finetuning.py`):

1. data: an uninterrupted `tfrecord_builder` build of the bundled sample corpus (the
   reference, and the training data of parts 2 and 4);
2. pre-training: an uninterrupted reference run (the names seen in its model_dir while it
   saves are listed: what TensorFlow writes before renaming), then the same command killed
   --kills times with SIGTERM (a preemption notice: must save and exit 75), SIGKILL at a
   random moment (start-up, compile or training), or SIGKILL as soon as a checkpoint write
   is seen under way (`ckpt-N_temp/`, `*.tempstate*`, `checkpoint.tmp*`), each time rerun
   until it exits 0. After every kill the newest checkpoint must load completely, the rerun
   must resume from it, and the steps lost (last `step N/M` logged - step resumed) must be
   at most save_checkpoints_steps + steps_per_loop (0 for SIGTERM); the final checkpoint
   must equal the reference run's in every variable;
3. data again: --builder_kills builds into fresh directories, each SIGKILLed once (at a
   random moment; the last while its shards are assembled and renamed into place; the
   second killing only the main process, leaving its workers) and rerun; no manifest.json
   may ever stand beside missing shards, the workers must not outlive the main process by
   30 s, and every rerun's output must equal the reference build byte for byte;
4. fine-tuning (polarity, from the reference pre-training run, two trials): SIGKILLed
   --finetune_kills times (mid-training in the first trial, then during a checkpoint write of
   the last), rerun; results.json and the trials' final weights must equal an uninterrupted
   run's. (They do not yet for a trial resumed mid-way, most likely because its dropout
   masks come from TensorFlow's stateful RNG, which a new process starts over; the
   harness reports the difference as a failed check.)

Killed checkpoint writes leave `ckpt-N_temp/` directories behind; they are listed (not a
failed check) in the summary.

Prints each kill and a summary; exits 0 only if every check passed. Logs and outputs go
to --workdir (a temporary directory, removed after a fully passing run unless --keep).
--workdir is local by design (the harness reads /proc, kills local processes and polls
their output directories for half-written files: plain os / open calls on it are
deliberate); --json may be on any filesystem TensorFlow knows (gs://...).
"""

import argparse
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "data", "corpus", "enwiki_sample.txt")
VOCAB = os.path.join(REPO, "data", "vocab", "bert_uncased_vocab.txt")
PREEMPTED = 75

STEP_RE = re.compile(r"\] step (\d+)/(\d+) \|")
RESUMED_RE = re.compile(r"Resumed from (\S+) \(step (\d+)\)")
SIGTERM_RE = re.compile(r"SIGTERM at step (\d+)")
TRIAL_DONE_RE = re.compile(r"Trial (\d+) \(seed \d+\) dev:")
CKPT_NUM_RE = re.compile(r"ckpt-(\d+)")


def is_temp_name(name: str) -> bool:
    """What TensorFlow writes while a checkpoint is being saved, before renaming:
    `ckpt-N_temp/` (the shards, merged into ckpt-N.* at the end), `*.tempstate*` (the
    merged index and the data file being moved) and `checkpoint.tmp*` (the state file)."""
    base = name.rsplit("/", 1)[-1]
    return "_temp" in name or "tempstate" in base or base.startswith("checkpoint.tmp")


# ----------------------------------------------------------------------------- processes

# How Proc starts a command: subprocess.Popen's signature (the test suite forks its
# commands from a process that has imported TensorFlow, tests/forked_cli.py: popen).
POPEN = subprocess.Popen


class Proc:
    """A command in its own session, its merged stdout/stderr read by a thread into
    timestamped lines (and a log file)."""

    def __init__(self, cmd: Sequence[str], log_path: str, cwd: str = REPO):
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
        self.cmd, self.log_path = list(cmd), log_path
        self.t0 = time.monotonic()
        self.lines: List[tuple] = []
        self.eof = False
        self.cond = threading.Condition()
        self.p = POPEN(self.cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.log_path, "a") as log:
            log.write("$ " + " ".join(self.cmd) + "\n")
            for line in self.p.stdout:
                log.write(line)
                with self.cond:
                    self.lines.append((time.monotonic() - self.t0, line))
                    self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def alive(self) -> bool:
        return self.p.poll() is None

    def wait_lines(self, predicate: Callable[[List[str]], bool], timeout: float) -> bool:
        """Waits until predicate(all lines so far) holds (True) or the output ends (False)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if predicate([l for _, l in self.lines]):
                    return True
                if self.eof or time.monotonic() > deadline:
                    return False
                self.cond.wait(0.05)

    def signal(self, sig: int, group: bool = True):
        try:
            if group:
                os.killpg(self.p.pid, sig)
            else:
                self.p.send_signal(sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float = 600) -> int:
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            rc = self.p.wait()
        self.thread.join(30)
        return rc

    def text(self) -> str:
        with self.cond:
            return "".join(l for _, l in self.lines)

    def tail(self, n: int = 15) -> str:
        return "".join(self.text().splitlines(True)[-n:])


def group_alive(pgid: int) -> List[int]:
    """The live (not zombie) processes of a process group, from /proc."""
    alive = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(pid))
    return alive


def list_tree(path: str) -> List[str]:
    """Names in `path` and one level down (`sub/name`); [] if it does not exist."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    for sub in list(names):
        try:
            names += [f"{sub}/{n}" for n in os.listdir(os.path.join(path, sub))]
        except (NotADirectoryError, FileNotFoundError):
            pass
    return names


def poll_dir(path: str, predicate: Callable[[List[str]], bool], proc: Proc,
             interval: float = 0.0005, recursive: bool = False) -> Optional[List[str]]:
    """Lists `path` in a tight loop until predicate(names) holds (returns the names) or
    the process ends (None). recursive: names one level down too, as `sub/name`."""
    while proc.alive():
        if recursive:
            names = list_tree(path)
        else:
            try:
                names = os.listdir(path)
            except FileNotFoundError:
                names = []
        if predicate(names):
            return names
        time.sleep(interval)
    return None


# ----------------------------------------------------------------------------- checkpoints


def read_checkpoint(prefix: str) -> Dict[str, "object"]:
    """Every tensor of a checkpoint (raises if any file is missing or torn)."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def newest_checkpoint(model_dir: str) -> Optional[str]:
    """The checkpoint a rerun resumes from: the newest complete one, as the run finds it
    (from the index and the data files' sizes, `checkpoints.newest_complete`), which
    `checkpoint_problem` then confirms by reading every tensor."""
    from electra_tf.training.checkpoints import newest_complete
    return newest_complete(model_dir) if os.path.isdir(model_dir) else None


def checkpoint_problem(model_dir: str) -> Optional[str]:
    """None if the newest complete checkpoint in model_dir (if any) reads completely, else
    why."""
    try:
        latest = newest_checkpoint(model_dir)
    except ValueError as e:  # checkpoint files, none complete
        return str(e)
    if latest is None:
        return None
    try:
        read_checkpoint(latest)
    except Exception as e:  # noqa: BLE001 (any failure to read is the finding)
        return f"{latest}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return None


def latest_step(model_dir: str) -> int:
    latest = newest_checkpoint(model_dir)
    return int(CKPT_NUM_RE.search(os.path.basename(latest)).group(1)) if latest else 0


def compare_checkpoints(a: str, b: str, prefix: str = "") -> dict:
    """Compares every variable (names starting with `prefix`) of two checkpoints (a
    directory: its newest), save_counter (how often that run saved) aside.
    -> {equal, n, differ: [names], max_abs_diff, only_in_one, save_counter}."""
    import numpy as np
    import tensorflow as tf
    pa = tf.train.latest_checkpoint(a) if os.path.isdir(a) else a
    pb = tf.train.latest_checkpoint(b) if os.path.isdir(b) else b
    ta = {k: v for k, v in read_checkpoint(pa).items() if k.startswith(prefix)}
    tb = {k: v for k, v in read_checkpoint(pb).items() if k.startswith(prefix)}
    differ, max_diff = [], 0.0
    bookkeeping = [n for n in set(ta) & set(tb) if n.startswith("save_counter/")]
    for name in sorted(set(ta) & set(tb) - set(bookkeeping)):
        x, y = np.asarray(ta[name]), np.asarray(tb[name])
        if x.shape != y.shape or x.tobytes() != y.tobytes():
            differ.append(name)
            if x.shape == y.shape and x.dtype.kind in "fiu":
                max_diff = max(max_diff, float(np.max(np.abs(x.astype(np.float64) -
                                                             y.astype(np.float64)))))
            else:
                max_diff = float("inf")
    only = sorted(set(ta) ^ set(tb))
    return {"equal": not differ and not only, "n": len(set(ta) & set(tb)), "differ": differ,
            "max_abs_diff": max_diff, "only_in_one": only, "a": pa, "b": pb,
            "names": sorted(set(ta) & set(tb) - set(bookkeeping)),
            "save_counter": [int(ta[n]) for n in bookkeeping] + [int(tb[n]) for n in bookkeeping]}


# ----------------------------------------------------------------------------- pre-training


@dataclasses.dataclass
class PretrainSetup:
    data: str
    steps: int = 60
    batch: int = 8
    save: int = 10
    loop: int = 5
    seed: int = 1234
    max_seq_length: int = 128
    extra: Sequence[str] = ()

    def cmd(self, model_dir: str) -> List[str]:
        return [sys.executable, "run_pretraining.py", f"--model_dir={model_dir}",
                f"--train_data={self.data}", f"--num_train_steps={self.steps}",
                f"--train_batch_size={self.batch}", f"--save_checkpoints_steps={self.save}",
                f"--steps_per_loop={self.loop}", f"--seed={self.seed}",
                f"--max_seq_length={self.max_seq_length}", "--strategy=cpu",
                "--nojit_compile", f"--params_override=log_every_steps={self.loop}",
                *self.extra]


@dataclasses.dataclass
class Kill:
    """One planned kill. kind: sigterm | sigkill | sigkill_ckpt. phase: startup (after
    `delay` s), training (`lines` step lines after start, then `delay` s), ckpt (the first
    write seen of a checkpoint ckpt-N with N >= `min_ckpt`; the planner sets it to the
    `nth_write`-th save of the attempt)."""
    kind: str
    phase: str
    delay: float = 0.0
    lines: int = 1
    nth_write: int = 1
    min_ckpt: int = 0
    startup_delay: float = 1.0  # if a training kill can no longer happen: start-up instead
    write_delay: float = 0.0  # ckpt: seconds between seeing the write and the SIGKILL


@dataclasses.dataclass
class Attempt:
    rc: int
    resumed: int  # step restored at start (0: fresh; killed before the log line
    #               says: the newest checkpoint there was)
    resumed_from: Optional[str]
    reached: int  # the last `step N/M` logged (or `resumed`)
    killed: bool = False
    kill_t: float = 0.0
    sigterm_step: Optional[int] = None
    temp_seen: Sequence[str] = ()  # for a kill during a checkpoint write: what was there
    writing: Optional[int] = None  # the checkpoint being written when killed
    latest_before: int = 0  # newest complete checkpoint when the write was seen
    log_tail: str = ""
    seconds: float = 0.0


def _steps(lines: Sequence[str]) -> List[int]:
    return [int(m.group(1)) for m in map(STEP_RE.search, lines) if m]


def pretrain_attempt(setup: PretrainSetup, model_dir: str, log_path: str,
                     kill: Optional[Kill] = None, timeout: float = 600) -> Attempt:
    """Runs the pre-training command once, killing it as `kill` says (None: not at all)."""
    start = latest_step(model_dir) if os.path.isdir(model_dir) else 0
    proc = Proc(setup.cmd(model_dir), log_path)
    killed, temp_seen, writing, latest_before, kill_t = False, (), None, 0, 0.0
    if kill is not None:
        sig = signal.SIGTERM if kill.kind == "sigterm" else signal.SIGKILL
        fire = False
        if kill.phase == "startup":
            deadline = time.monotonic() + kill.delay
            while proc.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            fire = proc.alive()
        elif kill.phase == "training":
            fire = proc.wait_lines(lambda lines: len(_steps(lines)) >= kill.lines, timeout)
            if fire and kill.delay:
                time.sleep(kill.delay)
        else:  # ckpt: a write of ckpt-N, N >= min_ckpt, under way
            # (new names only: a write killed earlier leaves its ckpt-N_temp/ behind)
            old = set(list_tree(model_dir))

            def writing_now(names):
                return any(int(m.group(1)) >= kill.min_ckpt for m in
                           (CKPT_NUM_RE.search(n) for n in names
                            if is_temp_name(n) and n not in old) if m)
            names = poll_dir(model_dir, writing_now, proc, recursive=True)
            fire = names is not None
            if fire:
                if kill.write_delay:  # later into the write: data, merge, state file
                    time.sleep(kill.write_delay)
                proc.signal(sig)  # first, then look at what we caught
                kill_t = proc.elapsed()
                temp_seen = tuple(sorted(n for n in names if is_temp_name(n) and n not in old))
                nums = [int(m.group(1)) for m in map(CKPT_NUM_RE.search, temp_seen) if m]
                writing = max(nums) if nums else None
                done = [int(m.group(1)) for n in names
                        if n.endswith(".index") and (m := CKPT_NUM_RE.fullmatch(n[:-6]))]
                latest_before = max([d for d in done if d != writing] or [0])
                killed = True
        if fire and not killed:
            proc.signal(sig)
            kill_t = proc.elapsed()
            killed = True
    rc = proc.wait(timeout)
    lines = proc.text().splitlines()
    resumed_from, resumed = None, 0
    for line in lines:
        m = RESUMED_RE.search(line)
        if m:
            resumed_from, resumed = m.group(1), int(m.group(2))
            break
    steps = _steps(lines)
    sigterm = [int(m.group(1)) for m in map(SIGTERM_RE.search, lines) if m]
    if resumed_from is None and not steps and not sigterm:
        resumed = start  # killed before it said: it had this checkpoint to resume from
    reached = max(steps + sigterm + [resumed])
    if killed and rc == 0:
        killed = False  # it finished before the signal landed
    return Attempt(rc=rc, resumed=resumed, resumed_from=resumed_from, reached=reached,
                   killed=killed, kill_t=kill_t, sigterm_step=sigterm[-1] if sigterm else None,
                   temp_seen=temp_seen, writing=writing, latest_before=latest_before,
                   log_tail=proc.tail(), seconds=proc.elapsed())


def plan_kills(n: int, rng: random.Random, startup_s: float, loop_s: float) -> List[Kill]:
    kinds = [("sigterm", "sigkill", "sigkill_ckpt")[i % 3] for i in range(n)]
    rng.shuffle(kinds)
    plan = []
    for kind in kinds:
        if kind == "sigkill_ckpt":
            # the save takes ~0.1 s here: SIGKILL at its first file, or up to 0.1 s later
            plan.append(Kill(kind, "ckpt", nth_write=rng.choice((1, 1, 2)),
                             write_delay=rng.choice((0.0, rng.uniform(0.0, 0.1)))))
        elif rng.random() < 0.3:  # during start-up / restore / tracing
            plan.append(Kill(kind, "startup", delay=rng.uniform(0.3, startup_s)))
        else:
            plan.append(Kill(kind, "training", lines=rng.randint(1, 2),
                             delay=rng.uniform(0.0, loop_s),
                             startup_delay=rng.uniform(0.3, startup_s)))
    return plan


def reference_pretraining(setup: PretrainSetup, model_dir: str, log_path: str) -> dict:
    """The uninterrupted run, with its model_dir listed in a tight loop: every name that
    appears while it runs but is gone at the end is a temporary one."""
    proc = Proc(setup.cmd(model_dir), log_path)
    ever = set()

    def record(names):
        ever.update(names)
        for n in names:
            if os.path.isdir(os.path.join(model_dir, n)) and n.endswith("_temp"):
                try:
                    ever.update(f"{n}/{x}" for x in os.listdir(os.path.join(model_dir, n)))
                except FileNotFoundError:
                    pass
        return False
    poll_dir(model_dir, record, proc, interval=0.001)
    rc = proc.wait()
    lines = proc.text().splitlines()
    first_step = next((t for t, l in proc.lines if STEP_RE.search(l)), None)
    steps_t = [t for t, l in proc.lines if STEP_RE.search(l)]
    loop_s = ((steps_t[-1] - steps_t[0]) / max(len(steps_t) - 1, 1)) if len(steps_t) > 1 else 1
    final = set(os.listdir(model_dir)) if os.path.isdir(model_dir) else set()
    swept = re.compile(r"ckpt-\d+\.(index|data-\d+-of-\d+)$")  # old ones, deleted after 5
    temps = sorted(n for n in ever if (n.split("/")[0] not in final and not swept.match(n))
                   or is_temp_name(n))
    return {"rc": rc, "seconds": proc.elapsed(), "first_step_s": first_step or 0.0,
            "loop_s": loop_s, "temp_names": temps, "tail": proc.tail(),
            "final_step": max(_steps(lines) or [0])}


def interrupted_pretraining(setup: PretrainSetup, model_dir: str, logs: str, plan: List[Kill],
                            report: Callable[[str], None], max_attempts: int = 100) -> dict:
    """Runs the command, killing it as planned, rerunning until it exits 0. -> records."""
    records, failures = [], []
    pending = None  # the record of the last kill, until the rerun shows where it resumed
    n_attempts, final = 0, None
    while n_attempts < max_attempts:
        start = latest_step(model_dir) if os.path.isdir(model_dir) else 0
        kill = plan[len(records)] if len(records) < len(plan) else None
        if kill is not None and kill.phase == "training":
            # a kill after `lines` step lines needs them to come before the run ends
            left = (setup.steps - start) // setup.loop - 1
            kill = dataclasses.replace(kill, lines=min(kill.lines, left)) if left >= 1 else \
                dataclasses.replace(kill, phase="startup", delay=kill.startup_delay)
        if kill is not None and kill.phase == "ckpt":
            kill = dataclasses.replace(kill, min_ckpt=min(
                setup.steps, (start // setup.save + kill.nth_write) * setup.save))
        att = pretrain_attempt(setup, model_dir, os.path.join(logs, f"attempt{n_attempts}.log"),
                               kill)
        n_attempts, final = n_attempts + 1, att
        if pending is not None:
            rec, pending = pending, None
            rec["resumed"] = att.resumed
            rec["lost"] = rec["reached"] - att.resumed
            ok = rec["ok"] and rec["lost"] <= rec["bound"] and att.resumed == rec["latest_after"]
            if rec["sigterm_step"] is not None:
                ok = ok and att.resumed == rec["sigterm_step"]
            if rec["writing"] is not None:
                ok = ok and att.resumed <= rec["writing"]
            rec["ok"] = ok
            report(_format_kill(rec))
            if not ok:
                failures.append(_format_kill(rec).strip())
        expected = {0} | ({PREEMPTED, -signal.SIGTERM} if kill and kill.kind == "sigterm" else
                          {-signal.SIGKILL} if kill else set())
        if att.rc not in expected or (att.rc != 0 and not att.killed):
            failures.append(f"attempt {n_attempts - 1} (resumed from "
                            f"{att.resumed_from or 'nothing'}) exited {att.rc}:\n{att.log_tail}")
            break
        if att.rc == 0:
            break
        rec = {"i": len(records), "kind": kill.kind, "phase": kill.phase, "rc": att.rc,
               "t": att.kill_t, "reached": att.reached, "writing": att.writing,
               "temp_seen": list(att.temp_seen), "ok": True, "write_delay": kill.write_delay,
               "sigterm_step": att.sigterm_step if att.rc == PREEMPTED else None,
               # SIGTERM: exit 75 after a checkpoint at the step reported, or (before the
               # handler is installed, or after training) death by the signal: nothing lost
               "bound": 0 if kill.kind == "sigterm" else setup.save + setup.loop}
        problem = checkpoint_problem(model_dir)
        rec["latest_after"] = latest_step(model_dir) if problem is None else -1
        if problem:
            rec["ok"], rec["torn"] = False, problem
        records.append(rec)
        pending = rec
    else:
        failures.append(f"not finished after {max_attempts} attempts")
    return {"records": records, "failures": failures, "attempts": n_attempts,
            "final_rc": final.rc if final else None, "final_step": final.reached if final else 0,
            "planned": len(plan), "delivered": len(records)}


def _format_kill(r: dict) -> str:
    what = {"sigterm": "SIGTERM", "sigkill": "SIGKILL", "sigkill_ckpt": "SIGKILL"}[r["kind"]]
    where = ("during the write of ckpt-%s (saw %s; SIGKILL %.0f ms later)" % (
        r["writing"], ", ".join(r["temp_seen"][:2]), 1000 * r.get("write_delay", 0))
             if r["phase"] == "ckpt" else f"{r['phase']} t={r['t']:.1f}s")
    s = (f"  kill {r['i'] + 1:2d}: {what:7s} {where}; exit {r['rc']}, reached step "
         f"{r['reached']}, resumed {r.get('resumed')}, lost {r.get('lost')}")
    if r.get("torn"):
        s += f"; NEWEST CHECKPOINT UNREADABLE: {r['torn']}"
    return s + ("" if r.get("ok", True) else "  <-- FAIL")


# ----------------------------------------------------------------------------- data build


def builder_cmd(out_dir: str, workers: int = 2) -> List[str]:
    return [sys.executable, "-m", "tfrecord_builder", f"--input={CORPUS}",
            f"--vocab_file={VOCAB}", f"--output_dir={out_dir}", f"--num_workers={workers}"]


def dir_digest(path: str) -> Dict[str, str]:
    """sha256 of every file at the top level of a build (the state dir excluded)."""
    out = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def manifest_problem(path: str) -> Optional[str]:
    """None unless manifest.json exists while a shard it names is missing or short."""
    mpath = os.path.join(path, "manifest.json")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"unreadable manifest.json: {e}"
    missing = [s["name"] for s in manifest.get("shards", [])
               if not os.path.exists(os.path.join(path, s["name"]))]
    if missing:
        return f"manifest.json present but {len(missing)} shard(s) missing: {missing[:3]}"
    if not os.path.exists(os.path.join(path, manifest.get("token_counts_file", ""))):
        return "manifest.json present but token_counts.txt missing"
    return None


def builder_faults(ref_dir: str, out_root: str, logs: str, n: int, rng: random.Random,
                   ref_seconds: float, report: Callable[[str], None]) -> dict:
    """n builds into fresh directories, each SIGKILLed once (at a random moment; the last
    while the shards are assembled and renamed into place; the second killing only the
    main process, leaving its workers), then rerun to the end and compared with the
    uninterrupted build. manifest.json must never stand beside missing shards."""
    records, failures = [], []
    kinds = ["random"] * max(n - 1, 0) + (["assembly"] if n else [])
    for i, kind in enumerate(kinds):
        out_dir = f"{out_root}{i}"
        group = not (i == 1 and kind == "random")  # the second kill: the main process only
        proc = Proc(builder_cmd(out_dir), os.path.join(logs, f"build{i}.log"))
        seen_bad: List[str] = []
        # random: once k chunks are finished (k = 0: as soon as the build dir exists)
        k = rng.randint(0, 4)
        pieces_dir = os.path.join(out_dir, ".building", "pieces")

        def watch(names):
            if "manifest.json" in names:
                bad = manifest_problem(out_dir)
                if bad:
                    seen_bad.append(bad)
            if kind == "assembly":  # shards being dealt out, or renamed into place
                return ".building/shards" in names or \
                    any(x.startswith("pretrain_data.tfrecord-") for x in names)
            try:
                done = sum(x.endswith(".stats.npz") for x in os.listdir(pieces_dir))
            except FileNotFoundError:
                return False
            return done >= k
        names = poll_dir(out_dir, watch, proc, interval=0.001, recursive=True)
        if names is not None:
            proc.signal(signal.SIGKILL, group=group)
        t = proc.elapsed()
        rc = proc.wait()
        orphans, linger = False, 0.0
        if not group:  # the workers were left running: do they go away by themselves?
            t_dead = time.monotonic()
            while group_alive(proc.p.pid) and time.monotonic() - t_dead < 30:
                time.sleep(0.1)
            linger = time.monotonic() - t_dead
            orphans = bool(group_alive(proc.p.pid))
            if orphans:
                proc.signal(signal.SIGKILL)  # the group we started
        bad = manifest_problem(out_dir)
        if bad:
            seen_bad.append(bad)
        shards = sorted(x for x in os.listdir(out_dir) if x.startswith("pretrain_data.tfrecord-"))
        pieces = len([x for x in os.listdir(pieces_dir) if x.endswith(".stats.npz")]) \
            if os.path.isdir(pieces_dir) else 0
        had_manifest = os.path.exists(os.path.join(out_dir, "manifest.json"))
        # the rerun: the same command, to the end
        rerun = Proc(builder_cmd(out_dir), os.path.join(logs, f"build{i}_rerun.log"))
        rerun_rc = rerun.wait()
        same = rerun_rc == 0 and dir_digest(ref_dir) == dir_digest(out_dir)
        if rerun_rc == 0 and os.path.exists(os.path.join(out_dir, ".building")):
            seen_bad.append("the finished build left .building/ behind")
        rec = {"i": i, "kind": kind, "group": group, "t": t, "rc": rc, "fired": rc != 0,
               "manifest": had_manifest,
               "final_shards": len(shards), "pieces": pieces, "orphans": orphans,
               "workers_linger_s": linger, "bad": seen_bad, "rerun_rc": rerun_rc,
               "rerun_s": rerun.elapsed(), "identical": same}
        rec["ok"] = not seen_bad and not orphans and same and rc != 0
        records.append(rec)
        report(f"  build kill {i + 1}: SIGKILL {'group' if group else 'main process only'} "
               f"{'during shard assembly' if kind == 'assembly' else f'after {k} chunk(s)'} "
               f"t={t:.1f}s, "
               f"exit {rc}; {pieces} finished pieces kept, {len(shards)} final shard(s), "
               f"manifest {'present' if rec['manifest'] else 'absent'}"
               + ("" if group else f", its workers outlived it by {linger:.1f}s"
                  + (" (then killed)" if orphans else ""))
               + f"; rerun exit {rerun_rc} in {rerun.elapsed():.1f}s, output "
               + ("identical" if same else "DIFFERENT")
               + ("" if rec["ok"] else "  <-- FAIL " + "; ".join(
                   seen_bad + (["workers outlived the main process by 30 s"] if orphans else [])
                   + (["the kill came after the build finished"] if rc == 0 else []))))
        if not rec["ok"] and rc != 0:
            failures.append(f"build kill {i + 1}: " + "; ".join(
                seen_bad + (["orphaned worker processes"] if orphans else []) +
                ([] if same else [f"rerun exit {rerun_rc}, output differs from the "
                                  "uninterrupted build"])))
    return {"records": records, "failures": failures,
            "identical": all(r["identical"] for r in records)}


# ----------------------------------------------------------------------------- fine-tuning


def finetune_cmd(init: str, model_dir: str, epochs: float, trials: int, save: int) -> List[str]:
    return [sys.executable, "run_finetuning.py", "--task=polarity",
            f"--data_dir={os.path.join(REPO, 'data')}", f"--init_checkpoint={init}",
            f"--model_dir={model_dir}", f"--num_trials={trials}", "--train_batch_size=8",
            f"--num_train_epochs={epochs}", f"--save_checkpoints_steps={save}",
            "--max_seq_length=64", "--nojit_compile", "--strategy=cpu", "--seed=1"]


def _ft_steps(lines: Sequence[str]) -> List[tuple]:
    """(trial, step) of every step line, the trial counted from the `Trial i ... dev` lines
    and `Trial i already done` lines before it."""
    out, trial = [], None
    for line in lines:
        m = TRIAL_DONE_RE.search(line) or re.search(r"Trial (\d+) already done", line)
        if m:
            trial = int(m.group(1)) + 1
            continue
        m = STEP_RE.search(line)
        if m:
            out.append((trial or 0, int(m.group(1))))
    return out


def w_names(w: dict) -> List[str]:
    """The tensors a comparison found equal."""
    return [n for n in w.get("names", []) if n not in w["differ"]]


def finetune_faults(init: str, ref_dir: str, out_dir: str, logs: str, n: int,
                    rng: random.Random, epochs: float, trials: int, save: int,
                    report: Callable[[str], None]) -> dict:
    failures, records = [], []
    ref = Proc(finetune_cmd(init, ref_dir, epochs, trials, save),
               os.path.join(logs, "finetune_reference.log"))
    rc = ref.wait()
    ref_s = ref.elapsed()
    if rc != 0:
        return {"failures": [f"reference fine-tuning exited {rc}:\n{ref.tail()}"],
                "records": [], "identical": False, "reference_seconds": ref_s}
    total_lines = len(_ft_steps(ref.text().splitlines()))
    for i in range(n):
        kind = "ckpt" if i % 2 == 1 else "random"
        proc = Proc(finetune_cmd(init, out_dir, epochs, trials, save),
                    os.path.join(logs, f"finetune{i}.log"))
        temp_seen = ()
        if kind == "random":
            # inside the first trial, after its first checkpoint, before its last step
            per_trial = max(total_lines // trials, 1)
            k = rng.randint(min(2, per_trial), max(per_trial - 1, 1))
            fired = proc.wait_lines(lambda ls: len(_ft_steps(ls)) >= k, 600)
            if fired:
                time.sleep(rng.uniform(0, 0.2))
                proc.signal(signal.SIGKILL)
        else:
            last = f"trial_{trials - 1}/"  # the last trial: the others are done by then
            names = poll_dir(out_dir, lambda ns: any(is_temp_name(x) and x.startswith(last)
                                                     for x in ns), proc, recursive=True)
            fired = names is not None
            if fired:
                proc.signal(signal.SIGKILL)
                temp_seen = tuple(x for x in names if is_temp_name(x))
        rc = proc.wait()
        steps = _ft_steps(proc.text().splitlines())
        rec = {"i": i, "kind": kind, "rc": rc, "t": proc.elapsed(),
               "reached": steps[-1] if steps else None, "temp_seen": list(temp_seen)}
        problems = [checkpoint_problem(os.path.join(out_dir, d)) for d in
                    sorted(os.listdir(out_dir)) if d.startswith("trial_")] \
            if os.path.isdir(out_dir) else []
        rec["torn"] = [p for p in problems if p]
        records.append(rec)
        if rc == 0:
            report(f"  fine-tune kill {i + 1}: the run finished before the kill")
            break
    final = Proc(finetune_cmd(init, out_dir, epochs, trials, save),
                 os.path.join(logs, "finetune_final.log"))
    rc = final.wait()
    # where each kill's rerun resumed: the log of the attempt after it
    next_logs = [os.path.join(logs, f"finetune{i + 1}.log") for i in range(len(records) - 1)] + \
        [os.path.join(logs, "finetune_final.log")]
    pairs = [(r, path) for r, path in zip(records, next_logs) if r["rc"] != 0]
    records = [r for r, _ in pairs]
    for rec, path in pairs:
        with open(path) as f:
            text = f.read()
        m = RESUMED_RE.search(text)
        done = re.findall(r"Trial (\d+) already done", text)
        resumed_trial = len(done)
        resumed = int(CKPT_NUM_RE.search(m.group(1)).group(1)) if m else 0
        rec["resumed"] = (resumed_trial, resumed)
        if rec["reached"] is not None:
            r_trial, r_step = rec["reached"]
            rec["lost"] = (r_step - resumed) if r_trial == resumed_trial else \
                (0 if resumed_trial > r_trial else None)
        else:
            rec["lost"] = 0
        bound = save + min(50, save)
        rec["ok"] = not rec["torn"] and rec["lost"] is not None and rec["lost"] <= bound
        what = ("during a checkpoint write (saw %s)" % ", ".join(rec["temp_seen"][:2])
                if rec["kind"] == "ckpt" else f"at random t={rec['t']:.1f}s")
        report(f"  fine-tune kill {rec['i'] + 1}: SIGKILL {what}; exit {rec['rc']}, reached "
               f"trial {rec['reached'][0] if rec['reached'] else '-'} step "
               f"{rec['reached'][1] if rec['reached'] else '-'}, resumed trial "
               f"{rec['resumed'][0]} step {rec['resumed'][1]}, lost {rec['lost']}"
               + ("" if rec["ok"] else f"  <-- FAIL {rec['torn']}"))
        if not rec["ok"]:
            failures.append(f"fine-tune kill {rec['i'] + 1}: lost {rec['lost']}, {rec['torn']}")
    result = {"records": records, "failures": failures, "reference_seconds": ref_s,
              "identical": False}
    if rc != 0:
        failures.append(f"fine-tuning rerun exited {rc}:\n{final.tail()}")
        return result
    with open(os.path.join(ref_dir, "results.json")) as f:
        ra = json.load(f)
    with open(os.path.join(out_dir, "results.json")) as f:
        rb = json.load(f)
    result["scores"] = (ra["scores"], rb["scores"])
    same_results = ra["trials"] == rb["trials"] and ra["scores"] == rb["scores"]
    weights = []
    for t in range(trials):
        a, b = os.path.join(ref_dir, f"trial_{t}"), os.path.join(out_dir, f"trial_{t}")
        w = compare_checkpoints(a, b)
        w["model"] = compare_checkpoints(a, b, prefix="model/")
        weights.append(w)
    same_weights = all(w["equal"] for w in weights)
    result.update(identical=same_results and same_weights, same_results=same_results,
                  weights=weights, trials_ref=ra["trials"], trials_int=rb["trials"])
    if not same_results:
        failures.append(f"fine-tuning results differ: reference {ra['trials']} vs "
                        f"interrupted {rb['trials']}")
    for t, w in enumerate(weights):
        if not w["equal"]:
            failures.append(f"fine-tuning trial {t}: {len(w['differ'])} of {w['n']} checkpoint "
                            f"tensors differ; model/ weights: {len(w['model']['differ'])} of "
                            f"{w['model']['n']}, max abs diff {w['model']['max_abs_diff']:.3g}; "
                            "equal: " + (", ".join(sorted(
                                n.split("/")[0] for n in w_names(w))) or "none"))
    return result


# ----------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=12, help="pre-training kills")
    p.add_argument("--seed", type=int, default=0, help="seed of the random kill plan")
    p.add_argument("--num_train_steps", type=int, default=120)
    p.add_argument("--train_batch_size", type=int, default=8)
    p.add_argument("--save_checkpoints_steps", type=int, default=10)
    p.add_argument("--steps_per_loop", type=int, default=5)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--train_seed", type=int, default=1234, help="--seed of the runs")
    p.add_argument("--builder_kills", type=int, default=3)
    p.add_argument("--finetune_kills", type=int, default=2)
    p.add_argument("--finetune_epochs", type=float, default=1.0)
    p.add_argument("--finetune_trials", type=int, default=2)
    p.add_argument("--finetune_save_steps", type=int, default=5)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: "
                   "pretrain, build, finetune")
    p.add_argument("--workdir", default=None, help="a local directory (default: a new "
                   "temporary one)")
    p.add_argument("--keep", action="store_true", help="keep --workdir after a passing run")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    t_start = time.monotonic()
    work = args.workdir or tempfile.mkdtemp(prefix="fault_injection_")
    os.makedirs(work, exist_ok=True)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    rng = random.Random(args.seed)
    failures: List[str] = []
    figures: dict = {"workdir": work, "args": vars(args)}

    def say(msg):
        print(msg, flush=True)

    # 1. the data, uninterrupted: the reference build and the training data
    data = os.path.join(work, "data_ref")
    say(f"[data] building the bundled sample into {data}")
    proc = Proc(builder_cmd(data), os.path.join(logs, "build_reference.log"))
    rc = proc.wait()
    build_s = proc.elapsed()
    if rc != 0:
        say(f"reference build failed ({rc}):\n{proc.tail()}")
        return 1
    say(f"[data] reference build: {build_s:.1f}s")
    figures["build_reference_s"] = build_s

    ref_dir = os.path.join(work, "pretrain_ref")
    setup = PretrainSetup(data=data, steps=args.num_train_steps, batch=args.train_batch_size,
                          save=args.save_checkpoints_steps, loop=args.steps_per_loop,
                          seed=args.train_seed, max_seq_length=args.max_seq_length)
    pre = None
    if "pretrain" not in skip or "finetune" not in skip:
        say(f"[pretrain] reference run: {' '.join(setup.cmd(ref_dir)[1:])}")
        ref = reference_pretraining(setup, ref_dir, os.path.join(logs, "pretrain_reference.log"))
        figures["pretrain_reference"] = {k: v for k, v in ref.items() if k != "tail"}
        if ref["rc"] != 0:
            say(f"reference pre-training failed ({ref['rc']}):\n{ref['tail']}")
            return 1
        say(f"[pretrain] reference: {ref['seconds']:.1f}s, first step logged at "
            f"{ref['first_step_s']:.1f}s, {ref['loop_s']:.2f}s per host loop; temporary "
            f"names seen in model_dir while saving: {', '.join(ref['temp_names']) or 'none'}")
    if "pretrain" not in skip:
        plan = plan_kills(args.kills, rng, ref["first_step_s"], ref["loop_s"])
        int_dir = os.path.join(work, "pretrain_int")
        say(f"[pretrain] interrupted run: {len(plan)} kills planned")
        pre = interrupted_pretraining(setup, int_dir, logs, plan, say)
        failures += pre["failures"]
        if pre["final_rc"] == 0:
            cmp_all = compare_checkpoints(ref_dir, int_dir)
            cmp_model = compare_checkpoints(ref_dir, int_dir, prefix="model/")
            pre["compare"] = {"all": cmp_all, "model": cmp_model}
            if pre["final_step"] != args.num_train_steps:
                failures.append(f"pre-training ended at step {pre['final_step']}")
            if not cmp_model["equal"]:
                failures.append(f"final pre-training weights differ from the reference: "
                                f"{len(cmp_model['differ'])} of {cmp_model['n']} model/ "
                                f"variables, max abs diff {cmp_model['max_abs_diff']:.3g} "
                                f"(e.g. {cmp_model['differ'][:3]})")
            other = [d for d in cmp_all["differ"] if not d.startswith("model/")]
            if other or cmp_all["only_in_one"]:
                failures.append(f"checkpoint state differs from the reference: "
                                f"{other[:5]} {cmp_all['only_in_one'][:5]}")
            litter = sorted(n for n in os.listdir(int_dir) if is_temp_name(n))
            pre["litter"] = litter
            pre["litter_bytes"] = sum(
                os.path.getsize(os.path.join(int_dir, n)) for n in list_tree(int_dir)
                if n.split("/")[0] in litter and os.path.isfile(os.path.join(int_dir, n)))
        figures["pretrain"] = pre

    bld = None
    if "build" not in skip and args.builder_kills:
        say(f"[build] {args.builder_kills} SIGKILLs of tfrecord_builder")
        bld = builder_faults(data, os.path.join(work, "data_int"), logs, args.builder_kills,
                             rng, build_s, say)
        failures += bld["failures"]
        figures["build"] = bld

    ft = None
    if "finetune" not in skip:
        say(f"[finetune] reference and {args.finetune_kills} SIGKILLs of run_finetuning.py")
        ft = finetune_faults(ref_dir, os.path.join(work, "finetune_ref"),
                             os.path.join(work, "finetune_int"), logs, args.finetune_kills, rng,
                             args.finetune_epochs, args.finetune_trials,
                             args.finetune_save_steps, say)
        failures += ft["failures"]
        figures["finetune"] = ft

    wall = time.monotonic() - t_start
    say("")
    say("=" * 78)
    say("fault injection summary")
    if pre is not None:
        recs = pre["records"]
        by = {k: sum(1 for r in recs if r["kind"] == k) for k in
              ("sigterm", "sigkill", "sigkill_ckpt")}
        lost = [r.get("lost") or 0 for r in recs]
        torn = [r for r in recs if r.get("torn")]
        say(f"pre-training: {len(recs)}/{pre['planned']} kills delivered and survived "
            f"(SIGTERM {by['sigterm']}, SIGKILL at random {by['sigkill']}, SIGKILL during a "
            f"checkpoint write {by['sigkill_ckpt']}), {pre['attempts']} runs")
        say(f"  steps lost per kill: max {max(lost or [0])}, total {sum(lost)} (bound "
            f"{args.save_checkpoints_steps + args.steps_per_loop}; SIGTERM: "
            f"{[r.get('lost') for r in recs if r['kind'] == 'sigterm']})")
        say(f"  final step {pre['final_step']}/{args.num_train_steps}; newest checkpoint "
            f"readable after every kill: {'yes' if not torn else 'NO: ' + torn[0]['torn']}")
        if "compare" in pre:
            c = pre["compare"]
            say(f"  final weights vs reference: {c['model']['n']} model/ variables "
                + ("bit-identical" if c["model"]["equal"] else
                   f"DIFFER ({len(c['model']['differ'])}, max abs diff "
                   f"{c['model']['max_abs_diff']:.3g})")
                + f"; all {c['all']['n']} checkpoint tensors "
                + ("identical" if c["all"]["equal"] else f"differ in {c['all']['differ'][:4]}"))
            say("  left in model_dir by killed writes (never cleaned up): "
                + (f"{', '.join(pre['litter'])} ({pre['litter_bytes'] / 2**20:.1f} MiB)"
                   if pre["litter"] else "nothing"))
    if bld is not None:
        br = bld["records"]
        assembly = sum(r["kind"] == "assembly" and r["fired"] for r in br)
        say(f"builder: {sum(r['fired'] for r in br)} SIGKILLs ({assembly} "
            f"during shard assembly, {sum(not r['group'] and r['fired'] for r in br)} of the "
            f"main process "
            f"only); partial output never had a manifest: "
            f"{'yes' if not any(r['bad'] for r in br) else 'NO'}; orphaned workers: "
            f"{'yes' if any(r['orphans'] for r in br) else 'none'}; every rerun's output "
            f"identical to the uninterrupted build: {'yes' if bld['identical'] else 'NO'}")
    if ft is not None:
        fr = ft["records"]
        say(f"fine-tuning: {sum(r['rc'] != 0 for r in fr)} SIGKILLs "
            f"({sum(r['kind'] == 'ckpt' for r in fr)} during a checkpoint write), steps lost "
            f"{[r.get('lost') for r in fr]}; results "
            + ("identical" if ft.get("same_results") else f"DIFFER {ft.get('scores')}")
            + "; final weights "
            + ("bit-identical" if ft["identical"] else "DIFFER: " + "; ".join(
                f"trial {t}: {len(w['model']['differ'])}/{w['model']['n']} model/ "
                f"variables, max abs diff {w['model']['max_abs_diff']:.3g}"
                for t, w in enumerate(ft.get("weights", [])) if not w["equal"])))
    say(f"wall time {wall:.0f}s")
    say("ALL CHECKS PASSED" if not failures else f"{len(failures)} CHECK(S) FAILED:")
    for f in failures:
        say("  - " + f)
    removed = not failures and args.workdir is None and not args.keep
    say(f"logs: {logs}" + (" (removed; --keep keeps them)" if removed else ""))
    figures.update(wall_s=wall, failures=failures)
    if args.json:  # any filesystem TensorFlow knows (local, gs://...)
        if REPO not in sys.path:
            sys.path.insert(0, REPO)
        from electra_tf import fileio
        fileio.write_atomic(args.json, json.dumps(figures, indent=2, default=str))
    if removed:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
