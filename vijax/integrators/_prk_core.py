"""The stage equations of every variational PRK family, written once on a Lie group.

Martín de Diego & Sato Martín de Almagro (2022) derive the variational PRK methods on a vector
space (§4.2, eq. (9)), with holonomic constraints (§4.3, eq. (13)), with nonholonomic ones (§5,
eq. (14); Hamiltonian form eq. (15), App. E), and on a Lie group over a retraction ``τ``
(§6, Thm 6.1; constraints §6.3--§6.4, App. F, and the Hamiltonian form App. G).  The group
equations contain the vector-space ones: on ``R^n`` (``compose = +``, ``τ = id``,
``d^L τ = I``, ``Ad = I``) they *are* eqs. (9), (13), (14) and (15).  This module holds them
once; :class:`vijax.VPRK`, :class:`vijax.HolonomicVPRK`, :class:`vijax.NonholonomicVPRK` call
it with the group ``R^n`` and :class:`vijax.GroupVPRK` with the system's group.  The branches
on the group's traits (:attr:`vijax.lie.AbstractLieGroup.commutative`,
:meth:`vijax.lie.AbstractRetraction.flat`) drop the tangent maps where they are the identity,
so that on ``R^n`` the compiled residual is the vector-space one (measured: no per-step cost
added, ``benchmarks/prk_core.py``).

With unknown stage algebra elements ``H^1..H^s`` (stage velocities ``V^i`` on ``R^n``):

    Ξ^i = h Σ_j a_ij H^j,   G^i = g_k τ(Ξ^i),   V^i = d^Lτ_{Ξ^i} H^i,   ξ = h Σ_j b_j H^j,
    F^i = L*_{G^i} D1ℓ(G^i, V^i) + F_ext^i + (constraint forces),
    μ_{k+1} = Ad*_{τ(ξ)} [μ_k + h Σ_j b_j Ad*_{τ(Ξ^j)^{-1}} F^j],
    0 = (d^Lτ_{Ξ^i})* D2ℓ + h Σ_j (b_j - â_ij) [(d^Lτ_{Ξ^j})* F^j + (dd^Lτ_{Ξ^j})*(H^j, D2ℓ^j)]
        - (d^Lτ_ξ)* μ_{k+1},
    g_{k+1} = g_k τ(ξ),

(their eqs. (24)--(30), ``b_j a_ji / b_i = b_j - â_ij``); on a commutative group with a flat
retraction the residual is written directly as ``D2ℓ(G^i, V^i) - μ_k - h Σ_j â_ij F^j``
(their eq. (9)), the same equation without the round-off of adding and subtracting ``μ_{k+1}``.

Constraints (``mode``):

* ``"holonomic"``: ``F^i`` gains ``-(L*_{G^i} DΦ)ᵀ Λ^i``; the unknowns are ``(H, hΛ^1..hΛ^s,
  ξ_{k+1})`` and the residual ``(stage rows, Φ(G^i)/h (i >= 2), D2ℓ(g_{k+1}, ξ_{k+1}) - μ_{k+1},
  L*DΦ(g_{k+1}) ξ_{k+1})`` (eq. (13) and §6.3);
* ``"nonholonomic"``: ``F^i`` gains ``D2φ(G^i, V^i)ᵀ Λ^i`` with ``Λ^1 = λ_k`` carried; the
  constraint is imposed on the IIIA-built stage momenta ``μ^i = Ad*_{τ(Ξ^i)} [μ_k + h Σ_j
  a_ij Ad*_{τ(Ξ^j)^{-1}} F^j]`` through ``φ(G^i, η^i) = 0``, ``D2ℓ(G^i, η^i) = μ^i``
  (``i = 2..s``; eq. (14), App. F).  The unknowns are ``(H, hΛ^2..hΛ^s, w)``: ``w = η^2..η^s``
  joins them for a Lagrangian not declared ``quadratic_in_velocity`` (else ``η^i`` is one
  linear solve);
* ``form="hamiltonian"`` (nonholonomic only; eq. (15), App. E, App. G): the unknowns are
  ``(H, hΛ^2..hΛ^s, P)`` with ``P^i`` the stage momenta ``μ̄^i = (d^Lτ_{Ξ^i})^{-*} Π^i``; the
  derivatives come from the reduced Hamiltonian ``𝔥(g, μ)`` (``system.hamiltonian``):
  ``d^Lτ_{Ξ^i} H^i = D2𝔥(G^i, P^i)`` (App. G prints ``(d^Lτ)*`` here; the dimensions need the
  tangent itself), ``F^i = -L*_{G^i} D1𝔥(G^i, P^i) + ...`` with the constraint one-forms
  ``♭_𝔥(D2ψ) = D2φ(G^i, D2𝔥)`` and ``η^i = D2𝔥(G^i, μ^i)``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from .. import constraints as cons
from .. import tableaus as tb
from .._linalg import factor, mm
from .._tracing import depends_on_first
from ..lie import AbstractLieGroup, AbstractRetraction, Exp, Rn
from ..quadrature import lagrange_extrapolation_matrix
from ..solvers import Newton
from ._base import AbstractState

__all__ = ["PRKState", "StepOutput", "stage_equations", "extrapolation", "predict", "at_nodes",
           "vector_space", "initial_state", "next_state", "corrected", "missed", "Misses",
           "Coupling", "momentum_coupling", "first_order_terms",
           "free_precond", "nonholonomic_precond", "nonholonomic_solver"]

MODES = ("free", "holonomic", "nonholonomic")


class PRKState(AbstractState):
    """``(t, q, p)`` (``q`` a vector or a group element, ``p`` the (body) momentum), the node
    velocity ``v``, the node multiplier ``lam`` (empty without constraints) and the last step's
    stage values (``stages`` the ``H^i`` with constraints, the stage body velocities ``V^i``
    without (the same on a vector space); ``lams`` the ``Λ^i``) from which the next step's
    predictor is built.  For a nonholonomic
    system ``lam`` is ``Λ^s`` of the step that ended here, the next step's ``Λ^1``, and ``v``
    is the node velocity ``η^s`` (the inverse Legendre map of ``p``), not the IIIB stage
    velocity.  ``misses``: the predictor's misses of the last two steps (:class:`Misses`) on
    the stage unknowns and impulses (nonholonomic mode), the stage unknowns (unconstrained
    group mode), none (holonomic mode)."""

    t: Float[Array, ""]
    q: PyTree
    p: Float[Array, " d"]
    v: Float[Array, " d"]
    lam: Float[Array, " m"]
    stages: Float[Array, "s d"]
    lams: Float[Array, "s m"]
    misses: "Misses"


class StepOutput(NamedTuple):
    """What a residual evaluation gives besides the residual: ``g_{k+1}``, ``μ_{k+1}``, the
    node velocity (``η^s`` nonholonomic, the unknown ``ξ_{k+1}`` holonomic, ``None`` free) and
    the stage forces ``L*D1ℓ(G^i, V^i) + F_ext^i`` without the constraint forces (what the
    vector-space VPRK stores as its ``W^i``)."""

    q: PyTree
    p: Array
    v: Optional[Array]
    forces: Array
    body: Optional[Array] = None    # free: the stage body velocities V^i (next predictor)


def at_nodes(system, times, fn, *args):
    """``fn(system.at(t_i), *args_i)`` over the leading axis (``jax.vmap``); ``times`` may be
    ``None`` for a system whose Lagrangian does not depend on time."""
    if times is None:
        return jax.vmap(lambda *x: fn(system, *x))(*args)
    return jax.vmap(lambda t, *x: fn(system.at(t), *x))(times, *args)


def vector_space(q) -> tuple[AbstractLieGroup, AbstractRetraction]:
    """The group ``R^n`` of a vector configuration ``q`` and its (identity) retraction."""
    return Rn(int(q.shape[-1])), Exp()


def _rows(tree, start):
    return jax.tree_util.tree_map(lambda x: x[start:], tree)


def _coefficients(pair: tb.PartitionedTableau, dtype):
    return tuple(jnp.asarray(x, dtype) for x in (pair.q.a, pair.p.a, pair.q.b, pair.q.c))


def _hamiltonian_derivatives(group, sy, g, mu):
    """``(L*_g D1𝔥, D2𝔥)`` of the (reduced) Hamiltonian at ``(g, μ)`` in one reverse pass."""
    zero = jnp.zeros_like(mu)
    return jax.grad(lambda z, m: sy.hamiltonian(group.compose(g, group.exp(z)), m),
                    argnums=(0, 1))(zero, mu)


def stage_equations(pair: tb.PartitionedTableau, group: AbstractLieGroup,
                    retraction: AbstractRetraction, system, mode: str, state, h, X,
                    force=None, *, form: str = "lagrangian", dd_term: bool = True,
                    with_stages: bool = False):
    """Residuals of one step at the unknowns ``X = (H, μ, extra)`` and a :class:`StepOutput`
    (see the module docstring for the unknowns of each ``mode`` and ``form``).  ``state``
    needs ``t``, ``q``, ``p`` and, with constraints, ``lam`` and ``v``.  ``force(G, V)`` gives
    the stage generalised forces (:func:`vijax.integrators._forcing.stage_force`).
    ``dd_term=False`` drops the ``(dd^Lτ)*`` term (for the test that shows why it is there).
    ``with_stages=True`` adds ``(G^i, μ^i, η^i)`` for ``i = 1..s`` (nonholonomic only) to the
    output: where the constraint is imposed."""
    dtype = state.p.dtype
    a, ahat, b, c = _coefficients(pair, dtype)
    H, mus, extra = X
    g, mu0 = state.q, state.p
    times = state.t + h * c
    flat = retraction.flat(group)
    commutative = group.commutative
    Xi = h * mm(a, H)
    xi = h * mm(b, H)
    T = jax.vmap(lambda x: retraction.tau(group, x))(Xi)
    G = jax.vmap(lambda t: group.compose(g, t))(T)
    if flat:
        D, V = None, H
    else:
        # per stage D^i = d^Lτ_{Ξ^i} and the stage velocity V^i = D^i H^i
        D = jax.vmap(lambda x: retraction.dtau(group, x))(Xi)
        V = jnp.einsum("ide,ie->id", D, H)
    hamiltonian = form == "hamiltonian"
    extra_rows = ()
    if hamiltonian:
        P = extra
        Hq, Hp = at_nodes(system, times, lambda sy, x, y: _hamiltonian_derivatives(group, sy, x, y),
                          G, P)
        D1, D2 = -Hq, P
        extra_rows = (V - Hp,)
    else:
        D1, D2 = at_nodes(system, times, lambda sy, x, y: sy.derivatives(x, y), G, V)
    F = D1 if force is None else D1 + force(G, V)
    hF = h * F
    if mode == "nonholonomic":
        A = at_nodes(system, times, lambda sy, x, y: sy.constraint_matrix(x, y), G,
                     Hp if hamiltonian else V)
        hF = hF + jnp.einsum("imd,im->id", A, jnp.concatenate([(h * state.lam)[None, :], mus]))
    elif mode == "holonomic":
        # the constraint at the stage times, as the Lagrangian (a rheonomic g(t, q) reads
        # them; a clock that is not read leaves the same program)
        J = at_nodes(system, times, lambda sy, x: group.left_jacobian(sy.holonomic, x), G)
        hF = hF - jnp.einsum("imd,im->id", J, mus)
    # (d^Lτ^{-1}_{-Ξ})* N = (Ad^{-1}_{τ(Ξ)})* (d^Lτ^{-1}_Ξ)* N = Ad*_{τ(Ξ)^{-1}} hF: their
    # eq. (28), no inverse tangent needed
    Psi = hF if commutative else jax.vmap(lambda t, f: group.Ad_star(group.inverse(t), f))(T, hF)
    tau_xi = retraction.tau(group, xi)
    base1 = mu0 + mm(b, Psi)
    mu1 = base1 if commutative else group.Ad_star(tau_xi, base1)
    if flat and commutative:
        res = D2 - (mu0[None, :] + mm(ahat, hF))
    else:
        if flat:
            hN, Pi, dd = hF, D2, 0.0
        else:
            hN = jnp.einsum("ide,id->ie", D, hF)             # (d^Lτ)* hF
            Pi = jnp.einsum("ide,id->ie", D, D2)             # (d^Lτ)* D2ℓ
            # (dd^Lτ_Ξ)*(H, Π) = [∂_Ξ(d^Lτ_Ξ H)]ᵀ (d^Lτ_Ξ)^{-T} Π, and (d^Lτ)^{-T} Π = D2ℓ
            dd = (jax.vmap(lambda x, y, z: jax.vjp(lambda u: retraction.dtau(group, u) @ y,
                                                     x)[1](z)[0])(Xi, H, D2)
                  if dd_term else 0.0)
        rhs = mu1 if flat else retraction.dtau(group, xi).T @ mu1
        res = Pi + mm(b[None, :] - ahat, hN + h * dd) - rhs[None, :]
    g1 = group.compose(g, tau_xi)
    if mode == "nonholonomic":
        base = mu0[None, :] + mm(a[1:], Psi)
        stage_mu = base if commutative else jax.vmap(group.Ad_star)(_rows(T, 1), base)
        G2, t2 = _rows(G, 1), times[1:]
        if hamiltonian:
            eta = at_nodes(system, t2, lambda sy, x, m: jax.grad(sy.hamiltonian, 1)(x, m), G2,
                           stage_mu)
        elif extra is None:
            eta = at_nodes(system, t2, lambda sy, x, m, v: sy.velocity(x, m, v), G2, stage_mu,
                           V[1:])
        else:
            eta = extra
            extra_rows = (at_nodes(system, t2, lambda sy, x, v: sy.momentum(x, v), G2, eta)
                          - stage_mu,)
        phi = at_nodes(system, t2, lambda sy, x, v: sy.nonholonomic(x, v), G2, eta)
        out = StepOutput(g1, mu1, eta[-1], F)
        if with_stages:
            out = (out, (G, jnp.concatenate([mu0[None, :], stage_mu]),
                         jnp.concatenate([state.v[None, :], eta])))
        return (res, phi) + extra_rows, out
    if mode == "holonomic":
        rows = at_nodes(system, times[1:], lambda sy, x: sy.holonomic(x), _rows(G, 1)) / h
        at_t1 = system.at(state.t + h)
        tangency = group.left_jacobian(at_t1.holonomic, g1) @ extra
        rate = cons.constraint_rate(at_t1, g1)
        if rate is not None:   # a rheonomic constraint: G v + ∂g/∂t = 0
            tangency = tangency + rate
        momentum = at_t1.momentum(g1, extra) - mu1
        return (res, rows, momentum, tangency), StepOutput(g1, mu1, extra, F)
    return res, StepOutput(g1, mu1, None, F, V)


class Coupling(NamedTuple):
    """The configuration dependence of the momentum at ``(g, v)`` for :func:`free_precond`,
    each term ``None`` when it vanishes identically: ``N = ∂D2ℓ/∂g`` (left-trivialised;
    ``∂²L/∂v∂q`` on ``R^n``) and ``Ṁ``, the rate of the velocity Hessian along the motion."""

    N: Optional[Array]
    Mdot: Optional[Array]


def momentum_coupling(system, group: AbstractLieGroup, g, v) -> Optional[Coupling]:
    """The :class:`Coupling` of ``system`` at ``(g, v)`` (``system.momentum`` differentiated
    by ``jax.jacfwd``), or ``None`` when the momentum does not depend on the configuration at
    all.  Whether each term vanishes is decided from the program while tracing, so
    ``½|v|² - V(q)`` or a rigid body pays nothing, and a magnetic term ``A(q)·v`` only its
    ``N``."""
    def momentum(z, y):
        return system.momentum(group.compose(g, group.exp(z)), y)

    def hessian(z, y):
        return jax.jacfwd(momentum, argnums=1)(z, y)

    zero = jnp.zeros_like(v)
    N = jax.jacfwd(momentum)(zero, v) if depends_on_first(momentum, zero, v) else None
    Mdot = (jax.jvp(lambda z: hessian(z, v), (zero,), (v,))[1]
            if depends_on_first(hessian, zero, v) else None)
    return None if N is None and Mdot is None else Coupling(N, Mdot)


def free_precond(pair: tb.PartitionedTableau, group: AbstractLieGroup, minv, mu, eta, h,
                 coupling=None):
    """Approximate inverse Jacobian of the unconstrained stage equations, ``r -> P r``.

    On a commutative group (``R^n``, SO(2)) with a flat retraction: the inverse velocity
    Hessian ``minv = M^{-1}`` at the step start, stage by stage (the Jacobian is ``I ⊗ M``
    up to terms of order ``h²``, from the forces).  On a non-commutative group the
    coadjoint terms of the equations (``Ad*_{τ(ξ)}``, ``(d^Lτ)*``, ``(dd^Lτ)*``) add terms
    of order ``h`` -- the gyroscopic coupling ``ad*_ξ μ`` of the Euler--Poincaré equations --
    and a fixed point preconditioned by ``M^{-1}`` alone contracts only by a factor ``O(h |ξ|)``
    per update (9.6 updates per Gauss(2) step on the heavy top against 3.0 on ``R^3``).  With
    ``M``, ``μ = μ_k`` and ``η = ξ_k`` at the step start, expanding every tangent map to first
    order (``d^Lτ_Ξ = I - ad_Ξ / 2 + O(Ξ²)``, ``Ad*_{τ(ξ)} = I + ad_ξᵀ + O(ξ²)``, the same for
    the exponential and the Cayley map) gives the Jacobian of stage row ``i`` with respect to
    ``H^k`` as ``δ_ik M + h K_ik + O(h²)``,

        K_ik = -(a_ik + â_ik)/2 Γ_μ + ((b_k - â_ik) - c_i δ_ik)/2 ad_ηᵀ M
               + (a_ik - c_i δ_ik)/2 M ad_η,

    ``Γ_μ δ = ad_δᵀ μ`` (``c_i = Σ_k a_ik``).  When the momentum depends on the
    configuration (a magnetic or Coriolis term, a configuration-dependent mass), ``coupling``
    (:func:`momentum_coupling`) adds ``a_ik N - â_ik Nᵀ`` (the stage momentum through
    ``G^i``, the stage force through ``V^i``) and ``c_i δ_ik Ṁ`` (the velocity Hessian at
    the stage instead of the step start).  ``P`` is that ``sn × sn`` matrix's inverse to
    first order, ``I ⊗ M^{-1} - h (I ⊗ M^{-1}) K (I ⊗ M^{-1})`` (:func:`first_order_terms`),
    built once per step (a test checks ``P J - I = O(h²)`` against the Jacobian of the
    residual by ``jax.jacfwd``).  The forces' dependence on ``H`` (order ``h²`` for forces
    of the configuration) is left out, as on ``R^n``."""
    return first_order_inverse(minv[None], first_order_terms(pair, group, minv, mu, eta,
                                                             coupling), h, pair.q.stages)


def first_order_inverse(minv, terms, h, s: int):
    """``r -> (blockdiag(M_k^{-1}) - h Σ C ⊗ B) r`` on stage-by-row arrays ``r`` (``s × n``),
    with ``minv`` the ``M^{-1}`` of each stage (``s × n × n``, or ``1 × n × n`` for one shared
    by all) and ``terms`` the ``(C, B)`` of :func:`first_order_terms`.  With one shared
    ``M^{-1}`` it is one ``sn × sn`` matrix built per step (applied term by term,
    ``(C ⊗ B) r = C r Bᵀ``, a ``vmap``-ed ensemble of the magnetic R^3 system ran at 0.6-0.9x
    the throughput on CPU); with one per stage it is applied term by term (the block-diagonal
    ``sn × sn`` matrix made a Lobatto(3) unicycle step 2-3x slower on CPU)."""
    shared = minv.shape[0] == 1
    if not terms:   # stage by stage, as without the first-order terms
        return ((lambda r: mm(r, minv[0].T)) if shared else
                (lambda r: jnp.einsum("kde,ke->kd", minv, r)))
    dtype, n = minv.dtype, minv.shape[-1]
    if shared:
        P = jnp.kron(jnp.eye(s, dtype=dtype), minv[0]) - h * sum(
            jnp.kron(jnp.asarray(C, dtype), B) for C, B in terms)
        return lambda r: mm(P, r.reshape(-1)).reshape(s, n)
    terms = [(jnp.asarray(C, dtype), B) for C, B in terms]

    def apply(r):
        out = jnp.einsum("kde,ke->kd", minv, r)
        for C, B in terms:
            out = out - h * mm(mm(C, r), B.T)
        return out

    return apply


def _coadjoint(group: AbstractLieGroup, mu, eta):
    """``(ad_η, Γ_μ)``: the matrices of ``δ -> [η, δ]`` and of ``δ -> ad_δᵀ μ`` (the latter by
    ``jax.jacfwd``), for the coadjoint terms of the preconditioners."""
    return group.ad(eta), jax.jacfwd(lambda d: group.ad_star(d, mu))(jnp.zeros_like(mu))


def first_order_terms(pair: tb.PartitionedTableau, group: AbstractLieGroup, minv, mu, eta,
                      coupling=None, coadjoint=None) -> list:
    """The terms ``(C, B)`` of ``(I ⊗ M^{-1}) K (I ⊗ M^{-1}) = Σ C ⊗ B`` in
    :func:`free_precond` (``C`` a constant ``s × s`` tableau matrix, ``B`` an ``n × n``
    matrix of the step); empty on a commutative group without ``coupling``.  ``coadjoint``:
    :func:`_coadjoint` at ``(μ, η)`` when the caller has it already."""
    a, ahat = np.asarray(pair.q.a, float), np.asarray(pair.p.a, float)
    b, c = np.asarray(pair.q.b, float), np.asarray(pair.q.a, float).sum(axis=1)
    terms = []
    if not group.commutative:
        ad, gamma = _coadjoint(group, mu, eta) if coadjoint is None else coadjoint
        # (I ⊗ M + h K)^{-1} = I ⊗ M^{-1} - h (I ⊗ M^{-1}) K (I ⊗ M^{-1}) + O(h²): no
        # inverse to form, and M itself drops out of the last two blocks
        terms += [(-0.5 * (a + ahat), mm(mm(minv, gamma), minv)),
                  (0.5 * (b[None, :] - ahat - np.diag(c)), mm(minv, ad.T)),
                  (0.5 * (a - np.diag(c)), mm(ad, minv))]
    if coupling is not None and coupling.N is not None:
        terms += [(a, mm(mm(minv, coupling.N), minv)), (-ahat, mm(mm(minv, coupling.N.T), minv))]
    if coupling is not None and coupling.Mdot is not None:
        terms += [(np.diag(c), mm(mm(minv, coupling.Mdot), minv))]
    return terms


def nonholonomic_precond(pair: tb.PartitionedTableau, group: AbstractLieGroup,
                         retraction: AbstractRetraction, system, state, h, H0,
                         with_velocities: bool):
    """Approximate inverse Jacobian of the nonholonomic stage equations (Lagrangian form) for
    a preconditioned fixed point, at the predicted stages ``G^i = g_k τ(h Σ_j a_ij H0^j)``,
    ``V^i ≈ H0^i``: the velocity Hessians ``M_i``, the constraint matrices ``A_i = D2φ``
    and the (left-trivialised) configuration derivatives ``B_i = D1φ`` there.  Dropped: the
    stage forces' dependence on ``H`` (order ``h`` in the stage rows), and the change of
    these matrices between predictor and solution.

    With ``μ_j = h Λ^j`` (``j >= 2``) that Jacobian is

        ∂(stage row i) = M_i dH_i - Σ_{j>=2} â_ij A_jᵀ dμ_j,
        ∂(φ row i)     = h Σ_k a_ik B_i dH_k + Σ_{j>=2} a_ij A_i M_i^{-1} A_jᵀ dμ_j  (i >= 2),

    and with the stage velocities ``w_i = η^i`` as unknowns (``with_velocities``: a
    Lagrangian not quadratic in the velocities) the rows ``φ(G^i, w_i)`` and
    ``D2ℓ(G^i, w_i) - μ^i`` become ``h Σ_k a_ik B_i dH_k + A_i dw_i`` and
    ``M_i dw_i - Σ_j a_ij A_jᵀ dμ_j``.  Eliminating ``dH`` (and ``dw``) leaves one
    ``(s - 1) m``-square system for ``dμ``, with blocks
    ``K_ij = a_ij A_i M_i^{-1} A_jᵀ + h Σ_k a_ik â_kj B_i M_k^{-1} A_jᵀ`` and right-hand side
    ``r_φ,i - A_i M_i^{-1} r_w,i - h Σ_k a_ik B_i M_k^{-1} r_H,k``, factorised once per step.

    On a non-commutative group two terms of order ``h`` join (the coadjoint terms of
    :func:`free_precond`): ``dH`` is ``(M_k^{-1})`` corrected by :func:`first_order_terms`, and
    ``B_i`` gains ``A_i M_i^{-1} Γ_μ`` (``Γ_μ δ = ad_δᵀ μ_k``: the stage momenta
    ``Ad*_{τ(Ξ^i)} μ_k ≈ μ_k + ad_{Ξ^i}ᵀ μ_k`` move with ``H``).  On the unicycle at
    h = 0.1 that takes a Lobatto step from 11 updates to 6.4-8.3 (s = 2..4, both
    retractions)."""
    dtype = state.p.dtype
    a_np = np.asarray(pair.q.a)
    a = jnp.asarray(a_np, dtype)
    a1 = jnp.asarray(a_np[1:, :], dtype)                            # (s-1, s)
    a2 = jnp.asarray(a_np[1:, 1:], dtype)                           # (s-1, s-1)
    ahat = jnp.asarray(np.asarray(pair.p.a)[:, 1:], dtype)        # (s, s-1)
    g = state.q
    times = state.t + h * jnp.asarray(np.asarray(pair.q.c), dtype)
    G = jax.vmap(lambda x: retraction.retract(group, g, x))(h * mm(a, H0))

    def constraint_matrices(sy, x, v):
        B = jax.jacfwd(lambda z: sy.nonholonomic(group.compose(x, group.exp(z)), v))(
            jnp.zeros_like(v))
        return sy.constraint_matrix(x, v), B

    minv = at_nodes(system, times, lambda sy, x, v: sy.inverse_velocity_hessian(x, v), G, H0)
    # the constraint rows and impulses are those of stages 2..s only
    A2, B2 = at_nodes(system, times[1:], constraint_matrices, _rows(G, 1), H0[1:])
    am = jnp.einsum("iad,ied->iae", A2, minv[1:])                   # A_i M_i^{-1}    (s-1,m,d)
    ma = jnp.einsum("kde,jbe->kjdb", minv, A2)                      # M_k^{-1} A_jᵀ
    n, m = A2.shape[0], A2.shape[1]
    K = a2[:, None, :, None] * jnp.einsum("iad,jbd->iajb", am, A2)
    terms, gamma = [], None
    if not group.commutative:
        # the coadjoint terms of order h (ad = ad_η, Γ δ = ad_δᵀ μ_k at the step start):
        # the stage rows' H-columns as in free_precond; their impulse columns, where the
        # constraint forces are carried by (d^Lτ)*, Ad*_{τ(ξ)} and Ad*_{τ(Ξ^j)^{-1}}:
        # -â_ij A_jᵀ + h e_ij adᵀ A_jᵀ; and the stage momenta Ad*_{τ(Ξ^i)} [μ_k + Σ_j a_ij
        # Ad*_{τ(Ξ^j)^{-1}} hF_j] ≈ μ_k + h c_i adᵀ μ_k + Σ_j a_ij (I + h (c_i - c_j) adᵀ) hF_j
        # that the constraint rows read
        ad, gamma = coadjoint = _coadjoint(group, state.p, state.v)
        terms = first_order_terms(pair, group, minv[0], state.p, state.v, coadjoint=coadjoint)
        bn, cn = np.asarray(pair.q.b, float), a_np.sum(axis=1)
        e = (bn * cn - 0.5 * bn)[None, :] - 0.5 * (bn[None, :] - np.asarray(pair.p.a)) * cn
        e1 = jnp.asarray(e[:, 1:], dtype)                            # (s, s-1)
        dc = jnp.asarray(a_np[1:, 1:] * (cn[1:, None] - cn[None, 1:]), dtype)
        B2 = B2 + jnp.einsum("iad,de->iae", am, gamma)
        K = K + h * dc[:, None, :, None] * jnp.einsum("iad,ed,jbe->iajb", am, ad, A2)
    K = K + h * jnp.einsum("ik,kj,iad,kjdb->iajb", a1, ahat, B2, ma)
    solve_k = factor(K.reshape(n * m, n * m))

    stage_inverse = first_order_inverse(minv, terms, h, minv.shape[0])   # M_k^{-1}, corrected

    def precond(r):
        res, phi = r[0], r[1]
        mres = stage_inverse(res)
        rhs = phi - h * jnp.einsum("iad,id->ia", B2, mm(a1, mres))
        if with_velocities:
            rhs = rhs - jnp.einsum("iad,id->ia", am, r[2])
        Y = solve_k(rhs.reshape(-1)).reshape(n, m)
        cf = jnp.einsum("jad,ja->jd", A2, Y)                        # A_jᵀ dμ_j
        if gamma is None:
            dH = stage_inverse(res + mm(ahat, cf))
            dmu = mm(a2, cf)
        else:
            dH = stage_inverse(res + mm(ahat, cf) - h * mm(e1, mm(cf, ad)))
            dmu = mm(a2, cf) + h * (mm(dc, mm(cf, ad)) + mm(mm(a1, dH), gamma.T))
        if not with_velocities:
            return dH, Y, None
        return dH, Y, jnp.einsum("ide,ie->id", minv[1:], r[2] + dmu)

    return precond


def nonholonomic_solver(solver, pair: tb.PartitionedTableau, form: str, group, retraction,
                        system, state, h, H0):
    """The solver of a nonholonomic step and its preconditioner: ``solver`` as given (with
    the preconditioner of :func:`nonholonomic_precond` in the Lagrangian form, used by the
    fixed-point solvers), by default the constrained methods' fixed point
    (:func:`vijax.constraints.default_solver`) stopping at a hundredth of the tolerance in
    the Lagrangian form, and :class:`Newton` in the Hamiltonian form (whose stage rows
    depend on the stage velocities only at order ``h``, which that preconditioner does not
    capture).  (``kappa=0.01``: the constraint rows are part of the solve, and with the
    constrained methods' ``0.1`` the rotating pendulum-driven CVT ends steps with
    ``|Φ| = 2.9e-13`` over T = 1000, against 3.9e-14 at 0.01 for 0.4 more iterations per
    step and 1.2e-14 with Newton.)"""
    if form == "hamiltonian":
        return (Newton() if solver is None else solver), None
    precond = nonholonomic_precond(pair, group, retraction, system, state, h, H0,
                                   not system.quadratic_in_velocity)
    return (cons.default_solver(kappa=0.01) if solver is None else solver), precond


def extrapolation(pair: tb.PartitionedTableau, dtype, constant: bool = False):
    """Predictor matrix, the previous step's stage values -> this step's: their interpolation
    polynomial at ``1 + c_i``, or (``constant``, or repeated nodes) the last stage value."""
    tq = pair.q
    s = tq.stages
    if constant or len(set(tq.c_)) < s:
        extrap = np.zeros((s, s))
        extrap[:, -1] = 1.0
    else:
        c = np.asarray(tq.c)
        extrap = lagrange_extrapolation_matrix(c, 1.0 + c)
    return jnp.asarray(extrap, dtype)


def _equal_stage_momenta(pair: tb.PartitionedTableau) -> bool:
    """Whether every row of the momentum tableau ``â`` is the same (all stage momenta equal)."""
    ahat = np.asarray(pair.p.a, float)
    return pair.q.stages > 1 and bool(np.allclose(ahat, ahat[:1], rtol=0.0, atol=1e-14))


def predict(pair: tb.PartitionedTableau, state: PRKState, h, mode: str, extra: str = "", *,
            system=None, group: Optional[AbstractLieGroup] = None,
            retraction: Optional[AbstractRetraction] = None, retrace: bool = False):
    """The warm start ``X0`` of :func:`stage_equations` from the previous step's stage values:
    the stage values extrapolated; the holonomic node velocity shifted by the change of the
    last stage (with equal stage momenta, as in RATTLE, stage and node velocities from the
    mean velocity and the node velocity, exact to ``O(h²)``); the nonholonomic ``extra``:
    ``"velocities"`` (``w = η^2..η^s``) the predicted stages shifted the same way,
    ``"momenta"`` (the Hamiltonian form; needs ``system``, ``group`` and ``retraction``) the
    Legendre map ``D2ℓ(G^i, V^i)`` at the predicted stages.

    ``retrace`` (nonholonomic and holonomic modes on a vector space, a symmetric pair; see
    :meth:`vijax.integrators.AbstractIntegrator.retracing`): ``state`` was reached by a step
    with ``-h``, whose stage values and multipliers, in reverse order, are this step's root."""
    if mode == "free" and group is not None and retraction is not None:
        return (free_group_predictor(pair, state, h, group, retraction),
                jnp.zeros((0,), state.p.dtype), None)
    extrap = extrapolation(pair, state.p.dtype)
    if retrace:
        H0, lams = state.stages[::-1], state.lams[::-1]
    else:
        H0, lams = mm(extrap, state.stages), mm(extrap, state.lams)
    shift = state.v - state.stages[-1]
    if mode == "nonholonomic":
        if extra == "velocities":
            x0 = H0[1:] + shift[None, :]
        elif extra == "momenta":
            a, _, _, c = _coefficients(pair, state.p.dtype)
            Xi = h * mm(a, H0)
            G = jax.vmap(lambda x: retraction.retract(group, state.q, x))(Xi)
            V = H0 if retraction.flat(group) else jax.vmap(
                lambda x, y: retraction.dtau(group, x) @ y)(Xi, H0)
            x0 = at_nodes(system, state.t + h * c, lambda sy, x, y: sy.momentum(x, y), G, V)
        else:
            x0 = None
        return (H0, h * lams[1:], x0)
    if mode == "holonomic":
        if retrace:
            # the node velocity v_{k+1} is not carried: reflected through the last stage as
            # the step back's node velocity v_k through its first, exact to O(h^2)
            return (H0, h * lams, H0[-1] - shift)
        if _equal_stage_momenta(pair):
            # Equal rows of â (Lobatto IIIB(2): RATTLE) give equal stage momenta, hence (for
            # a constant velocity Hessian) equal stage velocities: the step's mean velocity,
            # v(t - h/2) + O(h^2).  With the node velocity v_k they extrapolate to
            # v(t_k + h/2) and v(t_k + h), exact to O(h^2) (the polynomial through the stage
            # values, constant here, is exact to O(h)): 3.6-3.8 instead of 5.8-6.1 updates per
            # RATTLE step on the planar pendulum at h = 0.01.
            return (H0 + 2.0 * shift[None, :], h * lams, H0[-1] + 3.0 * shift)
        return (H0, h * lams, H0[-1] + shift)
    return (H0, jnp.zeros((0,), state.p.dtype), None)


