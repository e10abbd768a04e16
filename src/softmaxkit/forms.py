r"""The forms a normalizer can take, and the streaming decomposition each form implies.

Every normalizer declares one *form* next to its definition (``softmaxkit/normalizers/``).
The other paths (streaming and fused attention, kernels, distributed merges, a user's
own normalizer) read the form; none of them keeps a per-name switch.

=================  ====================================================  ==================================
family             output, row-wise over visible entries                 elementwise pieces
=================  ====================================================  ==================================
``softmax_of``     :math:`\mathrm{softmax}(g(x))`                         ``g``, ``dg`` (= dg/dx)
``sum_normalized`` :math:`h(x) / (\sum h(x) + \varepsilon)`;              ``h``, ``dh``
                   signed variant: :math:`[h]_+ / (\sum |h| + \varepsilon)`
``elementwise``    :math:`h(x)` (no normalisation)                        ``h``, ``dh``
``threshold``      :math:`\alpha\text{-entmax}(g(x))`                     ``g``, ``dg`` and ``alpha``
=================  ====================================================  ==================================

A *piece* (``g``, ``h`` and their derivatives) is a function of the scores ``x`` whose
other arguments are the normalizer's parameters, by name, plus ``n``: the number of
visible entries of the row (overridden by a parameter ``n`` when the normalizer has one).
Pieces are written in plain tensor operations, so they run on dense rows, on key tiles
of attention and inside a traced graph alike.

Streaming (attention over key blocks without the ``Lq x Lk`` matrix): a
:class:`StreamRule` describes a normalizer as a fixed number of passes over the keys of
each query. Pass ``p`` maps the scores of a tile to ``z = rule.z(p, x, st)`` and to
per-entry terms, which the engine sums over keys, as row sums or against the values. A
``shifted`` pass keeps the running maximum ``m`` of ``z`` and evaluates its terms
relative to ``c = rule.shift(m)``; when ``m`` grows the sums are rescaled by
``e^{c_old - c_new}``: the online normalizer of Milakov & Gimelshein (2018), arXiv
1805.02867. Partial sums of disjoint key sets merge the same way, which is what a
distributed ring uses. ``rule.stats`` turns the sums of one pass into per-query
statistics for the next; ``rule.output`` gives the attention output. Everything is a
differentiable function of scores, values and parameters, so the engine's backward
recomputes the tiles and differentiates the rule.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ._checks import can_branch_on

Piece = Callable[..., torch.Tensor]

FAMILIES = ("softmax_of", "sum_normalized", "elementwise", "threshold")

#: The name a piece uses for the number of visible entries of its row.
COUNT = "n"


# ----------------------------------------------------------------------------------------
# pieces
# ----------------------------------------------------------------------------------------

@functools.cache
def _signature(fn: Piece) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...], bool]:
    """Names after the first argument, their defaults, and whether ``fn`` takes ``**kwargs``.
    A callable without a signature to read (a builtin such as ``torch.exp``) takes ``x`` only."""
    if not callable(fn):
        raise TypeError(f"a piece must be callable, got {type(fn).__name__}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except ValueError:
        return (), (), False
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"a piece must take the scores x as its first argument, got {fn!r}")
    names, defaults, var_kw = [], [], False
    for p in params[1:]:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.append(p.name)
            if p.default is not inspect.Parameter.empty:
                defaults.append((p.name, p.default))
        else:
            raise TypeError(f"a piece takes x, then named parameters; {fn!r} has *{p.name}")
    return tuple(names), tuple(defaults), var_kw


def piece_parameters(fn: Piece) -> dict[str, Any]:
    """The parameters a piece declares, with their defaults (``None`` when it has none); ``n`` excluded."""
    names, defaults, _ = _signature(fn)
    given = dict(defaults)
    return {name: given.get(name) for name in names if name != COUNT}


def uses_count(fn: Piece | None) -> bool:
    """Whether a piece needs ``n``, the number of visible entries of its row."""
    return fn is not None and COUNT in _signature(fn)[0]


def effective_count(params: Mapping[str, Any], count: torch.Tensor) -> torch.Tensor | float:
    """``n`` for the pieces: the parameter ``n`` when given, else the visible count (at least 1)."""
    n = params.get(COUNT)
    if n is None:
        return count.clamp_min(1.0)
    return n.clamp_min(1.0) if isinstance(n, torch.Tensor) else float(n)


def call(fn: Piece, x: torch.Tensor, params: Mapping[str, Any], count: torch.Tensor | None = None) -> torch.Tensor:
    """``fn(x, **the parameters it names)``, with ``n`` from ``count`` when it asks for it."""
    names, _, var_kw = _signature(fn)
    kw = {k: v for k, v in params.items() if k != COUNT and (var_kw or k in names)}
    if COUNT in names:
        if count is None:
            raise ValueError(f"{getattr(fn, '__name__', fn)!r} needs n, the number of visible entries")
        kw[COUNT] = effective_count(params, count)
    return fn(x, **kw)


# ----------------------------------------------------------------------------------------
# forms
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SoftmaxOf:
    r"""``softmax(g(x))``: ``g`` an elementwise map of the score (``passes=2`` when ``g``
    needs a statistic of the whole row, as adaptive temperature does; the normalizer then
    supplies its own stream rule)."""

    g: Piece
    dg: Piece
    passes: int = 1
    #: when ``g(x) = a x`` for a number ``a`` given by the parameters: ``a`` (else ``None``);
    #: scaled dot-product attention then runs it with its scale times ``a``
    linear_factor: Callable[[Mapping[str, Any]], float | None] | None = None
    #: whether ``g(x) = g' x`` with ``g'`` free of ``x`` (a function of the parameters and ``n``
    #: only): SDPA then runs it on queries multiplied by ``g'`` per row (SSMax, per-head temperatures)
    linear: bool = False
    family = "softmax_of"

    def pieces(self) -> tuple[Piece, ...]:
        return (self.g, self.dg)


@dataclass(frozen=True)
class SumNormalized:
    r"""``h(x) / (sum h(x) + eps)``, or with ``signed=True`` ``relu(h) / (sum |h| + eps)``
    (softpick); ``eps`` is the constant given here, else the normalizer's parameter ``eps``
    (0 when it has none)."""

    h: Piece
    dh: Piece
    signed: bool = False
    eps: float | None = None
    family = "sum_normalized"

    def epsilon(self, params: Mapping[str, Any]) -> Any:
        return self.eps if self.eps is not None else params.get("eps", 0.0)

    def pieces(self) -> tuple[Piece, ...]:
        return (self.h, self.dh)


@dataclass(frozen=True)
class Elementwise:
    """``h(x)`` entry by entry, no normalisation (sigmoid, ReLU attention)."""

    h: Piece
    dh: Piece
    family = "elementwise"

    def pieces(self) -> tuple[Piece, ...]:
        return (self.h, self.dh)


def identity(x: torch.Tensor) -> torch.Tensor:
    """The piece ``g(x) = x``."""
    return x


def one(x: torch.Tensor) -> torch.Tensor:
    """The piece ``dg(x) = 1``, the derivative of :func:`identity`."""
    return torch.ones_like(x)


@dataclass(frozen=True)
class Threshold:
    r"""``alpha-entmax(g(x))``: ``[(alpha - 1) g(x) - tau]_+^{1/(alpha-1)}`` with ``tau`` the
    threshold that makes the row sum to one. ``alpha(params)`` gives alpha (a number, or a
    tensor with one value per row)."""

    alpha: Callable[[Mapping[str, Any]], Any]
    g: Piece = identity
    dg: Piece = one
    family = "threshold"

    def pieces(self) -> tuple[Piece, ...]:
        return (self.g, self.dg)


Form = SoftmaxOf | SumNormalized | Elementwise | Threshold


def form_parameters(form: Form) -> dict[str, Any]:
    """The parameters named by a form's pieces, with their defaults."""
    out: dict[str, Any] = {}
    for piece in form.pieces():
        for name, default in piece_parameters(piece).items():
            if out.get(name) is None:
                out[name] = default
    return out


