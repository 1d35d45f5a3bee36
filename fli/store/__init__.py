"""What fli keeps on disk and how it is trusted: sharded zarr arrays and the observation and mock
formats (``io``, ``observation``), content fingerprints (``fingerprint``), the run manifest
``fli-run.json`` (``manifest``), and atomic writes and barriers (``files``): nothing
half-written looks complete, on any number of processes."""

from fli.store.io import Mock, Observation, load_mock, load_observation, write_observation  # noqa: F401
