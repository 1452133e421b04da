"""Records for the modules a plain `pyvgpu wrap` imports, without the dataclasses module.

Importing dataclasses (and the inspect, ast, dis and tokenize modules it pulls in) and building each class
with it costs a third of a plain wrap's start (pyvgpu/fastwrap.py; the figures are in docs/measurements.md).
Many wraps start at once, so the classes on that path are made with :func:`record` instead, which does the
part of ``@dataclass`` they use: fields from the class's annotations, in order, with their defaults (or
``field(default_factory=...)``); ``__init__`` (calling ``__post_init__`` when the class has one),
``__repr__`` and ``__eq__`` (same class, equal fields); with ``frozen``, assignment raises
dataclasses.FrozenInstanceError and instances hash by their fields, as a frozen dataclass's do. Inherited
fields are not collected: a subclass adds methods only. Modules off that path keep ``@dataclass``.
"""

from __future__ import annotations

from collections.abc import Callable

_MISSING = object()


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], object]) -> object:
    """A field whose default is made anew for each instance (dataclasses.field's default_factory)."""
    return _Factory(default_factory)


def _frozen_setattr(self: object, name: str, value: object) -> None:
    import dataclasses  # only here: what a frozen dataclass raises

    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: object, name: str) -> None:
    import dataclasses

    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def record(cls: type | None = None, *, frozen: bool = False):
    """``@record`` or ``@record(frozen=True)``: the class with the methods described above."""

    def make(cls: type) -> type:
        names = tuple(cls.__dict__.get("__annotations__", {}))
        defaults = {}
        for n in names:
            d = cls.__dict__.get(n, _MISSING)
            if d is not _MISSING:
                defaults[n] = d
                if isinstance(d, _Factory):
                    delattr(cls, n)
        required = [n for n in names if n not in defaults]
        if any(names.index(r) > names.index(d) for r in required for d in defaults):
            raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
        post_init = getattr(cls, "__post_init__", None)
        set_ = object.__setattr__

        def __init__(self, *args: object, **kwargs: object) -> None:
            if len(args) > len(names):
                raise TypeError(f"{cls.__name__}() takes {len(names)} positional arguments, {len(args)} given")
            for n, v in zip(names, args, strict=False):  # the rest come by keyword or default
                if n in kwargs:
                    raise TypeError(f"{cls.__name__}() got multiple values for argument {n!r}")
                set_(self, n, v)
            for n in names[len(args):]:
                if n in kwargs:
                    v = kwargs.pop(n)
                elif n in defaults:
                    d = defaults[n]
                    v = d.make() if isinstance(d, _Factory) else d
                else:
                    raise TypeError(f"{cls.__name__}() missing required argument {n!r}")
                set_(self, n, v)
            if kwargs:
                raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {sorted(kwargs)[0]!r}")
            if post_init is not None:
                self.__post_init__()

        def __repr__(self) -> str:
            return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

        def __eq__(self, other: object) -> bool:
            if other.__class__ is not self.__class__:
                return NotImplemented
            return all(getattr(self, n) == getattr(other, n) for n in names)

        for name, method in (("__init__", __init__), ("__repr__", __repr__), ("__eq__", __eq__)):
            if name not in cls.__dict__:  # as @dataclass: what the class defines itself stays
                setattr(cls, name, method)
        if frozen:
            cls.__setattr__ = _frozen_setattr
            cls.__delattr__ = _frozen_delattr
        if cls.__dict__.get("__hash__") is None:  # none of its own (defining __eq__ sets it to None)
            # frozen: hashed by its fields; mutable and compared by value: unhashable, as a dataclass
            cls.__hash__ = (lambda self: hash(tuple(getattr(self, n) for n in names))) if frozen else None
        return cls

    return make if cls is None else make(cls)
