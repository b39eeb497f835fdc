"""The networks: encoder, generator, discriminator and their heads (`modeling.py`)."""
