"""Frigate's model transfer (model_data): a .tflite a client sends, checked, written as a model directory, loaded.

Only with ZMQ_ACCEPT_MODELS=true, from loopback, ipc and ZMQ_UPLOAD_FROM peers, at most ZMQ_MAX_MODEL_BYTES. Each
upload is decided twice. First from its header and its frame's declared size, before any byte of the file is read
(`admit`, as the frame's head arrives): a refusal then (uploads off, a peer not allowed, a name that makes no model,
a size over the cap, another model being written, the caps on uploaded models reached) is answered at once, and its
peer dropped with nothing of the file read; a name that already answers, or the name being written now, lets the
file be read through a hash (nothing of it held); only the one upload that may be written is received whole. Then,
once it has come (`receive`):

    name, bytes --checks (app/importing: as `converter import` checks a file; here also: a detector ending in
                  TFLite_Detection_PostProcess with a uint8 [1, H, W, 3] input, what Frigate sends)
      --> MODEL_DIR/<name>/ written whole and atomically (app/model_dir/writing.py): model.json with provenance
          "uploaded by a Frigate ZMQ client", the file as the plain or the compiled file (app/importing handed_over)
      --> loaded and warmed up on the configured backends (the core's command Core.add), then it serves

Names are compared without regard to case, as in a model_request. One model is written at a time: another model sent
meanwhile is answered "busy" at once, and the same name sent meanwhile waits for that write and gets its answer when
its bytes are the same (two Frigates starting together both end up ready), a refusal when they differ. A name that
already answers (a served model's, or one of its files') is refused unless the bytes are that model's own file: then
the answer is "saved and loaded", nothing written. Nothing is ever replaced or evicted: uploaded models are capped by
count and bytes (ZMQ_MAX_UPLOADED_MODELS, ZMQ_MAX_UPLOADED_BYTES), and an upload beyond is refused, saying so. Class
ids suffice (Frigate keeps its own labelmap), so no labels are written. A file no backend here can run (a
compiled-only file on a host without an Edge TPU in service) is not kept, and the reply says why. A refusal writes
nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import ServeError
from app.frontdoors.served import ServedDetector, UploadResult
from app.frontdoors.zmtp import HASH
from app.importing import ImportRefused, graph_facts, handed_over, read_tflite_source
from app.model_dir.schema import EDGETPU, INT8, MANIFEST
from app.model_dir.writing import write_model_dir

log = logging.getLogger(__name__)

PROVENANCE = "uploaded by a Frigate ZMQ client"
ROUTE = "uploaded"


# A Ticket's limit when the upload is refused from its header: no frame is that small
REFUSED = -1


class Refusal(Exception):
    """The upload is not kept; the message says why and what would work. `reason`: its label."""

    def __init__(self, message: str, reason: str = "upload"):
        super().__init__(message)
        self.reason = reason


@dataclass(eq=False)
class Ticket:
    """One upload as admitted from its header: how its file's frame is read (`limit`: held up to its size, HASH, or
    REFUSED: answered `refusal` at once), and what decides its answer once it has come."""

    name: str
    size: int
    limit: int
    refusal: str | None = None              # answered so, whatever the bytes
    reason: str = "upload"                  # the refusal's label (metrics, log)
    model: str = ""                         # the model directory it becomes
    hashes: frozenset[str] = frozenset()    # a name that answers: that model's own files (same bytes: served)
    answers: ServedDetector | None = None
    directory: Path | None = None           # a directory of that name, not served: loaded if it is this file
    joins: Ticket | None = None             # the write under way it waits for
    done: asyncio.Future | None = None      # a write's answer, for those that wait on it
    sha256: str | None = None               # a write's file, once read
    result: UploadResult | None = field(default=None)


def _refused(message: str) -> UploadResult:
    return UploadResult(saved=False, loaded=False, model=None, message=message)


class ModelUploads:
    """`add(path)` serves a model directory written here (the registry's add); `root` is MODEL_DIR."""

    def __init__(self, add: Callable[[Path], object], root: Path, max_bytes: int, accepting: bool,
                 max_models: int = 8, max_total_bytes: int = 256 << 20):
        self.add = add
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.accepting = accepting
        self.max_models = max_models
        self.max_total_bytes = max_total_bytes
        self.writing: Ticket | None = None
        self.uploaded: dict[str, int] | None = None  # model -> its files' bytes, read from MODEL_DIR when first asked

    # -- at the frame's head ------------------------------------------------------------------------------------

    def admit(self, name: str, size: int, may_upload: bool, served: Iterable[ServedDetector]) -> Ticket:
        """How the file of `size` bytes named `name` is read, decided before any of it is held."""
        try:
            return self._admit(name, size, may_upload, served)
        except Refusal as e:
            return Ticket(name, size, REFUSED, refusal=str(e), reason=e.reason)

    def _admit(self, name: str, size: int, may_upload: bool, served: Iterable[ServedDetector]) -> Ticket:
        if not self.accepting:
            raise Refusal(f"model uploads are off here (set EDGETPU_SERVE_ZMQ_ACCEPT_MODELS=true to accept them), and "
                          f"{name!r} is not served: name a served model in Frigate's model.path")
        if not may_upload:
            raise Refusal(f"model uploads are taken from loopback, ipc and EDGETPU_SERVE_ZMQ_UPLOAD_FROM only: put "
                          f"{name!r} into MODEL_DIR on the service's host, or add this client's address there")
        model = model_name_for(name)
        if size > self.max_bytes:
            raise Refusal(f"{name} has {size} bytes, more than this service takes "
                          f"(EDGETPU_SERVE_ZMQ_MAX_MODEL_BYTES={self.max_bytes})")
        answers = answering(name, model, served)
        if answers is not None:
            return Ticket(name, size, HASH, model=answers.name, hashes=answers.hashes, answers=answers)
        writing = self.writing
        if writing is not None:
            if writing.model.lower() == model.lower():
                return Ticket(name, size, HASH, model=writing.model, joins=writing)
            raise Refusal(f"busy: {writing.name} is being written and loaded (one model at a time). Frigate does not "
                          f"send it again by itself: restart its detector once {writing.model} serves", "busy")
        directory = next((p for p in self._directories() if p.name.lower() == model.lower()), None)
        if directory is not None:
            return Ticket(name, size, HASH, model=directory.name, directory=directory)
        uploaded = self._uploaded()
        if len(uploaded) >= self.max_models or sum(uploaded.values()) + size > self.max_total_bytes:
            raise Refusal(f"{len(uploaded)} uploaded models of {sum(uploaded.values())} bytes are here "
                          f"(EDGETPU_SERVE_ZMQ_MAX_UPLOADED_MODELS={self.max_models}, ZMQ_MAX_UPLOADED_BYTES="
                          f"{self.max_total_bytes}); none is removed to make room: remove one from MODEL_DIR "
                          f"({', '.join(sorted(uploaded))}) and restart, or raise the caps")
        self.writing = ticket = Ticket(name, size, size, model=model, done=asyncio.get_running_loop().create_future())
        return ticket

    def release(self, ticket: Ticket) -> None:
        """A ticket whose file never came whole (its peer gone, its message refused): the write it held is free."""
        if ticket is self.writing:
            self._finish(ticket, _refused(f"the first copy of {ticket.name} did not arrive whole: send it again"))

    # -- once the file has come -----------------------------------------------------------------------------

    async def receive(self, ticket: Ticket, data) -> UploadResult:
        """The answer to an upload admitted as `ticket`, its file `data` (held, or Skipped with its hash)."""
        if ticket.refusal is not None:
            return _refused(ticket.refusal)
        if len(data) != ticket.size:
            return _refused(f"{ticket.name}: its frame has {len(data)} bytes, not the {ticket.size} admitted")
        if ticket.joins is not None:
            first = await asyncio.shield(ticket.joins.done)
            if data.sha256 == ticket.joins.sha256:
                return first
            return _refused(f"another file named {ticket.joins.name} was being written as this one came: not "
                            "replaced. Rename the file Frigate's model.path names")
        if ticket.answers is not None:
            if data.sha256 in ticket.hashes:
                return UploadResult(saved=True, loaded=ticket.answers.loaded, model=ticket.answers.name,
                                    message=f"{ticket.name} is model {ticket.answers.name!r}'s own file: it serves "
                                            "already")
            return _refused(f"model {ticket.answers.name!r} answers to {ticket.name!r} already, with another file: "
                            f"not replaced. Rename the file Frigate's model.path names")
        if ticket.directory is not None:
            return await asyncio.to_thread(self._again, ticket, data.sha256)
        try:
            result = await asyncio.to_thread(self._write, ticket, data)
        except BaseException:
            self._finish(ticket, _refused(f"{ticket.name} could not be written: see the service's log"))
            raise
        self._finish(ticket, result)
        return result

    def _finish(self, ticket: Ticket, result: UploadResult) -> None:
        if self.writing is ticket:
            self.writing = None
        if ticket.done is not None and not ticket.done.done():
            ticket.done.set_result(result)

    def _write(self, ticket: Ticket, frame) -> UploadResult:
        data = bytes(frame)  # the one copy, after every check of the name and the size, off the event loop
        ticket.sha256 = hashlib.sha256(data).hexdigest()
        try:
            return self._keep(ticket.name, ticket.model, data)
        except Refusal as e:
            return _refused(str(e))

    def _keep(self, name: str, model: str, data: bytes) -> UploadResult:
        try:
            source = read_tflite_source(Path(name), data)
            facts = graph_facts(source)
        except ImportRefused as e:
            raise Refusal(str(e)) from None
        if facts.task != "detection":
            raise Refusal(f"{name} is a {facts.task} model ({facts.why}): Frigate needs a detector, ending in "
                          "TFLite_Detection_PostProcess (model_type ssd, such as the SSD files its image ships) or a "
                          "YOLO head (model_type yolo-generic)")
        tensor = facts.input
        if tensor.type != "UINT8" or tensor.shape[3] != 3:
            raise Refusal(f"{name}'s input {tensor.name!r} is {tensor.type.lower()} {list(tensor.shape)}: Frigate "
                          "sends uint8 [1, height, width, 3] tensors (input_dtype int), which this model does not take")
        manifest, files = handed_over(model, source, facts, PROVENANCE, ROUTE, notes=[
            f"sent by a Frigate ZMQ client as {name!r} (model_data); Frigate keeps its own labelmap, so the classes "
            "are named by their ids here"])
        try:
            path = write_model_dir(self.root, manifest, files)
        except (OSError, ServeError) as e:
            raise Refusal(f"{name} could not be written to {self.root / model}: {e}") from None
        result = self._serve(name, model, path, source.compiled, written=True)
        self._uploaded()[model] = len(data)
        return result

    def _again(self, ticket: Ticket, sha256: str | None) -> UploadResult:
        """A directory of that name is here, not served: load it if it holds this very file as this door wrote it."""
        files = uploaded_files(ticket.directory)
        if files is None or sha256 not in files:
            return _refused(f"a model directory {ticket.model!r} is here already and holds another model: it is not "
                            f"replaced. Rename the file Frigate's model.path names, or remove {ticket.model}/ from "
                            "the model directory")
        try:
            return self._serve(ticket.name, ticket.model, ticket.directory, files[sha256] == EDGETPU, written=False)
        except Refusal as e:
            return _refused(str(e))

    def _serve(self, name: str, model: str, path: Path, compiled_only: bool, written: bool) -> UploadResult:
        try:
            self.add(path)
        except ServeError as e:
            if written:
                shutil.rmtree(path, ignore_errors=True)  # nothing left behind that the next start would fail on
            if compiled_only:
                raise Refusal(f"{name} is compiled for the Edge TPU only, and no Edge TPU serves here ({e}): not kept. "
                              "Send the plain .tflite it was compiled from (Frigate's /cpu_model.tflite for its "
                              "compiled SSD), or attach an Edge TPU and serve it there") from None
            if "served already" in str(e):
                raise Refusal(f"{e}: name a served model in Frigate's model.path, or rename the file") from None
            raise Refusal(f"{name} could not be loaded here: {e}; not kept") from None
        verb = "saved as" if written else "already here as"
        return UploadResult(saved=True, loaded=True, model=model, message=f"{name} {verb} model {model!r}: serving")

    # -- what is here -------------------------------------------------------------------------------------------

    def _directories(self) -> list[Path]:
        try:
            return [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            return []

    def _uploaded(self) -> dict[str, int]:
        """The models this door wrote into MODEL_DIR (read once, then kept up to date): name -> their files' bytes."""
        if self.uploaded is None:
            self.uploaded = {}
            for directory in self._directories():
                manifest = _manifest(directory)
                if manifest is not None and (manifest.get("build") or {}).get("route") == ROUTE:
                    self.uploaded[directory.name] = sum(int(f.get("bytes", 0))
                                                        for f in manifest.get("files", {}).values())
        return self.uploaded


def _manifest(directory: Path) -> dict | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def uploaded_files(directory: Path) -> dict[str, str] | None:
    """A directory this door wrote: its files' sha256 -> their kind (int8 or compiled); None for any other."""
    manifest = _manifest(directory)
    if manifest is None or (manifest.get("build") or {}).get("route") != ROUTE:
        return None
    files = manifest.get("files", {})
    kinds = {entry.get("sha256"): kind for kind, entry in files.items() if isinstance(entry, dict)}
    only_compiled = EDGETPU in files and INT8 not in files
    return {sha: (EDGETPU if only_compiled else kind) for sha, kind in kinds.items()}


def answering(name: str, model: str, served: Iterable[ServedDetector]) -> ServedDetector | None:
    """The served detector that already answers to `name` (its own name, or one of its files'), case aside."""
    wanted = {name.lower(), model.lower(), name.lower().removesuffix(".tflite")}
    base = name.replace("\\", "/").rsplit("/", 1)[-1].lower()
    return next((d for d in served if d.name.lower() in wanted or base in d.names), None)


def model_name_for(name: str) -> str:
    """The model directory a file name becomes: its stem, with what a model name cannot hold replaced by '_'."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    if not base.lower().endswith(".tflite"):
        raise Refusal(f"{name!r} is not a .tflite file: the Edge TPU and this service run TFLite models (give "
                      "Frigate's model.path a .tflite detector)")
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", base[:-len(".tflite")]).lstrip("._-")
    if not stem or stem.lower() == MANIFEST:
        raise Refusal(f"{name!r} makes no model name: name the file with letters and digits")
    return stem[:128]