def corrected(X0, misses, warm):
    """The warm start ``X0`` corrected by the predictor's last misses ``misses[0]``,
    ``misses[1]`` (``X - X0`` of the last two steps, :func:`missed`), extrapolated linearly.

    The miss of an extrapolated predictor is a smooth function of time to leading order (the
    extrapolation error of smooth stage values, plus the stage values' own error, smooth in
    time for each stage), so each miss of the last steps carried over removes one power of
    ``h``.  ``warm`` counts the steps taken (at most 3): the first step's predictor comes
    from the initial state, not from stage values, so its miss is not carried; the second
    step's miss corrects from the third step on, both misses from the fourth.  Measured on
    the chaotic double pendulum, ``VPRK`` (velocity form), h = 0.01, 20000 steps, fixed-point
    updates per step without / with the last miss / with both: Gauss(2) 4.49 / 4.13 / 3.83,
    Gauss(3) 3.97 / 3.66 / 3.37, Lobatto IIIA-IIIB(3) 5.40 / 4.98 / 4.55 (the step 0.90x,
    0.91x, 0.87x); ``gauss(6)`` at h = 0.035 4.77 / 4.76 / 4.79 (its updates are set by the
    contraction rate, not the start).  Where the start matters less the carried misses cost
    more than they save: Kepler (force form) 2.19 -> 2.04 updates but 1.06-1.10x the step
    time, so ``VPRK`` carries them in its velocity form only, up to four stages
    (``VPRK._carries_misses``).  The nonholonomic mode (``NonholonomicVPRK``, the
    nonholonomic ``GroupVPRK``) corrects its stage values and impulses the same way: the CVT
    gearbox ``lobatto(3)`` at h = 0.1 5.31 -> 4.78 updates per step (the step 0.92x), the
    quartic system 5.67 -> 5.10 (0.95x), the unicycle on
    SE(2) 0.87x (Cayley) and 0.88x (Exp), chaotic ensembles of 1024-4096 members
    ``lobatto(3)`` h = 0.2 7.36 -> 7.13 (0.97-0.98x), h = 0.1 5.77 -> 5.12 (0.93x).  The
    unconstrained group mode corrects its chart-mapped stage values (``O(h^3)`` -> ``O(h^4)``
    -> ``O(h^5)`` for Gauss(2)): the heavy top at h = 0.05 4.15 -> 3.38 updates (Exp) and
    4.51 -> 3.73 (Cayley), the step 0.88x, 1024-member ensembles 0.93-0.95x; ``Rn(3)`` 2.99 ->
    2.46.  The holonomic mode carries none: on the planar Cartesian pendulum (2000 steps)
    RATTLE took 3.00 instead of 3.61 updates per step at h = 0.01 but as long a step
    (``benchmarks/ab_versions.py``, 1.20 against 1.21 us), 5.62 against 5.71 at h = 0.05, and
    ``HolonomicVPRK.lobatto(4)`` 6.09 against 6.01 at h = 0.05."""
    last = jnp.where(warm >= 2, misses[0], 0.0)
    trend = jnp.where(warm >= 3, misses[0] - misses[1], 0.0)
    return X0 + (last + trend).astype(X0.dtype)


