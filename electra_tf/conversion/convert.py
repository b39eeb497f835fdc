"""The command line of checkpoint conversion: released TF1 checkpoints <-> our pre-training
model_dir (`electra_tf.pretraining.model_dir`), and our discriminator / generator <->
Hugging Face `transformers` directories (safetensors, no torch) or keras-hub presets,
all through one flat dict {TF1 name: numpy array} (`electra_tf.conversion.formats`)."""

import argparse
import dataclasses
import json
import os
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m electra_tf.conversion.convert", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("inspect", help="Print the config inferred from a TF1 checkpoint and "
                       "which variables map.")
    s.add_argument("checkpoint")
    s.add_argument("--num_heads", type=int)
    s = sub.add_parser("import-tf1", help="TF1 checkpoint -> our pre-training model_dir.")
    s.add_argument("checkpoint")
    s.add_argument("model_dir")
    s.add_argument("--num_heads", type=int)
    s.add_argument("--base_config", help="Preset or JSON for the non-model sections.")
    s.add_argument("--params_override", default="")
    s.add_argument("--allow_missing", action="store_true")
    s = sub.add_parser("export-tf1", help="Our model_dir -> TF1 name-based checkpoint.")
    s.add_argument("model_dir")
    s.add_argument("prefix")
    s.add_argument("--include_optimizer", action="store_true")
    s = sub.add_parser("export-hf", help="Our model_dir or a TF1 checkpoint -> Hugging Face "
                       "directories (discriminator, generator when present).")
    s.add_argument("source")
    s.add_argument("out_dir")
    s.add_argument("--num_heads", type=int)
    _vocab_arguments(s)
    s = sub.add_parser("import-hf", help="Hugging Face directories -> TF1 checkpoint.")
    s.add_argument("discriminator_dir")
    s.add_argument("prefix")
    s.add_argument("--generator_dir")
    s = sub.add_parser("export-keras-hub", help="Our model_dir, a TF1 checkpoint or a Hugging "
                       "Face ELECTRA directory -> a keras-hub preset (ElectraBackbone, "
                       "ElectraTokenizer).")
    s.add_argument("source")
    s.add_argument("out")
    s.add_argument("--part", choices=("discriminator", "generator"), default="discriminator")
    _vocab_arguments(s)
    s.add_argument("--num_heads", type=int)
    s = sub.add_parser("import-keras-hub", help="A keras-hub ELECTRA preset -> OUT/model.ckpt "
                       "(TF1 names) and OUT/vocab.txt.")
    s.add_argument("preset")
    s.add_argument("out")
    return p


def _vocab_arguments(s):
    s.add_argument("--vocab_file", help="WordPiece vocab.txt (default: the one SOURCE's run "
                   "recorded, its vocab.json beside the checkpoint, else SOURCE's vocab.txt).")
    s.add_argument("--cased", action="store_const", const=True, default=None,
                   help="Do not lower-case (default: the casing SOURCE's run recorded, else "
                   "lower-case).")


def _vocabulary(args, text, fileio):
    """(vocab.txt path or None, lower-case?) for SOURCE: --vocab_file, else the run's
    recorded vocabulary (`text.find_run_vocab`), else a vocab.txt in or beside SOURCE."""
    found = text.find_run_vocab(args.source)
    lower = not args.cased if args.cased is not None else (
        found.do_lower_case if found and not args.vocab_file else True)
    if args.vocab_file:
        return args.vocab_file, lower
    if found and found.kind == "wordpiece":
        return found.path, lower
    beside = fileio.join(args.source if fileio.isdir(args.source)
                         else os.path.dirname(args.source), "vocab.txt")
    return (beside if fileio.isfile(beside) else None), lower


