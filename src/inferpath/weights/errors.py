"""WeightsError: a model file that cannot be turned into the tensors the model needs."""

from __future__ import annotations

from inferpath.errors import ModelFileError


class WeightsError(ModelFileError):
    """A checkpoint file is unreadable, truncated, or lacks a tensor of the right shape.

    The message always names the file, and where one is to blame, the tensor and the
    shape that was expected, so that the user knows which download to redo.
    """
