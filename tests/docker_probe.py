"""Run inside an image's container (tests/test_docker.py): what the image computes, to compare
across architectures byte for byte. For every model in /models and every photo in /photos: the
sha256 of the preprocessed input tensor (app.imaging, as the service prepares it) and the bytes of
the CPU interpreter's outputs (ai-edge-litert, XNNPACK, one thread), each output by name; a
detector's rows only up to its count (the kernel leaves the rows after it as they were). Prints
one JSON object."""

import hashlib
import json
import sys
from pathlib import Path

from ai_edge_litert.interpreter import Interpreter

from app.imaging import prepare
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import read_model_dir
from app.model_dir.schema import int8_filename

MAX_PIXELS = 50_000_000


def main(models: Path, photos: Path) -> dict:
    found = {}
    for directory in sorted(p for p in models.iterdir() if (p / "model.json").is_file()):
        model = read_model_dir(directory)
        spec = model.manifest.input
        interpreter = Interpreter(str(directory / int8_filename(directory.name)), num_threads=1)
        interpreter.allocate_tensors()
        (given,), outputs = interpreter.get_input_details(), interpreter.get_output_details()
        count = model.manifest.outputs.get("count")  # a detector's: how many rows are its answer
        scale, zero_point = given["quantization"]
        quantizer = InputQuantizer(spec, given["dtype"], scale, zero_point)
        for photo in sorted(photos.iterdir()):
            tensor = quantizer(prepare(photo.read_bytes(), spec, MAX_PIXELS)).reshape(given["shape"])
            interpreter.set_tensor(given["index"], tensor)
            interpreter.invoke()
            values = {d["name"]: interpreter.get_tensor(d["index"]) for d in outputs}
            rows = int(values[count][0]) if count else None
            found.setdefault(directory.name, {})[photo.name] = {
                "tensor_sha256": hashlib.sha256(tensor.tobytes()).hexdigest(),
                "outputs": {name: (value if rows is None or name == count else value[:, :rows]).tobytes().hex()
                            for name, value in values.items()},
            }
    return found


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
