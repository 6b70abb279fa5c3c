"""The SDK's protobuf bodies: forward_backward requests in, forward_backward outputs and samples out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tinker.proto import tinker_public_pb2 as pb


@dataclass
class DatumIn:
    tokens: list[int]
    """The model input (text chunks concatenated)."""
    inputs: dict[str, np.ndarray]
    """``loss_fn_inputs`` by name, dense."""


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    data: list[DatumIn]
    forward_only: bool


_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


def _tensor(msg, where: str) -> np.ndarray:
    if msg.dtype not in _NUMPY:
        raise ValueError(f"{where}: dtype {msg.dtype} is not supported (float32 or int64)")
    dtype = _NUMPY[msg.dtype]
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):
        values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
        crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
        cols = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
        rows = len(crow) - 1
        dense = np.zeros((rows, shape[-1] if shape else int(cols.max(initial=-1)) + 1), dtype=dtype)
        for r in range(rows):
            dense[r, cols[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
        return dense.reshape(shape) if shape else dense
    arr = np.frombuffer(msg.dense, dtype=dtype).copy()
    return arr.reshape(shape) if shape else arr


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    config: dict[str, float | str] = dict(msg.loss_fn_config)
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise ValueError(f"data[{i}].model_input: {kind} chunks are not supported; send token ids (encoded_text)")
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        inputs = {name: _tensor(t, f"data[{i}].loss_fn_inputs.{name}") for name, t in d.loss_fn_inputs.items()}
        data.append(DatumIn(tokens, inputs))
    return ForwardBackwardCall(msg.model_id, msg.seq_id, msg.loss_fn, config, data, msg.forward_only)


def _batched(arrays: list[np.ndarray], dtype) -> pb.BatchedTensor:
    flat = [np.ascontiguousarray(a, dtype=dtype).ravel() for a in arrays]
    sizes = np.cumsum([0] + [a.nbytes for a in flat]).astype(np.int64)
    code = pb.DTYPE_FLOAT32 if dtype == np.float32 else pb.DTYPE_INT64
    data = b"".join(a.tobytes() for a in flat)
    return pb.BatchedTensor(data=data, offsets=sizes.tobytes(), dtype=code)


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """One ArrayRecord holding every datum's 1-D float32 fields, and the request's metrics."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in (outputs[0] if outputs else {}):
        record.fields[name].CopyFrom(_batched([o[name] for o in outputs], np.float32))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    return out.SerializeToString()


_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


def encode_sample_response(sequences: list[tuple[list[int], list[float], str]], prompt_logprobs: list[float] | None) -> bytes:
    """``sequences``: (token ids, log-probs, stop reason) per sample; prompt log-probs with NaN at position 0."""
    out = pb.SampleResponse()
    for tokens, logprobs, reason in sequences:
        out.sequences.add(stop_reason=_STOP[reason], tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
                          logprobs=np.asarray(logprobs, dtype=np.float32).tobytes())
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()