def missed(misses, X, X0):
    """The misses for the next step: this step's ``X - X0`` (root minus uncorrected predictor;
    not differentiated) and the last one."""
    return jnp.stack([jax.lax.stop_gradient(X - X0), misses[0]])


class Misses(eqx.Module):
    """The predictor's misses of the last two steps on the leading unknowns of a stage solve
    (``values``: one ``(2, ...)`` array per corrected unknown, ``()`` where the method carries
    none) and the steps taken, at most 3 (``warm``): the record :func:`corrected` reads and
    :func:`missed` writes, in every state that carries it."""

    values: tuple
    warm: Float[Array, ""]

    @classmethod
    def zeros(cls, shapes, dtype) -> "Misses":
        """A record for unknowns of ``shapes`` (none: an empty record, which corrects and
        records nothing)."""
        return cls(tuple(jnp.zeros((2,) + tuple(s), dtype) for s in shapes),
                   jnp.zeros((), dtype))

    def correct(self, X0: tuple) -> tuple:
        """The warm start ``X0`` (a tuple of unknowns) with its leading unknowns corrected."""
        k = len(self.values)
        return tuple(corrected(x, m, self.warm)
                     for x, m in zip(X0[:k], self.values)) + tuple(X0[k:])

    def after(self, X: tuple, X0: Optional[tuple]) -> "Misses":
        """The record after a step from the uncorrected warm start ``X0`` to the root ``X``;
        ``X0=None`` (a step whose start was no prediction: a retraced step) restarts it, with
        nothing corrected until it warms up again."""
        if not self.values:
            return self
        if X0 is None:
            return Misses(tuple(jnp.zeros_like(m) for m in self.values),
                          jnp.zeros_like(self.warm))
        return Misses(tuple(missed(m, x, x0) for m, x, x0 in zip(self.values, X, X0)),
                      jnp.minimum(self.warm + 1.0, 3.0))


