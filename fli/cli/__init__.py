"""Thin Hydra entry points: compose and validate the config, set up devices, call the library."""
