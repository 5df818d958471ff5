"""The models served: discovery and the versions' lifetimes (registry), building a version
(loading), the version and a request's lease on it (versions), and what clients see (status)."""

from app.registry.registry import Registry
from app.registry.status import SERVING, ModelStatus, iso_time
from app.registry.versions import Lease, ModelVersion

__all__ = ["SERVING", "Lease", "ModelStatus", "ModelVersion", "Registry", "iso_time"]
