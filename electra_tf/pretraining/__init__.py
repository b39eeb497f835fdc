"""Pre-training: the losses (pure functions), the objectives built from them, the pre-training job (`trainer.PretrainingJob`, on either runtime), the run, and FLOP counting."""
