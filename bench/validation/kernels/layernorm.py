"""LayerNorm over the rows of a 2-D fp32 tensor, in the legacy NKI generation.

layernorm_v1 reproduces version 1 of the AWS NKI LayerNorm tutorial
(nki.language only): mean and E[x^2] with nl.mean, var = E[x^2] - mean^2,
then (x - mean) * rsqrt(var + eps) * gamma + beta with tile arithmetic.

layernorm_v2 reproduces version 2: the statistics come from nisa.bn_stats
(one per 512-column chunk) and nisa.bn_aggr, and the shift and scale are one
nisa.tensor_scalar with two ALU ops.

Both take (input_tensor, epsilon, gamma_vector, beta_vector), as the
tutorial does, with input [rows, cols] and gamma / beta [cols]. Rows are
tiled by 128 partitions; the last tile is masked when rows is not a multiple
of 128.

Run with tern: tern.nki.install() must be called before this module is
imported (it makes `neuronxcc.nki` resolve to tern's legacy generation).
"""
import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


def _affine_rows(vec, ncols, part_idx, col_idx):
    """gamma or beta [cols] loaded into one partition then spread over the
    128 partitions, so the Vector engine can use it as a tensor operand."""
    row = nl.load(vec.reshape((1, ncols))[part_idx, col_idx])
    return row.broadcast_to((nl.tile_size.pmax, ncols))


@nki.jit
def layernorm_v1(input_tensor, epsilon, gamma_vector, beta_vector):
    nrows, ncols = input_tensor.shape
    assert gamma_vector.shape[0] == ncols and beta_vector.shape[0] == ncols
    result = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)

    pmax = nl.tile_size.pmax
    p_idx = nl.arange(pmax)[:, None]
    c_idx = nl.arange(ncols)[None, :]
    one_idx = nl.arange(1)[:, None]

    # gamma / beta are shared by every row tile: load and broadcast once.
    scale_rows = _affine_rows(gamma_vector, ncols, one_idx, c_idx)
    shift_rows = _affine_rows(beta_vector, ncols, one_idx, c_idx)

    for t in nl.affine_range(math.ceil(nrows / pmax)):
        row = t * pmax + p_idx
        in_range = row < nrows
        xt = nl.load(input_tensor[row, c_idx], mask=in_range)

        mu = nl.mean(xt, axis=1)
        # var = E[x^2] - E[x]^2 keeps the statistics to two passes over x.
        sq_mean = nl.mean(nl.square(xt), axis=1)
        var = sq_mean - mu * mu

        normed = (xt - mu) * nl.rsqrt(var + epsilon)
        yt = normed * scale_rows + shift_rows

        nl.store(result[row, c_idx], value=yt, mask=in_range)
    return result


@nki.jit
def layernorm_v2(input_tensor, epsilon, gamma_vector, beta_vector):
    nrows, ncols = input_tensor.shape
    assert gamma_vector.shape[0] == ncols and beta_vector.shape[0] == ncols
    result = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)

    pmax = nl.tile_size.pmax
    p_idx = nl.arange(pmax)[:, None]
    c_idx = nl.arange(ncols)[None, :]
    one_idx = nl.arange(1)[:, None]

    scale_rows = _affine_rows(gamma_vector, ncols, one_idx, c_idx)
    shift_rows = _affine_rows(beta_vector, ncols, one_idx, c_idx)

    # bn_stats takes at most bn_stats_fmax columns and emits 6 values each.
    chunk = nl.tile_size.bn_stats_fmax
    n_chunks = math.ceil(ncols / chunk)
    chunk_idx = nl.arange(chunk)[None, :]
    stat_idx = nl.arange(6)[None, :]
    all_stats_idx = nl.arange(6 * n_chunks)[None, :]

    for t in nl.affine_range(math.ceil(nrows / pmax)):
        row = t * pmax + p_idx
        in_range = row < nrows
        xt = nl.load(input_tensor[row, c_idx], mask=in_range)

        partial = nl.ndarray((pmax, 6 * n_chunks), dtype=np.float32)
        for c in nl.affine_range(n_chunks):
            col = c * chunk + chunk_idx
            partial[p_idx, c * 6 + stat_idx] = nisa.bn_stats(
                xt[p_idx, col], mask=(col < ncols), dtype=np.float32)

        # bn_aggr folds the per-chunk statistics into [mean, var] per row.
        moments = nisa.bn_aggr(partial[p_idx, all_stats_idx])
        mu = moments[p_idx, 0]
        inv_std = nl.rsqrt(moments[p_idx, 1] + epsilon)

        # One Vector instruction does both the shift and the scale.
        normed = nisa.tensor_scalar(data=xt, op0=np.subtract, operand0=mu,
                                    op1=np.multiply, operand1=inv_std)
        yt = normed * scale_rows + shift_rows

        nl.store(result[row, c_idx], value=yt, mask=in_range)
    return result
