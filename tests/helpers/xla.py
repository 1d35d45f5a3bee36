"""The XLA flags of every test process: tests/conftest.py sets them for pytest's own processes,
and the helpers that start workers pass them on.

LLVM's optimisation is off (``--xla_backend_optimization_level=0``): most of the tests' time is
XLA compiling small programs, not running them. Measured (docs/benchmarks.md, "Test-suite
compile flags"): one posterior gradient compiled in 15 s instead of 22 s and ran 1.5x slower;
the default test set took 457 s of wall time instead of 611 s. The programs are the same, so
results agree with optimised code to round-off, and every comparison a test makes is between
processes that use these flags.

XLA's newer CPU fusion emitters are off too (``--xla_cpu_use_fusion_emitters=false``): the
older emitters compile the same fusions faster. Measured (docs/benchmarks.md, "Test-suite
compile flags"): the SMALL posterior's gradient compiled in 7.5 s instead of 9.7 s at -O0, and
the default test set took 175 s instead of 230 s. The optimised child of
tests/helpers/optimised.py drops both: the PM Wiener test, bound by running its programs, took
113 s there with XLA's defaults and 137 s with the older emitters."""

FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
