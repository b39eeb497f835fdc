"""The input side: TFRecords -> batches (files.py, shards.py, order.py, dataset.py)."""
