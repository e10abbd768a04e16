"""as_entmax: the examples its spec carries, its pieces, and the definition written naively."""


import math

from tests.normalizers._spec_checks import check_spec

NAME = "as_entmax"


def test_spec():
    check_spec(NAME)


def test_a_number_n_keeps_float64_precision_on_every_path():
    """``n`` given as a number: its log was taken in float32 (fused and streaming float64 1.8e-8 off)."""
    from softmaxkit.normalizers.as_entmax import length_scale

    scale = length_scale(50, 1.0, 1.0, 1.0)
    assert abs(float(scale) - (1 + math.log(50))) < 1e-15
