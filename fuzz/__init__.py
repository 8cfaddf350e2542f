"""A fuzzer of toast_core: random valid JAX programs run through the whole pipeline.

* `programs`: a seeded generator of small JAX programs (a train step or a forward function) kept as
  a spec that renders to a standalone Python script and is executed from that very source.
* `pipeline`: one program on one mesh through trace, analyze, search, every baseline and validate,
  with each outcome classified (crash, ToastError, invalid plan, numerics mismatch, fidelity).
* `minimize`: shrink a failing program while the same failure persists and write a reproduction.
* `worker`: a subprocess that runs the pipeline, so that an XLA crash is recorded, not fatal.

`bench/fuzz.py` drives them; `tests/test_fuzz.py` is the property test.
"""
