"""The registry of normalizers: one :class:`NormalizerSpec` per name.

A built-in normalizer lives in its own module under :mod:`softmaxkit.normalizers`: its
reference function, its parameters, properties, form and examples, registered here once.
A user's normalizer is registered with :func:`register_normalizer` from its form alone.
Everything else (attention, modules, Hugging Face names, losses, bench, arena, the
README table) iterates :func:`normalizers` and reads the spec: no path keeps a list of
names or a copy of a formula.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ._checks import can_branch_on, check_bool, check_known_params, check_number
from .forms import (
    FAMILIES,
    Elementwise,
    Form,
    SoftmaxOf,
    StreamRule,
    SumNormalized,
    Threshold,
    call,
    form_parameters,
    identity,
    rule_from_form,
)

if TYPE_CHECKING:
    from ._table import Table

__all__ = [
    "NormalizerSpec", "Param", "Learnable", "Example", "normalize", "normalizers", "names", "get",
    "register_normalizer", "unregister_normalizer", "table",
]


@dataclass(frozen=True)
class Learnable:
    """How :class:`softmaxkit.nn.Normalizer` learns a parameter, as its paper does.

    Attributes:
        init: the initial value (a number; a tuple for a parameter of several values).
        init_std: when the value given is all zeros, draw it instead from a normal truncated
            at two standard deviations with this std (MultiMax's ``r``, ``t``).
        low, high: keep the value inside ``(low, high)`` by learning ``raw`` with
            ``value = low + (high - low) sigmoid(raw)`` (entmax ``alpha`` in (1, 2)).
    """

    init: float | tuple[float, ...]
    init_std: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def constrained(self) -> bool:
        return self.low is not None and self.high is not None

    def to_raw(self, value: torch.Tensor, name: str) -> torch.Tensor:
        """The tensor a module stores for ``value`` (``ValueError`` naming ``name`` outside the bounds)."""
        if not self.constrained:
            return value
        low, high = float(self.low), float(self.high)  # type: ignore[arg-type]
        if can_branch_on(value) and not bool(((value > low) & (value < high)).all()):   # (meta: no values)
            raise ValueError(f"a learnable {name} must be strictly between {low} and {high}, got {value.tolist()}")
        u = (value - low) / (high - low)
        return torch.log(u / (1 - u))

    def from_raw(self, raw: torch.Tensor) -> torch.Tensor:
        if not self.constrained:
            return raw
        return self.low + torch.sigmoid(raw) * (self.high - self.low)  # type: ignore[operator]


@dataclass(frozen=True)
class Param:
    """One keyword parameter of a normalizer.

    Attributes:
        name: the keyword.
        default: its default, read from the reference function's signature.
        size: values per parameter (MultiMax's ``r`` and ``t`` hold 4; a tensor value then
            has them along its first axis).
        learnable: how a module learns it, or ``None``.
        for_length: ``for_length(value, length)`` is the value an attention layer uses for
            rows of ``length`` keys, given the value it has (``None`` when no caller could
            pass one, as in a Hugging Face layer without a :class:`softmaxkit.nn.Normalizer`):
            sparse_softmax keeps at most the row length.
    """

    name: str
    default: Any = None
    size: int = 1
    learnable: Learnable | None = None
    for_length: Callable[[Any, int], Any] | None = None


@dataclass(frozen=True)
class Example:
    """A known input and output: ``normalize(x, name, **params) == expected``."""

    x: tuple
    expected: tuple
    params: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class NormalizerSpec:
    """What softmaxkit knows about one normalizer.

    Attributes:
        name: the registered name, as passed to :func:`normalize`.
        fn: the reference function ``fn(x, dim=-1, mask=None, **params)``.
        formula: the definition, row-wise over ``dim``.
        reference: the paper (authors, year, arXiv id).
        form: how the other paths compute it (:mod:`softmaxkit.forms`); ``None`` when it has
            no form that streams (``sparse_softmax``: its top-k needs whole rows).
        sums_to_one: every row with a visible entry sums to one.
        can_be_sparse: outputs can contain exact zeros at visible entries.
        shift_invariant: ``fn(x + c) == fn(x)`` for a constant ``c`` per row.
        can_be_negative: outputs can be negative (plain SA-softmax).
        param_specs: the keyword parameters, in signature order.
        stream: builds the normalizer's own :class:`~softmaxkit.forms.StreamRule` from the
            parameters when its form alone does not say how it streams.
        stream_passes: passes over the keys of that rule.
        examples: known inputs and outputs (its tests run them).
        tsallis_alpha: for a normalizer that is alpha-entmax of the raw scores outside the
            threshold family (softmax: alpha = 1), alpha from the parameters, or ``None``.
        user: registered from user code with :func:`register_normalizer`.
        triton: a factory (no arguments, imports triton lazily) returning the form's pieces as
            Triton functions (:class:`softmaxkit.kernels.gpu.pieces.TritonPieces`) for the
            fused GPU attention kernels; ``None``: those kernels fall back to the other paths.
        numba: the same for the CPU fused attention's row kernels: a factory returning
            :class:`softmaxkit.kernels.cpu.pieces.NumbaPieces`; ``None``: torch operations.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    formula: str
    reference: str
    form: Form | None
    sums_to_one: bool
    can_be_sparse: bool
    shift_invariant: bool
    can_be_negative: bool = False
    param_specs: tuple[Param, ...] = ()
    stream: Callable[[Mapping[str, Any]], StreamRule | None] | None = None
    stream_passes: int | None = None
    examples: tuple[Example, ...] = ()
    tsallis_alpha: Callable[[Mapping[str, Any]], Any] | None = None
    user: bool = False
    triton: Callable[[], Any] | None = None
    numba: Callable[[], Any] | None = None

    @property
    def family(self) -> str | None:
        return None if self.form is None else self.form.family

    @property
    def params(self) -> dict[str, Any]:
        """Keyword parameters and their defaults."""
        return {p.name: p.default for p in self.param_specs}

    @property
    def learnable(self) -> dict[str, Any]:
        """Learnable parameters and their initial values."""
        return {p.name: p.learnable.init for p in self.param_specs if p.learnable is not None}

    def param(self, name: str) -> Param:
        for p in self.param_specs:
            if p.name == name:
                return p
        raise ValueError(f"normalizer {self.name!r} has no parameter {name!r}; parameters: "
                         f"{', '.join(self.params) or 'none'}")

    @property
    def streamable(self) -> bool:
        """Attention can accumulate it over key blocks with O(1) state per query (DESIGN.md), at
        its default parameters (a threshold form streams for ``1 < alpha <= 2`` only)."""
        if self.stream is not None:
            return True
        if isinstance(self.form, Threshold):
            return self.stream_rule({}) is not None
        return self.form is not None

    @property
    def passes(self) -> int | None:
        """Passes over the keys when streaming (``None``: a threshold search over several)."""
        if isinstance(self.form, Threshold):
            return None
        if self.stream_passes is not None:
            return self.stream_passes
        return self.form.passes if isinstance(self.form, SoftmaxOf) else 1

    @property
    def streaming(self) -> str:
        """``"one pass"``, ``"2 passes"``, ``"threshold search"`` or ``"dense"``."""
        if not self.streamable:
            return "dense"
        passes = self.passes
        if passes is None:
            return "threshold search"
        return "one pass" if passes == 1 else f"{passes} passes"

    def with_defaults(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` over the defaults; ``TypeError`` for a name the normalizer does not take."""
        check_known_params(params, self.params, f"normalizer {self.name!r}")
        return {**self.params, **params}

    def stream_rule(self, params: Mapping[str, Any]) -> StreamRule | None:
        """The streaming rule for these parameters (defaults filled in), or ``None``: dense only."""
        merged = self.with_defaults(params)
        if self.stream is not None:
            return self.stream(merged)
        if self.form is None:
            return None
        return rule_from_form(self.form, merged)

    def params_for_length(self, params: Mapping[str, Any], length: int) -> dict[str, Any]:
        """``params`` as an attention layer over rows of ``length`` keys uses them (see :class:`Param`)."""
        out = dict(params)
        for p in self.param_specs:
            if p.for_length is not None:
                out[p.name] = p.for_length(out.get(p.name), length)
        return out

    def entmax_alpha(self, params: Mapping[str, Any]) -> Any:
        """The alpha for which this normalizer is alpha-entmax of the raw scores, or ``None``.

        softmax (temperature 1) is alpha = 1; the threshold family gives its alpha when its
        map ``g`` is the identity. This is what a Fenchel-Young loss needs.
        """
        merged = self.with_defaults(params)
        if self.tsallis_alpha is not None:
            return self.tsallis_alpha(merged)
        if isinstance(self.form, Threshold) and self.form.g is identity:
            return self.form.alpha(merged)
        return None


_REGISTRY: dict[str, NormalizerSpec] = {}


def signature_params(fn: Callable[..., Any]) -> dict[str, Any]:
    """The keyword parameters of a reference function ``fn(x, dim=-1, mask=None, **params)``."""
    params = list(inspect.signature(fn).parameters.values())
    head = [p.name for p in params[:3]]
    if head != ["x", "dim", "mask"]:
        raise TypeError(f"a reference function takes (x, dim=-1, mask=None, ...), got ({', '.join(head)}, ...)")
    return {p.name: (None if p.default is inspect.Parameter.empty else p.default) for p in params[3:]}


def builtin(fn: Callable[..., torch.Tensor], *, form: Form | None, formula: str, reference: str,
            sums_to_one: bool, can_be_sparse: bool, shift_invariant: bool, can_be_negative: bool = False,
            learnable: Mapping[str, Learnable] | None = None, sizes: Mapping[str, int] | None = None,
            for_length: Mapping[str, Callable[[Any, int], Any]] | None = None,
            stream: Callable[[Mapping[str, Any]], StreamRule | None] | None = None,
            stream_passes: int | None = None, examples: tuple[Example, ...] = (),
            tsallis_alpha: Callable[[Mapping[str, Any]], Any] | None = None,
            triton: Callable[[], Any] | None = None,
            numba: Callable[[], Any] | None = None) -> NormalizerSpec:
    """Register a built-in normalizer from its reference function ``fn`` (its name is the
    registered name and its signature the parameter list) and return the spec."""
    learnable, sizes, for_length = learnable or {}, sizes or {}, for_length or {}
    defaults = signature_params(fn)
    for extra in set(learnable) | set(sizes) | set(for_length):
        if extra not in defaults:
            raise ValueError(f"{fn.__name__}: {extra!r} is not a parameter of the reference function")
    specs = tuple(Param(name, default, sizes.get(name, 1), learnable.get(name), for_length.get(name))
                  for name, default in defaults.items())
    spec = NormalizerSpec(name=fn.__name__, fn=fn, formula=formula, reference=reference, form=form,
                          sums_to_one=sums_to_one, can_be_sparse=can_be_sparse, shift_invariant=shift_invariant,
                          can_be_negative=can_be_negative, param_specs=specs, stream=stream,
                          stream_passes=stream_passes, examples=examples,
                          tsallis_alpha=tsallis_alpha, triton=triton, numba=numba)
    _add(spec)
    return spec


def _add(spec: NormalizerSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"normalizer {spec.name!r} is already registered; unregister_normalizer({spec.name!r}) "
                         "first to replace it")
    _REGISTRY[spec.name] = spec


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


def normalize(x: torch.Tensor, name: str, dim: int = -1, mask: torch.Tensor | None = None,
              **params: Any) -> torch.Tensor:
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
        tensor([0., 0., 1.])
    """
    spec = get(name)
    check_known_params(params, spec.params, f"normalizer {name!r}")
    return spec.fn(x, dim=dim, mask=mask, **params)


_FORMS = {"softmax_of": SoftmaxOf, "sum_normalized": SumNormalized, "elementwise": Elementwise,
          "threshold": Threshold}
_FORMULAS = {"softmax_of": "softmax(g(x))", "sum_normalized": "h(x) / (sum h(x) + eps)",
             "elementwise": "h(x)", "threshold": "alpha-entmax(g(x))"}


#: Names a user's normalizer may not start with: ``softmaxkit_linear_<method>`` are the Hugging
#: Face names of the linear-attention methods (:mod:`softmaxkit.hf`).
RESERVED_PREFIX = "linear_"


def register_normalizer(name: str, family: str, *, h: Callable | None = None, dh: Callable | None = None,
                        g: Callable | None = None, dg: Callable | None = None, alpha: float | None = None,
                        eps: float | None = None, formula: str | None = None, reference: str = "user-defined",
                        sums_to_one: bool | None = None, can_be_sparse: bool = False,
                        shift_invariant: bool = False) -> NormalizerSpec:
    r"""Register a normalizer of your own; it then works everywhere a built-in one does.

    ``sk.normalize``, ``sk.attention`` (dense and streaming, forward and backward),
    ``sk.nn.Normalizer``, ``sk.nn.Attention``, the Hugging Face names and the bench and
    arena lists all read the spec. The family says what the pieces mean:

    * ``"softmax_of"``: ``softmax(g(x))``; give ``g`` and its derivative ``dg``;
    * ``"sum_normalized"``: ``h(x) / (sum h(x) + eps)``; give ``h``, ``dh`` and ``eps``
      (``h`` must be non-negative). ``eps`` defaults to 0, which suits an ``h`` positive
      everywhere (``torch.exp``); where ``h`` can be 0 over a whole row (a ReLU-like ``h``),
      give ``eps > 0``, or such a row is ``0 / 0 = NaN``, as the formula says (the built-in
      ``relu_l1``, ``softpick`` and ``softplus_l1`` require ``eps > 0``);
    * ``"elementwise"``: ``h(x)``; give ``h`` and ``dh``;
    * ``"threshold"``: ``alpha-entmax(g(x))``; give ``alpha`` (``g`` defaults to the identity).

    A piece takes the scores first; its other arguments become the normalizer's keyword
    parameters, with the piece's defaults, and an argument named ``n`` receives the number
    of visible entries of the row.

    Example:
        >>> def cube(x): return torch.relu(x) ** 3
        >>> def dcube(x): return 3 * torch.relu(x) ** 2
        >>> sk.register_normalizer("relu3_l1", family="sum_normalized", h=cube, dh=dcube, eps=1e-6)
        >>> p = sk.normalize(torch.randn(8, 50), "relu3_l1")

    Raises:
        ValueError: the name is taken (``unregister_normalizer`` it first), the family is
            unknown, a piece the family needs is missing, or a derivative piece (``dg``,
            ``dh``) disagrees with central differences of its function at a few scores
            (:data:`DERIVATIVE_PROBES`, the pieces' default parameters).
    """
    from .normalizers._generic import reference_for

    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Python identifier (it becomes softmaxkit_<name>), got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"normalizer {name!r} is already registered; unregister_normalizer({name!r}) first")
    if name.startswith(RESERVED_PREFIX):
        raise ValueError(f"name must not start with {RESERVED_PREFIX!r}: softmaxkit_{RESERVED_PREFIX}<method> names "
                         f"the Hugging Face linear-attention methods, got {name!r}")
    sums_to_one = None if sums_to_one is None else check_bool(sums_to_one, "sums_to_one")
    can_be_sparse = check_bool(can_be_sparse, "can_be_sparse")
    shift_invariant = check_bool(shift_invariant, "shift_invariant")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(map(repr, FAMILIES))}, got {family!r}")
    pieces: dict[str, dict[str, Any]] = {
        "softmax_of": {"g": g, "dg": dg}, "sum_normalized": {"h": h, "dh": dh},
        "elementwise": {"h": h, "dh": dh},
        "threshold": {"alpha": alpha, **({"g": g, "dg": dg} if g is not None or dg is not None else {})}}
    needs = pieces[family]
    missing = [k for k, v in needs.items() if v is None]
    if missing:
        raise ValueError(f"family {family!r} needs {', '.join(missing)}")
    for piece_name, piece in needs.items():
        if piece_name not in ("g", "dg", "h", "dh"):   # (alpha: a number, checked below)
            continue
        if not callable(piece):
            raise TypeError(f"{piece_name} must be callable, got {type(piece).__name__}")
        try:
            hash(piece)
        except TypeError:   # (pieces are looked up by identity in caches: a dataclass instance is unhashable)
            raise TypeError(f"{piece_name} must be hashable (a function, or an object with __hash__), "
                            f"got an unhashable {type(piece).__name__}") from None
    unused = [k for k, v in {"h": h, "dh": dh, "g": g, "dg": dg, "alpha": alpha, "eps": eps}.items()
              if v is not None and k not in needs and not (family == "sum_normalized" and k == "eps")]
    if unused:
        raise ValueError(f"family {family!r} does not take {', '.join(unused)}")
    form: Form
    if family == "softmax_of":
        form = SoftmaxOf(g=g, dg=dg)  # type: ignore[arg-type]
    elif family == "sum_normalized":
        form = SumNormalized(h=h, dh=dh)  # type: ignore[arg-type]
    elif family == "elementwise":
        form = Elementwise(h=h, dh=dh)  # type: ignore[arg-type]
    else:
        check_number(alpha, "alpha", allow_tensor=False)
        if not 1 <= alpha < math.inf:  # type: ignore[operator]
            raise ValueError(f"alpha must be a finite number >= 1, got {alpha}")
        fixed_alpha = float(alpha)  # type: ignore[arg-type]
        if g is None:
            form = Threshold(alpha=lambda params: fixed_alpha)
        else:
            form = Threshold(alpha=lambda params: fixed_alpha, g=g, dg=dg)  # type: ignore[arg-type]
    defaults = form_parameters(form)
    if family == "sum_normalized":
        eps = 0.0 if eps is None else eps
        check_number(eps, "eps", allow_tensor=False)
        if not (eps >= 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a finite number >= 0, got {eps}")
        defaults["eps"] = float(eps)
    for pname in ("x", "dim", "mask"):
        if pname in defaults:
            raise ValueError(f"a piece parameter may not be called {pname!r}")
    for fn_name, dfn_name in (("g", "dg"), ("h", "dh")):
        if needs.get(fn_name) is not None and needs.get(dfn_name) is not None:
            _check_derivative(needs[fn_name], needs[dfn_name], fn_name, dfn_name, defaults)
    spec = NormalizerSpec(
        name=name, fn=reference_for(name, form, defaults), formula=formula or _FORMULAS[family],
        reference=reference, form=form,
        sums_to_one=family in ("softmax_of", "threshold") if sums_to_one is None else sums_to_one,
        can_be_sparse=can_be_sparse or family == "threshold", shift_invariant=shift_invariant,
        param_specs=tuple(Param(k, v) for k, v in defaults.items()), user=True)
    _add(spec)
    return spec


#: Scores at which :func:`register_normalizer` compares a derivative piece with its function's
#: central differences: away from 0 and the integers, where ReLU-like pieces have kinks.
DERIVATIVE_PROBES = (-2.71, -1.37, -0.43, 0.29, 0.61, 1.13, 2.39)


def _check_derivative(fn: Callable, dfn: Callable, fn_name: str, dfn_name: str, defaults: dict) -> None:
    """``ValueError`` when ``dfn`` is not ``fn``'s derivative at :data:`DERIVATIVE_PROBES`
    (float64 central differences, step 1e-6, rows of 8 entries for an ``n``; relative
    tolerance 1e-4). Skipped where the pieces cannot be evaluated with their defaults (a
    parameter without one, an error, a non-finite value): the call then reports it."""
    if any(value is None for value in defaults.values()):
        return
    x = torch.tensor(DERIVATIVE_PROBES, dtype=torch.float64)
    step = 1e-6
    count = torch.full_like(x, 8.0)
    try:
        with torch.no_grad():
            slope = (call(fn, x + step, defaults, count) - call(fn, x - step, defaults, count)) / (2 * step)
            given = call(dfn, x, defaults, count)
        slope, given = torch.as_tensor(slope, dtype=torch.float64), torch.as_tensor(given, dtype=torch.float64)
        slope, given = torch.broadcast_tensors(slope, given)
    except Exception:
        return
    finite = torch.isfinite(slope) & torch.isfinite(given)
    off = finite & ((given - slope).abs() > 1e-4 * (1 + slope.abs()))
    if bool(off.any()):
        i = int(off.nonzero()[0, 0])
        raise ValueError(f"{dfn_name} is not the derivative of {fn_name}: at x = {DERIVATIVE_PROBES[i]} {dfn_name} "
                         f"gives {float(given[i]):.6g}, central differences of {fn_name} {float(slope[i]):.6g}")


def unregister_normalizer(name: str) -> NormalizerSpec:
    """Remove ``name`` from the registry (for tests and for replacing a user normalizer);
    returns its spec. ``ValueError`` for an unknown name."""
    spec = get(name)
    del _REGISTRY[name]
    return spec


def table() -> Table:
    """The registry as a :class:`softmaxkit._table.Table` (what ``softmaxkit list`` prints
    and what the README's normalizer table is generated from)."""
    from ._table import Table

    out = Table(title="Registered normalizers",
                columns=["name", "definition", "family", "sums to one", "can be sparse", "streaming",
                         "parameters", "learnable", "paper"])
    for spec in normalizers():
        params = ", ".join(f"{k}={v}" for k, v in spec.params.items()) or "-"
        learnable = ", ".join(spec.learnable) or "-"
        out.add(spec.name, spec.formula, spec.family or "-", "yes" if spec.sums_to_one else "no",
                "yes" if spec.can_be_sparse else "no", spec.streaming, params, learnable, spec.reference)
    return out