def through_the_node(pair: tb.PartitionedTableau, dtype):
    """``(s, s + 1)`` matrix: the polynomial through the previous step's stage values (at
    ``c_i``) and its end node's value (at 1), at this step's stages ``1 + c_i``; ``None``
    when a stage lies on a node (Lobatto, Radau) or nodes repeat."""
    c = np.asarray(pair.q.c, float)
    if len(set(pair.q.c_)) < pair.q.stages or not (c[0] > 0.0 and c[-1] < 1.0):
        return None
    return jnp.asarray(lagrange_extrapolation_matrix(np.append(c, 1.0), 1.0 + c), dtype)


def extrapolate(pair: tb.PartitionedTableau, values, extrap, node=None):
    """The previous step's stage values (``s × d``) at this step's stages: by ``extrap``
    (:func:`extrapolation`), or, given ``node`` (a function returning the value at the
    previous step's end) and stages inside the step (:func:`through_the_node`), by the
    polynomial through that node value as well.

    The stage values have stage order ``s`` and the node values order ``2s``: the polynomial
    of degree ``s`` through both extrapolates with error ``O(h^{s+1})`` instead of ``O(h^s)``
    (measured slopes, Gauss(2) and Gauss(3), against the stage values alone: 2.96/2.00 and
    3.99/2.96 on the double pendulum's velocities, 3.00/2.00 and 4.01/3.01 on Kepler's
    forces), for one evaluation at the node per step.  Updates per step on the chaotic
    double pendulum (16 members to T = 1e3): 4.82 -> 4.23 (Gauss(4), h = 0.0175),
    4.58 -> 3.94 (Gauss(3), h = 0.01), 5.16 -> 4.42 (Gauss(2), h = 0.01); Kepler (e = 0.5)
    2.52 -> 2.19 (Gauss(2), h = 0.01), 3.42 -> 2.78 (Gauss(3), h = 0.05)."""
    E = None if node is None else through_the_node(pair, values.dtype)
    if E is None:
        return mm(extrap, values)
    return mm(E, jnp.concatenate([values, node()[None, :]]))


