"""``inspect.signature`` works on every method of our RawBlockDevice, as on LMCache's Rust wheel's,
and names the same parameters, in the same order and of the same kinds, where the wheel has the
method (the comparison is skipped, with the reason, where the wheel is not installed)."""

from __future__ import annotations

import inspect

import pytest

from lmcache_rawblock import RawBlockDevice as Ours

from helpers import rust_module

rust = rust_module()
needs_rust = pytest.mark.skipif(rust is None, reason="lmcache-rust-raw-block-io is not installed "
                                "(pip install lmcache-rust-raw-block-io)")

# Inherited from object, the same on every class; none of them is ours.
_OBJECT_NAMES = set(dir(object))


def _methods(cls: type) -> list[str]:
    """The methods a user calls: public ones, and the context manager protocol."""
    names = []
    for name in dir(cls):
        if name in _OBJECT_NAMES or (name.startswith("_") and name not in ("__enter__", "__exit__")):
            continue
        if callable(inspect.getattr_static(cls, name)):
            names.append(name)
    return sorted(names)


def _shape(sig: inspect.Signature) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in sig.parameters.values()]


OUR_METHODS = _methods(Ours)
TEST_HOOKS = sorted(n for n in vars(Ours) if n.startswith("_inject_"))


def test_the_device_has_methods_to_check():
    # The filter above must not leave the list empty (then every test below would pass vacuously).
    assert {"size_bytes", "close", "pread_into", "batched_write", "__enter__", "__exit__"} <= set(OUR_METHODS)


@pytest.mark.parametrize("name", OUR_METHODS + TEST_HOOKS)
def test_every_method_has_a_signature(name):
    sig = inspect.signature(getattr(Ours, name))
    params = list(sig.parameters.values())
    assert params and params[0].name == "self", (name, sig)


def test_the_constructor_has_a_signature():
    sig = inspect.signature(Ours)
    assert list(sig.parameters)[:2] == ["path", "writable"]


# The methods both devices have (ours adds io_stats_snapshot, write_streams, the context manager...).
SHARED = sorted(set(OUR_METHODS) & set(_methods(rust.RawBlockDevice))) if rust is not None else []


@needs_rust
def test_the_devices_share_methods_to_compare():
    assert {"pread_into", "batched_write", "size_bytes", "close"} <= set(SHARED)


@needs_rust
@pytest.mark.parametrize("name", SHARED)
def test_parameters_match_the_rust_wheel(name):
    assert _shape(inspect.signature(getattr(Ours, name))) == _shape(inspect.signature(getattr(rust.RawBlockDevice, name)))


@needs_rust
def test_the_rust_wheel_has_no_method_we_lack():
    assert not set(_methods(rust.RawBlockDevice)) - set(OUR_METHODS)


@needs_rust
def test_constructor_parameters_extend_the_rust_wheels():
    """Ours takes every parameter of the wheel's constructor, in its order and kind; what it adds
    (max_data_transfer_size, lock) comes after them."""
    theirs = _shape(inspect.signature(rust.RawBlockDevice))
    ours = _shape(inspect.signature(Ours))
    assert ours[:len(theirs)] == theirs
