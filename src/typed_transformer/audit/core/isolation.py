"""The candidate in its own process: ``audit_attention(..., isolate=True)``, and the command line's default for a
function (``--isolate/--no-isolate``).

In process, a candidate shares the audit's interpreter: ``os._exit(0)``, a signal, a segfault or a fork whose parent
exits ends the audit before any report is printed (the command exited 0 with no output), and its code can reach
the memory the reference computes from. Isolated, the candidate is imported and called in a child process forked
from the audit (``multiprocessing``'s ``fork`` start method, POSIX: a child starts in milliseconds, and writes none
of the parent's memory). Each call's tensors cross a pipe by value, pickled, so the child never holds the parent's
tensors; the
reference, the comparison and the verdict stay in the parent. An exit, a signal or a segfault of the child, or a
call past the time limit (the child is killed), stops the audit with one line that names it
(:class:`~.running.CandidateStopped`: exit 1 on the command line). Gradients cross too: the child keeps each call's
graph until the parent's backward sends the output's gradient. torch's global settings the candidate changes are
put back in the child after each call and named in the report, as in process.

Only functions: a module's weights are copied into the reference in the parent, so a module is audited in
process. ``multiprocessing`` and pickle are the library here; what is written is the call protocol (one message
each way per call) and the autograd bridge.
"""

import contextlib
import faulthandler
import importlib
import inspect
import io
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from torch import Tensor

from .conventions import AuditUsageError
from .running import (
    CandidateStopped,
    Skip,
    global_state,
    modified,
    note_change,
    restore_global_state,
    subclass_note,
)

#: how long the child may take to start and import the candidate, in seconds
START_SECONDS = 120.0
#: the graphs of calls the parent may still run backward through, kept in the child (oldest dropped first)
KEPT_GRAPHS = 8


def _target_of(candidate: str | Callable[..., Any]) -> tuple[str, str]:
    """``(module, attribute path)`` the child imports: from ``MODULE:ATTR``, or a function's own module and
    qualified name (it must be importable by that name)."""
    if isinstance(candidate, str):
        name, _, attr = candidate.partition(":")
        if not name or not attr:
            raise AuditUsageError(f"isolate: expected MODULE:ATTR, got {candidate!r}")
        return name, attr
    module: Any = getattr(candidate, "__module__", None)
    qualname: Any = getattr(candidate, "__qualname__", None)
    found: Any = sys.modules.get(module) if isinstance(module, str) else None
    for part in (qualname if isinstance(qualname, str) else "<").split("."):
        found = getattr(found, part, None)
    if found is not candidate or module == "__main__" or not isinstance(module, str) or not isinstance(qualname, str):
        raise AuditUsageError(f"isolate=True needs a candidate its own process can import by name (a function "
                              f"defined at the top of an importable module); {candidate!r} is not one: pass "
                              f"isolate=False, or 'pkg.mod:attr'")
    return module, qualname


# ----------------------------------------------------------------------------------------------------
# The child
# ----------------------------------------------------------------------------------------------------


def _send(connection: Connection, message: Any) -> None:
    """The parent's message to the child (pickled: the child trusts its parent)."""
    connection.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(connection: Connection) -> Any:
    """The parent's message, in the child."""
    return pickle.loads(connection.recv_bytes())


def _answer_parent(connection: Connection, message: Any) -> None:
    """The child's message to the parent, written with ``torch.save``: the parent reads it with
    ``torch.load(weights_only=True)``, which rebuilds tensors, strings, numbers and containers only. Unpickling
    anything else would run the candidate's code in the parent (a ``__reduce__`` is a function call)."""
    buffer = io.BytesIO()
    torch.save(message, buffer)
    connection.send_bytes(buffer.getvalue())


class _Shown:
    """An annotation or default as the child's ``inspect`` printed it (the parent prints the same text)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _shown_signature(signature: inspect.Signature) -> tuple[list[tuple[str, int, str | None, str | None]], str | None]:
    """The signature as text: each parameter's name, kind, default and annotation, and the return annotation."""
    empty = inspect.Parameter.empty
    return ([(p.name, int(p.kind), None if p.default is empty else repr(p.default),
              None if p.annotation is empty else inspect.formatannotation(p.annotation))
             for p in signature.parameters.values()],
            None if signature.return_annotation is empty else inspect.formatannotation(signature.return_annotation))


