"""Schedule tuning: hardware-centric spaces, parallel measurement, on-disk records.

    from treadle.tune import gemm_space, tune_gemm
    cfg = tune_gemm(name, inputs, pattern, level=1)   # served from records when present
"""
from treadle.tune.exhaustive import tune_gemm
from treadle.tune.space import check_gemm_config, gemm_space

__all__ = ["check_gemm_config", "gemm_space", "tune_gemm"]
