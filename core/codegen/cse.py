"""Common subexpressions named once: a statement's shared nodes become constants before it.

A formula written once in Python (:mod:`.formulas`) uses its operand several times, and a
fused chain feeds one formula's result into the next, so the tree a statement holds is a
DAG whose shared nodes a renderer would print at every use: XNNPACK's sigmoid over a
fused chain printed 120 KB lines, which the kernel compilers then parse and fold back
(efficientnet_b0's OpenCL source was 3.7 MB). :func:`hoist` gives each shared node a
constant of its own, declared just before the statement, in the order its operands need.

A node is hoisted only where the statement evaluates it whatever happens: a C ternary
evaluates one branch, so a node reached only through one branch of a :class:`~.ir.Select`
(a guarded load, a division) stays where it is; one the condition reads, or both branches,
is evaluated anyway. Hoisting changes no value: the constant holds what each use computed
(the renderers contract nothing: OpenCL's ``FP_CONTRACT OFF``, NVRTC's ``--fmad=false``).
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Callable

from . import ir

_LEAVES = (ir.Lit, ir.Sym, ir.Id)


def _children(e: ir.Expr) -> list[ir.Expr]:
    out = []
    for f in fields(e):
        value = getattr(e, f.name)
        if isinstance(value, ir.Expr):
            out.append(value)
        elif isinstance(value, tuple):
            out.extend(v for v in value if isinstance(v, ir.Expr))
    return out


def _post_order(root: ir.Expr) -> list[ir.Expr]:
    """Each distinct node once, operands before the nodes that use them (no recursion:
    fused chains nest deep)."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(_children(node)) if id(c) not in seen)
    return order


def _uses(order: list[ir.Expr]) -> dict[int, int]:
    uses: dict[int, int] = {}
    for node in order:
        for c in _children(node):
            uses[id(c)] = uses.get(id(c), 0) + 1
    return uses


def _always_evaluated(order: list[ir.Expr]) -> dict[int, frozenset]:
    """Per node, the ids of the nodes evaluating it evaluates in every case."""
    always: dict[int, frozenset] = {}
    for node in order:                      # operands first
        if isinstance(node, ir.Select):
            inner = always[id(node.cond)] | (always[id(node.a)] & always[id(node.b)])
        else:
            inner = frozenset().union(*(always[id(c)] for c in _children(node)))
        always[id(node)] = inner | {id(node)}
    return always


def hoist(e: ir.Expr, let: Callable[[ir.Expr], ir.Sym]) -> ir.Expr:
    """``e`` with each node it uses more than once, and always evaluates, replaced by
    ``let(node)`` (which declares it before the statement and returns its name)."""
    order = _post_order(e)
    if len(order) < 3:
        return e
    uses = _uses(order)
    if not any(n > 1 for n in uses.values()):
        return e
    always = _always_evaluated(order)[id(e)]
    new: dict[int, ir.Expr] = {}
    for node in order:
        changes = {}
        for f in fields(node):
            value = getattr(node, f.name)
            if isinstance(value, ir.Expr) and new[id(value)] is not value:
                changes[f.name] = new[id(value)]
            elif isinstance(value, tuple) and any(isinstance(v, ir.Expr) and new[id(v)] is not v for v in value):
                changes[f.name] = tuple(new[id(v)] if isinstance(v, ir.Expr) else v for v in value)
        out = replace(node, **changes) if changes else node
        if uses.get(id(node), 0) > 1 and id(node) in always and not isinstance(node, _LEAVES):
            out = let(out)
        new[id(node)] = out
    return new[id(e)]
