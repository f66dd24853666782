"""Tools built on the library: the command line (:mod:`.cli`, run as ``python -m persistent_gemm``),
the schedule picture (:mod:`.picture`, drawn by :mod:`.picture_layers` with matplotlib) and the
demo (:mod:`.demo` on the real model of :mod:`.demo_model`).

They import the library; no library module imports them when it is imported (``explain``'s
``render=`` draws through :mod:`.picture` only when asked), so the library loads without
matplotlib, argparse or a model reader (tests/test_layering.py holds this).
"""
