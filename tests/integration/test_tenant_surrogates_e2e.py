"""A tenant's own surrogate end to end (IEEE-A7 transfer attacks, IEEE-P6 label mapping), over
real loopback gRPC with the real upload API and the real services:

- tenant A uploads an ONNX classifier (the project's Fashion-MNIST surrogate exported with
  torch.onnx, its classes in a different order and under other names) through UploadService,
  defines it in the plan with a label_map by name, and runs PGD on it against the
  Fashion-MNIST target: the evaluation succeeds and the report lists the transfer setting on
  that surrogate;
- tenant B naming A's blob gets exactly what an unknown blob gets (no such upload of this
  tenant, naming the plan's surrogates[0].model, refused when the plan is submitted);
- an ensemble ``surrogate: [fmnist-surrogate, my-net]`` runs;
- a definition taking a built-in's name is refused at validation, naming the field.
"""

from __future__ import annotations

import io
import json

import pytest
import torch
from fortis.client import FortisClient
from fortis.client.errors import InvalidArgument

from tests.conftest import API_KEY, OTHER_KEY

pytestmark = pytest.mark.slow

# The surrogate's own order and names: reversed, lower-case (IEEE-P6: another label set).
_TARGET = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot"]
_OWN = [n.lower() for n in reversed(_TARGET)]


class _Reversed(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).flip(1)


def _onnx(fmnist_surrogate) -> bytes:
    buf = io.BytesIO()
    torch.onnx.export(_Reversed(fmnist_surrogate.model).eval(), torch.zeros(1, 1, 28, 28), buf,
                      dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    return buf.getvalue()


def _plan(blob_id: str, surrogate: str, name: str = "my-net", n: int = 24) -> str:
    label_map = ", ".join(f'"{o}": "{o.capitalize() if o != "t-shirt/top" else "T-shirt/top"}"'
                          for o in _OWN)
    return f"""
name: tenant-surrogate
seed: 7
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: {n}}}
surrogates:
  - name: {name}
    model: "{blob_id}"
    format: onnx
    input: {{height: 28, width: 28, channels: 1}}
    labels: {json.dumps(_OWN)}
    label_map: {{{label_map}}}
attacks:
  - {{id: pgd, surrogate: {surrogate}, params: {{epsilon: 0.1, steps: 5}}}}
"""


def test_tenant_onnx_surrogate_pgd_isolation_and_ensemble(stack, fmnist_surrogate) -> None:
    data = _onnx(fmnist_surrogate)
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        blob = fc.upload(data, kind="model")
        assert blob.kind == "model" and blob.size == len(data)
        plan = _plan(blob.blob_id, "my-net")
        assert fc.validate(plan)["plan_name"] == "tenant-surrogate"
        ev = fc.wait(fc.submit(plan).evaluation_id, timeout_s=300)
        assert ev.state.value == "SUCCEEDED", ev.error
        report = fc.report(ev.evaluation_id)
        text = json.dumps(report)
        assert "my-net" in text and blob.blob_id in text
        tests = [t for t in report.get("tests", []) if t.get("id") == "pgd"]
        assert tests and tests[0].get("surrogate") == "my-net", tests
        accuracy = float(ev.summary["accuracy"])
        print("PGD", tests[0], json.dumps(report["metrics"].get("attacks", report["metrics"].get("transfer_attacks", {})))[:600])

        ens = fc.wait(fc.submit(_plan(blob.blob_id, "[fmnist-surrogate, my-net]"))
                      .evaluation_id, timeout_s=300)
        assert ens.state.value == "SUCCEEDED", ens.error
        ens_tests = [t for t in fc.report(ens.evaluation_id).get("tests", [])
                     if t.get("id") == "pgd"]
        assert ens_tests[0].get("surrogate") == "fmnist-surrogate + my-net", ens_tests
        print(f"clean accuracy {accuracy}; summaries: {dict(ev.summary)} / {dict(ens.summary)}")

        # a built-in's name is refused at validation, naming the field
        with pytest.raises(InvalidArgument) as e:
            fc.validate(_plan(blob.blob_id, "fmnist-surrogate", name="fmnist-surrogate"))
        assert "surrogates[0].name" in [v.field for v in e.value.violations]
        # an unknown target label in the map: refused naming the map entry
        with pytest.raises(InvalidArgument) as e:
            fc.validate(_plan(blob.blob_id, "my-net").replace('"bag": "Bag"', '"bag": "Purse"'))
        assert [v.field for v in e.value.violations] == ["surrogates[0].label_map.bag"]

    unknown = "sha256:" + "0" * 64
    with FortisClient(stack.address, api_key=OTHER_KEY) as fb:
        answers = []
        for blob_id in (blob.blob_id, unknown):
            # refused when submitted (ValidatePlan checks what the run would load), naming
            # the plan's field; nothing is stored
            with pytest.raises(InvalidArgument) as refused:
                fb.submit(_plan(blob_id, "my-net", n=4))
            answers.append(str(refused.value).replace(blob_id, "<id>"))
        assert answers[0] == answers[1], answers          # foreign == unknown
        assert answers[0].startswith("surrogates[0].model:")
        assert "no such upload" in answers[0]
