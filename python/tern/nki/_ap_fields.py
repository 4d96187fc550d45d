"""The access-pattern fields of an instruction, as tern's views meet them."""


# An access-pattern dim counts at most this many elements, with a stride of
# at most this magnitude (the ISA's 16-bit fields; sim/check.cpp enforces them).
_MAX_COUNT, _MAX_STRIDE = 65535, 32767


def split_long_dims(free):
    """Dims longer than an access-pattern field holds, split in two (outer x
    inner, the same elements in the same order), as the compiler lowers
    them; one with no such factors stays (the rule check names it)."""
    out = []
    for s, c in free:
        if c > _MAX_COUNT:
            inner = next((k for k in range(min(_MAX_COUNT, _MAX_STRIDE // max(abs(s), 1)), 1, -1)
                          if c % k == 0 and c // k <= _MAX_COUNT), None)
            if inner is not None:
                out += [(s * inner, c // inner), (s, inner)]
                continue
        out.append((s, c))
    return out
