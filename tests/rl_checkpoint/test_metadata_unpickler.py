"""The DCP metadata reader builds DCP's own classes only, including enum members pickled through
``getattr`` (as Python 3.11.0-3.11.3, e.g. Debian 12's 3.11.2, writes them)."""

from __future__ import annotations

import io
import pathlib
import pickle

import pytest
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

from rl_checkpoint.dcp_io import _MetadataUnpickler


class _ByGetattr:
    """Pickles as ``getattr(target, name)``, the form those Pythons use for enum members."""

    def __init__(self, target, name):
        self.target, self.name = target, name

    def __reduce__(self):
        return getattr, (self.target, self.name)


def _load(obj):
    return _MetadataUnpickler(io.BytesIO(pickle.dumps(obj))).load()


def test_enum_member_pickled_through_getattr_loads():
    member = _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    assert _load(_ByGetattr(_MEM_FORMAT_ENCODING, member.name)) is member


@pytest.mark.parametrize("target, name", [(pathlib.PosixPath, "home"), (_MEM_FORMAT_ENCODING, "__class__"),
                                          (_MEM_FORMAT_ENCODING, "mro")])
def test_getattr_on_anything_else_is_refused(target, name):
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        _load(_ByGetattr(target, name))