# Where each command writes, probed before anything is read: (argument, is it a prefix).
_OUTPUTS = {"import-tf1": ("model_dir", False), "export-tf1": ("prefix", True),
            "export-hf": ("out_dir", False), "import-hf": ("prefix", True),
            "export-keras-hub": ("out", True), "import-keras-hub": ("out", True)}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)  # before TensorFlow is imported: --help is instant
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from electra_tf import backend, fileio, text
    from electra_tf.configs import ConfigError
    from electra_tf.conversion import keras_hub
    from electra_tf.conversion.formats import (ConvertError, export_hf, import_hf, is_hf_dir,
                                               write_hf_tokenizer)
    from electra_tf.conversion.source import inspect_tf1, resolve
    from electra_tf.training import checkpoints

    def model_dirs():
        # A model_dir is written and read through the TensorFlow runtime's object graph.
        backend.require_tensorflow(f"convert {args.command}")
        from electra_tf.pretraining import model_dir
        return model_dir

    try:
        if args.command in _OUTPUTS:
            name, is_prefix = _OUTPUTS[args.command]
            out = getattr(args, name)
            directory = os.path.dirname(out) if is_prefix else out
            problem = fileio.writable_dir_problem(directory or ".")
            if problem:
                raise ConvertError(f"{name.upper()} {directory}: cannot write there ({problem})")
        if args.command == "inspect":
            print("\n".join(inspect_tf1(args.checkpoint, args.num_heads).lines()))
        elif args.command == "import-tf1":
            report, path = model_dirs().tf1_to_model_dir(
                args.checkpoint, args.model_dir, args.base_config, args.params_override,
                args.num_heads, args.allow_missing)
            print("\n".join(report.lines()))
            print(f"wrote {path}; continue with: python run_pretraining.py "
                  f"--model_dir={args.model_dir} "
                  f"--config={os.path.join(args.model_dir, 'config.json')}")
        elif args.command == "export-tf1":
            print(model_dirs().model_dir_to_tf1(args.model_dir, args.prefix,
                                                args.include_optimizer))
        elif args.command == "export-hf":
            src = resolve(args.source, num_heads=args.num_heads)
            arrays = src.arrays(slots=False)
            vocab, lower = _vocabulary(args, text, fileio)
            parts = ["discriminator"] + (["generator"] if src.has_generator else [])
            for part in parts:
                out = os.path.join(args.out_dir, part)
                export_hf(arrays, src.config, out, part)
                if vocab:  # AutoTokenizer.from_pretrained(out) tokenises as we trained
                    write_hf_tokenizer(out, vocab, lower, src.config)
                print(out)
            if not vocab:
                print(f"warning: no vocabulary found for {args.source} (no vocab.json or "
                      "vocab.txt with it): no tokenizer files written; give --vocab_file",
                      file=sys.stderr)
        elif args.command == "import-hf":
            config, arrays, unmapped = import_hf(args.discriminator_dir, args.generator_dir)
            print(json.dumps(dataclasses.asdict(config), indent=2))
            if unmapped:
                print(f"unmapped ({len(unmapped)}): {', '.join(unmapped)}")
            print(checkpoints.write_tf1(arrays, args.prefix))
        elif args.command == "export-keras-hub":
            if is_hf_dir(args.source):  # the resolver takes BERT too (fine-tuning does)
                hf_json = fileio.join(args.source, "config.json")
                model_type = fileio.read_json(hf_json).get("model_type")
                if model_type != "electra":
                    raise ConvertError(f"{hf_json}: model_type {model_type!r} is not electra")
            src = resolve(args.source, num_heads=args.num_heads)
            if args.part == "generator" and not src.has_generator:
                raise ConvertError(f"{args.source} holds no generator")
            vocab, lower = _vocabulary(args, text, fileio)
            if vocab is None:
                raise ConvertError(f"no vocabulary found for {args.source} (no vocab.json or "
                                   "vocab.txt with it): give --vocab_file")
            print(keras_hub.export_keras_hub(src.arrays(slots=False), src.config, vocab, args.out,
                                             args.part, lower))
        elif args.command == "import-keras-hub":
            config, arrays, lower = keras_hub.import_keras_hub(args.preset)
            print(json.dumps(dataclasses.asdict(config), indent=2))
            print(f"wrote {keras_hub.write_imported(args.preset, arrays, args.out)}; fine-tune "
                  f"with --init_checkpoint={args.out} --vocab_file={args.out}/vocab.txt "
                  f"--do_lower_case={lower}")
    except (ConvertError, ConfigError, checkpoints.CheckpointError,
            backend.BackendError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
