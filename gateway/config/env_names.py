"""The `WARMGATE_*` environment variables that are not gateway settings: the one list of them.

`gateway.config.settings.Settings` refuses any other `WARMGATE_<NAME>` whose first part names
no setting (`contracts.settings_sources.check_env`), so a misspelt `WARMGATE_HELTH__INTERVAL_S`
stops start-up instead of leaving `health.interval_s` at its default. A new variable read
anywhere else in warmgate goes here, with who reads it (tests/unit/test_env_names.py checks
that every such name in the repository is a setting or listed here).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# name after `WARMGATE_` -> who reads it
OTHER_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "CONFIG": "the settings' YAML file (gateway.config.settings, tests, bench)",
        "ADMIN_KEY": "the admin CLI's key (gateway.admin.cli)",
        "ADMIN_KEYS": "deploy/compose's admin keys, passed on as WARMGATE_AUTH__ADMIN_KEYS",
        "URL": "the admin CLI's gateway (gateway.admin.cli)",
        "NATIVE": "`python` forces the pure-Python fallbacks (router.accel, tierd.native)",
        "GPU_BACKENDS": "which native GPU backends setup.py builds",
        "CUDA_ARCH": "nvcc's -arch for setup.py",
        "HIP_ARCH": "the HIP target of setup.py",
        "KV_COPY": "tierd's vLLM connector copy path (tierd.connector.copier)",
        "KV_PIN": "tierd's vLLM connector: 0 leaves the arena pageable",
        "ENGINE_PYTHON": "the vLLM venv's interpreter (gateway.launch.models)",
        "MODEL_CACHE": "where tiny test models are built (gateway.launch.models)",
        "MODEL": "deploy/compose's model directory name",
        "MODEL_NAME": "deploy/compose's served model name",
        "MODELS_DIR": "deploy/compose's models volume",
        "PEERS_VENV": "the peer gateways' venv (bench.peers)",
        "UI_SCREENSHOTS": "where the UI browser tests write screenshots",
        "UP_ENGINE": "`warmgate up --engine`",
        "UP_INSTANCES": "`warmgate up --instances`",
        "UP_KV_CACHE_GIB": "`warmgate up --kv-cache-gib`",
        "UP_L1_BYTES": "`warmgate up --l1-bytes`",
        "UP_MODEL": "`warmgate up --model`",
        "UP_NO_TIERD": "`warmgate up --no-tierd`",
        "UP_PROFILE": "`warmgate up --profile`",
        "UP_RUN_DIR": "`warmgate up --run-dir`",
        "UP_START_TIMEOUT": "`warmgate up --start-timeout`",
        "UP_TIME_SCALE": "`warmgate up --time-scale`",
    }
)

# prefix after `WARMGATE_` -> whose settings they are (each checks its own the same way or
# reads them as flag twins)
OTHER_PREFIXES: Mapping[str, str] = MappingProxyType(
    {
        "TIERD__": "tierd's settings (tierd.settings.TierdSettings checks them)",
        "ENGINE__": "the simulated engine's flag twins (sim.engine.config)",
    }
)
