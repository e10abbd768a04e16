r"""``"performer"``: FAVOR+, positive orthogonal random features (Choromanski et al. 2020).

.. math:: \phi(x) = \frac{1}{\sqrt m}\exp\!\Big(W x - \frac{\lVert x\rVert^2}{2}\Big),\qquad
          \mathbb{E}_W\big[\phi(x)^\top \phi(y)\big] = \exp(x^\top y)

with ``x = sqrt(scale) q`` and ``y = sqrt(scale) k``, so that ``phi(q).phi(k)`` is an
unbiased estimate of the softmax kernel ``exp(scale q.k)``; the output is
``sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j)``. ``W`` is ``(m, D)`` with rows
``w_r ~ N(0, I_D)``; with ``orthogonal=True`` (default) the rows are drawn in blocks of ``D``
orthogonal directions (QR of a Gaussian matrix) whose lengths are redrawn as the norms of
independent Gaussian vectors, so every row is still marginally ``N(0, I)`` and the estimate
stays unbiased (Choromanski, Likhosherstov, Dohan, Song, Gane, Sarlos, Hawkins, Davis,
Mohiuddin, Kaiser, Belanger, Colwell, Weller 2020, "Rethinking Attention with Performers",
ICLR 2021, arXiv 2009.14794).

Parameters: ``nb_features`` (``m``, default 256), ``orthogonal``, ``generator`` (a
``torch.Generator`` for a reproducible draw; each call draws anew from it), or
``projection`` (a fixed ``(m, D)`` matrix from :func:`draw_projection`: redraw by drawing
another), ``eps``: a floor on the denominator in the kernel's own units (default 0: the
features are positive, so the denominator is; a query whose terms all underflow outputs 0).

Numerical range: each query's and each key's features are divided by ``e`` to their
largest exponent (``Features.shift``). Non-causal attention measures every key in the
units of the largest visible key, causal attention each query in those of the largest key
it sees (so no key is measured against a future one), and the factors cancel in the
ratio (a floor ``eps > 0`` applies to ``sum_j phi(q_i).phi(k_j)`` itself, not to its rescaled value).
"""

from __future__ import annotations

import math

import torch

from .._checks import can_branch_on
from ._spec import Features, LinearMethod, check_count, check_eps, ratio_combine


def draw_projection(nb_features: int, head_dim: int, *, orthogonal: bool = True,
                    generator: torch.Generator | None = None, dtype=torch.float32, device=None) -> torch.Tensor:
    """A random ``(nb_features, head_dim)`` projection ``W`` for FAVOR+ (rows marginally ``N(0, I)``).

    ``orthogonal=True``: blocks of ``head_dim`` mutually orthogonal rows (QR of a Gaussian
    matrix), each row rescaled to the norm of an independent ``N(0, I)`` vector
    (Choromanski et al. 2020, arXiv 2009.14794, section 2.4).
    """
    nb_features = check_count(nb_features, "nb_features")
    head_dim = check_count(head_dim, "head_dim")
    if not isinstance(orthogonal, bool):
        raise TypeError(f"orthogonal must be a bool, got {type(orthogonal).__name__}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    dev = generator.device if generator is not None else device
    g = torch.randn(nb_features, head_dim, generator=generator, dtype=torch.float64, device=dev)
    if orthogonal:
        blocks = []
        for r0 in range(0, nb_features, head_dim):
            rows = min(head_dim, nb_features - r0)
            a = torch.randn(head_dim, head_dim, generator=generator, dtype=torch.float64, device=dev)
            qmat, rmat = torch.linalg.qr(a)
            qmat = qmat * torch.sign(torch.diagonal(rmat)).where(torch.diagonal(rmat) != 0,
                                                                  torch.ones(head_dim, dtype=torch.float64, device=dev))
            blocks.append(qmat.T[:rows])
        w = torch.cat(blocks) * g.norm(dim=1, keepdim=True)
    else:
        w = g
    return w.to(dtype=dtype, device=device if device is not None else w.device)


def _check(params, head_dim, dtype, device):
    if head_dim < 1:
        raise ValueError("performer needs queries and keys with at least one feature (head dimension 0)")
    proj = params["projection"]
    if proj is None:
        m = check_count(params["nb_features"], "nb_features")
        if not isinstance(params["orthogonal"], bool):
            raise TypeError(f"orthogonal must be a bool, got {type(params['orthogonal']).__name__}")
        proj = draw_projection(m, head_dim, orthogonal=params["orthogonal"], generator=params["generator"],
                               dtype=dtype, device=device)
    else:
        if not isinstance(proj, torch.Tensor) or not proj.is_floating_point():
            raise TypeError("projection must be a floating-point tensor (nb_features, head_dim)")
        if proj.dim() != 2 or proj.shape[1] != head_dim or proj.shape[0] < 1:
            raise ValueError(f"projection must have shape (nb_features >= 1, head_dim={head_dim}), "
                             f"got {tuple(proj.shape)}")
        if can_branch_on(proj) and not bool(torch.isfinite(proj).all()):
            raise ValueError("projection must be finite (it holds NaN or inf)")
        proj = proj.to(dtype=dtype, device=device)
    return {"eps": check_eps(params["eps"], allow_zero=True), "projection": proj}


def _features(x, positions, ctx, is_query, visible):
    w = ctx["projection"]
    if not ctx["scale"] >= 0:
        raise ValueError(f"performer needs scale >= 0 (its kernel is exp(scale q.k) through sqrt(scale) q), "
                         f"got {ctx['scale']}")
    xs = x * math.sqrt(ctx["scale"])
    # u = log(sqrt(m) phi(x)) = W x - |x|^2 / 2; the 1/sqrt(m) is folded into the shift below
    u = xs @ w.T
    inplace = not (torch.is_grad_enabled() and u.requires_grad)
    half_norm = 0.5 * (xs * xs).sum(-1, keepdim=True)
    u = u.sub_(half_norm) if inplace else u - half_norm
    # each vector's features divided by e^(its largest u): every one is at most 1 / sqrt(m) and
    # its largest does not underflow; the engine rescales keys to common units
    shift = u.amax(-1, keepdim=True).detach()
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    offset = shift + 0.5 * math.log(w.shape[0])
    phi = u.sub_(offset).exp_() if inplace else torch.exp(u - offset)
    return Features(phi, shift)


METHOD = LinearMethod(
    name="performer",
    feature_map="exp(W x - |x|^2/2) / sqrt(m), W orthogonal random",
    formula="phi(q_i).phi(k_j) / sum_j' phi(q_i).phi(k_j')  (E = softmax kernel)",
    paper="Choromanski et al. 2020, arXiv 2009.14794",
    causal=True, decoding=True,
    params={"nb_features": 256, "orthogonal": True, "generator": None, "projection": None, "eps": 0.0},
    check=_check, features=_features, combine=ratio_combine, shift_invariant=True, uses_vsum=False,
)