def _rebuilt_signature(shown: tuple[list[tuple[str, int, str | None, str | None]], str | None]) -> inspect.Signature:
    """The child's signature, printed as the child prints it."""
    empty = inspect.Parameter.empty
    parameters, returns = shown
    return inspect.Signature(
        [inspect.Parameter(name, inspect._ParameterKind(kind), default=empty if default is None else _Shown(default),
                           annotation=empty if annotation is None else _Shown(annotation))
         for name, kind, default, annotation in parameters],
        return_annotation=empty if returns is None else _Shown(returns))


def _plain(out: Any) -> Any:
    """The candidate's output as the parent may rebuild it: a tensor as a plain, detached tensor (a subclass is
    judged by the values it holds, as in process), a tuple or list of them likewise, anything else by its type's
    name only."""
    if isinstance(out, Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            return out.detach().as_subclass(Tensor)
    if isinstance(out, tuple | list) and all(isinstance(x, Tensor) for x in out):
        return type(out)(_plain(x) for x in out)
    return ("not a tensor", type(out).__name__)


def _raised(err: BaseException) -> tuple[str, str, str, str]:
    return ("raised", type(err).__name__, str(err), "".join(traceback.format_exception(err)))


def _child(connection: Connection, parents: Connection, module: str, attr: str, cwd: str) -> None:
    """The child's loop: import the candidate, answer ``call``, ``backward`` and ``exit`` messages (``parents``: the
    parent's end of the pipe, which the fork copied: closed, so that the pipe ends when the parent's copy does)."""
    parents.close()
    faulthandler.disable()  # a crash is named by the parent in one line, not dumped by a handler it inherited
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like the command line: modules of the current directory import
    torch.set_num_threads(1)
    target = f"{module}:{attr}"
    try:
        candidate: Any = importlib.import_module(module)
        for part in attr.split("."):
            candidate = getattr(candidate, part)
    except SystemExit as exit_:  # the module ends the interpreter while it is imported
        _answer_parent(connection, ("refused", f"cannot import {target}: importing it called sys.exit({exit_.code!r})"))
        return
    except BaseException as err:  # any import-time error of the user's module: the parent names it in one line
        first = str(err).splitlines()[0] if str(err) else ""
        _answer_parent(connection, ("refused", f"cannot import {target}: {type(err).__name__}: {first}"))
        return
    if not callable(candidate):
        _answer_parent(connection, ("refused", f"{target} is not callable"))
        return
    try:
        signature = inspect.signature(candidate)
        shown = _shown_signature(signature)
    except (TypeError, ValueError):  # a builtin without one: the parent's inspect.signature raises too
        shown = None
    _answer_parent(connection, ("ready", shown))
    graphs: dict[int, tuple[Tensor, list[Tensor]]] = {}
    while True:
        try:
            message = _receive(connection)
        except (EOFError, OSError):  # the parent is gone
            return
        if message[0] == "exit":
            return
        mode = message[-1]  # the parent's grad mode and inference mode at the call: the candidate runs under them
        with torch.inference_mode() if mode == "inference" else contextlib.nullcontext():
            torch.set_grad_enabled(mode == "grad")
            state = global_state()
            reply, changed = _answer(candidate, message, graphs, state)
        torch.set_grad_enabled(True)
        _answer_parent(connection, (*reply, changed, os.getpid()))


def _answer(candidate: Any, message: Any, graphs: dict[int, tuple[Tensor, list[Tensor]]], state: list[Any]
            ) -> tuple[Any, list[str]]:
    """One ``call`` or ``backward`` message's reply, and the global settings the candidate changed (put back)."""
    try:
        if message[0] == "call":
            _, number, args, kwargs, grad, _ = message
            leaves = [x.requires_grad_(True) for x, wants in zip(args, grad, strict=True) if wants]
            given = {**dict(enumerate(args)), **kwargs}
            copies = {key: x.detach().clone() for key, x in given.items() if isinstance(x, Tensor)}
            out = candidate(*args, **kwargs)
            if any(grad) and isinstance(out, Tensor) and out.requires_grad:
                graphs[number] = (out, leaves)
                for old in sorted(graphs)[:-KEPT_GRAPHS]:
                    del graphs[old]
            # inputs it changed in place: sent back, for the parent's own check to find them changed and name them
            changed = {key: given[key].detach().clone() for key, was in copies.items() if modified(was, given[key])}
            subclass = type(out).__name__ if isinstance(out, Tensor) and type(out) is not Tensor else None
            reply: Any = ("out", _plain(out), changed, subclass)
        else:  # backward
            _, number, gradient, _ = message
            out, leaves = graphs.pop(number)
            grads = torch.autograd.grad(out, leaves, gradient, allow_unused=True)
            reply = ("grads", [None if g is None else g.detach() for g in grads])
    except SystemExit as exit_:  # the parent stops the audit, as in process
        reply = ("exited", repr(exit_.code))
    except BaseException as err:  # the candidate's exception: the parent raises it
        reply = _raised(err)
    return reply, restore_global_state(state)


# ----------------------------------------------------------------------------------------------------
# The parent
# ----------------------------------------------------------------------------------------------------


class _Remote(torch.autograd.Function):
    """The child's call as one autograd node: forward sends the inputs, backward the output's gradient."""

    @staticmethod
    def forward(ctx: Any, isolated: "IsolatedCandidate", kwargs: dict[str, Any], *args: Tensor) -> Tensor:
        grad = [isinstance(x, Tensor) and x.requires_grad for x in args]
        number, out = isolated.request_call(args, kwargs, grad)
        if not isinstance(out, Tensor):
            raise TypeError(f"returned {type(out).__name__}, expected a tensor")
        ctx.isolated, ctx.number, ctx.grad = isolated, number, grad
        return out

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor | None, ...]:
        grads = iter(ctx.isolated.request_backward(ctx.number, gradient))
        return (None, None, *(next(grads) if wants else None for wants in ctx.grad))


