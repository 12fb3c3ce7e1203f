"""The order the two xdist workers take the tests in: those marked ``slow(seconds)`` first, the
longest first, then the rest in collection order. The many short tests then fill the end of the
run, and neither worker idles while the other finishes a long one. ``-m "not slow"`` runs the
quick set."""

from __future__ import annotations


def _seconds(item) -> float:
    mark = item.get_closest_marker("slow")
    return mark.args[0] if mark is not None else 0.0


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -_seconds(item))   # stable: collection order within equal costs
