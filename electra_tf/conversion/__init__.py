"""Checkpoints and models into and out of other layouts: TF1 and Hugging Face names and arrays
(`formats.py`, CLI `convert.py`); `saved_model_cli.py` runs SavedModels."""
