"""Run by tests/test_v2_clients.py in the KServe client's own venv: classify one photo through
/v2 with kserve's InferenceRESTClient and print what came back as JSON.

usage: kserve_classify.py URL MODEL IMAGE_PATH
"""

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(url: str, model: str, image: str) -> dict:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    try:
        live = await client.is_server_live(url)
        ready = await client.is_server_ready(url)
        model_ready = await client.is_model_ready(url, model)
        data = np.array([open(image, "rb").read()], dtype=np.object_)
        tensor = InferInput(name="image", shape=[1], datatype="BYTES")
        tensor.set_data_from_numpy(data, binary_data=True)
        response = await client.infer(url, InferRequest(model_name=model, infer_inputs=[tensor]), model_name=model)
        scores = next(o for o in response.outputs if o.name == "scores").as_numpy()
        top5 = np.argsort(-scores[0], kind="stable")[:5].tolist()
        return {"live": live, "ready": ready, "model_ready": model_ready, "top5": top5,
                "parameters": response.parameters}
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4])), default=str))
