"""_api.py - lmk's public op functions: the eager entry points of _ops.py behind the torch.compile hand-over.

While torch.compile traces a call on torch tensors, the ctypes path cannot be traced (dynamo cannot trace into
C), so each public function first hands the call to the allocating form of lmk.torch_ops (torch.empty +
torch.ops.lmk.*), whose custom ops run _ops' eager functions. The hand-over sits here, above both modules:
lmk.torch_ops imports _ops, this module imports both, and neither of them imports it, so no two modules of the
package import each other.

The first torch tensor seen imports lmk.torch_ops, which registers torch.ops.lmk.* (torch is imported by
then); the module comes from the import statement, which torch.compile also follows. A torch too old for
torch.library.custom_op keeps the eager path (`import lmk.torch_ops` then says why).
"""
import functools
import inspect

from . import _arrays, _lib, _ops

_torch_ops_error = None


def _torch_forms(obj):
    """lmk.torch_ops while torch.compile traces a call on torch tensors, else None."""
    global _torch_ops_error
    if _torch_ops_error is not None or _arrays.kind_of(obj) != "torch":
        return None
    try:
        from . import torch_ops
    except Exception as e:  # noqa: BLE001 - any failure to register leaves the eager path working
        _torch_ops_error = e
        return None
    return torch_ops if torch_ops.is_compiling() else None


def _public(eager):
    """The public form of _ops' function `eager` (its name, signature and docstring): the check that the loaded
    liblmk has the op, then the hand-over to lmk.torch_ops' function of the same name while torch.compile
    traces a call whose first array is a torch tensor, else the eager call."""
    name = eager.__name__
    first = next(iter(inspect.signature(eager).parameters))

    @functools.wraps(eager)
    def entry(*args, **kwargs):
        _ops.require(name, getattr(_lib, name))
        forms = _torch_forms(args[0] if args else kwargs.get(first))
        if forms is not None:
            return getattr(forms, name)(*args, **kwargs)
        return eager(*args, **kwargs)

    return entry


rope = _public(_ops.rope)
repeat_heads = _public(_ops.repeat_heads)
attn_prologue = _public(_ops.attn_prologue)
causal_conv1d = _public(_ops.causal_conv1d)
gated_delta_rule = _public(_ops.gated_delta_rule)
