"""The config schema: typed, validated dataclasses that the entry points build once from Hydra's
composition (``to_config``); nothing below them sees a DictConfig.

``schema`` holds the physics and run sections and the top ``Config``, ``inference`` the
inference's sections, ``checks`` the error type and the checks they share.
"""

from fli.config.checks import ConfigError  # noqa: F401
from fli.config.inference import (  # noqa: F401
    ESTIMATORS,
    INIT_REDRAWS,
    INIT_THETAS,
    INTEGRATORS,
    KERNELS,
    MCLMC_LENGTHS,
    MUSE_SPREADS,
    PARAM_NAMES,
    PRECONDITIONERS,
    SAMPLERS,
    DiagnoseConfig,
    InferenceConfig,
    MapConfig,
    MuseConfig,
    ParamPrior,
    PriorConfig,
)
from fli.config.schema import (  # noqa: F401
    COSMOLOGY_PARAMETERS,
    DIAGNOSE_KEYS,
    Config,
    CosmologyConfig,
    DistributedConfig,
    LensingConfig,
    NzBinConfig,
    SimulationConfig,
    SurveyConfig,
    register_configs,
    to_config,
)
