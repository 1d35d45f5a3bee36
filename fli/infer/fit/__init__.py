"""MAP fits with Optax (``optimize``) and ``fli-map``'s run (``map``): the joint MAP of (theta, s),
its Laplace errors (``laplace``, on ``hvp``'s Hessian-vector products), the low-rank curvature of
the data term (``lowrank``), recovery metrics against a truth (``metrics``) and figures (``figures``)."""

from fli.infer.fit.map import Estimator, fit_map, load_map_field  # noqa: F401
