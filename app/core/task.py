"""Celery's ``shared_task``, typed: Celery ships no type information, so its decorator
would leave each task untyped. The task is still Celery's own object; this only tells the
type checker it keeps the function's signature (and has the task's ``name``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar, cast

from celery import shared_task

P = ParamSpec("P")
R_co = TypeVar("R_co", covariant=True)
R = TypeVar("R")


class Task(Protocol[P, R_co]):
    """What the control plane uses of a Celery task: call it in process, or its name."""

    name: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...


def task(**options: Any) -> Callable[[Callable[P, R]], Task[P, R]]:
    """``@shared_task(**options)``."""
    return cast(Callable[[Callable[P, R]], Task[P, R]], shared_task(**options))
