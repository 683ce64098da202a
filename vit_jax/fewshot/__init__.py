"""Few-shot linear evaluation (paper Sec. 4.1): `linear` (solver, sampling), `evaluator`
(frozen features of a model, used by training and the `python -m vit_jax.fewshot` CLI)."""
