"""The selective-scan (SSM) core of a Mamba-v1 layer, in the legacy NKI generation.

    out[b, c, t] = sum_s C[b, s, t] * h[b, c, s, t]
    h[b, c, s, t] = exp(delta[b, c, t] * A[c, s]) * h[b, c, s, t-1]
                    + delta[b, c, t] * u[b, c, t] * B[b, s, t]      (h[..., -1] = 0)

Inputs: delta, u [batch, channels, seq_len]; A [channels, state_size];
B, C [batch, state_size, seq_len]; all fp32. Channels go on the 128
partitions, seq_len on the free axis, so exp(delta * A) is one Scalar
activation with a per-partition scale, B and C are partition-broadcast rows,
and the recurrence over t is one Vector tensor_tensor_scan per tile.

mamba_v1 reproduces mamba_v1 of the AWS NKI "Fused Mamba" tutorial: loops
batch > state > channel tile, so delta and u are loaded again for every
state; one accumulator holds all channel tiles, stored after all states.

mamba_v2 reproduces mamba_v2 (loop reordering): batch > channel tile > state,
delta and u loaded once per channel tile, a [128, seq_len] accumulator per
channel tile stored when its states are done.

mamba_v3 reproduces mamba_v3 (seq_len tiling): as v2, with an innermost loop
over 512-column chunks of seq_len; the scan carries its last column into the
next chunk through `initial`, and the C product goes to a PSUM tile that is
then added into the SBUF accumulator.

mamba_v2_inplace is not a tutorial version: mamba_v2's instructions and DMAs
with results written over dead input tiles, for the seq_lens where
mamba_v2's tiles do not fit in tern's SBUF (tern does not spill).

Run with tern: tern.nki.install() must be called before this module is
imported (it makes `neuronxcc.nki` resolve to tern's legacy generation).
"""
import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
# The current generation's nki.isa (dst= forms), used only by mamba_v2_inplace.
import nki.isa as nisa_dst

# seq_len chunk of mamba_v3: the tutorial's choice (full Vector utilisation
# was seen at seq_len 512 before tiling).
SEQ_CHUNK = 512

# tern frees a tile when the kernel drops its last reference to it, so a
# tile rebound in a loop (acc = nl.zeros(...) in the next iteration) is
# double-buffered: the new one is placed while the old one is still held.
# When that does not fit, tern frees every tile at its last use instead
# (what the compiler's liveness gives). RELEASE_CHANNEL_TILES = True drops
# delta, u and acc after each channel tile's store; it changes no
# instruction or DMA, only where tern places tiles (check.py runs both).
# Off by default: the kernels then read as the tutorial's.
RELEASE_CHANNEL_TILES = False


