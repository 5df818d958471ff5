"""The models served: the registry the front doors ask (registry), what start-up settles (startup), the
fallbacks in force (fallbacks), building a version (loading), each model's state and current version
(lifetimes), following devices (devices), the version and a request's lease on it (versions), and what
clients see (status)."""

from app.registry.registry import Registry
from app.registry.startup import Defaults
from app.registry.status import SERVING, ModelStatus, iso_time
from app.registry.versions import Lease, ModelVersion

__all__ = ["SERVING", "Defaults", "Lease", "ModelStatus", "ModelVersion", "Registry", "iso_time"]
