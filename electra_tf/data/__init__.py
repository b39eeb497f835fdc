"""The input side: TFRecords -> batches (`input_pipeline.py`)."""
