"""One prepared check on a GPU (``python -m benchmarks.gpu_check``, see `__main__`): its rows
(`rows`), their measurements (`measure`, `correctness`, `profile`, `timm_rows`,
`pipeline_rows`), the report (`report`) and the CPU-side evidence (`hlo_evidence`)."""
