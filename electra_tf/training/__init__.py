"""The training core that pre-training and fine-tuning share: the state and compiled
step (`trainer.py`) and the outer loop (`loop.py`)."""
