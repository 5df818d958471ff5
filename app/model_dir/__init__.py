"""The model directory: the unit of deployment shared by the converter and the service.

    models/<name>/
      model.json                   what the model is, how to feed it, where it came from
      labels.txt                   one label per line: line i names class i (a blank line: an id with no label)
      <name>_int8.tflite           full-integer model (cpu and emulated backends)
      <name>_int8_edgetpu.tflite   the same, compiled for the Edge TPU (when compiled)

A segmented model (python -m converter segment) has instead one file per segment, kinds
`int8_segment_<i>` (and `edgetpu_segment_<i>` when compiled), and a `segments` entry
listing them in order; the service runs it as a pipeline (app/pool/pipeline.py).

model.json is one validated format, read by the service and written by the converter:
  schema.py   the format: `Manifest` and the records the service reads (input, outputs, files, segments,
              provenance, the Edge TPU estimate), the file kinds and their names;
  records.py  what the converter measured and recorded (quality, quantization, the compile report): the
              service reads none of it, but validates it with the rest, so a model.json is refused whole
              or read whole, and serves the quality as it is;
  reading.py  a directory read and checked: `read_model_dir()`, `discover()`, the files' sha256;
  writing.py  a directory written whole, atomically, validated by `Manifest` first: the converter's builds and
              imports, and the models clients upload to the service (Frigate's ZMQ model transfer).
"""
