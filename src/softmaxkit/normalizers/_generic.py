"""The reference computation of each form, on rows whose normalised axis is last.

A normalizer that is exactly its form (SSMax, MultiMax, sigmoid, ReLU, the
l1-normalised rectifiers, a user's own) uses these as its reference; the others write
their own and declare the form for the fast paths. Conventions (see
:mod:`softmaxkit._rows`): masked and ``-inf`` entries get exactly 0, a row with nothing
visible gives zeros, a visible NaN makes its row NaN, a visible ``+inf`` gives the limit
(equal weights on the ``+inf`` entries) in the normalised families.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import forms
from .._checks import can_branch_on, check_finite, check_nonnegative, check_number
from .._rows import Rows, prepare_rows
from ._entmax import entmax_rows
from .softmax import infinite_limit, limit_rows, softmax_rows


def aligned(rows: Rows, params: Mapping[str, Any], sizes: Mapping[str, int]) -> dict[str, Any]:
    """Tensor parameters in the rows' layout: broadcast to the input and moved like ``x``.

    A parameter of ``size > 1`` values (MultiMax's ``r``, ``t``) becomes a list of them; a
    tensor one carries them along its first axis. ``n`` is one value per row.
    """
    out: dict[str, Any] = {}
    for name, value in params.items():
        size = sizes.get(name, 1)
        if size > 1:
            out[name] = _values(rows, value, name, size)
        elif name == forms.COUNT and isinstance(value, torch.Tensor):
            out[name] = rows.per_row(value.to(rows.x.dtype), name)
        elif isinstance(value, torch.Tensor):
            out[name] = rows.align(value, name)
        else:
            out[name] = value
    return out


def _values(rows: Rows, value: Any, name: str, size: int) -> list[Any]:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] != size:
            raise ValueError(f"{name} must have {size} entries along its first axis, got shape {tuple(value.shape)}")
        return [rows.align(value[i], f"{name}[{i}]") for i in range(size)]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence of {size} numbers or a tensor, got {type(value).__name__}")
    values = list(value)
    if len(values) != size:
        raise ValueError(f"{name} must have {size} entries, got {len(values)}")
    for i, v in enumerate(values):
        check_finite(v, f"{name}[{i}]", allow_tensor=False)
    return [float(v) for v in values]


def finish(rows: Rows, p: torch.Tensor) -> torch.Tensor:
    """Invisible entries to exactly 0, back to the caller's layout and dtype."""
    return rows.restore(rows.zero_invisible(p))


def _finite(rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Visible entries that are not infinite (a NaN stays, so its row becomes NaN), and ``x``
    with every other entry replaced by 0."""
    finite = rows.visible & ~torch.isinf(rows.x)
    return finite, torch.where(finite, rows.x, torch.zeros_like(rows.x))


def softmax_of_rows(rows: Rows, form: forms.SoftmaxOf, params: Mapping[str, Any]) -> torch.Tensor:
    """``softmax(g(x))`` over visible entries; ``+inf`` stays ``+inf`` (``g`` is increasing).

    In float32 (float16 / bfloat16 compute in it), a finite score whose ``g`` overflows (SSMax's
    ``s log(n) x`` of a ``finfo.min`` fill over long rows: every entry ``-inf``, the row read
    as empty) is not a limit of the definition: the call is then computed in float64. Where
    ``g`` overflows float64 too (a float64 ``finfo.min`` fill), it is held at the float64
    range (:func:`~softmaxkit.forms.held_overflow`): a row of such fills gets equal weights."""
    finite, xs = _finite(rows)
    g_params, wants = forms.value_params(form, params)   # see shift_invariant_slope_grad
    gx = forms.call(form.g, xs, g_params, rows.count)
    if rows.x.dtype == torch.float64:
        gx = forms.held_overflow(xs, gx, lambda: forms.call(form.dg, xs, g_params, rows.count))
    if wants:
        top = forms.score_at_largest(xs, gx, finite)
        gx = forms.slope_grad(form, gx, xs, params, rows.count, lambda _: top)
    p = softmax_rows(torch.where(finite, gx, rows.x), rows.visible)
    if rows.x.dtype == torch.float32:
        over = (finite & ~torch.isfinite(gx)).any(-1, keepdim=True)
        if not can_branch_on(gx) or bool(over.any()):   # those rows (only) in float64 (traced: always)
            wide = softmax_of_rows(dataclasses.replace(rows, x=rows.x.double()), form, params)
            p = torch.where(over, wide.to(p.dtype), p)
    return p


def sum_normalized_rows(rows: Rows, form: forms.SumNormalized, params: Mapping[str, Any]) -> torch.Tensor:
    """``h / (sum h + eps)`` over visible entries (signed: ``relu(h) / (sum |h| + eps)``)."""
    finite, xs = _finite(rows)
    hx = forms.call(form.h, xs, params, rows.count)
    wide = None
    if rows.x.dtype == torch.float32:
        lost = (finite & ~torch.isfinite(hx)).any(-1, keepdim=True)
        if not can_branch_on(hx) or bool(lost.any()):   # (traced: always, no branch on the values)
            # h overflowing float32 at finite scores (a user's relu(x)^3 at 1e13: inf / inf = NaN):
            # those rows in float64; here they are zeroed, so that no inf reaches the gradient
            wide = (lost, sum_normalized_rows(dataclasses.replace(rows, x=rows.x.double()), form, params))
            xs = torch.where(lost, torch.zeros_like(xs), xs)
            hx = forms.call(form.h, xs, params, rows.count)
    f = torch.where(finite, hx, torch.zeros_like(xs))
    num, den = (torch.relu(f), f.abs()) if form.signed else (f, f)
    total = den.sum(-1, keepdim=True)
    eps = form.epsilon(params)
    p = num / (total + eps)
    # finite terms whose sum overflows (relu_l1 of finfo.max scores): every weight would be
    # 0. Divided by the row's largest term first, the same quotient stays in range.
    over = torch.isinf(total) & torch.isfinite(den).all(-1, keepdim=True)
    if not can_branch_on(total) or bool(over.any()):   # (traced: always)
        c = den.detach().amax(-1, keepdim=True)
        c = torch.where(over & (c > 0), c, torch.ones_like(c))
        scaled = (num / c) / ((den / c).sum(-1, keepdim=True) + eps / c)
        p = torch.where(over, scaled, p)
    if wide is not None:
        p = torch.where(wide[0], wide[1].to(p.dtype), p)
    return torch.where(limit_rows(rows.x, rows.visible), infinite_limit(rows.x.detach(), rows.visible), p)


def elementwise_rows(rows: Rows, form: forms.Elementwise, params: Mapping[str, Any]) -> torch.Tensor:
    """``h(x)`` at visible entries."""
    visible_x = torch.where(rows.visible, rows.x, torch.zeros_like(rows.x))
    return forms.call(form.h, visible_x, params, rows.count)


def threshold_rows(rows: Rows, form: forms.Threshold, params: Mapping[str, Any]) -> torch.Tensor:
    """``alpha-entmax(g(x))`` over visible entries."""
    finite, xs = _finite(rows)
    z = torch.where(finite, forms.call(form.g, xs, params, rows.count), rows.x)
    alpha = form.alpha(params)
    if isinstance(alpha, torch.Tensor):  # already in the rows' layout: one value per row
        alpha = alpha[..., :1]
    return entmax_rows(z, rows.visible, alpha)


_ROWS: dict[type, Callable[..., torch.Tensor]] = {
    forms.SoftmaxOf: softmax_of_rows, forms.SumNormalized: sum_normalized_rows,
    forms.Elementwise: elementwise_rows, forms.Threshold: threshold_rows,
}


def from_form(form: forms.Form, x: torch.Tensor, dim: int, mask: torch.Tensor | None,
              params: Mapping[str, Any], sizes: Mapping[str, int] | None = None) -> torch.Tensor:
    """The normalizer that ``form`` defines, applied to ``x`` along ``dim``."""
    rows = prepare_rows(x, dim, mask)
    if rows.x.shape[-1] == 0:
        return rows.restore(rows.x.clone())
    p = _ROWS[type(form)](rows, form, aligned(rows, params, sizes or {}))
    return finish(rows, p)


def reference_for(name: str, form: forms.Form, defaults: Mapping[str, Any]) -> Callable[..., torch.Tensor]:
    """A reference function ``fn(x, dim=-1, mask=None, **params)`` for a user's normalizer."""

    required = forms.required_parameters(form)

    def reference(x: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, **params: Any) -> torch.Tensor:
        merged = {**defaults, **params}
        for pname in required:   # (left out, it reached the piece as None: "NoneType and Tensor")
            if merged.get(pname) is None:
                raise TypeError(f"normalizer {name!r} needs {pname} (a parameter of its pieces without a default)")
        if isinstance(form, forms.SumNormalized) and form.eps is None:
            # (as register_normalizer checks it: a negative eps gave weights above 1, -0.0 rows)
            check_finite(merged.get("eps"), "eps")
            check_nonnegative(merged["eps"], "eps")
        for pname, value in merged.items():
            if value is not None and not (pname == forms.COUNT and isinstance(value, int)):
                check_number(value, pname)
        return from_form(form, x, dim, mask, merged)

    reference.__name__ = name
    reference.__qualname__ = name
    reference.__doc__ = f"The user-registered normalizer {name!r} ({form.family} form)."
    return reference
