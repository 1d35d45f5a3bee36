"""Checkpoints of resumable inference: sharded pytrees saved with orbax, with per-leaf checksums
(``leaves``), restored on any device layout, falling back past a damaged one (``store``)."""

from fli.infer.checkpoint.store import latest_step, read_meta, restore_checkpoint, save_checkpoint  # noqa: F401
