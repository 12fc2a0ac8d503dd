"""PyTorch's device-mismatch RuntimeError, enriched where it propagates: gpuguard's grouped report (named
parameters, inputs, the first layer that disagrees, cause, fix) attached with ``add_note``.

Zero cost on the happy path: nothing runs until an exception reaches ``sys.excepthook`` (or
``threading.excepthook``, see ``excepthooks``); only then are the traceback's frames read. The outermost ``nn.Module.forward``
frame holds the model the job called and its inputs, the innermost one the layer where torch stopped. The
exception keeps its type and traceback; the report is printed once per process (with the traceback it is
attached to).
"""

from __future__ import annotations

import inspect
import threading
import types
from typing import Any, Optional

from ..errors import add_note

MARKERS = ("Expected all tensors to be on the same device", "is not on the expected device")
NOTE_PREFIX = "gpuguard: "
_printed = False
_lock = threading.Lock()


def is_device_mismatch(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in MARKERS)


def _forward_frames(tb: Optional[types.TracebackType]) -> list[types.FrameType]:
    from torch import nn

    frames = []
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "forward" and isinstance(frame.f_locals.get("self"), nn.Module):
            frames.append(frame)
        tb = tb.tb_next
    return frames


def _inputs(frame: types.FrameType) -> list[Any]:
    code = frame.f_code
    names = list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])[1:]
    values = [frame.f_locals.get(n) for n in names]
    if code.co_flags & inspect.CO_VARARGS:
        values.extend(frame.f_locals.get(code.co_varnames[code.co_argcount + code.co_kwonlyargcount], ()))
    return values


def report(exc: BaseException) -> Optional[str]:
    """gpuguard's report on a device-mismatch exception, from its traceback; None when there is nothing to say."""
    if not is_device_mismatch(exc):
        return None
    from ..errors import DeviceMismatchError
    from ..tensors.tensor_devices import assert_same_device

    frames = _forward_frames(exc.__traceback__)
    if not frames:
        return None
    outer, inner = frames[0], frames[-1]
    model, layer = outer.f_locals["self"], inner.f_locals["self"]
    try:
        assert_same_device(model, *_inputs(outer))
    except DeviceMismatchError as found:
        text = str(found)
    else:  # the model and its inputs agree: the disagreement is inside a layer (a tensor made in forward)
        try:
            assert_same_device(layer, *_inputs(inner))
        except DeviceMismatchError as found:
            text = str(found)
        else:
            return None
    name = next((n for n, m in model.named_modules() if m is layer), None)
    where = (f"torch stopped in layer '{name}' ({type(layer).__name__})" if name else
             f"torch stopped in {type(layer).__name__}")
    return f"{NOTE_PREFIX}{where} of {type(model).__name__}.\n{text}"


def enrich(exc: BaseException) -> bool:
    """Attaches the report to ``exc`` once; True when it did (or had)."""
    notes = getattr(exc, "__notes__", None) or []
    if any(isinstance(n, str) and n.startswith(NOTE_PREFIX) for n in notes):
        return True
    try:
        text = report(exc)
    except Exception:  # noqa: BLE001 - a failing report must never replace the user's exception
        return False
    if text is None:
        return False
    add_note(exc, text)
    return True


def first_time() -> bool:
    """True once per process: the report is attached to the first device mismatch that reaches a hook."""
    global _printed
    with _lock:
        first, _printed = not _printed, True
    return first
