"""The Lie-group interface and its abelian member R^n."""

import jax
import jax.numpy as jnp
import numpy as np

import vijax as vj


def test_rn_group_axioms_and_retraction():
    G = vj.lie.Rn(3)
    rng = np.random.default_rng(0)
    g, h, k = (jnp.asarray(rng.normal(size=3)) for _ in range(3))
    np.testing.assert_allclose(G.compose(G.compose(g, h), k), G.compose(g, G.compose(h, k)))
    np.testing.assert_allclose(G.compose(g, G.inverse(g)), G.identity(g.dtype))
    np.testing.assert_allclose(G.log(G.exp(h)), h)
    np.testing.assert_allclose(G.tau(-h), G.inverse(G.tau(h)))   # tau(-xi) = tau(xi)^{-1}
    np.testing.assert_allclose(G.retract(g, h), g + h)
    # dtau is the left-trivialised tangent of tau: d/de tau(xi + e eta) = tau(xi) dtau(xi) eta
    eta = jnp.asarray(rng.normal(size=3))
    deriv = jax.jvp(G.tau, (h,), (eta,))[1]
    np.testing.assert_allclose(deriv, G.dtau(h) @ eta)
    np.testing.assert_allclose(G.dtau_inv(h) @ G.dtau(h), np.eye(3))
    # abelian: ad = 0, Ad = I, ad* = 0
    assert float(jnp.max(jnp.abs(G.ad(h)))) == 0.0
    np.testing.assert_allclose(G.Ad(g), np.eye(3))
    assert float(jnp.max(jnp.abs(G.ad_star(h, eta)))) == 0.0


def test_systems_live_on_rn_by_default():
    q = jnp.array([0.1, 0.2])
    G = vj.systems.Kepler().group(q)
    assert isinstance(G, vj.lie.Rn) and G.dim == 2
