"""The embedding kernels (indirect DMA gather / scatter-add, built through
the kernel registry) against PyTorch: torch.nn.functional.embedding forward,
and its autograd weight gradient for the backward, FP32."""
import numpy as np
import pytest
import torch

from tern import _core


def bf16(x):
    """Round float32 values to bfloat16 (nearest even), kept as float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def token_ids(rng, tokens, vocab):
    """Random ids with the table's ends and a run of one id inside the first
    128-token tile (duplicates within one scatter as well as across)."""
    ids = rng.integers(0, vocab, size=tokens)
    ids[1 : min(tokens, 30)] = ids[min(1, tokens - 1)]
    ids[0], ids[-1] = 0, vocab - 1
    return ids


def run(chip_name, name, inputs, output, **params):
    chip = _core.load_chip(chip_name)
    sim = _core.Simulator(chip)
    sim.load(_core.build_kernel(chip, name, **params))
    for k, v in inputs.items():
        # The simulator takes float values and encodes them into each
        # tensor's dtype: int32 for the ids (exact below 2^24).
        sim.write(k, np.asarray(v, np.float32))
    sim.run()
    return sim.read(output)


@pytest.mark.parametrize(
    "chip,tokens,vocab,dim,dtype,cores",
    [("trn3", 300, 1000, 200, "fp32", 2), ("trn2", 129, 37, 4100, "fp32", 1), ("trn3", 200, 50, 64, "bf16", 3), ("trn1", 1, 1, 1, "fp32", 1)],
)
def test_forward_equals_torch(chip, tokens, vocab, dim, dtype, cores):
    rng = np.random.default_rng(1)
    ids = token_ids(rng, tokens, vocab)
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    if dtype == "bf16":
        table = bf16(table)
    got = run(chip, "embedding", {"ids": ids, "table": table}, "out", tokens=tokens, vocab=vocab, dim=dim, dtype=dtype, cores=cores)
    want = torch.nn.functional.embedding(torch.from_numpy(ids), torch.from_numpy(table)).numpy()
    # A gather moves bytes: exact.
    assert np.array_equal(got.reshape(tokens, dim).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    "chip,tokens,vocab,dim,cores",
    [("trn3", 300, 7, 96, 2), ("trn3", 2500, 300, 130, 2), ("trn3", 5000, 300, 64, 2), ("trn2", 129, 1000, 33, 1), ("trn3", 1, 1, 1, 1)],
)
def test_backward_equals_torch_autograd(chip, tokens, vocab, dim, cores):
    """dtable = d/dtable sum(embedding(ids, table) * dout). PyTorch's CPU
    backward adds each token's row in token order in FP32 (also past 3000
    tokens, where it switches code paths), as the
    kernel does (zero start, one rounding per add), so the bits agree; a
    different summation order would miss by a few ulps (see
    tests/kernel/test_embedding.cpp, ReverseOrderDiffers)."""
    rng = np.random.default_rng(2)
    ids = token_ids(rng, tokens, vocab)
    dout = rng.standard_normal((tokens, dim)).astype(np.float32)
    weight = torch.zeros((vocab, dim), dtype=torch.float32, requires_grad=True)
    torch.nn.functional.embedding(torch.from_numpy(ids), weight).backward(torch.from_numpy(dout))
    want = weight.grad.numpy()
    got = run(chip, "embedding_backward", {"ids": ids, "dout": dout}, "dtable", tokens=tokens, vocab=vocab, dim=dim, dtype="fp32", cores=cores)
    assert np.array_equal(got.reshape(vocab, dim).view(np.uint32), want.view(np.uint32))


def test_out_of_range_id_is_a_clear_error():
    ids = np.array([0, 5, 2], np.int64)
    table = np.ones((5, 4), np.float32)
    with pytest.raises(Exception, match=r"dma_gather.*index 5 at \[1, 0\].*rows \[0, 5\)"):
        run("trn3", "embedding", {"ids": ids, "table": table}, "out", tokens=3, vocab=5, dim=4, dtype="fp32")
