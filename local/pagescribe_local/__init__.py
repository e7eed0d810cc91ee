"""What runs on a laptop or in CI, never in Lambda: the ``pagescribe`` command, the local stack (AWS emulated by a
moto server, the real handlers driven as Lambda would), the embedded PostgreSQL server and the accuracy evaluation.

It imports ``pagescribe`` (the package the Lambda layer ships) and is imported by nothing there.
"""