def free_group_predictor(pair: tb.PartitionedTableau, state: PRKState, h,
                         group: AbstractLieGroup, retraction: AbstractRetraction):
    """The unknowns ``H^i`` of an unconstrained group step, predicted in this step's chart.

    ``H^i`` is the derivative of the chart coordinate ``Ξ(t)`` centred at the step's start,
    ``V^i = d^Lτ_{Ξ^i} H^i`` the body velocity: the previous step's ``H`` belong to the
    chart at ``g_{k-1}`` and differ from this step's by ``O(h)`` on a non-commutative group.
    The state keeps the previous stage body velocities ``V^i`` instead (:func:`next_state`);
    they are extrapolated -- chart-free, through the node velocity ``ξ_k`` as well where the
    stages lie inside the step (:func:`extrapolate`) -- and mapped into the chart at ``g_k``
    by ``H^i = d^Lτ^{-1}_{Ξ^i} V^i`` with ``Ξ = h a V`` (a second pass with ``Ξ = h a H``
    changed no iteration count).  Updates per step on the heavy top (h = 0.05, Exp):
    Gauss(2) 4.85 -> 4.00, Gauss(3) 5.00 -> 3.94; Cayley Gauss(2) 5.08 -> 4.30."""
    dtype = state.p.dtype
    Vp = extrapolate(pair, state.stages, extrapolation(pair, dtype), lambda: state.v)
    if retraction.flat(group):
        return Vp
    Xi = h * mm(jnp.asarray(pair.q.a, dtype), Vp)
    return jax.vmap(lambda x, y: retraction.dtau_inv(group, x) @ y)(Xi, Vp)


