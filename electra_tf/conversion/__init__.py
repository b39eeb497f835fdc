"""Checkpoints and models out of and into other layouts: TF1 and Hugging Face names and
arrays (`formats.py`; the command line `convert.py`), SavedModels (`saved_model_cli.py`
runs them; `finetune/export.py` writes them)."""
