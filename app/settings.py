"""Every setting of the service, from environment variables prefixed EDGETPU_SERVE_.

The core's own settings are here; each backend plug-in declares its own (a PluginSettings
class, read from EDGETPU_SERVE_<KEY>_*), which `plugin_settings()` composes. The registry makes
each plug-in's when it starts, so a wrong value stops the service at start either way.

Settings are frozen once made: what the service decides from them at start (the default model of each task,
which backend serves a model instead of another) is kept where it is decided (app/registry/), never written
back here. A different value is a different Settings (`model_copy(update=...)`, as a worker's share does).
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from collections.abc import Collection, Iterable

from pydantic import AfterValidator, AliasChoices, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models"
# Every setting of the service, a plug-in's too, comes from a variable with this prefix.
ENV_PREFIX = "EDGETPU_SERVE_"


def words(value):
    """Lists from the environment as comma-separated words: EDGETPU_SERVE_BACKENDS=cpu,emulated."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class PluginSettings(BaseSettings):
    """A backend plug-in's own settings (Frigate's way: each detector declares its config class).

    A subclass sets `model_config = plugin_config(KEY)`, so its fields read EDGETPU_SERVE_<KEY>_<FIELD>;
    values given in code (`Settings(plugins={KEY: {...}})`) take precedence over the environment. Frozen, like
    the core's."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True)


def plugin_config(key: str, **extra) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=f"{ENV_PREFIX}{key.upper()}_", extra="forbid", frozen=True, **extra)


def gallery_file(path: Path | None) -> Path | None:
    """FACE_DB names a file (made if missing), never a directory."""
    if path is not None and path.is_dir():
        raise ValueError(f"{path} is a directory; the face gallery is one file: name it, e.g. {path / 'faces.db'}")
    return path


@dataclass(frozen=True)
class DeviceShare:
    """Process `index` of `count` (0-based) sharing a host's devices (app/processes): a device plug-in claims
    a device before it opens one, so that no device is opened by two processes, and takes an even part of
    those present (the Edge TPU plug-in's claims), the `index`-th contiguous part first."""

    index: int
    count: int

    def __post_init__(self):
        if not 0 <= self.index < self.count:
            raise ValueError(f"share {self.index}/{self.count}: the index must be 0 to {self.count - 1}")

    @classmethod
    def parse(cls, text: str) -> DeviceShare:
        index, sep, count = text.partition("/")
        if not sep or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError(f"{text!r}: a share is K/N, the K-th of N (0-based), e.g. 0/2")
        return cls(int(index), int(count))

    def of(self, items: list) -> list:
        """This share's part of `items`: contiguous and in order (0/2 of [a, b, c, d] is [a, b]), the
        parts of all N shares together being `items` once each, the first ones one longer where they do
        not divide evenly; the last ones empty when there are fewer items than shares. What a process
        claims first: processes started together split the devices this way."""
        size, extra = divmod(len(items), self.count)
        start = self.index * size + min(self.index, extra)
        return items[start:start + size + (self.index < extra)]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    # Python's, uvicorn's and gunicorn's level names alike (any case)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    model_dir: Path = DEFAULT_MODEL_DIR
    # Models to serve (names of sub-directories of model_dir); empty = every one found.
    models: Annotated[list[str], NoDecode] = []
    # The model of /v1/classify. Unset: efficientnet_lite0 when it is served, else the only classifier
    # served; Registry.configure() settles it (default_model_for; Registry.default_model answers it from then on)
    # and refuses to start when it cannot.
    default_model: str | None = None
    # The model of /v1/detect and DeepStack's /v1/vision/detection. Unset: ssdlite_mobilenet_v2_person when it
    # is served, else the only detection model served; settled like DEFAULT_MODEL, among detection models.
    default_detection_model: str | None = None
    # The models of /v1/segment and /v1/pose. Unset: the only model of that task served (none is committed);
    # settled like DEFAULT_MODEL, among that task's models.
    default_segmentation_model: str | None = None
    default_pose_model: str | None = None
    # Backends each model is loaded on; the first is the default for requests.
    backends: Annotated[list[str], NoDecode] = ["cpu"]

    # Interpreters per (model, backend): requests beyond that wait in line.
    workers: int = Field(default=os.cpu_count() or 1, ge=1, le=64)
    cpu_threads: int = Field(default=1, ge=1, le=64, description="threads per CPU interpreter")
    max_waiting: int = Field(default=32, ge=0, description="requests allowed to wait per pool before 503")
    wait_timeout_s: float = Field(default=10.0, gt=0, description="longest wait for an interpreter before 503")
    # Under overload, admission by time as well as by count: once a pool's line has overflowed
    # (MAX_WAITING), and until it has refused nobody for OVERLOAD_HOLD_S, a request is also refused (503) when
    # the line ahead of it would take longer than this to clear, from the recent invoke times.
    # A line that never overflows is never bounded by time. 0 = by count only.
    max_queue_ms: float = Field(default=30.0, ge=0)
    # How long a pool stays overloaded after it last refused a request for want of room: while it is, the
    # line is bounded by time too (MAX_QUEUE_MS). Long enough to span the gaps of a burst, short enough that
    # a pool back under its capacity soon queues by count only again.
    overload_hold_s: float = Field(default=2.0, gt=0, le=3600)
    # Nice steps below the process for the threads that compute on the host's cores, so the event loop, which
    # answers and refuses, runs first when they fill every core (app/threads.py): the image threads always; a CPU
    # interpreter's invokes while its pool is overloaded, at the process's priority otherwise. 0 = as the process.
    compute_nice: int = Field(default=10, ge=0, le=19)
    # Processes serving one port (app/processes): `python -m app` starts that many under gunicorn, each
    # with its own share of the TPUs. auto: one per TPU (fewer when a segmented model needs several TPUs
    # in one process, or when there are fewer cores), and a single process without an Edge TPU.
    processes: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = "auto"
    # This process's place among N sharing the host's devices ("K/N": the K-th of N, 0-based): a device
    # plug-in claims an even part of the devices present, the K-th contiguous part first, in
    # DEVICE_CLAIMS_DIR, and opens only those. Set for each worker by the process group; unset = every device.
    device_share: DeviceShare | None = None
    # Where the processes sharing the devices claim them (a lock file per device, the plug-in's claims):
    # one directory for the N, set with DEVICE_SHARE (the process group's own directory for its workers).
    device_claims_dir: Path | None = None
    # The deadline of one invoke on a backend without a watchdog: past it the request gets a 504.
    invoke_timeout_s: float = Field(default=30.0, gt=0)
    # SIGTERM: requests already admitted get this long to finish before interpreters are closed.
    drain_timeout_s: float = Field(default=10.0, ge=0)
    # Then, at most this long for each of: a plug-in's background work under way (the Edge TPU's probe
    # round, which may be loading interpreters), and the interpreters' threads closing their interpreters.
    close_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    retry_after_s: int = Field(default=1, ge=0)
    warmup_at_start: bool = True
    # Threads that decode and resize images: more than the cores the interpreters leave free
    # only preempt them, and each holds a decoded image (app/core/images.py ImageWork).
    # Unset: half the cores when an interpreter computes on them (cpu, emulated), every core
    # when only devices do (an accelerator's plug-in): app/core/images.py image_threads.
    image_threads: int | None = Field(default=None, ge=1, le=64)

    # Plug-ins' own settings given in code, by backend key: {"<key>": {"<field>": value}}. From the
    # environment each plug-in reads its own EDGETPU_SERVE_<KEY>_<FIELD> variables.
    plugins: dict[str, dict[str, Any]] = {}
    # An invoke longer than this marks its device unhealthy: out of the pool until re-created.
    watchdog_timeout_s: float = Field(default=5.0, gt=0)
    # A segmented model's pipeline (app/pool/pipeline.py): requests inside it at once per segment (one invoking in
    # each stage, one queued: the next input is ready when a stage finishes), and inputs waiting between
    # two stages (a slow stage holds up the ones before it instead of letting inputs pile up).
    pipeline_lanes_per_segment: int = Field(default=2, ge=1, le=64)
    pipeline_queue_depth: int = Field(default=1, ge=1, le=64)
    # Backends whose interpreters the watchdog watches; unset: those whose plug-in says so (Backend.watched).
    watchdog_backends: Annotated[list[str] | None, NoDecode] = None
    watchdog_retry_s: float = Field(default=2.0, gt=0, description="wait between attempts to re-create a device")

    max_body_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    max_image_pixels: int = Field(default=50_000_000, ge=1, description="decompression bomb guard")
    max_top_k: int = Field(default=1000, ge=1)
    # Open Inference Protocol: images (or tensors) one request may hold; each runs as its own invoke.
    v2_max_batch: int = Field(default=64, ge=1)

    # API keys (app/api/auth.py), sent as `Authorization: Bearer <key>` or `X-API-Key`; several of
    # each so a key can be rotated. Inference keys: none = inference endpoints open. Admin keys: none =
    # admin endpoints open on a loopback HOST only, 403 on any other. *_FILE: one key per line (secrets).
    api_keys: Annotated[list[str], NoDecode] = Field(default=[], repr=False)
    api_keys_file: Path | None = None
    admin_keys: Annotated[list[str], NoDecode] = Field(default=[], repr=False)
    admin_keys_file: Path | None = None

    # The HTTP connection (app/http_server.py): what a slow or hostile client can hold.
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, description="request line + headers; over it: 431")
    header_timeout_s: float = Field(default=10.0, gt=0, description="from connect (or the previous response) to the "
                                    "end of the headers; over it: 408 and close")
    body_timeout_s: float = Field(default=60.0, gt=0, description="from the end of the headers to the end of the "
                                  "body; over it: 408 and close")
    keep_alive_timeout_s: float = Field(default=5.0, gt=0, description="idle keep-alive connection closed after")
    max_connections: int = Field(default=256, ge=1, description="open connections; beyond: 503 at connect")
    linger_s: float = Field(default=1.0, ge=0, le=60, description="a connection refused by the HTTP layer (408, "
                            "431, 503, 400) is drained this long after its answer, then closed: the client reads "
                            "the answer instead of a reset")
    # Refusals (503) are logged in full only when the first comes after a quiet window; while they go on,
    # one line per window sums them up (app/api/errors.py), so an overload does not flood the log.
    refusal_log_window_s: float = Field(default=10.0, gt=0, le=3600)

    # Memory of requests in flight (app/api/body.py): request bodies being read and held count
    # against this; a request whose body does not fit waits (up to WAIT_TIMEOUT_S), then 503.
    max_body_bytes_in_flight: int = Field(default=160 * 1024 * 1024, ge=1)
    # glibc malloc set for bursts of large buffers (app/memory.py): fixed mmap threshold, 2 arenas.
    tune_malloc: bool = True
    # Image strictness (app/imaging/decoding.py): refuse images the decoder reports as damaged (corrupt JPEG
    # entropy data, PNG checksum errors) with a 400; true accepts them as decoded.
    accept_damaged_images: bool = False
    # Pixels decoded for formats without reduced-size decoding (all but JPEG): bounds time and memory.
    max_decoded_pixels: int = Field(default=24_000_000, ge=1)
    # Pillow's freed pixel blocks kept for the next images (process-wide, app/imaging/decoding.py): a request then
    # skips fresh pages for its decoded and resized images (about 1 ms of a 640x427 JPEG's 5 ms). At most
    # IMAGE_BUFFER_BLOCKS blocks of IMAGE_BUFFER_BLOCK_BYTES are kept (64 MiB by default); 0 blocks frees each at once.
    image_buffer_blocks: int = Field(default=16, ge=0, le=1024)
    image_buffer_block_bytes: int = Field(default=4 * 1024 * 1024, ge=4096, le=1024 * 1024 * 1024, multiple_of=4096)

    # Frigate's ZMQ detector protocol (app/frontdoors, docs/frigate.md): the endpoint this service binds, e.g.
    # tcp://127.0.0.1:5555 or ipc:///tmp/cache/zmq_detector; unset: no ZMQ door. The API keys do not cover it: who
    # may connect is decided by address (ZMQ_ALLOW_FROM) and, for ipc, by the file system.
    zmq_endpoint: str | None = Field(default=None, max_length=512)
    # Who may connect over tcp besides loopback (always allowed): addresses and CIDRs, comma-separated
    # (192.168.1.20, 10.0.0.0/24, fd00::/64). A tcp bind beyond loopback needs it (or ZMQ_ALLOW_REMOTE).
    zmq_allow_from: Annotated[list[str], NoDecode] = []
    # Anyone who reaches the port may connect (the door warns at start): a bind beyond loopback without a list.
    zmq_allow_remote: bool = False
    # Who may send a model (model_data) besides loopback and ipc peers: a narrower list than ZMQ_ALLOW_FROM.
    zmq_upload_from: Annotated[list[str], NoDecode] = []
    # An abstract ipc socket (ipc://@name: no file, so no file permissions decide who connects) only with this set.
    zmq_allow_abstract: bool = False
    # Frigate's model transfer (model_data): a .tflite checked as `converter import` checks one, written into
    # MODEL_DIR as a model directory, loaded and warmed up before the reply. Off: refused, saying so.
    zmq_accept_models: bool = False
    # The largest model file a client may send. Larger ones, and any frame over its own limit, are read and dropped
    # up to this size, never held; a frame larger than this drops its peer.
    zmq_max_model_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024, le=1024 * 1024 * 1024)
    # Models uploaded into MODEL_DIR (by the door's provenance) at most, by count and by their files' bytes: an
    # upload beyond is refused, saying so; none is ever removed to make room.
    zmq_max_uploaded_models: int = Field(default=8, ge=1, le=1024)
    zmq_max_uploaded_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    # Requests being answered at once, over every connection; one beyond gets zero rows at once ("busy").
    zmq_max_in_flight: int = Field(default=64, ge=1, le=4096)
    # Connections held at once; a new one beyond takes the place of the quietest one not being answered, or is
    # closed. Each holds at most one frame of the largest served input (or one upload) while it is read.
    zmq_max_connections: int = Field(default=64, ge=1, le=4096)
    # A peer that has not finished its greeting this long after connecting, or whose message under way has not
    # moved this long, is dropped.
    zmq_peer_timeout_s: float = Field(default=10.0, gt=0, le=3600)

    # Faces (docs/faces.md): served detection and embedding models (unset: the face routes answer 503 with the fix);
    # the gallery's file (unset: default_gallery_path()); register and delete need the admin key, or not.
    face_detector: str | None = Field(default=None, max_length=256)
    face_embedder: str | None = Field(default=None, max_length=256)
    face_db: Annotated[Path | None, AfterValidator(gallery_file)] = None
    face_edits_need_admin: bool = False

    _plugin_settings: dict[type, PluginSettings | None] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _zmq_endpoint_binds_safely(self):
        problem = zmq_bind_problem(self.zmq_endpoint, self.zmq_allow_remote, self.zmq_allow_from,
                                   self.zmq_upload_from, self.zmq_allow_abstract)
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("zmq_allow_from", "zmq_upload_from", mode="before")
    @classmethod
    def _zmq_networks(cls, value):
        return words(value)

    @field_validator("zmq_allow_from", "zmq_upload_from")
    @classmethod
    def _zmq_networks_read(cls, value):
        for text in value:
            zmq_network(text)  # ValueError naming the entry
        return value

    def plugin_settings(self, plugin: type) -> PluginSettings | None:
        """A backend plug-in's own settings: its settings class from the environment, with what
        `plugins` gives for its key on top. None for a plug-in without settings."""
        if plugin not in self._plugin_settings:
            cls = plugin.settings_class
            self._plugin_settings[plugin] = None if cls is None else cls(**self.plugins.get(plugin.key, {}))
        return self._plugin_settings[plugin]

    @model_validator(mode="after")
    def _share_has_its_claims(self):
        if self.device_share is not None and self.device_claims_dir is None:
            raise ValueError(f"{ENV_PREFIX}DEVICE_SHARE={self.device_share} needs {ENV_PREFIX}DEVICE_CLAIMS_DIR, the "
                             "directory where the processes sharing the devices claim the devices they open. Fix: "
                             f"set {ENV_PREFIX}DEVICE_CLAIMS_DIR to one directory they can all write (the same for "
                             f"all), or unset {ENV_PREFIX}DEVICE_SHARE")
        return self

    @model_validator(mode="after")
    def _budget_holds_a_body(self):
        # a multipart body is held twice for a moment (the body, the file in it)
        if self.max_body_bytes_in_flight < 2 * self.max_body_bytes:
            raise ValueError(f"{ENV_PREFIX}MAX_BODY_BYTES_IN_FLIGHT={self.max_body_bytes_in_flight} must be at least "
                             f"twice {ENV_PREFIX}MAX_BODY_BYTES ({self.max_body_bytes}): a multipart body is held twice "
                             f"while it is parsed. Fix: raise it to {2 * self.max_body_bytes} or more, or lower "
                             f"{ENV_PREFIX}MAX_BODY_BYTES")
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value):
        return value.lower() if isinstance(value, str) else value

    @field_validator("device_share", mode="before")
    @classmethod
    def _share(cls, value):
        if value == "":
            return None
        return DeviceShare.parse(value) if isinstance(value, str) else value

    @field_validator("api_keys_file", "admin_keys_file", "device_claims_dir", "face_db", "face_detector",
                     "face_embedder", mode="before")
    @classmethod
    def _empty_is_none(cls, value):
        return None if value == "" else value  # EDGETPU_SERVE_API_KEYS_FILE= (compose's empty default)

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _keys(cls, value):
        return words(value)

    @field_validator("models", "backends", "watchdog_backends", mode="before")
    @classmethod
    def _comma_separated(cls, value):
        return words(value)

    @field_validator("backends")
    @classmethod
    def _at_least_one(cls, value):
        if not value:
            raise ValueError("at least one backend is needed")
        return value


