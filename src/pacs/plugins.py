"""Plug-ins named ``"package.module:name"``: a user's reward function, or a user's algorithm (its
configuration class, `pacs.config.algorithms.plugin_section`)."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable

FUNCTION_SPEC_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
PYTHON_TOOL = "python"
"""`rollout.tools` naming the built-in sandboxed Python tool (`pacs.rollout.tools`) rather than a
user's tool ``"package.module:function"``."""


def check_function_spec(spec: object, kind: str = "function") -> str:
    """``spec`` if it is written ``"package.module:function"``; ValueError otherwise (`kind`: what
    the path names, for the message)."""
    if not isinstance(spec, str) or not FUNCTION_SPEC_PATTERN.match(spec):
        raise ValueError(f"{kind.capitalize()} {spec!r} must be written 'package.module:{kind}'")
    return spec


def _import_module(module_name: str):
    """Import `module_name` from `sys.path`, else from the working directory, as `python -m` finds
    it (the working directory is then appended to `sys.path`, so worker servers, which start with
    this process's `sys.path`, find it too)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        working_dir = os.getcwd()
        if error.name != module_name.split(".")[0] or {working_dir, ""} & set(sys.path):
            raise
        sys.path.append(working_dir)
        try:
            return importlib.import_module(module_name)
        except ImportError:
            sys.path.remove(working_dir)
            raise


def compile_error_text(error: SyntaxError) -> str:
    """Where and why a module does not compile, in one line: "my_reward.py, line 3: SyntaxError: expected ':'"."""
    where = f"{error.filename}, line {error.lineno}" if error.lineno is not None else str(error.filename)
    return f"{where}: {type(error).__name__}: {error.msg}"


def import_function(spec: str, kind: str = "function") -> Callable:
    """The callable named ``"package.module:function"``; ValueError saying what is wrong otherwise
    (`kind`: what the path names, a function or a class, for the messages)."""
    module_name, function_name = check_function_spec(spec, kind).split(":")
    try:
        module = _import_module(module_name)
    except ImportError as error:
        raise ValueError(f"Cannot import module {module_name!r} of {kind} {spec!r}: {error}") from error
    except SyntaxError as error:  # IndentationError and TabError too: a module (its own or one it imports) does not compile
        raise ValueError(f"Cannot import module {module_name!r} of {kind} {spec!r}: {compile_error_text(error)}") from None
    if not hasattr(module, function_name):
        available = sorted(name for name, value in vars(module).items() if callable(value) and not name.startswith("_"))
        raise ValueError(f"Module {module_name!r} has no attribute {function_name!r}; its callables: {available}")
    function = getattr(module, function_name)
    if not callable(function):
        raise ValueError(f"{spec!r} is not callable (it is a {type(function).__name__})")
    return function
