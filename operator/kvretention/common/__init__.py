"""The ground floor: names every layer shares (tenancy, the request trace, the ``kv.retain`` wire
format, the session keys, the store-metrics parser).

Import-light (standard library only) and importing nothing else of ``kvretention``: the API, the
operator, the data plane and the retention plugin inside SGLang may all import it, so none of them
has to import another's layer for a shared name (``tests/unit/test_layering.py`` holds that).
"""