@dataclass(frozen=True)
class ZmqEndpoint:
    """ZMQ_ENDPOINT read: tcp://HOST:PORT (HOST an address, `*` for every IPv4 one, `localhost`, or a name) or
    ipc://PATH (`ipc://@NAME`: an abstract socket, Linux's, with no file)."""

    text: str
    scheme: str                    # tcp | ipc
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def abstract(self) -> bool:
        return self.scheme == "ipc" and self.path.startswith("@")

    @property
    def loopback(self) -> bool:
        """A tcp endpoint only this host reaches (an ipc one is local by nature: its file decides)."""
        if self.scheme != "tcp":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # "*", an interface name, a host name
            return self.host == "localhost"


def zmq_endpoint(text: str) -> ZmqEndpoint:
    """ZMQ_ENDPOINT as parts; ValueError saying what an endpoint is."""
    scheme, sep, rest = text.partition("://")
    if scheme == "ipc" and sep and rest and rest != "@":
        return ZmqEndpoint(text, "ipc", path=rest)
    if scheme != "tcp" or not sep:
        raise ValueError(f"ZMQ_ENDPOINT={text!r}: tcp://HOST:PORT or ipc://PATH (Frigate's default: "
                         "ipc:///tmp/cache/zmq_detector)")
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"ZMQ_ENDPOINT={text!r}: a tcp endpoint is tcp://HOST:PORT, e.g. tcp://127.0.0.1:5555")
    return ZmqEndpoint(text, "tcp", host=host.removeprefix("[").removesuffix("]"), port=int(port))


