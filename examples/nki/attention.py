"""Causal flash-attention forward (one head) in the public NKI style:
online softmax over 128-key blocks, never materializing the S x S scores.

    PYTHONPATH=build/python /usr/bin/python3 examples/nki/attention.py
"""
import numpy as np

import tern.nki as nki
import tern.nki.isa as nisa
import tern.nki.language as nl


@nki.jit
def flash_attention_fwd(qT, kT, v):
    """qT, kT [d, S] (transposed, d <= 128 on partitions), v [S, d]. Returns
    o [S, d] = softmax(q k^T / sqrt(d) + causal mask) v."""
    d, S = qT.shape
    T = nl.tile_size.pmax
    out = nl.ndarray((S, d), dtype=nl.float32, buffer=nl.shared_hbm)
    scale = 1.0 / float(np.sqrt(d))
    for i in nl.affine_range(S // T):
        q = nl.load(qT[:, i * T:(i + 1) * T])
        m = nl.full((T, 1), -3.0e38, dtype=nl.float32)  # running max
        l = nl.zeros((T, 1), dtype=nl.float32)          # running sum
        o = nl.zeros((T, d), dtype=nl.float32)          # unnormalized output
        for j in nl.affine_range(i + 1):                # causal: key blocks up to the diagonal
            k = nl.load(kT[:, j * T:(j + 1) * T])
            vj = nl.load(v[j * T:(j + 1) * T, :])
            s_psum = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=s_psum, stationary=q, moving=k)   # q k^T: [queries, keys]
            s = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=s, op=nl.copy_fn, data=s_psum, scale=scale)
            if j == i:  # the diagonal block: keep key <= query (partition p - column i >= 0)
                nisa.affine_select(dst=s, pattern=[[-1, T]], offset=0, channel_multiplier=1, on_true_tile=s,
                                   on_false_value=-3.0e38, cmp_op=nl.greater_equal)
            m_new = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=m_new, op=nl.maximum, data=s, axis=1)
            nisa.tensor_tensor(dst=m_new, data1=m_new, data2=m, op=nl.maximum)
            neg = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg, data=m_new, op0=nl.multiply, operand0=-1.0)
            p = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.sbuf)
            rowsum = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=p, op=nl.exp, data=s, bias=neg, reduce_op=nl.add, reduce_res=rowsum)
            corr = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=corr, op=nl.exp, data=m, bias=neg)  # exp(m_old - m_new)
            nisa.tensor_scalar(dst=l, data=l, op0=nl.multiply, operand0=corr)
            nisa.tensor_tensor(dst=l, data1=l, data2=rowsum, op=nl.add)
            pT_psum = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(dst=pT_psum, data=p)                 # [keys, queries]
            pT = nl.copy(pT_psum)
            pv = nl.ndarray((T, d), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=pv, stationary=pT, moving=vj)       # p @ v_j
            nisa.tensor_scalar(dst=o, data=o, op0=nl.multiply, operand0=corr)
            nisa.tensor_tensor(dst=o, data1=o, data2=pv, op=nl.add)
            m = m_new
        inv = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=l)
        nisa.tensor_scalar(dst=o, data=o, op0=nl.multiply, operand0=inv)
        nl.store(out[i * T:(i + 1) * T, :], value=o)
    return out


def reference(q, k, v):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ k.T / np.sqrt(q.shape[1])
    s = s + np.triu(np.full(s.shape, -np.inf), k=1)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True) @ v).astype(np.float32)


def main():
    rng = np.random.default_rng(0)
    S, d = 384, 64
    q, k, v = (rng.standard_normal((S, d), dtype=np.float32) for _ in range(3))
    o = flash_attention_fwd(np.ascontiguousarray(q.T), np.ascontiguousarray(k.T), v)
    err = np.abs(o - reference(q, k, v)).max()
    assert err < 1e-4, err
    print(f"causal flash attention: ok (max error {err:.1e}), {flash_attention_fwd.last['latency_us']:.2f} us")


if __name__ == "__main__":
    main()