@nki.jit
def mamba_v1(delta, u, A, B, C):
    nbatch, nchan, seqlen = delta.shape
    nstate = A.shape[1]
    pmax = nl.tile_size.pmax
    assert nchan % pmax == 0
    ntiles = nchan // pmax
    out = nl.ndarray((nbatch, nchan, seqlen), dtype=delta.dtype, buffer=nl.shared_hbm)

    for b in nl.affine_range(nbatch):
        acc = nl.zeros((ntiles, nl.par_dim(pmax), seqlen), dtype=delta.dtype)
        for s in nl.affine_range(nstate):
            for ct in nl.affine_range(ntiles):
                c0 = ct * pmax
                # Channel tiles innermost: delta and u come in again for every state.
                d_tile = nl.load(delta[b, c0:c0 + pmax, 0:seqlen])
                a_col = nl.load(A[c0:c0 + pmax, s])
                # exp(delta * A[c, s]): the per-partition multiply rides on the activation.
                decay = nisa.activation(op=nl.exp, data=d_tile, scale=a_col)

                u_tile = nl.load(u[b, c0:c0 + pmax, 0:seqlen])
                b_row = nl.load(B[b, s:s + 1, 0:seqlen])
                du = nisa.tensor_tensor(d_tile, u_tile, op=nl.multiply)
                b_full = b_row.broadcast_to((pmax, seqlen))
                dbu = nisa.tensor_tensor(du, b_full, op=nl.multiply)

                # h[t] = decay[t] * h[t-1] + dbu[t] along the row, one instruction.
                hidden = nisa.tensor_tensor_scan(decay, dbu, initial=0, op0=np.multiply, op1=np.add)

                c_row = nl.load(C[b, s:s + 1, 0:seqlen])
                c_full = c_row.broadcast_to((pmax, seqlen))
                contrib = nisa.tensor_tensor(hidden, c_full, op=nl.multiply)
                # The sum over states is a loop-carried add into the accumulator.
                acc[ct, 0:pmax, 0:seqlen] += contrib

        for ct in nl.affine_range(ntiles):
            c0 = ct * pmax
            nl.store(out[b, c0:c0 + pmax, 0:seqlen], acc[ct, 0:pmax, 0:seqlen])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    nbatch, nchan, seqlen = delta.shape
    nstate = A.shape[1]
    pmax = nl.tile_size.pmax
    assert nchan % pmax == 0
    ntiles = nchan // pmax
    out = nl.ndarray((nbatch, nchan, seqlen), dtype=delta.dtype, buffer=nl.shared_hbm)

    for b in nl.affine_range(nbatch):
        for ct in nl.affine_range(ntiles):
            c0 = ct * pmax
            acc = nl.zeros((nl.par_dim(pmax), seqlen), dtype=delta.dtype)
            # delta and u stay resident across all states of this channel tile.
            d_tile = nl.load(delta[b, c0:c0 + pmax, 0:seqlen])
            u_tile = nl.load(u[b, c0:c0 + pmax, 0:seqlen])
            for s in nl.affine_range(nstate):
                a_col = nl.load(A[c0:c0 + pmax, s])
                decay = nisa.activation(op=nl.exp, data=d_tile, scale=a_col)

                b_row = nl.load(B[b, s:s + 1, 0:seqlen])
                du = nisa.tensor_tensor(d_tile, u_tile, op=nl.multiply)
                b_full = b_row.broadcast_to((pmax, seqlen))
                dbu = nisa.tensor_tensor(du, b_full, op=nl.multiply)

                hidden = nisa.tensor_tensor_scan(decay, dbu, initial=0, op0=np.multiply, op1=np.add)

                c_row = nl.load(C[b, s:s + 1, 0:seqlen])
                c_full = c_row.broadcast_to((pmax, seqlen))
                contrib = nisa.tensor_tensor(hidden, c_full, op=nl.multiply)
                acc[0:pmax, 0:seqlen] += contrib
            nl.store(out[b, c0:c0 + pmax, 0:seqlen], acc[0:pmax, 0:seqlen])
            if RELEASE_CHANNEL_TILES:
                del acc, d_tile, u_tile
    return out


