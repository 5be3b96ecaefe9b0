"""Python stubs generated from ``protos/`` when the package is built or installed.

The ``*_pb2*.py`` files here are build outputs (see ``setup.py``): never edit or commit them.
"""
