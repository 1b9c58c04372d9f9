"""tfcluster instrumentation bootstrap, imported by Python's ``site`` at interpreter start.

worker_entry puts this directory first on PYTHONPATH (``TFCLUSTER_INSTRUMENT=1``). We must leave the
user's program exactly as it would be without us, so this file:

1. imports the ``sitecustomize`` that would have been imported without ours (our directory removed from
   ``sys.path`` for that import only, errors reported the way ``site`` reports them);
2. unless ``TFCLUSTER_INSTRUMENT=0``, imports ``worker_entry/instrument/hooks.py`` from our directory — the
   interpreter may be another Python/venv without our package, and we add nothing to ``sys.path`` —
   and calls ``install()``, which only registers post-import hooks (nothing heavy is imported here);
3. turns any failure of ours into one ``tfcluster:`` warning line on stderr.
"""


def _tfcluster_chain(here: str) -> object:
    """Import the next ``sitecustomize`` on sys.path (the one ours shadows), as ``site`` would."""
    import importlib
    import os
    import sys

    def _same(entry: str) -> bool:
        try:
            return os.path.realpath(entry or os.getcwd()) == here
        except Exception:
            return False

    me = sys.modules.get("sitecustomize")
    positions = [i for i, entry in enumerate(sys.path) if isinstance(entry, str) and _same(entry)]
    for i in reversed(positions):
        del sys.path[i]
    sys.modules.pop("sitecustomize", None)
    importlib.invalidate_caches()
    chained = None
    try:
        chained = importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")
    except Exception as exc:
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")
    finally:
        for i in positions:  # put our directory back where it was (other entries stay as they are now)
            sys.path.insert(min(i, len(sys.path)), here)
        if me is not None:
            sys.modules["sitecustomize"] = me
    return chained


def _tfcluster_load_instrument(package_dir: str):
    """Import ``<package_dir>/instrument/hooks.py`` as a submodule of our package (real or private)."""
    import importlib
    import importlib.machinery
    import importlib.util
    import os
    import sys
    import types

    # If this interpreter has our very package as ``worker_entry``, share its modules (one set of
    # progress counters); otherwise register a private package pointing at our directory, and import
    # the instrumentation through it (its modules reach each other and the protocol by relative imports).
    try:
        spec = importlib.util.find_spec("worker_entry")
    except Exception:
        spec = None
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    if locations and os.path.realpath(locations[0]) == package_dir:
        return importlib.import_module("worker_entry.instrument.hooks")

    name = "_tfcluster_worker_entry"
    if name not in sys.modules:
        package = types.ModuleType(name, "tfcluster worker_entry, loaded by path for instrumentation")
        package.__path__ = [package_dir]
        package.__package__ = name
        package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        package.__spec__.submodule_search_locations = [package_dir]
        sys.modules[name] = package
    return importlib.import_module(name + ".instrument.hooks")


def _tfcluster_bootstrap() -> None:
    import os
    import sys

    here = os.path.dirname(os.path.realpath(__file__))
    path = os.environ.get("TFCLUSTER_TF_CONFIG_FILE")  # a TF_CONFIG too large for execve: set it here
    if path and "TF_CONFIG" not in os.environ:
        try:
            with open(path) as f:
                os.environ["TF_CONFIG"] = f.read()
        except OSError as exc:
            sys.stderr.write(f"tfcluster: cannot read TF_CONFIG from {path}: {exc}\n")
    try:
        globals()["chained"] = _tfcluster_chain(here)
    except Exception as exc:  # pragma: no cover - defensive
        sys.stderr.write(f"tfcluster: could not chain sitecustomize: {exc!r}\n")
    if os.environ.get("TFCLUSTER_INSTRUMENT", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    try:
        _tfcluster_load_instrument(os.path.dirname(here)).install()
    except Exception as exc:
        sys.stderr.write(f"tfcluster: instrumentation disabled: {exc!r}\n")


_tfcluster_bootstrap()
