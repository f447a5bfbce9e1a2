"""The smallest possible module system: a tree of ops that own plain tensors.

``torch.nn.Module`` brings hooks, parameters, training state and buffers that an
inference engine never uses. Upstream mini-sglang replaces it with ``BaseOP``: every
public tensor attribute is a weight, every public ``BaseOP`` attribute a child, and the
state-dict names follow the attribute path (``model.layers.0.self_attn.qkv_proj.weight``)
so they line up with the checkpoint after merging. Mirrors upstream ``minisgl.layers.base``.
"""

from __future__ import annotations

from typing import Any, Dict, Generic, Iterator, List, TypeVar

import torch

StateDict = Dict[str, torch.Tensor]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class BaseOP:
    """An op whose public tensor attributes are its weights and public BaseOP attributes its
    children. Private attributes (``_name``) are neither: caches, communicators, flags."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def _children(self) -> Iterator[tuple[str, torch.Tensor | "BaseOP"]]:
        for name, value in self.__dict__.items():
            if not name.startswith("_") and isinstance(value, (torch.Tensor, BaseOP)):
                yield name, value

    def state_dict(self, *, prefix: str = "", result: StateDict | None = None) -> StateDict:
        """Every weight under this op, keyed by its dotted path."""
        result = {} if result is None else result
        for name, value in self._children():
            if isinstance(value, torch.Tensor):
                result[_join(prefix, name)] = value
            else:
                value.state_dict(prefix=_join(prefix, name), result=result)
        return result

    def load_state_dict(
        self, state_dict: StateDict, *, prefix: str = "", _root: bool = True
    ) -> None:
        """Replace every weight by the tensor of the same name, consuming ``state_dict``.

        Raises:
            KeyError: a weight is missing from ``state_dict``.
            ValueError: a shape or dtype differs, or keys are left over at the root.
        """
        for name, value in self._children():
            key = _join(prefix, name)
            if isinstance(value, BaseOP):
                value.load_state_dict(state_dict, prefix=key, _root=False)
                continue
            if key not in state_dict:
                raise KeyError(f"weight {key!r} is missing from the checkpoint")
            item = state_dict.pop(key)
            if item.shape != value.shape or item.dtype != value.dtype:
                raise ValueError(
                    f"weight {key!r}: expected {tuple(value.shape)} {value.dtype}, "
                    f"got {tuple(item.shape)} {item.dtype}"
                )
            setattr(self, name, item)
        if _root and state_dict:
            raise ValueError(f"unexpected weights in the checkpoint: {sorted(state_dict)[:8]}")


class StateLessOP(BaseOP):
    """An op with no weights of its own (activation, rotary embedding, attention)."""

    def _children(self) -> Iterator[tuple[str, torch.Tensor | BaseOP]]:
        return iter(())


T = TypeVar("T", bound=BaseOP)


class OPList(BaseOP, Generic[T]):
    """A list of ops whose weights are named by index: ``layers.0.…``, ``layers.1.…``."""

    def __init__(self, ops: List[T]) -> None:
        self.op_list = ops

    def _children(self) -> Iterator[tuple[str, torch.Tensor | BaseOP]]:
        for i, op in enumerate(self.op_list):
            yield str(i), op

    def __iter__(self) -> Iterator[T]:
        return iter(self.op_list)

    def __len__(self) -> int:
        return len(self.op_list)

    def __getitem__(self, i: int) -> T:
        return self.op_list[i]
