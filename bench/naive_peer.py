"""A naive peer, for side-by-side figures only: written here as a faithful equivalent of
robmarkcole's tensorflow-lite-rest-server (FastAPI; one interpreter invoked on the event loop;
the multipart upload opened by Pillow and stretched to the input size; top-1), moved onto
ai-edge-litert and pointed at our default model. Not a copy of its code; not part of the product.

PEER_PREPROCESS=exact (with the repository on PYTHONPATH) makes it a fairer peer: the image goes through
our own preprocessing (app.imaging: the center crop scaled to the model's input, the same tensor bytes
the service hands its interpreter) instead of the stretch, so the two differ only in the serving around it.

    PEER_MODEL=models/efficientnet_lite0/efficientnet_lite0_int8.tflite PEER_PORT=5000 python bench/naive_peer.py
"""

import io
import os

import numpy as np
import uvicorn
from ai_edge_litert.interpreter import Interpreter
from fastapi import FastAPI, File, UploadFile
from PIL import Image

MODEL = os.environ["PEER_MODEL"]
LABELS = [line.strip() for line in open(os.path.join(os.path.dirname(MODEL), "labels.txt"))]

app = FastAPI()
interpreter = Interpreter(model_path=MODEL, num_threads=1)  # one thread, as our WORKERS=1 CPU_THREADS=1
interpreter.allocate_tensors()
input_details = interpreter.get_input_details()
output_details = interpreter.get_output_details()
height, width = input_details[0]["shape"][1:3]


if os.environ.get("PEER_PREPROCESS") == "exact":
    from app.imaging import prepare
    from app.imaging.decoding import reuse_image_buffers
    from app.imaging.quantization import InputQuantizer
    from app.model_dir.reading import read_model_dir

    SPEC = read_model_dir(os.path.dirname(MODEL)).manifest.input
    QUANTIZER = InputQuantizer(SPEC, input_details[0]["dtype"], *input_details[0]["quantization"])
    reuse_image_buffers()

    def to_tensor(contents: bytes) -> np.ndarray:
        return QUANTIZER(prepare(contents, SPEC, 50_000_000))
else:
    def to_tensor(contents: bytes) -> np.ndarray:
        picture = Image.open(io.BytesIO(contents)).convert("RGB").resize((width, height))
        return np.expand_dims(picture, axis=0)


@app.post("/v1/vision/scene")
async def predict_scene(image: UploadFile = File(...)):
    contents = await image.read()
    interpreter.set_tensor(input_details[0]["index"], to_tensor(contents))
    interpreter.invoke()
    output = interpreter.get_tensor(output_details[0]["index"])[0]
    scale, zero_point = output_details[0]["quantization"]
    best = int(np.argmax(output))
    return {"success": True, "label": LABELS[best], "confidence": float(scale * (int(output[best]) - zero_point))}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PEER_PORT", "5000")), log_level="warning",
                access_log=False)
