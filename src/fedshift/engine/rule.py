"""Client steps that are update rules, not losses (issue 23 item 3).

Most local objectives are a loss the engine's SGD descends. Some algorithm boxes are
written as update rules instead: pFedMe and CGPFL solve an inner problem per minibatch and
then move the local model towards its solution, PerInvFL takes Adam steps, so a loss would
have to be a surrogate whose one SGD step lands where the box says. An update rule states
the box directly: ``step(params, buffers, extras, x, y, w) -> (new params, loss)`` for one
client's minibatch (vmapped over the cohort like a loss), the new values of every trained
entry and the number to log. The engine writes the new values in place of the old ones; the
run's SGD settings (lr, momentum, weight decay) are not applied: a rule uses what its box
names. The new values are written entry after entry, so each must be a fresh tensor (or the
entry itself, unchanged), never another entry of the state. The rest is the loss's
machinery unchanged: the client's own minibatch schedule, finished clients dropped from the
batch, ``execution`` (batched or client after client), ``compile``, stop requests between
steps, nested trees.
"""

from __future__ import annotations

from collections.abc import Callable

MARK = "update_rule"
BATCHED = "update_rule_batched"


def update_rule(step: Callable, batched: bool = False) -> Callable:
    """Mark ``step`` as an update rule (see the module docstring); give it to ``ctx.train``
    where a loss would go. ``batched=True`` (``batched_update_rule``): ``step`` takes the
    whole cohort's stacked tensors (a leading client axis on every argument, shared extras
    included) and returns every client's new values and loss [C]; the engine then calls it
    without ``vmap``, as it does a gradient written with ``gradient_by(batched=True)``."""
    setattr(step, MARK, True)
    setattr(step, BATCHED, batched)
    return step


def batched_update_rule(step: Callable) -> Callable:
    """``update_rule(step, batched=True)``: a rule written for the whole cohort at once."""
    return update_rule(step, batched=True)


def is_update_rule(fn: Callable) -> bool:
    return bool(getattr(fn, MARK, False))


def is_batched_rule(fn: Callable) -> bool:
    return bool(getattr(fn, BATCHED, False))