@nki.jit
def mamba_v3(delta, u, A, B, C):
    nbatch, nchan, seqlen = delta.shape
    nstate = A.shape[1]
    pmax = nl.tile_size.pmax
    w = SEQ_CHUNK
    assert nchan % pmax == 0 and seqlen % w == 0
    ntiles, nchunks = nchan // pmax, seqlen // w
    out = nl.ndarray((nbatch, nchan, seqlen), dtype=delta.dtype, buffer=nl.shared_hbm)

    for b in nl.affine_range(nbatch):
        for ct in nl.affine_range(ntiles):
            c0 = ct * pmax
            acc = nl.zeros((nl.par_dim(pmax), seqlen), dtype=delta.dtype)
            d_tile = nl.load(delta[b, c0:c0 + pmax, 0:seqlen])
            u_tile = nl.load(u[b, c0:c0 + pmax, 0:seqlen])
            for s in nl.affine_range(nstate):
                a_col = nl.load(A[c0:c0 + pmax, s])
                # The scan state handed from one chunk to the next.
                carry = nl.zeros((pmax, 1), dtype=d_tile.dtype)
                # Chunks depend on each other through `carry`: a static loop.
                for k in nl.static_range(nchunks):
                    t0 = k * w
                    d_part = d_tile[0:pmax, t0:t0 + w]
                    decay = nisa.activation(op=nl.exp, data=d_part, scale=a_col)

                    b_row = nl.load(B[b, s:s + 1, t0:t0 + w])
                    du = nisa.tensor_tensor(d_part, u_tile[0:pmax, t0:t0 + w], op=nl.multiply)
                    b_full = b_row.broadcast_to((pmax, w))
                    dbu = nisa.tensor_tensor(du, b_full, op=nl.multiply)

                    hidden = nisa.tensor_tensor_scan(decay, dbu, initial=carry, op0=np.multiply, op1=np.add)
                    carry[...] = hidden[0:pmax, w - 1]

                    c_row = nl.load(C[b, s:s + 1, t0:t0 + w])
                    c_full = c_row.broadcast_to((pmax, w))
                    # The product lands in PSUM, so the add into the SBUF
                    # accumulator reads one operand from each memory.
                    prod = nl.ndarray((pmax, w), dtype=delta.dtype, buffer=nl.psum)
                    prod[...] = nisa.tensor_tensor(hidden, c_full, op=nl.multiply)
                    acc[0:pmax, t0:t0 + w] += prod
            nl.store(out[b, c0:c0 + pmax, 0:seqlen], acc[0:pmax, 0:seqlen])
            if RELEASE_CHANNEL_TILES:
                del acc, d_tile, u_tile
    return out


@nki.jit
def mamba_v2_inplace(delta, u, A, B, C):
    """mamba_v2 with the same instructions and DMAs, each [128, seq_len]
    result written over an input tile that is dead after it (the current
    API's dst=), and delta * u * B formed as (delta * B) * u so the product
    can build up in the broadcast B tile. tern keeps every tile in SBUF
    (the NKI compiler spills to HBM instead), and at seq_len 8192 fp32
    mamba_v2's live tiles do not fit; this form needs five [128, seq_len]
    buffers at a time instead of seven."""
    nbatch, nchan, seqlen = delta.shape
    nstate = A.shape[1]
    pmax = nl.tile_size.pmax
    assert nchan % pmax == 0
    ntiles = nchan // pmax
    out = nl.ndarray((nbatch, nchan, seqlen), dtype=delta.dtype, buffer=nl.shared_hbm)

    for b in nl.affine_range(nbatch):
        for ct in nl.affine_range(ntiles):
            c0 = ct * pmax
            acc = nl.zeros((nl.par_dim(pmax), seqlen), dtype=delta.dtype)
            d_tile = nl.load(delta[b, c0:c0 + pmax, 0:seqlen])
            u_tile = nl.load(u[b, c0:c0 + pmax, 0:seqlen])
            for s in nl.affine_range(nstate):
                a_col = nl.load(A[c0:c0 + pmax, s])
                decay = nisa.activation(op=nl.exp, data=d_tile, scale=a_col)

                b_row = nl.load(B[b, s:s + 1, 0:seqlen])
                dbu = b_row.broadcast_to((pmax, seqlen))
                nisa_dst.tensor_tensor(dst=dbu, data1=d_tile, data2=dbu, op=nl.multiply)
                nisa_dst.tensor_tensor(dst=dbu, data1=dbu, data2=u_tile, op=nl.multiply)

                # The scan result replaces decay, the C product replaces it again.
                nisa_dst.tensor_tensor_scan(dst=decay, data0=decay, data1=dbu, initial=0,
                                            op0=np.multiply, op1=np.add)
                c_row = nl.load(C[b, s:s + 1, 0:seqlen])
                c_full = c_row.broadcast_to((pmax, seqlen))
                nisa_dst.tensor_tensor(dst=decay, data1=decay, data2=c_full, op=nl.multiply)
                acc[0:pmax, 0:seqlen] += decay
            nl.store(out[b, c0:c0 + pmax, 0:seqlen], acc[0:pmax, 0:seqlen])
            if RELEASE_CHANNEL_TILES:
                del acc, d_tile, u_tile
    return out
