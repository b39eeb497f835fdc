"""Fine-tuning: tasks (data, head, loss, metrics), the compiled fine-tuning step and
SavedModel export. `run_finetuning.py` is the CLI."""


class DataError(ValueError):
    """A malformed task data file; the one-line message names the file and line."""


def where(path: str, line: int) -> str:
    """'path:line' for error messages (line is 1-based)."""
    return f"{path}:{line}"
