"""nki.typing: tensor type annotations. `nt.tensor[[4096, 8192], nl.bfloat16]`
(a shape list and a dtype) is also a stand-in input for timing-only runs
(nki.benchmark), as the legacy samples pass it."""


class _TensorType:
    def __init__(self, name):
        self.name = name

    def __getitem__(self, item):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (list, tuple)) \
                and isinstance(item[1], str):
            from tern.nki._kernel import spec
            return spec(item[0], item[1])
        return self

    def __repr__(self):
        return f"nt.{self.name}"


tensor = _TensorType("tensor")
mutable_tensor = _TensorType("mutable_tensor")
scalar = _TensorType("scalar")
