"""The launcher's shared vocabulary, no I/O: diagnostics, errors, states and results.

Every layer may use it; it imports nothing from the rest of ``orchestrator``.
"""