def zmq_network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An entry of ZMQ_ALLOW_FROM or ZMQ_UPLOAD_FROM: an address (one host) or a CIDR (its host bits ignored)."""
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"{text!r} is not an address or a CIDR (e.g. 192.168.1.20 or 192.168.1.0/24; host names "
                         "are not taken: the door admits peers by the address they connect from)") from None


def zmq_bind_problem(endpoint: str | None, allow_remote: bool, allow_from: Collection[str] = (),
                     upload_from: Collection[str] = (), allow_abstract: bool = False) -> str | None:
    """Why ZMQ_ENDPOINT cannot be bound as set (None: it can): tcp://HOST:PORT or ipc://PATH only; a tcp HOST other
    than loopback only with ZMQ_ALLOW_FROM (who may connect) or ZMQ_ALLOW_REMOTE (anyone); an abstract ipc socket
    only with ZMQ_ALLOW_ABSTRACT; ZMQ_UPLOAD_FROM only within who may connect."""
    if endpoint is None:
        return None
    try:
        parts = zmq_endpoint(endpoint)
    except ValueError as e:
        return str(e)
    if parts.abstract and not allow_abstract:
        return (f"ZMQ_ENDPOINT={endpoint!r} is an abstract socket: it has no file, so no file permissions decide who "
                f"connects (any process of this network namespace can). Fix: an ipc:// path in a directory only "
                f"Frigate's user may enter, or {ENV_PREFIX}ZMQ_ALLOW_ABSTRACT=true where every process is trusted")
    if parts.scheme == "tcp" and not parts.loopback and not (allow_from or allow_remote):
        return (f"ZMQ_ENDPOINT={endpoint!r} binds beyond this host, and Frigate's protocol has no authentication: "
                f"the door admits peers by address. Fix: set {ENV_PREFIX}ZMQ_ALLOW_FROM to Frigate's address (or its "
                f"network, e.g. 192.168.1.0/24), or bind tcp://127.0.0.1:{parts.port} or an ipc:// path; "
                f"{ENV_PREFIX}ZMQ_ALLOW_REMOTE=true lets anyone who reaches the port in")
    if not allow_remote:
        allowed = [zmq_network(text) for text in allow_from]
        for text in upload_from:
            network = zmq_network(text)
            if not (network.network_address.is_loopback or any(
                    network.version == a.version and network.subnet_of(a) for a in allowed)):
                return (f"ZMQ_UPLOAD_FROM names {text}, which ZMQ_ALLOW_FROM does not let connect: uploads come from "
                        "a narrower list than connections. Fix: add it to ZMQ_ALLOW_FROM too, or leave it out")
    return None


# The default model when DEFAULT_MODEL is unset and it is served: the committed ImageNet classifier.
COMMITTED_DEFAULT_MODEL = "efficientnet_lite0"
# The default detector when DEFAULT_DETECTION_MODEL is unset and it is served: the committed person detector.
COMMITTED_DEFAULT_DETECTION_MODEL = "ssdlite_mobilenet_v2_person"


@dataclass(frozen=True)
class DefaultOf:
    """One task's default model: its setting, the committed model it prefers, the routes that use it."""

    setting: str          # the Settings field (its variable: EDGETPU_SERVE_ + upper case)
    task: str             # model.json's task
    committed: str        # "" where none is committed
    routes: str           # what answers with it, for the messages
    named_route: str      # where each model of the task is also served

    @property
    def variable(self) -> str:
        return f"{ENV_PREFIX}{self.setting.upper()}"


