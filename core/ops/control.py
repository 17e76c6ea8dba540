"""Control flow (WHILE, IF, CALL_ONCE) and resource variables (VAR_HANDLE, READ_VARIABLE,
ASSIGN_VARIABLE).

These ops need the runtime's services rather than a plain kernel: they call other
subgraphs and keep state across invokes. Their ``execute(inputs, attrs, runtime)``
receives a :class:`litegpu.backend.Runtime`.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ..errors import ExecutionError, ResourceLimitError, Unbound
from .registry import OpDef, TensorSpec, check_inputs, register


def _no_reference(inputs, attrs):
    raise ExecutionError("control-flow ops run through the runtime, not a reference")


def _model_output_specs(node, tensors):
    return [TensorSpec(tensors[o].shape, tensors[o].dtype) for o in node.outputs]


def _truth(value: np.ndarray, what: str) -> bool:
    if value.size != 1:
        raise ExecutionError(f"{what} must hold one element, has shape {list(value.shape)}")
    return bool(value)   # (an array of one element, of any rank, has a truth value)


def _while_attrs(node, tensors) -> dict:
    if len(node.inputs) != len(node.outputs):
        raise ValueError(f"WHILE has {len(node.inputs)} inputs but {len(node.outputs)} outputs")
    return {"cond": node.options.get("cond_subgraph_index", 0), "body": node.options.get("body_subgraph_index", 0)}


def _loop_limit(limit: int) -> ResourceLimitError:
    return ResourceLimitError(f"WHILE ran {limit} iterations without ending "
                              "(raise Limits.max_while_iterations for longer loops)")


def _while(inputs, attrs, runtime):
    loop = runtime.while_loop
    if loop is not None:
        # The session's loop: the same iterations, over its compiled subgraphs' arrays. It
        # leaves the inputs as they are and returns new arrays, so nothing is copied here.
        result = loop(attrs["cond"], attrs["body"], list(inputs), runtime.max_while_iterations, _truth)
        if result is not None:
            return result
        raise _loop_limit(runtime.max_while_iterations)
    values = [np.array(v) for v in inputs]
    for _ in range(runtime.max_while_iterations):
        (cond,) = runtime.call_subgraph(attrs["cond"], values)[:1]
        if not _truth(cond, "WHILE condition"):
            return values
        values = runtime.call_subgraph(attrs["body"], values)  # fresh arrays, safe to keep
    raise _loop_limit(runtime.max_while_iterations)


def _bind_while(inputs, outputs, attrs, runtime):
    bind = runtime.bind_while
    limit = runtime.max_while_iterations
    return None if bind is None else bind(attrs["cond"], attrs["body"], inputs, outputs, limit,
                                          partial(_loop_limit, limit))


def _if_attrs(node, tensors) -> dict:
    check_inputs(node, 1, 1 << 16)
    return {"then": node.options.get("then_subgraph_index", 0), "else": node.options.get("else_subgraph_index", 0)}


def _if(inputs, attrs, runtime):
    branch = attrs["then"] if _truth(inputs[0], "IF condition") else attrs["else"]
    # The session's branch call compiles the branch's constant inputs (its weights) in;
    # without a session it is call_subgraph (see Runtime).
    return runtime.branch(branch, list(inputs[1:]))


def _bind_if(inputs, outputs, attrs, runtime):
    bind = runtime.bind_if
    return None if bind is None else bind(attrs["then"], attrs["else"], inputs, outputs)


def _call_once_attrs(node, tensors) -> dict:
    init = node.options.get("init_subgraph_index", 0)
    # The key of its "done" mark in the resources, made once rather than on every run.
    return {"init": init, "key": ("call_once", init)}


def _call_once(inputs, attrs, runtime):
    key = attrs["key"]
    if key not in runtime.resources:
        runtime.call_subgraph(attrs["init"], [])
        runtime.resources[key] = np.zeros(0)
    return []


def _var_handle_attrs(node, tensors) -> dict:
    return {"key": (node.options.get("container", ""), node.options.get("shared_name", ""))}


# Handle arrays by handle, shared by every model: read-only, so sharing them is safe.
_HANDLES: dict[int, np.ndarray] = {}


def _handle_array(handle: int) -> np.ndarray:
    array = _HANDLES.get(handle)
    if array is None:
        array = _HANDLES[handle] = np.array([handle], np.int32)
        array.flags.writeable = False
    return array


def _handle(resources: dict, key: tuple) -> int:
    """The handle of the variable named ``key``: numbered in order of first use."""
    ids = resources.get("__ids__")
    if ids is None:
        ids = resources["__ids__"] = {}
    handle = ids.get(key)
    if handle is None:
        handle = ids[key] = len(ids)
    return handle


def _var_handle(inputs, attrs, runtime):
    return [_handle_array(_handle(runtime.resources, attrs["key"]))]


def _bind_var_handle(inputs, outputs, attrs, runtime):
    out = outputs[0]
    if out.dtype != np.int32 or out.size != 1:
        return None
    flat, resources, key = out.reshape(-1), runtime.resources, attrs["key"]

    def var_handle() -> None:
        flat[0] = _handle(resources, key)
    return var_handle


# A variable's value is stored read-only and replaced, never written, by ASSIGN_VARIABLE:
# READ_VARIABLE hands out the stored array itself, which no later assignment changes.

def _read_variable(inputs, attrs, runtime):
    return [_variable(runtime.resources, inputs[0].item(0))]


def _variable(resources: dict, handle: int) -> np.ndarray:
    value = resources.get(("var", handle))
    if value is None:
        raise ExecutionError(f"READ_VARIABLE of resource {handle}, which was never assigned")
    return value


def _bind_read_variable(inputs, outputs, attrs, runtime):
    handle, out, resources = inputs[0], outputs[0], runtime.resources
    if handle.size != 1:
        return None

    def read_variable() -> None:
        value = _variable(resources, handle.item(0))
        if value.shape != out.shape or value.dtype != out.dtype:
            raise Unbound
        out[...] = value
    return read_variable


def _bind_outputless(inputs, outputs, attrs, runtime, execute=None):
    """The bound call of an op with no outputs: its ``execute`` on these inputs."""
    return partial(execute, inputs, attrs, runtime)


def _assign_variable(inputs, attrs, runtime):
    value = np.array(inputs[1])
    value.flags.writeable = False
    runtime.resources[("var", inputs[0].item(0))] = value
    return []


def _stateful(name, execute, attrs=None, bind=None):
    register(OpDef(name=name, infer=lambda ins, a: [], reference=_no_reference,
                   attrs=attrs or (lambda n, t: {}), stateful=True, execute=execute, bind=bind,
                   doc=(execute.__doc__ or name)))


_stateful("WHILE", _while, _while_attrs, _bind_while)
_stateful("IF", _if, _if_attrs, _bind_if)
_stateful("CALL_ONCE", _call_once, _call_once_attrs, partial(_bind_outputless, execute=_call_once))
_stateful("VAR_HANDLE", _var_handle, _var_handle_attrs, _bind_var_handle)
_stateful("READ_VARIABLE", _read_variable, lambda n, t: (check_inputs(n, 1), {})[1], _bind_read_variable)
_stateful("ASSIGN_VARIABLE", _assign_variable, lambda n, t: (check_inputs(n, 2), {})[1],
          partial(_bind_outputless, execute=_assign_variable))
