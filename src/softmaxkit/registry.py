"""The registry of normalizers: one :class:`NormalizerSpec` per name, and :func:`normalize`.

A normalizer is defined once, in ``softmaxkit.functional``, and registered once, here.
Attention, losses, scores and the arena look normalizers up by name through this
module and never keep a private copy of a formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from . import functional as F


@dataclass(frozen=True)
class NormalizerSpec:
    """What softmaxkit knows about one normalizer.

    Attributes:
        name: the registered name, as passed to :func:`normalize`.
        fn: the reference function ``fn(x, dim=-1, mask=None, **params)``.
        formula: the definition, row-wise over ``dim``.
        sums_to_one: every row with a visible entry sums to one.
        can_be_sparse: outputs can contain exact zeros at visible entries.
        shift_invariant: ``fn(x + c) == fn(x)`` for a constant ``c`` per row.
        passes: passes over the keys needed to stream it in attention (1 or 2), or
            ``None`` for a threshold search over several passes (sparsemax, entmax).
        params: keyword parameters and their defaults.
        learnable: parameters that :class:`softmaxkit.nn.Normalizer` owns, with their
            initial values (as the papers initialise them).
        streamable: attention can accumulate it over key blocks with O(1) state per query
            (DESIGN.md); sparse_softmax is not (its top-k needs O(k) state).
        reference: the paper.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    formula: str
    sums_to_one: bool
    can_be_sparse: bool
    shift_invariant: bool
    passes: int | None
    params: Mapping[str, object]
    reference: str
    learnable: Mapping[str, object] = field(default_factory=dict)
    streamable: bool = True

    @property
    def streaming(self) -> str:
        """How attention streams it: ``"one pass"``, ``"2 passes"``, ``"threshold search"``,
        or ``"dense"`` when it cannot be streamed with O(1) state per query."""
        if not self.streamable:
            return "dense"
        if self.passes is None:
            return "threshold search"
        return "one pass" if self.passes == 1 else f"{self.passes} passes"


_REGISTRY: dict[str, NormalizerSpec] = {}


