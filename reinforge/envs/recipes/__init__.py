"""Recipes: what a run adds to any environment from its `env` config section (`config.py`),
each a `reinforge.envs.recipe.Recipe` or a reward term: reasoning levels with token budgets
(`levels.py`), harness augmentation (`augment.py`) with its sub-agent tool
(`subagent.py`), a loop penalty (`loops.py`), an LLM judge (`judge.py`) and a conciseness
bonus (`conciseness.py`). docs/recipes.md.
"""
