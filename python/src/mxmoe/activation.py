"""Activation kinds, derived from the C++ X-macro MXMOE_ACTIVATION_LIST (include/mxmoe/activation.h).

The names and values are not written here: the binding exports the list and the IntEnum is built from
it, so they are FlashInfer's numbering by construction (Gelu 0 ... Situ 10, InvalidType 11) and an
IntEnum value crosses into FlashInfer or SGLang code unchanged.
"""

from __future__ import annotations

import enum
from typing import Union

from . import _mxmoe as _C

_LIST = _C.activation_list()  # [(name, value, gated, implemented), ...]

ActivationType = enum.IntEnum("ActivationType", [(name, value) for name, value, _, _ in _LIST])
ActivationType.__module__ = __name__
ActivationType.__doc__ = "FlashInfer's ActivationType numbering; gated kinds have FC1 = [gate; up]."

#: Kinds whose FC1 has 2*I rows (gate and up).
GATED = frozenset(ActivationType(value) for _, value, gated, _ in _LIST if gated)
#: Kinds the reference and every backend implement; any other is refused by name.
IMPLEMENTED = frozenset(ActivationType(value) for _, value, _, impl in _LIST if impl)

ActivationLike = Union[ActivationType, int, str]


def activation_type(activation: ActivationLike) -> ActivationType:
    """An ActivationType from the enum, its integer value or its name (case-insensitive, e.g. "situ").

    Raises ValueError naming the value when it is none of these.
    """
    if isinstance(activation, ActivationType):
        return activation
    if isinstance(activation, bool):
        raise ValueError(f"activation: expected an ActivationType, int or name, got {activation!r}")
    if isinstance(activation, int):
        try:
            return ActivationType(activation)
        except ValueError:
            raise ValueError(
                f"activation: {activation} is not an ActivationType value "
                f"({min(ActivationType)}..{max(ActivationType)}, FlashInfer numbering)"
            ) from None
    if isinstance(activation, str):
        for member in ActivationType:
            if member.name.lower() == activation.lower():
                return member
        names = ", ".join(m.name for m in ActivationType)
        raise ValueError(f"activation: '{activation}' is not an ActivationType name ({names})")
    raise ValueError(f"activation: expected an ActivationType, int or name, got {type(activation).__name__}")


def is_gated(activation: ActivationLike) -> bool:
    """Whether FC1 holds gate and up rows for this kind."""
    return activation_type(activation) in GATED


def is_implemented(activation: ActivationLike) -> bool:
    """Whether mxmoe computes this kind (others are refused, never run as another kind)."""
    return activation_type(activation) in IMPLEMENTED
