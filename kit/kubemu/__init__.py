"""kubemu: a small Kubernetes API-server emulator for tests and the local demo."""

from .admission import AdmissionAttributes, AdmissionDenied
from .emulator import Emulator, TlsFiles
from .errors import ApiError
from .faults import Fault, FaultHandle
from .resources import Resource, ScaleSpec, default_resources
from .wire import RecordedRequest

__all__ = [
    "AdmissionAttributes",
    "AdmissionDenied",
    "ApiError",
    "Emulator",
    "Fault",
    "FaultHandle",
    "RecordedRequest",
    "Resource",
    "ScaleSpec",
    "TlsFiles",
    "default_resources",
]
