"""fli-diagnose: the runs' chains read and combined (``chains``), ArviZ's convergence and the
field's (``convergence``, ``fields``), the sampler's health (``sampler``), the verdicts
(``checks``), figures and the report (``figures``, ``report``), and the command's run (``run``)."""

from fli.infer.diagnose.run import diagnose_chains, run_diagnose  # noqa: F401
