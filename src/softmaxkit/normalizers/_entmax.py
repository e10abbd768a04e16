r"""The alpha-entmax solvers shared by the threshold family (sparsemax, 1.5-entmax, alpha-entmax,
Adaptive-Scalable entmax, a user's threshold normalizer).

All of them are alpha-entmax for some alpha (Peters, Niculae & Martins 2019):

.. math::
    \alpha\text{-entmax}(x) = \arg\max_{p \in \Delta} \; p^\top x + H^T_\alpha(p),\qquad
    p_i = [(\alpha - 1)\, x_i - \tau]_+^{1/(\alpha - 1)},\quad \textstyle\sum_i p_i = 1,

with ``H^T_alpha`` the Tsallis alpha-entropy; alpha = 1 is softmax, alpha = 2 sparsemax.
Writing ``u = alpha - 1`` and ``tau = u*theta - 1`` gives the form this module solves,

.. math:: p_i = [1 + u\,(x_i - \theta)]_+^{1/u} \;\xrightarrow{u \to 0}\; e^{x_i - \theta},

whose threshold ``theta`` lives in the units of ``x`` and stays well conditioned as
alpha approaches 1 (``log1p`` carries the small-``u`` limit).

Forward passes are exact: sparsemax and 1.5-entmax by sorting (closed forms on the
support), any other alpha by bisection on ``theta`` to full precision followed by
Newton steps. Backward passes are closed form (see :class:`_EntmaxFunction`).

Row conventions (see :mod:`softmaxkit._rows`): masked and ``-inf`` entries get exactly 0
and zero gradient, a row with nothing visible gives zeros, a row with visible ``+inf``
entries gives equal weights on them (the limit), a NaN stays in its own row, and float16
/ bfloat16 are computed in float32.
"""

from __future__ import annotations

import torch

from .._autograd import without_forward_mode
from .._checks import can_branch_on, check_at_least, check_finite
from .._rows import Rows, nonzero_or_one
from ..kernels.entmax_grad import centered, dp_dalpha, entmax_weights
from .softmax import infinite_limit, softmax_rows

# ----------------------------------------------------------------------------------------
# forward solvers, on rows whose normalised axis is last. ``z`` is already shifted so that
# the visible row maximum is 0, and is 0 at invisible entries.
# ----------------------------------------------------------------------------------------

