"""Each domain has one root exception, as ConfError is the confserver's: a service catches the root
as a one-line exit, and anything else (a ValueError among them) is a bug with a traceback."""

import importlib
import inspect
import pkgutil

import pytest

import ramen.archive
import ramen.transport
from ramen.archive.errors import ArchiveError
from ramen.transport.errors import TransportError


def _exceptions_defined_in(package) -> list[type]:
    found = []
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        found += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, Exception) and obj.__module__ == module.__name__]
    return found


@pytest.mark.parametrize("package, root", [(ramen.transport, TransportError), (ramen.archive, ArchiveError)])
def test_every_error_of_a_domain_is_under_its_root_and_none_is_a_value_error(package, root):
    errors = _exceptions_defined_in(package)
    assert len(errors) > 1  # the root and the errors under it
    assert [e.__name__ for e in errors if not issubclass(e, root)] == []
    assert [e.__name__ for e in errors if issubclass(e, ValueError)] == []
