"""Finding environments: by file path, by `module:function`, by installed name, by
`<source>:<name>` for another framework's environments, or a directory of Harbor tasks
(one holding task.toml, or a folder of such directories).

Every route ends at a function returning an `Environment`. Installed packages register
theirs under the entry-point group `reinforge.environments`, the built-ins included, so
a built-in takes the same path as a user's package.

A loader declares its arguments by annotating one parameter with a pydantic model (its
`Args`): `env.args` is validated into it before the loader runs, so a misspelt or
ill-typed argument is one line naming its key, and a default lives on the model's field.
A loader that declares none gets `env.args` as keywords, its own signature the check.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

from reinforge.envs.config import HARNESS_LIMITS, EnvConfig
from reinforge.envs.environment import Environment
from reinforge.errors import ConfigError, UsageError, describe, first_problem
from reinforge.types import Task

GROUP = "reinforge.environments"
TASK_FORMATS = "reinforge.task_formats"
"""Loaders of a directory of tasks, registered as environments are: the API names no
format's code, so harbor/ imports the API and never the reverse."""
SOURCES = "reinforge.env_sources"
"""Other frameworks' environments, named `<source>:<name>`: the source's loader takes the
name first, then `env.args` as any loader does. A source's prefix wins over a module of
the same name, so `verifiers:x` is always verifiers' environment `x`."""
FILE_FUNCTION = "load_environment"


def installed_environments() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_environment(spec: str, /, **kwargs: Any) -> Environment:
    """The environment `spec` names, its loader given `kwargs` (a run's `env.args`)."""
    load = _bound(spec, kwargs)
    try:
        environment = load()
    except UsageError:  # the loader's own line: a source's unknown name, an argument it refuses
        raise
    except (TypeError, ValueError) as error:
        raise UsageError(f"environment {spec!r} rejected its arguments: {error}") from error
    except Exception as error:
        raise UsageError(f"environment {spec!r} failed to load: {describe(error)}") from error
    if not isinstance(environment, Environment):
        raise UsageError(f"{spec!r} returned {type(environment).__name__}, not an Environment")
    return environment


def load_configured(config: EnvConfig) -> Environment:
    """The environment a config section names, changed as the section asks (`apply`: its
    per-turn limits, and the recipes of a run's `env` section): the one place a run's
    settings change an environment."""
    environment = load_environment(config.name, **config.args)
    config.apply(environment)
    return environment


def check_args(config: EnvConfig) -> None:
    """`env.args` against what the environment's loader declares, without loading it: a
    command refuses a mistaken argument before it imports the model stack. A user's .py
    file is not run for this (it would run twice); its arguments are checked as it loads."""
    if not _user_file(config.name):
        _bound(config.name, config.args)


def _bound(spec: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    """The loader of `spec` with `kwargs` bound, validated first where it declares them."""
    factory = _factory(spec)
    declared = declared_args(factory)
    if declared is None:
        return partial(factory, **kwargs)
    parameter, model = declared
    return partial(factory, **{parameter: validated_args(model, kwargs)})


def declared_args(loader: Callable[..., Any]) -> tuple[str, type[BaseModel]] | None:
    """The parameter of `loader` annotated with a pydantic model, and that model: how a
    loader declares its arguments. None for a loader of plain keywords."""
    try:
        signature = inspect.signature(loader, eval_str=True)
    except Exception:  # annotations that do not evaluate (type-checking imports): no model
        return None
    for parameter in signature.parameters.values():
        annotation = parameter.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return parameter.name, annotation
    return None


def validated_args(model: type[BaseModel], args: dict[str, Any]) -> BaseModel:
    """`args` as the loader's `model`; a problem is one line naming its `env.args` key. A
    per-turn limit the model does not take names the `env` key that sets it for every
    environment."""
    for key in args:
        if key in HARNESS_LIMITS and key not in model.model_fields:
            raise ConfigError(f"env.args.{key}", f"moved to env.{key}")
    try:
        return model.model_validate(args)
    except ValidationError as error:
        where, problem = first_problem(error)
        raise ConfigError(f"env.args.{where}".rstrip("."), problem) from error


def _factory(spec: str) -> Callable[..., Any]:
    module_name, _, attribute = spec.partition(":")
    sources = {ep.name: ep for ep in entry_points(group=SOURCES)}
    if attribute and module_name in sources:  # first: its name may be a path (`verifiers:x.py`)
        return partial(sources[module_name].load(), attribute)
    if Path(spec).is_dir():  # a task set, loaded by its format's loader (Harbor's)
        formats = {ep.name: ep for ep in entry_points(group=TASK_FORMATS)}
        return partial(formats["harbor"].load(), spec)
    if _user_file(spec):
        return _from_file(Path(spec))
    if ":" in spec:
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # not found, or the module itself is broken
            raise UsageError(f"cannot import {module_name!r}: {describe(error)}") from error
        return _attribute(module, attribute, spec)
    installed = installed_environments()
    if spec not in installed:
        known = ", ".join(sorted(installed)) or "none"
        raise UsageError(
            f"unknown environment {spec!r}; known: {known} "
            "(or give a path to a .py file, module:function, or a Harbor task directory)"
        )
    return installed[spec].load()


def _user_file(spec: str) -> bool:
    """A spec naming a user's Python file, which loading runs."""
    return spec.endswith(".py") or Path(spec).is_file()


def _from_file(path: Path) -> Callable[..., Any]:
    module = load_user_file(path, "environment", "env")
    return _attribute(module, FILE_FUNCTION, str(path))


def load_user_file(path: Path, what: str, prefix: str) -> ModuleType:
    """A user's Python file as the module `reinforge_user_{prefix}_{stem}`: a missing file,
    or one that raises as it loads, is one line saying where."""
    if not path.is_file():
        raise UsageError(f"no {what} file at {path}")
    name = f"reinforge_user_{prefix}_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # the user's file: say where, not a traceback
        raise UsageError(f"cannot load {what} file {path}: {describe(error)}") from error
    return module


def _attribute(module: Any, attribute: str, spec: str) -> Callable[..., Any]:
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise UsageError(f"{spec}: no function {attribute!r} returning an Environment")
    return factory


def draw_tasks(environment: Environment, n: int, seed: int) -> list[Task]:
    """`environment.tasks(n, seed)`, with a failure reported as the environment's, in one
    line with where it was raised: it is the user's code, not the run, that needs fixing."""
    try:
        return environment.tasks(n, seed=seed)
    except Exception as error:
        raise UsageError(
            f"environment {environment.name!r}: tasks() raised {describe(error)}"
        ) from error
