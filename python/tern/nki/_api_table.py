"""The table of NKI calls and their arguments, both generations, with what
tern supports: generated from the code (signatures, and the status each
call declares), so docs/nki.md cannot drift from it (a test compares).

    PYTHONPATH=build/python /usr/bin/python3 -m tern.nki._api_table > table.md
"""
import inspect

# The public API's names (NKI API reference, current and legacy), so calls
# tern lacks are listed too.
CURRENT_ISA = """activation activation_reduce activate2 affine_select bn_aggr bn_stats core_barrier dma_compute dma_copy
dma_transpose dropout exponential get_nc_version iota local_gather max8 memset nc_find_index8 nc_match_replace8
nc_matmul nc_matmul_mx nc_n_gather nc_stream_shuffle nc_transpose nonzero_with_count quantize_mx rand2
rand_get_state rand_set_state range_select reciprocal register_alloc register_load register_move register_store
rng scalar_load scalar_store scalar_tensor_tensor select_reduce sendrecv sequence_bounds set_rng_seed
tensor_copy tensor_copy_predicated
tensor_partition_reduce tensor_reduce tensor_scalar tensor_scalar_cumulative tensor_scalar_reduce tensor_tensor
tensor_tensor_scan""".split()
LANGUAGE = """ndarray zeros ones full empty_like zeros_like ones_like full_like load store copy load_transpose2d
shared_constant shared_identity_matrix matmul transpose mean where loop_reduce program_id num_programs program_ndim
affine_range sequential_range static_range dynamic_range range fori_loop while_loop no_reorder ds arange mgrid
par_dim spmd_dim nc device_print NKIObject finfo static_cast dropout rand random_seed all_reduce softmax broadcast_to
gather_flattened exp log tanh sigmoid gelu gelu_apprx_tanh gelu_apprx_sigmoid gelu_dx gelu_apprx_sigmoid_dx silu
silu_dx relu rsqrt sqrt square reciprocal sin cos arctan erf erf_dx softplus mish sign abs negative invert
add subtract multiply divide maximum minimum equal not_equal greater greater_equal less less_equal power
bitwise_and bitwise_or bitwise_xor left_shift right_shift logical_and logical_or logical_xor logical_not bypass
max min sum prod all any""".split()
TOP = "jit simulate cpu_simulate simulate_kernel baremetal benchmark profile install".split()


def status_of(fn):
    return getattr(fn, "__nki_status__", "supported")


def _params(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ""
    names = []
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            continue
        if p.kind is p.VAR_POSITIONAL:
            names.append("*" + p.name)
        else:
            names.append(p.name)
    return ", ".join(names)


def _row(prefix, name, mod):
    fn = getattr(mod, name, None)
    if fn is None:
        return f"| `{prefix}.{name}` | | not yet |"
    if not callable(fn):
        return f"| `{prefix}.{name}` | (value) | supported |"
    if type(fn).__name__ == "Op":
        kind = {"binary": "x, y, dtype, mask", "unary": "x, dtype, mask", "reduce": "x, axis, dtype, keepdims, mask"}
        return f"| `{prefix}.{name}` | {kind[fn.kind]} (also an op value) | supported |"
    target = fn.__init__ if inspect.isclass(fn) else fn
    return f"| `{prefix}.{name}` | {_params(target)} | {status_of(fn)} |"


def table():
    from tern import nki
    from tern.nki import isa, language, legacy_isa
    out = ["| call | arguments | status |", "|---|---|---|"]
    out += [_row("nki", n, nki) for n in TOP]
    out += [_row("nki.isa", n, isa) for n in CURRENT_ISA]
    out += [_row("nki.language", n, language) for n in LANGUAGE]
    legacy = sorted(n for n in dir(legacy_isa) if not n.startswith("_") and callable(getattr(legacy_isa, n))
                    and getattr(getattr(legacy_isa, n), "__module__", "") == legacy_isa.__name__)
    out += [_row("neuronxcc.nki.isa", n, legacy_isa) for n in legacy]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(table(), end="")
