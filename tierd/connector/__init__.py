"""tierd's KV connector for vLLM (v1 connector API), loaded by the engine with

    --kv-transfer-config '{"kv_connector": "TierdConnector",
      "kv_connector_module_path": "tierd.connector.vllm_v1", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"socket": "/run/tierd-0.sock"}}'

(the repository root on the engine's PYTHONPATH). Runs inside the engine's own environment,
so only `vllm_v1` and `worker` import vllm/torch; `layout` and `plan` are plain Python.
"""
