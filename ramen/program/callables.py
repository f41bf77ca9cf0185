"""Python callables named by `call = "module:function"`: where their module is imported from,
loading them with errors a user can act on, and a digest of their code for the signature.

The module is looked up on sys.path and in the program's import root: the first directory above
the program file that is not a package (has no __init__.py), as pytest does for test files. So
`examples/net.toml` can say `call = "examples.net:top_talkers"` from any working directory.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)
CODE_DIGEST_BYTES = 16
PACKAGE_MARKER = "__init__.py"


class CallableError(ValueError):
    """The callable cannot be loaded; the message is one line."""


def import_root(program_path: str | Path) -> Path:
    directory = Path(program_path).resolve().parent
    while (directory / PACKAGE_MARKER).exists() and directory.parent != directory:
        directory = directory.parent
    return directory


def load_callable(spec: str, program_path: str | Path | None = None) -> tuple[Callable, str | None]:
    """The callable named by `spec` and a digest of its module's source (None when it has no file).

    The import root stays on sys.path: the callable may import more of its package when it runs.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise CallableError(f"call {spec!r} must be 'module:function'")
    if program_path is not None:
        root = str(import_root(program_path))
        if root not in sys.path:
            log.debug("adding %s to sys.path for %s", root, spec)
            sys.path.append(root)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise CallableError(f"call {spec!r}: cannot import {module_name!r}: {_one_line(e)}") from None
    except Exception as e:  # the module's own code failed; the user needs its message, on one line
        raise CallableError(f"call {spec!r}: importing {module_name!r} failed: {type(e).__name__}: "
                            f"{_one_line(e)}") from None
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise CallableError(f"call {spec!r}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise CallableError(f"call {spec!r} is not callable (it is a {type(target).__name__})")
    return target, _code_digest(module)


def _code_digest(module) -> str | None:
    """Hash of the module's source file: editing the callable changes the function's signature.
    Only this module is hashed, not what it imports."""
    path = getattr(module, "__file__", None)
    if not path or not Path(path).is_file():
        return None
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=CODE_DIGEST_BYTES).hexdigest()


def _one_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