CLASSIFICATION_DEFAULT = DefaultOf("default_model", "classification", COMMITTED_DEFAULT_MODEL, "/v1/classify",
                                   "/v1/models/NAME/classify")
DETECTION_DEFAULT = DefaultOf("default_detection_model", "detection", COMMITTED_DEFAULT_DETECTION_MODEL,
                              "/v1/detect and /v1/vision/detection",
                              "/v1/models/NAME/detect and /v1/vision/custom/NAME")
SEGMENTATION_DEFAULT = DefaultOf("default_segmentation_model", "segmentation", "", "/v1/segment",
                                 "/v1/models/NAME/segment")
POSE_DEFAULT = DefaultOf("default_pose_model", "pose", "", "/v1/pose", "/v1/models/NAME/pose")
DEFAULTS = (CLASSIFICATION_DEFAULT, DETECTION_DEFAULT, SEGMENTATION_DEFAULT, POSE_DEFAULT)


def default_model_for(chosen: str | None, served: list[str], of_task: list[str],
                      default: DefaultOf = CLASSIFICATION_DEFAULT, others: Collection[str] = ()) -> str | None:
    """The model a route uses when its path names none (/v1/classify; for detection /v1/detect and DeepStack's
    /v1/vision/detection): the one the setting names, which must be served and not a model of a task that has its
    own default (`others`: a detector is no default for /v1/classify); unset, the committed default when it is
    served, else the only model of the task served, else none (the route names no model). ValueError, saying what
    to set, otherwise: a default the service guessed among several would answer for a model nobody asked for."""
    variable, task = default.variable, default.task
    if chosen is not None:
        if chosen not in served:
            fix = f"set {variable} to one of {', '.join(of_task)}" if of_task else \
                f"unset {variable} (no {task} model is served)"
            raise ValueError(f"{variable}={chosen} is not served (serving {', '.join(served)}). Fix: {fix}, or serve "
                             f"{chosen} too ({ENV_PREFIX}MODELS)")
        if chosen in others and not of_task:  # nothing it could name: say so, and what is served
            raise ValueError(f"{variable}={chosen} is not a {task} model, and no {task} model is served (serving "
                             f"{', '.join(served)}), so {variable}, the model of {default.routes}, cannot apply. Fix: "
                             f"unset {variable}, or serve a {task} model too ({ENV_PREFIX}MODELS)")
        if chosen in others:
            settings = ", ".join(d.variable for d in DEFAULTS if d is not default)
            raise ValueError(f"{variable}={chosen} is not a {task} model, and {variable} names the model of "
                             f"{default.routes}. Fix: set {variable} to one of {of_task}; the default of another "
                             f"task has its own setting ({settings})")
        return chosen
    if default.committed in of_task:
        return default.committed
    if len(of_task) <= 1:
        return of_task[0] if of_task else None
    raise ValueError(f"{variable} is unset and several {task} models are served ({', '.join(of_task)}): "
                     f"which one answers {default.routes}? Fix: set {variable} to one of them (each is also at "
                     f"{default.named_route})")


