import enum

import pytest

import mxmoe
from mxmoe import ActivationType


def test_flashinfer_numbering():
    # FlashInfer's ActivationType, so values cross engine APIs unchanged (SPEC section 3).
    expected = {
        "Gelu": 0, "Relu": 1, "Silu": 2, "Swiglu": 3, "Geglu": 4, "SwigluBias": 5, "Relu2": 6,
        "SwigluStep": 7, "GegluTanh": 8, "Identity": 9, "Situ": 10, "InvalidType": 11,
    }
    assert {m.name: m.value for m in ActivationType} == expected
    assert issubclass(ActivationType, enum.IntEnum)
    assert ActivationType.Situ == 10 and int(ActivationType.InvalidType) == 11


def test_gated_set():
    gated = {"Swiglu", "Geglu", "SwigluBias", "SwigluStep", "GegluTanh", "Situ"}
    assert {m.name for m in mxmoe.GATED} == gated
    for m in ActivationType:
        assert mxmoe.is_gated(m) == (m.name in gated)
        assert mxmoe.is_gated(int(m)) == mxmoe.is_gated(m.name.lower())


def test_implemented_set():
    assert {m.name for m in mxmoe.IMPLEMENTED} == {"Swiglu", "Geglu", "SwigluBias", "GegluTanh", "Situ"}
    assert mxmoe.IMPLEMENTED <= mxmoe.GATED


def test_activation_type_lookup():
    assert mxmoe.activation_type("situ") is ActivationType.Situ
    assert mxmoe.activation_type("SWIGLUBIAS") is ActivationType.SwigluBias
    assert mxmoe.activation_type(3) is ActivationType.Swiglu
    with pytest.raises(ValueError, match="activation"):
        mxmoe.activation_type("gelu_new")
    with pytest.raises(ValueError, match="activation"):
        mxmoe.activation_type(12)
