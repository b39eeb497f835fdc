"""Checkpoints and models out of and into other layouts: TF1 and Hugging Face (`convert.py`), SavedModels (`export.py`, `saved_model_cli.py`)."""
