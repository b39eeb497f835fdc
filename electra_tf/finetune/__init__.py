"""Fine-tuning: tasks (data, head, loss, metrics), the compiled fine-tuning step and
SavedModel export. `run_finetuning.py` is the CLI."""

import numpy as np


class DataError(ValueError):
    """A malformed task data file; the one-line message names the file and line."""


def read_text(path: str) -> str:
    """The text of a UTF-8 task data file (BOM dropped) on any filesystem; DataError names the
    file, and the line of bad UTF-8."""
    from electra_tf import fileio
    try:
        raw = fileio.read_bytes(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {fileio.error_reason(e)}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - raw.rfind(b"\n", 0, e.start)  # 1-based: rfind is -1 on line 1
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                        f"column {column})") from None


class Features:
    """Base of a task's features (dataclasses of [N, ...] arrays); `ARRAYS`: inputs and labels."""
    ARRAYS = ("input_ids", "input_mask", "segment_ids")

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def arrays(self) -> dict:
        """The `ARRAYS` fields and a `weight` of 1 per row (TaskData.arrays)."""
        return {**{k: getattr(self, k) for k in self.ARRAYS},
                "weight": np.ones([len(self)], np.float32)}