def register(spec: NormalizerSpec) -> NormalizerSpec:
    """Add ``spec`` to the registry; a name can be registered once."""
    if spec.name in _REGISTRY:
        raise ValueError(f"normalizer {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> NormalizerSpec:
    """The spec registered as ``name``; ``ValueError`` listing the registered names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown normalizer name={name!r}; registered names: {', '.join(sorted(_REGISTRY))}"
        ) from None


def normalizers() -> list[NormalizerSpec]:
    """Every registered normalizer, in registration order."""
    return list(_REGISTRY.values())


def names() -> list[str]:
    """Every registered name, in registration order."""
    return list(_REGISTRY)


def normalize(x: torch.Tensor, name: str, dim: int = -1, mask: torch.Tensor | None = None, **params) -> torch.Tensor:
    """Apply the normalizer registered as ``name`` to ``x`` along ``dim``.

    Args:
        x: scores, any shape, floating point.
        name: a registered name (see :func:`normalizers` or ``softmaxkit list``).
        dim: the axis to normalise.
        mask: bool, broadcastable to ``x``, True = visible; masked entries get 0.
        **params: the normalizer's parameters (see ``NormalizerSpec.params``).

    Example:
        >>> import torch, softmaxkit as sk
        >>> sk.normalize(torch.tensor([1.0, 2.0, 3.0]), "sparsemax")
        tensor([0.0000, 0.0000, 1.0000])
    """
    spec = get(name)
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        accepted = ", ".join(spec.params) or "none"
        raise TypeError(f"normalizer {name!r} got unexpected parameter(s) {unknown}; accepted: {accepted}")
    return spec.fn(x, dim=dim, mask=mask, **params)


def _register_builtin() -> None:
    rows = [
        ("softmax", F.softmax, "exp(x/T - m) / sum exp(x/T - m)", True, False, True, 1,
         {"temperature": 1.0}, "Bridle 1990; temperature: Hinton et al. 2015, arXiv 1503.02531", {}),
        ("adaptive_softmax", F.adaptive_softmax,
         "softmax(beta x), beta = max(poly(H(softmax x)), 1) if H > 0.5 else 1", True, False, True, 2,
         {"detach_beta": False}, "Velickovic et al. 2024, arXiv 2410.01104", {}),
        ("ssmax", F.ssmax, "softmax(s log(n) x)", True, False, True, 1,
         {"s": F.SSMAX_S_INIT, "n": None}, "Nakanishi 2025, arXiv 2501.19399", {"s": F.SSMAX_S_INIT}),
        ("sa_softmax", F.sa_softmax, "x * softmax(x)  (normalized: rescaled x * softmax(x))", False, False, False, 1,
         {"normalized": False, "eps": 1e-6}, "Self-Adjust Softmax, Zheng et al. 2025, arXiv 2502.18277", {}),
        ("multimax", F.multimax, "softmax(sigma(x)), piecewise-quadratic modulator sigma", True, False, False, 1,
         {"r": F.MULTIMAX_R_INIT, "t": F.MULTIMAX_T_INIT}, "Zhou, Fritz & Keuper, ICML 2024, arXiv 2406.01189",
         {"r": F.MULTIMAX_R_INIT, "t": F.MULTIMAX_T_INIT}),
        ("sparse_softmax", F.sparse_softmax, "softmax over the k largest entries, 0 elsewhere", True, True, True, None,
         {"k": None}, "Sun et al. 2021, Sparse-softmax, arXiv 2112.12433", {}),
        ("sparsemax", F.sparsemax, "[x - tau]_+ with sum 1", True, True, True, None,
         {}, "Martins & Astudillo 2016, arXiv 1602.02068", {}),
        ("entmax15", F.entmax15, "[(x/2 - tau)]_+^2 with sum 1", True, True, True, None,
         {}, "Peters, Niculae & Martins 2019, arXiv 1905.05702", {}),
        ("entmax", F.entmax, "[(alpha-1) x - tau]_+^(1/(alpha-1)) with sum 1", True, True, True, None,
         {"alpha": 1.5}, "Peters, Niculae & Martins 2019, arXiv 1905.05702; Correia et al. 2019, arXiv 1909.00015",
         {"alpha": 1.5}),
        ("as_entmax", F.as_entmax, "entmax_alpha((delta + beta (log n)^gamma) x)", True, True, True, None,
         {"alpha": 1.5, "beta": 1.0, "gamma": 1.0, "delta": 1.0, "n": None},
         "Adaptive-Scalable Entmax, Vasylenko, Pitorro, Martins & Treviso 2025, arXiv 2506.16640",
         {"alpha": 1.5, "beta": 1.0, "gamma": 1.0}),
        ("softpick", F.softpick, "relu(e^x - 1) / (sum |e^x - 1| + eps)", False, True, False, 1,
         {"eps": 1e-6}, "Zuhri et al. 2025, arXiv 2504.20966", {}),
        ("stablemax", F.stablemax, "s(x) / sum s(x), s(x) = x+1 (x>=0), 1/(1-x) (x<0)", True, False, False, 1,
         {}, "Prieto et al. 2025, arXiv 2501.04697", {}),
        ("clipped_softmax", F.clipped_softmax, "clip((zeta - gamma) softmax(x) + gamma, 0, 1)", False, True, True, 2,
         {"gamma": -0.03, "zeta": 1.0}, "Bondarenko, Nagel & Blankevoort 2023, arXiv 2306.12929", {}),
        ("sigmoid", F.sigmoid, "sigmoid(x + b), b = -log n by default", False, False, False, 1,
         {"bias": None, "bias_offset": 0.0}, "Ramapuram et al. 2024, arXiv 2409.04431", {"bias_offset": 0.0}),
        ("relu", F.relu, "relu(x) / n", False, True, False, 1,
         {}, "Wortsman et al. 2023, arXiv 2309.08586", {}),
        ("relu_l1", F.relu_l1, "relu(x) / (sum relu(x) + eps)", False, True, False, 1,
         {"eps": 1e-6}, "l1-normalised ReLU (Wortsman et al. 2023, arXiv 2309.08586)", {}),
        ("softplus_l1", F.softplus_l1, "softplus(x) / (sum softplus(x) + eps)", False, False, False, 1,
         {"eps": 1e-6}, "l1-normalised softplus", {}),
    ]
    for name, fn, formula, s1, sparse, shift, passes, params, ref, learn in rows:
        register(NormalizerSpec(name=name, fn=fn, formula=formula, sums_to_one=s1, can_be_sparse=sparse,
                                shift_invariant=shift, passes=passes, params=params, reference=ref,
                                learnable=learn, streamable=name != "sparse_softmax"))


_register_builtin()


def table() -> "Table":
    """The registry as a :class:`softmaxkit._table.Table` (what ``softmaxkit list`` prints
    and what the README's normalizer table is generated from)."""
    from ._table import Table

    out = Table(title="Registered normalizers",
                columns=["name", "definition", "sums to one", "can be sparse", "streaming",
                         "parameters", "learnable", "paper"])
    for spec in normalizers():
        params = ", ".join(f"{k}={v}" for k, v in spec.params.items()) or "-"
        learnable = ", ".join(spec.learnable) or "-"
        out.add(spec.name, spec.formula, "yes" if spec.sums_to_one else "no",
                "yes" if spec.can_be_sparse else "no", spec.streaming, params, learnable, spec.reference)
    return out