def _sorted_support(z: torch.Tensor, visible: torch.Tensor, support_test) -> torch.Tensor:
    """The entries of the support found by sorting: a bool tensor like ``z``.

    ``support_test(sorted_z, k, cumsum, cumsum_sq)`` says, for each rank ``k``, whether
    the ``k`` largest entries can all be in the support. The support is the top
    ``k*`` entries, ``k*`` the number of ranks that pass; equal values are in or out
    together, so it is the set of entries ``>=`` the ``k*``-th largest.
    """
    count = visible.sum(-1, keepdim=True)
    srt = z.masked_fill(~visible, float("-inf")).sort(-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    valid = k <= count
    s0 = torch.where(valid, srt, torch.zeros_like(srt))
    passes = support_test(s0, k, s0.cumsum(-1), (s0 * s0).cumsum(-1)) & valid
    k_star = passes.sum(-1, keepdim=True).clamp_min(1)
    kth = srt.gather(-1, k_star - 1)
    return visible & (z >= kth)


def _sparsemax_sorted(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    r"""Sparsemax (Martins & Astudillo 2016, Alg. 1): ``p = [z - tau]_+``.

    Sorted decreasingly, rank ``k`` is in the support iff ``1 + k z_(k) > sum_{j<=k} z_(j)``;
    then ``tau = (sum_S z - 1) / |S|``, recomputed over the support itself. The search runs
    in float64 so that long rows of large values keep the exact support.
    """
    w = z.double()
    support = _sorted_support(w, visible, lambda s, k, cs, _: 1 + k * s > cs)
    size = support.sum(-1, keepdim=True).clamp_min(1).to(w.dtype)
    tau = (torch.where(support, w, torch.zeros_like(w)).sum(-1, keepdim=True) - 1) / size
    p = torch.where(support, (w - tau).clamp_min(0), torch.zeros_like(w))
    return p.to(z.dtype)


def _entmax15_threshold(mean, sum_sq_dev, size):
    r"""``tau`` of 1.5-entmax on a support of ``size`` entries of ``z/2`` with the given
    mean and sum of squared deviations: ``sum_S (v_i - tau)^2 = 1`` gives
    ``tau = mean - sqrt((1 - ss) / k)``."""
    return mean - ((1 - sum_sq_dev) / size).clamp_min(0).sqrt()


def _entmax15_sorted(z: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    r"""1.5-entmax, exact (Peters, Niculae & Martins 2019, Alg. 2): ``p = [z/2 - tau]_+^2``.

    With ``v = z/2`` sorted decreasingly, rank ``k`` is in the support iff the threshold
    of the top ``k`` entries, ``tau_k = mean_k - sqrt((1 - ss_k)/k)``, is ``<= v_(k)``.
    The threshold is then recomputed over the support with a two-pass variance.
    """
    v = z.double() / 2

    def test(s, k, cs, cs2):
        mean = cs / k
        return _entmax15_threshold(mean, cs2 - cs * mean, k) <= s

    support = _sorted_support(v, visible, test)
    size = support.sum(-1, keepdim=True).clamp_min(1).to(v.dtype)
    on = torch.where(support, v, torch.zeros_like(v))
    mean = on.sum(-1, keepdim=True) / size
    dev = torch.where(support, v - mean, torch.zeros_like(v))
    tau = _entmax15_threshold(mean, (dev * dev).sum(-1, keepdim=True), size)
    p = torch.where(support, (v - tau).clamp_min(0) ** 2, torch.zeros_like(v))
    return p.to(z.dtype)


def _log_power(d: torch.Tensor, u: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    r"""``log p`` for ``p = [1 + u d]_+^{1/u}`` (``d`` for ``u = 0``); ``-inf`` off the support."""
    t = u * d
    inside = visible & (t > -1)
    safe_u = torch.where(u > 0, u, torch.ones_like(u))
    safe_t = torch.where(inside, t, torch.zeros_like(t))
    log_p = torch.where(u > 0, torch.log1p(safe_t) / safe_u, d)
    return torch.where(inside, log_p, torch.full_like(log_p, float("-inf")))


def _log_weights(z: torch.Tensor, s: torch.Tensor, u: torch.Tensor, visible: torch.Tensor,
                 shifted: torch.Tensor) -> torch.Tensor:
    r"""``log p`` at the iterate ``s``: ``theta`` (``p = [1 + u (z - theta)]_+^{1/u}``), or on
    ``shifted`` rows ``delta = theta - 1/u`` (``p = [u (z - delta)]_+^{1/u}``)."""
    d = z - s
    inside = visible & (d > 0)
    safe_u = torch.where(u > 0, u, torch.ones_like(u))
    by_delta = torch.where(inside, (torch.log(safe_u) + torch.log(torch.where(inside, d, torch.ones_like(d)))) / safe_u,
                           torch.full_like(d, float("-inf")))
    return torch.where(shifted, by_delta, _log_power(d, u, visible))


def _entmax_bisect(z: torch.Tensor, visible: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    r"""alpha-entmax for any ``u = alpha - 1 >= 0`` (per row): ``p_i = [1 + u(z_i - theta)]_+^{1/u}``.

    ``f(theta) = sum_i p_i - 1`` decreases in ``theta``, with slope ``-sum_i p_i^{1-u}``.
    With the row maximum at 0, ``p_max <= 1`` gives ``theta >= 0`` and ``p_max >= 1/n``
    gives ``theta <= (1 - n^{-u}) / u`` (``log n`` at ``u = 0``). For ``u >= 1`` the search
    runs on ``delta = theta - 1/u`` in ``[-1/u, -n^{-u}/u]`` instead, ``p = [u (z - delta)]_+^{1/u}``:
    there ``theta`` sits next to ``1/u`` and ``1 + u (z - theta)`` cancelled, so scores closer
    than ``n^{-u}/u`` came out uniform (alpha = 100 on scores 1e-30 apart). The root is found
    by safeguarded Newton: a Newton step when it stays inside the bracket, else bisection,
    until the bracket or the step reaches machine precision. (For alpha <= 2, ``f`` is
    convex and Newton from ``theta = 0`` converges monotonically.) ``p`` is finally divided
    by its sum. The search runs in float64 (as the sort-based solvers do): in float32 its
    error grows with alpha (1e-4 at alpha = 3, 0.2 at alpha = 10).
    """
    out_dtype = z.dtype
    z, u = z.double(), u.double()
    count = visible.sum(-1, keepdim=True).to(z.dtype)
    log_n = torch.log(count.clamp_min(1))
    u = u.to(z.dtype).expand_as(count)
    safe_u = torch.where(u > 0, u, torch.ones_like(u))
    shifted = u >= 1
    lo = torch.where(shifted, -1 / safe_u, torch.zeros_like(count))
    hi = torch.where(shifted, -torch.exp(-u * log_n) / safe_u,
                     torch.where(u > 0, -torch.expm1(-u * log_n) / safe_u, log_n))
    eps = torch.finfo(z.dtype).eps
    tol = 4 * eps
    # |f| this small is rounding in the sum of the weights.
    f_tol = 16 * eps * torch.log2(count + 2)
    theta = lo.clone()   # (delta on shifted rows)
    # the iterate with the smallest |f| so far: near a support entry f' is unbounded and
    # the bracket must shrink to adjacent floats before that iterate is accurate
    best, best_f = theta, torch.full_like(theta, float("inf"))
    prev_f = best_f
    for _ in range(300):
        log_p = _log_weights(z, theta, u, visible, shifted)
        on = log_p > float("-inf")
        f = torch.exp(log_p).sum(-1, keepdim=True) - 1
        slope = torch.where(on, torch.exp((1 - u) * log_p), torch.zeros_like(log_p)).sum(-1, keepdim=True)
        better = f.abs() < best_f
        best, best_f = torch.where(better, theta, best), torch.where(better, f.abs(), best_f)
        lo = torch.where(f >= 0, theta, lo)
        hi = torch.where(f >= 0, hi, theta)
        newton = theta + f / torch.where(slope > 0, slope, torch.ones_like(slope))
        mid = (lo + hi) / 2
        tiny_step = (newton - theta).abs() <= tol * torch.where(shifted, theta.abs(), theta.abs().clamp_min(1))
        small_f = f.abs() <= f_tol
        done = ~((lo < mid) & (mid < hi)) | (tiny_step & small_f)
        if done.is_meta or (can_branch_on(done) and bool(done.all())):   # (traced: every iteration;
            break                                                            # meta: shapes after one)
        # A Newton step inside the bracket, unless it stalls or fails to halve |f| (a huge
        # slope for alpha > 2, or a root next to a support entry): then bisection.
        use_newton = ((slope > 0) & (newton > lo) & (newton < hi) & ~tiny_step & (f.abs() <= prev_f / 2))
        prev_f = f.abs()
        theta = torch.where(done, theta, torch.where(use_newton, newton, mid))
    theta = best
    p = torch.exp(_log_weights(z, theta, u, visible, shifted))
    total = p.sum(-1, keepdim=True)
    return (p / nonzero_or_one(total)).to(out_dtype)


def _solve_on_candidates(solver, z, visible, reach):
    """Run ``solver(z, visible)`` on the entries that can be in the support only.

    With the row maximum at 0, an entry below ``-reach`` (``reach = 1/u``, a float or a
    per-row tensor) gets weight 0 whatever the threshold; when few entries remain in every
    row, the solver runs on the top ``k`` entries (``torch.topk``) and the result is
    scattered back. This is exact: it only skips entries whose weight is 0.
    """
    if not can_branch_on(z):
        return solver(z, visible)
    candidates = visible & (z > -reach)
    k = int(candidates.sum(-1).max()) if z.numel() else 0
    if 4 * k > z.shape[-1]:
        return solver(z, visible)
    k = max(k, 1)
    top, index = z.masked_fill(~candidates, float("-inf")).topk(k, dim=-1)
    p_top = solver(torch.where(torch.isfinite(top), top, torch.zeros_like(top)), candidates.gather(-1, index))
    return torch.zeros_like(z).scatter(-1, index, p_top)


# ----------------------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------------------

def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64 where the device has it (the backward's weights span many decades)."""
    return t if t.dtype == torch.float64 or t.device.type == "mps" else t.double()


class _EntmaxFunction(torch.autograd.Function):
    r"""alpha-entmax on the last axis with its closed-form backward.

    Gradient with respect to the scores (Peters et al. 2019, Prop. 1): with
    ``g_i = p_i^{2-alpha}`` on the support (0 elsewhere; ``g = 1`` on the support for
    sparsemax, ``g = p`` for softmax),

    .. math:: \frac{\partial L}{\partial x} = g \odot \bar p - g\, \frac{\sum_j g_j \bar p_j}{\sum_j g_j}.

    Gradient with respect to alpha (the result of Correia, Niculae & Martins 2019,
    written in ``theta`` form, which has no cancellation as alpha -> 1): with
    ``d_i = x_i - theta = (p_i^u - 1)/u`` and ``h_i = p_i d_i^2 M(u d_i)``,

    .. math:: \frac{\partial p_i}{\partial \alpha} = h_i - g_i \frac{\sum_j h_j}{\sum_j g_j},

    which at alpha = 1 is ``-(p_i/2)((log p_i)^2 - sum_j p_j (log p_j)^2)``.
    """

    @staticmethod
    def forward(z, visible, u, method):
        # Entmax is shift invariant: solve with the visible row maximum at 0.
        filled = z.masked_fill(~visible, float("-inf"))
        top = filled.amax(-1, keepdim=True) if z.shape[-1] else z.new_zeros(z.shape[:-1] + (1,))
        top = torch.where(visible.any(-1, keepdim=True), top, torch.zeros_like(top))
        shifted = torch.where(visible, z - top, torch.zeros_like(z))
        if method == "sparsemax":
            p = _solve_on_candidates(_sparsemax_sorted, shifted, visible, 1.0)
        elif method == "entmax15":
            p = _solve_on_candidates(_entmax15_sorted, shifted, visible, 2.0)
        elif can_branch_on(u) and bool((u > 0).all()):
            p = _solve_on_candidates(lambda w, vis: _entmax_bisect(w, vis, u), shifted, visible, 1 / u)
        else:
            p = _entmax_bisect(shifted, visible, u)
        return p

    @staticmethod
    def setup_context(ctx, inputs, output):   # separate from forward: torch.func transforms need it
        ctx.save_for_backward(output, inputs[2])
        ctx.save_for_forward(output, inputs[2])
        ctx.method = inputs[3]

    @staticmethod
    def vmap(info, in_dims, z, visible, u, method):
        """``torch.func.vmap``: the op is row-wise along the last axis with any leading
        axes, so the vmapped axis becomes one more leading axis (``u`` broadcast over it)."""
        def lead(t, d):   # the vmapped axis first (size 1 where it is not vmapped)
            return t.unsqueeze(0) if d is None else t.movedim(d, 0)

        z = lead(z, in_dims[0])
        z = z.expand((info.batch_size,) + z.shape[1:])
        visible = lead(visible, in_dims[1]).expand(z.shape)
        u = lead(u, in_dims[2])
        return _EntmaxFunction.apply(z, visible, u, method), 0

    @staticmethod
    def backward(ctx, grad_p):
        p, u = ctx.saved_tensors
        wp, wu = _wide(p), _wide(u)
        g, g_sum, on, log_p = entmax_weights(wp, wu)
        wgrad = _wide(grad_p)
        grad_z = centered(g, wgrad, g_sum, ctx.method == "bisect").to(p.dtype)
        grad_u = None
        if ctx.needs_input_grad[2]:
            dp_du = dp_dalpha(wp, wu, g, g_sum, on, log_p)
            # an entry at p = 0 is constant in alpha: its incoming gradient (inf, NaN) passes nothing
            terms = torch.where(on, wgrad * dp_du, torch.zeros_like(dp_du))
            grad_u = terms.sum(-1, keepdim=True).sum_to_size(u.shape).to(u.dtype)
        return grad_z, None, grad_u, None

    @staticmethod
    def jvp(ctx, dz, _dvisible, du, _dmethod):
        """Forward mode (``torch.func.jvp``, ``forward_ad``): the Jacobian in ``z`` is symmetric,
        so the tangent is the backward's formula applied to ``dz``, plus ``dp/du * du``."""
        p, u = ctx.saved_tensors
        wp, wu = _wide(p), _wide(u)
        g, g_sum, on, log_p = entmax_weights(wp, wu)
        out = torch.zeros_like(wp)
        if dz is not None:
            out = centered(g, _wide(dz), g_sum, ctx.method == "bisect")
        if du is not None:
            out = out + dp_dalpha(wp, wu, g, g_sum, on, log_p) * _wide(du)
        return out.to(p.dtype)


_EntmaxTraced = without_forward_mode(_EntmaxFunction)


def _entmax_function():
    """:class:`_EntmaxFunction`, without its forward mode while ``torch.compile`` traces."""
    return _EntmaxTraced if torch.compiler.is_compiling() else _EntmaxFunction


# ----------------------------------------------------------------------------------------
# rows-level entry point and argument handling
# ----------------------------------------------------------------------------------------

def entmax_rows(z: torch.Tensor, visible: torch.Tensor, alpha) -> torch.Tensor:
    """alpha-entmax along the last axis over visible entries (building block, no checks).

    ``alpha`` is a float (1 -> softmax, 1.5 and 2 -> exact sort-based solvers) or a tensor
    of shape ``(..., 1)`` broadcastable to ``z`` (bisection; differentiable in alpha).
    Rows with a visible ``+inf`` give equal weights on those entries; rows with a visible
    NaN give NaN.
    """
    finite = visible & torch.isfinite(z)
    safe = torch.where(finite, z, torch.zeros_like(z))
    if isinstance(alpha, torch.Tensor):
        p = _entmax_function().apply(safe, finite, alpha - 1, "bisect")
    elif alpha == 1:
        p = softmax_rows(safe, finite)
    else:
        method = {2.0: "sparsemax", 1.5: "entmax15"}.get(float(alpha), "bisect")
        # (in float64 when z's dtype cannot hold it: a finite alpha of 1e39 raised in float32)
        wide = abs(float(alpha) - 1) > torch.finfo(z.dtype).max
        u = torch.full((1,) * z.dim(), float(alpha) - 1, dtype=torch.float64 if wide else z.dtype, device=z.device)
        p = _entmax_function().apply(safe, finite, u, method)
    if not can_branch_on(z) or bool((finite != visible).any()):  # (vmap, compile)
        inf_rows = (visible & (z == float("inf"))).any(-1, keepdim=True)
        p = torch.where(inf_rows, infinite_limit(z.detach(), visible), p)
        nan_rows = (visible & torch.isnan(z)).any(-1, keepdim=True)
        p = torch.where(nan_rows, torch.full_like(p, float("nan")), p)
    return p


def check_alpha(alpha) -> None:
    """alpha: a finite number or tensor, >= 1 everywhere."""
    check_finite(alpha, "alpha")
    check_at_least(alpha, 1.0, "alpha")


def entmax_from_rows(rows: Rows, z: torch.Tensor, alpha) -> torch.Tensor:
    if isinstance(alpha, torch.Tensor):
        # a float64 alpha stays float64 over float32 scores (its solve runs in float64): rounded to
        # float32 an alpha past 3.4e38 became inf and its rows all zeros, where the kernels take it
        dtype = torch.promote_types(alpha.dtype, rows.x.dtype) if alpha.is_floating_point() else None
        alpha = rows.per_row(alpha, "alpha", dtype)
    else:
        alpha = float(alpha)
    if z.shape[-1] == 0:
        return rows.restore(z.clone())
    return rows.restore(rows.zero_invisible(entmax_rows(z, rows.visible, alpha)))


