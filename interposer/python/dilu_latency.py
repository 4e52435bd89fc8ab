"""Report request latencies to dilu's node manager from Python.

Works in any process started under the dilu interposer (``dilu run``); a
no-op elsewhere, so servers can call it unconditionally::

    import time, dilu_latency
    started = time.perf_counter()
    handle(request)
    dilu_latency.report(time.perf_counter() - started)
"""

import ctypes

try:
    _report = ctypes.CDLL(None).dilu_report_latency
    _report.argtypes = [ctypes.c_uint64]
    _report.restype = None
except AttributeError:  # not running under the interposer
    _report = None


def available():
    """Whether the interposer is loaded in this process."""
    return _report is not None


def report(seconds):
    """Reports one request latency, in seconds."""
    if _report is not None and seconds >= 0:
        _report(int(seconds * 1e9))
