"""MUSE (Millea & Seljak 2022): parameter estimates and covariances from field-only MAP fits on the
data and on simulations (``estimator``, ``result``), the fits themselves (``field_fit``), the run
inside fli-map (``run``, :data:`MUSE`) and the workers that share it through files (``worker``)."""

from fli.infer.muse.run import MUSE  # noqa: F401