def required_parameters(form: Form) -> tuple[str, ...]:
    """The parameters of a form's pieces that no piece gives a default (``n`` excluded): a call
    must pass them (a default of ``None`` is a default, the piece's to read)."""
    named: dict[str, bool] = {}
    for piece in form.pieces():
        names, defaults, _ = _signature(piece)
        given = dict(defaults)
        for name in names:
            if name != COUNT:
                named[name] = named.get(name, False) or name in given
    return tuple(name for name, has_default in named.items() if not has_default)


def form_uses_count(form: Form) -> bool:
    return any(uses_count(p) for p in form.pieces())


# ----------------------------------------------------------------------------------------
# streaming rules
# ----------------------------------------------------------------------------------------

def keep_visible(t: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """``t`` with invisible entries set to 0 (``visible=None``: all visible)."""
    return t if visible is None else torch.where(visible, t, torch.zeros((), dtype=t.dtype, device=t.device))


def safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``; 0 for query rows with an empty denominator."""
    return num / torch.where(den > 0, den, torch.ones_like(den))


def value_params(form: SoftmaxOf, params: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    """``(params for g's value, whether the slope's gradient is added)``: for a ``softmax(a x)``
    form whose tensor parameter records a gradient, ``g`` is evaluated with them detached and
    :func:`slope_grad` adds their gradient (see :func:`shift_invariant_slope_grad`)."""
    wants = form.linear and torch.is_grad_enabled() and any(
        isinstance(v, torch.Tensor) and v.requires_grad for v in params.values())
    if not wants:
        return params, False
    return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in params.items()}, True


def slope_grad(form: SoftmaxOf, z: torch.Tensor, x: torch.Tensor, params: Mapping[str, Any], count: Any,
               ref: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """:func:`shift_invariant_slope_grad` with the slope ``a = g(1)`` and ``ref(a.detach())``."""
    slope = call(form.g, torch.ones((), dtype=x.dtype, device=x.device), params, count)
    return shift_invariant_slope_grad(z, x, ref(slope.detach()), slope)


def shift_invariant_slope_grad(z: torch.Tensor, x: torch.Tensor, ref: torch.Tensor,
                               slope: torch.Tensor) -> torch.Tensor:
    r"""``z = a x`` of a ``softmax(a x)`` form (computed with the parameters detached), carrying
    the gradient of the slope ``a`` (``slope``, with its graph) as ``sum_j dL/dz_j (x_j - ref)``
    rather than ``sum_j dL/dz_j x_j``. Softmax is shift invariant, so ``sum_j dL/dz_j = 0`` over
    each row and the two agree in exact arithmetic; but at scores near one huge value (a query
    row that an additive ``finfo.min`` mask hides whole: every score ``finfo.min``) the second
    sums rounding errors times 1e38 (a temperature gradient of 1e31, inf or NaN), where the
    first is 0. ``ref``: one value per row, near the row's largest ``z``. An entry whose
    ``x - ref`` overflows has weight 0 and adds nothing. The value of ``z`` is unchanged, and so
    are its gradient in ``x`` and the second derivatives.

    Only a slope shared by the row can take the shift: a row whose slope varies along it (a
    temperature per entry) gets ``sum_j dL/dz_j x_j`` over the finite ``x_j``, as ``x * a``
    would. (Shared is told by value, row by row: a per-head parameter often arrives expanded
    to the scores' shape.)"""
    if slope.dim() and slope.shape[-1] != 1:
        ref = torch.where(shared_along_rows(slope), ref.detach(), torch.zeros((), dtype=ref.dtype, device=ref.device))
    return z + relative_to(x, ref) * (slope - slope.detach())


def shared_along_rows(a: torch.Tensor) -> torch.Tensor:
    """Per row (last axis, keepdim), whether ``a`` (a parameter in the rows' layout, size > 1
    along the last axis) holds one value along the row, told by value: a per-head parameter
    often arrives expanded to the scores' shape."""
    a = a.detach()
    return (a == a[..., :1]).all(-1, keepdim=True)


def relative_to(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``x - ref`` (``ref`` detached), 0 where that overflows (an entry of weight 0)."""
    d = x - ref.detach()
    return torch.where(torch.isfinite(d), d, torch.zeros_like(d))


def score_at_largest(x: torch.Tensor, z: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """Per row (last axis), the ``x`` of the visible entry with the largest ``z`` (detached)."""
    zd = z.detach()
    if visible is not None:
        zd = zd.masked_fill(~visible, float("-inf"))
    return x.detach().gather(-1, zd.argmax(-1, keepdim=True))


def held_overflow(x: torch.Tensor, z: torch.Tensor, slope: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """``z = g(x)`` held within ``[finfo.min, finfo.max]`` where ``g`` overflowed a score that
    is not ``-inf``. Down (SSMax's ``s log n``, a temperature below 1 or MultiMax's slope above 1
    on a ``finfo.min`` mask fill): a row all of whose visible scores overflowed gets equal
    weights on them, as on the dense path, instead of reading as a row with nothing visible; in
    any other row such entries still get weight 0. Up (MultiMax's quadratic term with ``t3 > 0``
    on a ``finfo.min`` fill): the row's weight goes equally to those entries, as softmax gives
    a row's ``+inf`` entries, instead of ``inf - inf = NaN``. (The fused CPU kernels do the same
    in ``_g_held``, the Triton kernels in ``_held``.)

    ``slope``: ``g'(x)`` (called only when a finite score overflowed and a gradient is being
    recorded). A held entry then keeps ``g'`` as its derivative, not the clamp's 0: the row of
    equal weights moves with its scores as softmax of the exact ``g`` does (the dense path, which
    recomputes such float32 rows in float64, and the fused kernels)."""
    finfo = torch.finfo(z.dtype)
    held = torch.where(x > float("-inf"), z.clamp(finfo.min, finfo.max), z)
    if slope is None or not (torch.is_grad_enabled() and x.requires_grad):
        return held
    over = torch.isinf(z) & torch.isfinite(x)
    if can_branch_on(over) and not bool(over.any()):
        return held
    d = slope()
    d = torch.where(over & torch.isfinite(d), d, torch.zeros_like(d))
    moved = torch.where(over, x, torch.zeros_like(x))
    return held + (moved - moved.detach()) * d


def shifted_exp(z: torch.Tensor, visible: torch.Tensor | None, c: torch.Tensor) -> torch.Tensor:
    """``e^{z - c}`` at visible entries, 0 elsewhere."""
    if visible is None:
        return torch.exp(z - c)
    return keep_visible(torch.exp(torch.where(visible, z, c) - c), visible)


class StreamRule:
    """One normalizer as passes of summed terms (see the module docstring).

    ``st`` holds, per query row: the parameters (``st["params"]``), the visible-key count
    ``n`` (when :attr:`needs_count`), the final shift ``c{p}`` and maximum ``m{p}`` of each
    shifted pass (``mn{p}``: the minimum, for rules that track it) and the statistics of
    earlier passes.
    """

    passes: int = 1
    #: per pass: keep a running maximum of ``z`` and evaluate terms relative to ``shift(m)``
    shifted: tuple[bool, ...] = (True,)
    #: per pass: the terms summed against the values (the others are row sums)
    value_terms: tuple[frozenset, ...] = (frozenset({"num"}),)
    #: ``output`` uses the maximum ``m{p}`` of the last pass as a differentiable quantity
    max_grad: bool = False
    #: track the running minimum of ``z`` (differentiable ``mn{p}``) in the last pass
    min_grad: bool = False
    #: needs the number of visible keys of each query (``st["n"]``)
    needs_count: bool = False
    #: ``output`` is ``a * S`` for the last pass's value sum ``S`` with ``a`` per query row,
    #: not depending on ``S`` (attention is linear in the values): with one value sum, the
    #: distributed ring keeps the output for its backward instead of ``S`` (``S = out / a``)
    output_scales_values: bool = True

    def z(self, p: int, x: torch.Tensor, st: dict) -> torch.Tensor:
        return x

    def keeps_score_at_max(self, st: dict) -> bool:
        """Whether a shifted pass keeps, per query row, the score ``x`` of the visible entry
        with the largest ``z`` (``st[f"xm{p}"]``) for the backward."""
        return False

    def shift(self, m: torch.Tensor) -> torch.Tensor:
        return m

    def terms(self, p: int, z: torch.Tensor, visible: torch.Tensor | None, st: dict) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def stats(self, p: int, sums: dict, st: dict) -> dict[str, torch.Tensor]:
        return {}

    def output(self, sums: dict, st: dict) -> torch.Tensor:
        raise NotImplementedError

    def rescaled(self, sums: dict, alpha: torch.Tensor, c_old: torch.Tensor, c_new: torch.Tensor) -> dict:
        """A shifted pass's running sums, taken from shift ``c_old`` to ``c_new`` (``alpha =
        e^{c_old - c_new}``, or 1 for rows that have seen no visible key yet). Sums that the
        new shift makes vanish (``alpha = 0``) are 0, also where they overflowed at a huge
        negative shift."""
        zero = torch.zeros((), dtype=alpha.dtype, device=alpha.device)
        return {name: torch.where(alpha > 0, s * alpha, zero) for name, s in sums.items()}


class SoftmaxOfRule(StreamRule):
    """``softmax(g(x))``: output ``sum_j e^{z_j - c} v_j / sum_j e^{z_j - c}``, ``z = g(x)``."""

    def __init__(self, form: SoftmaxOf):
        self.form = form
        self.needs_count = uses_count(form.g)

    def z(self, p, x, st):
        params, n = st["params"], st.get("n")
        # the backward (c{p} known) of a softmax(a x) form: see shift_invariant_slope_grad
        g_params, wants = value_params(self.form, params) if f"c{p}" in st else (params, False)
        gx = call(self.form.g, x, g_params, n)
        if x.dtype != torch.float64 and not self.form.linear and x.numel() and x.device.type == "cpu":
            # terms that overflow with opposite signs at a finite score (MultiMax's slope and its
            # quadratic term on a finfo.min fill: -inf + inf) are NaN; those entries in float64,
            # as the dense path computes such rows, then held by held_overflow (CPU: the check
            # would synchronise an accelerator on every tile; amax passes a NaN on)
            if not can_branch_on(gx) or bool(torch.isnan(gx.detach().amax())):
                wide = call(self.form.g, x.double(), g_params, n).to(x.dtype)
                gx = torch.where(torch.isnan(gx) & ~torch.isnan(x), wide, gx)
        z = held_overflow(x, gx, lambda: call(self.form.dg, x, g_params, n))
        if wants:
            # the row's exact score at its largest z, kept by the forward; c / a is not it where
            # every visible a x overflowed (a bfloat16 finfo.min fill under s log n > 1 in float32)
            # or rounds (an ulp of a 3e38 fill in float64), and the gradient of a would sum
            # rounding errors times that difference (1e28)
            ref = st.get(f"xm{p}")
            z = slope_grad(self.form, z, x, params, n,
                           (lambda a: ref) if ref is not None else (lambda a: self._score_at_shift(st[f"c{p}"], a)))
        return z

    def keeps_score_at_max(self, st):
        return self.form.linear and any(isinstance(v, torch.Tensor) for v in st["params"].values())

    @staticmethod
    def _score_at_shift(c: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
        """The score whose ``a x`` is the row's shift ``c``: ``c / a`` within the dtype's range;
        ``finfo.min`` where ``c`` was held there (every visible ``a x`` overflowed: a row of
        ``finfo.min`` fills), 0 where ``c / a`` is NaN or ``c`` infinite (``a = 0``, a row
        with nothing visible)."""
        finfo = torch.finfo(c.dtype)
        ref = torch.where(c <= finfo.min, torch.full_like(c, finfo.min), c / slope).clamp(finfo.min, finfo.max)
        return torch.where(torch.isfinite(c) & ~torch.isnan(ref), ref, torch.zeros_like(ref))

    def terms(self, p, z, visible, st):
        e = shifted_exp(z, visible, st[f"c{p}"])
        return {"num": e, "den": e}

    def output(self, sums, st):
        return safe_div(sums["num"], sums["den"])


class SumNormalizedRule(StreamRule):
    """``sum_j h(x_j) v_j / (sum_j h(x_j) + eps)``: plain sums, no shift."""

    shifted = (False,)

    def __init__(self, form: SumNormalized):
        if form.signed:
            raise ValueError("a signed sum_normalized form streams through its normalizer's own rule")
        self.form = form
        self.needs_count = uses_count(form.h)

    def terms(self, p, z, visible, st):
        f = keep_visible(call(self.form.h, z, st["params"], st.get("n")), visible)
        return {"num": f, "den": f}

    def output(self, sums, st):
        return sums["num"] / (sums["den"] + self.form.epsilon(st["params"]))


class ElementwiseRule(StreamRule):
    """``sum_j h(x_j) v_j``: one value sum, no shift."""

    shifted = (False,)

    def __init__(self, form: Elementwise):
        self.form = form
        self.needs_count = uses_count(form.h)

    def terms(self, p, z, visible, st):
        return {"num": keep_visible(call(self.form.h, z, st["params"], st.get("n")), visible)}

    def output(self, sums, st):
        return sums["num"]


class ThresholdRule(StreamRule):
    r"""alpha-entmax of ``z = g(x)`` for a number ``1 < alpha <= 2``:
    ``p_j = [u z_j - tau]_+^{1/u}``, ``u = alpha - 1``.

    The threshold is searched first (:meth:`search`, no gradient): ``tau`` lies in
    ``[u m - 1, u m - n^{-u}]`` (``m`` the row maximum of ``z``: the largest weight is
    between ``1/n`` and 1), and each pass over the keys evaluates ``sum_j p_j(tau) - 1`` at
    :attr:`CANDIDATES` points of the bracket at once, until the bracket is at machine
    precision; one more pass refines it (a Newton step; sparsemax's closed form
    ``(sum_S z - 1) / |S|`` on the support). The support is ``{j: p_j > 0}`` at that
    threshold, as the dense and fused paths take it: an entry exactly at the threshold is
    outside it. Then pass 0 sums ``s_j = p_j^{2 - alpha}`` (the support's weights) and
    ``s_j z_j``, and pass 1 sums ``p_j v_j``, both at the same threshold and so on the same
    support. For the gradient, ``tau`` enters pass 1 as ``tau_0 + u (sum_j s_j z_j -
    \text{its value}) / sum_j s_j``, the implicit derivative of ``sum_j p_j = 1``, which
    gives the entmax Jacobian of Peters, Niculae & Martins (2019), arXiv 1905.05702.
    """

    passes = 2
    shifted = (False, False)
    value_terms = (frozenset(), frozenset({"num"}))
    needs_count = True
    CANDIDATES = 15
    MAX_SEARCH_PASSES = 40

    def __init__(self, form: Threshold, alpha: float):
        self.form = form
        self.u = float(alpha) - 1.0

    def z(self, p, x, st):
        return call(self.form.g, x, st["params"], st.get("n"))

    def _base(self, z, tau, visible):
        """``(u z - tau)`` on the support (visible and ``> 0``), 0 elsewhere, and the support.

        Hidden entries are 0 before any power: relative to a row maximum of huge negative
        scores a hidden entry's ``u z - tau`` is huge, its ``1/u``-th power overflows, and the
        backward of the zeroing (0 times an infinite derivative) was NaN. An entry exactly at
        the threshold is off the support and passes no gradient (a clamp passes it there)."""
        base = self.u * z - tau
        support = base > 0
        if visible is not None:
            support = support & visible
        return torch.where(support, base, torch.zeros((), dtype=base.dtype, device=base.device)), support

    def _weights(self, z, tau, visible):
        base, support = self._base(z, tau, visible)
        return (base if self.u == 1.0 else base ** (1.0 / self.u)), base, support

    def _slopes(self, base, support):
        """``s = p^{2 - alpha} = base^{1/u - 1}`` on the support, 0 elsewhere (no gradient)."""
        base = base.detach()
        if self.u == 1.0:
            return support.to(base.dtype)
        s = torch.where(support, base, torch.ones_like(base)) ** (1.0 / self.u - 1.0)
        return torch.where(support, s, torch.zeros_like(s))

    def search(self, reduce, st: dict) -> dict:
        """``tau`` per query row, by bracketing over passes (``reduce(fn, how)`` runs ``fn`` over the key tiles).

        Scores are taken relative to the row maximum ``m`` (``z - m``, ``tau - u m``, with
        ``m`` a constant): the bracket is then ``[-1, -n^{-u}]`` whatever the scores' size,
        and a row of equal huge scores (a ``finfo.min`` mask fill) keeps its weights."""
        top = reduce(lambda z, visible: z if visible is None else z.masked_fill(~visible, float("-inf")), "max")
        n = st["n"].expand_as(top)
        empty = n < 1
        m = torch.where(empty | ~torch.isfinite(top), torch.zeros_like(top), top).detach()
        lo = -torch.ones_like(m)
        hi = -(n.clamp_min(1.0) ** (-self.u))
        steps = torch.arange(1, self.CANDIDATES + 1, dtype=m.dtype, device=m.device) / (self.CANDIDATES + 1)
        tiny = torch.finfo(m.dtype).eps
        passes, branch = self.MAX_SEARCH_PASSES, can_branch_on(m)
        if not branch:   # traced, no stop on the values: the passes that take a width-1 bracket to the stop
            passes = min(passes, math.ceil(-math.log(4 * tiny) / math.log(self.CANDIDATES + 1)) + 1)
        for _ in range(passes):
            width = hi - lo
            if branch and bool((width <= 4 * tiny * (lo.abs() + hi.abs() + 1.0)).all()):
                break
            taus = lo + width * steps  # (..., r, K)

            def total(z, visible, taus=taus):
                p = (self.u * (z - m).unsqueeze(-1) - taus.unsqueeze(-2)).clamp_min(0.0)
                if self.u != 1.0:
                    p = p ** (1.0 / self.u)
                if visible is not None:   # (hidden entries, relative to m, can overflow)
                    p = torch.where(visible.unsqueeze(-1), p, torch.zeros((), dtype=p.dtype, device=p.device))
                return p.sum(-2)

            mass = reduce(total, "sum")
            above = mass >= 1.0  # tau_k at or below the threshold
            below_count = above.sum(-1, keepdim=True)
            lo_new = torch.where(below_count > 0, taus.gather(-1, (below_count - 1).clamp_min(0)), lo)
            hi_new = torch.where(below_count < self.CANDIDATES,
                                 taus.gather(-1, below_count.clamp_max(self.CANDIDATES - 1)), hi)
            lo, hi = lo_new, hi_new
        tau = torch.where(empty, torch.zeros_like(lo), (lo + hi) / 2)

        # one more pass: sum_j p_j, sum_j s_j and sum_S z on the support at the bracketed tau
        def support_sums(z, visible, tau=tau):
            zr = z - m
            weights, base, support = self._weights(zr, tau, visible)
            s = self._slopes(base, support)
            on_z = torch.where(support, zr, torch.zeros_like(zr))
            return torch.cat([weights.sum(-1, keepdim=True), s.sum(-1, keepdim=True),
                              on_z.sum(-1, keepdim=True)], -1)

        sums = reduce(support_sums, "sum")
        mass, slope, on_z = sums[..., 0:1], sums[..., 1:2], sums[..., 2:3]
        found = slope > 0
        safe = torch.where(found, slope, torch.ones_like(slope))
        if self.u == 1.0:
            # sparsemax: tau = (sum_S z - 1) / |S|, as the dense path computes it; exact at ties
            # (an entry at the threshold, in or out of S, gives the same tau)
            refined = (on_z - 1.0) / safe
        else:
            # a Newton step on sum_j p_j(tau) = 1 (slope -sum_j s_j / u): the bracket pins tau to
            # about eps, the step squares the error
            refined = tau + self.u * (mass - 1.0) / safe
        tau = torch.where(found & ~empty & torch.isfinite(refined), refined, tau)
        return {"tau0": tau, "shift": m}

    def terms(self, p, z, visible, st):
        z = z - st["shift"]
        if p == 0:
            base, support = self._base(z, st["tau0"], visible)
            s = self._slopes(base, support)
            # off the support s is 0 and z may be -inf (a finfo.min mask fill times a scale > 1)
            lin = torch.where(support, s * z, torch.zeros_like(z))
            return {"lin": lin, "S": s}
        weights, _, _ = self._weights(z, st["tau"], visible)
        return {"num": weights}

    def stats(self, p, sums, st):
        # tau0 is the refined threshold (a value); the term added carries its gradient, the
        # implicit derivative of sum_j p_j = 1 on the support (its value is 0)
        lin, s_total = sums["lin"], sums["S"]
        return {"tau": st["tau0"] + self.u * safe_div(lin - lin.detach(), s_total)}

    def output(self, sums, st):
        return sums["num"]


def _plain_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def rule_from_form(form: Form, params: Mapping[str, Any]) -> StreamRule | None:
    """The streaming rule a form implies with ``params``, or ``None`` when it does not stream.

    ``threshold`` streams for a number ``1 < alpha <= 2`` (a tensor alpha, learnable and per
    row, takes the dense path); a two-pass ``softmax_of`` and a signed ``sum_normalized``
    need their normalizer's own rule.
    """
    if isinstance(form, SoftmaxOf):
        return SoftmaxOfRule(form) if form.passes == 1 else None
    if isinstance(form, SumNormalized):
        return None if form.signed else SumNormalizedRule(form)
    if isinstance(form, Elementwise):
        return ElementwiseRule(form)
    alpha = form.alpha(params)
    if _plain_number(alpha) and 1.0 < alpha <= 2.0:
        return ThresholdRule(form, alpha)
    return None