def _rebuilt(name: str, message: str) -> BaseException:
    """The child's exception as the same type where the parent has it (builtins, the audit's own), else an
    ``Exception`` subclass of the same name: the report reads as it would in process."""
    import builtins

    known: Any = {"Skip": Skip}.get(name) or getattr(builtins, name, None)
    if isinstance(known, type) and issubclass(known, BaseException):
        try:
            rebuilt: BaseException = known(message)
            return rebuilt
        except TypeError:
            pass
    named: type[Exception] = type(name, (Exception,), {"__module__": "candidate"})
    return named(message)


def _write_back(args: tuple[Any, ...], kwargs: dict[str, Any], changed: dict[Any, Tensor]) -> None:
    """The inputs the candidate changed in place in its own process, changed alike in the parent's copies (the
    audit's check after the call names them, as in process)."""
    for key, value in changed.items():
        target = args[key] if isinstance(key, int) else kwargs.get(key)
        if not isinstance(target, Tensor):
            continue
        with torch.no_grad():
            if target.shape == value.shape and target.dtype == value.dtype:
                target.copy_(value)
            else:
                target.data = value


def _mode() -> str:
    """The parent's mode at a call, for the child to run it under: inference mode, grad mode, or no grad."""
    return "inference" if torch.is_inference_mode_enabled() else "grad" if torch.is_grad_enabled() else "no_grad"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class IsolatedCandidate:
    """A function imported and called in a child process (see the module docstring); a context manager that ends
    the child. It calls like the candidate and has its signature."""

    def __init__(self, candidate: str | Callable[..., Any]) -> None:
        self.module, self.attr = _target_of(candidate)
        self.name = f"{self.module}:{self.attr}"
        #: what a repro imports: the candidate itself, by name (the parent may never have imported it)
        self.isolated_target = (self.module, self.attr)
        self.__module__, self.__qualname__ = self.module, self.attr
        self._numbers = itertools.count()
        self._process: Any = None
        self._process_pid: int | None = None
        self._connection: Connection | None = None
        self._signature: inspect.Signature | None = None
        self.start()

    # -- the child's life ---------------------------------------------------------------------------------

    def start(self) -> None:
        # fork: the child starts in milliseconds with torch imported, and runs none of the parent's __main__ again
        # (spawn and forkserver re-run a script's top level); its one intra-op thread is set before any parallel
        # region, so torch's OpenMP pool is never used across the fork
        context = multiprocessing.get_context("fork")
        mine, theirs = context.Pipe()
        self._process = context.Process(target=_child, args=(theirs, mine, self.module, self.attr, os.getcwd()),
                                        name=f"audit candidate {self.name}", daemon=True)
        self._process.start()
        self._process_pid = self._process.pid
        theirs.close()
        self._connection = mine
        try:
            reply = self._reply(START_SECONDS, starting=True)
        except CandidateStopped as stopped:  # its module ended the process while it was imported: no call was made
            raise AuditUsageError(f"cannot import {self.name}: it {stopped.what}") from None
        if reply[0] == "refused":
            self.close()
            raise AuditUsageError(reply[1])
        self._signature = None if reply[1] is None else _rebuilt_signature(reply[1])

    def close(self) -> None:
        process, connection = self._process, self._connection
        self._process = self._connection = None
        if connection is not None:
            with contextlib.suppress(OSError):
                _send(connection, ("exit",))
            connection.close()
        if process is not None:
            process.join(2)
            if process.is_alive():
                process.kill()
                process.join()

    def __enter__(self) -> "IsolatedCandidate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the pipe may already be gone
            self.close()

    @property
    def __signature__(self) -> inspect.Signature:
        """The candidate's signature as its own process read it; a ValueError where it has none (a builtin), as
        ``inspect.signature`` raises for the function itself."""
        if self._signature is None:
            raise ValueError(f"no signature found for {self.name}")
        return self._signature

    def __repr__(self) -> str:
        return f"IsolatedCandidate({self.name!r})"

    # -- calls ----------------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [x for x in args if isinstance(x, Tensor)]
        if torch.is_grad_enabled() and any(x.requires_grad for x in tensors) and len(tensors) == len(args):
            return _Remote.apply(self, kwargs, *args)  # type: ignore[no-untyped-call]
        return self.request_call(args, kwargs, [False] * len(args))[1]

    def request_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], grad: list[bool]) -> tuple[int, Any]:
        number = next(self._numbers)
        plain = tuple(x.detach() if isinstance(x, Tensor) else x for x in args)
        # inside autograd's forward grad mode is off: a call with leaves runs with it on, as the caller's did
        reply = self._request(("call", number, plain, kwargs, grad, "grad" if any(grad) else _mode()))
        _write_back(args, kwargs, reply[2])
        if reply[3] is not None:
            note_change(subclass_note(reply[3]))
        out = reply[1]
        if isinstance(out, tuple) and len(out) == 2 and out[0] == "not a tensor":  # named by its type, as in process
            out = type(out[1], (), {})()
        return number, out

    def request_backward(self, number: int, gradient: Tensor) -> list[Tensor | None]:
        grads: list[Tensor | None] = self._request(("backward", number, gradient.detach(), "grad"))[1]
        return grads

    def _request(self, message: Any) -> Any:
        if self._connection is None:
            raise CandidateStopped("could not be called: its process had already ended")
        try:
            _send(self._connection, message)
            reply = self._reply(None)
        except BaseException:  # the call's time limit (or Ctrl-C) while the child works: it cannot be trusted on
            self._kill()
            raise
        *reply, changes, pid = reply
        if pid != self._process_pid:  # the call forked, and the fork answered: the process the audit started
            self._kill()              # may have ended, and the answer is not its own; the fork is ended too
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            raise CandidateStopped(f"forked in its own process, and the answer came from the fork (pid {pid}), not "
                                   f"from the process the audit started")
        for change in changes:
            note_change(change)
        if reply[0] == "exited":
            raise CandidateStopped(f"called sys.exit({reply[1]})")
        if reply[0] == "raised":
            error = _rebuilt(reply[1], reply[2])
            error.__notes__ = [f"in its own process:\n{reply[3]}"]
            raise error
        return reply

    def _reply(self, seconds: float | None, starting: bool = False) -> Any:
        assert self._connection is not None
        assert self._process is not None
        ready = wait([self._connection, self._process.sentinel], seconds)
        if self._connection in ready:
            try:
                data = self._connection.recv_bytes()
            except (EOFError, OSError):
                pass
            else:
                try:
                    return torch.load(io.BytesIO(data), weights_only=True)
                except Exception as err:
                    self._kill()
                    raise CandidateStopped(f"answered from its own process with data the audit does not read "
                                           f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
                                           ) from None
        if not ready:
            self._kill()
            raise CandidateStopped(f"did not start within {seconds:g} s in its own process")
        self._process.join(5)
        code = self._process.exitcode
        self._kill()
        when = "while it was imported in its own process" if starting else "in its own process"
        if code is not None and code < 0:
            raise CandidateStopped(f"was killed by {_signal_name(-code)} {when} (a crash, a signal or the memory "
                                   f"limit)")
        raise CandidateStopped(f"ended its process {when} with exit status {code} (os._exit, exit, or a fork whose "
                               f"parent exited) without returning")

    def _kill(self) -> None:
        process, connection = self._process, self._connection
        self._process = self._connection = None
        if process is not None and process.is_alive():
            process.kill()
            process.join()
        if connection is not None:
            connection.close()
