"""The demo moved to :mod:`persistent_gemm.tools.demo`; this name stays for ``persistent_gemm.demo.main``."""

from .tools.demo import main  # noqa: F401