def default(name: str) -> Any:
    """The default of a core setting, for code that also runs without Settings (a pool built by a test):
    one value, the one docs/configuration.md documents."""
    return Settings.model_fields[name].default


def variable_names(plugins: Iterable[type] = ()) -> set[str]:
    """Every environment variable the service reads: the core's, and each given plug-in's own
    (app.engines.BACKENDS.values() for all), for checks of deployment manifests."""
    names = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    for plugin in plugins:
        cls = plugin.settings_class
        if cls is None:
            continue
        for name in cls.model_fields:
            names |= set(field_variables(cls, name))
    return names


def field_variables(model: type[BaseSettings], name: str) -> list[str]:
    """The environment variables that set field `name` of `model` (the core's Settings or a plug-in's): its
    prefixed name, and the names its validation alias adds (a variable that kept its first name)."""
    names = [f"{model.model_config.get('env_prefix', '')}{name}".upper()]
    field = model.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    return names + [choice.upper() for choice in choices if isinstance(choice, str) and choice.upper() not in names]


# ---- a refusal to start, in one line -------------------------------------------------------------

# Fixed: how much of a bad value a refusal repeats (a value is the user's own, but a line is a line).
SHOWN_VALUE_CHARS = 60
# pydantic-settings names the field whose value is not the JSON it needs only in its message.
_UNPARSED_FIELD = re.compile(r'error parsing value for field "(?P<field>[^"]+)"')


