"""The models served: the registry the core asks (registry), what start-up settles (startup), the
fallbacks in force (fallbacks), building a version (loading), each model's state and current version
(lifetimes), following devices (devices), a version (versions), a request's ticket (tickets: the version it holds
and its place in line), and what clients see (status)."""

from app.registry.registry import Registry
from app.registry.startup import Defaults
from app.registry.status import SERVING, ModelStatus, iso_time
from app.registry.tickets import Target, Ticket
from app.registry.versions import ModelVersion

__all__ = ["SERVING", "Defaults", "ModelStatus", "ModelVersion", "Registry", "Target", "Ticket", "iso_time"]
