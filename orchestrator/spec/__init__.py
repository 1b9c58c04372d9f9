"""Stage 1: the cluster spec. YAML in, a validated, frozen ``ClusterSpec`` out, or every problem at
once as ``FILE:LINE: field: message`` diagnostics."""

from .load import LoadedSpec, check_spec_text, load_spec, load_spec_text
from .model import ClusterSpec, is_loopback
from .rules import format_path

__all__ = ["ClusterSpec", "LoadedSpec", "check_spec_text", "format_path", "is_loopback", "load_spec", "load_spec_text"]
