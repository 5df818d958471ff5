"""The Open Inference Protocol (KServe v2) REST API: wire format (wire.py), the v2 view of a
model and one request through the core (infer.py), errors (errors.py), routes (router.py)."""
