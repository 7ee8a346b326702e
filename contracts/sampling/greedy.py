"""Executable half of sampling/greedy: logits with many exact ties; reference = lowest index of the maximum."""

from __future__ import annotations

import torch


def make_inputs(axes, params, dtype, device, generator):
    rows, vocab = axes["B"], axes["V"]
    logits = torch.randn(rows, vocab, generator=generator, dtype=torch.float64) * 3
    for row in range(rows):
        if row % 2 == 0:
            logits[row] = torch.round(logits[row])  # quantised: ties everywhere, often at the maximum too
        top = int(logits[row].argmax())
        twin = (top + 1 + int(torch.randint(0, vocab - 1, (1,), generator=generator))) % vocab
        logits[row, twin] = logits[row, top]  # the maximum always shared, the twin before or after the original
    batch = {
        "logits": logits.to(dtype),
        "temperature": torch.zeros(rows, dtype=torch.float32),
        "top_k": torch.randint(-1, vocab + 2, (rows,), generator=generator, dtype=torch.int64).to(torch.int32),
        "top_p": (torch.rand(rows, generator=generator, dtype=torch.float64) * 0.9 + 0.1).to(torch.float32),
        "seeds": torch.randint(0, 2**62, (rows,), generator=generator, dtype=torch.int64),
    }
    return {name: tensor.to(device) for name, tensor in batch.items()}


def reference(logits, temperature, top_k, top_p, seeds):
    values = logits.double()
    out = torch.empty(values.shape[0], dtype=torch.int64)
    for row in range(values.shape[0]):
        maximum = values[row].max()
        out[row] = int(torch.nonzero(values[row] == maximum)[0, 0])  # the lowest id among the maxima
    return {"out": out}


def seeds_short(inputs, params):
    inputs["seeds"] = inputs["seeds"][:-1].clone()
    return inputs, params


def negative_temperature(inputs, params):
    inputs["temperature"] = inputs["temperature"].clone()
    inputs["temperature"][0] = -1.0
    return inputs, params


def logits_flat(inputs, params):
    inputs["logits"] = inputs["logits"].flatten().clone()
    return inputs, params


def top_k_float(inputs, params):
    inputs["top_k"] = inputs["top_k"].float()
    return inputs, params
