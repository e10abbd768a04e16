"""softplus_l1: the examples its spec carries, its pieces, and the definition written naively."""


from tests.normalizers._spec_checks import check_spec

NAME = "softplus_l1"


def test_spec():
    check_spec(NAME)
