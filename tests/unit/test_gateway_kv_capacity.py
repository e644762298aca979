"""Reading an instance's HBM KV capacity from vLLM's `vllm:cache_config_info` (the vLLM
engine kind's `kv_capacity`)."""

from __future__ import annotations

from gateway.engine.vllm import VLLM

parse_kv_capacity = VLLM.kv_capacity

VLLM_PAGE = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27317",\
prefix_caching_hash_algo="sha256_cbor"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-32B"} 0.0
"""


def test_blocks_times_block_size() -> None:
    assert parse_kv_capacity(VLLM_PAGE) == 27317 * 16


def test_unknown_until_the_engine_says() -> None:
    assert parse_kv_capacity("vllm:num_requests_running 0.0\n") is None
    before_profiling = VLLM_PAGE.replace('num_gpu_blocks="27317"', 'num_gpu_blocks="None"')
    assert parse_kv_capacity(before_profiling) is None
    assert parse_kv_capacity(VLLM_PAGE.replace('block_size="16",', "")) is None
    assert parse_kv_capacity(VLLM_PAGE.replace('"27317"', '"0"')) is None
