"""`import tern.nki.as_nki` once, then unmodified kernels' `import nki` use tern."""
from tern import nki

nki.install()
