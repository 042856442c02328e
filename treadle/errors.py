"""The exceptions treadle raises. Each message names the node, tensor or argument at fault."""


class TreadleError(Exception):
    """Base of every error treadle raises on purpose."""


class IRError(TreadleError):
    """A malformed tensor program: an undefined variable, a rank mismatch, a bad mapping."""


class UnsupportedOpError(TreadleError, NotImplementedError):
    """The model uses an operator (or an attribute of one) that treadle does not support."""


class NeedsValueError(UnsupportedOpError):
    """An input whose contents decide shapes (a Reshape's target, a reduction's axes, a
    Pad's widths) is computed at run time; ``tensor`` names it."""

    def __init__(self, message: str, tensor: str):
        super().__init__(message)
        self.tensor = tensor

    def __reduce__(self):
        return type(self), (str(self), self.tensor)


class ShapeError(TreadleError, ValueError):
    """A tensor's shape does not fit what the program or graph expects."""


class DTypeError(TreadleError, TypeError):
    """A tensor's dtype does not fit what the program or graph expects."""


class ArgumentError(TreadleError, ValueError):
    """A call passed the wrong number, kind or layout of arguments."""


class CompileError(TreadleError):
    """The native compiler rejected generated code; the message holds its log."""


class KernelError(TreadleError, RuntimeError):
    """A check inside a running kernel failed (for example a symbolic-size condition)."""


class RaceError(KernelError):
    """Two threads of a simulated GPU kernel touch one memory element with no barrier
    between them, at least one writing; the message names the buffer, the element, the
    block and both threads."""


class ModelError(TreadleError, ValueError):
    """A model file or saved model is malformed, corrupt or incomplete."""


class ScheduleConfigError(TreadleError, ValueError):
    """A schedule configuration is invalid for this workload or target; searches skip it."""


class LangError(TreadleError):
    """A ``treadle.lang`` kernel uses Python that cannot become a tensor program; the
    message starts with the ``file:line:`` of the offending source."""


class DeviceUnavailableError(TreadleError, RuntimeError):
    """This machine cannot run GPU kernels: no driver library, no device, or a driver that
    failed to start. Building kernels (which needs only the compiler) still works."""


class ExportError(TreadleError):
    """A model that the C export cannot run; the message says why."""


class DeviceMismatchError(TreadleError, RuntimeError):
    """No worker of the cluster has the device the kernels are tuned for."""


class RunnerUnavailableError(TreadleError, ImportError):
    """The runner named needs a package this Python lacks (Ray, for ``ray``)."""