def settings_problem(error: ValidationError | SettingsError, model: type[BaseSettings] = Settings) -> str:
    """What is wrong with the settings that `model` (the core's, or a plug-in's) could not be made from, as one
    line: each setting by its variable, its value, what is wrong, and the fix. A check across several settings (a
    model validator) says all of that in its own message, naming its variables; one that names a setting by its
    short name (ZMQ_ENDPOINT) gets the prefix added. Values of fields kept out of reprs (API keys) are not shown."""
    if isinstance(error, SettingsError):
        match = _UNPARSED_FIELD.search(str(error))
        if match is None:
            return f"the settings cannot be read: {error}"
        name = match.group("field")
        cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
        return _one_setting(model, name, [f"not the JSON this setting takes{cause}"], _environment_value(model, name))
    problems, by_field = [], {}
    for item in error.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        if not item["loc"]:  # a model validator: its message names its settings and the fix
            problems.append(_prefixed(message, model))
            continue
        name = str(item["loc"][0])
        entry = by_field.setdefault(name, ([], item.get("input")))
        entry[0].append(message[:1].lower() + message[1:])
    problems += [_one_setting(model, name, messages, value) for name, (messages, value) in by_field.items()]
    return "; ".join(problems)


def _one_setting(model: type[BaseSettings], name: str, messages: list[str], value: Any) -> str:
    variable = next((v for v in field_variables(model, name) if v in os.environ), field_variables(model, name)[0])
    field = model.model_fields.get(name)
    shown = ""
    if field is not None and field.repr and isinstance(value, str):  # a value from the environment, not a secret
        shown = "=" + repr(value if len(value) <= SHOWN_VALUE_CHARS else value[:SHOWN_VALUE_CHARS] + "...")
    default = "" if field is None or field.is_required() else f" (default: {_default_text(field.default)})"
    return f"{variable}{shown}: {', or '.join(dict.fromkeys(messages))}. Fix: correct {variable}, or unset it{default}"


def _default_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "empty"
    return str(value) if value != {} else "none"


def _environment_value(model: type[BaseSettings], name: str) -> str | None:
    return next((os.environ[v] for v in field_variables(model, name) if v in os.environ), None)


def _prefixed(message: str, model: type[BaseSettings]) -> str:
    """A model validator's message, its leading setting named by its variable (ZMQ_ENDPOINT=... -> EDGETPU_SERVE_...)."""
    prefix = model.model_config.get("env_prefix", "")
    lead = re.match(r"[A-Z][A-Z0-9_]*", message)
    if lead and not message.startswith(prefix) and lead.group(0).lower() in model.model_fields:
        return prefix + message
    return message
