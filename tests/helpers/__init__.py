"""Helpers that tests import by name (never from another test file):

- ``physics``: the device layouts every sharded test runs on, pyccl twins of fli cosmologies;
- ``posterior``: the small posterior (``SMALL``) and the short fli-nuts chain (``CHAIN``);
- ``scripts``: a script of scripts/ imported as a module (``load_script``);
- ``processes``: the repository root, free ports, launching N worker processes, the small PM
  forward that both sides of the multi-process comparison run;
- workers started as scripts or modules in their own processes: ``mp_forward_worker``,
  ``mp_posterior_worker``, ``ckpt_worker``, ``hydra_probe`` (its body is pickled by name by
  Hydra's submitit launcher, so it lives in an importable module).
"""
