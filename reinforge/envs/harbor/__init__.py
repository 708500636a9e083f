"""Harbor tasks as environments: reading task directories (`task.py`), the sandbox each
episode gets and the tools that act in it (`sandbox.py`), the scripted agents
(`agents.py`), grading out of the agent's reach (`verify.py`, `grading.py`), the
environment that ties them together (`environment.py`), and what `reinforge audit` plays
against a grader and reads from a run (`exploits.py`, `hacks.py`).
"""
