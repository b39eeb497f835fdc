"""The pre-training loss and its gradients on Keras' JAX backend: one `jax.jit` of
`jax.value_and_grad` of the objective (masking, sampling, both networks, every loss and
metric sum), timed on whatever device JAX sees. No optimizer update and no input pipeline:
a first figure for the backend-independent model, not the train step (that needs the JAX
runtime). Needs no TensorFlow.

    KERAS_BACKEND=jax python bench/jax_loss_grad.py --config small --batch_size 128 \\
        --max_seq_length 128 --precisions float32,bfloat16

Prints one row per setting: compile seconds, steady seconds per call, sequences/s, and the
loss (the same batch and seed for every precision)."""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # local: the repo
sys.path.insert(0, REPO)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="small", help="a preset name")
    p.add_argument("--objective", default="electra")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--precisions", default="float32,bfloat16")
    p.add_argument("--steps", type=int, default=10, help="timed calls")
    return p.parse_args(argv)


def measure(args, precision):
    import jax
    import keras
    import numpy as np

    from electra_tf.configs import load_config
    from electra_tf.model.modeling import ElectraPretrainingModel
    from electra_tf.pretraining import objectives

    cfg = load_config(args.config, {"objective.objective": args.objective,
                                    "train.max_seq_length": args.max_seq_length,
                                    "train.train_batch_size": args.batch_size})
    keras.config.set_dtype_policy("mixed_bfloat16" if precision == "bfloat16" else "float32")
    keras.utils.set_random_seed(0)
    objective = objectives.build_objective(cfg)
    model = ElectraPretrainingModel(cfg.model, heads=objective.heads)
    keras.config.set_dtype_policy("float32")
    rows = np.random.default_rng(0).integers(1000, cfg.model.vocab_size,
                                             (args.batch_size, args.max_seq_length))
    rows[:, 0], rows[:, -1] = 101, 102
    batch = {"input_ids": rows.astype(np.int32),
             "input_mask": np.ones(rows.shape, np.int32),
             "segment_ids": np.zeros(rows.shape, np.int32)}
    batch = jax.device_put(batch)
    den = objective.denominators(batch)
    trainable = model.trainable_variables

    def loss_fn(values, seed):
        with keras.StatelessScope(state_mapping=list(zip(trainable, values))):
            loss, _ = objective.loss(model, batch, seed, den, True)
        return loss

    step = jax.jit(jax.value_and_grad(loss_fn))
    values = [v.value for v in trainable]
    seed = np.array([1, 2, 0], np.int32)
    start = time.perf_counter()
    loss, grads = step(values, seed)
    jax.block_until_ready(grads)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(args.steps):
        loss, grads = step(values, np.array([1, 2 + i, 0], np.int32))
    jax.block_until_ready((loss, grads))
    per_call = (time.perf_counter() - start) / args.steps
    return {"config": args.config, "precision": precision, "batch": args.batch_size,
            "length": args.max_seq_length, "compile_s": compile_s, "call_s": per_call,
            "seq_per_s": args.batch_size / per_call, "loss": float(step(values, seed)[0]),
            "device": str(jax.devices()[0])}


def main(argv=None):
    args = parse_args(argv)
    for precision in args.precisions.split(","):
        row = measure(args, precision)
        print(f"{row['config']:6s} {row['precision']:9s} batch {row['batch']:4d} x "
              f"{row['length']:4d} | compile {row['compile_s']:6.1f} s | "
              f"{row['call_s'] * 1e3:8.2f} ms/call | {row['seq_per_s']:9.1f} seq/s | "
              f"loss {row['loss']:.4f} | {row['device']}", flush=True)


if __name__ == "__main__":
    main()
