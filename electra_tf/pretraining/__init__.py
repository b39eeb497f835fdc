"""Pre-training: the losses (pure functions), the objectives built from them, the Pretrainer (the training core's pre-training part), the run, and FLOP counting."""
