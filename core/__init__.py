"""The pure domain kernel of Fortis: what every service means by a task, an answer and the
IEEE Std 3129-2023 rules that judge answers, defined once.

Plain Python and numpy, the one error model (``fortis.client.errors``) and the generated
``fortis.common.v1`` messages the answers convert to and from (protobuf only): no service,
adapter, CLI or gRPC is imported here (an import-linter contract in pyproject.toml and tests/contract/
test_boundaries.py hold it), so every service, the CLI and tests can share these definitions
without depending on each other.

``task``      :class:`~fortis.core.task.Task`, the three kinds of image-recognition service.
``answers``   what a target answered for a batch of images, as arrays, one type per task
              (``from_proto`` / ``to_proto``: the target's Prediction messages).
``tensors``   numpy arrays <-> the ``fortis.common.v1.Tensor`` message.
``boxes``     detection box formats, their conversion to pixel xyxy and IoU (IEEE-C4).
``matching``  the IEEE-C4 object matching (batched) and the IEEE-C5 per-class IoU.
``criteria``  the plan's correctness criteria (IEEE-C1..C5) and attack criterion kinds, validated.
``strategy``  :class:`~fortis.core.strategy.TaskStrategy`: what each task means, one per task.
"""
