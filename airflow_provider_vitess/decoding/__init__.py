"""Decoding what vtgate sends: response bytes to typed events and row values (pure, no I/O).

``wire`` (views that leave rows serialized), ``copyrows`` (copy-phase ROW events gathered in
blocks), ``events`` (typed events), ``rowwire`` (where row values lie in the bytes) and
``values`` (a value's text to Python). Used by ``vstream/`` and ``staging/`` alike.
"""
