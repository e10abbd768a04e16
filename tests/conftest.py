"""Shared test fixtures: the parameters a normalizer needs (read from its spec), a seeded
generator, and a user normalizer registered through the public API for the registry loops."""

import os

import pytest
import torch

# The Triton kernels run on CPU under Triton's interpreter, which must be chosen before
# triton is first imported (its language functions are defined at import): set it here,
# ahead of every test module, unless a GPU is present to run them compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import softmaxkit as sk

#: A normalizer a user would register; the generic tests loop over it with the built-ins.
USER_NAME = "test_relu3_l1"


def cube(x):
    return torch.relu(x) ** 3


def dcube(x):
    return 3 * torch.relu(x) ** 2


def register_user_normalizer():
    """Register :data:`USER_NAME` (idempotent); returns its spec."""
    if USER_NAME not in sk.registry.names():
        sk.register_normalizer(USER_NAME, family="sum_normalized", h=cube, dh=dcube, eps=1e-6)
    return sk.registry.get(USER_NAME)


def builtin_names() -> list[str]:
    return [spec.name for spec in sk.normalizers() if not spec.user]


def names_with_user() -> list[str]:
    """Every built-in name plus :data:`USER_NAME` (registered by the ``user_normalizer`` fixture)."""
    return builtin_names() + [USER_NAME]


@pytest.fixture(autouse=True)
def user_normalizer(request):
    """Register :data:`USER_NAME` for a test parametrized with it; unregister it afterwards."""
    callspec = getattr(request.node, "callspec", None)
    wanted = callspec is not None and USER_NAME in callspec.params.values()
    if wanted:
        register_user_normalizer()
    yield
    if wanted and USER_NAME in sk.registry.names():
        sk.unregister_normalizer(USER_NAME)


def params_for(name: str, length: int | None = None) -> dict:
    """Parameters ``name`` needs that have no default, as an attention layer over rows of
    ``length`` entries would pass them (3 when no length is given)."""
    return sk.registry.get(name).params_for_length({}, 3 if length is None else length)


def learnable_tensors(name: str, dtype=torch.float64) -> dict:
    """Each learnable parameter of ``name`` as a tensor a little away from its initial value
    (inside its constraint), to gradcheck it with the input."""
    out = {}
    for param in sk.registry.get(name).param_specs:
        learn = param.learnable
        if learn is None:
            continue
        init = torch.tensor(learn.init, dtype=dtype)
        offsets = torch.linspace(0.2, 0.5, init.numel(), dtype=dtype).reshape(init.shape)
        signs = torch.tensor([(-1.0) ** i for i in range(init.numel())], dtype=dtype).reshape(init.shape)
        out[param.name] = learn.from_raw(learn.to_raw(init, param.name) + signs * offsets)
    return out


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)
