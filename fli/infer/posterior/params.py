"""The derived parameters every output reports beside the sampled ones, defined once.

``Omega_m = Omega_c + Omega_b`` and ``S8 = sigma8 sqrt(Omega_m / 0.3)``. :func:`with_derived`
works on Python floats, numpy arrays and traced jax arrays alike (jax values through
``jnp.sqrt``, the others through numpy's, so each keeps its own precision).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

DERIVED = ("Omega_m", "S8")
S8_OMEGA_M_PIVOT = 0.3  # S8's normalisation: sigma8 (Omega_m / 0.3)^0.5


def omega_m(omega_c, omega_b):
    return omega_c + omega_b


def s8(sigma8, om):
    """``sigma8 sqrt(Omega_m / 0.3)``."""
    sqrt = jnp.sqrt if isinstance(om, jax.Array) else np.sqrt
    return sigma8 * sqrt(om / S8_OMEGA_M_PIVOT)


def with_derived(values: dict, cosmology=None) -> dict:
    """``values`` with ``Omega_m`` and ``S8`` added after them.

    ``values`` maps parameter names to values (floats or arrays); a parameter it lacks is read
    from ``cosmology`` (anything with the parameters as attributes, e.g. the fixed cosmology of
    a run). With no parameter sampled, ``values`` is empty and every one comes from
    ``cosmology``.
    """
    out = dict(values)

    def get(name):
        return out[name] if name in out else getattr(cosmology, name)

    om = omega_m(get("Omega_c"), get("Omega_b"))
    out["Omega_m"] = om
    out["S8"] = s8(get("sigma8"), om)
    return out


def reported_names(sampled) -> list[str]:
    """The sampled parameters' names followed by the derived ones."""
    return [*sampled, *DERIVED]


def names_of_run(config: dict) -> list[str]:
    """The parameters a run reports, from its resolved config: the sampled ones
    (``prior.sample``), then the derived ones."""
    return reported_names((config.get("prior") or {}).get("sample") or [])