def initial_state(pair: tb.PartitionedTableau, t0, q0, p0, v0, lam0, mode: str = "free"
                  ) -> PRKState:
    """The state at ``t0``: every stage value starts at the initial velocity and multiplier;
    the nonholonomic and the unconstrained (``"free"``) ``mode`` carry the predictor's misses
    (:func:`corrected`)."""
    s = pair.q.stages
    shapes = {"nonholonomic": [(s,) + v0.shape, (s - 1,) + lam0.shape],
              "free": [(s,) + v0.shape]}.get(mode, [])
    return PRKState(t=t0, q=q0, p=p0, v=v0, lam=lam0,
                    stages=jnp.broadcast_to(v0, (s,) + v0.shape),
                    lams=jnp.broadcast_to(lam0, (s,) + lam0.shape),
                    misses=Misses.zeros(shapes, v0.dtype))


def next_state(state: PRKState, mode: str, X, out: StepOutput, h, v_free=None, X0=None
               ) -> PRKState:
    """The state after a converged step: the multipliers from the impulses, the node values
    from the last residual evaluation; where the state carries the predictor's misses, this
    step's against the uncorrected warm start ``X0`` (:meth:`Misses.after`)."""
    H, mus = X[0], X[1]
    misses = state.misses.after(X, X0)
    if mode == "nonholonomic":
        lams = jnp.concatenate([state.lam[None, :], mus / h])
    elif mode == "holonomic":
        lams = mus / h
    else:
        lams = state.lams
    v1 = v_free if out.v is None else out.v
    # free: the stage body velocities, whatever the chart (free_group_predictor)
    stages = H if out.body is None else out.body
    return PRKState(t=state.t + h, q=out.q, p=out.p, v=v1, lam=lams[-1], stages=stages,
                    lams=lams, misses=misses)
